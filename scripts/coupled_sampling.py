"""Would Gumbel-coupled sampling make a drafting head's guesses pass more often than today's rule?

Today, sampled, a head's guess x (its most likely id) is verified one-hot: it passes with p(x), the
target's probability. Coupled sampling (drafter-invariant speculative decoding) draws each
position's token as argmax(log p + G) with Gumbel noise G fixed by the seed and the position, which
the drafter can compute too: it guesses argmax over its ids of (its logits / T_h + G), and a guess
passes when the two argmaxes agree (lossless: G is fresh for every position). Teacher-forced on the
target's sampled answers to the first N dev prompts (one per category), the shipped MLP head's first
guess at each position (from the row that chose the token before), S noise draws a position:

    python scripts/coupled_sampling.py [--temperature 0.7] [--prompts 6] [--draws 64]

Prints running means: greedy agreement (argmax against argmax), one-hot (today: p of the head's
top 1, of its top 2 as two children), coupled (the head's noisy top 1 / top 2 holds the target's
noisy argmax; T_h = T, and T_h = T / 2).
"""
from __future__ import annotations

import argparse

import torch

from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.pipeline import Speculator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--draws", type=int, default=64)
    args = ap.parse_args()
    T, S = args.temperature, args.draws
    sd = Speculator(progress=False, load_draft=False)
    head = sd._new_drafter(SpecConfig(method="head"))
    taps, ids_of = tuple(head.feature_layers), head.ids  # [V'] the target ids of the head's vocabulary
    prompts = [sd.encode_prompt(p.text) for p in select_prompts(load_prompts(prompts_path(None)), per_category=1)]
    g = torch.Generator().manual_seed(0)
    sums = dict.fromkeys(("greedy", "one-hot 1", "coupled 1", "coupled 1 (T_h = T/2)", "one-hot 2", "coupled 2"), 0.0)
    n = 0
    for pi, ids in enumerate(prompts[:args.prompts]):
        answer = sd.generate(ids, spec=SpecConfig(method="none"), sampling=SamplingConfig(temperature=T, seed=pi),
                             gen=GenerationConfig(max_new_tokens=128)).token_ids
        m = sd.target.model
        m.reset()
        out = m.forward(torch.tensor(ids + answer), need_hidden=True, taps=taps)
        rows = torch.cat([out.taps.flatten(1), out.hidden], -1) if taps else out.hidden
        with torch.inference_mode():
            for i in range(len(answer) - 1):
                r = len(ids) - 1 + i  # row r chose answer[i]; the head guesses answer[i + 1], row r + 1's choice
                hl = head.out(head.step(head.fused(rows[r:r + 1]), head.embed[[answer[i]]].float()))[0]  # [V']
                logp = torch.log_softmax(out.logits[r + 1].float() / T, -1)  # [V]
                top2 = ids_of[hl.topk(2).indices]
                sums["greedy"] += float(top2[0] == out.logits[r + 1].argmax())
                sums["one-hot 1"] += float(logp[top2[0]].exp())
                sums["one-hot 2"] += float(logp[top2].exp().sum())
                G = -torch.log(-torch.log(torch.rand(S, logp.shape[0], generator=g).clamp_min(1e-20)))  # [S, V]
                chosen = (logp[None] + G).argmax(-1)  # [S] the target's coupled draws
                noisy = hl[None] / T + G[:, ids_of]  # [S, V']
                sums["coupled 1"] += float((ids_of[noisy.argmax(-1)] == chosen).float().mean())
                sums["coupled 2"] += float((ids_of[noisy.topk(2, -1).indices] == chosen[:, None]).any(-1).float().mean())
                cooler = hl[None] / (T / 2) + G[:, ids_of]
                sums["coupled 1 (T_h = T/2)"] += float((ids_of[cooler.argmax(-1)] == chosen).float().mean())
                n += 1
        print(f"prompt {pi}, {n} positions: " + ", ".join(f"{k} {v / n:.3f}" for k, v in sums.items()), flush=True)


if __name__ == "__main__":
    main()
