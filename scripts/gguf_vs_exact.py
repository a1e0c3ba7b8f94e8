"""How far our gguf forward and llama.cpp's are from the GGUF file's exact model: the logits of one
chat prompt from specdraft (weight format gguf: 8-bit activations), from llama.cpp (llama-cpp-python,
the same file) and from transformers with the file's weights dequantized to fp32 (no activation
rounding), compared row by row.

    python scripts/gguf_vs_exact.py [MODEL] [--prompt TEXT | --prompt-file F] [--no-rope-factors]

MODEL: a packaged name or a .gguf file (default: the default target). Needs llama-cpp-python.
--no-rope-factors: our RoPE tables without a Llama 3.1+ file's rope_freqs divisors, as the
converted copy had them before it kept them (transformers' exact model never has them).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch


def compare(name: str, logits: torch.Tensor, exact: torch.Tensor, other: str = "exact") -> None:
    d = (logits - exact).abs()
    cos = torch.nn.functional.cosine_similarity(logits, exact, dim=-1)
    top = (logits.argmax(-1) == exact.argmax(-1)).float().mean()
    print(f"  {name} vs {other}: |diff| mean {d.mean():.4f} max {d.max():.3f}; cosine mean {cos.mean():.4f} min {cos.min():.5f}; "
          f"top-1 agreement {top:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prompt-file", type=Path, help="the prompt's text from a file")
    ap.add_argument("--no-rope-factors", action="store_true")
    ap.add_argument("--prompt", default="What is the capital of France? Answer in one sentence, then name three "
                                        "famous landmarks there.")
    args = ap.parse_args()
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    from specdraft.models.packaged import gguf_file
    from specdraft.pipeline import load_model

    path = gguf_file(args.model)
    lm = load_model(args.model, dtype="auto", weight_format="gguf", max_length=2048)
    prompt = args.prompt_file.read_text() if args.prompt_file else args.prompt
    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if args.no_rope_factors:
        from transformers import AutoConfig

        from specdraft.models.llama import rope_tables, signed_sin

        config = AutoConfig.from_pretrained(lm.path)
        config.rope_freq_factors = None
        cos, sin = rope_tables(config, lm.model.max_length)
        lm.model.cos, lm.model.sin = cos.to(lm.model.cos.dtype), signed_sin(sin).to(lm.model.sin.dtype)
    ours = lm.model.forward(torch.tensor(ids)).logits.float()
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    theirs = torch.tensor(np.array(llm.scores[:len(ids)]), dtype=torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        exact = hf(torch.tensor([ids])).logits[0].float()
    print(f"{path.name}: {len(ids)} prompt tokens; exact logits' std {float(exact.std()):.2f}")
    compare("specdraft gguf", ours, exact)
    compare("llama.cpp", theirs, exact)
    compare("specdraft gguf", ours, theirs, "llama.cpp")


if __name__ == "__main__":
    main()
