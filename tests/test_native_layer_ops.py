"""The fused native steps of the GGUF runtime's layers: attention, norm + quantize, SwiGLU +
quantize, RoPE + cache write (specdraft/kernels/attention.cpp, layer_ops.cpp).

Two properties each: close to a float64 reference, and every row computed independently of
the block around it (what keeps speculative verification exact).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdraft.kernels import KernelUnavailable, gguf_ops

NH, NKV, HD, C = 6, 2, 64, 192  # grouped-query: 3 query heads per kv head


@pytest.fixture(scope="module")
def ops():
    try:
        return gguf_ops()
    except KernelUnavailable as e:
        pytest.skip(str(e))


def reference_attention(q, k, v, allowed):
    """float64 softmax attention. q [nh, T, hd], k/v [nkv, L, hd], allowed [T, L] -> [T, nh, hd]."""
    g = q.shape[0] // k.shape[0]
    kk, vv = k.double().repeat_interleave(g, 0), v.double().repeat_interleave(g, 0)
    s = q.double() @ kk.transpose(1, 2) / q.shape[-1] ** 0.5
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
    return (p @ vv).transpose(0, 1)


def cache(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(NKV, C, HD, generator=g), torch.randn(NKV, C, HD, generator=g)


@pytest.mark.parametrize("T,L", [(1, 1), (1, 77), (5, 77), (16, 130)])
def test_attention_matches_reference_and_decoding(ops, T, L):
    k, v = cache(T + L)
    q = torch.randn(NH, T, HD, generator=torch.Generator().manual_seed(L))
    got = ops.block_attention(q, k, v, L)
    causal = torch.ones(T, L, dtype=torch.bool).tril_(L - T)
    torch.testing.assert_close(got.double(), reference_attention(q, k[:, :L], v[:, :L], causal), atol=1e-5, rtol=1e-5)
    for t in range(T):  # each row is bit for bit what a one-token decode at its position computes
        one = ops.block_attention(q[:, t:t + 1].contiguous(), k, v, L - T + t + 1)
        assert torch.equal(one[0], got[t])


def test_attention_flushes_denormal_terms_and_restores_the_float_mode(ops):
    """A key at the exp's clamp (e^-87 ~ 1.6e-38) times a small value is a denormal term; the
    kernel flushes it (Intel cores take a microcode assist per denormal operation), so the row's
    output is exactly 0, and the caller's float mode is what it was (denormals still made after)."""
    k = torch.zeros(NKV, C, HD)
    v = torch.zeros(NKV, C, HD)
    k[:, 1, 0] = -120.0  # q . k / sqrt(hd) = -120: e^(s - max) clamped to e^-87
    v[:, 1, :] = 1e-3  # e^-87 * 1e-3 ~ 1.6e-41: denormal
    q = torch.zeros(NH, 1, HD)
    q[:, 0, 0] = HD ** 0.5
    out = ops.block_attention(q, k, v, 2)
    assert torch.equal(out, torch.zeros_like(out))
    tiny = torch.tensor([1e-37], dtype=torch.float32) * torch.tensor([1e-3], dtype=torch.float32)
    assert tiny.item() != 0.0  # this thread's MXCSR restored: torch still makes denormals


def test_tree_rows_equal_decoding_their_path(ops):
    """A tree node sees the prefix and its ancestors at scattered cache slots; its row must equal
    decoding its path with those keys next to the prefix (what the cache holds after compaction)."""
    prefix, parents = 40, [-1, 0, 0, 1, 2, 3]  # 6 nodes: two branches under node 0
    T = len(parents)
    k, v = cache(3)
    q = torch.randn(NH, T, HD, generator=torch.Generator().manual_seed(4))
    mask = torch.zeros(T, prefix + T, dtype=torch.bool)
    mask[:, :prefix] = True
    for i, p in enumerate(parents):
        mask[i, prefix + i] = True
        while p >= 0:
            mask[i, prefix + p] = True
            p = parents[p]
    got = ops.block_attention(q, k, v, prefix + T, mask)
    torch.testing.assert_close(got.double(), reference_attention(q, k[:, :prefix + T], v[:, :prefix + T], mask),
                               atol=1e-5, rtol=1e-5)
    for i in range(T):
        path = mask[i, prefix:].nonzero().flatten() + prefix  # ancestors then the node, ascending
        kc, vc = k.clone(), v.clone()
        kc[:, prefix:prefix + len(path)], vc[:, prefix:prefix + len(path)] = k[:, path], v[:, path]
        one = ops.block_attention(q[:, i:i + 1].contiguous(), kc, vc, prefix + len(path))
        assert torch.equal(one[0], got[i])


@pytest.mark.parametrize("nh,nkv,hd", [(12, 2, 128), (7, 1, 64), (4, 4, 32), (8, 2, 16), (28, 2, 48)])
def test_attention_avx512_loops_give_the_avx2_bits(ops, nh, nkv, hd):
    """On the AVX-512 kernel paths attention's inner loops run in zmm (attention_avx512.cpp): two
    heads a vector for the scores, odd head counts' last head by the AVX2 loop, 16 to 64 dims a
    pass for the values; every row must be bit for bit what the AVX2 loops give."""
    if "avx512-vnni" not in ops.kernel_paths():
        pytest.skip(f"no AVX-512 VNNI on this CPU (paths: {', '.join(ops.kernel_paths())})")
    g = torch.Generator().manual_seed(nh * hd)
    k, v = torch.randn(nkv, 64, hd, generator=g), torch.randn(nkv, 64, hd, generator=g)
    before = ops.kernel_path()
    try:
        for T, L, masked in [(1, 1, False), (1, 37, False), (16, 50, False), (5, 13, True)]:
            q = torch.randn(nh, T, hd, generator=g)
            mask = (torch.rand(T, L, generator=g) < 0.7) if masked else None
            ops.set_kernel_path("avx2")
            want = ops.block_attention(q, k, v, L, mask)
            ops.set_kernel_path("avx512-vnni")
            assert torch.equal(ops.block_attention(q, k, v, L, mask), want)
    finally:
        ops.set_kernel_path(before)


def dequantized(xq):
    qx, xs = xq[0], xq[1]
    return (qx.float().view(qx.shape[0], -1, 256) * xs[..., None]).view(qx.shape)


# widths: whole super-blocks, and one padded to them (the rows' tails quantize as zeros); rows
# 5 x 3 blocks split between threads inside a row
@pytest.mark.parametrize("T, width", [(1, 512), (3, 512), (40, 512), (1, 640), (5, 640)])
def test_rms_quantize(ops, T, width):
    x = torch.randn(T, width) * 5
    w = torch.rand(width) + 0.5
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    got = ops.rms_quantize(x, w, 1e-6)
    step = ops.quantize_q8k(ref)[1].repeat_interleave(256, 1)[:, :width]  # one quantum of each block
    assert ((dequantized(got)[:, :width] - ref).abs() <= 0.51 * step + 1e-6).all()
    assert not got[0][:, width:].any()
    for t in range(T):
        assert all(torch.equal(a[t], b[0]) for a, b in zip(got, ops.rms_quantize(x[t:t + 1].contiguous(), w, 1e-6)))


@pytest.mark.parametrize("T, width", [(1, 512), (4, 512), (33, 512), (1, 640), (5, 640)])
def test_swiglu_quantize(ops, T, width):
    gu = torch.randn(T, 2 * width) * 6
    gu[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -30.0])  # exp's clamps, and zero
    g, u = gu.chunk(2, -1)
    ref = F.silu(g.double()) * u.double()
    got = ops.swiglu_quantize(gu)
    step = ops.quantize_q8k(ref.float().contiguous())[1].double().repeat_interleave(256, 1)[:, :width]
    assert ((dequantized(got)[:, :width].double() - ref).abs() <= 0.51 * step + 1e-5).all()
    assert not got[0][:, width:].any()
    for t in range(T):
        assert all(torch.equal(a[t], b[0]) for a, b in zip(got, ops.swiglu_quantize(gu[t:t + 1].contiguous())))


def test_rope_cache(ops):
    T, start = 3, 10
    qkv = torch.randn(T, (NH + 2 * NKV) * HD)
    cos, sin = torch.randn(T, HD), torch.randn(T, HD)
    kc, vc = torch.zeros(NKV, C, HD), torch.zeros(NKV, C, HD)
    q = ops.rope_cache(qkv, cos, sin, kc, vc, start, NH)
    heads = qkv.view(T, NH + 2 * NKV, HD).transpose(0, 1)
    rot = heads[:NH + NKV] * cos + torch.roll(heads[:NH + NKV], HD // 2, -1) * sin
    torch.testing.assert_close(q, rot[:NH])
    torch.testing.assert_close(kc[:, start:start + T], rot[NH:])
    assert torch.equal(vc[:, start:start + T], heads[NH + NKV:])
    assert kc[:, :start].abs().sum() == 0 and kc[:, start + T:].abs().sum() == 0  # nothing else written


def test_rope_cache_with_head_norms(ops):
    """Qwen3: each q / k head RMS-normalised over its hd values (own weights for q and k) before
    RoPE; v as it comes."""
    T, start, eps = 3, 10, 1e-6
    g = torch.Generator().manual_seed(4)
    qkv = 3 * torch.randn(T, (NH + 2 * NKV) * HD, generator=g)
    cos, sin = torch.randn(T, HD, generator=g), torch.randn(T, HD, generator=g)
    qn, kn = 1 + 0.3 * torch.randn(HD, generator=g), 1 + 0.3 * torch.randn(HD, generator=g)
    kc, vc = torch.zeros(NKV, C, HD), torch.zeros(NKV, C, HD)
    q = ops.rope_cache(qkv, cos, sin, kc, vc, start, NH, qn, kn, eps)
    heads = qkv.view(T, NH + 2 * NKV, HD).transpose(0, 1)
    qk = heads[:NH + NKV] * torch.rsqrt(heads[:NH + NKV].pow(2).mean(-1, keepdim=True) + eps)
    qk = torch.cat([qk[:NH] * qn, qk[NH:] * kn])
    rot = qk * cos + torch.roll(qk, HD // 2, -1) * sin
    torch.testing.assert_close(q, rot[:NH])
    torch.testing.assert_close(kc[:, start:start + T], rot[NH:])
    assert torch.equal(vc[:, start:start + T], heads[NH + NKV:])
    with pytest.raises(RuntimeError, match="together"):
        ops.rope_cache(qkv, cos, sin, kc, vc, start, NH, qn, None, eps)


def test_bad_shapes_are_refused(ops):
    k, v = cache(0)
    q = torch.randn(NH, 2, HD)
    with pytest.raises(RuntimeError, match="mask"):
        ops.block_attention(q, k, v, 10, torch.ones(3, 10, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="cache capacity"):
        ops.block_attention(q, k, v, C + 1)
    with pytest.raises(RuntimeError, match="cache overflow"):
        ops.rope_cache(torch.randn(2, (NH + 2 * NKV) * HD), torch.randn(2, HD), torch.randn(2, HD), k, v, C - 1, NH)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
def test_fused_decoder_is_the_layer_loop_bit_for_bit(ops, tmp_path, kind):
    """kernels.Decoder runs every layer in one call; it must compute exactly what the Python
    loop over the same native steps computes: decode steps, blocks, a tree, and past the
    32-row pass of the matrix kernels (qwen2 has q/k/v biases, qwen3 q / k norms)."""
    from _tiny import build_hf, save
    from specdraft.models.llama import LlamaModel

    model = LlamaModel.from_dir(save(build_hf(kind, seed=5), tmp_path / "m"), dtype=torch.float32,
                                max_length=256, weight_format="q4k")
    assert model._decoder is not None
    g = torch.Generator().manual_seed(1)
    model.forward(torch.randint(0, 96, (70,), generator=g))  # a prefill past ROW_EXACT_MAX: the loop path
    start = model.length
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    for T, tree_mask in [(1, None), (5, None), (40, None), (4, tree)]:
        ids = torch.randint(0, 96, (T,), generator=g)
        out = {}
        for fused in (True, False):
            model.rollback(start)
            model.fused = fused
            out[fused] = model.forward(ids, tree_mask=tree_mask, need_hidden=True)
            cache = model.k_cache[1][:, start:start + T].clone()
        assert torch.equal(out[True].logits, out[False].logits)
        assert torch.equal(out[True].hidden, out[False].hidden)
        model.rollback(start)
        model.fused = True
        model.forward(ids, tree_mask=tree_mask)
        assert torch.equal(model.k_cache[1][:, start:start + T], cache)  # the same keys were written


def test_the_decoder_taps_layers_in_its_one_call(ops, tmp_path):
    """forward_tapped copies x after each tapped layer out as its loop passes it: x is forward's,
    to the bit, and each tap is what the layers up to it compute; bad taps are refused."""
    from _tiny import build_hf, save
    from specdraft.models.llama import LlamaModel

    model = LlamaModel.from_dir(save(build_hf("qwen2", seed=5), tmp_path / "m"), dtype=torch.float32,
                                max_length=64, weight_format="q4k")
    dec, n = model._decoder, len(model.layers)
    x = model.embed[torch.tensor([3, 17, 5])].float()
    cos, sin = model.cos[:3].contiguous(), model.sin[:3].contiguous()
    whole = dec.forward(x, 0, cos, sin)
    taps = [0, n - 1]  # (the tiny model: 2 layers)
    out, tapped = dec.forward_tapped(x, 0, cos, sin, None, taps)
    assert torch.equal(out, whole) and tapped.shape == (3, len(taps), x.shape[1])
    for j, layer in enumerate(taps):
        short = model.with_layers(list(range(layer + 1)))
        assert torch.equal(tapped[:, j], short._decoder.forward(x, 0, cos, sin))
    for bad in ([1, 0], [n], [-1], [0, 0]):
        with pytest.raises(RuntimeError, match="ascending layer indices"):
            dec.forward_tapped(x, 0, cos, sin, None, bad)


def test_decoder_times_its_steps(ops, tmp_path):
    """kernels.Decoder adds each step's seconds per kind (calibrate --steps reads them): every
    kind timed, together no more than the forward, and cleared to zeros."""
    import time

    from _tiny import build_hf, save
    from specdraft.models.llama import LlamaModel

    model = LlamaModel.from_dir(save(build_hf("qwen2", seed=5), tmp_path / "m"), dtype=torch.float32,
                                max_length=64, weight_format="q4k")
    decoder = model._decoder
    assert list(decoder.step_names) == ["rms_quantize", "qkv", "rope_cache", "attention", "o", "gate_up",
                                        "swiglu_quantize", "down"]
    decoder.clear_step_seconds()
    assert decoder.step_seconds() == [0.0] * 8
    t0 = time.perf_counter()
    model.forward(torch.arange(6))
    wall = time.perf_counter() - t0
    steps = decoder.step_seconds()
    assert len(steps) == 8 and all(s > 0 for s in steps) and sum(steps) <= wall
    decoder.clear_step_seconds()
    assert decoder.step_seconds() == [0.0] * 8


def test_the_layer_loop_times_its_steps_too(ops, tmp_path):
    """A block longer than the fused decoder's (a prefill) runs the layer loop, which adds its
    steps' seconds under the same kinds: model.step_seconds() sees them, the decoder's own stay 0."""
    import time

    from _tiny import build_hf, save
    from specdraft.models.llama import ROW_EXACT_MAX, LlamaModel

    model = LlamaModel.from_dir(save(build_hf("qwen2", seed=5), tmp_path / "m"), dtype=torch.float32,
                                max_length=256, weight_format="q4k")
    model.clear_step_seconds()
    assert set(model.step_seconds().values()) == {0.0}
    t0 = time.perf_counter()
    model.forward(torch.arange(ROW_EXACT_MAX + 30) % 96)
    wall = time.perf_counter() - t0
    steps = model.step_seconds()
    assert list(steps) == list(model._decoder.step_names)
    assert all(t > 0 for t in steps.values()) and sum(steps.values()) <= wall
    assert model._decoder.step_seconds() == [0.0] * 8
    model.clear_step_seconds()
    assert set(model.step_seconds().values()) == {0.0}


# the loop path; in pieces of 80, 80, 70 (each the loop's) and of 80, 80, 30 (the last the fused decoder's)
@pytest.mark.parametrize("T,block", [(70, None), (230, 80), (190, 80)])
def test_prefill_of_the_last_row_alone_keeps_its_bits_and_every_rows_cache(ops, tmp_path, monkeypatch, T, block):
    """A prefill whose caller reads the last row only (last_only, and hidden_last_only with
    need_hidden) runs the last layer's attention and MLP for that row alone: its logits, hidden
    state and taps are bitwise those of the full prefill, every row's keys and values are cached
    as before, and the decode step after it computes the same logits."""
    from _tiny import build_hf, save
    from specdraft.models import llama
    from specdraft.models.llama import LlamaModel

    if block is not None:
        monkeypatch.setattr(llama, "PREFILL_BLOCK", block)
    model = LlamaModel.from_dir(save(build_hf("qwen2", seed=7), tmp_path / "m"), dtype=torch.float32,
                                max_length=256, weight_format="q4k")
    g = torch.Generator().manual_seed(4)
    prompt, nxt = torch.randint(0, 96, (T,), generator=g), torch.randint(0, 96, (1,), generator=g)
    last = len(model.layers) - 1

    def run(**kw):
        model.reset()
        out = model.forward(prompt, need_hidden=True, taps=(0,), **kw)
        caches = [c[:, :T].clone() for c in (model.k_cache[last], model.v_cache[last])]
        return out, caches, model.forward(nxt).logits

    full, full_cache, full_next = run()
    for kw in ({"last_only": True, "hidden_last_only": True}, {"last_only": True}):
        got, cache, after = run(**kw)
        assert torch.equal(got.logits, full.logits[-1:])
        rows = slice(-1, None) if kw.get("hidden_last_only") else slice(None)
        assert torch.equal(got.hidden, full.hidden[rows]) and torch.equal(got.taps, full.taps[rows])
        assert all(torch.equal(a, b) for a, b in zip(cache, full_cache))
        assert torch.equal(after, full_next)
    model.reset()  # without hidden states, too
    assert torch.equal(model.forward(prompt, last_only=True).logits, full.logits[-1:])
