"""How often the target's attention makes denormal terms (e^(s - max) * v below FLT_MIN, what Intel
cores take a microcode assist for unless flushed): one decode step after a prompt of this
repository's own source, the 28 layers' q, k, v caught through the Python layer loop, the scores
recomputed in torch.

    python scripts/attention_denormals.py [--model MODEL] [--prompt-tokens 700]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from specdraft.models.packaged import DEFAULT_TARGET
from specdraft.pipeline import load_model

FLT_MIN = 1.17549435e-38


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_TARGET)
    ap.add_argument("--prompt-tokens", type=int, default=700)
    args = ap.parse_args()
    loaded = load_model(args.model, weight_format="gguf", max_length=args.prompt_tokens + 8)
    model, tok = loaded.model, loaded.tokenizer
    text = (Path(__file__).parents[1] / "specdraft" / "engine.py").read_text()[:8000]
    ids = torch.tensor(tok(text + "\nExplain what this code does.")["input_ids"][:args.prompt_tokens])
    model.reset()
    model.forward(ids[:-1], last_only=True)
    real, caught = model._ops, []

    class Catch:  # the kernels, block_attention's inputs recorded
        def __getattr__(self, name):
            return getattr(real, name)

        def block_attention(self, q, k, v, L, mask):
            caught.append((q.clone(), k[:, :L].clone(), v[:, :L].clone()))
            return real.block_attention(q, k, v, L, mask)

    model._ops, model.fused = Catch(), False  # the Python layer loop, which calls block_attention per layer
    try:
        model.forward(ids[-1:])
    finally:
        model._ops, model.fused = real, True
    total = denormal = worst = 0
    for q, k, v in caught:  # q [nh, 1, hd], k / v [nkv, L, hd]
        g = q.shape[0] // k.shape[0]
        s = torch.einsum("htd,hld->htl", q, k.repeat_interleave(g, 0)) / math.sqrt(q.shape[-1])
        d = s - s.max(-1, keepdim=True).values
        worst = min(worst, d.min().item())
        terms = torch.exp(d.clamp(min=-87))[..., None] * v.repeat_interleave(g, 0)[:, None]  # [nh, 1, L, hd]
        total += terms.numel()
        denormal += ((terms.abs() < FLT_MIN) & (terms != 0)).sum().item()
    print(f"{len(caught)} layers, context {ids.numel()}: min(s - max) {worst:.1f}; denormal e * v terms "
          f"{denormal:,} of {total:,} ({denormal / total:.1e})")


if __name__ == "__main__":
    main()
