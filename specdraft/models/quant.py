"""Linear layers over dense or weight-only quantized weights.

The runtime calls every projection through one of these objects: ``lin(x)`` with x [T, in]
returns [T, out]. Dense uses F.linear (oneDNN; AMX for bf16). The quantized forms use torch's
own CPU weight-only kernels, which read 4 or 8 bits per weight: on this 2-core CPU memory
traffic dominates a one-token forward, so they make a draft model several times cheaper. A
drafter's numerics need not match anything, so quantizing it loses nothing but a little
acceptance.

- int8: per-output-channel symmetric scales, ``aten._weight_int8pack_mm``.
- int4: groups of ``group`` input weights with a scale and an offset (asymmetric), packed for
  ``aten._weight_int4pack_mm_for_cpu``; the kernel computes ``(q - 8) * scale + zero``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

WEIGHT_FORMATS = ("dense", "int8", "int4")


class DenseLinear:
    """Dense weights. fp32 goes through oneDNN with the weight prepacked in its own layout.

    Measured on an AVX2 CPU (2 threads, 1536x8960, scripts/measure_kernels.py): F.linear
    (MKL sgemm) takes 4.5 ms for 1 row and 18.5 ms for 16, oneDNN 2.3 ms and 6.7 ms. A flat cost
    over a block of rows is what makes verifying a draft cheap.
    """

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight  # [out, in]
        self.bias = bias  # [out] | None
        self.packed = None
        if weight.dtype == torch.float32 and _onednn_fp32():
            self.packed = weight.to_mkldnn()  # oneDNN blocked layout; the dense copy is dropped
            self.weight = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _onednn_fp32() -> bool:
    import os

    return torch.backends.mkldnn.is_available() and os.environ.get("SPECDRAFT_ONEDNN", "1") != "0"


class Int8Linear:
    __slots__ = ("qweight", "scales", "bias", "dtype")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        w = weight.float()
        scales = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0  # [out]
        self.qweight = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()  # [out, in]
        self.dtype = weight.dtype
        self.scales = scales.to(self.dtype)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(self.dtype), self.qweight, self.scales)
        return y if self.bias is None else y + self.bias


class Int4Linear:
    __slots__ = ("packed", "scales_zeros", "group", "bias", "dtype")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, group: int = 32):
        out_f, in_f = weight.shape
        if in_f % group:
            raise ValueError(f"in_features {in_f} is not a multiple of the int4 group {group}")
        w = weight.float().view(out_f, in_f // group, group)  # [out, G, group]
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15.0).clamp_min(1e-8)
        q = ((w - lo) / scale).round().clamp(0, 15).to(torch.int32).view(out_f, in_f)
        zero = lo + 8.0 * scale  # the kernel dequantizes as (q - 8) * scale + zero
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        self.dtype = weight.dtype if weight.dtype != torch.float32 else torch.bfloat16
        # [in/group, out, 2]: per group and output channel, (scale, zero)
        self.scales_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], -1).transpose(0, 1).contiguous().to(self.dtype)
        self.group = group
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(self.dtype), self.packed, self.group, self.scales_zeros)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str):
    """A linear layer over ``weight`` [out, in] in the given weight format."""
    if fmt == "dense":
        return DenseLinear(weight, bias)
    if fmt == "int8":
        return Int8Linear(weight, bias)
    if fmt == "int4":
        return Int4Linear(weight, bias)
    raise ValueError(f"unknown weight format {fmt!r}; choose one of {WEIGHT_FORMATS}")
