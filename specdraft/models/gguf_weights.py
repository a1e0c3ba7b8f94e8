"""The quantized tensors of a GGUF file, kept as they are, and linear layers that compute with them.

weight format "gguf": the target's projections keep their GGUF quantization (Q4_K and Q6_K, what
Q4_K_M files use) and run through native kernels (specdraft/kernels/gguf_matmul.cpp) with
activations quantized to 8 bits per row and per 256 inputs, as llama.cpp computes them: the model
computed is the GGUF model itself, not a re-quantization of a bf16 copy, and a one-token forward
reads ~1.1 GB instead of w8a8's ~1.5 GB. Tensors of other types fall back to w8a8 (from the
converted copy), layer by layer. Qwen2, Qwen3 and Llama files ("llama": Llama 2 / 3, Mistral,
...): the last's q / k rows, permuted by llama.cpp's converter for GGML's rope, are packed in HF order.

Kernel layouts (see the C++ file): one record per super-block of 256 inputs, interleaving 8
output rows per record (4 inputs of each of the 8 rows per 4 bytes, so that one 8-bit product
instruction serves 8 rows); Q4_K's 6-bit scales and mins are unpacked, Q6_K's quants keep 6 bits.
"""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..cache import cache_root, console
from ..errors import ModelFileError
from ..kernels import KernelUnavailable, gguf_ops
from ..kernels.plan import use_forms
from .files import safetensors_header, save_safetensors
from .gguf_index import KERNEL_ARCHS, QK, GGUFIndex, has_records
from .gguf_numbers import LAYER_NAMES, hf_row_order, hf_tensors, permuted_heads
from .hugepages import in_huge_pages, map_file, none_at_all, read_huge, start_read, uncache
from .packaged import gguf_file


def gguf_name(hf_name: str) -> str | None:
    """'model.layers.3.mlp.up_proj.weight' -> 'blk.3.ffn_up.weight'; lm_head -> output."""
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    if len(parts) == 6 and parts[:2] == ["model", "layers"] and parts[-1] == "weight":
        mapped = LAYER_NAMES.get(".".join(parts[3:5]))
        return None if mapped is None else f"blk.{parts[2]}.{mapped}.weight"
    return None


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [..., 4] uint8: the little-endian fp16 as float32 bytes."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32).view(np.uint8)


REC = {"Q4_K": 1216, "Q6_K": 1728}  # bytes per super-block record of 8 output rows in the kernel's layout
GROUP = 8  # output rows per record
# A record's fields as (first byte, end, bytes before the row index): each field is [before, row
# (8), after] (see unpack_q4k / unpack_q6k and QuantTensor.dequantize)
_SECTIONS = {"Q4_K": [(0, 1024, 32), (1024, 1088, 8), (1088, 1152, 4), (1152, 1184, 1), (1184, 1216, 1)],
             "Q6_K": [(0, 1024, 32), (1024, 1536, 16), (1536, 1664, 16), (1664, 1696, 1), (1696, 1728, 1)]}


def _groups(*arrays: np.ndarray) -> list[np.ndarray]:
    """[O, ...] arrays -> [ceil(O / 8), 8, ...]: groups of 8 output rows, the last one padded with
    zero rows (whose d = 0 makes them compute 0)."""
    O = arrays[0].shape[0]
    G = -(-O // GROUP)
    out = []
    for a in arrays:
        if G * GROUP > O:
            a = np.concatenate([a, np.zeros((G * GROUP - O,) + a.shape[1:], a.dtype)])
        out.append(a.reshape((G, GROUP) + a.shape[1:]))
    return out


def _f32_bytes(d: np.ndarray) -> np.ndarray:
    """[G, 8, nb] float32 -> [G, nb, 32] uint8: each super-block's 8 rows' scales."""
    G, _, nb = d.shape
    return d.transpose(0, 2, 1).copy().view(np.uint8).reshape(G, nb, 32)


def _q4k_fields(blocks: np.ndarray):
    """[O, nb * 144] uint8 Q4_K rows -> q [O, nb, 256] (0..15, inputs in order), sc, mn [O, nb, 8]
    (6-bit scales and mins per sub-block of 32), d, dmin [O, nb] float32."""
    O = blocks.shape[0]
    b = blocks.reshape(O, -1, 144)
    s = b[..., 4:16]  # the 12 bytes of 6-bit scales and mins
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    qs = b[..., 16:].reshape(O, -1, 4, 1, 32)  # byte l of chunk j: inputs 64j + l (low), 64j + 32 + l (high)
    q = np.concatenate([qs & 0xF, qs >> 4], 3).reshape(O, -1, 256)
    return q, sc, mn, _f16(b[..., 0:2]).view(np.float32)[..., 0], _f16(b[..., 2:4]).view(np.float32)[..., 0]


def _q6k_fields(blocks: np.ndarray):
    """[O, nb * 210] uint8 Q6_K rows -> q [O, nb, 256] (0..63, inputs in order; W = d * sc * (q - 32)),
    sc [O, nb, 16] int8 (per sub-block of 16), d [O, nb] float32."""
    O = blocks.shape[0]
    b = blocks.reshape(O, -1, 210)
    # ql byte 64n + 32h + l: low nibble input 128n + 32h + l, high nibble input 128n + 64 + 32h + l;
    # qh byte 32n + l: bits 2m, 2m + 1 are the top bits of input 128n + 32m + l
    ql = b[..., :128].reshape(O, -1, 2, 1, 2, 32)  # [n, -, h, l]
    low = np.concatenate([ql & 0xF, ql >> 4], 3).reshape(O, -1, 2, 4, 32)  # [n, m, l]
    qh = b[..., 128:192].reshape(O, -1, 2, 1, 32)
    top = np.concatenate([(qh >> (2 * m)) & 3 for m in range(4)], 3)  # [n, m, l]
    q = (low | (top << 4)).reshape(O, -1, 256)
    return q, b[..., 192:208].view(np.int8), _f16(b[..., 208:210]).view(np.float32)[..., 0]


def unpack_q4k(blocks: np.ndarray) -> torch.Tensor:
    """[O, nb * 144] uint8 Q4_K rows -> [ceil(O / 8), nb * 1216] records, each one super-block of
    8 output rows interleaved as gguf_matmul.cpp reads them."""
    return _q4k_records(*_q4k_fields(blocks))


def _q4k_records(q: np.ndarray, sc: np.ndarray, mn: np.ndarray, d: np.ndarray, dmin: np.ndarray) -> torch.Tensor:
    """Q4_K fields (as _q4k_fields returns them) -> the kernel's records [ceil(O / 8), nb * 1216]."""
    q, sc, mn, d, dmin = _groups(q, sc, mn, d, dmin)
    G, _, nb = d.shape
    q = q.reshape(G, 8, nb, 8, 4, 2, 4)  # [g, o, b, s, c, nibble, i]: input 32s + 8c + 4 nibble + i
    qs = q[..., 0, :] | (q[..., 1, :] << 4)  # [g, o, b, s, c, i]
    rec = np.empty((G, nb, 1216), np.uint8)
    rec[..., :1024] = qs.transpose(0, 2, 3, 4, 1, 5).reshape(G, nb, 1024)  # [g, b, s, c, o, i]
    rec[..., 1024:1088] = sc.transpose(0, 2, 3, 1).reshape(G, nb, 64)  # [g, b, s, o]
    rec[..., 1088:1152] = mn.reshape(G, 8, nb, 4, 2).transpose(0, 2, 3, 1, 4).reshape(G, nb, 64)  # [g, b, s/2, o, s%2]
    rec[..., 1152:1184] = _f32_bytes(d)
    rec[..., 1184:1216] = _f32_bytes(dmin)
    return torch.from_numpy(rec.reshape(G, -1))


def _row_chunks(weight: torch.Tensor, chunk: int, sub: int):
    """weight [O, in] -> float32 pieces of up to ``chunk`` rows (bounding the quantizers' float
    temporaries), inputs zero-padded to whole super-blocks: [rows, nb, 256 / sub, sub] each."""
    n_in = weight.shape[1]
    width = -(-n_in // QK) * QK
    for i in range(0, weight.shape[0], chunk):
        w = weight[i:i + chunk].float()
        if width > n_in:
            w = torch.nn.functional.pad(w, (0, width - n_in))
        yield w.reshape(w.shape[0], width // QK, QK // sub, sub)


def quantize_q4k(weight: torch.Tensor, chunk: int = 4096) -> QuantTensor:
    """A float matrix [O, in] quantized to Q4_K in the kernel's records, for models without a GGUF
    file of their own (weight format "q4k"): per sub-block of 32 inputs a step and a minimum, both
    6-bit multiples of per-super-block floats, as Q4_K stores them (W ~= d sc q - dmin mn, q in
    0..15). Inputs are padded with zeros to whole super-blocks of 256 (quantize_q8k pads the
    activations alike), so any width that is a multiple of 32 works (Qwen2.5-0.5B: 896)."""
    O, n_in = weight.shape
    parts = []
    for w in _row_chunks(weight, chunk, 32):  # [o, b, s, 32]
        # Both 6-bit factors round outwards (the stored minimum at or below the true one, the
        # stored step at or above what the rest of the range needs), so no weight is clipped:
        # each is within half a stored step of its value.
        lo = w.amin(-1).clamp(max=0.0)  # [o, b, s] each sub-block's minimum, <= 0 (Q4_K subtracts it)
        dmin = (-lo).amax(-1) / 63  # [o, b] the 6-bit minimums' unit
        mn = torch.where(dmin[..., None] > 0, -lo / dmin[..., None].clamp(min=1e-30), 0.0).ceil().clamp(0, 63)
        base = (dmin[..., None] * mn)[..., None]  # [o, b, s, 1] minus the stored minimum
        step = (w.amax(-1) + base[..., 0]) / 15  # what one quant step of the sub-block must cover
        d = step.amax(-1) / 63  # [o, b] the 6-bit scales' unit
        sc = torch.where(d[..., None] > 0, step / d[..., None].clamp(min=1e-30), 0.0).ceil().clamp(0, 63)
        unit = (d[..., None] * sc)[..., None]  # [o, b, s, 1] the quant step as stored
        q = torch.where(unit > 0, (w + base) / unit.clamp(min=1e-30), 0.0)
        q = q.round().clamp(0, 15).to(torch.uint8).reshape(w.shape[0], w.shape[1], QK)
        parts.append(_q4k_records(q.numpy(), sc.to(torch.uint8).numpy(), mn.to(torch.uint8).numpy(),
                                  d.numpy(), dmin.numpy()))
    return QuantTensor("Q4_K", O, n_in, in_huge_pages(torch.cat(parts) if len(parts) > 1 else parts[0]))


Q6K_RECORDS = 1  # the layout quantize_q6k writes; bump when it changes (small_linear keeps its records by it)


def quantize_q6k(weight: torch.Tensor, chunk: int = 4096) -> QuantTensor:
    """A float matrix [O, in] quantized to Q6_K in the kernel's records (drafters' own matrices,
    models.small_linear): per sub-block of 16 inputs a signed 8-bit multiple of a per-super-block
    float step, W ~= d sc (q - 32) with q in 0..63. The step rounds outwards (sc = ceil), so no
    weight is clipped: each is within half a stored step of its value. Inputs are padded with zeros
    to whole super-blocks of 256, as in quantize_q4k."""
    O, n_in = weight.shape
    parts = []
    for w in _row_chunks(weight, chunk, 16):  # [o, b, s, 16]
        step = w.abs().amax(-1) / 31  # [o, b, s] the quant step a sub-block needs (q - 32 in -31..31)
        d = step.amax(-1) / 127  # [o, b] the 8-bit scales' unit
        sc = torch.where(d[..., None] > 0, step / d[..., None].clamp(min=1e-30), 0.0).ceil().clamp(0, 127)
        unit = (d[..., None] * sc)[..., None]  # [o, b, s, 1] the quant step as stored
        q = torch.where(unit > 0, w / unit.clamp(min=1e-30), 0.0).round().clamp(-32, 31) + 32
        parts.append(_q6k_records(q.to(torch.uint8).reshape(w.shape[0], w.shape[1], QK).numpy(),
                                  sc.to(torch.int8).numpy(), d.numpy()))
    return QuantTensor("Q6_K", O, n_in, torch.cat(parts) if len(parts) > 1 else parts[0])


def unpack_q6k(blocks: np.ndarray) -> torch.Tensor:
    """[O, nb * 210] uint8 Q6_K rows -> [ceil(O / 8), nb * 1728] records, each one super-block of
    8 output rows interleaved as gguf_matmul.cpp reads them."""
    return _q6k_records(*_q6k_fields(blocks))


def _q6k_records(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> torch.Tensor:
    """Q6_K fields (as _q6k_fields returns them) -> the kernel's records [ceil(O / 8), nb * 1728]."""
    q, sc, d = _groups(q, sc, d)
    G, _, nb = d.shape
    lo = (q & 0xF).reshape(G, 8, nb, 32, 2, 4)  # [g, o, b, c, nibble, i]: input 8c + 4 nibble + i
    ql = lo[..., 0, :] | (lo[..., 1, :] << 4)  # [g, o, b, c, i]
    top = (q >> 4).reshape(G, 8, nb, 16, 4, 4)  # [g, o, b, s, k, i]: input 16s + 4k + i
    qh = top[..., 0, :] | (top[..., 1, :] << 2) | (top[..., 2, :] << 4) | (top[..., 3, :] << 6)  # [g, o, b, s, i]
    rec = np.empty((G, nb, 1728), np.uint8)
    rec[..., :1024] = ql.transpose(0, 2, 3, 1, 4).reshape(G, nb, 1024)  # [g, b, c, o, i]
    rec[..., 1024:1536] = qh.transpose(0, 2, 3, 1, 4).reshape(G, nb, 512)  # [g, b, s, o, i]
    rec[..., 1536:1664] = sc.transpose(0, 2, 3, 1).view(np.uint8).reshape(G, nb, 128)  # [g, b, s, o]
    rec[..., 1664:1696] = _f32_bytes(d)
    # set_q6k_offsets' per-row int32 from these fields directly (it re-derives them from records)
    qsum = q.reshape(G, 8, nb, 16, 16).sum(-1, dtype=np.int64) - 32 * 16  # [g, o, b, s] sum (q - 32)
    off = (128 * (sc.astype(np.int64) * qsum).sum(-1)).astype(np.int32)  # [g, o, b]
    rec[..., 1696:1728] = off.transpose(0, 2, 1).copy().view(np.uint8).reshape(G, nb, 32)
    return torch.from_numpy(rec).reshape(G, -1)


def _q6k_quants(rec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K records [G, nb, 1728] -> quants q [G * 8, nb, 256] (0..63, W = d * sc * (q - 32)) and
    scales sc [G * 8, nb, 16] (int8 as int64), rows in order."""
    G, nb = rec.shape[:2]
    ql = rec[..., :1024].reshape(G, nb, 32, 8, 1, 4)  # [g, b, c, o, -, i]
    lo = torch.cat([ql & 0xF, ql >> 4], 4).permute(0, 3, 1, 2, 4, 5).reshape(G * 8, nb, 256)
    qh = rec[..., 1024:1536].reshape(G, nb, 16, 1, 8, 4)  # [g, b, s, -, o, i]
    top = torch.cat([(qh >> (2 * k)) & 3 for k in range(4)], 3).permute(0, 4, 1, 2, 3, 5).reshape(G * 8, nb, 256)
    sc = rec[..., 1536:1664].contiguous().view(torch.int8).reshape(G, nb, 16, 8).permute(0, 3, 1, 2)
    return lo | (top << 4), sc.reshape(G * 8, nb, 16).long()


def set_q6k_offsets(rec: torch.Tensor) -> None:
    """Writes each Q6_K record's per-row int32 at 1696 (rec [G, nb, 1728], in place): 128 *
    sum_s sc[s] * sum_{i in s} (q_i - 32), the part of the AVX-512 / AVX-VNNI kernels' sums that
    comes from taking x as x + 128 (u8), the weights' own (gguf_vnni_kernels.h's q6k_rows)."""
    G, nb = rec.shape[:2]
    q, sc = _q6k_quants(rec)
    qsum = (q.long() - 32).reshape(G * 8, nb, 16, 16).sum(-1)  # [row, b, s]
    off = (128 * (sc * qsum).sum(-1)).to(torch.int32)  # [row, b]: |.| <= 128 * 16 * 128 * 512
    rec[..., 1696:1728] = off.reshape(G, 8, nb).permute(0, 2, 1).contiguous().view(torch.uint8).reshape(G, nb, 32)


@dataclass
class QuantTensor:
    """One GGUF matrix [out, in] as kernel records ``w`` [ceil(out / 8), ceil(in / 256) * REC[kind]] uint8
    (inputs past ``in_features`` are zero padding)."""
    kind: str  # "Q4_K" or "Q6_K"
    out_features: int
    in_features: int
    w: torch.Tensor

    def rows(self, n: int) -> QuantTensor:
        """The first n output rows."""
        return QuantTensor(self.kind, n, self.in_features, self.w[:-(-n // GROUP)])

    def select(self, ids: torch.Tensor) -> QuantTensor:
        """The output rows ``ids`` [n] (in that order), re-interleaved 8 to a record: the same
        bytes per row, so the kernels give each row the bits they give it in the whole matrix."""
        nb = -(-self.in_features // QK)
        rec = self.w.reshape(-1, nb, REC[self.kind])
        G = rec.shape[0]
        pad = torch.cat([ids, ids[-1:].expand(-len(ids) % GROUP)]).long()  # a last partial record repeats its row
        group, o = pad // GROUP, pad % GROUP  # where each chosen row sits: its record, its slot in it
        out = torch.empty(len(pad) // GROUP, nb, REC[self.kind], dtype=torch.uint8)
        for start, end, before in _SECTIONS[self.kind]:  # each field is [before, o, after] in a record
            field = rec[..., start:end].reshape(G, nb, before, GROUP, -1)
            # only the chosen rows' bytes are gathered (reordering the whole field first copied the
            # default target's output head: 0.34 s against 0.18, warm, AVX2 EPYC)
            picked = field[group, :, :, o]  # [n, b, before, after]
            picked = picked.reshape(-1, GROUP, nb, before, picked.shape[-1]).permute(0, 2, 3, 1, 4)
            out[..., start:end] = picked.reshape(-1, nb, end - start)
        # in 2 MB pages as the matrix it comes from (a drafter reads these rows every round)
        return QuantTensor(self.kind, len(ids), self.in_features, in_huge_pages(out.reshape(len(pad) // GROUP, -1)))

    def dequantize(self) -> torch.Tensor:
        """[out, in] float32 (for tests, and for drafters that read the output head)."""
        O, nb = self.out_features, -(-self.in_features // QK)
        rec = self.w.reshape(-1, nb, REC[self.kind])
        G = rec.shape[0]
        rows = lambda a, k: a.reshape(G, nb, k, 8).permute(0, 3, 1, 2).reshape(G * 8, nb, k)  # noqa: E731 [g, b, k, o] -> [row, b, k]
        floats = lambda at: rows(rec[..., at:at + 32].contiguous().view(torch.float32), 1)[..., 0]  # noqa: E731 [row, b]
        if self.kind == "Q4_K":
            qs = rec[..., :1024].reshape(G, nb, 8, 4, 8, 1, 4)  # [g, b, s, c, o, -, i]
            q = torch.cat([qs & 0xF, qs >> 4], 5)  # [g, b, s, c, o, nibble, i]
            q = q.permute(0, 4, 1, 2, 3, 5, 6).reshape(G * 8, nb, 8, 32).float()
            sc = rows(rec[..., 1024:1088], 8).float()
            mn = rec[..., 1088:1152].reshape(G, nb, 4, 8, 2).permute(0, 3, 1, 2, 4).reshape(G * 8, nb, 8).float()
            d, dmin = floats(1152), floats(1184)
            w = d[..., None, None] * sc[..., None] * q - dmin[..., None, None] * mn[..., None]
        else:  # Q6_K
            q, sc = _q6k_quants(rec)
            q, sc = q.float().reshape(G * 8, nb, 16, 16) - 32, sc.float()
            d = floats(1664)
            w = d[..., None, None] * sc[..., None] * q
        return w.reshape(G * 8, nb * QK)[:O, :self.in_features]


PACK_FORMAT = 4  # bump when the records' layout or the pack's metadata changes: every packed cache is rebuilt
# Order of a block's matrices in the pack: projections that one layer stacks (q, k, v; gate, up)
# lie next to each other, so GGUFLinear stacks them as a view of the file instead of a copy.
_PACK_ORDER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _pack_key(name: str) -> tuple:
    """'blk.3.ffn_up.weight' -> (3, 5): blocks in order, their matrices in _PACK_ORDER; the rest first."""
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _PACK_ORDER:
        return (int(parts[1]), _PACK_ORDER.index(parts[2]), name)
    return (-1, 0, name)


DENSE_FORMAT = 1  # bump when the dense file's contents change: every one is made again


def _pack_path(path: Path, folder: str = "packed", fmt: int = PACK_FORMAT) -> Path:
    """Where the kernel records of a GGUF file are kept (``folder`` "packed/dense": its dense
    tensors): keyed by its name, size and mtime, so an edited file is packed again."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{fmt}".encode()).hexdigest()[:12]
    return cache_root() / folder / f"{path.stem}-{key}.safetensors"


def _remove_stale_packs(pack: Path, source: str) -> None:
    """Removes the packs beside ``pack`` that no load can reach any more: those of the same GGUF
    file made before it was edited (their metadata names the same source), and those of the same
    name in an older layout (no "format" in their metadata: keyed by an older PACK_FORMAT). Each is
    ~1 GB for the default target. A pack of another file of the same name is kept; nothing here
    fails a load."""
    for other in pack.parent.glob(f"{pack.name.rsplit('-', 1)[0]}-*.safetensors"):
        if other == pack:
            continue
        try:
            meta = safetensors_header(other)[1].get("__metadata__", {})
            if meta.get("source") == source or (meta and "format" not in meta):
                other.unlink(missing_ok=True)
        except (OSError, ValueError):
            continue


class GGUFTensors:
    """The supported quantized matrices of one GGUF file in the kernels' record layout, looked up by
    Hugging Face name.

    The records are made once per file and kept in the cache: a safetensors file whose one tensor
    ``records`` holds every matrix's records back to back (name -> kind, shape and byte offset in
    its metadata). A start reads that file into 2 MB pages (models.hugepages; where there are none,
    maps it, processes sharing its pages) instead of parsing the GGUF's metadata (~11 s for
    Qwen2.5's tokenizer arrays) and unpacking every matrix (~6 s)."""

    def __init__(self, path: str | Path, progress: bool = True):
        self.path = Path(path)
        self.progress = progress
        pack = _pack_path(self.path)
        if not pack.is_file():
            self._write_pack(pack, progress)
        # Damage is what the file says (its header, its length); only that removes it. An error
        # while reading a sound file (memory, a fault of ours) propagates and leaves the pack alone.
        try:
            meta = safetensors_header(pack)[1]["__metadata__"]
            self.arch = meta["arch"]
            self._entries: dict[str, tuple] = {k: tuple(v) for k, v in json.loads(meta["tensors"]).items()}
            offset, nbytes = _records_span(pack)
        except (OSError, ValueError, KeyError, TypeError):
            pack.unlink(missing_ok=True)
            raise ModelFileError(f"the packed copy of {self.path.name} in {pack.parent} was damaged and is "
                                 "removed; run the command again to rebuild it") from None
        # in 2 MB pages where the kernel gives them (models.hugepages: a forward streams every
        # record, ~15% faster than through 4 KB pages): the file's map where its page cache holds
        # 2 MB folios, else a copy; without them the file's map (pages shared between processes),
        # marked MADV_HUGEPAGE all the same (no start cost: pages it reads come in 2 MB folios,
        # which later maps take whole) unless huge pages are refused outright
        flat = read_huge(pack, offset, nbytes)
        self._flat = flat if flat is not None else map_file(pack, offset, nbytes, huge=not none_at_all())
        if self.arch not in KERNEL_ARCHS:
            raise ModelFileError(f"weight format gguf supports {', '.join(KERNEL_ARCHS)} GGUF files, "
                                 f"{self.path.name} is {self.arch!r}; use --target-format w8a8")

    def _write_pack(self, pack: Path, progress: bool) -> None:
        """Parse the GGUF, unpack every Q4_K / Q6_K matrix into records, write them to ``pack``."""
        try:
            reader = GGUFIndex(self.path)
        except Exception as e:
            raise ModelFileError(f"cannot read GGUF {self.path.name} ({type(e).__name__}: {e}); re-create the file") from None
        arch = str(reader.fields.get("general.architecture", "?"))
        # where each matrix's records go: [ceil(out / 8) groups, a record per super-block of inputs]
        # in one buffer, filled in place (a list of them joined at the end held the pack twice: 2.2 GB)
        tensors = [t for t in sorted(reader.tensors, key=lambda t: _pack_key(t.name)) if has_records(t)] \
            if arch in KERNEL_ARCHS else []  # others are refused on open, with the reason
        entries, offset = {}, 0
        for t in tensors:
            in_f, out_f = (int(n) for n in t.shape[:2])  # ggml order: inputs first
            groups = -(-out_f // GROUP)
            entries[t.name] = (t.tensor_type.name, out_f, in_f, offset, groups)
            offset += groups * _record_bytes(t.tensor_type.name, in_f)
        flat = torch.empty(offset, dtype=torch.uint8)
        heads = permuted_heads(reader)
        status = console().status(f"packing {self.path.name} for the GGUF kernels (once)...")
        with status if progress else nullcontext():
            for t in tensors:
                kind, out_f, in_f, start, groups = entries[t.name]
                data = np.asarray(t.data).reshape(out_f, -1)  # a row's blocks: the rows are independent
                role = t.name.split(".")[-2]
                if role in heads:
                    data = data[hf_row_order(out_f, heads[role])]
                unpack = unpack_q4k if kind == "Q4_K" else unpack_q6k
                dest = flat[start:start + groups * _record_bytes(kind, in_f)].view(groups, -1)
                chunk = 8192  # rows per unpack (whole groups): bounds the temporaries for the output head
                for i in range(0, out_f, chunk):
                    dest[i // GROUP:(i + chunk) // GROUP] = unpack(data[i:i + chunk])
        # uncached: its first load reads it back in 2 MB folios where the kernel can (hugepages.mapped_huge)
        self._publish(pack, {"records": flat}, {"arch": arch, "tensors": json.dumps(entries),
                                                "format": str(PACK_FORMAT)}, uncached=True)

    def _publish(self, path: Path, tensors: dict, metadata: dict[str, str], uncached: bool = False) -> None:
        """Writes a cache file of this GGUF's (the pack, the dense file) whole or not at all, its
        source named in its metadata, and removes the ones of the same name no load can reach."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        source = str(self.path.resolve())
        save_safetensors(tensors, tmp, {**metadata, "source": source})
        if uncached:
            uncache(tmp)
        os.replace(tmp, path)  # whole or absent: a crash mid-write leaves no half file
        _remove_stale_packs(path, source)

    def dense_file(self) -> Path:
        """A safetensors file of the tensors the gguf weight format reads as numbers, by Hugging
        Face name, in bfloat16: the embedding (gathered from), norms, biases, and matrices without
        records (a type the kernels lack), made once per GGUF file. The same numbers as
        transformers' dequantization (gguf-py's), rounded to bfloat16 as the converted copy is;
        read from here, a gguf model's numbers do not depend on which copy the cache holds, and
        a first run need not write the bf16 copy of every matrix (convert.py: weights=False)."""
        dense = _pack_path(self.path, "packed/dense", DENSE_FORMAT)
        if not dense.is_file():
            self._write_dense(dense, self.progress)
        try:
            safetensors_header(dense)
        except (OSError, ValueError):
            dense.unlink(missing_ok=True)
            raise ModelFileError(f"the dense tensors of {self.path.name} in {dense.parent} were damaged and are "
                                 "removed; run the command again to make them anew") from None
        return dense

    def _write_dense(self, dense: Path, progress: bool) -> None:
        reader = GGUFIndex(self.path)
        status = console().status(f"reading {self.path.name}'s embedding and norms (once)...")
        with status if progress else nullcontext():
            # what is multiplied from the records is left out; the embedding is gathered from: numbers
            tensors = dict(hf_tensors(reader, lambda t: not has_records(t) or t.name == "token_embd.weight"))
        self._publish(dense, tensors, {"format": str(DENSE_FORMAT)})

    def _name(self, hf_name: str) -> str | None:
        """The GGUF tensor behind a HF weight name when the kernels can multiply it, else None."""
        name = gguf_name(hf_name)
        if name not in self._entries and hf_name == "lm_head.weight":
            name = "token_embd.weight"  # tied output head
        return name if name in self._entries else None

    def has_kernel(self, hf_name: str) -> bool:
        return self._name(hf_name) is not None

    def get(self, hf_name: str, rows: int | torch.Tensor | None = None) -> QuantTensor | None:
        """The matrix behind a HF weight name in the kernel's layout (a view of the mapped pack;
        ``rows``: its first ``rows`` outputs, or the outputs ``rows`` [n] gathered), or None when
        its type has no kernel."""
        name = self._name(hf_name)
        if name is None:
            return None
        kind, out_f, in_f, offset, groups = self._entries[name]
        w = self._flat[offset:offset + groups * _record_bytes(kind, in_f)]
        qt = QuantTensor(kind, out_f, in_f, w.view(groups, -1))
        if isinstance(rows, torch.Tensor):
            return qt.select(rows)
        return qt.rows(rows) if rows is not None and rows < out_f else qt


def _record_bytes(kind: str, in_f: int) -> int:
    """Bytes of one group of 8 output rows: one record per super-block of inputs."""
    return -(-in_f // QK) * REC[kind]


def _adjacent(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when b's bytes follow a's in the same storage (two matrices of one mapped pack)."""
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.is_contiguous()
            and b.is_contiguous() and a.data_ptr() + a.nbytes == b.data_ptr())


def _stack(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[Ga, n] and [Gb, n] records -> [Ga + Gb, n]: a view when they are adjacent, else a copy."""
    if _adjacent(a, b):
        return torch.empty(0, dtype=a.dtype).set_(a.untyped_storage(), a.storage_offset(),
                                                  (a.shape[0] + b.shape[0], a.shape[1]))
    return in_huge_pages(torch.cat([a, b]))


class GGUFLinear:
    """A linear layer over one or more GGUF matrices stacked along the outputs (q, k, v may differ
    in type): x [T, in] -> [T, sum of outs]. The activations are quantized once per call."""

    __slots__ = ("bias", "in_features", "ops", "parts")

    def __init__(self, parts: list[QuantTensor], bias: torch.Tensor | None = None):
        self.ops = gguf_ops()
        use_forms()  # once a process: the VNNI kernels' forms timed as they run, or fixed (kernels.plan)
        merged: list[QuantTensor] = []  # neighbours of one type become one matrix: one kernel call
        for p in parts:
            if (merged and merged[-1].kind == p.kind and merged[-1].in_features == p.in_features
                    and merged[-1].out_features % GROUP == 0):  # no padding rows inside
                last = merged.pop()
                p = QuantTensor(p.kind, last.out_features + p.out_features, p.in_features, _stack(last.w, p.w))
            merged.append(p)
        self.parts = merged
        self.in_features = parts[0].in_features
        self.bias = None if bias is None else bias.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.on_quantized(self.ops.quantize_q8k(x.float().contiguous())).to(x.dtype)

    def on_quantized(self, xq: list[torch.Tensor]) -> torch.Tensor:
        """y [T, out] float32 from activations already quantized (quantize_q8k's 3 tensors:
        the fused ops rms_quantize / swiglu_quantize produce them)."""
        ys = [(self.ops.q4k_matmul if p.kind == "Q4_K" else self.ops.q6k_matmul)(*xq, p.w, p.out_features)
              for p in self.parts]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, -1)
        return y if self.bias is None else y.add_(self.bias)

    def native_spec(self) -> tuple:
        """(parts, bias) as kernels.Decoder takes a projection: parts [(4 | 6, records, out)]."""
        return ([(4 if p.kind == "Q4_K" else 6, p.w, p.out_features) for p in self.parts], self.bias)

    def first_rows(self, n: int) -> GGUFLinear:
        """The same layer over its first n outputs (one part only: an output head)."""
        assert len(self.parts) == 1 and self.bias is None
        return GGUFLinear([self.parts[0].rows(n)])

    def select_rows(self, ids: torch.Tensor) -> GGUFLinear:
        """The same layer over the outputs ``ids`` [n], in that order (one part only: an output head)."""
        assert len(self.parts) == 1 and self.bias is None
        return GGUFLinear([self.parts[0].select(ids)])

    def dequantize_rows(self, n: int | torch.Tensor) -> torch.Tensor:
        """[n, in] float32: the first n output rows of the weights, or the rows ``n`` [n] (one part)."""
        if isinstance(n, torch.Tensor):
            return self.select_rows(n).parts[0].dequantize()
        out, left = [], n
        for p in self.parts:
            if left <= 0:
                break
            out.append(p.rows(min(left, p.out_features)).dequantize())
            left -= p.out_features
        return torch.cat(out)


class RequantizedWeights:
    """Weight format "q4k": a Llama-family model's own float weights quantized to Q4_K as they are
    looked up (quantize_q4k), so a model without a GGUF file, or one whose GGUF types have no
    kernel here (the default 0.5B draft is mostly Q5_0), runs on the same native kernels and
    fused layers as a gguf target. Lossy like any 4-bit format: meant for drafts, whose numerics
    only move the acceptance rate. Same lookup as GGUFTensors."""

    def __init__(self, weights):
        self.weights = weights  # HF name -> tensor (llama.LazyWeights)

    def get(self, hf_name: str, rows: int | torch.Tensor | None = None) -> QuantTensor | None:
        name = hf_name
        if name == "lm_head.weight" and name not in self.weights:
            name = "model.embed_tokens.weight"  # tied output head
        w = self.weights.get(name)
        if w is None or w.dim() != 2 or w.shape[1] % 32:
            return None
        if isinstance(rows, torch.Tensor):
            return quantize_q4k(w[rows])  # rows are quantized one by one: the same bits as in the whole
        return quantize_q4k(w if rows is None else w[:rows])


def _records_span(pack: Path) -> tuple[int, int]:
    """(offset, bytes) of the records in a pack file; ValueError / KeyError / OSError where its
    header cannot say."""
    n, header = safetensors_header(pack)
    start, end = (int(x) for x in header["records"]["data_offsets"])
    if not 0 <= start <= end or 8 + n + end > pack.stat().st_size:
        raise ValueError("cut short")
    return 8 + n + start, end - start


def start_pack_read(spec: str) -> bool:
    """Starts reading the packed records of the GGUF file behind ``spec`` into 2 MB pages on a
    thread of their own (hugepages.start_read), for GGUFTensors to take when it opens the same pack;
    whether it started. Nothing where the spec has no GGUF file, the pack is not made yet or huge
    pages are off; a damaged pack is left for GGUFTensors to report."""
    try:
        pack = _pack_path(gguf_file(spec, progress=False))
        if not pack.is_file():
            return False
        return start_read(pack, *_records_span(pack))
    except (ModelFileError, OSError, ValueError, KeyError, TypeError):
        return False


def gguf_source(spec: str, *, required: bool, progress: bool = True) -> GGUFTensors | None:
    """The tensors of the GGUF file behind ``spec`` when weight format gguf can run it here, else
    None, or (when ``required``) a one-line error naming what is missing."""

    try:
        path = gguf_file(spec, progress=progress)
        tensors = GGUFTensors(path, progress=progress)
        if not tensors.has_kernel("model.layers.0.mlp.up_proj.weight"):
            raise ModelFileError(f"{path.name} has no Q4_K / Q6_K projections for the gguf kernels; use w8a8")
        gguf_ops()
    except KernelUnavailable as e:
        if required:
            raise ModelFileError(f"{e}; use --target-format w8a8") from None
        import sys

        print(f"note: {e}; the target runs w8a8 instead", file=sys.stderr)
        return None
    except ModelFileError:
        if required:
            raise
        return None
    return tensors
