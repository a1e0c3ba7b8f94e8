"""Whether a shared host slows the two vCPUs together or one at a time: both cores' `vpaddw` issue
rates (the kernels' probe, specdraft.kernels probe.cpp), each core pinned in its own process, probed
at the same moments every second:

    python scripts/core_phases.py [SECONDS]

Prints a line per second (G instructions/s, core 0 and core 1) and the mean gap between the two.
When the gap is large, products split in fixed halves wait for the slower core (gguf_common.h's
balanced_for hands out the tail of a product to whichever core frees up first)."""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time


def probe(cpu: int, n: int, start: float, q) -> None:
    os.sched_setaffinity(0, {cpu})
    from specdraft.kernels import gguf_ops

    ops = gguf_ops()
    rates = []
    for i in range(n):
        while time.time() < start + i:
            time.sleep(0.001)
        rates.append(ops.issue_rates(0.2)[0] / 1e9)
    q.put((cpu, rates))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    from specdraft.kernels import gguf_ops

    gguf_ops()  # built once here, not by both probes at the same time
    q = mp.Queue()
    start = time.time() + 5
    procs = [mp.Process(target=probe, args=(cpu, n, start, q)) for cpu in (0, 1)]
    for p in procs:
        p.start()
    rates = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    for i in range(n):
        print(f"{i:4d} s  core 0 {rates[0][i]:5.2f}  core 1 {rates[1][i]:5.2f}")
    gaps = [abs(a - b) for a, b in zip(rates[0], rates[1])]
    mean = sum(rates[0] + rates[1]) / (2 * n)
    print(f"mean rate {mean:.2f} G/s; mean gap between the cores {sum(gaps) / n:.2f} G/s "
          f"({sum(gaps) / n / mean:.0%}); seconds with a gap over a quarter of the mean: "
          f"{sum(g > mean / 4 for g in gaps)} of {n}")


if __name__ == "__main__":
    main()
