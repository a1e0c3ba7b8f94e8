"""``specdraft export``: an EAGLE drafter in speculators' "eagle" layout (``--to vllm``), an
EAGLE-3 drafter in speculators' "eagle3" layout (``--to vllm``) and SGLang's (``--to sglang``),
Medusa heads in the ``medusa_num_heads`` layout vLLM loads (``--to medusa``).

What was written is reloaded and run through transformers' own Llama decoder layer and RMS
norms, wired as speculators wires them (embedding norm, fusion_fc over [embedding ; hidden],
the layer, the norm before the output head): it must give the drafter's own features. Medusa's
files are reloaded and run as vLLM's Medusa model runs them (residual block, shared output head,
token map): they must give the heads' own logits. EAGLE-3's files are reloaded and run through
transformers' Llama attention, MLP and norms wired as EAGLE-3 wires them (fc over the taps,
[embedding ; hidden] into q/k/v, the unnormed residual, the draft vocabulary mapped by d2t): they
must give the drafter's own features and guesses.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft.errors import ParameterError
from specdraft.heads.eagle import Eagle3Head, EagleConfig, EagleHead, attend
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


TAPS, V3 = (0, 2, 3), 80  # an EAGLE-3 drafter: three taps, 80 of the target's 96 ids


@pytest.fixture
def head3():
    torch.manual_seed(0)
    h = Eagle3Head(EagleConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=16, inner=96, vocab=V3,
                               form="eagle3", taps=TAPS, listed_vocab=True))
    with torch.no_grad():
        for p in h.parameters():
            p.copy_((p + 0.2 * torch.randn(p.shape)).to(torch.bfloat16).float())
        h.vocab_ids.copy_(torch.randperm(96)[:V3].sort().values)
    return h.eval()


def eagle3_reference(tensors: dict, layer_config: dict, prefix: str, aux: torch.Tensor, e: torch.Tensor):
    """EAGLE-3's first step with transformers' modules, from the exported files alone: aux [T, k, H]
    the taps' raw outputs, e [T, H] the next tokens' embeddings -> (normed features [T, H], the
    target ids guessed [T])."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    cfg = LlamaConfig(**layer_config)
    cfg._attn_implementation = "eager"
    w = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    attn = layer.self_attn
    for name in ("q_proj", "k_proj", "v_proj"):  # EAGLE-3's first layer reads [embedding ; hidden]
        setattr(attn, name, torch.nn.Linear(2 * H, getattr(attn, name).out_features, bias=False))
    layer.hidden_norm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
    layer.load_state_dict({k.removeprefix(prefix): v for k, v in w.items() if k.startswith(prefix)})
    norm = LlamaRMSNorm(H, eps=cfg.rms_norm_eps)
    norm.weight.data.copy_(w["norm.weight"])
    g = aux.flatten(-2) @ w["fc.weight"].T  # [T, H]
    positions = torch.arange(T)[None]
    cos, sin = LlamaRotaryEmbedding(cfg)(g[None], positions)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        z = torch.cat([layer.input_layernorm(e), layer.hidden_norm(g)], -1)
        h = g + attn(z[None], position_embeddings=(cos, sin), attention_mask=mask)[0][0]
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        feats = norm(h)
        draft = (feats @ w["lm_head.weight"].T).argmax(-1)
    return feats, draft + w["d2t"][draft]


@pytest.mark.parametrize("to", ["vllm", "sglang"])
def test_eagle3_export_reloads_and_computes_the_same_features(head3, to, tmp_path):
    lm = torch.randn(96, H).to(torch.bfloat16).float()  # the target's output head [V, H]
    files = export(head3, tmp_path / to, to, "Qwen/Qwen2.5-Coder-1.5B-Instruct", VERIFIER, lm[head3.vocab_ids])
    assert [p.name for p in files] == ["config.json", "model.safetensors"]
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in files)  # readable by the engine's user
    config = json.loads((tmp_path / to / "config.json").read_text())
    if to == "vllm":
        assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
        assert config["norm_before_residual"] is False and config["target_hidden_size"] == H
        assert config["eagle_aux_hidden_state_layer_ids"] == [t + 1 for t in TAPS]
        spec = config["speculators_config"]
        assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
        assert spec["proposal_methods"][0]["proposal_type"] == "greedy"
        assert spec["proposal_methods"][0]["speculative_tokens"] >= 1
        assert spec["verifier"] == {"name_or_path": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
                                    "architectures": ["Qwen2ForCausalLM"]}
        layer, prefix = config["transformer_layer_config"], "layers.0."
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["target_hidden_size"] == H
        assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": list(TAPS), "use_aux_hidden_state": True}
        layer, prefix = config, "midlayer."
    assert config["draft_vocab_size"] == V3 and layer["num_hidden_layers"] == 1 and layer["model_type"] == "llama"
    assert (layer["hidden_size"], layer["intermediate_size"], layer["num_attention_heads"],
            layer["num_key_value_heads"], layer["head_dim"], layer["vocab_size"]) == (H, 96, 4, 2, 16, 96)
    tensors = load_file(str(tmp_path / to / "model.safetensors"))
    names = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
             *(prefix + n for n in ("input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
                                    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                    "mlp.down_proj.weight"))}
    assert set(tensors) == names
    assert tensors["fc.weight"].shape == (H, len(TAPS) * H) and tensors[prefix + "self_attn.q_proj.weight"].shape == (64, 2 * H)
    assert tensors["lm_head.weight"].shape == (V3, H) and tensors["d2t"].dtype == torch.int64
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].shape == (96,) and int(tensors["t2d"].sum()) == V3
    assert torch.equal(torch.arange(V3) + tensors["d2t"], head3.vocab_ids)
    assert torch.equal(tensors["t2d"].nonzero()[:, 0], head3.vocab_ids)
    g = torch.Generator().manual_seed(1)
    aux, e = 5 * torch.randn(T, len(TAPS), H, generator=g), torch.randn(T, H, generator=g)
    feats, guessed = eagle3_reference(tensors, layer, prefix, aux, e)
    with torch.no_grad():
        x = head3.inputs(head3.entry(None, aux), e)
        cos, sin = head3.rope_tables(torch.arange(T))
        q, k, v = head3.project(x, cos, sin)
        want = head3.readout(head3.finish(x, attend(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())))
    torch.testing.assert_close(feats, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(guessed, head3.vocab_ids[(want @ lm[head3.vocab_ids].T).argmax(-1)])


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
        export(head, tmp_path, "tensorrt", "x", VERIFIER)
    with pytest.raises(ParameterError, match="--to sglang writes EAGLE-3 drafters"):
        export(head, tmp_path, "sglang", "x", VERIFIER)
    with pytest.raises(ParameterError, match="--to medusa writes medusa drafters"):
        export(head, tmp_path, "medusa", "x", VERIFIER)
    from specdraft.heads.eagle import EagleMLPHead

    on_head = EagleMLPHead(EagleConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, inner=16, vocab=96,
                                       form="head"))
    with pytest.raises(ParameterError, match="'head' form"):
        export(on_head, tmp_path, "vllm", "x", VERIFIER)
    head3 = Eagle3Head(EagleConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=16, inner=16, vocab=4,
                                   form="eagle3", taps=(0,), listed_vocab=True))
    head3.vocab_ids.copy_(torch.tensor([3, 1, 5, 7]))
    with pytest.raises(ParameterError, match="ascending order"):
        export(head3, tmp_path / "out", "sglang", "x", VERIFIER, torch.zeros(4, H))
    head3.vocab_ids.copy_(torch.tensor([3, 5, 7, 96]))
    with pytest.raises(ParameterError, match="past the target's 96 ids"):
        export(head3, tmp_path / "out", "vllm", "x", VERIFIER, torch.zeros(4, H))
    assert not any(tmp_path.iterdir())  # nothing written
