"""The drafters' own matrices (the MLP head's step and fusion, EAGLE's layer, Medusa / Hydra
blocks, MTP modules): one linear layer kind for all of them, the fastest one that runs here.

A drafter's matrices are small (the shipped head's: 3072 -> 2048, 2048 -> 1536, 6144 -> 1536) and
run on one to a few rows a step, so what a call costs is reading the weights plus per-call work.
Where the native GGUF kernels build, each matrix is re-quantized to Q6_K (6.56 bits a weight,
within half a step of each weight) and runs through them, activations quantized per 256 inputs
(quantize_q8k, in native code). Elsewhere: W8A8Linear (FBGEMM, int8 per output channel, two
passes of ~7-bit activations).

Measured on the AVX2 EPYC (Zen 3), one row, `python scripts/drafter_linear.py times`: 3072 -> 2048
0.66 ms in W8A8 two-pass against 0.22 in Q6_K (2-4x for every shipped drafter's shapes at 1-16
rows); the shipped head's first guesses agree with the target as often either way
(`... agreement 13`: 0.5707 / 0.5688; BENCHMARKS.md). Guesses only: the target checks each, so their
rounding never changes the output. Rows are computed independently in both kinds.
"""
from __future__ import annotations

import weakref

import torch

from ..kernels import KernelUnavailable, gguf_ops
from . import snapshots
from .gguf_weights import GROUP, Q6K_RECORDS, QK, REC, GGUFLinear, QuantTensor, quantize_q6k
from .quant import W8A8Linear

# id(weight) -> (a weak reference to it, what it was made of, drafter_linear of it): every drafter
# of a head in the process runs the same matrices (answers decoded together hold a drafter each),
# read only; an entry leaves with its weight
_MADE: dict[int, tuple] = {}


def drafter_linear(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """A callable x [B, in] float32 -> [B, out] float32 computing x W^T + b (weight [out, in]);
    made once for a weight and bias as they stand (their in-place version counters: a head
    changed in place gets new matrices)."""
    key, versions = id(weight), (weight._version, None if bias is None else bias._version)
    made = _MADE.get(key)
    if made is None or made[0]() is not weight or made[1] is not bias or made[2] != versions:
        made = _MADE[key] = (weakref.ref(weight, lambda _, key=key: _MADE.pop(key, None)), bias, versions,
                             _drafter_linear(weight, bias))
    return made[3]


def _drafter_linear(weight: torch.Tensor, bias: torch.Tensor | None):
    weight = weight.detach().float()
    bias = None if bias is None else bias.detach().float()
    try:
        gguf_ops()
    except KernelUnavailable:
        return W8A8Linear(weight, bias, passes=2)
    return GGUFLinear([_q6k(weight)], bias)


KEPT_FROM = 1 << 20  # weights a matrix needs for its records to be kept (a shipped drafter's: 2.6-9.4 M)
KEPT = 48  # matrices' records kept, most recently used first (~15 MB for the shipped MLP head's three)


def _q6k(weight: torch.Tensor) -> QuantTensor:
    """quantize_q6k(weight) [O, in] float32; for a large matrix, its records kept in the cache by
    the matrix's bytes (models.snapshots): a start reads the shipped head's three back in ~15 ms,
    hashing included, where quantizing them took 0.26-0.37 s (Zen 5 EPYC); the same bytes."""
    w = weight.contiguous()
    if w.numel() < KEPT_FROM:
        return quantize_q6k(w)
    digest = snapshots.digest_of(f"q6k {Q6K_RECORDS} {tuple(w.shape)}", w.numpy())
    O, n_in = w.shape
    groups, width = -(-O // GROUP), -(-n_in // QK) * REC["Q6_K"]  # the records' shape (QuantTensor)
    saved = snapshots.load_array("q6k", digest)
    if saved is not None and saved.dtype == "uint8" and saved.shape == (groups, width):
        return QuantTensor("Q6_K", O, n_in, torch.from_numpy(saved))
    q = quantize_q6k(w)
    snapshots.save_array("q6k", digest, q.w.numpy(), keep=KEPT)
    return q


def drafter_linear_of(module: torch.nn.Linear):
    """drafter_linear of an nn.Linear's weight and bias."""
    return drafter_linear(module.weight, module.bias)
