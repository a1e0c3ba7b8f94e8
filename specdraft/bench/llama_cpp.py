"""llama.cpp as a peer: the same GGUF files decoded by llama-cpp-python, in the same process.

* ``llama-cpp``: plain greedy decoding of the target's GGUF (a packaged name or a .gguf file) with
  llama.cpp's own kernels, the reference for CPU decoding speed;
* ``llama-cpp-lookup``: llama-cpp-python's speculative decoding with its prompt-lookup drafter
  (``LlamaPromptLookupDecoding``), 2 tokens a draft, what its README advises on a CPU;
* ``llama-cpp-draft``: the same speculative loop with the draft model's GGUF as the drafter, drafted
  the way llama.cpp's own ``common_speculative_gen_draft`` does: greedy, up to 16 tokens, stopping
  at the first token whose draft probability is below 0.9 (its defaults).

llama-cpp-python verifies a draft in one decode call and keeps the longest prefix its greedy
sampler agrees with. Its speculative path asks for logits at every position, the prompt's too;
llama.cpp's own speculative tools compute the prompt's last row only, so here the prompt is
evaluated first without them (see :meth:`LlamaCppRunner._prefill`).

It is an optional extra (``pip install 'specdraft[llama-cpp]'``, built from source: ~7 min on 2
cores); ggml's AMX backend crashes on some Sapphire Rapids machines, where it must be built with
``CMAKE_ARGS="-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS=..."``.
Its output is compared with ``none`` like every greedy method; mismatches are expected: with
weight format gguf both compute the same Q4_K/Q6_K weights but round activations differently,
and with w8a8 our runtime computes an int8 copy of their dequantized values.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import SpecdraftError
from ..prefix import shared_prefix
from .records import Outcome, stop_ids, strip_eos

NAME = "llama-cpp"
LOOKUP = "llama-cpp-lookup"
DRAFT = "llama-cpp-draft"
METHODS = (NAME, LOOKUP, DRAFT)

LOOKUP_NGRAM = 2  # LlamaPromptLookupDecoding's default n-gram length
LOOKUP_TOKENS = 2  # its README: "2 performs better for cpu-only machines" (10 on a GPU)


@dataclass(frozen=True)
class DraftRule:
    """How ``llama-cpp-draft`` drafts: llama.cpp's common_speculative_params defaults."""

    max_tokens: int = 16
    p_min: float = 0.9


def _llama_options(n_ctx: int, threads: int | None) -> dict:
    """Llama's arguments every peer here shares: the context, ``threads`` (default: torch's) for
    decoding and for batches alike, no log."""
    threads = threads or torch.get_num_threads() or os.cpu_count() or 1
    return dict(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)


def _llama_class():
    try:
        from llama_cpp import Llama
    except ImportError:
        raise SpecdraftError("the llama-cpp methods need llama-cpp-python: pip install 'specdraft[llama-cpp]'") from None
    return Llama


class CountingLookup:
    """llama-cpp-python's prompt-lookup drafter, counting the tokens it proposes."""

    def __init__(self, ngram: int = LOOKUP_NGRAM, tokens: int = LOOKUP_TOKENS):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.inner = LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=tokens)
        self.drafted = 0

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        out = self.inner(input_ids)
        self.drafted += len(out)
        return out


class DraftModelDrafter:
    """A second llama.cpp model drafting greedily, with its own KV cache kept across calls.

    ``input_ids`` is the whole sequence so far (prompt, committed tokens, the token just sampled);
    the draft's cache keeps the longest prefix it shares with that, so each call evaluates only
    what changed (at least the last token, whose logits start the draft).
    """

    def __init__(self, llm, rule: DraftRule = DraftRule()):
        self.llm = llm
        self.rule = rule
        self.n_vocab = llm.n_vocab()
        self.drafted = 0

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        ids = [int(t) for t in input_ids]
        llm = self.llm
        keep = kept_prefix(llm, ids)
        llm.n_tokens = keep  # eval() drops the cache past n_tokens before it decodes
        llm.eval(ids[keep:])
        out: list[int] = []
        while len(out) < self.rule.max_tokens:
            logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(self.n_vocab,))
            tok = int(np.argmax(logits))
            p_top = 1.0 / float(np.exp(logits.astype(np.float64) - logits[tok]).sum())  # softmax at the argmax
            if p_top < self.rule.p_min:
                break
            out.append(tok)
            if len(out) < self.rule.max_tokens:
                llm.eval([tok])
        self.drafted += len(out)
        return np.array(out, dtype=np.intc)


def kept_prefix(llm, ids: list[int]) -> int:
    """How much of ``ids`` a llama.cpp model's cache holds already (prefix.shared_prefix)."""
    return shared_prefix(llm.input_ids[:llm.n_tokens], ids)


def same_vocab(a, b, probes: int = 257) -> bool:
    """Whether two llama.cpp models share a vocabulary: the same size, and the same text for ids
    spread across it (a cheaper form of llama.cpp's own compatibility check)."""
    n = a.n_vocab()
    if b.n_vocab() != n:
        return False
    return all(a.detokenize([i]) == b.detokenize([i]) for i in range(0, n, max(1, n // probes)))


class LlamaCppForward:
    """llama.cpp's forward over k new tokens in the shape ``forward_cost.forward_costs`` times
    (``reset`` / ``forward(ids [k], last_only)`` / ``rollback(n)`` / ``vocab_size``), so that
    ``specdraft calibrate --peer llama-cpp`` times the same GGUF's cost curve through llama.cpp's own
    kernels, interleaved with ours. A forward over new tokens asks for every row's logits, as a check
    of k guesses does (llama-cpp-python then copies them into its score rows, 0.6 MB a row of the
    default target's vocabulary, as its speculative path does too); a prefill (``last_only``)
    computes the last row's only."""

    weight_format = "gguf, llama.cpp's kernels"  # what calibrate prints and files for it

    def __init__(self, gguf_path, *, n_ctx: int, threads: int | None = None):
        Llama = _llama_class()
        import llama_cpp

        # logits_all: llama-cpp-python sizes its score rows by it (n_batch rows otherwise)
        self.llm = Llama(model_path=str(gguf_path), logits_all=True, **_llama_options(n_ctx, threads))
        self.vocab_size = self.llm.n_vocab()
        self.dtype = f"llama-cpp-python {getattr(llama_cpp, '__version__', '(version unknown)')}"

    def reset(self) -> None:
        self.llm.reset()

    def rollback(self, length: int) -> None:
        self.llm.n_tokens = length  # eval() drops the cache past n_tokens before it decodes

    def forward(self, ids: torch.Tensor, last_only: bool = False) -> None:
        llm = self.llm
        llm._logits_all = not last_only
        try:
            llm.eval([int(i) for i in ids])
        finally:
            llm._logits_all = True


class LlamaCppRunner:
    """Greedy decoding through llama.cpp, plain or speculative; the same call shape as the engine runner."""

    def __init__(self, gguf_path, eos_ids, *, n_ctx: int = 4096, threads: int | None = None,
                 drafter: str | None = None, draft_gguf=None, reuse_prefix: bool = False, ignore_eos: bool = False):
        Llama = _llama_class()
        opts = _llama_options(n_ctx, threads)
        self.drafter = None
        if drafter == "lookup":
            self.drafter = CountingLookup()
        elif drafter == "draft-model":
            self.drafter = DraftModelDrafter(Llama(model_path=str(draft_gguf), **opts))
        elif drafter is not None:
            raise ValueError(f"unknown llama.cpp drafter {drafter!r}")
        # logits_all: the speculative path needs every row's logits, and llama-cpp-python sizes its
        # score rows by this argument (n_batch rows otherwise, too few past position n_batch)
        self.llm = Llama(model_path=str(gguf_path), draft_model=self.drafter, logits_all=self.drafter is not None,
                         **opts)
        if isinstance(self.drafter, DraftModelDrafter) and not same_vocab(self.llm, self.drafter.llm):
            raise SpecdraftError(f"{draft_gguf} and {gguf_path} have different vocabularies; "
                                 "llama-cpp-draft needs a draft model with the target's tokenizer")
        # where an answer ends (none with --ignore-eos): generate() itself never stops at EOS, its callers do
        self.stop_ids = stop_ids(eos_ids, ignore_eos)
        self.reuse_prefix = reuse_prefix
        self.forwards = 0
        decode = self.llm.eval

        def counted_eval(tokens):  # one decode call of the target = one forward, a batch of guesses or the prompt
            self.forwards += len(tokens) > 0  # generate() first "evaluates" nothing when the prompt is cached
            decode(tokens)

        self.llm.eval = counted_eval

    def _prefill(self, ids: list[int]) -> None:
        """The prompt in one decode call with its last row's logits only, as llama.cpp's speculative
        tools do; generate() then finds it cached and samples from that row. Nothing of the previous
        prompt is kept (generate() would reuse a shared prefix such as the chat template's system
        turn): every method here, ours too, evaluates each prompt whole; with ``reuse_prefix`` (the
        bench's --reuse-prefix, as ours then do) the cache keeps what it shares with the prompt, up to
        its last token, and only the rest is evaluated."""
        llm = self.llm
        keep = kept_prefix(llm, ids) if self.reuse_prefix else 0
        logits_all = llm._logits_all
        llm._logits_all = False
        try:
            llm.reset()
            llm.n_tokens = keep  # eval() drops the cache past n_tokens before it decodes
            llm.eval(ids[keep:])
        finally:
            llm._logits_all = logits_all

    def __call__(self, ids: list[int], max_new_tokens: int) -> Outcome:
        self.forwards = 0
        drafted_before = self.drafter.drafted if self.drafter is not None else 0
        self._prefill(ids)
        produced: list[int] = []
        for tok in self.llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            produced.append(int(tok))
            if tok in self.stop_ids or len(produced) >= max_new_tokens:
                break
        tokens = strip_eos(produced, self.stop_ids)
        if self.drafter is None:  # one decode call per token after the prefill call: plain decoding
            return Outcome(tokens, len(produced), len(produced), None, None)
        # Each decode call commits the guesses it accepted and one token of its own (the prefill:
        # just that one), so accepted = committed - calls; a run cut at max_new_tokens inside a
        # verified batch leaves that batch's later agreed guesses uncounted.
        accepted = max(0, len(produced) - self.forwards)
        return Outcome(tokens, self.forwards, len(produced), self.drafter.drafted - drafted_before, accepted)
