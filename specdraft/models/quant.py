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
- w8a8: int8 weights and per-row int8 activations through FBGEMM's integer GEMM, for targets
  on CPUs without native bf16: measured on an AVX2 EPYC (2 threads, Qwen2.5-Coder-1.5B, context
  300) a forward over 1/4/8/16 new tokens takes 82/96/144/257 ms against 282/531/563/769 ms with
  fp32 oneDNN weights, at a quarter of the memory (scripts/measure_forward.py). Rows stay
  bitwise independent of the block, so verification is exact (see W8A8Linear).
- w8a8-fast: w8a8 with one pass everywhere, for drafts.
"""
from __future__ import annotations

import warnings
from typing import ClassVar

import torch
import torch.nn.functional as F

WEIGHT_FORMATS = ("dense", "int8", "int4", "w8a8", "w8a8-fast", "gguf", "q4k")  # gguf, q4k: see models/gguf_weights.py


class DenseLinear:
    """Dense weights. fp32 goes through oneDNN with the weight prepacked in its own layout.

    Measured on an AVX2 CPU (2 threads, 1536x8960, scripts/measure_kernels.py): F.linear
    (MKL sgemm) takes 4.5 ms for 1 row and 18.5 ms for 16, oneDNN 2.3 ms and 6.7 ms. A flat cost
    over a block of rows is what makes verifying a draft cheap.
    """

    __slots__ = ("bias", "packed", "weight")

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


def _per_channel_int8(weight: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] (any float dtype) -> (int8 [out, in], fp32 scales [out]); symmetric, per
    output channel. Works on ``chunk`` rows at a time, so the fp32 temporaries stay small (the
    151936-row head of Qwen2.5 would otherwise need ~3 GB of them)."""
    out_f = weight.shape[0]
    q = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(out_f)
    for i in range(0, out_f, chunk):
        w = weight[i:i + chunk].float()
        s = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        q[i:i + chunk] = (w / s[:, None]).round_().clamp_(-127, 127)  # integral values: the cast is exact
        scales[i:i + chunk] = s
    return q, scales


class Int8Linear:
    __slots__ = ("bias", "dtype", "qweight", "scales")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype | None = None):
        self.qweight, scales = _per_channel_int8(weight)
        self.dtype = dtype or weight.dtype  # compute dtype
        self.scales = scales.to(self.dtype)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(self.dtype), self.qweight, self.scales)
        return y if self.bias is None else y + self.bias


class Int4Linear:
    __slots__ = ("bias", "dtype", "group", "packed", "scales_zeros")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, group: int = 32,
                 dtype: torch.dtype | None = None):
        out_f, in_f = weight.shape
        if in_f % group:
            raise ValueError(f"in_features {in_f} is not a multiple of the int4 group {group}")
        w = weight.float().view(out_f, in_f // group, group)  # [out, G, group]
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15.0).clamp_min(1e-8)
        q = ((w - lo) / scale).round().clamp(0, 15).to(torch.int32).view(out_f, in_f)
        zero = lo + 8.0 * scale  # the kernel dequantizes as (q - 8) * scale + zero
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        dtype = dtype or weight.dtype
        self.dtype = dtype if dtype != torch.float32 else torch.bfloat16
        # [in/group, out, 2]: per group and output channel, (scale, zero)
        self.scales_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], -1).transpose(0, 1).contiguous().to(self.dtype)
        self.group = group
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(self.dtype), self.packed, self.group, self.scales_zeros)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias


class W8A8Linear:
    """int8 weights (per output channel) times int8 activations (per row), through FBGEMM.

    FBGEMM's dynamic linear quantizes its input with one scale for the whole block, which would
    make a row's result depend on the other rows in the block: a verified draft could then differ
    from plain decoding. So each row is first divided by its own absolute maximum, and two
    sentinel columns (+1 and -64/63, against zero weights) pin the block's range: FBGEMM then
    always picks scale 1/63 and zero point 64 (7 bits: ``reduce_range``, so that AVX2's pairwise
    u8*s8 products cannot saturate 16 bits), the grid holds every row in [-1, 1] without
    clipping, integer accumulation is exact, and a row's output is bitwise independent of the
    block it is computed in. The row's maximum is multiplied back afterwards.

    ``passes=2`` also quantizes what the first pass rounded away (the residual, renormalised to
    its own maximum) as a second row through the same weights: ~14-bit activations for the
    layers whose inputs have outliers, at the cost of twice the rows (flat for small blocks).
    """

    __slots__ = ("bias", "in_features", "packed", "passes")

    GRID = 63.0  # quantization steps per unit of the normalised row
    # Input buffers [rows, in + 2] whose last two columns hold the sentinels, one per input width,
    # shared by every W8A8Linear (calls run one at a time): a row is normalised straight into
    # the buffer, so no per-call concatenation (a copy of the whole block) is needed.
    _buffers: ClassVar[dict[int, torch.Tensor]] = {}

    def __init__(self, weight: torch.Tensor | None, bias: torch.Tensor | None = None, passes: int = 1,
                 quantized: tuple[torch.Tensor, torch.Tensor] | None = None):
        q, scales = quantized if quantized is not None else _per_channel_int8(weight)  # [out, in], [out]
        out_f, self.in_features = q.shape
        q = torch.cat([q, q.new_zeros(out_f, 2)], 1)  # [out, in + 2]: zero weights for the sentinels
        with warnings.catch_warnings():  # torch flags quantized tensors as deprecated; FBGEMM still wants one
            warnings.simplefilter("ignore", UserWarning)
            qw = torch._make_per_channel_quantized_tensor(q, scales.double(), torch.zeros(out_f, dtype=torch.long), 0)
        self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.bias = None if bias is None else bias.float()
        self.passes = passes

    def _buffer(self, rows: int) -> torch.Tensor:
        """[rows, in + 2] input buffer: columns in, in+1 hold +1 and -64/63 (see the class doc)."""
        buf = self._buffers.get(self.in_features)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(max(rows, 64), self.in_features + 2)
            buf[:, -2] = 1.0
            buf[:, -1] = -64.0 / self.GRID
            W8A8Linear._buffers[self.in_features] = buf
        return buf[:rows]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        T = x.shape[0]
        buf = self._buffer(T * self.passes)
        xn = buf[:T, :-2]
        amax = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)  # [T, 1] (vector_norm(inf) is 10x slower)
        torch.div(x, amax, out=xn)  # rows with max |.| = 1
        if self.passes == 2:
            # what the 63-step grid loses, as a second row per token, renormalised to its own max
            res = buf[T:, :-2]
            torch.sub(xn, torch.round(xn * self.GRID).div_(self.GRID), out=res)
            rmax = res.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)
            res.div_(rmax)
            amax = torch.cat([amax, amax * rmax])
        y = torch.ops.quantized.linear_dynamic(buf, self.packed, True).mul_(amax)
        if self.passes == 2:
            y = y[:T] + y[T:]
        return y if self.bias is None else y.add_(self.bias)


class W8A8Head(W8A8Linear):
    """The output head: one-pass w8a8 logits, then the top ``refine`` logits of each row
    recomputed with full-precision activations against the int8 weights.

    What decides the next token (the argmax, and the bulk of the sampling mass) then has the
    precision of weight-only int8, for T x refine dot products instead of a second pass over the
    whole vocabulary. Each row's refinement is an elementwise product and a sum over the hidden
    size, so it too is independent of the block.
    """

    __slots__ = ("qweight", "refine", "scales")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, refine: int = 32):
        self.qweight, self.scales = _per_channel_int8(weight)  # [V, in] int8, [V]
        super().__init__(None, bias, passes=1, quantized=(self.qweight, self.scales))
        self.refine = refine

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        y = super().__call__(x)  # [T, V]
        top = y.topk(self.refine, dim=-1).indices  # [T, r]
        w = self.qweight[top].float()  # [T, r, in]
        exact = (w * x[:, None, :]).sum(-1) * self.scales[top]  # [T, r]
        if self.bias is not None:
            exact = exact + self.bias[top]
        return y.scatter_(-1, top, exact)


# Layers whose inputs carry outlier activations (measured on Qwen2.5-Coder-1.5B: most of the
# w8a8 error against dense weights comes from mlp.down_proj and the output head).
W8A8_TWO_PASS = frozenset({"down"})


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def resolve_format(fmt: str, dtype: torch.dtype, draft: bool, gguf: bool = False, kernels: bool = False) -> str:
    """"auto" -> the measured fastest weight format for this CPU and compute dtype.

    bf16 (AMX CPUs): dense for a target (a bf16 block forward costs about one token), int4 for a
    draft. fp32 (CPUs without native bf16): for a target, gguf where its GGUF file's tensors have
    kernels here (``gguf``: measured 60 ms a token against w8a8's 84 on an AVX2 EPYC), else w8a8;
    for a draft, q4k where the GGUF kernels build here (``kernels``: the default 0.5B draft, one
    token at context 300 on the AVX2 EPYC: w8a8-fast 85 ms, q4k see BENCHMARKS.md), else
    w8a8-fast; dense / int4 without FBGEMM.
    """
    if fmt != "auto":
        return fmt
    if dtype == torch.float32 and not draft and gguf:
        return "gguf"
    if dtype == torch.float32 and draft and kernels:
        return "q4k"
    if dtype == torch.float32 and fbgemm_available():
        return "w8a8-fast" if draft else "w8a8"
    return "int4" if draft else "dense"


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str, role: str = "",
                dtype: torch.dtype | None = None):
    """A linear layer over ``weight`` [out, in] (as stored: any float dtype) in the given format.

    dtype: the compute dtype (default: the weight's). Quantized formats read the stored weight
    directly, chunk by chunk, so no full-size converted copy of a large matrix is made.
    role: "qkv", "o", "gate_up", "down" or "head"; lets a format treat layers differently.
    """
    dtype = dtype or weight.dtype
    if weight.dtype.itemsize > dtype.itemsize:
        weight = weight.to(dtype)  # round as the compute dtype would; widening (exact) is left to the format
    if fmt == "dense":
        return DenseLinear(weight.to(dtype).contiguous(), bias)
    if fmt == "int8":
        return Int8Linear(weight, bias, dtype)
    if fmt == "int4":
        return Int4Linear(weight, bias, dtype=dtype)
    if fmt == "w8a8" and role == "head":
        return W8A8Head(weight, bias)
    if fmt == "w8a8":
        return W8A8Linear(weight, bias, passes=2 if role in W8A8_TWO_PASS else 1)
    if fmt == "w8a8-fast":  # one pass everywhere: for drafts, whose numerics only move acceptance
        return W8A8Linear(weight, bias)
    raise ValueError(f"unknown weight format {fmt!r}; choose one of {WEIGHT_FORMATS}")
