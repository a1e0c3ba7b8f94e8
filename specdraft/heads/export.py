"""Exporting trained drafters to the layouts serving engines load, so they serve beyond one machine.

EAGLE -> vLLM's speculators layout (``--to vllm``):

heads.eagle is the EAGLE-1 / HASS layer with layernorms, which speculators describes as
``speculators_model_type: "eagle"`` with ``layernorms: true`` and ``fusion_bias: false``: an
embedding norm, ``fusion_fc`` over [embedding ; verifier hidden state], one LlamaDecoderLayer
(its input norm kept; q/k/v biases as Qwen2's) and a norm before the verifier's output head.
The weights map one to one (names below); only fc's two input halves swap places, since
speculators concatenates the embedding first. The verifier's embedding and output head are not
stored: the serving engine attaches the verifier's own.

Medusa -> the ``medusa_num_heads`` layout vLLM's Medusa model loads (``--to medusa``): one
residual block per head, ``blocks.{i}.layers.0.{weight,bias}`` (``medusa_fc_bias``), one output
head shared by all (``original_lm_head``), and since the heads guess among the target's first
V' ids, ``truncated_vocab_size`` V' with ``token_map`` = 0..V'-1 and the output head's first V'
rows as ``lm_heads.0.weight``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import ParameterError
from .eagle import EagleHead
from .medusa import MedusaHeads

SPECULATORS_VERSION = "0.3.0"  # the speculators release whose "eagle" config fields this writes
PROPOSED_TOKENS = 5  # the greedy proposal length written as the default


def vllm_tensors(head: EagleHead) -> dict[str, torch.Tensor]:
    """The drafter's weights under speculators' "eagle" names (bf16)."""
    c = head.cfg
    H = c.hidden_size
    q, k, v = head.qkv.weight.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                                     c.num_kv_heads * c.head_dim])
    qb, kb, vb = head.qkv.bias.split([q.shape[0], k.shape[0], v.shape[0]])
    gate, up = head.gate_up.weight.chunk(2)
    attn, mlp = "transformer.self_attn.", "transformer.mlp."
    out = {
        "embedding_layernorm.weight": head.g_e,
        "fusion_fc.weight": torch.cat([head.fc.weight[:, H:], head.fc.weight[:, :H]], 1),  # [emb ; hidden]
        "transformer.input_layernorm.weight": head.ln1,
        "transformer.post_attention_layernorm.weight": head.ln2,
        attn + "q_proj.weight": q, attn + "q_proj.bias": qb,
        attn + "k_proj.weight": k, attn + "k_proj.bias": kb,
        attn + "v_proj.weight": v, attn + "v_proj.bias": vb,
        attn + "o_proj.weight": head.o.weight,
        attn + "o_proj.bias": torch.zeros(H),  # Llama's attention_bias covers o_proj too
        mlp + "gate_proj.weight": gate, mlp + "up_proj.weight": up, mlp + "down_proj.weight": head.down.weight,
        "pre_lm_head_layernorm.weight": head.g_out,
    }
    return {name: t.detach().to(torch.bfloat16).contiguous() for name, t in out.items()}


def vllm_config(head: EagleHead, verifier: str, verifier_config: dict) -> dict:
    """config.json of the speculators "eagle" model for ``verifier`` (its HF id or path) whose
    config.json is ``verifier_config``."""
    c = head.cfg
    layer = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
        "hidden_size": c.hidden_size, "intermediate_size": c.inner, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden_act": "silu",
        "rms_norm_eps": c.eps, "rope_theta": c.rope_theta, "attention_bias": True, "mlp_bias": False,
        "vocab_size": verifier_config["vocab_size"],
        "max_position_embeddings": verifier_config.get("max_position_embeddings", 4096),
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    return {
        "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
        "speculators_model_type": "eagle",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_architecture": "LlamaDecoderLayer",
        "transformer_layer_config": layer,
        "layernorms": True,
        "fusion_bias": False,
        "torch_dtype": "bfloat16",
        "speculators_config": {
            "algorithm": "eagle",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": PROPOSED_TOKENS}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_config.get("architectures", [])},
        },
    }


def medusa_tensors(heads: MedusaHeads, lm_rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The heads' weights under vLLM Medusa's names (bf16); lm_rows [V', H]: the target's output
    head's rows for the heads' vocabulary; token_map (int64) maps draft ids to the target's."""
    out = {}
    for i, block in enumerate(heads.blocks):
        out[f"blocks.{i}.layers.0.weight"] = block.weight
        out[f"blocks.{i}.layers.0.bias"] = block.bias
    out["lm_heads.0.weight"] = lm_rows[:heads.cfg.vocab]
    tensors = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in out.items()}
    tensors["token_map"] = heads.token_ids().to(torch.int64)
    return tensors


def medusa_config(heads: MedusaHeads, verifier: str, verifier_config: dict) -> dict:
    """config.json of vLLM's Medusa model for ``verifier`` whose config.json is ``verifier_config``."""
    c = heads.cfg
    return {
        "architectures": ["MedusaModel"], "model_type": "medusa",
        "medusa_num_heads": c.num_heads, "medusa_num_layers": 1, "medusa_fc_bias": True,
        "original_lm_head": True, "hidden_size": c.hidden_size,
        "vocab_size": verifier_config["vocab_size"], "truncated_vocab_size": c.vocab,
        "base_model_name_or_path": verifier, "torch_dtype": "bfloat16",
    }


LAYOUTS = {"vllm": EagleHead, "medusa": MedusaHeads}  # --to: the drafter kind it writes


def check_layout(to: str) -> None:
    """A one-line ParameterError unless ``to`` is a layout this module writes."""
    if to not in LAYOUTS:
        raise ParameterError(f"--to {to}: the layouts written are 'vllm' (speculators' eagle) and 'medusa'; "
                             "SGLang's and vLLM's EAGLE-3 layouts need a drafter on several target layers")


def export(head, out: str | Path, to: str, verifier: str, verifier_config: dict,
           lm_rows: torch.Tensor | None = None) -> list[Path]:
    """Write ``head`` in the layout ``to`` into directory ``out`` (Medusa: with ``lm_rows`` [V', H],
    the target's output head's first rows); returns the files written."""
    check_layout(to)
    if getattr(head.cfg, "form", None) == "head":
        raise ParameterError("this EAGLE drafter is of the 'head' form (attention in front of the MLP head's step, "
                             "whose MLP reads the token too): no serving engine's layout holds it; "
                             "--to vllm exports the 'layer' form (train-drafter --kind eagle without --init)")
    if not isinstance(head, LAYOUTS[to]):
        kind = "eagle" if to == "vllm" else "medusa"
        raise ParameterError(f"--to {to} writes {kind} drafters (train one with `specdraft train-drafter --kind {kind}`)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if to == "vllm":
        tensors, config = vllm_tensors(head), vllm_config(head, verifier, verifier_config)
    else:
        if lm_rows is None:
            raise ParameterError("a Medusa export needs the target's output head")
        tensors, config = medusa_tensors(head, lm_rows), medusa_config(head, verifier, verifier_config)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "config.json", out / "model.safetensors"]
