"""Decode speed of methods side by side: the first prompt of each of the first N Spec-Bench
categories, every method on a prompt before the next prompt (this machine's slow phases then
hit all methods alike). Decode = after the target's prefill (a draft model's own prefill counts).

    python scripts/compare_methods.py 8 none,draft-model,hybrid,hybrid-head ['{"draft-model:1": {"k": 1}}']

A method may carry a ":label" to run with SpecConfig options given in the JSON argument.
"""
import collections
import json
import sys

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.pipeline import Speculator

n, methods = int(sys.argv[1]), sys.argv[2].split(",")
options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
prompts = [p.text for p in select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=1)][:n]
sd = Speculator(progress=False)
total = {m: collections.Counter() for m in methods}
for prompt in prompts:
    for m in methods:
        res = sd.generate(prompt, spec=SpecConfig(method=m.split(":")[0], **options.get(m, {})),
                          gen=GenerationConfig(max_new_tokens=96))
        s, t = res.stats, total[m]
        t["tokens"] += s.new_tokens
        t["decode_tokens"] += s.new_tokens - 1
        t["decode_s"] += s.time_total - s.time_prefill
        t["forwards"] += s.target_forwards
        t["draft_s"] += s.time_draft
base = total[methods[0]]["decode_tokens"] / total[methods[0]]["decode_s"]
for m in methods:
    t = total[m]
    rate = t["decode_tokens"] / t["decode_s"]
    print(f"{m:16s} decode {rate:.2f} tok/s ({rate / base:.3f}x {methods[0]})  tokens/forward "
          f"{t['tokens'] / t['forwards']:.2f}  drafting {t['draft_s']:.1f} of {t['decode_s']:.1f} s")
