"""Where the time of n answers decoded together goes, by method: the prefill, the joint checks'
forwards, and the rest (each answer's drafting, sampling and verifying, the batch's bookkeeping),
n sampled answers to one dev prompt, every answer the same length (ignore_eos), methods
interleaved round by round (the order reversed every other round):

    python scripts/batch_split.py [--methods none,head] [--answers 8] [--rounds 4]

Prints per method: wall seconds, prefill seconds, checks' forwards (count, seconds, rows a
forward, ms by rows), the rest in ms a step and a step's answer. Drafters are made before the
timed rounds (a first batch makes them: scripts/first_batch.py).
"""
from __future__ import annotations

import argparse
import collections
import time

from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.models import llama
from specdraft.pipeline import Speculator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="none,head")
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    methods, n = args.methods.split(","), args.answers
    timed: dict[str, list] = collections.defaultdict(list)  # method (+ " prefill") -> [(rows, seconds)]
    now: list[str | None] = [None]
    forward = llama.LlamaModel.forward

    def timing(self, ids, *a, **k):
        t = time.perf_counter()
        out = forward(self, ids, *a, **k)
        if now[0]:
            timed[now[0] + (" prefill" if k.get("last_only") else "")].append((int(ids.shape[0]), time.perf_counter() - t))
        return out

    llama.LlamaModel.forward = timing
    sd = Speculator(progress=False, load_draft=False)
    pool = [sd.encode_prompt(p.text) for p in select_prompts(load_prompts(prompts_path(None)), per_category=1)]
    samplings = [SamplingConfig(temperature=0.7, seed=i) for i in range(n)]
    for m in methods:  # make each method's drafters
        sd.generate_batch([pool[0]] * n, spec=SpecConfig(method=m), samplings=samplings,
                          gen=GenerationConfig(max_new_tokens=4), batched=True)
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    wall: collections.Counter = collections.Counter()
    for r in range(args.rounds):
        for m in methods if r % 2 == 0 else methods[::-1]:
            now[0] = m
            t = time.perf_counter()
            sd.generate_batch([pool[r % len(pool)]] * n, spec=SpecConfig(method=m), samplings=samplings, gen=gen, batched=True)
            wall[m] += time.perf_counter() - t
            now[0] = None
    for m in methods:
        checks, prefill = timed[m], sum(s for _, s in timed[m + " prefill"])
        by_rows: dict[int, list[float]] = collections.defaultdict(list)
        for rows, s in checks:
            by_rows[rows].append(s)
        spent = sum(s for _, s in checks)
        rest = wall[m] - prefill - spent
        print(f"{m}: wall {wall[m]:.2f} s, prefill {prefill:.2f} s, {len(checks)} checks' forwards {spent:.2f} s "
              f"({sum(r for r, _ in checks) / len(checks):.2f} rows a forward; "
              + ", ".join(f"{r} rows {1000 * sum(v) / len(v):.1f} ms x{len(v)}"
                          for r, v in sorted(by_rows.items()) if len(v) >= 10)
              + f"), the rest {1000 * rest / len(checks):.2f} ms a step, {1000 * rest / len(checks) / n:.2f} an answer's step")


if __name__ == "__main__":
    main()
