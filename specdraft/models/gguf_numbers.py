"""A GGUF file's tensors by their Hugging Face names, as bfloat16 numbers: gguf-py's dequantization
(what transformers' GGUF loader runs), rounded to bf16 as a converted copy is, a chunk of rows at a
time. Llama-family files only (Qwen2, Qwen3, Llama): a "llama" file's q / k rows, permuted by
llama.cpp's converter for GGML's rope, come back in Hugging Face's order.

Checked against transformers' own conversion: every tensor of the default target (339) and the
default draft (291) equal, bit for bit (Zen 4 EPYC, transformers 5.25). The gguf weight format's
dense file (gguf_weights) is made from here. Not the whole bf16 copy: gguf-py's numpy is one core,
transformers' own loader is not (the default target: 46.5 s against 42.0).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from ..errors import ModelFileError
from .gguf_index import KERNEL_ARCHS, GGUFIndex, IndexedTensor

# Hugging Face projection name -> GGUF tensor name (llama.cpp's naming for Llama-family blocks)
LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
# every tensor such a file holds, by its Hugging Face name: per block (blk.N.<gguf> ->
# model.layers.N.<hf>) and whole-model ones
_LAYER = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
          "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
          "attn_v.bias": "self_attn.v_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
          "attn_k_norm.weight": "self_attn.k_norm.weight",
          **{f"{g}.weight": f"{h}.weight" for h, g in LAYER_NAMES.items()}}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}


def hf_tensor_name(name: str) -> str | None:
    """'blk.3.attn_norm.weight' -> 'model.layers.3.input_layernorm.weight' (gguf_weights.gguf_name's
    inverse, norms and biases too); None for a tensor the models here do not read as a weight."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}"
    return _TOP.get(name)


def hf_row_order(rows: int, heads: int) -> np.ndarray:
    """GGUF row of each HF row of a permuted q / k matrix ([rows] int64). The converter wrote
    gguf[h, i, j] = hf[h, j, i] (h a head, j a rope half, i < head_dim / 2), so hf = gguf[order]."""
    return np.arange(rows).reshape(heads, -1, 2).swapaxes(1, 2).reshape(-1)


def head_counts(reader: GGUFIndex, arch: str) -> dict[str, int]:
    """GGUF q / k tensor suffix -> the heads its rows hold, from the file's metadata."""
    def field(key: str) -> int | None:
        value = reader.fields.get(f"{arch}.attention.{key}")
        return None if value is None else int(value)

    heads = field("head_count")
    if heads is None:
        raise ModelFileError(f"{arch} GGUF without {arch}.attention.head_count; re-create the file")
    return {"attn_q": heads, "attn_k": field("head_count_kv") or heads}


def permuted_heads(reader: GGUFIndex) -> dict[str, int]:
    """head_counts for a file whose q / k rows the converter permuted ("llama"), else {}."""
    arch = str(reader.fields.get("general.architecture", "?"))
    return head_counts(reader, arch) if KERNEL_ARCHS.get(arch) else {}


def dequantize_bf16(t: IndexedTensor, rows_order: np.ndarray | None = None, chunk: int = 8192) -> torch.Tensor:
    """A GGUF tensor as bfloat16 numbers in Hugging Face order [rows, inputs] (``rows_order``: the
    GGUF row of each), dequantized by gguf-py as float32 and rounded ``chunk`` rows at a time (the
    default target's embedding whole in float32 would be 0.93 GB)."""
    from gguf import dequantize

    shape = tuple(reversed(t.shape))  # ggml order lists the inputs first
    if len(shape) == 1:  # a norm's or a bias's numbers (a q / k bias's in ``rows_order`` too)
        x = torch.from_numpy(dequantize(np.asarray(t.data).reshape(1, -1), t.tensor_type).reshape(-1).copy())
        return (x if rows_order is None else x[torch.from_numpy(rows_order)]).to(torch.bfloat16)
    rows = int(np.prod(shape[:-1]))
    data = np.asarray(t.data).reshape(rows, -1)  # a row's bytes: rows dequantize independently
    if rows_order is not None:
        data = data[rows_order]
    out = torch.empty((rows, int(shape[-1])), dtype=torch.bfloat16)
    for i in range(0, rows, chunk):
        x = dequantize(data[i:i + chunk], t.tensor_type)
        out[i:i + chunk] = torch.from_numpy(x if x.flags.writeable else x.copy())  # float32: a view of the map
    return out.reshape(shape)


def hf_tensors(reader: GGUFIndex, keep: Callable[[IndexedTensor], bool] = lambda t: True,
               ) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, bf16 numbers) of each tensor ``keep`` takes, in the file's order; a
    tensor without a Hugging Face name is left out (rope_freqs: the config holds it)."""
    heads = permuted_heads(reader)
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None or not keep(t):
            continue
        role = t.name.split(".")[-2]  # a permuted q / k's rows (a bias, a matrix)
        order = hf_row_order(int(t.shape[-1]), heads[role]) if role in heads else None
        yield name, dequantize_bf16(t, order)

