"""The target's forwards with its GGUF records in 2 MB pages against 4 KB pages, in separate
processes alternated (a process's pages are set when it loads), per block of new tokens.

    python scripts/huge_pages.py [--rounds 3] [--blocks 1,4,8,16] [--repeats 7]

Each child loads the default target with SPECDRAFT_HUGE_PAGES=1 or 0 and prints its medians
(`specdraft calibrate`'s timing, context 300) and how many bytes of its records sit in huge pages.
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
blocks = tuple(int(b) for b in sys.argv[1].split(","))
m = load_model("qwen2.5-coder-1.5b", weight_format="gguf", max_length=300 + max(blocks) + 1).model
head = m.lm_head.parts[0].w  # the output head's records: a view of the pack's buffer (or its map)
got = forward_costs({"m": m}, blocks=blocks, context=300, repeats=int(sys.argv[2]))["m"]
print(json.dumps({"seconds": got["seconds"], "huge": huge_page_bytes(head)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", default="1,4,8,16")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    blocks = [int(b) for b in a.blocks.split(",")]
    runs: dict[str, list[list[float]]] = {"4K": [], "2M": []}
    for r in range(a.rounds):
        for label in (("2M", "4K") if r % 2 else ("4K", "2M")):
            env = dict(os.environ, SPECDRAFT_HUGE_PAGES="1" if label == "2M" else "0")
            out = subprocess.run([sys.executable, "-c", CHILD, a.blocks, str(a.repeats)], env=env, check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            got = json.loads(out)
            runs[label].append(got["seconds"])
            print(f"round {r + 1} {label}: " + " ".join(f"{k}:{s * 1e3:.2f}" for k, s in zip(blocks, got["seconds"]))
                  + f" ms  (the records' mapping in huge pages: {got['huge'] / 2**20:.0f} MiB)", flush=True)
    print("medians over rounds, ms (4 KB pages / 2 MB pages = speedup):")
    for i, k in enumerate(blocks):
        a4 = statistics.median(run[i] for run in runs["4K"]) * 1e3
        a2 = statistics.median(run[i] for run in runs["2M"]) * 1e3
        print(f"  {k:3d} new tokens: {a4:7.2f} / {a2:7.2f} = {a4 / a2:.3f}x")


if __name__ == "__main__":
    main()
