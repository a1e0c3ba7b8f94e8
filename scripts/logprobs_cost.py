"""What asking for log-probabilities costs a generation: one method with and without
``GenerationConfig.logprobs`` (N most likely beside each token), interleaved prompt by prompt (the
order reversed every other prompt, so the machine's phases hit both sides alike):

    python scripts/logprobs_cost.py [--method hybrid-head] [--top 5] [--per-category 1] [--max-new-tokens 128]

Prints each side's decode time (prefill excluded) and the ratio, the time the engine spends on
the log-probabilities themselves (``Engine._scores``, timed where it runs: a steadier figure than
the ratio, which the machine's phases move by a few percent), and checks that both sides generate
the same tokens.
"""
from __future__ import annotations

import argparse
import time

from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.engine import Engine
from specdraft.pipeline import Speculator

SCORES = [0.0, 0]  # seconds in Engine._scores with log-probabilities asked, tokens scored


def _timed_scores():
    scores = Engine._scores

    def timed(logits, tokens, gen):
        t = time.perf_counter()
        got = scores(logits, tokens, gen)
        if gen.logprobs is not None:
            SCORES[0] += time.perf_counter() - t
            SCORES[1] += len(tokens)
        return got

    Engine._scores = staticmethod(timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="hybrid-head")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    _timed_scores()
    sd = Speculator(progress=False, load_draft=args.method in ("draft-model", "hybrid", "fusion"))
    spec = SpecConfig(method=args.method)
    sides = {"off": GenerationConfig(max_new_tokens=args.max_new_tokens),
             "on": GenerationConfig(max_new_tokens=args.max_new_tokens, logprobs=args.top)}
    decode = dict.fromkeys(sides, 0.0)
    tokens = dict.fromkeys(sides, 0)
    prompts = select_prompts(load_prompts(prompts_path(None)), per_category=args.per_category)
    for n, prompt in enumerate(prompts):
        ids = sd.encode_prompt(prompt.text)
        got = {}
        for name in (list(sides) if n % 2 == 0 else list(sides)[::-1]):
            r = sd.generate(ids, spec=spec, gen=sides[name])
            decode[name] += r.stats.time_total - r.stats.time_prefill
            tokens[name] += len(r.token_ids)
            got[name] = r.token_ids
        assert got["on"] == got["off"], f"prompt {n}: the tokens differ"
    for name in sides:
        print(f"{name:4s} {tokens[name]} tokens, decode {decode[name]:.2f} s ({tokens[name] / decode[name]:.2f} tok/s)")
    print(f"logprobs (top {args.top}) / without: {decode['on'] / decode['off']:.3f}x decode time, "
          f"{len(prompts)} prompts, method {args.method}; the same tokens")
    print(f"in the engine: {SCORES[0]:.3f} s for {SCORES[1]} scored tokens, {SCORES[0] / SCORES[1] * 1e3:.3f} ms a token, "
          f"{SCORES[0] / decode['on']:.1%} of the decode time with them")


if __name__ == "__main__":
    main()
