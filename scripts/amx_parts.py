"""Where the AMX Q4_K kernel's time goes: the kernel built with parts switched off, timed against
itself whole and against the AVX-512 VNNI kernel, over the default target's Q4_K products.

    python scripts/amx_parts.py [--parts 7,3,5,6,1,2,4] [--rows 12,16,32] [--rounds 7] [--hot] [--base DIR]

A part set is a sum of bits: 1 unpacking the weight tiles, 2 the tile products, 4 the closing
float steps (7: the whole kernel). Each set is a build of this checkout's kernel sources with
``AmxRows::rows`` and ``AmxRows::span`` patched at compile time (checks of up to 16 rows and the
spans of 32 and more; bits wrong except for 7; only times are read).
--hot times one 1792 x 1536 matrix 98 times (its records stay in the caches: compute alone);
otherwise the 98 Q4_K matrices of the default target (~520 MB, read from memory). --base DIR also
times another version's kernel sources whole. Needs an AMX-INT8 CPU. Prints medians in ms; vnni1
is one row on avx512-vnni (the bound reading the weights sets).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdraft.bench.kernel_cost import product, random_records
from specdraft.kernels import HERE, build_source_dir, gguf_ops
from specdraft.kernels.plan import DEFAULT_TARGET_SHAPES

# the statements of AmxRows (rows, span, tile_sums) that each part bit switches off (every occurrence)
SWITCHES = {1: ("unpack<KIND>(w0 + b * REC", "unpack_tile<KIND>(w0"), 2: ("Tiles::template product<KIND == 6>(",),
            4: ("close_rows<KIND>(",)}


def build(src: Path, label: str):
    ops = build_source_dir(src, label)
    ops.set_kernel_path("amx-int8")
    return ops


def build_parts(parts: int, tmp: Path):
    src = tmp / f"parts{parts}"
    shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    text = (src / "gguf_amx.cpp").read_text()
    for bit, starts in SWITCHES.items():
        if not any(start in text for start in starts):
            sys.exit(f"gguf_amx.cpp changed: none of {starts} is in it")
        if not parts & bit:
            for start in starts:
                text = text.replace(start, "if (false) " + start)
    (src / "gguf_amx.cpp").write_text(text)
    return build(src, f"amx_parts{parts}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="7,3,5,6,1,2,4")
    ap.add_argument("--rows", default="12,16,32")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hot", action="store_true")
    ap.add_argument("--base")
    args = ap.parse_args()
    ref = gguf_ops()
    if "amx-int8" not in ref.kernel_paths():
        sys.exit(f"this CPU has no AMX-INT8 (paths: {', '.join(ref.kernel_paths())})")
    rows = [int(r) for r in args.rows.split(",")]
    with tempfile.TemporaryDirectory(prefix="amx-parts-") as tmp:
        builds = {f"parts{p}": build_parts(int(p), Path(tmp)) for p in args.parts.split(",")}
    if args.base:
        builds["base"] = build(Path(args.base), "amx_parts_base")
    for ops in (ref, *builds.values()):
        ops.set_vnni_forms_timed(False)
    gen = torch.Generator().manual_seed(0)
    if args.hot:
        one = random_records("Q4_K", 1792, 1536, gen)
        weights = [one] * 98
    else:
        weights = [random_records(k, o, i, gen) for k, o, i in DEFAULT_TARGET_SHAPES if k == "Q4_K"]
    xq = {k: {i: ref.quantize_q8k(torch.randn(k, i, generator=gen)) for i in {w.in_features for w in weights}}
          for k in {1, *rows}}
    runs = [("vnni", ref), *builds.items(), ("vnni1", ref)]
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        for k in rows:
            for name, ops in runs:
                if ops is ref:
                    ref.set_kernel_path("avx512-vnni")
                n = 1 if name == "vnni1" else k
                t0 = time.perf_counter()
                for w in weights:
                    product(ops, w, xq[n][w.in_features])
                if r:
                    times.setdefault((name, k), []).append(time.perf_counter() - t0)
    where = "in the caches (one matrix 98 times)" if args.hot else "from memory"
    print(f"Q4_K products, {len(weights)} matrices {where}, {torch.get_num_threads()} threads, ms, median of {args.rounds}")
    for k in rows:
        print(f"{k:3d} rows: " + "  ".join(f"{n} {statistics.median(times[n, k]) * 1e3:.1f}" for n, _ in runs))


if __name__ == "__main__":
    main()
