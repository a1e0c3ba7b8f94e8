"""What reading tapped layers' outputs adds to a target forward: forwards of T new rows at a
context of 300 with and without ``taps`` (the shipped head's layers), interleaved, medians:

    python scripts/taps_cost.py [--blocks 1,4,8] [--repeats 80]

(A trained drafter with taps asks every check for them: hybrid-head, head, fusion.)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdraft.config import SpecConfig
from specdraft.pipeline import Speculator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=80)
    args = ap.parse_args()
    sd = Speculator(progress=False, load_draft=False)
    m = sd.target.model
    taps = tuple(sd.head(SpecConfig(method="head").head, "mlp").cfg.taps)
    g = torch.Generator().manual_seed(0)
    m.reset()
    m.forward(torch.randint(0, 1000, (300,), generator=g), last_only=True)
    start = m.length
    for T in (int(b) for b in args.blocks.split(",")):
        times: dict[str, list[float]] = {"plain": [], "hidden": [], "taps": []}
        for i in range(args.repeats):
            for kind in (list(times) if i % 2 == 0 else list(times)[::-1]):
                ids = torch.randint(0, 1000, (T,), generator=g)
                kw = {} if kind == "plain" else {"need_hidden": True} | ({"taps": taps} if kind == "taps" else {})
                t = time.perf_counter()
                m.forward(ids, **kw)
                times[kind].append(time.perf_counter() - t)
                m.rollback(start)
        print(f"{T} rows: " + ", ".join(f"{k} {1000 * statistics.median(v[5:]):.3f} ms" for k, v in times.items())
              + f" (taps {sorted(taps)})")


if __name__ == "__main__":
    main()
