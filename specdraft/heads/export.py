"""Exporting trained drafters to the layouts serving engines load, so they serve beyond one machine.

EAGLE -> vLLM's speculators layout (``--to vllm``):

heads.eagle's "layer" form is the EAGLE-1 / HASS layer with layernorms, which speculators describes as
``speculators_model_type: "eagle"`` with ``layernorms: true`` and ``fusion_bias: false``: an
embedding norm, ``fusion_fc`` over [embedding ; verifier hidden state], one LlamaDecoderLayer
(its input norm kept; q/k/v biases as Qwen2's) and a norm before the verifier's output head.
The weights map one to one (names below); only fc's two input halves swap places, since
speculators concatenates the embedding first. The verifier's embedding and output head are not
stored: the serving engine attaches the verifier's own.

EAGLE-3 -> speculators' "eagle3" layout (``--to vllm``) and SGLang's ``LlamaForCausalLMEagle3``
layout (``--to sglang``): heads.eagle's "eagle3" form is that layer (norm_before_residual false:
the residual is fc's output unnormed; the attention reads [embedding ; hidden], both normed). fc
maps the tapped layers' raw outputs, low to high; q/k/v read 2H. Its guesses come from the
target's output-head rows of its listed ids, written as the drafter's own ``lm_head`` [V', H]
with EAGLE-3's maps: ``d2t`` [V'] int64 (target id = draft index + d2t) and ``t2d`` [V] bool.
The tapped layers are named as each engine counts them: speculators / vLLM by the layer whose
input is captured (tap + 1), SGLang by the layer whose output is (the tap itself).

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
from .eagle import Eagle3Head, EagleHead
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
    layer = {**_llama_layer_config(head, verifier_config), "attention_bias": True}  # Qwen2's q/k/v biases
    return {
        "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
        "speculators_model_type": "eagle",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_architecture": "LlamaDecoderLayer",
        "transformer_layer_config": layer,
        "layernorms": True,
        "fusion_bias": False,
        "torch_dtype": "bfloat16",
        "speculators_config": _speculators_config("eagle", verifier, verifier_config),
    }


def _speculators_config(algorithm: str, verifier: str, verifier_config: dict, **proposal) -> dict:
    """speculators_config: greedy proposals of PROPOSED_TOKENS (``proposal``: more fields of the
    method) checked by ``verifier``."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": PROPOSED_TOKENS, **proposal}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier, "architectures": verifier_config.get("architectures", [])},
    }


def _eagle3_layer(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The layer's weights under the names the decoder layer has in both layouts (before their
    prefix): Llama's, plus EAGLE-3's hidden_norm."""
    c = head.cfg
    q, k, v = head.qkv.weight.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                                     c.num_kv_heads * c.head_dim])  # [*, 2H]: [embedding ; hidden]
    gate, up = head.gate_up.weight.chunk(2)
    return {"input_layernorm.weight": head.ln_e, "hidden_norm.weight": head.ln_h,
            "post_attention_layernorm.weight": head.ln2,
            "self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
            "self_attn.o_proj.weight": head.o.weight,
            "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up, "mlp.down_proj.weight": head.down.weight}


def eagle3_tensors(head: Eagle3Head, lm_rows: torch.Tensor, layer_prefix: str,
                   target_vocab: int) -> dict[str, torch.Tensor]:
    """The weights (bf16) and vocabulary maps of an "eagle3" drafter, its decoder layer's names
    under ``layer_prefix`` ("layers.0." for speculators, "midlayer." for SGLang); lm_rows [V', H]:
    the target's output-head rows of the drafter's ids."""
    ids = head.token_ids()
    if bool((ids[1:] <= ids[:-1]).any()):
        raise ParameterError("EAGLE-3's vocabulary maps need the drafter's ids in ascending order")
    if int(ids.max()) >= target_vocab:
        raise ParameterError(f"the drafter guesses token id {int(ids.max())}, past the target's {target_vocab} ids: "
                             "it was trained for another target")
    out = {"fc.weight": head.fuse.weight, "norm.weight": head.g_out, "lm_head.weight": lm_rows,
           **{layer_prefix + name: t for name, t in _eagle3_layer(head).items()}}
    tensors = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in out.items()}
    tensors["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)
    tensors["t2d"] = torch.zeros(target_vocab, dtype=torch.bool).index_fill_(0, ids, True)
    return tensors


def _llama_layer_config(head: EagleHead | Eagle3Head, verifier_config: dict) -> dict:
    """The Llama config of the drafter's one decoder layer (vocab_size: the target's; no biases)."""
    c = head.cfg
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
        "hidden_size": c.hidden_size, "intermediate_size": c.inner, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden_act": "silu",
        "rms_norm_eps": c.eps, "rope_theta": c.rope_theta, "attention_bias": False, "mlp_bias": False,
        "vocab_size": verifier_config["vocab_size"],
        "max_position_embeddings": verifier_config.get("max_position_embeddings", 4096),
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def speculators_eagle3_config(head: Eagle3Head, verifier: str, verifier_config: dict) -> dict:
    """config.json of the speculators "eagle3" model for ``verifier``."""
    c = head.cfg
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _llama_layer_config(head, verifier_config),
        "draft_vocab_size": c.vocab,
        "norm_before_residual": False,  # vLLM assumes True when it is missing: always written
        "target_hidden_size": c.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [t + 1 for t in c.taps],  # the layers whose input is captured
        "torch_dtype": "bfloat16",
        "speculators_config": _speculators_config("eagle3", verifier, verifier_config, verifier_accept_k=1,
                                                  accept_tolerance=0.0),
    }


def sglang_eagle3_config(head: Eagle3Head, verifier_config: dict) -> dict:
    """config.json of SGLang's LlamaForCausalLMEagle3 (the original EAGLE-3 checkpoints' layout)."""
    c = head.cfg
    return {**_llama_layer_config(head, verifier_config), "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": c.vocab, "target_hidden_size": c.hidden_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.taps), "use_aux_hidden_state": True}}


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


# --to: the drafter classes it writes, and the kind of drafter that is (train-drafter --kind)
LAYOUTS = {"vllm": ((EagleHead, Eagle3Head), "eagle"), "sglang": ((Eagle3Head,), "eagle"),
           "medusa": ((MedusaHeads,), "medusa")}


def check_layout(to: str) -> None:
    """A one-line ParameterError unless ``to`` is a layout this module writes."""
    if to not in LAYOUTS:
        raise ParameterError(f"--to {to}: the layouts written are 'vllm' (speculators' eagle and eagle3), "
                             "'sglang' (EAGLE-3) and 'medusa'")


def export(head, out: str | Path, to: str, verifier: str, verifier_config: dict,
           lm_rows: torch.Tensor | None = None) -> list[Path]:
    """Write ``head`` in the layout ``to`` into directory ``out`` (Medusa and EAGLE-3: with
    ``lm_rows`` [V', H], the target's output-head rows of the drafter's ids); returns the files
    written."""
    check_layout(to)
    if getattr(head.cfg, "form", None) == "head":
        raise ParameterError("this EAGLE drafter is of the 'head' form (attention in front of the MLP head's step, "
                             "whose MLP reads the token too): no serving engine's layout holds it; "
                             "train the 'eagle3' form (train-drafter --kind eagle --taps ...) to export")
    classes, kind = LAYOUTS[to]
    if not isinstance(head, classes):
        how = "--kind eagle --taps LAYERS" if to == "sglang" else f"--kind {kind}"
        raise ParameterError(f"--to {to} writes {'EAGLE-3' if to == 'sglang' else kind} drafters "
                             f"(train one with `specdraft train-drafter {how}`)")
    if lm_rows is None and not isinstance(head, EagleHead):
        raise ParameterError("this export needs the target's output head")
    if isinstance(head, EagleHead):
        tensors, config = vllm_tensors(head), vllm_config(head, verifier, verifier_config)
    elif to == "vllm":
        tensors = eagle3_tensors(head, lm_rows, "layers.0.", verifier_config["vocab_size"])
        config = speculators_eagle3_config(head, verifier, verifier_config)
    elif to == "sglang":
        tensors = eagle3_tensors(head, lm_rows, "midlayer.", verifier_config["vocab_size"])
        config = sglang_eagle3_config(head, verifier_config)
    else:
        tensors, config = medusa_tensors(head, lm_rows), medusa_config(head, verifier, verifier_config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600; a serving engine may run as another user
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "config.json", out / "model.safetensors"]
