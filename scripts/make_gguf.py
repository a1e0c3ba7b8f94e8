"""Q4_K_M GGUF files of other architectures than the default target's, made on this machine, for
the gguf weight format's end-to-end checks against llama.cpp on the same file.

Default: a Llama-architecture file that speaks, made from the packaged SmolLM2-135M
(a "llama" model whose widths, 576, are not multiples of 256, so a K-quant file of it has no Q4_K
projections): its widths padded to 768 with zeros, the same function, then written by llama.cpp's
own converter and quantizer. It exercises the gguf weight format on a "llama" file (q / k rows
permuted by the converter) end to end, with real text, against llama.cpp on the same file.

    python scripts/make_gguf.py OUT_DIR --converter PATH/convert_hf_to_gguf.py [--llama3-rope N]
    python scripts/make_gguf.py OUT_DIR --converter ... --random qwen3

--random qwen3: a random 4-layer Qwen3 (q / k norms; hidden 256, 4 heads of 128) with the default
target's tokenizer; its text is noise, its logits still comparable with llama.cpp's.
--random llama --shape llama-3.2-1b: a random model of Llama 3.2 1B's shapes (16 layers, hidden
2048, 32 heads of 64 over 8 key/value heads, MLP 8192, tied embeddings) with the default target's
tokenizer (151,936 ids against Llama 3's 128,256): for timing the forward of a common Llama.

--llama3-rope N gives the model Llama 3.1's RoPE scaling ("llama3": factor 8, low / high frequency
factors 1 / 4) with N as its original context, which llama.cpp's converter writes as the file's
rope_freqs tensor; a small N makes it bite at short positions (the model then speaks less well).

The converter is in llama.cpp's sources (llama-cpp-python's sdist has it under vendor/llama.cpp;
pass its gguf-py on PYTHONPATH if the installed gguf is older; it reads Llama tokenizers with
`sentencepiece` installed); the quantizer is llama-cpp-python's llama_model_quantize. Writes
OUT_DIR/hf (the model in HF form), OUT_DIR/NAME-f16.gguf and OUT_DIR/NAME-q4_k_m.gguf, NAME
"padded" or the --random architecture.

Padding keeps the function: hidden 576 -> 768 and 9 query heads -> 12 (3 per key/value head -> 4;
each group's fourth head has zero query and zero output columns, so what it attends to is never
added), every new width zero in the embeddings and in each projection's rows or columns, so the
residual stream is zero there; RMSNorm then divides by a mean over 768 widths instead of 576, so
the norm weights take a factor sqrt(576 / 768) and eps 576 / 768 of itself.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import torch

WIDTH = 768


def pad_model(src: Path, out: Path, llama3_rope: int | None = None) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    H, hd, nh, nkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    per = nh // nkv
    new_nh = WIDTH // hd
    new_per = new_nh // nkv
    assert new_per * nkv == new_nh and new_per >= per
    # new query head of each old one: group g's heads first, the group's padding heads after
    heads = torch.tensor([(h // per) * new_per + h % per for h in range(nh)])
    rows = (heads[:, None] * hd + torch.arange(hd)).reshape(-1)  # [nh * hd] new q rows / o columns
    norm = (H / WIDTH) ** 0.5

    def pad_in(w):  # [out, H] -> [out, WIDTH]
        return torch.cat([w, w.new_zeros(w.shape[0], WIDTH - H)], 1)

    new = {}
    for name, w in model.state_dict().items():
        if name.endswith("norm.weight"):
            w = torch.cat([w * norm, w.new_zeros(WIDTH - H)])
        elif "embed_tokens" in name or name == "lm_head.weight":
            w = pad_in(w)
        elif "q_proj" in name:
            q = w.new_zeros(new_nh * hd, WIDTH)
            q[rows] = pad_in(w)
            w = q
        elif "k_proj" in name or "v_proj" in name or "gate_proj" in name or "up_proj" in name:
            w = pad_in(w)
        elif "o_proj" in name:
            o = w.new_zeros(WIDTH, new_nh * hd)
            o[:H, rows] = w
            w = o
        elif "down_proj" in name:
            w = torch.cat([w, w.new_zeros(WIDTH - H, w.shape[1])])
        new[name] = w
    cfg.hidden_size, cfg.num_attention_heads, cfg.rms_norm_eps = WIDTH, new_nh, cfg.rms_norm_eps * H / WIDTH
    padded = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    padded.load_state_dict(new, strict=False)  # a tied lm_head comes with the embeddings
    check_same_function(model, padded)
    if llama3_rope:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        padded.config.rope_parameters = {"rope_type": "llama3", "rope_theta": theta, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": llama3_rope}
    padded.to(torch.bfloat16).save_pretrained(out)  # the source's own precision
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, out / f)


SHAPES = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=128, tie_word_embeddings=False),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, rope_theta=500000.0),
}


def random_model(arch: str, out: Path, shape: str = "tiny") -> None:
    """A random model of ``arch`` and ``shape`` (widths multiples of 256), with the default target's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdraft.models.packaged import resolve_model_dir

    tok = Path(resolve_model_dir("qwen2.5-coder-1.5b"))
    base = AutoConfig.from_pretrained(tok)
    cfg = AutoConfig.for_model(arch, vocab_size=base.vocab_size, max_position_embeddings=4096, rms_norm_eps=1e-6,
                               bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id, **SHAPES[shape])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape) if "norm" in name else 0.05 * torch.randn(p.shape))
    model.to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (tok / f).exists():
            shutil.copy(tok / f, out / f)


def check_same_function(model, padded) -> None:
    ids = torch.tensor([[1, 504, 3458, 314, 260, 1345, 30, 2743, 28, 1023, 4710, 2]])
    with torch.no_grad():
        a, b = model(ids).logits[0], padded(ids).logits[0]
    print(f"padded vs original logits: max |diff| {float((a - b).abs().max()):.3g} "
          f"(logits' std {float(a.std()):.3g}), argmax agree {float((a.argmax(-1) == b.argmax(-1)).float().mean()):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--converter", type=Path, required=True, help="llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument("--source", default="smollm2-135m", help="packaged Llama-family model to pad")
    ap.add_argument("--llama3-rope", type=int, metavar="N", help="Llama 3.1 RoPE scaling, original context N")
    ap.add_argument("--random", metavar="ARCH", help="a random model of this transformers model type instead")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="--random's sizes")
    args = ap.parse_args()
    from specdraft.models.packaged import resolve_model_dir

    stem = args.random or "padded"
    hf, f16, q4 = args.out / "hf", args.out / f"{stem}-f16.gguf", args.out / f"{stem}-q4_k_m.gguf"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.random:
        random_model(args.random, hf, args.shape)
    else:
        pad_model(Path(resolve_model_dir(args.source)), hf, args.llama3_rope)
    subprocess.run([sys.executable, str(args.converter), str(hf), "--outtype", "f16", "--outfile", str(f16)], check=True)
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    if llama_cpp.llama_model_quantize(str(f16).encode(), str(q4).encode(), params) != 0:
        sys.exit("llama_model_quantize failed")
    print(f"wrote {q4}")


if __name__ == "__main__":
    main()
