"""Recording the target's answers one at a time against packed in one cache (models.packed):
python scripts/packed_recording.py [--batch 8] [--requests 16] [--rounds 2]

The first N templated requests of request set 0 (heads.corpus.chat_requests: no generation
needed to make them), answered greedily (at most 160 new tokens, taps 1, 13, 24) by
heads.data.record_answers with batch 1 and with --batch, in turn for --rounds rounds; prints
positions per second for each and which documents the two recordings hold bit for bit (tokens,
features, top candidates, tapped layers: a prompt longer than ROW_EXACT_MAX tokens is prefilled in
one block alone and in blocks of ROW_EXACT_MAX packed, which round differently, and a near-tie
may then take another greedy token). Then the time to
write --requests self-written requests (heads.requests.self_requests, sampled) one at a time and
--batch at a time.
"""
from __future__ import annotations

import argparse
import itertools
import time

import torch

from specdraft.heads.corpus import chat_requests
from specdraft.heads.data import record_answers
from specdraft.heads.requests import self_requests
from specdraft.models.llama import ROW_EXACT_MAX
from specdraft.pipeline import Speculator


def _documents(data):
    """Per document: (tokens, features, top candidates, tapped layers)."""
    cut = data.starts.tolist()
    return [(data.tokens[a:b], data.features[a:b], data.top[a:b], data.aux[a:b]) for a, b in itertools.pairwise(cut)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    args = p.parse_args()
    sd = Speculator(args.target, dtype="fp32", runtime="native", max_length=1024, load_draft=False)
    model, eos = sd.target.model, sd.target.eos_ids
    prompts = [sd.encode_prompt(r) for r in chat_requests(args.requests, seed=0)]
    print(f"{len(prompts)} requests, prompt tokens {min(map(len, prompts))}-{max(map(len, prompts))}")
    got = {}
    for rnd in range(args.rounds):
        for b in (1, args.batch):
            t0 = time.perf_counter()
            data = record_answers(model, iter(prompts), eos_ids=eos, taps=(1, 13, 24), batch=b)
            s = time.perf_counter() - t0
            print(f"round {rnd + 1} batch {b}: {len(data)} positions in {s:.1f} s, {len(data) / s:.1f} positions/s")
            got[b] = data
    one, packed = got[1], got[args.batch]
    short = [len(q) <= ROW_EXACT_MAX for q in prompts]
    same_tokens = same_bits = short_bits = 0
    for d, (a, b) in enumerate(zip(_documents(one), _documents(packed), strict=True)):
        if torch.equal(a[0], b[0]):
            same_tokens += 1
            bits = all(torch.equal(x, y) for x, y in zip(a[1:], b[1:]))
            same_bits += bits
            short_bits += bits and short[d]
    print(f"documents with the same tokens: {same_tokens} of {len(prompts)}, bit for bit the same rows: {same_bits} "
          f"({short_bits} of the {sum(short)} whose prompt has at most {ROW_EXACT_MAX} tokens, prefilled in one "
          "native block either way)")
    for b in (1, args.batch):
        t0 = time.perf_counter()
        written = list(self_requests(model, sd.tokenizer, args.requests, seed=0, eos_ids=eos, batch=b))
        print(f"self-written requests, batch {b}: {len(written)} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
