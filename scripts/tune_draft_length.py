import json
import sys

from specdraft.config import *
from specdraft.pipeline import Speculator

prompts = [json.loads(l) for l in open("../shared/bench/spec_bench_dev.jsonl")]
bycat = {}
for p in prompts: bycat.setdefault(p["category"], p)
sel = [bycat[c] for c in ("coding", "summarization", "qa", "math_reasoning")]
sd = Speculator(draft_format=sys.argv[1] if len(sys.argv) > 1 else "int4")
gen = GenerationConfig(max_new_tokens=64)
ids = [sd.encode_prompt(p["turns"][0]) for p in sel]
sd.engine(SpecConfig(method="none")).generate(ids[0][:20], gen=GenerationConfig(max_new_tokens=8))
configs = [("none", {}), ("prompt-lookup", dict(k=8, ngram_min=2)), ("prompt-lookup", dict(k=8, ngram_min=3, ngram_max=4)), ("prompt-lookup", dict(k=16, ngram_min=3, ngram_max=4))]
for method, kw in configs:
    e = sd.engine(SpecConfig(method=method, **kw))
    row = []
    tot_t = tot_n = 0
    for x in ids:
        e.generate(x, gen=gen); s = e.stats
        tot_t += s.time_total; tot_n += s.new_tokens
        row.append(f"{s.tokens_per_s:.2f}t/s,{s.mean_accepted_tokens:.2f}")
    print(method, kw, f"overall {tot_n/tot_t:.2f} tok/s", row, flush=True)
