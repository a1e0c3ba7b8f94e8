"""The GGUF kernels' ISA paths (AVX2, AVX-VNNI, AVX-512 VNNI, AMX-INT8): each against the dequantized reference, each
row independent of its block, and every path bit for bit the AVX2 path (the same int32 sums per
super-block, then the same float steps). A path this CPU lacks is skipped with the reason."""
from __future__ import annotations

import json

import pytest
import torch
from test_gguf_kernels import BLOCK_BYTES, quant_tensor, random_blocks

from specdraft.kernels import KernelUnavailable, gguf_ops
from specdraft.models.gguf_weights import GGUFLinear, QuantTensor, unpack_q4k, unpack_q6k

# amx-int8-emulated: the AMX kernel with its tile registers emulated (any AVX-512 VNNI CPU), so its
# logic is tested where no AMX runs; both AMX forms take the tiles at every block size here
PATHS = ["avx2", "avx-vnni", "avx512-vnni", "amx-int8", "amx-int8-emulated"]
# (kind, out, in): O a multiple of 16, of 8 only, of neither (an odd count of 8-row groups, a partial record)
SHAPES = [("Q4_K", 48, 512), ("Q4_K", 40, 768), ("Q4_K", 13, 256), ("Q6_K", 32, 512), ("Q6_K", 24, 256),
          ("Q6_K", 21, 768), ("Q4_K", 24, 4096), ("Q6_K", 40, 4096)]  # 16 super-blocks a row and more: pairs of groups at T = 1


@pytest.fixture(scope="module")
def ops():
    try:
        o = gguf_ops()
    except KernelUnavailable as e:
        pytest.skip(str(e))
    before = o.kernel_path()
    yield o
    o.set_kernel_path(before)


@pytest.fixture(autouse=True)
def no_amx_settings_after(request):
    """Every test leaves the AMX tiles real and their threshold the default."""
    yield
    if "ops" in request.fixturenames:
        o = request.getfixturevalue("ops")
        o.set_amx_emulated(False)
        o.set_amx_min_rows(0)


def use(ops, path) -> str:
    """Set the kernels to path (skipped where this CPU cannot run it); the path name they now report."""
    if path == "amx-int8-emulated":
        if "avx512-vnni" not in ops.kernel_paths():
            pytest.skip(f"the emulated AMX tiles need AVX-512 VNNI (this CPU has {ops.kernel_paths()})")
        ops.set_amx_emulated(True)
        path = "amx-int8"
    if path not in ops.kernel_paths():
        pytest.skip(f"this CPU cannot run the {path} path (it has {ops.kernel_paths()})")
    ops.set_kernel_path(path)
    if path == "amx-int8":
        ops.set_amx_min_rows(1)
    return path


def matmul(ops, kind, xq, qt):
    return (ops.q4k_matmul if kind == "Q4_K" else ops.q6k_matmul)(*xq, qt.w, qt.out_features)


def test_amx_settings_are_read_back(ops):
    ops.set_amx_min_rows(5)
    assert ops.amx_min_rows() == 5
    ops.set_amx_min_rows(0)
    assert ops.amx_min_rows() >= 1
    if "avx512-vnni" not in ops.kernel_paths():
        with pytest.raises(RuntimeError, match="AVX-512 VNNI"):
            ops.set_amx_emulated(True)
        return
    ops.set_amx_emulated(True)
    assert ops.amx_emulated() and "amx-int8" in ops.kernel_paths()
    ops.set_kernel_path("amx-int8")
    ops.set_amx_emulated(False)
    assert ops.kernel_path() in ops.kernel_paths()  # not left on a path the CPU lacks


def test_paths_are_named_and_forced(ops):
    assert ops.kernel_path() in ops.kernel_paths() and "avx2" in ops.kernel_paths()
    with pytest.raises(RuntimeError, match="unknown kernel path"):
        ops.set_kernel_path("sse2")
    ops.set_kernel_path("auto")
    assert ops.kernel_path() == ops.kernel_paths()[-1]  # the best this CPU has


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind,out_f,in_f", SHAPES)
def test_path_matches_reference_and_avx2_bitwise(ops, path, kind, out_f, in_f):
    name = use(ops, path)
    qt, ref = quant_tensor(kind, out_f, in_f, seed=out_f + in_f)
    x = torch.randn(40, in_f) * torch.logspace(-2, 1, 40)[:, None]
    xq = ops.quantize_q8k(x)
    nb = in_f // 256
    expect = (xq[0].double().reshape(40, nb, 256) * xq[1].double()[..., None]).reshape(40, in_f) @ ref.double().T
    for T in range(1, 41):
        part = tuple(t[:T] for t in xq)
        got = matmul(ops, kind, part, qt)
        assert (got.double() - expect[:T]).abs().max() <= 1e-5 * expect[:T].abs().max(), T
        ops.set_kernel_path("avx2")
        base = matmul(ops, kind, part, qt)
        ops.set_kernel_path(name)
        assert torch.equal(got, base), (T, (got - base).abs().max())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_rows_are_independent_of_the_block_per_path(ops, path, kind):
    use(ops, path)
    qt, _ = quant_tensor(kind, 40, 512, seed=3)
    lin = GGUFLinear([qt])
    x = torch.randn(75, 512)
    full = lin(x)  # one pass (amx-int8) or passes of 32 rows, tiles of up to 8 or 16: no bit changes
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(75)]), full)
    for T in (2, 3, 5, 8, 9, 16, 17):
        for start in range(0, 40 - T, 7):
            assert torch.equal(lin(x[start:start + T]), full[start:start + T]), (T, start)


@pytest.mark.parametrize("path", PATHS)
def test_rows_of_a_block_longer_than_a_pass(ops, path):
    """A 4096-wide input: amx-int8 takes passes of 256 rows (1 MB of x), the others of 32; a block
    of 300 rows cut either way gives each row the bits it has alone."""
    use(ops, path)
    qt, _ = quant_tensor("Q4_K", 16, 4096, seed=4)
    lin = GGUFLinear([qt])
    x = torch.randn(300, 4096)
    full = lin(x)
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(300)]), full)
    assert torch.equal(lin(x[250:290]), full[250:290])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("fill", [0xFF, 0x80])
def test_extreme_blocks_agree_across_paths(ops, path, kind, fill):
    """Largest quants and scales against |qx| = 127: the int32 sums at their largest, no wrap."""
    use(ops, path)
    blocks = random_blocks(kind, 24, 512, seed=6).reshape(24, 2, BLOCK_BYTES[kind])
    if kind == "Q4_K":
        blocks[..., 4:] = fill
    else:
        blocks[..., :208] = fill
    qt = QuantTensor(kind, 24, 512, (unpack_q4k if kind == "Q4_K" else unpack_q6k)(blocks.reshape(24, -1)))
    x = torch.randn(9, 512).sign()
    x[0] = 1
    xq = ops.quantize_q8k(x)
    got = matmul(ops, kind, xq, qt)
    expect = x.double() @ qt.dequantize().double().T
    assert (got.double() - expect).abs().max() <= 1e-5 * expect.abs().max()
    ops.set_kernel_path("avx2")
    assert torch.equal(got, matmul(ops, kind, xq, qt))


def test_kernel_costs_time_every_asked_path(ops):
    from specdraft.bench.kernel_cost import kernel_costs

    paths, costs = kernel_costs("all", blocks=(1, 3), shapes=[("Q4_K", 24, 512), ("Q6_K", 16, 256)], repeats=1)
    assert paths == ops.kernel_paths() and set(costs) == set(paths)
    for p in paths:
        assert costs[p]["tokens"] == [1, 3] and len(costs[p]["seconds"]) == 2 and min(costs[p]["seconds"]) > 0


def test_calibrate_kernels_refuses_a_path_the_cpu_lacks(ops, capsys):
    from test_cli_errors import assert_one_line_error, call

    assert_one_line_error(*call(["calibrate", "--kernels", "sse2"], capsys), contains="cannot run sse2")


def test_calibrate_paths_times_the_whole_forward_on_every_path(ops, capsys, tmp_path):
    """calibrate --paths: one model on the GGUF kernels timed on each path this CPU has, interleaved,
    their logits compared bit for bit, and the path in use left as it was."""
    from test_cli_errors import call

    from _tiny import make_cli_model

    model, out_json, before = make_cli_model(tmp_path / "tiny"), tmp_path / "paths.json", ops.kernel_path()
    rc, out, err = call(["calibrate", "--model", str(model), "--format", "q4k", "--context", "8", "--blocks", "1,3",
                         "--repeats", "1", "--paths", "all", "--json", str(out_json)], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    assert list(report["paths"]) == ops.kernel_paths() and report["weight_format"] == "q4k"
    assert all(r["tokens"] == [1, 3] and min(r["seconds"]) > 0 for r in report["paths"].values())
    assert report["max_abs_logit_diff"] == {p: 0.0 for p in ops.kernel_paths()}
    assert ops.kernel_path() == before
    if len(ops.kernel_paths()) > 1:
        assert out.count("bit for bit") == len(ops.kernel_paths()) - 1


def test_calibrate_steps_breaks_each_forward_into_its_steps(ops, capsys, tmp_path):
    """calibrate --steps: per path and block, ms in each kind of native layer step and in the rest,
    which add up to the whole forward; the path in use left as it was."""
    from test_cli_errors import call

    from _tiny import make_cli_model
    from specdraft.bench.forward_cost import REST

    model, out_json, before = make_cli_model(tmp_path / "tiny"), tmp_path / "steps.json", ops.kernel_path()
    rc, out, err = call(["calibrate", "--model", str(model), "--format", "q4k", "--context", "8", "--blocks", "1,3",
                         "--repeats", "1", "--steps", "--paths", "all", "--json", str(out_json)], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    assert list(report["paths"]) == ops.kernel_paths()
    steps = ["rms_quantize", "qkv", "rope_cache", "attention", "o", "gate_up", "swiglu_quantize", "down", REST]
    for r in report["paths"].values():
        assert r["tokens"] == [1, 3] and list(r["steps"]) == steps
        assert all(v > 0 for name in steps[:-1] for v in r["steps"][name])
        for i in range(2):  # with one repeat the medians are the one run's parts: they add up
            assert sum(r["steps"][n][i] for n in steps) == pytest.approx(r["seconds"][i], rel=1e-9)
    assert ops.kernel_path() == before
    assert "attention" in out and "whole forward" in out


def test_same_logits_reports_a_path_that_differs():
    from types import SimpleNamespace

    from specdraft.bench.forward_cost import same_logits

    class Fake:
        vocab_size = 50

        def __init__(self, shift):
            self.shift = shift

        def rollback(self, length):
            pass

        def forward(self, ids):
            return SimpleNamespace(logits=ids.float()[:, None] + self.shift)

    assert same_logits({"a": Fake(0.0), "b": Fake(0.0), "c": Fake(0.25)}, 4, 3) == {"a": 0.0, "b": 0.0, "c": 0.25}


@pytest.mark.parametrize("args, contains", [
    (["--format", "q4k", "--paths", "sse2"], "cannot run sse2"),
    (["--format", "q4k", "--paths", "avx2,avx2"], "twice"),
    (["--format", "dense", "--paths", "all"], "GGUF kernels"),
    (["--format", "q4k,dense", "--paths", "all"], "one --format"),
    (["--format", "dense", "--steps"], "natively"),
    (["--format", "q4k,dense", "--steps"], "one weight format"),
    (["--kernels", "all", "--steps"], "not with --kernels"),
])
def test_calibrate_paths_bad_arguments_give_one_line(ops, capsys, tmp_path, args, contains):
    from test_cli_errors import assert_one_line_error, call

    from _tiny import make_cli_model

    model = make_cli_model(tmp_path / "tiny")
    assert_one_line_error(*call(["calibrate", "--model", str(model), "--context", "8", "--blocks", "1",
                                 "--repeats", "1", *args], capsys), contains=contains)


@pytest.fixture
def vnni(ops):
    """The AVX-512 VNNI path with its forms restored afterwards (skipped where the CPU lacks it)."""
    use(ops, "avx512-vnni")
    saved, timed = ops.vnni_forms(), ops.vnni_forms_timed()
    ops.set_vnni_forms_timed(False)  # the masks decide unless a test says otherwise
    yield ops
    ops.set_vnni_forms(saved)
    ops.set_vnni_forms_timed(timed)


@pytest.mark.parametrize("kind,out_f,in_f", SHAPES)
def test_vnni_forms_give_the_same_bits(vnni, kind, out_f, in_f):
    """One 8-row group a ymm or two a zmm, for any rows a pass: the AVX2 path's bits every time."""
    qt, _ = quant_tensor(kind, out_f, in_f, seed=out_f * in_f)
    xq = vnni.quantize_q8k(torch.randn(20, in_f))
    vnni.set_kernel_path("avx2")
    base = matmul(vnni, kind, xq, qt)
    vnni.set_kernel_path("avx512-vnni")
    for masks in ([0] * 4, [0x1FE] * 4, [0b1010_1010] * 4, [0b0101_0100] * 4):
        vnni.set_vnni_forms(masks)
        assert vnni.vnni_forms() == masks
        for T in range(1, 21):
            got = matmul(vnni, kind, tuple(t[:T] for t in xq), qt)
            assert torch.equal(got, base[:T]), (masks, T)


def test_vnni_forms_are_checked(vnni):
    for bad in ([0, 0], [0, 0, 0, 512], [-1, 0, 0, 0]):
        with pytest.raises(RuntimeError, match="vnni forms"):
            vnni.set_vnni_forms(bad)


@pytest.mark.parametrize("kind,out_f,in_f", SHAPES[:2] + SHAPES[3:4] + SHAPES[-2:])
def test_timed_forms_give_the_same_bits_and_time_both(vnni, kind, out_f, in_f):
    """Forms chosen per product by timing: every call the AVX2 path's bits, and for each rows both
    forms timed (each one's first call is thrown away, then both are timed before one is preferred)."""
    qt, _ = quant_tensor(kind, out_f, in_f, seed=out_f * in_f + 1)
    xq = vnni.quantize_q8k(torch.randn(9, in_f))
    vnni.set_kernel_path("avx2")
    base = matmul(vnni, kind, xq, qt)
    vnni.set_kernel_path("avx512-vnni")
    vnni.clear_vnni_form_stats()
    vnni.set_vnni_forms_timed(True)
    for _ in range(20):
        for T in range(1, 10):
            assert torch.equal(matmul(vnni, kind, tuple(t[:T] for t in xq), qt), base[:T]), T
    stats = vnni.vnni_form_stats()
    assert sorted(int(key) >> 1 & 15 for key, *_ in stats) == list(range(1, 9))  # 9 rows: always zmm, not timed
    for _, ymm, zmm, ns_ymm, ns_zmm in stats:
        assert ymm >= 1 and zmm >= 1 and ymm + zmm == 18 and ns_ymm > 0 and ns_zmm > 0


def test_form_choice_follows_the_times(ops):
    """The timed choice (gguf_forms.h) on made-up times: the two forms in turn, the fixed one first,
    until both are timed, then the faster one, the other tried at most every 16th product,
    following when they trade places."""
    picks = ops.simulate_form_choice([1.0] * 400 + [2.0] * 400, [2.0] * 400 + [1.0] * 400, fixed=0)
    assert picks[:16] == [0, 1, 0, 1] + [0] * 12  # each one's first time thrown away, then timed
    assert 1 <= sum(picks[100:400]) <= 300 // 16  # ymm, zmm tried now and then
    assert 0 not in picks[400 + 80:400 + 95]  # zmm within 80 products of the swap
    assert 1 <= picks[500:].count(0) <= 300 // 16
    assert ops.simulate_form_choice([1.0] * 16, [0.5] * 16, fixed=1) == [1, 0, 1, 0] + [1] * 12
    assert ops.simulate_form_choice([0.5] * 16, [1.0] * 16, fixed=1) == [1, 0, 1, 0] + [0] * 12  # the fixed one slower
    # near times: one outlier (a preemption) of the faster form turns the choice for a few products at most
    near = ops.simulate_form_choice([1.0] * 200 + [1000.0] + [1.0] * 199, [1.1] * 400, fixed=0)
    assert 300 // 16 - 3 <= sum(near[16:200]) * 300 / 184 <= 300 // 16 + 3
    assert near[300:].count(1) <= 100 // 16 + 1


def test_forms_are_timed_by_default_and_fixed_on_request(vnni, monkeypatch):
    from specdraft.kernels import plan

    for env, timed in (("", True), ("default", False)):
        monkeypatch.setenv("SPECDRAFT_VNNI_FORMS", env)
        monkeypatch.setattr(plan, "_set", [])
        vnni.set_vnni_forms_timed(not timed)
        plan.use_forms()
        assert vnni.vnni_forms_timed() == timed
    assert plan.forms_note().endswith("(built in)")
    vnni.set_vnni_forms_timed(True)
    vnni.clear_vnni_form_stats()
    assert "no product of 1-8 rows yet" in plan.forms_note()
    qt, _ = quant_tensor("Q4_K", 16, 256, seed=3)
    for _ in range(6):
        matmul(vnni, "Q4_K", vnni.quantize_q8k(torch.randn(4, 256)), qt)
    assert plan.forms_note().startswith("form timed per product and rows; zmm share so far 4 rows ")


def test_amx_parts_switches_name_statements_of_the_amx_kernel():
    """scripts/amx_parts.py switches kernel parts off by patching statements of gguf_amx.cpp: each
    one it names must still be there (any CPU: only the source is read)."""
    import importlib.util
    from pathlib import Path

    from specdraft.kernels import HERE

    path = Path(__file__).resolve().parents[1] / "scripts" / "amx_parts.py"
    spec = importlib.util.spec_from_file_location("amx_parts", path)
    parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parts)
    source = (HERE / "gguf_amx.cpp").read_text()
    assert set(parts.SWITCHES) == {1, 2, 4}
    for starts in parts.SWITCHES.values():
        assert all(start in source for start in starts), starts


def test_a_prebuild_runs_once_on_a_thread_and_gguf_ops_waits_for_it(monkeypatch, tmp_path):
    """prebuild_kernels builds on a thread where nothing is built yet (once, whatever the calls);
    gguf_ops waits for that build and takes its module; with the kernels built, no thread."""
    import functools
    import threading
    import time

    import specdraft.kernels as kernels

    monkeypatch.setattr(kernels, "_prebuild", None)
    monkeypatch.setattr(kernels, "cpu_supports_avx2", lambda: True)
    monkeypatch.setattr(kernels, "gguf_build_dir", lambda: tmp_path)
    builds = []

    def slow_build():
        builds.append(threading.current_thread().name)
        time.sleep(0.3)
        return "module"

    monkeypatch.setattr(kernels, "_gguf_ops", functools.lru_cache(maxsize=1)(slow_build))  # as the real one
    kernels.prebuild_kernels()
    kernels.prebuild_kernels()
    thread = kernels._prebuild
    assert thread is not None and thread.is_alive()
    assert kernels.gguf_ops() == "module" and not thread.is_alive()
    assert builds == ["specdraft-kernel-build"]  # built once, on the thread
    monkeypatch.setattr(kernels, "_prebuild", None)
    (tmp_path / "kernels.so").write_bytes(b"")
    kernels.prebuild_kernels()
    assert kernels._prebuild is None  # built: nothing to start
