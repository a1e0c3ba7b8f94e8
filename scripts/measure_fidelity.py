"""How far a weight format moves a model from its dense fp32 weights: the numbers in README.

    python scripts/measure_fidelity.py --model qwen2.5-coder-1.5b --format w8a8

For the first prompt of each of 8 Spec-Bench dev categories, the dense fp32 model generates 48
greedy tokens; both models then score that text teacher-forced. Prints top-1 agreement of the
next-token argmax and the mean KL(dense || format) per position.
"""
import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.pipeline import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--format", default="w8a8")
    ap.add_argument("--prompts", default=str(PACKAGED_PROMPTS))
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    ref = load_model(args.model, dtype="fp32", weight_format="dense", max_length=2048, progress=False)
    q = load_model(args.model, dtype="fp32", weight_format=args.format, max_length=2048, progress=False)
    tok = ref.tokenizer
    prompts = [p.text for p in select_prompts(load_prompts(Path(args.prompts)), per_category=1)]
    agree = total = 0
    kl = 0.0
    for prompt in prompts[:8]:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        m = ref.model
        m.reset()
        nxt = int(m.forward(torch.tensor(ids)).logits[-1].argmax())
        seq = list(ids)
        for _ in range(args.tokens):
            seq.append(nxt)
            nxt = int(m.forward(torch.tensor([nxt]), last_only=True).logits[-1].argmax())
        m.reset()
        lr = m.forward(torch.tensor(seq)).logits[len(ids) - 1:]
        q.model.reset()
        lq = q.model.forward(torch.tensor(seq)).logits[len(ids) - 1:]
        agree += int((lr.argmax(-1) == lq.argmax(-1)).sum())
        total += lr.shape[0]
        kl += float(F.kl_div(lq.log_softmax(-1), lr.log_softmax(-1), log_target=True, reduction="sum"))
    print(f"{args.model} {args.format}: top-1 agreement {agree / total:.4f}, mean KL {kl / total:.5f} "
          f"over {total} positions")


if __name__ == "__main__":
    main()
