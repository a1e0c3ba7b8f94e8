"""The target's forwards with its GGUF records in 2 MB pages against 4 KB pages, per block of new
tokens (`specdraft calibrate`'s timing).

    python scripts/huge_pages.py [--rounds 3] [--blocks 1,4,8,16] [--repeats 7] [--context 300] [--processes]

By default one process loads the default target twice, once in 4 KB pages and once in 2 MB pages
(models.hugepages.forced), and times their forwards interleaved (forward_costs' round robin):
a phase of the machine hits both alike, so the ratio of each round is a paired one. --processes:
separate processes alternated instead (SPECDRAFT_HUGE_PAGES=0 / 1), each loading the target once,
as a user's process would. Prints how many bytes of the records sit in huge pages.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys, torch
from specdraft.bench.forward_cost import forward_costs
from specdraft.models.hugepages import huge_page_bytes
from specdraft.pipeline import load_model
torch.set_num_threads(2)
blocks, context = tuple(int(b) for b in sys.argv[1].split(",")), int(sys.argv[3])
m = load_model("qwen2.5-coder-1.5b", weight_format="gguf", max_length=context + max(blocks) + 1).model
head = m.lm_head.parts[0].w  # the output head's records: a view of the pack's buffer (or its map)
got = forward_costs({"m": m}, blocks=blocks, context=context, repeats=int(sys.argv[2]))["m"]
print(json.dumps({"seconds": got["seconds"], "huge": huge_page_bytes(head)}))
"""


def in_processes(a, blocks: list[int]) -> dict[str, list[list[float]]]:
    runs: dict[str, list[list[float]]] = {"4K": [], "2M": []}
    for r in range(a.rounds):
        for label in (("2M", "4K") if r % 2 else ("4K", "2M")):
            env = dict(os.environ, SPECDRAFT_HUGE_PAGES="1" if label == "2M" else "0")
            out = subprocess.run([sys.executable, "-c", CHILD, a.blocks, str(a.repeats), str(a.context)], env=env,
                                 check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            got = json.loads(out)
            runs[label].append(got["seconds"])
            print(f"round {r + 1} {label}: " + " ".join(f"{k}:{s * 1e3:.2f}" for k, s in zip(blocks, got["seconds"]))
                  + f" ms  (the records' mapping in huge pages: {got['huge'] / 2**20:.0f} MiB)", flush=True)
    return runs


def in_one_process(a, blocks: list[int]) -> dict[str, list[list[float]]]:
    import torch

    from specdraft.bench.forward_cost import forward_costs
    from specdraft.models.hugepages import forced, huge_page_bytes
    from specdraft.pipeline import load_model

    torch.set_num_threads(2)
    length = a.context + max(blocks) + 1
    with forced("4K"):
        small = load_model("qwen2.5-coder-1.5b", weight_format="gguf", max_length=length, progress=False).model
    with forced("2M"):  # whatever a payback filed for this CPU says (calibrate --pages)
        big = load_model("qwen2.5-coder-1.5b", weight_format="gguf", max_length=length, progress=False).model
    models = {"4K": small, "2M": big}
    print("the records' mappings in huge pages: " + ", ".join(
        f"{label} {huge_page_bytes(m.lm_head.parts[0].w) / 2**20:.0f} MiB" for label, m in models.items()))
    runs: dict[str, list[list[float]]] = {"4K": [], "2M": []}
    for r in range(a.rounds):
        got = forward_costs(models, blocks=tuple(blocks), context=a.context, repeats=a.repeats)
        for label in models:
            runs[label].append(got[label]["seconds"])
        print(f"round {r + 1}: " + "  ".join(f"{k}: {x * 1e3:.2f} / {y * 1e3:.2f} ms ({x / y:.3f}x)" for k, x, y in
                                             zip(blocks, got["4K"]["seconds"], got["2M"]["seconds"])), flush=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", default="1,4,8,16")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--processes", action="store_true", help="separate processes instead of one")
    a = ap.parse_args()
    blocks = [int(b) for b in a.blocks.split(",")]
    runs = (in_processes if a.processes else in_one_process)(a, blocks)
    print("medians over rounds, ms (4 KB pages / 2 MB pages = speedup):")
    for i, k in enumerate(blocks):
        a4 = statistics.median(run[i] for run in runs["4K"]) * 1e3
        a2 = statistics.median(run[i] for run in runs["2M"]) * 1e3
        print(f"  {k:3d} new tokens: {a4:7.2f} / {a2:7.2f} = {a4 / a2:.3f}x")


if __name__ == "__main__":
    main()
