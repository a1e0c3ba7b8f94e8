"""The engine's forward-cost table as shipped against phase_sim.py's `Levelled` (due anchors level
every size), one method, interleaved prompt by prompt with plain decoding (the order reversed
every other prompt, so the machine's phases hit each alike):

    python scripts/cost_table_ab.py [--method hybrid-head] [--per-category 2] [--max-new-tokens 128]

Each side keeps its own table (costs.ForwardCosts) from prompt to prompt, as a process keeps it
from request to request. Prints, per side, the time over `none`'s with and without the prefill,
tokens per target forward, the nodes a checked draft had and the one-token forwards; and the
tables' ratios at the end. `python scripts/phase_sim.py` shows how each follows a change of
phase; this shows what that is worth on the machine in hand, where phases come as they come.
"""
from __future__ import annotations

import argparse
from collections import Counter

from phase_sim import Levelled  # scripts/ is on the path of a script run from it

from specdraft.bench.machine import vector_rates
from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.costs import ForwardCosts
from specdraft.pipeline import Speculator

SUMMED = ("time_total", "time_prefill", "target_forwards", "step_tokens", "drafts", "draft_tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="hybrid-head")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    sd = Speculator(load_draft=args.method in ("draft-model", "hybrid"), progress=False)
    sides = {"none": (SpecConfig(method="none"), ForwardCosts()),
             "shipped": (SpecConfig(method=args.method), ForwardCosts()),
             "levelled": (SpecConfig(method=args.method), Levelled())}
    ones = Counter()

    def run(name: str, text: str, gen: GenerationConfig):
        spec, costs = sides[name]
        sd._costs = costs  # the engine sd makes for this request times its forwards into this side's table
        record = costs.record

        def counted(tokens: int, seconds: float) -> None:
            ones[name] += tokens == 1
            record(tokens, seconds)

        costs.record = counted
        try:
            return sd.generate(text, spec=spec, gen=gen).stats
        finally:
            del costs.record

    for name in sides:  # warm every side up once, long enough that `none` takes the 2 MB pages here, not in its first prompt
        run(name, "Count from one to fifty in words.", GenerationConfig(max_new_tokens=64))
    ones.clear()
    chosen = select_prompts(load_prompts(prompts_path(None)), per_category=args.per_category)
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    sums = {name: Counter() for name in sides}
    print(f"{len(chosen)} prompts, {args.method}; phase at start: {vector_rates()}", flush=True)
    for i, p in enumerate(chosen):
        for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
            s = run(name, p.text, gen)
            sums[name].update({f: getattr(s, f) for f in SUMMED})
        print(p.category, {n: round(c["time_total"], 1) for n, c in sums.items()}, vector_rates(), flush=True)
    base = sums["none"]
    decode = {n: c["time_total"] - c["time_prefill"] for n, c in sums.items()}
    for name, c in sums.items():
        fw = c["target_forwards"]
        print(f"{name:9s} {base['time_total'] / c['time_total']:.3f}x none  decode {decode['none'] / decode[name]:.3f}x  "
              f"tokens/forward {c['step_tokens'] / fw:.2f}  {c['draft_tokens'] / max(c['drafts'], 1):.2f} nodes a "
              f"draft  one-token forwards {ones[name]} of {fw}")
    for name in ("shipped", "levelled"):
        table = sides[name][1]
        print(name, "ratios at the end:", {t: round(table.ratio(t), 2) for t in sorted(table.log_ratio)})


if __name__ == "__main__":
    main()
