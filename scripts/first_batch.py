"""The first batch of answers decoded together in a fresh process: its wall time and the
process's peak memory, drafters made included (run once per side of an A/B, a process each):

    python scripts/first_batch.py [--method hybrid-head] [--answers 8] [--max-new-tokens 32]

n sampled answers (temperature 0.7, seeds 0..n-1) to the second dev prompt, every answer
``--max-new-tokens`` long (ignore_eos), after one 8-token plain generation (kernels, tables).
"""
from __future__ import annotations

import argparse
import resource
import time

from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.pipeline import Speculator


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # (kB on Linux)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="hybrid-head")
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    sd = Speculator(progress=False, load_draft=False)
    pool = [sd.encode_prompt(p.text) for p in select_prompts(load_prompts(prompts_path(None)), per_category=1)]
    sd.generate(pool[0], spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=8))
    before = peak_gb()
    t = time.perf_counter()
    sd.generate_batch([pool[1]] * args.answers, spec=SpecConfig(method=args.method),
                      samplings=[SamplingConfig(temperature=0.7, seed=i) for i in range(args.answers)],
                      gen=GenerationConfig(max_new_tokens=args.max_new_tokens, ignore_eos=True), batched=True)
    seconds = time.perf_counter() - t
    print(f"{args.method}, {args.answers} answers x {args.max_new_tokens} tokens, the first batch of a process: "
          f"{seconds:.2f} s; peak resident {peak_gb():.2f} GB (+{1000 * (peak_gb() - before):.0f} MB in the batch)")


if __name__ == "__main__":
    main()
