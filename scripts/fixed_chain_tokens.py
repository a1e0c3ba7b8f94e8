"""Tokens per target forward of trained drafters drafting fixed chains, the cost rule off:
python scripts/fixed_chain_tokens.py K DIR|shipped... [--method head|eagle|hydra|mtp|medusa] [--per-category N]

The bench's tokens per forward move with the cost rule, which reads forward times, and these
machines run in phases: the same head gave 1.74 and 1.47 in two bench runs. Chains of K guesses
with the rule off make the count depend on the head alone (greedy, 128 new tokens each, the first
--per-category N dev prompts of each category: 13 by default; 26 with 2 decide differences of ~1%
better), so two drafters compare in one number that repeats exactly.
"""
from __future__ import annotations

import argparse

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.pipeline import Speculator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("k", type=int, help="guesses a chain")
    p.add_argument("drafters", nargs="+", help="drafter directories, or 'shipped'")
    p.add_argument("--method", default="head", choices=("head", "eagle", "hydra", "mtp", "medusa"))
    p.add_argument("--per-category", type=int, default=1)
    args = p.parse_args()
    sd = Speculator(load_draft=False, progress=False)
    prompts = select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=args.per_category)
    for drafter in args.drafters:
        spec = SpecConfig(method=args.method, k=args.k, cost_rule=False, trees=False,
                          **{args.method: None if drafter == "shipped" else drafter})
        tokens = forwards = 0
        for prompt in prompts:
            result = sd.generate(prompt.text, spec=spec, gen=GenerationConfig(max_new_tokens=128))
            tokens += len(result.token_ids)
            forwards += result.stats.target_forwards
        print(f"{drafter}: {args.method}, k {args.k}, {tokens} tokens in {forwards} forwards, {tokens / forwards:.3f} a forward",
              flush=True)


if __name__ == "__main__":
    main()
