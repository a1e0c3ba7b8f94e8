"""llama.cpp as a peer: the same GGUF file decoded by llama-cpp-python, in the same process.

``llama-cpp`` runs plain greedy decoding of the target's GGUF (a packaged name or a .gguf file)
with llama.cpp's own kernels, the reference for CPU decoding speed. It is an optional extra
(``pip install 'specdraft[llama-cpp]'``, built from source: ~7 min on 2 cores); ggml's AMX
backend crashes on some Sapphire Rapids machines, where it must be built with
``CMAKE_ARGS="-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS=..."``.
Its output is compared with ``none`` like every greedy method; mismatches are expected: with
weight format gguf both compute the same Q4_K/Q6_K weights but round activations differently,
and with w8a8 our runtime computes an int8 copy of their dequantized values.
"""
from __future__ import annotations

import os

import torch

from ..errors import SpecdraftError
from .peers import strip_eos
from .records import Outcome

NAME = "llama-cpp"


class LlamaCppRunner:
    """Greedy decoding through llama.cpp; the same call shape as the engine runner."""

    def __init__(self, gguf_path, eos_ids, *, n_ctx: int = 4096, threads: int | None = None):
        try:
            from llama_cpp import Llama
        except ImportError:
            raise SpecdraftError("method llama-cpp needs llama-cpp-python: pip install 'specdraft[llama-cpp]'") from None
        threads = threads or torch.get_num_threads() or os.cpu_count() or 1
        self.llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         verbose=False)
        self.eos_ids = set(eos_ids)

    def __call__(self, ids: list[int], max_new_tokens: int) -> Outcome:
        produced: list[int] = []
        for tok in self.llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            produced.append(int(tok))
            if tok in self.eos_ids or len(produced) >= max_new_tokens:
                break
        # One decode call per token after the prefill call: plain decoding.
        return Outcome(strip_eos(produced, self.eos_ids), len(produced), len(produced), None, None)
