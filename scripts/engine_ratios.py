"""What the engine learns a forward costs, against the same forwards timed side by side.

Runs a method over the dev prompts (the first of each category) in one process with nothing
beside it, as `specdraft generate` and the server run, then prints the cost ratios the engine's
ForwardCosts learnt while decoding (cost(T) / cost(1)) and the curve `specdraft calibrate` times
(interleaved forwards at a context of 400 tokens) right after. The two should agree within the
machine's noise; a learnt ratio far off sizes drafts wrongly (costs.ForwardCosts).

    python scripts/engine_ratios.py [--method head] [--trees] [--temperature 0.7]
"""
import argparse
import collections

from specdraft.bench.forward_cost import forward_cost
from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.pipeline import Speculator

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="head")
ap.add_argument("--trees", action="store_true")
ap.add_argument("--temperature", type=float, default=0.0)
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--blocks", default="1,2,3,4,5,6,8")
args = ap.parse_args()

firsts = select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=1)  # as the bench's --per-category 1
sd = Speculator(load_draft=False, progress=False)
spec = SpecConfig(method=args.method, trees=args.trees)
sampling = SamplingConfig(temperature=args.temperature, seed=1)
sizes: collections.Counter = collections.Counter()
record = sd._costs.record


def counted(tokens: int, seconds: float) -> None:
    sizes[tokens] += 1
    record(tokens, seconds)


sd._costs.record = counted
for p in firsts:
    sd.generate(p.text, spec=spec, sampling=sampling, gen=GenerationConfig(max_new_tokens=args.max_new_tokens))
blocks = [int(b) for b in args.blocks.split(",")]
timed = forward_cost(sd.target.model, blocks=blocks, context=400, repeats=5)
one = timed["seconds"][0]
print(f"{args.method}{' trees' if args.trees else ''}, temperature {args.temperature}, {len(firsts)} prompts; "
      f"forwards by new tokens: {dict(sorted(sizes.items()))}")
print("new tokens | learnt while decoding | timed side by side")
for t, s in zip(blocks, timed["seconds"]):
    print(f"{t:10d} | {sd._costs.ratio(t):21.2f} | {s / one:18.2f}")
