"""What a drafter's trees would commit on other CPUs' cost curves: the engine run with a fixed
forward-cost table (the cost rule reads it instead of this machine's timings), on the dev prompts.

    python scripts/tree_budget.py [--method hybrid-head] [--curves avx2,zen5,amx,free] [--per-category 1] [--k K]

The cost rule sizes each tree by the check's cost ratio (cost of T new tokens / one token), so
the same drafter sends small trees where checks are dear and large ones where they are cheap.
Each curve below is a ratio table; the one-token forward is taken as this machine's measured one
(drafting is timed for real and weighed against it). For each curve: tokens per target forward,
nodes a check, and the decode speedup that curve would give (tokens a step over the step's cost
in one-token forwards: the curve's ratio for the rows checked, plus the drafting time), with the
output checked against plain decoding token for token. The curves: avx2 the AVX2 EPYC's with
its 8-row kernels (calibrate at fbdefaa: 1 / 1.11 / 1.25 / 1.61 / 2.76 / 5.25 / 10.45 for 1 / 2 / 3
/ 4 / 8 / 16 / 32 tokens), avx2-old the same CPU's before them (issue 20: 1 / 1.48 / 2.55 / 5.05
for 1 / 2 / 4 / 8), zen5 this Zen 5's with
VNNI kernels (calibrate at ca1b711), amx issue 18's target for AMX (16 tokens 1.3x, linear),
free: every check costs one token (the drafter's own ceiling).
"""
from __future__ import annotations

import argparse

from specdraft.bench.forward_cost import forward_cost, watched_forwards
from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.costs import ForwardCosts
from specdraft.pipeline import Speculator

# ratio of a forward over T new tokens to one token, at measured points (linear in between)
CURVES = {
    "avx2": {1: 1.0, 2: 1.11, 3: 1.25, 4: 1.61, 8: 2.76, 16: 5.25, 32: 10.45, 64: 20.9},
    "avx2-old": {1: 1.0, 2: 1.48, 4: 2.55, 8: 5.05, 16: 10.0, 64: 40.0},
    "zen5": {1: 1.0, 2: 1.03, 4: 1.09, 8: 1.22, 12: 1.51, 16: 1.98, 32: 3.97, 64: 7.94},
    "amx": {1: 1.0, 16: 1.3, 64: 2.26},
    "free": {1: 1.0, 64: 1.0},
}
MAX_ROWS = 64


def ratios(points: dict[int, float]) -> dict[int, float]:
    """The table for 2..MAX_ROWS new tokens, linear between the given points."""
    xs = sorted(points)
    out = {}
    for t in range(2, MAX_ROWS + 1):
        hi = next(x for x in xs if x >= t)
        lo = max(x for x in xs if x <= t)
        out[t] = points[lo] if hi == lo else points[lo] + (points[hi] - points[lo]) * (t - lo) / (hi - lo)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--method", default="hybrid-head")
    p.add_argument("--curves", default="avx2,zen5,amx,free")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=None, help="draft cap (default: the method's, config.draft_cap)")
    args = p.parse_args()
    curves = args.curves.split(",")
    unknown = set(curves) - set(CURVES)
    if unknown:
        raise SystemExit(f"unknown curves {sorted(unknown)}; choose from {sorted(CURVES)}")
    sd = Speculator(progress=False)
    prompts = select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=args.per_category)
    encoded = [sd.encode_prompt(q.text) for q in prompts]
    # this machine's one-token forward at the first prompt's context (median of 9)
    one = forward_cost(sd.target.model, blocks=(1,), context=len(encoded[0]), repeats=9)["seconds"][0]
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    want = []  # plain decoding's tokens, prompt by prompt
    for ids in encoded:
        e = sd.engine(SpecConfig(method="none"))
        e.generate(ids, SamplingConfig(), gen)
        want.append(list(e.token_ids))
    print(f"one-token forward {one * 1000:.1f} ms; method {args.method}; {len(prompts)} prompts")
    model = sd.target.model
    rows: list[int] = []  # new tokens of each target forward for the prompt being decoded

    def counted(forward, ids, **kw):
        rows.append(len(ids))
        return forward(ids, **kw)

    with watched_forwards(model, counted):
        for name in curves:
            table = ratios(CURVES[name])
            engine = sd.engine(SpecConfig(method=args.method, k=args.k))
            engine.costs = engine.policy.costs = ForwardCosts.fixed(table, one)
            tokens = forwards = exact = nodes = 0
            cost = draft = 0.0
            for ids, expect in zip(encoded, want):
                rows.clear()
                engine.generate(ids, SamplingConfig(), gen)
                s = engine.stats
                checks = rows[1:]  # the first forward is the prefill
                tokens += s.step_tokens
                forwards += s.target_forwards
                nodes += sum(checks) - len(checks)
                cost += sum(1.0 if r == 1 else table[min(r, MAX_ROWS)] for r in checks)
                draft += s.time_draft
                exact += list(engine.token_ids) == expect
            print(f"{name:5s}: {tokens / forwards:.2f} tokens/forward, {nodes / forwards:.1f} draft nodes and "
                  f"{cost / forwards:.2f}x a check, drafting {1000 * draft / forwards:.1f} ms a forward, "
                  f"decode speedup on this curve {tokens / (cost + draft / one):.2f}x, exact {exact}/{len(encoded)}",
                  flush=True)


if __name__ == "__main__":
    main()
