"""A prefill that reads its last row alone against one that keeps every row, on the default target
(gguf): the first skips the other rows' last-layer attention and MLP (models.llama), the second
runs them all, as a drafter that reads every prompt row's features needs. Interleaved, the order
reversed every other round, so the machine's phases hit both alike:

    python scripts/prefill_last_row.py [ROUNDS] [LENGTHS]      # default: 5 128,300,700

Prints per prompt length the median seconds of each way, its tokens/s and the ratio; the last
rows' logits are checked equal (bit for bit) every round.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from specdraft.pipeline import load_model


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    lengths = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "128,300,700").split(",")]
    model = load_model("qwen2.5-coder-1.5b", weight_format="gguf", max_length=max(lengths) + 8, progress=False).model
    gen = torch.Generator().manual_seed(0)
    prompts = {n: torch.randint(0, 150000, (n,), generator=gen) for n in lengths}
    ways = {"last row": {"last_only": True}, "every row": {"last_only": True, "need_hidden": True}}
    times = {(w, n): [] for w in ways for n in lengths}
    model.forward(prompts[lengths[0]][:70], last_only=True)  # warm up
    for r in range(rounds):
        for n in lengths:
            logits = {}
            for w in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                model.reset()
                t0 = time.perf_counter()
                logits[w] = model.forward(prompts[n], **ways[w]).logits[-1]
                times[w, n].append(time.perf_counter() - t0)
            assert torch.equal(*logits.values()), "the last row's logits differ"
    print(f"prefill, medians of {rounds} rounds (s; tokens/s)")
    for n in lengths:
        a, b = (statistics.median(times[w, n]) for w in ways)
        print(f"{n:5d} tokens: last row {a:.3f} s ({n / a:.1f}/s), every row {b:.3f} s ({n / b:.1f}/s), "
              f"{b / a:.3f}x")


if __name__ == "__main__":
    main()
