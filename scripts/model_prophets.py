"""How often whole-model prophets guess the target's next token on the bench answers: the draft
model (over its whole vocabulary or a reduced one) and low-bit copies of the target itself.

    python scripts/model_prophets.py BENCH.pt --draft default-draft [--counts TRAIN.pt]
    python scripts/model_prophets.py BENCH.pt --copies dense,q3,q2d3,q2

BENCH.pt: the target's greedy answers to the first 2 Spec-Bench dev prompts of each category with
their contexts (`python scripts/heldout_agreement.py BENCH.pt --bench 2` records it). Each answer
is fed whole (teacher forcing) and a prophet's argmax at answer row i is compared with the target's
choice there, for rows 1.. (row 0's token comes from the prefill: a drafter first guesses after
it), so the figures compare with heldout_agreement's first step of a trained drafter.

--draft: the draft model in its default format (the one `--method draft-model` runs), its logits
over every id, the first 16,384 / 32,768 (what the runtime computes by default), and, with
--counts, the 16,384 / 24,576 / 32,768 ids the target chose most often in TRAIN.pt (feature
files; never the bench's). --copies: the target in fp32 with every decoder projection rounded
to b bits per group of 16 (asymmetric, fp16 scale and minimum, a few clipping factors searched
per group; an optimistic stand-in for llama.cpp's Q3_K / Q2_K, whose scales are 6 / 4 bits):
dense (no rounding: the fp32 forward's own agreement with the GGUF target), q3, q2, q2d3 (2 bits,
the down projections 3). Prints top-1 (and top-3 for --draft) agreement and the share of rows
where two guesses in a row agree, overall and per category."""
from __future__ import annotations

import argparse
import collections

import torch

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
from specdraft.heads.data import FeatureSet
from specdraft.heads.vocab import choice_counts, frequent_ids
from specdraft.models.quant import make_linear
from specdraft.pipeline import load_model

COPY_BITS = {"dense": {}, "q3": {"*": 3}, "q2": {"*": 2}, "q2d3": {"*": 2, "down": 3}}
PROJECTIONS = ("qkv", "o", "gate_up", "down")


def round_groups(w: torch.Tensor, bits: int, group: int = 16) -> torch.Tensor:
    """w [out, in] rounded to ``bits`` per group of ``group`` inputs (asymmetric), dequantized."""
    x = w.reshape(-1, group).float()
    lo, hi = x.min(1, keepdim=True).values, x.max(1, keepdim=True).values
    n = 2 ** bits - 1
    best, best_err = None, None
    for clip in (1.0, 0.95, 0.9, 0.85, 0.8, 0.75):  # the clipping that rounds each group best
        low, step = lo * clip, ((hi - lo) * clip / n).clamp_min(1e-12)
        d = torch.clamp(torch.round((x - low) / step), 0, n) * step + low
        err = (d - x).pow(2).sum(1, keepdim=True)
        if best is None:
            best, best_err = d, err
        else:
            better = err < best_err
            best, best_err = torch.where(better, d, best), torch.where(better, err, best_err)
    return best.reshape(w.shape)


class Tally:
    """Agreement counts per group (a category and "all")."""

    def __init__(self):
        self.rows, self.top1, self.top3, self.pairs = (collections.Counter() for _ in range(4))

    def add(self, groups, guesses: torch.Tensor, truth: torch.Tensor) -> None:
        """guesses [R, k] best first, truth [R]."""
        hit = guesses == truth[:, None]
        ok = hit[:, 0]
        for g in groups:
            self.rows[g] += len(truth)
            self.top1[g] += int(ok.sum())
            self.top3[g] += int(hit[:, :3].any(-1).sum())
            self.pairs[g] += int((ok[:-1] & ok[1:]).sum())

    def line(self, name: str, top3: bool) -> str:
        r = self.rows
        head = f"{name}: top-1 {self.top1['all'] / r['all']:.4f}"
        if top3:
            head += f", top-3 {self.top3['all'] / r['all']:.4f}"
        head += f", two in a row {self.pairs['all'] / r['all']:.4f} ({r['all']} rows);"
        return head + " " + " ".join(f"{g} {self.top1[g] / r[g]:.2f}" for g in r if g != "all")


def answer_rows(bench: FeatureSet):
    """(document tokens, first answer row in them, the target's choices at answer rows 1..)."""
    s, cs = bench.starts.tolist(), bench.context_starts.tolist()
    for d, doc in enumerate(bench.documents()):
        yield doc, cs[d + 1] - cs[d], bench.top[s[d] + 1:s[d + 1], 0]


def logits_over_answer(model, doc, first, n):
    model.reset()
    return model.forward(torch.tensor(doc)).logits[first + 1:first + 1 + n].float()  # [n, V']


def measure_draft(bench, categories, spec: str, counts_path: str | None) -> None:
    model = load_model(spec, draft=True, progress=False, weight_format="auto", max_length=4096).model
    V = model.vocab_size
    vocabs = {"every id": None, "first 16384": torch.arange(16384), "first 32768": torch.arange(32768)}
    if counts_path:
        counts = choice_counts(FeatureSet.load(counts_path).top, V)
        vocabs |= {f"ranked {n}": frequent_ids(counts, n) for n in (16384, 24576, 32768)}
    masks = {}
    for name, ids in vocabs.items():
        if ids is not None:
            masks[name] = torch.full((V,), float("-inf"))
            masks[name][ids] = 0.0
    tallies = {name: Tally() for name in vocabs}
    for cat, (doc, first, truth) in zip(categories, answer_rows(bench)):
        logits = logits_over_answer(model, doc, first, len(truth))
        for name in vocabs:
            x = logits if name not in masks else logits + masks[name]
            tallies[name].add((cat, "all"), x.topk(3, -1).indices, truth)
    for name, t in tallies.items():
        print(t.line(f"draft {spec}, {name}", top3=True), flush=True)


def measure_copies(bench, categories, variants: list[str]) -> None:
    model = load_model("default-target", dtype="fp32", weight_format="dense", runtime="native",
                       progress=False, max_length=4096).model
    stored = [{n: (getattr(layer, n).packed.to_dense() if getattr(layer, n).packed is not None
                   else getattr(layer, n).weight).clone() for n in PROJECTIONS} for layer in model.layers]
    for variant in variants:
        bits = COPY_BITS[variant]
        for layer, weights in zip(model.layers, stored):
            for n, w in weights.items():
                b = bits.get(n, bits.get("*"))
                setattr(layer, n, make_linear(w if b is None else round_groups(w, b), getattr(layer, n).bias, "dense"))
        t = Tally()
        for cat, (doc, first, truth) in zip(categories, answer_rows(bench)):
            t.add((cat, "all"), logits_over_answer(model, doc, first, len(truth)).argmax(-1, keepdim=True), truth)
        print(t.line(f"target copy {variant}", top3=False), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("bench")
    p.add_argument("--draft", default=None)
    p.add_argument("--counts", default=None)
    p.add_argument("--copies", default=None)
    args = p.parse_args()
    bench = FeatureSet.load(args.bench)
    prompts = select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=2)
    if len(bench.starts) - 1 != len(prompts):
        raise SystemExit(f"{args.bench} holds {len(bench.starts) - 1} answers, not one for each of {len(prompts)} prompts")
    categories = [q.category for q in prompts]
    if args.draft:
        measure_draft(bench, categories, args.draft, args.counts)
    if args.copies:
        unknown = set(args.copies.split(",")) - set(COPY_BITS)
        if unknown:
            raise SystemExit(f"unknown copies {sorted(unknown)}; choose from {sorted(COPY_BITS)}")
        measure_copies(bench, categories, args.copies.split(","))


if __name__ == "__main__":
    main()
