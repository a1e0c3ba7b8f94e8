"""Methods with and without lookup after a guess (drafters.extend), interleaved per prompt:
python scripts/extend_ab.py [--methods fusion,hybrid-head] [--per-category N] [--max-new-tokens 128]
    [--temperature T --seed S]

Each dev prompt runs `none`, then every method with --extend and --no-extend, in one process
(the suffix history cleared before each run, as the bench does), greedy unless --temperature;
prints per prompt the tokens a target forward, and overall tokens/s, speedup against `none`
(tokens/s against tokens/s), tokens a forward and exact matches against `none` (greedy only).
"""
from __future__ import annotations

import argparse
import time

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters.suffix import HISTORY
from specdraft.pipeline import Speculator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--methods", default="fusion,hybrid-head")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1, help="sampling: every run of a prompt starts from this seed")
    args = p.parse_args()
    sampling = SamplingConfig(temperature=args.temperature, seed=args.seed if args.temperature > 0 else None)
    sd = Speculator(load_draft=False, progress=False)
    runs = {"none": SpecConfig(method="none")}
    for m in args.methods.split(","):
        runs[m] = SpecConfig(method=m)
        runs[m + " --no-extend"] = SpecConfig(method=m, extend=False)
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    sd.generate("Hello", spec=runs["none"], gen=GenerationConfig(max_new_tokens=4))  # warm up
    total = {name: [0.0, 0, 0, 0] for name in runs}  # seconds, tokens, forwards, exact
    prompts = select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=args.per_category)
    for q in prompts:
        line, plain = [], None
        for name, spec in runs.items():
            HISTORY.clear()
            t0 = time.perf_counter()
            r = sd.generate(q.text, spec=spec, gen=gen, sampling=sampling)
            seconds = time.perf_counter() - t0
            plain = r.token_ids if plain is None else plain
            t = total[name]
            t[0] += seconds
            t[1] += len(r.token_ids)
            t[2] += r.stats.target_forwards
            t[3] += r.token_ids == plain and sampling.greedy
            line.append(f"{name} {len(r.token_ids) / r.stats.target_forwards:.2f}")
        print(f"{q.category:15} " + " | ".join(line), flush=True)
    base = total["none"]
    for name, (seconds, tokens, forwards, exact) in total.items():
        exactness = f"exact {exact}/{len(prompts)}" if sampling.greedy else "sampled"
        print(f"{name:26} {tokens / seconds:6.2f} tok/s {base[0] / seconds * tokens / base[1]:.3f}x none "
              f"{tokens / forwards:.2f} tokens/forward {exactness}")


if __name__ == "__main__":
    main()
