"""Prefill speed and one-token decode of the default target (or MODEL: a packaged name or a .gguf
file): the native runtime against llama.cpp (llama-cpp-python) on the same GGUF file, 2 threads
each, interleaved in rounds (this machine's phases hit both alike). Needs `pip install
'specdraft[llama-cpp]'`.

    python scripts/prefill_vs_llama_cpp.py [ROUNDS] [MODEL]
"""
import statistics
import sys
import time
from pathlib import Path

import torch
from llama_cpp import Llama

from specdraft.models.packaged import gguf_file
from specdraft.pipeline import Speculator

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
MODEL = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b"
PROMPT_TOKENS = (128, 300, 700)
STEPS = 16  # one-token forwards timed after each prefill

sd = Speculator(MODEL, dtype="fp32", runtime="native", max_length=2048, load_draft=False)
ours = sd.target.model
llm = Llama(model_path=str(gguf_file(MODEL)), n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False)
ids = sd.tokenizer((Path(__file__).parents[1] / "README.md").read_text())["input_ids"]


def ours_run(x):
    ours.reset()
    t = time.perf_counter()
    ours.forward(torch.tensor(x), last_only=True)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(STEPS):
        ours.forward(torch.tensor([x[-1]]))
    return prefill, (time.perf_counter() - t) / STEPS


def llama_run(x):
    llm.reset()
    t = time.perf_counter()
    llm.eval(x)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(STEPS):
        llm.eval([x[-1]])
    return prefill, (time.perf_counter() - t) / STEPS


got: dict[tuple[str, int], list[tuple[float, float]]] = {}
for _ in range(ROUNDS):
    for n in PROMPT_TOKENS:
        for name, run in (("specdraft", ours_run), ("llama.cpp", llama_run)):
            got.setdefault((name, n), []).append(run(ids[:n]))
print("| prompt tokens | engine | prefill tok/s (median, min-max) | one token ms (median, min-max) |")
print("|---:|---|---:|---:|")
for (name, n), runs in got.items():
    rates = [n / p for p, _ in runs]
    ms = [1e3 * s for _, s in runs]
    print(f"| {n} | {name} | {statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) | "
          f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}) |")
