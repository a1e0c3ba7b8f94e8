"""Where a batch's time goes: answers to some dev prompts decoded together and one after another
(Speculator.generate_batch, batched on and off), twice, with each answer's drafting, checking
(its forwards, waits included) and prefill seconds, and the batch's joint forwards:

    python scripts/batch_overhead.py hybrid-head 5,6      # METHOD PROMPT_INDICES (the 13 dev prompts)

With one long answer and one short, the long one runs alone in the batch for most of its steps:
its checks should take what they take alone (they did not while answers ran on threads of their
own, each waking an OpenMP team whose spinning took the cores: BENCHMARKS.md, 2026-12-07).
"""
from __future__ import annotations

import sys
import time

from specdraft import batch
from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.pipeline import Speculator


def main() -> None:
    method, which = sys.argv[1], [int(i) for i in sys.argv[2].split(",")]
    sd = Speculator(progress=False, load_draft=False)
    pool = [sd.encode_prompt(p.text) for p in select_prompts(load_prompts(prompts_path(None)), per_category=1)]
    gen = GenerationConfig(max_new_tokens=128)
    sd.generate(pool[0], spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=8))  # warm
    joint = {"seconds": 0.0, "steps": 0}
    inner = batch.Batch._run_forwards

    def timed(self, asked):
        t = time.perf_counter()
        inner(self, asked)
        joint["seconds"] += time.perf_counter() - t
        joint["steps"] += 1

    batch.Batch._run_forwards = timed
    prompts = [pool[i] for i in which]
    for _ in range(2):
        for together in (True, False):
            joint.update(seconds=0.0, steps=0)
            t = time.perf_counter()
            res = sd.generate_batch(prompts, spec=SpecConfig(method=method), samplings=[SamplingConfig()] * len(prompts),
                                    gen=gen, batched=together)
            wall = time.perf_counter() - t
            st = [r.stats for r in res]
            print(f"{method} {'together' if together else 'one by one'}: wall {wall:.2f} s"
                  + (f", joint forwards {joint['seconds']:.2f} s in {joint['steps']} steps" if together else "")
                  + f"; per answer: drafting {[round(s.time_draft, 2) for s in st]} s, checks"
                  f" {[round(s.time_verify, 2) for s in st]} s, prefill {[round(s.time_prefill, 2) for s in st]} s,"
                  f" tokens {[s.new_tokens for s in st]}, forwards {[s.target_forwards for s in st]}", flush=True)


if __name__ == "__main__":
    main()
