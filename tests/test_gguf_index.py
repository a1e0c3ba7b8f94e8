"""models.gguf_index reads what gguf-py's reader reads: every scalar metadata value, and every
tensor's name, type, shape and bytes, past metadata arrays of every kind (nested ones too)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from specdraft.models.gguf_index import GGUFIndex


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("index") / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -3)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -2000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -7)
    w.add_float32("t.f32", 0.25)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 1.0 / 3.0)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "ünïcödé")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, 1.5])
    w.add_array("t.strs", ["a", "bb", "", "ccc"])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_head_count(4)
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((3, 32)).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal((5, 64)).astype(np.float16))
    for name, kind, block in (("q4.weight", "Q4_K", 144), ("q6.weight", "Q6_K", 210), ("q8.weight", "Q8_0", 34)):
        per_row = 2 * block if kind != "Q8_0" else 16 * block  # 512 inputs a row
        raw = rng.integers(0, 256, (4, per_row), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_index_reads_what_gguf_py_reads(gguf_path):
    index, reader = GGUFIndex(gguf_path), gguf.GGUFReader(str(gguf_path))
    scalars = {k: f.contents() for k, f in reader.fields.items() if not f.types or f.types[0] != gguf.GGUFValueType.ARRAY}
    assert set(index.fields) == {k for k in scalars if not k.startswith("GGUF.")}
    for key, value in index.fields.items():
        assert value == pytest.approx(scalars[key]) if isinstance(value, float) else value == scalars[key], key
    assert index.fields["qwen2.attention.head_count"] == 4 and index.fields["t.str"] == "ünïcödé"
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for a, b in zip(index.tensors, reader.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(n) for n in b.shape), a.name
        assert np.array_equal(a.data, np.asarray(b.data).reshape(-1).view(np.uint8)), a.name


def test_the_index_refuses_what_it_cannot_read(tmp_path, gguf_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF"):
        GGUFIndex(bad)
    old = bytearray(gguf_path.read_bytes())
    old[4:8] = (1).to_bytes(4, "little")
    bad.write_bytes(bytes(old))
    with pytest.raises(ValueError, match="version 1"):
        GGUFIndex(bad)
