"""Tune the head drafter's k and stop threshold on held-out dev prompts.

Uses the THIRD prompt of each listed category (the benchmark's `--per-category 2` uses the first
two), 96 new tokens, greedy. Prints tokens/s and tokens per target forward per configuration,
all in one process so the ratios are comparable.

    python scripts/tune_head.py [--configs "head:5:0.5,hybrid-head:5:0.5"]
"""
import argparse
from pathlib import Path

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.pipeline import Speculator

ap = argparse.ArgumentParser()
ap.add_argument("--prompts", default=str(PACKAGED_PROMPTS))
ap.add_argument("--categories", default="writing,reasoning,math,coding,summarization,qa")
ap.add_argument("--index", type=int, default=2, help="which prompt of each category (0-based)")
ap.add_argument("--configs", default="none:1:0,head:5:0.5,head:5:0.2,head:8:0.2,hybrid-head:5:0.5,hybrid-head:5:0.2")
ap.add_argument("--head", default=None)
ap.add_argument("--max-new-tokens", type=int, default=96)
ap.add_argument("--target-format", default="auto")
args = ap.parse_args()

rows = load_prompts(Path(args.prompts))
cats = args.categories.split(",")
sel = [[r for r in rows if r.category == c][args.index] for c in cats]
sd = Speculator(load_draft=False, progress=False, target_format=args.target_format)
ids = [sd.encode_prompt(r.text) for r in sel]
gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
sd.engine(SpecConfig(method="none")).generate(ids[0][:16], gen=GenerationConfig(max_new_tokens=4))  # warm up
base = None
for cfg in args.configs.split(","):
    method, k, conf = cfg.split(":")
    e = sd.engine(SpecConfig(method=method, k=int(k), min_confidence=float(conf), head=args.head))
    t = n = dec_t = fwd = 0.0
    per = []
    for x in ids:
        e.generate(x, gen=gen)
        s = e.stats
        t += s.time_total
        dec_t += s.time_total - s.time_prefill
        n += s.new_tokens
        fwd += s.target_forwards
        per.append(f"{s.new_tokens / (s.time_total - s.time_prefill):.1f}")
    dec = (n - len(ids)) / dec_t
    base = base or dec
    print(f"{cfg:22s} decode {dec:6.2f} tok/s {dec / base:5.2f}x  tokens/forward {n / fwd:4.2f}  per prompt {per}", flush=True)
