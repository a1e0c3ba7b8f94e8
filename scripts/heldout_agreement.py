"""Held-out agreement of trained drafters with the target, and how much of the target's choices a
vocabulary covers: python scripts/heldout_agreement.py HELDOUT.pt DIR... [--coverage TRAIN.pt,...]

HELDOUT.pt: a feature file recorded on documents no drafter trained on (`specdraft train-drafter
--answers` writes such files); DIR: MLP-head, EAGLE, MTP, Medusa or Hydra drafter directories. For
each: its vocabulary (first or listed ids), their coverage of the held-out choices, and greedy
agreement per step (MLP/EAGLE/MTP: given the drafter's own earlier predictions) or per head
(Medusa/Hydra). --coverage: feature files whose choices rank ids by frequency; prints the coverage
of the first N ids against the N most frequent for several N.

With --holdout H, HELDOUT is the training files of a `train-drafter` run (commas between them,
--weights as its --answer-weight gave them: 1 for the corpus, the weight for answers) and the
drafters are judged on the documents that run held out (the same split, seed 0), all of them and
those of the largest weight (the answers), and on every 8th document it trained on.

With --bench N, HELDOUT is the target's greedy answers (128 new tokens, taps 1,13,24) to the first N
Spec-Bench dev prompts of each category, recorded into HELDOUT when it does not exist: agreement on
the bench's own text, all and per category (to measure drafters; never to train them).
--vocab N (with --coverage): MLP heads are judged over the N ids those files rank first.
--with-requests: EAGLE layers attend to each answer's request rows too (recorded again with them
when HELDOUT lacks them), as they do when drafting; their scores stay on the answers' rows."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.drafters.feature_head import output_weight
from specdraft.heads import train
from specdraft.heads.data import FeatureSet, concat, record_answers, with_requests
from specdraft.heads.eagle_train import agreement as eagle_agreement
from specdraft.heads.eagle_train import stretches
from specdraft.heads.medusa import agreement as heads_agreement
from specdraft.heads.model import load_head
from specdraft.heads.vocab import choice_counts, draft_index, frequent_ids
from specdraft.pipeline import Speculator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("heldout")
    p.add_argument("drafters", nargs="*")
    p.add_argument("--coverage", default=None)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--holdout", type=float, default=None)
    p.add_argument("--weights", default=None)
    p.add_argument("--bench", type=int, default=None)
    p.add_argument("--vocab", type=int, default=None,
                   help="with --coverage: judge MLP heads over the VOCAB ids those files rank first, not their own")
    p.add_argument("--with-requests", action="store_true",
                   help="EAGLE layers see each answer's request rows (as when drafting)")
    args = p.parse_intermixed_args()  # drafters may follow the options too
    sd = Speculator(args.target, dtype="fp32", runtime="native", max_length=2048, load_draft=False)
    target = sd.target.model
    if args.bench:
        prompts = select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=args.bench)
        if not Path(args.heldout).is_file():
            record_answers(target, (sd.encode_prompt(p.text) for p in prompts), max_new_tokens=128,
                           eos_ids=sd.target.eos_ids, taps=(1, 13, 24)).save(args.heldout)
    sets = [FeatureSet.load(f) for f in args.heldout.split(",")]
    held = concat(sets)
    if args.with_requests and held.request_rows is None:
        held = with_requests(target, held)
    full = held  # what EAGLE layers read: with the requests' rows where asked
    held = held.answers_only()
    if not args.with_requests:
        full = held
    groups = {"all": torch.arange(len(held.starts) - 1)}
    if args.bench:  # one document a prompt, in order
        if len(held.starts) - 1 != len(prompts):
            raise SystemExit(f"{args.heldout} holds {len(held.starts) - 1} answers, not one for each of {len(prompts)} prompts")
        for category in dict.fromkeys(p.category for p in prompts):
            groups[category] = torch.tensor([i for i, p in enumerate(prompts) if p.category == category])
    if args.holdout is not None:
        weights = [int(w) for w in args.weights.split(",")] if args.weights else [1] * len(sets)
        weight = torch.cat([torch.full((len(fs.starts) - 1,), w) for fs, w in zip(sets, weights)])
        val, trained = train.split_documents(len(held.starts) - 1, args.holdout, 0)
        groups = {"held out": val, "held-out answers": val[weight[val] == weight.max()],
                  "trained on (every 8th)": trained[::8]}  # against held out: how much a drafter memorised
    if args.coverage:
        counts = sum(choice_counts(FeatureSet.load(f).top, 151936) for f in args.coverage.split(","))
        choices = held.top[:, 0].long()
        for n in (4096, 8192, 12288, 16384, 32768):
            listed = draft_index(frequent_ids(counts, n), len(counts))[choices] >= 0
            print(f"{n:6d} ids: frequency-ranked {listed.float().mean():.4f}, first {(choices < n).float().mean():.4f}")
    if not args.drafters:
        return
    for d in args.drafters:
        kind = json.loads((Path(d) / "head.json").read_text()).get("kind", "mlp")
        head = load_head(d, kind)
        ids = head.token_ids()
        if args.vocab and args.coverage and kind == "mlp":
            ids = frequent_ids(counts, args.vocab)
        w = output_weight(target, ids).float()
        index = draft_index(ids, len(target.embed))
        top, full_top = index[held.top.long()], index[full.top.long()]
        for name, docs in groups.items():
            rows = torch.cat([torch.arange(int(held.starts[i]), int(held.starts[i + 1])) for i in docs.tolist()])
            cover = float((top[rows, 0] >= 0).float().mean())
            if kind in ("medusa", "hydra"):
                got = heads_agreement(head, held, train.start_rows(held, docs, 1), w, target.embed)
            elif kind == "eagle":
                got = eagle_agreement(head, full, stretches(full, docs, 512), target.embed, w, 3, full_top)
            else:
                got = train._agreement(head, held, target.embed, w, train.start_rows(held, docs, 3), 3, top)
            listed = "listed" if getattr(head.cfg, "listed_vocab", False) else "first"
            print(f"{d} {kind} {len(ids)} {listed} ids, coverage {cover:.4f}, agreement ({name}) {got}",
                  flush=True)


if __name__ == "__main__":
    main()
