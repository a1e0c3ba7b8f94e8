"""How often the draft model with some of its layers skipped picks the target's next token:

    python scripts/draft_skip_agreement.py BENCH_JSON [--method none] [--skips 1,2,3,4,6,8]

Teacher-forced over the answers a bench report holds (BENCH_JSON's generations by --method):
the target's argmax at every position against the draft model's (Q4_K, its 32,768-id head, as
`draft-model` drafts) with all its layers, with each layer skipped alone (that layer's harm), and
with the k least harmful skipped for each k in --skips (self-draft's layer_harm and kept_layers,
against the target's choices instead of the draft's own). The layers are ranked on the same
answers they are then scored on, so the skipped rows are optimistic. A skipped layer saves about
1 / layers of a draft forward's decoder time.
"""
from __future__ import annotations

import argparse
import json

import torch

from specdraft.drafters.self_draft import agreement, greedy_choices, kept_layers, layer_harm
from specdraft.pipeline import DEFAULT_DRAFT, DEFAULT_DRAFT_VOCAB, DEFAULT_TARGET, load_model


def report_answers(description: str, extra=None):
    """(parsed arguments, the answers [T] of the report's --method, the default target and the
    default draft (Q4_K) sized for them, the draft's logits over ``head_vocab``): what the
    teacher-forced agreement scripts share. ``extra(parser)`` adds a script's own arguments."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("report", help="a `specdraft bench --json` report")
    ap.add_argument("--method", default="none")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    with open(args.report) as f:
        seqs = [torch.tensor(p["token_ids"]) for p in json.load(f)["prompts"]
                if p["method"] == args.method and p["token_ids"]]
    longest = max(map(len, seqs)) + 1
    target = load_model(DEFAULT_TARGET, dtype="auto", weight_format="auto", max_length=longest).model
    return args, seqs, target, lambda head_vocab: load_model(DEFAULT_DRAFT, dtype="auto", weight_format="q4k",
                                                             max_length=longest, draft=True, head_vocab=head_vocab).model


def main() -> None:
    args, seqs, target, draft_with = report_answers(__doc__.splitlines()[0],
                                                    lambda ap: ap.add_argument("--skips", default="1,2,3,4,6,8"))
    total = sum(map(len, seqs))
    draft = draft_with(DEFAULT_DRAFT_VOCAB)
    want = [greedy_choices(target, s) for s in seqs]

    def pooled(model) -> float:
        """model's agreement with the target over every position of every answer."""
        return sum(len(s) * agreement(model, s, w) for s, w in zip(seqs, want)) / total

    full = pooled(draft)
    n = len(draft.layers)
    print(f"all {n} layers: {full:.4f} over {total} positions of {len(seqs)} answers", flush=True)
    per_answer = [layer_harm(draft, s, w) for s, w in zip(seqs, want)]
    harm = [sum(len(s) * h[i] for s, h in zip(seqs, per_answer)) / total - (1.0 - full) for i in range(n)]
    print("harm by layer: " + ", ".join(f"{i} {h:+.3f}" for i, h in enumerate(harm)), flush=True)
    for k in (int(s) for s in args.skips.split(",")):
        keep = kept_layers(harm, k)
        print(f"skip {k} {sorted(set(range(n)) - set(keep))}: {pooled(draft.with_layers(keep)):.4f}", flush=True)


if __name__ == "__main__":
    main()
