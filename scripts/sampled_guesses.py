"""How the head should guess when the target samples: drawn from its own q, or its argmax
(verified one-hot), as chains, and as EAGLE-2 trees; plain sampling beside.

Temperature 0.7, the dev prompts (the first of each category), each prompt seeded, arms rotated
prompt by prompt in one process; decode time only (after the first token).

    python scripts/sampled_guesses.py [--method head] [--temperature 0.7]
"""
import argparse

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.heads.model import shipped_head_dir
from specdraft.pipeline import Speculator

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="head")
ap.add_argument("--temperature", type=float, default=0.7)
ap.add_argument("--max-new-tokens", type=int, default=128)
args = ap.parse_args()

firsts = select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=1)  # as the bench's --per-category 1
sd = Speculator(load_draft=False, progress=False)
# arm -> (method, trees, guesses drawn from q: True, False, None = whichever passes more, the default)
arms = {"none": ("none", False, False), "chains from q": (args.method, False, True),
        "chains of argmax": (args.method, False, False), "chains (default)": (args.method, False, None),
        "trees": (args.method, True, None)}
shipped = shipped_head_dir(sd.target.name)
# the chain arms name the same head differently, so each keeps a drafter (and pass rates) of its own
head_name = {True: shipped, False: shipped + "/.", None: None}
sums = {a: {"seconds": 0.0, "forwards": 0, "tokens": 0, "drafting": 0.0} for a in arms}
names = list(arms)
for i, p in enumerate(firsts):
    for a in names[i % len(names):] + names[:i % len(names)]:
        method, trees, from_q = arms[a]
        spec = SpecConfig(method=method, trees=trees, head=None if trees else head_name[from_q])
        if method != "none":
            sd.engine(spec).drafter.sample_from_q = from_q  # the drafter is kept per spec
        r = sd.generate(p.text, spec=spec, sampling=SamplingConfig(temperature=args.temperature, seed=1 + i),
                        gen=GenerationConfig(max_new_tokens=args.max_new_tokens))
        s = sums[a]
        s["seconds"] += r.stats.time_total - r.stats.time_prefill
        s["forwards"] += r.stats.target_forwards
        s["tokens"] += r.stats.new_tokens
        s["drafting"] += r.stats.time_draft
plain = sums["none"]["seconds"] / sums["none"]["tokens"]
print(f"{args.method}, temperature {args.temperature}, {len(firsts)} prompts")
print("arm              | tokens/forward | decode ms/token | drafting ms/forward | decode speedup")
for a, s in sums.items():
    per = s["seconds"] / s["tokens"]
    print(f"{a:16s} | {s['tokens'] / s['forwards']:14.3f} | {1000 * per:15.2f} | "
          f"{1000 * s['drafting'] / s['forwards']:19.2f} | {plain / per:13.3f}x")
