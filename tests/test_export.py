"""``specdraft export``: an EAGLE drafter in speculators' "eagle" layout (``--to vllm``), Medusa
heads in the ``medusa_num_heads`` layout vLLM loads (``--to medusa``).

What was written is reloaded and run through transformers' own Llama decoder layer and RMS
norms, wired as speculators wires them (embedding norm, fusion_fc over [embedding ; hidden],
the layer, the norm before the output head): it must give the drafter's own features. Medusa's
files are reloaded and run as vLLM's Medusa model runs them (residual block, shared output head,
token map): they must give the heads' own logits.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft.errors import ParameterError
from specdraft.heads.eagle import EagleConfig, EagleHead, attend
from specdraft.heads.export import export
from specdraft.heads.medusa import MedusaConfig, MedusaHeads

H, T = 64, 7
VERIFIER = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 96, "max_position_embeddings": 256, "hidden_size": H}


@pytest.fixture
def head():
    torch.manual_seed(0)
    h = EagleHead(EagleConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=16, inner=96, vocab=96))
    with torch.no_grad():
        for p in h.parameters():  # every weight non-trivial, exactly representable in bf16
            p.copy_((p + 0.2 * torch.randn(p.shape)).to(torch.bfloat16).float())
    return h.eval()


def ours(head: EagleHead, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """The drafter's features for one causal sequence of pairs (f [T, H], e [T, H])."""
    x = head.inputs(f, e)
    cos, sin = head.rope_tables(torch.arange(T))
    q, k, v = head.project(x, cos, sin)
    return head.finish(x, attend(q, k, v, torch.ones(T, T, dtype=torch.bool).tril()))


def reference(tensors: dict, config: dict, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """speculators' eagle forward with transformers' modules, from the exported files alone."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    cfg = LlamaConfig(**config["transformer_layer_config"])
    cfg._attn_implementation = "eager"
    w = {k: v.float() for k, v in tensors.items()}
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    layer.load_state_dict({k.removeprefix("transformer."): v for k, v in w.items() if k.startswith("transformer.")})
    norms = {}
    for name in ("embedding_layernorm", "pre_lm_head_layernorm"):
        norms[name] = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
        norms[name].weight.data.copy_(w[name + ".weight"])
    x = torch.cat([norms["embedding_layernorm"](e), f], -1) @ w["fusion_fc.weight"].T  # [T, H]
    positions = torch.arange(T)[None]
    cos, sin = LlamaRotaryEmbedding(cfg)(x[None], positions)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = layer(x[None], attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin))
    out = out[0] if isinstance(out, tuple) else out
    return norms["pre_lm_head_layernorm"](out[0])


def test_vllm_export_reloads_and_computes_the_same_features(head, tmp_path):
    files = export(head, tmp_path / "vllm", "vllm", "Qwen/Qwen2.5-Coder-1.5B-Instruct", VERIFIER)
    assert [p.name for p in files] == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle" and config["layernorms"] is True
    assert config["fusion_bias"] is False and config["transformer_layer_architecture"] == "LlamaDecoderLayer"
    layer = config["transformer_layer_config"]
    assert (layer["hidden_size"], layer["intermediate_size"], layer["num_attention_heads"],
            layer["num_key_value_heads"], layer["head_dim"], layer["vocab_size"]) == (H, 96, 4, 2, 16, 96)
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["proposal_type"] == "greedy"
    assert spec["verifier"] == {"name_or_path": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "architectures": ["Qwen2ForCausalLM"]}
    tensors = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert {"embedding_layernorm.weight", "fusion_fc.weight", "pre_lm_head_layernorm.weight",
            "transformer.self_attn.q_proj.bias", "transformer.mlp.down_proj.weight"} <= set(tensors)
    g = torch.Generator().manual_seed(1)
    f, e = torch.randn(T, H, generator=g), torch.randn(T, H, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(reference(tensors, config, f, e), ours(head, f, e), atol=1e-4, rtol=1e-4)


def test_medusa_export_reloads_and_computes_the_same_logits(tmp_path):
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(hidden_size=H, num_heads=3, vocab=80)).eval()
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_((0.2 * torch.randn(p.shape)).to(torch.bfloat16).float())
    lm = torch.randn(96, H).to(torch.bfloat16).float()  # the target's output head [V, H]
    files = export(heads, tmp_path / "medusa", "medusa", "Qwen/Qwen2.5-Coder-1.5B-Instruct", VERIFIER, lm[:80])
    assert [p.name for p in files] == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "medusa" / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert (config["medusa_num_heads"], config["medusa_num_layers"], config["hidden_size"]) == (3, 1, H)
    assert (config["vocab_size"], config["truncated_vocab_size"]) == (96, 80)
    assert config["medusa_fc_bias"] is True and config["original_lm_head"] is True
    tensors = load_file(str(tmp_path / "medusa" / "model.safetensors"))
    assert set(tensors) == {"token_map", "lm_heads.0.weight",
                            *(f"blocks.{i}.layers.0.{w}" for i in range(3) for w in ("weight", "bias"))}
    assert tensors["token_map"].tolist() == list(range(80)) and tensors["lm_heads.0.weight"].shape == (80, H)
    f = torch.randn(T, H)
    for i in range(3):  # vLLM: x + silu(linear(x)), the shared head, logits scattered through token_map
        w, b = tensors[f"blocks.{i}.layers.0.weight"].float(), tensors[f"blocks.{i}.layers.0.bias"].float()
        r = f + torch.nn.functional.silu(f @ w.T + b)
        logits = torch.full((T, 96), float("-inf"))
        logits[:, tensors["token_map"]] = r @ tensors["lm_heads.0.weight"].float().T
        with torch.no_grad():
            want = heads(f)[:, i] @ lm[:80].T
        torch.testing.assert_close(logits[:, :80], want, atol=1e-4, rtol=1e-4)


def test_other_layouts_and_kinds_are_refused_in_one_line(head, tmp_path):
    with pytest.raises(ParameterError, match=r"'vllm' .* and 'medusa'"):
        export(head, tmp_path, "sglang", "x", VERIFIER)
    with pytest.raises(ParameterError, match="--to medusa writes medusa drafters"):
        export(head, tmp_path, "medusa", "x", VERIFIER)
    from specdraft.heads.eagle import EagleMLPHead

    on_head = EagleMLPHead(EagleConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, inner=16, vocab=96,
                                       form="head"))
    with pytest.raises(ParameterError, match="'head' form"):
        export(on_head, tmp_path, "vllm", "x", VERIFIER)
    assert not any(tmp_path.iterdir())  # nothing written
