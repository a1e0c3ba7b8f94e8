"""The packed copy of a GGUF file's kernel records: made once, read into huge pages (or mapped) on
later starts, rebuilt when damaged, and stacked projections (q, k; gate, up) read as views of the
records, not copies."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_gguf_kernels import random_blocks

from specdraft.errors import ModelFileError
from specdraft.models import gguf_weights, hugepages
from specdraft.models.gguf_index import kernels_take
from specdraft.models.gguf_weights import GGUFLinear, GGUFTensors, unpack_q4k, unpack_q6k

gguf = pytest.importorskip("gguf")
H, INNER = 256, 512
# (gguf name, HF name, kind, out, in): one block of a tiny qwen2, in the GGUF's own (sorted) order
TENSORS = [("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", "Q4_K", 64, H),
           ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", "Q4_K", H, H),
           ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", "Q6_K", 64, H),
           ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", "Q6_K", H, INNER),
           ("blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight", "Q4_K", INNER, H),
           ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", "Q4_K", INNER, H)]


@pytest.fixture(params=["2M", "4K"])
def gguf_file(tmp_path, monkeypatch, request):
    # packs in a fresh directory; the compiled kernels stay where they are
    monkeypatch.setattr(gguf_weights, "cache_root", lambda: tmp_path / "cache")
    # the records read into huge pages (however small; where the kernel has none, this falls back
    # to the map too) or mapped (SPECDRAFT_HUGE_PAGES=0): every test here both ways
    monkeypatch.setattr(hugepages, "MIN_BYTES", 0)
    monkeypatch.setenv("SPECDRAFT_HUGE_PAGES", "1" if request.param == "2M" else "0")
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    data = {}
    for i, (name, hf, kind, out_f, in_f) in enumerate(TENSORS):
        data[hf] = (kind, random_blocks(kind, out_f, in_f, seed=i))
        w.add_tensor(name, data[hf][1], raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, data


def test_pack_holds_the_records_and_is_reused(gguf_file, monkeypatch):
    path, data = gguf_file
    t = GGUFTensors(path, progress=False)
    for hf, (kind, b) in data.items():
        expect = (unpack_q4k if kind == "Q4_K" else unpack_q6k)(b)
        got = t.get(hf)
        assert got.kind == kind and got.out_features == b.shape[0] and torch.equal(got.w, expect)
        assert torch.equal(t.get(hf, rows=9).w, expect[:2])  # 9 rows: the first 2 records of 8
    assert not t.has_kernel("model.layers.0.mlp.nothing.weight")
    if hugepages.enabled():
        assert t._flat.data_ptr() % hugepages.HUGE == 0  # read into its own huge-page buffer
    else:  # SPECDRAFT_HUGE_PAGES=0: the file's map, in 4 KB mappings even where its folios are 2 MB
        assert hugepages.huge_page_bytes(t._flat) == 0

    def no_parse(*a, **k):
        raise AssertionError("a packed GGUF must not be parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", no_parse)
    again = GGUFTensors(path, progress=False)
    assert torch.equal(again.get(TENSORS[0][1]).w, t.get(TENSORS[0][1]).w)


def test_a_pack_read_started_early_is_the_one_the_tensors_take(gguf_file, monkeypatch):
    path, data = gguf_file
    GGUFTensors(path, progress=False)  # makes the pack
    assert not gguf_weights.start_pack_read(str(path.with_suffix(".missing.gguf")))  # no such file: nothing
    started = gguf_weights.start_pack_read(str(path))
    assert started == hugepages.enabled() and len(hugepages._reads) == started
    t = GGUFTensors(path, progress=False)
    assert not hugepages._reads  # taken
    for hf, (kind, b) in data.items():
        assert torch.equal(t.get(hf).w, (unpack_q4k if kind == "Q4_K" else unpack_q6k)(b))


def test_a_damaged_pack_starts_no_read_and_is_still_reported(gguf_file):
    path, _ = gguf_file
    GGUFTensors(path, progress=False)
    pack = gguf_weights._pack_path(path)
    pack.write_bytes(pack.read_bytes()[:100])
    assert not gguf_weights.start_pack_read(str(path)) and not hugepages._reads
    with pytest.raises(ModelFileError, match="damaged"):
        GGUFTensors(path, progress=False)


def test_stacked_projections_are_views_of_the_map(gguf_file):
    path, _ = gguf_file
    t = GGUFTensors(path, progress=False)
    gate, up = (t.get(f"model.layers.0.mlp.{n}_proj.weight") for n in ("gate", "up"))
    lin = GGUFLinear([gate, up])
    assert len(lin.parts) == 1 and lin.parts[0].w.data_ptr() == gate.w.data_ptr()  # one matrix, no copy
    assert torch.equal(lin.parts[0].w, torch.cat([gate.w, up.w]))
    x = torch.randn(3, H)
    assert torch.equal(lin(x), torch.cat([GGUFLinear([gate])(x), GGUFLinear([up])(x)], -1))
    q, k, v = (t.get(f"model.layers.0.self_attn.{n}_proj.weight") for n in ("q", "k", "v"))
    qkv = GGUFLinear([q, k, v])  # q, k: Q4_K, one view; v: Q6_K, its own part
    assert [p.kind for p in qkv.parts] == ["Q4_K", "Q6_K"] and qkv.parts[0].w.data_ptr() == q.w.data_ptr()


def test_a_damaged_pack_is_removed_with_one_line(gguf_file):
    path, _ = gguf_file
    GGUFTensors(path, progress=False)
    pack = gguf_weights._pack_path(path)
    pack.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelFileError, match="damaged") as e:
        GGUFTensors(path, progress=False)
    assert "\n" not in str(e.value) and not pack.exists()
    assert GGUFTensors(path, progress=False).has_kernel(TENSORS[0][1])  # made again


def test_a_pack_cut_short_is_removed_with_one_line(gguf_file):
    path, _ = gguf_file
    GGUFTensors(path, progress=False)
    pack = gguf_weights._pack_path(path)
    pack.write_bytes(pack.read_bytes()[:-100])  # the header intact, the records 100 bytes short
    with pytest.raises(ModelFileError, match="damaged") as e:
        GGUFTensors(path, progress=False)
    assert "\n" not in str(e.value) and not pack.exists()


def test_a_fault_while_reading_a_sound_pack_leaves_it_in_place(gguf_file, monkeypatch):
    """Only what the file says (header, length) counts as damage: an error while reading a sound
    pack (memory, a fault in the reading code) propagates as it is, and the 1 GB pack stays."""
    path, _ = gguf_file
    GGUFTensors(path, progress=False)
    pack = gguf_weights._pack_path(path)
    before = pack.read_bytes()

    def failing(*args, **kwargs):
        raise MemoryError("no room")

    monkeypatch.setattr(gguf_weights, "read_huge", failing)
    with pytest.raises(MemoryError):
        GGUFTensors(path, progress=False)
    assert pack.read_bytes() == before


def test_a_full_disk_while_packing_is_one_line_and_leaves_nothing(gguf_file, monkeypatch):
    """safetensors reports a full disk as its own error type, not OSError: still one line, with
    the fix, and no half-written pack left in the cache; with room again the pack is made."""
    import safetensors.torch
    from safetensors import SafetensorError

    path, _ = gguf_file
    pack = gguf_weights._pack_path(path)
    real = safetensors.torch.save_file

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)  # what a write cut short leaves
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(ModelFileError, match=r"No space left on device.*free disk space") as e:
        GGUFTensors(path, progress=False)
    assert "\n" not in str(e.value)
    assert not any(pack.parent.iterdir())  # neither the pack nor its temporary file
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert GGUFTensors(path, progress=False).has_kernel(TENSORS[0][1]) and pack.exists()


def test_an_edited_gguf_is_packed_again(gguf_file):
    path, _ = gguf_file
    before = gguf_weights._pack_path(path)
    GGUFTensors(path, progress=False)
    path.touch()
    import os

    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert gguf_weights._pack_path(path) != before


def test_unreachable_packs_are_removed_and_others_kept(gguf_file, tmp_path):
    path, _ = gguf_file
    GGUFTensors(path, progress=False)
    first = gguf_weights._pack_path(path)
    cache = first.parent
    legacy = cache / "tiny-000000000000.safetensors"  # an older layout's pack: no "format" in its metadata
    legacy.write_bytes(first.read_bytes().replace(b'"format"', b'"formaX"'))
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    other = other_dir / "tiny.gguf"  # another file of the same name: its pack stays
    other.write_bytes(path.read_bytes())
    GGUFTensors(other, progress=False)
    kept = gguf_weights._pack_path(other)
    assert kept.exists() and first.exists() and not legacy.exists()
    import os

    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # edited: packed again
    t = GGUFTensors(path, progress=False)
    assert gguf_weights._pack_path(path).exists() and not first.exists() and kept.exists()
    assert t.has_kernel(TENSORS[0][1])


def test_the_dense_file_holds_what_has_no_records_in_bf16(tmp_path, monkeypatch):
    """The gguf format's other numbers (the embedding, norms, biases, a matrix of a type without a
    kernel), dequantized by gguf-py and rounded to bf16 as a converted copy's, by Hugging Face
    name; the matrices with records are not in it. A damaged file is removed with one line."""
    from gguf import dequantize

    monkeypatch.setattr(gguf_weights, "cache_root", lambda: tmp_path / "cache")
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny-dense.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    emb = random_blocks("Q4_K", 64, H, seed=7)  # [vocab 64, H]: gathered from, so numbers too
    q8 = gguf.quants.quantize(rng.standard_normal((INNER, H)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    plain = {"blk.0.attn_norm.weight": rng.standard_normal(H).astype(np.float32),
             "blk.0.attn_q.bias": rng.standard_normal(H).astype(np.float32),
             "output_norm.weight": rng.standard_normal(H).astype(np.float32)}
    w.add_tensor("token_embd.weight", emb, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("blk.0.ffn_up.weight", random_blocks("Q4_K", INNER, H, seed=8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("blk.0.ffn_gate.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for name, x in plain.items():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t = GGUFTensors(path, progress=False)
    dense = t.dense_file()
    from safetensors.torch import load_file

    got = load_file(str(dense))
    want = {"model.embed_tokens.weight": dequantize(emb, gguf.GGMLQuantizationType.Q4_K),
            "model.layers.0.mlp.gate_proj.weight": dequantize(q8, gguf.GGMLQuantizationType.Q8_0),
            "model.layers.0.input_layernorm.weight": plain["blk.0.attn_norm.weight"],
            "model.layers.0.self_attn.q_proj.bias": plain["blk.0.attn_q.bias"],
            "model.norm.weight": plain["output_norm.weight"]}
    assert set(got) == set(want)  # up_proj has records: not here
    for name, x in want.items():
        assert torch.equal(got[name], torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)), name
    assert t.has_kernel("model.layers.0.mlp.up_proj.weight") and not t.has_kernel("model.layers.0.mlp.gate_proj.weight")
    assert GGUFTensors(path, progress=False).dense_file() == dense  # made once
    dense.write_bytes(b"\xff" * 16)
    with pytest.raises(ModelFileError, match=r"dense tensors .* damaged and are removed") as err:
        GGUFTensors(path, progress=False).dense_file()
    assert "\n" not in str(err.value) and not dense.exists()
    assert GGUFTensors(path, progress=False).dense_file() == dense  # made again


def test_kernels_take_says_which_files_the_format_takes(gguf_file, tmp_path):
    """By architecture and by the first block's up projection's type, read from the header alone."""
    path, _ = gguf_file
    assert kernels_take(path)
    other = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(other), "gemma")
    w.add_tensor("blk.0.ffn_up.weight", random_blocks("Q4_K", INNER, H, seed=1), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert not kernels_take(other)  # an architecture the kernels lack
    q8 = tmp_path / "q8.gguf"
    w = gguf.GGUFWriter(str(q8), "qwen2")
    w.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(np.ones((INNER, H), np.float32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert not kernels_take(q8)  # a type without records
    assert not kernels_take(tmp_path / "absent.gguf")
    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03")
    assert not kernels_take(tmp_path / "broken.gguf")
