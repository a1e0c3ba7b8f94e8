"""Record the target's features on text or on its own answers, with chosen corpus and request seeds:
python scripts/record_features.py text|answers MINUTES OUT.pt [--seed S] [--taps 1,13,24] [--requests self|passages]
    [--record-batch B]

`specdraft train-drafter --features F --answers A` records missing files itself, always from the
corpus shuffled with seed 0 and the Nth answers file from request set N; this records a set from
another shuffle (text) or request set (answers), e.g. requests no shipped drafter was trained on.
The shipped EAGLE layer's features came from

    python scripts/record_features.py answers 24 answers11.pt --seed 11
    python scripts/record_features.py text 10 text.pt --seed 5

Answers are decoded --record-batch at a time in one cache (models.packed; default 8): the same
answers to the same requests, more of them a minute. The shipped drafters' answer sets were
recorded one at a time: `--record-batch 1` writes the same self-written requests as then (a batch
takes its random draws in another order, so it writes other ones) and stops after as many answers.
"""
from __future__ import annotations

import argparse
import time

from specdraft.heads.command import request_set
from specdraft.heads.corpus import default_corpus
from specdraft.heads.data import encode_corpus, record, record_answers
from specdraft.pipeline import Speculator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("text", "answers"))
    p.add_argument("minutes", type=float)
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0, help="text: the corpus shuffle; answers: the request set")
    p.add_argument("--taps", default="1,13,24")
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--record-batch", type=int, default=8, help="answers: requests written and answered together")
    p.add_argument("--requests", choices=("templates", "self", "passages"), default="templates",
                   help="answers: to templated requests, to requests the target writes itself (Magpie), or to "
                        "requests carrying a passage it wrote (translation, summaries, questions over a document)")
    args = p.parse_args()
    taps = tuple(int(x) for x in args.taps.split(",")) if args.taps else ()
    sd = Speculator(args.target, dtype="fp32", runtime="native", max_length=1024, load_draft=False)
    target = sd.target.model
    t0 = time.perf_counter()
    if args.what == "text":
        data = record(target, encode_corpus(sd.tokenizer, default_corpus(seed=args.seed)), seconds=args.minutes * 60,
                      taps=taps)
    else:
        requests = request_set(args.requests, sd, args.seed, args.record_batch)
        data = record_answers(target, (sd.encode_prompt(r) for r in requests), eos_ids=sd.target.eos_ids,
                              seconds=args.minutes * 60, taps=taps, batch=args.record_batch)
    data.save(args.out)
    print(f"{args.what}: {len(data)} positions, {len(data.starts) - 1} documents, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
