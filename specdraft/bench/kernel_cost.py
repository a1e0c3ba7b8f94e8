"""The GGUF kernels' cost per ISA path, over k new tokens, with no model on disk.

One "forward" here is every matrix product of the default target (Qwen2.5-Coder-1.5B in Q4_K_M:
28 layers, hidden 1536, MLP 8960, vocabulary 151936), in layer order, over weights of that size
in the kernels' record layout (random quants, finite scales: ~1 GB, so the weights stream from
memory as a real model's do). Attention, norms and Python are left out: this is the part of a
forward the ISA paths change. Paths and block sizes are timed round robin, as forward_costs
times models, so a slow phase of the machine hits every path and ratio alike.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..errors import ParameterError, SpecdraftError
from ..kernels import KernelUnavailable, gguf_ops
from ..kernels.plan import DEFAULT_TARGET_SHAPES
from ..models.gguf_weights import GROUP, QK, REC, QuantTensor, set_q6k_offsets
from ..models.hugepages import in_huge_pages

_SCALES = {"Q4_K": (1152, 1216), "Q6_K": (1664, 1696)}  # byte range of a record's f32 scales (d, dmin)


def random_records(kind: str, out_f: int, in_f: int, gen: torch.Generator) -> QuantTensor:
    """A matrix of random quants in the kernels' layout, its scales small finite floats, in 2 MB
    pages where a model's records get them (models.hugepages)."""
    groups, nb = -(-out_f // GROUP), in_f // QK
    w = torch.randint(0, 256, (groups, nb, REC[kind]), dtype=torch.uint8, generator=gen)
    lo, hi = _SCALES[kind]
    w[..., lo:hi] = (torch.rand(groups, nb, (hi - lo) // 4, generator=gen) * 1e-3).view(torch.uint8)
    if kind == "Q6_K":
        set_q6k_offsets(w)  # what the records of a real matrix carry
    return QuantTensor(kind, out_f, in_f, in_huge_pages(w.reshape(groups, -1)))  # as a model's records lie


def product(ops, w: QuantTensor, xq) -> torch.Tensor:
    """The kernels' product of quantized activations xq (quantize_q8k's triple) and records w."""
    return (ops.q4k_matmul if w.kind == "Q4_K" else ops.q6k_matmul)(*xq, w.w, w.out_features)


def kernel_paths(spec: str, flag: str) -> tuple[object, list[str]]:
    """spec: ISA paths, comma-separated, or "all" this CPU has -> (the kernels' module, the paths);
    a one-line SpecdraftError where the kernels cannot run or the CPU lacks a path (``flag`` names
    the option in it)."""
    try:
        ops = gguf_ops()
    except KernelUnavailable as e:
        raise SpecdraftError(str(e)) from None
    have = ops.kernel_paths()
    paths = have if spec == "all" else [p.strip() for p in spec.split(",")]
    missing = [p for p in paths if p not in have]
    if missing:
        raise ParameterError(f"{flag}: this CPU cannot run {', '.join(missing)} (it has {', '.join(have)})")
    if len(set(paths)) < len(paths):
        raise ParameterError(f"{flag} names a path twice: {spec!r}")
    return ops, paths


def kernel_costs(spec: str, blocks=(1, 2, 4, 8, 16, 32), shapes=DEFAULT_TARGET_SHAPES, repeats: int = 5,
                 warmup: int = 1) -> tuple[list[str], dict[str, dict[str, list]]]:
    """spec: ISA paths (see kernel_paths) -> (paths, {path: {"tokens": [k...], "seconds": [median
    time of all products over k rows...]}})."""
    ops, paths = kernel_paths(spec, "--kernels")
    gen = torch.Generator().manual_seed(0)
    weights = [random_records(kind, o, i, gen) for kind, o, i in shapes]
    before = ops.kernel_path()
    xq = {k: {i: ops.quantize_q8k(torch.randn(k, i, generator=gen)) for i in {w.in_features for w in weights}}
          for k in blocks}
    times: dict[tuple[str, int], list[float]] = {(p, k): [] for p in paths for k in blocks}
    try:
        for r in range(warmup + repeats):  # round robin over blocks and paths
            for k in blocks:
                for p in paths:
                    ops.set_kernel_path(p)
                    t0 = time.perf_counter()
                    for w in weights:
                        product(ops, w, xq[k][w.in_features])
                    if r >= warmup:
                        times[p, k].append(time.perf_counter() - t0)
    finally:
        ops.set_kernel_path(before)
    return paths, {p: {"tokens": list(blocks), "seconds": [statistics.median(times[p, k]) for k in blocks]} for p in paths}
