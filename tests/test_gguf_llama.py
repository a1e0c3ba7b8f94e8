"""A Llama-family GGUF through the gguf weight format. llama.cpp's converter stores a "llama" file's
q / k rows permuted (each head's two rope halves interleaved, for GGML's rope); the pack must put
them back in Hugging Face's order, or every attention score is wrong. Here a tiny Llama's GGUF is
written the way the converter writes one (its permutation, applied to the quantized rows: rows are
independent), and the native forward over it must match the dense forward of the same weights.
Also: a Llama 3.1+ file's rope_freqs kept through conversion, converted copies of an older format
redone for Llama only, and a whole tiny Llama GGUF (tokenizer and all) through the CLI."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_gguf_kernels import ops, random_blocks  # noqa: F401  (ops: the fixture that skips without kernels)

from _tiny import save
from specdraft.models import gguf_weights
from specdraft.models.gguf_weights import GGUFTensors
from specdraft.models.llama import LlamaModel

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

H, INNER, HEADS, KV_HEADS, LAYERS, VOCAB = 256, 512, 4, 2, 2, 96
HD = H // HEADS
# HF projection -> (GGUF name, kind, rows, heads its rows hold when the converter permutes them)
PROJ = {"self_attn.q_proj": ("attn_q", "Q4_K", H, HEADS), "self_attn.k_proj": ("attn_k", "Q4_K", KV_HEADS * HD, KV_HEADS),
        "self_attn.v_proj": ("attn_v", "Q6_K", KV_HEADS * HD, None), "self_attn.o_proj": ("attn_output", "Q4_K", H, None),
        "mlp.gate_proj": ("ffn_gate", "Q4_K", INNER, None), "mlp.up_proj": ("ffn_up", "Q4_K", INNER, None),
        "mlp.down_proj": ("ffn_down", "Q6_K", H, None)}
# fp16 super-block scales giving weights of ~0.05, as in a trained model (Q6_K's int8 scales are larger)
SCALES = {"Q4_K": (1e-4, 3e-4), "Q6_K": (5e-6, 1.5e-5)}


def converter_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's LlamaModel.permute, written as it is there: [out, ...] rows in
    HF order -> the order a "llama" GGUF stores."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


@pytest.fixture(scope="module")
def llama_dir_and_blocks(tmp_path_factory):
    """A tiny Llama (GQA, untied) whose projections are random Q4_K / Q6_K blocks, saved dense (their
    dequantized values) as a HF directory, and the blocks in HF row order by GGUF name."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=INNER, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    blocks, seed = {}, 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape))
            elif "layers" not in name:
                p.copy_(0.5 * torch.randn(p.shape))  # embeddings and output head: dense, from the HF dir
        for i in range(LAYERS):
            for hf, (gname, kind, rows, _) in PROJ.items():
                seed += 1
                b = random_blocks(kind, rows, model.get_parameter(f"model.layers.{i}.{hf}.weight").shape[1], seed,
                                  scale=SCALES[kind])
                w = dequantize(b, getattr(gguf.GGMLQuantizationType, kind)).reshape(rows, -1)
                model.get_parameter(f"model.layers.{i}.{hf}.weight").copy_(torch.from_numpy(w.astype(np.float32)))
                blocks[f"blk.{i}.{gname}.weight"] = (kind, b)
    return save(model, tmp_path_factory.mktemp("llama") / "hf"), blocks


def write_gguf(path, arch: str, blocks: dict) -> None:
    """The projections as llama.cpp's converter writes them for ``arch``: q / k permuted for llama."""
    heads = {f"blk.{i}.{g}.weight": h for i in range(LAYERS) for g, _, _, h in PROJ.values() if h}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    for name, (kind, b) in blocks.items():
        if arch == "llama" and name in heads:
            b = converter_permute(b, heads[name])
        w.add_tensor(name, b, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def logits_agreement(directory, path) -> float:
    """The least cosine similarity of a row of gguf and dense logits over a 12-token prompt."""
    ids = torch.tensor([5, 17, 3, 88, 42, 42, 7, 60, 11, 2, 95, 30])
    dense = LlamaModel.from_dir(directory, dtype=torch.float32, max_length=64).forward(ids).logits
    native = LlamaModel.from_dir(directory, dtype=torch.float32, max_length=64, weight_format="gguf",
                                 gguf=GGUFTensors(path, progress=False)).forward(ids).logits
    return float(torch.nn.functional.cosine_similarity(native, dense, dim=-1).min())


def test_llama_gguf_rows_come_back_in_hf_order(ops, llama_dir_and_blocks, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gguf_weights, "cache_root", lambda: tmp_path / "cache")
    directory, blocks = llama_dir_and_blocks
    write_gguf(tmp_path / "tiny-llama.gguf", "llama", blocks)
    t = GGUFTensors(tmp_path / "tiny-llama.gguf", progress=False)
    for i in range(LAYERS):  # the packed records are those of the HF-order blocks, bit for bit
        for hf, (gname, kind, _, _) in PROJ.items():
            unpack = gguf_weights.unpack_q4k if kind == "Q4_K" else gguf_weights.unpack_q6k
            assert torch.equal(t.get(f"model.layers.{i}.{hf}.weight").w, unpack(blocks[f"blk.{i}.{gname}.weight"][1]))
    # the whole forward: only the activations' 8-bit steps apart from the dense weights' forward
    # (0.998 here; the rows left as the file has them give 0.31, next test)
    assert logits_agreement(directory, tmp_path / "tiny-llama.gguf") > 0.99


def test_the_check_sees_unrestored_rows(ops, llama_dir_and_blocks, tmp_path, monkeypatch):  # noqa: F811
    """The same permuted rows read as a qwen2 file (no permutation undone) give other logits: the
    forward check above fails when the rows are not put back."""
    monkeypatch.setattr(gguf_weights, "cache_root", lambda: tmp_path / "cache")
    directory, blocks = llama_dir_and_blocks
    path = tmp_path / "as-qwen2.gguf"
    write_gguf(path, "llama", blocks)
    raw = path.read_bytes().replace(b"llama", b"qwen2")  # same length: the header's strings keep their sizes
    path.write_bytes(raw)
    assert logits_agreement(directory, path) < 0.99


def test_llama_gguf_without_head_count_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_weights, "cache_root", lambda: tmp_path / "cache")
    path = tmp_path / "no-heads.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.attn_q.weight", random_blocks("Q4_K", 8, 256, 0), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(gguf_weights.ModelFileError, match="head_count"):
        GGUFTensors(path, progress=False)


def test_rope_freqs_of_a_gguf_are_read_and_divide_the_frequencies(tmp_path):
    """Llama 3.1+ files carry their RoPE scaling as llama.cpp's per-frequency divisors (rope_freqs);
    transformers' GGUF loader drops them, the converted copy keeps them for the native tables."""
    from transformers import LlamaConfig

    from specdraft.models.convert import rope_freq_factors
    from specdraft.models.llama import rope_tables

    factors = np.linspace(1.0, 8.0, HD // 2).astype(np.float32)
    with_freqs, without = tmp_path / "freqs.gguf", tmp_path / "plain.gguf"
    for path, extra in ((with_freqs, True), (without, False)):
        w = gguf.GGUFWriter(str(path), "llama")
        if extra:
            w.add_tensor("rope_freqs.weight", factors)
        w.add_tensor("blk.0.attn_norm.weight", np.ones(H, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    assert rope_freq_factors(with_freqs) == factors.tolist() and rope_freq_factors(without) is None

    cfg = LlamaConfig(hidden_size=H, num_attention_heads=HEADS, rope_theta=10000.0)
    cos, sin = rope_tables(cfg, 64)
    cfg.rope_freq_factors = factors.tolist()
    cos_f, sin_f = rope_tables(cfg, 64)
    inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float) / HD)) / torch.from_numpy(factors)
    angle = torch.outer(torch.arange(64, dtype=torch.float), inv)
    assert torch.allclose(cos_f, torch.cat([angle, angle], -1).cos(), atol=1e-6)
    assert torch.allclose(sin_f, torch.cat([angle, angle], -1).sin(), atol=1e-6)
    assert torch.equal(cos[:, 0], cos_f[:, 0])  # factor 1: the first frequency as without factors
    assert not torch.allclose(cos, cos_f)


@pytest.mark.parametrize(("fmt", "model_type", "kept"), [(2, "llama", True), (1, "qwen2", True), (1, "llama", False),
                                                          (1, "mistral", False), (0, "qwen2", False)])
def test_copies_converted_before_rope_factors_are_redone_for_llama_only(tmp_path, fmt, model_type, kept):
    import json

    from specdraft.models import convert

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / convert.MARKER).write_text(json.dumps({"format": fmt, "sha256": "s"}))
    assert convert.is_converted(tmp_path) is kept


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes: a byte-level BPE vocabulary's first tokens."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b if b in keep else next(extra)) for b in range(256)]


@pytest.fixture(scope="module")
def llama_gguf_file(tmp_path_factory):
    """A whole tiny "llama" GGUF as llama.cpp's converter writes one: metadata, a byte-level BPE
    tokenizer, F32 embeddings / norms / output head, Q4_K / Q6_K projections with q / k permuted,
    and Llama 3.1-style rope_freqs; returns (path, the rope factors)."""
    tokens = [*byte_level_alphabet(), "Ġt", "he", "<|endoftext|>"]
    vocab, factors = len(tokens), np.linspace(1.0, 4.0, HD // 2).astype(np.float32)
    path = tmp_path_factory.mktemp("llama-file") / "tiny-llama.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(INNER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HD)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - 1) + [3])
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 1)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", (0.5 * rng.standard_normal((vocab, H))).astype(np.float32))
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    w.add_tensor("output.weight", (0.05 * rng.standard_normal((vocab, H))).astype(np.float32))
    w.add_tensor("rope_freqs.weight", factors)
    heads = {g: h for g, _, _, h in PROJ.values() if h}
    for i in range(LAYERS):
        for seed, (gname, kind, rows, _) in enumerate(PROJ.values()):
            b = random_blocks(kind, rows, INNER if gname == "ffn_down" else H, 10 * i + seed, scale=SCALES[kind])
            if gname in heads:
                b = converter_permute(b, heads[gname])
            w.add_tensor(f"blk.{i}.{gname}.weight", b, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, factors


def test_a_llama_gguf_file_runs_end_to_end(ops, llama_gguf_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The file through the whole load (conversion, pack, runtime choice) and the CLI: it runs on
    the GGUF kernels, keeps its RoPE divisors, and computes what its dense copy computes (the copy
    un-permuted by transformers, the pack by us: a wrong order on either side would part them)."""
    from transformers import AutoConfig

    from specdraft import pipeline
    from specdraft.cli import main
    from specdraft.models import hugepages, packaged
    from specdraft.pipeline import load_model

    path, factors = llama_gguf_file
    for module in (gguf_weights, packaged):  # the converted copy and the pack in a fresh place; the kernels stay
        monkeypatch.setattr(module, "cache_root", lambda: tmp_path / "cache")
    native = load_model(str(path), dtype="auto", weight_format="auto", max_length=64)
    assert native.model.weight_format == "gguf"
    assert not packaged.has_weights(native.path)  # the config and tokenizer alone: the numbers are the GGUF's
    # once packed, a load starts reading the pack before the config and tokenizer (a thread of its
    # own, where huge pages are on) and leaves no read behind
    order = []
    start = gguf_weights.start_read
    monkeypatch.setattr(gguf_weights, "start_read", lambda *a: order.append("read") or start(*a))
    config = pipeline.load_config
    monkeypatch.setattr(pipeline, "load_config", lambda p: order.append("config") or config(p))
    again = load_model(str(path), dtype="auto", weight_format="auto", max_length=64)
    assert order == ["read", "config"] and not hugepages._reads
    assert AutoConfig.from_pretrained(native.path).rope_freq_factors == pytest.approx(factors.tolist())
    dense = load_model(str(path), dtype="fp32", weight_format="dense", max_length=64)
    assert packaged.has_weights(dense.path)  # a format that reads the weights: the full copy, made now
    ids = torch.tensor(native.tokenizer("the tether that the thin ten tie")["input_ids"])
    a, b = native.model.forward(ids).logits, dense.model.forward(ids).logits
    assert torch.equal(again.model.forward(ids).logits, a)  # the records read early are the same
    beside = load_model(str(path), dtype="auto", weight_format="auto", max_length=64)
    assert beside.path == dense.path  # the full copy serves the gguf format too, and changes no number
    assert torch.equal(beside.model.forward(ids).logits, a)
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min()) > 0.99
    assert main(["generate", "--target", str(path), "--method", "suffix", "--max-new-tokens", "6", "--no-chat",
                 "--color", "never", "the tether"]) == 0


def test_a_conversion_parses_the_gguf_once_and_writes_what_separate_parses_write(llama_gguf_file, tmp_path, monkeypatch):
    """transformers reads the GGUF for the config, the weights and the tokenizer; convert_gguf
    hands them (and the RoPE divisors' read) one reader, and the copy is the one separate readers
    make, byte for byte."""
    from contextlib import nullcontext

    from specdraft.models import convert

    path, _ = llama_gguf_file
    built = []
    real = gguf.GGUFReader.__init__

    def counted(self, path, *args, **kwargs):
        built.append(path)
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counted)
    shared = convert.convert_gguf(path, tmp_path / "shared", progress=False, sha256="x")
    assert len(built) == 1
    monkeypatch.setattr(convert, "_one_reader", nullcontext)
    separate = convert.convert_gguf(path, tmp_path / "separate", progress=False, sha256="x")
    assert len(built) > 2  # config, weights, tokenizer, RoPE divisors: each its own
    for name in ("model.safetensors", "config.json", "tokenizer.json", convert.MARKER):
        assert (shared / name).read_bytes() == (separate / name).read_bytes(), name
    # without weights (the gguf format's copy): the same config, generation config and tokenizer
    light = convert.convert_gguf(path, tmp_path / "light", progress=False, sha256="x", weights=False)
    assert not list(light.glob("*.safetensors")) and convert.read_marker(light)["weights"] == convert.GGUF_ONLY
    files = sorted(p.name for p in light.iterdir())
    assert files == sorted(p.name for p in shared.iterdir() if p.name != "model.safetensors")
    for name in files:
        if name != convert.MARKER:
            assert (light / name).read_bytes() == (shared / name).read_bytes(), name


def test_models_prepare_makes_what_a_load_reads(llama_gguf_file, tmp_path, monkeypatch, capsys):
    """`specdraft models prepare FILE.gguf`: the copy without weights, the pack and the dense file,
    so a load after it converts nothing; no bf16 copy of the weights."""
    from specdraft.cli import main
    from specdraft.models import packaged

    path, _ = llama_gguf_file
    for module in (gguf_weights, packaged):
        monkeypatch.setattr(module, "cache_root", lambda: tmp_path / "cache")
    assert main(["models", "prepare", str(path)]) == 0
    light = Path(capsys.readouterr().out.split(": ", 1)[1].strip())
    assert light.parent == tmp_path / "cache" / "light" and not packaged.has_weights(light)
    assert list((tmp_path / "cache" / "packed").glob("*.safetensors"))
    assert list((tmp_path / "cache" / "packed" / "dense").glob("*.safetensors"))
    assert not (tmp_path / "cache" / "models").exists()


def test_the_transformers_peers_read_the_full_copy(ops, llama_gguf_file, tmp_path, monkeypatch):  # noqa: F811
    """The bench's transformers peers load the target's weights: where our target runs from the
    copy without weights, the full copy is made for them, and the peer answers from it."""
    from types import SimpleNamespace

    from specdraft.bench.runners import peer_setup
    from specdraft.models import packaged
    from specdraft.pipeline import Speculator

    path, _ = llama_gguf_file
    for module in (gguf_weights, packaged):
        monkeypatch.setattr(module, "cache_root", lambda: tmp_path / "cache")
    sd = Speculator(str(path), dtype="auto", max_length=64, load_draft=False, progress=False)
    assert not packaged.has_weights(sd.target.path)
    setup = peer_setup(SimpleNamespace(hf_dtype_plain="fp32", ignore_eos=True), ["hf-generate"], sd)
    assert packaged.has_weights(setup.target_path) and setup.target_path.parent == tmp_path / "cache" / "models"
    ids = sd.tokenizer("the tether")["input_ids"]
    assert len(setup.runner("hf-generate")(ids, 4).token_ids) == 4


def test_the_dense_file_puts_a_llama_file_s_q_k_numbers_back_in_hf_order(tmp_path, monkeypatch):
    """A "llama" GGUF's q / k biases (and q / k matrices without records) are stored permuted as
    the converter permutes rows; the dense file has them in Hugging Face's order, v's untouched."""
    monkeypatch.setattr(gguf_weights, "cache_root", lambda: tmp_path / "cache")
    rng = np.random.default_rng(3)
    q_bias, k_bias, v_bias = (rng.standard_normal(n).astype(np.float32) for n in (H, H // HEADS * KV_HEADS,
                                                                                   H // HEADS * KV_HEADS))
    q8 = rng.standard_normal((H, H)).astype(np.float32)
    path = tmp_path / "tiny-llama-bias.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_tensor("blk.0.attn_q.bias", converter_permute(q_bias, HEADS))
    w.add_tensor("blk.0.attn_k.bias", converter_permute(k_bias, KV_HEADS))
    w.add_tensor("blk.0.attn_v.bias", v_bias)
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(converter_permute(q8, HEADS), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from safetensors.torch import load_file

    got = load_file(str(GGUFTensors(path, progress=False).dense_file()))
    a = "model.layers.0.self_attn."
    for name, want in (("q_proj.bias", q_bias), ("k_proj.bias", k_bias), ("v_proj.bias", v_bias)):
        assert torch.equal(got[a + name], torch.from_numpy(want).to(torch.bfloat16)), name
    want_q = gguf.quants.dequantize(gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(got[a + "q_proj.weight"], torch.from_numpy(want_q).to(torch.bfloat16))
