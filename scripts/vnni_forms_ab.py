"""The GGUF kernels alone over the default target's products (~1 GB of records): the AVX-512 VNNI
kernels' forms timed per product as they run (the default) against fixed forms (the built-in
masks, every block a ymm, every block a zmm), round robin in one process:
python scripts/vnni_forms_ab.py [ROUNDS]. Prints median ms per rows and the timed choice's share
of zmm products per rows. Needs an AVX-512 VNNI CPU. Run it twice a few minutes apart: which
fixed form wins moves with the machine's phases; the timed one should stay at the best."""
from __future__ import annotations

import statistics
import sys
import time

import torch

from specdraft.bench.kernel_cost import product, random_records
from specdraft.kernels import gguf_ops, plan

BLOCKS = [1, 2, 3, 4, 5, 6, 8]


def main(rounds: int) -> None:
    ops = gguf_ops()
    ops.set_kernel_path("avx512-vnni")
    gen = torch.Generator().manual_seed(0)
    weights = [random_records(k, o, i, gen) for k, o, i in plan.DEFAULT_TARGET_SHAPES]
    built_in = ops.vnni_forms()
    settings = {"timed": (True, built_in), "built in": (False, built_in),
                "ymm": (False, [0] * 4), "zmm": (False, [0x1FE] * 4)}
    xq = {k: {i: ops.quantize_q8k(torch.randn(k, i, generator=gen)) for i in (1536, 8960)} for k in BLOCKS}
    times: dict[tuple[str, int], list[float]] = {(s, k): [] for s in settings for k in BLOCKS}
    ops.clear_vnni_form_stats()
    try:
        for _ in range(rounds):
            for k in BLOCKS:
                for name, (timed, masks) in settings.items():
                    ops.set_vnni_forms_timed(timed)
                    ops.set_vnni_forms(masks)
                    t0 = time.perf_counter()
                    for w in weights:
                        product(ops, w, xq[k][w.in_features])
                    times[name, k].append(time.perf_counter() - t0)
        ops.set_vnni_forms_timed(True)
        note = plan.forms_note()
    finally:
        ops.set_vnni_forms(built_in)
    print(f"built in: {plan.describe(built_in)}")
    print("rows      " + "".join(f"{k:>8d}" for k in BLOCKS))
    for name in settings:
        print(f"{name:10s}" + "".join(f"{1e3 * statistics.median(times[name, k]):8.1f}" for k in BLOCKS))
    print(f"timed: {note}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
