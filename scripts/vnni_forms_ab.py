"""The GGUF kernels alone over the default target's products (~1 GB of records), with the AVX-512
VNNI kernels' built-in forms, the forms kernels.plan measures here, and two fixed rules, round
robin in one process: python scripts/vnni_forms_ab.py [ROUNDS]. Needs an AVX-512 VNNI CPU."""
from __future__ import annotations

import statistics
import sys
import time

import torch

from specdraft.bench.kernel_cost import product, random_records
from specdraft.kernels import gguf_ops, plan

BLOCKS = [1, 2, 3, 4, 5, 6, 8, 16]


def main(rounds: int) -> None:
    ops = gguf_ops()
    ops.set_kernel_path("avx512-vnni")
    gen = torch.Generator().manual_seed(0)
    weights = [random_records(k, o, i, gen) for k, o, i in plan.DEFAULT_TARGET_SHAPES]
    settings = {"built in": ops.vnni_forms(), "measured": plan.measure()["masks"],
                "ymm to 4": [0x1E0] * 4, "ymm to 2": [0x1F8] * 4}  # zmm from 5 / from 3 rows, every class
    print({name: plan.describe(m) for name, m in settings.items()})
    xq = {k: {i: ops.quantize_q8k(torch.randn(k, i, generator=gen)) for i in (1536, 8960)} for k in BLOCKS}
    times: dict[tuple[str, int], list[float]] = {(s, k): [] for s in settings for k in BLOCKS}
    for _ in range(rounds):
        for k in BLOCKS:
            for name, masks in settings.items():
                ops.set_vnni_forms(masks)
                t0 = time.perf_counter()
                for w in weights:
                    product(ops, w, xq[k][w.in_features])
                times[name, k].append(time.perf_counter() - t0)
    print("rows      " + "".join(f"{k:>8d}" for k in BLOCKS))
    for name in settings:
        print(f"{name:10s}" + "".join(f"{1e3 * statistics.median(times[name, k]):8.1f}" for k in BLOCKS))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
