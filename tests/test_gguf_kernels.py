"""The GGUF weight format: unpacking Q4_K / Q6_K blocks and the native kernels over them.

Blocks are random bytes (every byte pattern is a valid block once the fp16 scales are finite);
the reference dequantization is the gguf package's own, an independent implementation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specdraft.kernels import KernelUnavailable, gguf_ops
from specdraft.models.gguf_weights import GGUFLinear, QuantTensor, gguf_name, quantize_q4k, quantize_q6k, unpack_q4k, unpack_q6k

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}


@pytest.fixture(scope="module")
def ops():
    try:
        return gguf_ops()
    except KernelUnavailable as e:  # no AVX2 CPU or no compiler: the format falls back to w8a8
        pytest.skip(str(e))


def random_blocks(kind: str, out_f: int, in_f: int, seed: int, scale: tuple[float, float] = (1e-3, 2e-2)) -> np.ndarray:
    """[out, in/256 * block bytes] uint8: random quants, with finite fp16 scales drawn from ``scale``."""
    rng = np.random.default_rng(seed)
    nb = in_f // 256
    b = rng.integers(0, 256, size=(out_f, nb, BLOCK_BYTES[kind]), dtype=np.uint8)
    scales = rng.uniform(*scale, size=(out_f, nb, 2)).astype(np.float16).view(np.uint8).reshape(out_f, nb, 4)
    if kind == "Q4_K":
        b[..., 0:4] = scales  # d, dmin
    else:
        b[..., 208:210] = scales[..., :2]  # d
    return b.reshape(out_f, -1)


def quant_tensor(kind: str, out_f: int, in_f: int, seed: int) -> tuple[QuantTensor, torch.Tensor]:
    blocks = random_blocks(kind, out_f, in_f, seed)
    unpack = unpack_q4k if kind == "Q4_K" else unpack_q6k
    ref = dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind)).reshape(out_f, in_f)
    return QuantTensor(kind, out_f, in_f, unpack(blocks)), torch.from_numpy(ref.astype(np.float32))


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_unpacked_blocks_dequantize_as_gguf_does(kind):
    qt, ref = quant_tensor(kind, 24, 512, seed=1)
    assert torch.equal(qt.dequantize(), ref)
    assert torch.equal(qt.rows(5).dequantize(), ref[:5])


def test_q6k_records_carry_their_weights_offsets():
    """Each Q6_K record row's int32 at 1696 is 128 * sum_s sc[s] * sum (q - 32) over sub-block s,
    computed here from the GGUF block's own fields (the VNNI kernels subtract it; a wrong one
    changes their sums, which the path tests compare with the AVX2 kernels' where both run)."""
    b = random_blocks("Q6_K", 11, 512, seed=5)  # a partial last record: padded rows carry 0
    rec = unpack_q6k(b).reshape(2, 2, 1728)
    off = rec[..., 1696:].contiguous().view(torch.int32).reshape(2, 2, 8).permute(0, 2, 1).reshape(16, 2)
    w = torch.from_numpy(dequantize(b.reshape(11, -1), gguf.GGMLQuantizationType.Q6_K).reshape(11, 2, 16, 16))
    # W = d * sc * (q - 32), so sum_s sc * sum (q - 32) = sum_s sum W / d per super-block
    d = torch.from_numpy(b.reshape(11, 2, 210)[..., 208:210].copy().view(np.float16).astype(np.float32)[..., 0])
    expect = (128 * w.double().sum((2, 3)) / d.double()).round().long()
    assert torch.equal(off[:11].long(), expect) and not off[11:].any()


def test_activation_quantization(ops):
    x = torch.randn(3, 512) * torch.tensor([1.0, 50.0, 1e-3])[:, None]
    x[2, :256] = 0  # an all-zero block
    qx, xs, bsums = ops.quantize_q8k(x)
    assert qx.abs().max() <= 127 and xs.shape == (3, 2) and xs[2, 0] == 0
    assert torch.equal(bsums.long(), qx.long().reshape(3, -1, 16).sum(-1))
    back = (qx.float().reshape(3, 2, 256) * xs[..., None]).reshape(3, 512)
    assert ((back - x).abs().reshape(3, 2, 256) <= xs[..., None] / 2 * 1.001).all()  # round to nearest
    assert qx.reshape(3, 2, 256).abs().amax(-1)[xs > 0].eq(127).all()  # each block uses the full range


@pytest.mark.parametrize("kinds", [("Q4_K",), ("Q6_K",), ("Q4_K", "Q6_K", "Q4_K"), ("Q4_K", "Q4_K", "Q6_K")])
def test_kernel_matches_dequantized_product(ops, kinds):
    parts, refs = zip(*(quant_tensor(k, 40 + 8 * i, 768, seed=10 + i) for i, k in enumerate(kinds)))
    bias = torch.randn(sum(p.out_features for p in parts))
    lin = GGUFLinear(list(parts), bias)
    w = torch.cat(refs).double()
    for T in (1, 2, 3, 4, 5, 8, 9, 16):  # the AVX2 kernels take up to 8 rows a pass
        x = torch.randn(T, 768)
        qx, xs, _ = ops.quantize_q8k(x)
        xq = (qx.double().reshape(T, 3, 256) * xs.double()[..., None]).reshape(T, 768)  # what the kernel multiplies
        expect = xq @ w.T + bias.double()
        got = lin(x)
        assert got.shape == (T, w.shape[0]) and got.dtype == torch.float32
        assert (got.double() - expect).abs().max() <= 1e-5 * expect.abs().max()
        assert (got.double() - (x.double() @ w.T + bias.double())).abs().max() <= 0.05 * expect.abs().max()


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("fill", [0xFF, 0x80])
def test_extreme_blocks_do_not_overflow(ops, kind, fill):
    """Largest quants and scales against |qx| = 127 everywhere: the kernel's 16-bit partial sums
    (maddubs pairs) and 32-bit block sums are at their largest and must not wrap or saturate."""
    blocks = random_blocks(kind, 8, 512, seed=6).reshape(8, 2, BLOCK_BYTES[kind])
    if kind == "Q4_K":
        blocks[..., 4:] = fill  # 6-bit scales and mins 63 (0xFF), every nibble 15 (0xFF) or 0/8
    else:
        blocks[..., :208] = fill  # q = 63 (0xFF); scales -128 (0x80)
    blocks = blocks.reshape(8, -1)
    unpack = unpack_q4k if kind == "Q4_K" else unpack_q6k
    ref = dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind)).reshape(8, 512)
    lin = GGUFLinear([QuantTensor(kind, 8, 512, unpack(blocks))])
    x = torch.ones(9, 512)
    x[1] = -1
    x[2, ::2] = -1
    x[3:] = torch.randn(6, 512).sign()
    expect = x.double() @ torch.from_numpy(ref.astype(np.float64)).T  # |x| = 1 quantizes exactly
    for T in (1, 2, 3, 4, 7, 8, 9):
        got = lin(x[:T]).double()
        assert (got - expect[:T]).abs().max() <= 1e-5 * expect.abs().max()


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_rows_are_independent_of_the_block(ops, kind):
    """Verification computes a row inside a block of T rows; plain decoding alone: same bits."""
    qt, _ = quant_tensor(kind, 33, 512, seed=3)
    lin = GGUFLinear([qt])
    x = torch.randn(45, 512)
    full = lin(x)  # the kernel cuts a block of more than 32 rows into passes: no bit changes
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(45)]), full)
    x, full = x[:11], full[:11]
    for T in (1, 2, 3, 4, 5, 7, 8):
        for start in range(0, 11 - T + 1, 3):
            assert torch.equal(lin(x[start:start + T]), full[start:start + T])


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_product_split_over_threads_gives_every_row_once(ops, kind, threads):
    """Products of 2+ rows hand the threads a share each and the rest in chunks as they free up
    (gguf_common.h balanced_for): every output row computed exactly once (y starts uninitialised),
    the same bits as one row at a time, for any thread count, including a record partly padding."""
    qt, ref = quant_tensor(kind, 8 * 97 + 5, 512, seed=4)  # 98 groups of 8: a share each, then chunks
    lin = GGUFLinear([qt])
    x = torch.randn(5, 512)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = lin(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got, torch.cat([lin(x[i:i + 1]) for i in range(5)]))
    qx, xs, _ = ops.quantize_q8k(x)
    xq = (qx.double().reshape(5, 2, 256) * xs.double()[..., None]).reshape(5, 512)
    expect = xq @ ref.double().T
    assert (got.double() - expect).abs().max() <= 1e-5 * expect.abs().max()


def test_a_build_killed_half_way_does_not_hang_the_next_start(ops):
    """torch's loader waits without end on a lock file a killed build left behind; the kernels'
    loader clears it under an OS lock of its own (specdraft.kernels.build_kernels)."""
    import subprocess
    import sys

    from specdraft.kernels import gguf_build_dir

    build = gguf_build_dir()
    (build / "lock").touch()  # as a build killed between taking torch's lock and releasing it leaves it
    r = subprocess.run([sys.executable, "-c", "from specdraft.kernels import gguf_ops; print(gguf_ops().kernel_path())"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() in ops.kernel_paths() and not (build / "lock").exists()


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_first_rows_and_dequantize_rows(ops, kind):
    """Any number of first rows, also one that ends inside a Q4_K record of 8 interleaved rows."""
    qt, ref = quant_tensor(kind, 64, 256, seed=4)
    lin = GGUFLinear([qt])
    x = torch.randn(2, 256)
    for n in (10, 16, 63):
        assert torch.equal(lin.first_rows(n)(x), lin(x)[:, :n])
        assert torch.equal(lin.dequantize_rows(n), ref[:n])


def test_parts_with_a_partial_q4k_record_are_not_merged(ops):
    """Stacked parts whose first ends inside a record of 8 rows stay two kernel calls, same result."""
    (a, ra), (b, rb) = quant_tensor("Q4_K", 13, 512, seed=7), quant_tensor("Q4_K", 16, 512, seed=8)
    lin = GGUFLinear([a, b])
    assert len(lin.parts) == 2 and a.w.shape[0] == 2
    x = torch.randn(3, 512)
    qx, xs, _ = ops.quantize_q8k(x)
    xq = (qx.double().reshape(3, 2, 256) * xs.double()[..., None]).reshape(3, 512)
    expect = xq @ torch.cat([ra, rb]).double().T
    assert (lin(x).double() - expect).abs().max() <= 1e-5 * expect.abs().max()


def test_activations_are_padded_to_whole_super_blocks(ops):
    """A width that is not a multiple of 256 (SmolLM2: 576, Qwen2.5-0.5B: 896) is quantized as if
    zeros followed it: the padded weights of weight format q4k meet zeros."""
    x = torch.randn(3, 576)
    qx, xs, bsums = ops.quantize_q8k(x)
    ref = ops.quantize_q8k(torch.cat([x, torch.zeros(3, 192)], 1))
    assert qx.shape == (3, 768) and xs.shape == (3, 3) and bsums.shape == (3, 48)
    assert torch.equal(qx, ref[0]) and torch.equal(xs, ref[1]) and torch.equal(bsums, ref[2])
    assert not qx[:, 576:].any()


@pytest.mark.parametrize("in_f", [576, 512])
def test_quantize_q4k_round_trip_and_kernel(ops, in_f):
    """Weight format q4k: float weights -> Q4_K records. Each weight is within half a stored quant
    step of its value (nothing clipped), rows that are all zero stay zero, and the kernel
    multiplies the padded records as their dequantized copy."""
    torch.manual_seed(0)
    w = torch.randn(21, in_f) * torch.logspace(-3, 0, 21)[:, None]  # rows of very different scales
    w[4] = 0.0
    w[7, :64] += 3.0  # a sub-block far from zero: its minimum is clamped at 0 and the scale grows
    qt = quantize_q4k(w)
    assert qt.kind == "Q4_K" and (qt.out_features, qt.in_features) == (21, in_f)
    assert qt.w.shape == (3, -(-in_f // 256) * 1216)
    back = qt.dequantize()
    assert back.shape == w.shape and not back[4].any()
    width = -(-in_f // 256) * 256
    sub = torch.nn.functional.pad(w, (0, width - in_f)).reshape(21, -1, 8, 32)  # [o, super-block, sub-block, 32]
    lo = sub.amin(-1).clamp(max=0)
    step = (sub.amax(-1) - lo) / 15
    # the 6-bit factors round outwards by at most one unit of their super-block each
    step_stored = step + step.amax(-1, keepdim=True) / 63 * 1.1 + (-lo).amax(-1, keepdim=True) / 63 / 15 * 1.1
    err = torch.nn.functional.pad(back - w, (0, width - in_f)).abs().reshape(21, -1, 8, 32)
    assert (err <= step_stored[..., None] / 2 * 1.01 + 1e-7).all()
    assert (back - w).norm() <= 0.1 * w.norm()
    lin = GGUFLinear([qt])
    for T in (1, 3):
        x = torch.randn(T, in_f)
        qx, xs, _ = ops.quantize_q8k(x)
        nb = qx.shape[1] // 256
        xq = (qx.double().reshape(T, nb, 256) * xs.double()[..., None]).reshape(T, -1)[:, :in_f]
        expect = xq @ back.double().T
        assert (lin(x).double() - expect).abs().max() <= 1e-5 * expect.abs().max()


@pytest.mark.parametrize("in_f", [576, 512])
def test_quantize_q6k_round_trip_and_kernel(ops, in_f):
    """Drafters' matrices (models.small_linear): float weights -> Q6_K records. Each weight is
    within half a stored quant step of its value (nothing clipped; the step is the sub-block's
    |max| / 31 rounded up to a multiple of its super-block's unit), zero rows stay zero, and the
    kernel multiplies the padded records as their dequantized copy."""
    torch.manual_seed(0)
    w = torch.randn(21, in_f) * torch.logspace(-3, 0, 21)[:, None]  # rows of very different scales
    w[4] = 0.0
    w[7, :64] += 3.0  # one sub-block far from zero: its super-block's unit grows
    qt = quantize_q6k(w)
    assert qt.kind == "Q6_K" and (qt.out_features, qt.in_features) == (21, in_f)
    assert qt.w.shape == (3, -(-in_f // 256) * 1728)
    back = qt.dequantize()
    assert back.shape == w.shape and not back[4].any()
    width = -(-in_f // 256) * 256
    sub = torch.nn.functional.pad(w, (0, width - in_f)).reshape(21, -1, 16, 16)  # [o, super-block, sub-block, 16]
    step = sub.abs().amax(-1) / 31
    step_stored = step + step.amax(-1, keepdim=True) / 127 * 1.01  # rounded up by at most one unit
    err = torch.nn.functional.pad(back - w, (0, width - in_f)).abs().reshape(21, -1, 16, 16)
    assert (err <= step_stored[..., None] / 2 * 1.01 + 1e-7).all()
    assert (back - w).norm() <= 0.03 * w.norm()
    lin = GGUFLinear([qt], torch.arange(21.0))
    for T in (1, 3):
        x = torch.randn(T, in_f)
        qx, xs, _ = ops.quantize_q8k(x)
        nb = qx.shape[1] // 256
        xq = (qx.double().reshape(T, nb, 256) * xs.double()[..., None]).reshape(T, -1)[:, :in_f]
        expect = xq @ back.double().T + torch.arange(21.0).double()
        assert (lin(x).double() - expect).abs().max() <= 1e-5 * expect.abs().max()


def test_bad_inputs_are_refused(ops):
    qt, _ = quant_tensor("Q4_K", 8, 256, seed=5)
    xq = ops.quantize_q8k(torch.randn(2, 512))  # 512 inputs against a 256-input matrix
    with pytest.raises(RuntimeError, match="records"):
        ops.q4k_matmul(*xq, qt.w, qt.out_features)
    with pytest.raises(RuntimeError, match="records"):
        ops.q6k_matmul(*xq, qt.w, qt.out_features)


def test_issue_rates_probe_the_vector_units_on_every_cpu(ops):
    """The bench's phase probe: two positive rates (no CPU-specific figure asserted), about the time
    asked for, and a bad duration refused."""
    import time

    t0 = time.perf_counter()
    paddw, maddubs = ops.issue_rates(0.02)
    assert time.perf_counter() - t0 < 1.0
    assert paddw > 1e8 and maddubs > 1e8  # instructions per second
    with pytest.raises(RuntimeError, match="seconds"):
        ops.issue_rates(0.0)


def test_gguf_names():
    assert gguf_name("model.layers.3.mlp.up_proj.weight") == "blk.3.ffn_up.weight"
    assert gguf_name("model.layers.0.self_attn.o_proj.weight") == "blk.0.attn_output.weight"
    assert gguf_name("lm_head.weight") == "output.weight"
    assert gguf_name("model.layers.0.self_attn.q_proj.bias") is None
    assert gguf_name("model.embed_tokens.weight") is None


def test_auto_formats():
    """fp32 drafts take q4k where the kernels build, targets their GGUF file's own weights; bf16
    (AMX) machines keep dense targets and int4 drafts."""
    from specdraft.models.quant import fbgemm_available, resolve_format

    assert resolve_format("auto", torch.float32, draft=True, kernels=True) == "q4k"
    assert resolve_format("auto", torch.float32, draft=True, kernels=False) == ("w8a8-fast" if fbgemm_available() else "int4")
    assert resolve_format("auto", torch.float32, draft=False, gguf=True, kernels=True) == "gguf"
    assert resolve_format("auto", torch.bfloat16, draft=True, kernels=True) == "int4"
    assert resolve_format("auto", torch.bfloat16, draft=False) == "dense"
    assert resolve_format("w8a8", torch.float32, draft=True, kernels=True) == "w8a8"
