"""A long prompt joining answers being decoded: how long the others wait between tokens, and its
first token, with its prefill in chunks beside their checks (specdraft.batch.PREFILL_CHUNK) or
whole in one step.

    python scripts/prefill_join.py [--chunks 128,0] [--rounds 2] [--method hybrid-head] [--context 1200]

Two answers (128 new tokens each) start; at their 6th step a third joins with a prompt of about
``--context`` tokens (an excerpt of this repository's README, then a question). Per chunk size
(0: the whole prompt in one step), interleaved round by round: the longest gap between two pieces
of the first two answers while the third prefills, their tokens/s over the run, the third's time
to first token, and the wall time; every answer checked against the same answer decoded alone.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from specdraft import batch
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.pipeline import Answer, Speculator


def run(sd, spec, prompts, gen, chunk):
    batch.PREFILL_CHUNK = chunk if chunk > 0 else 1 << 30
    stamps = {i: [] for i in range(3)}
    got = {}
    answers = [Answer(ids, spec, SamplingConfig(), gen, on_done=lambda r, i=i: got.__setitem__(i, r),
                      on_piece=lambda piece, engine, i=i: stamps[i].append(time.perf_counter()))
               for i, ids in enumerate(prompts)]
    calls = []
    joined = []

    def more(room, places):
        calls.append(room)
        if len(calls) == 6:
            joined.append(time.perf_counter())
            return answers[2:]
        return []

    t0 = time.perf_counter()
    sd.decode_together(answers[:2], more=more, capacity=sum(a.need for a in answers))
    wall = time.perf_counter() - t0
    ttft = stamps[2][0] - joined[0]
    gaps = [b - a for i in (0, 1) for a, b in zip(stamps[i], stamps[i][1:]) if b > joined[0] and a < stamps[2][0]]
    tokens = sum(len(got[i].token_ids) for i in (0, 1))
    rate = tokens / (max(stamps[0][-1], stamps[1][-1]) - t0)
    return got, max(gaps) if gaps else 0.0, ttft, rate, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="128,0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--method", default="hybrid-head")
    ap.add_argument("--context", type=int, default=1200)
    args = ap.parse_args()
    sd = Speculator(None, None, load_draft=False)
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    excerpt = sd.tokenizer.decode(sd.tokenizer.encode(text, add_special_tokens=False)[:args.context])
    prompts = [sd.encode_prompt("Write a Python function that checks whether a number is prime."),
               sd.encode_prompt("Explain what a KV cache is in three sentences."),
               sd.encode_prompt(excerpt + "\n\nWhat does this project do, in two sentences?")]
    gen = GenerationConfig(max_new_tokens=128)
    spec = SpecConfig(method=args.method)
    alone = [sd.generate(p, spec=spec, gen=gen).token_ids for p in prompts]
    chunks = [int(c) for c in args.chunks.split(",")]
    results = {c: [] for c in chunks}
    for _ in range(args.rounds):
        for c in chunks:
            got, gap, ttft, rate, wall = run(sd, spec, prompts, gen, c)
            assert [got[i].token_ids for i in range(3)] == alone, c
            results[c].append((gap, ttft, rate, wall))
    print(f"third prompt {len(prompts[2])} tokens, {args.method}, {args.rounds} rounds (each answer equal to alone)\n")
    print("| chunk | longest gap of the others (s) | third's first token (s) | others' tok/s | wall (s) |")
    print("|---:|---:|---:|---:|---:|")
    for c, rows in results.items():
        cols = [" / ".join(f"{r[k]:.2f}" for r in rows) for k in range(4)]
        print(f"| {c or 'whole'} | {cols[0]} | {cols[1]} | {cols[2]} | {cols[3]} |")


if __name__ == "__main__":
    main()
