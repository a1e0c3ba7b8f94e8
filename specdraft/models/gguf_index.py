"""A GGUF file's scalar metadata and tensors (names, types, shapes, data as a memory map), read
in well under a second.

gguf-py's GGUFReader reads every element of every metadata array as a numpy view of its own: the
default target's 151,936 tokens and 151,387 merges took 7-13 s (Zen 4 EPYC), against 0.04 s
here; packing that GGUF for the kernels (gguf_weights) went from ~20 s to 12. This steps over
arrays by their lengths and keeps the scalar values only. Little-endian GGUF of versions 2 and 3,
as llama.cpp writes; anything else raises ValueError (gguf_weights: a one-line ModelFileError).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType

# metadata value type -> struct format of a scalar of it (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


QK = 256  # inputs per super-block
RECORD_TYPES = ("Q4_K", "Q6_K")  # the tensor types the native kernels multiply (models.gguf_weights' records)
# Architectures the kernels run -> whether llama.cpp's converter permuted their q / k rows: for a
# "llama" file (Llama 2 / 3, Mistral, TinyLlama, ...) it interleaves each head's two rope halves
# (GGML's rope pairs adjacent dims); Qwen2 / Qwen3's rope is already GGML's NEOX form, rows as in HF.
KERNEL_ARCHS = {"qwen2": False, "qwen3": False, "llama": True}


@dataclass(frozen=True)
class IndexedTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: the inputs (ne0) first
    data: np.ndarray  # uint8 [bytes] of the memory map


class GGUFIndex:
    """``fields``: key -> a scalar metadata value (int, float, bool or str; arrays left out);
    ``tensors``: IndexedTensor in the file's order."""

    def __init__(self, path: str | Path):
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        try:
            self._read(self._map)
        except (struct.error, KeyError, IndexError) as e:  # cut short, or a value type GGUF has not
            raise ValueError(f"malformed GGUF header ({type(e).__name__}: {e})") from None

    def _read(self, buf: np.memmap) -> None:
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (or big-endian)")
        pos = 24
        self.fields: dict[str, int | float | bool | str] = {}
        for _ in range(n_kv):
            key, pos = self._string(pos)
            (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            if kind == _ARRAY:
                (item, count), pos = struct.unpack_from("<IQ", buf, pos), pos + 12
                pos = self._skip(item, count, pos)
            elif kind == _STRING:
                self.fields[key], pos = self._string(pos)
            else:
                fmt = _SCALARS[kind]
                self.fields[key], pos = struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            shape, pos = struct.unpack_from(f"<{dims}Q", buf, pos), pos + 8 * dims
            (kind, offset), pos = struct.unpack_from("<IQ", buf, pos), pos + 12
            infos.append((name, GGMLQuantizationType(kind), tuple(int(d) for d in shape), offset))
        align = int(self.fields.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        start = -(-pos // align) * align
        self.tensors: list[IndexedTensor] = []
        for name, kind, shape, offset in infos:
            block, size = GGML_QUANT_SIZES[kind]
            n = int(np.prod(shape)) // block * size
            self.tensors.append(IndexedTensor(name, kind, shape, buf[start + offset:start + offset + n]))

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._map, pos)
        return bytes(self._map[pos + 8:pos + 8 + n]).decode("utf-8", errors="replace"), pos + 8 + n

    def _skip(self, item: int, count: int, pos: int) -> int:
        """The position after ``count`` values of type ``item``."""
        if item in _SCALARS:
            return pos + count * struct.calcsize(_SCALARS[item])
        for _ in range(count):
            if item == _STRING:
                (n,) = struct.unpack_from("<Q", self._map, pos)
                pos += 8 + n
            elif item == _ARRAY:
                (inner, m) = struct.unpack_from("<IQ", self._map, pos)
                pos = self._skip(inner, m, pos + 12)
            else:
                raise ValueError(f"metadata value type {item}")
        return pos


def has_records(t: IndexedTensor) -> bool:
    """Whether the kernels multiply this tensor from records (gguf_weights packs it)."""
    return t.tensor_type.name in RECORD_TYPES and len(t.shape) == 2 and int(t.shape[0]) % QK == 0


def kernels_take(path: str | Path) -> bool:
    """Whether the gguf weight format takes this GGUF file by what it holds (its architecture;
    records for its first block's up projection, as gguf_weights.gguf_source asks), read in ~40 ms
    (default target, Zen 4 EPYC); not whether the kernels build here. False where the file cannot
    be read (its load reports that itself)."""
    try:
        reader = GGUFIndex(path)
    except (OSError, ValueError):
        return False
    up = next((t for t in reader.tensors if t.name == "blk.0.ffn_up.weight"), None)
    return reader.fields.get("general.architecture") in KERNEL_ARCHS and up is not None and has_records(up)
