"""Several answers decoded together against one after another (Speculator.generate_batch with
batched on and off), interleaved round by round (the order reversed every other round, so the
machine's phases hit both sides alike):

    python scripts/batch_choices.py [--methods none,hybrid-head] [--sizes 2,4,8] [--rounds 2] [--max-new-tokens 128]
    python scripts/batch_choices.py --choices 0       # B different dev prompts, greedy, one answer each
    python scripts/batch_choices.py --temperature 0.7 # n sampled answers to one dev prompt (the server's n)

Prints, per method and batch size, each side's wall time for all the answers (prefills
included), their tokens a second and the ratio; greedy, both sides must give the same tokens
(checked). ``--json F`` writes the rows.
"""
from __future__ import annotations

import argparse
import json
import time

from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters import needs_draft_model
from specdraft.pipeline import Speculator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="none,hybrid-head")
    ap.add_argument("--sizes", default="2,4,8", help="answers decoded together")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--choices", type=int, default=1,
                    help="1: n answers to one prompt (sampled: seeds 0..n-1); 0: n different prompts")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sd = Speculator(progress=False, load_draft=any(needs_draft_model(m) for m in args.methods.split(",")))
    pool = [sd.encode_prompt(p.text) for p in select_prompts(load_prompts(prompts_path(None)), per_category=1)]
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    rows = []
    sd.generate(pool[0], spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=8))  # warm: kernels, tables
    for method in args.methods.split(","):
        spec = SpecConfig(method=method)
        for size in (int(s) for s in args.sizes.split(",")):
            times = {False: 0.0, True: 0.0}
            tokens = {False: 0, True: 0}
            forwards = {False: 0, True: 0}
            for r in range(args.rounds):
                prompts = [pool[(r * size + i) % len(pool)] for i in range(size)] if args.choices == 0 \
                    else [pool[r % len(pool)]] * size
                samplings = [SamplingConfig(temperature=args.temperature, seed=i) for i in range(size)]
                got = {}
                for batched in ((False, True) if r % 2 == 0 else (True, False)):
                    t = time.perf_counter()
                    res = sd.generate_batch(prompts, spec=spec, samplings=samplings, gen=gen, batched=batched)
                    times[batched] += time.perf_counter() - t
                    tokens[batched] += sum(len(x.token_ids) for x in res)
                    forwards[batched] += sum(x.stats.target_forwards for x in res)
                    got[batched] = [x.token_ids for x in res]
                if args.temperature == 0.0 and got[False] != got[True]:
                    raise SystemExit(f"{method}, {size} answers, round {r}: the batched answers differ")
            row = {"method": method, "answers": size, "rounds": args.rounds,
                   "one_by_one_s": round(times[False], 2), "together_s": round(times[True], 2),
                   "one_by_one_tok_s": round(tokens[False] / times[False], 2),
                   "together_tok_s": round(tokens[True] / times[True], 2),
                   "speedup": round(times[False] / times[True] * tokens[True] / max(tokens[False], 1), 3),
                   "tokens": [tokens[False], tokens[True]],
                   "tokens_per_forward": [round(tokens[b] / max(forwards[b], 1), 2) for b in (False, True)]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"temperature": args.temperature, "choices": args.choices,
                       "max_new_tokens": args.max_new_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
