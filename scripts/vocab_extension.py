"""First-guess agreement of a shipped-form MLP head and EAGLE layer when they read more of the
target's output rows at draft time than their own vocabulary:
python scripts/vocab_extension.py HELDOUT.pt [--head DIR] [--eagle DIR] [--sizes 16384,32768,65536,0]

HELDOUT.pt: a feature file no drafter trained on (e.g. the bench answers `heldout_agreement.py
--bench 2` records). A drafter's vocabulary is a list of target ids whose output rows score its
predicted feature, so it can read more rows without training: its own ids first, then the lowest
ids not among them, up to each size (0: every id). Prints, per size, the share of the target's
choices the ids hold and the agreement per depth (given the drafter's own earlier predictions).
"""
from __future__ import annotations

import argparse

import torch

from specdraft.drafters.feature_head import output_weight
from specdraft.heads import train
from specdraft.heads.data import FeatureSet
from specdraft.heads.eagle_train import agreement as eagle_agreement
from specdraft.heads.eagle_train import stretches
from specdraft.heads.model import load_head, shipped_head_dir
from specdraft.heads.vocab import as_draft_indices
from specdraft.models.registry import DEFAULT_TARGET
from specdraft.pipeline import Speculator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("heldout")
    p.add_argument("--head", default=None, help="MLP head directory (default: the shipped one)")
    p.add_argument("--eagle", default=None, help="EAGLE layer directory (default: the shipped one)")
    p.add_argument("--sizes", default="16384,24576,32768,49152,65536,0")
    args = p.parse_args()
    sd = Speculator(DEFAULT_TARGET, dtype="fp32", runtime="native", load_draft=False)
    target = sd.target.model
    data = FeatureSet.load(args.heldout)
    head = load_head(args.head or shipped_head_dir(DEFAULT_TARGET))
    eagle = load_head(args.eagle or shipped_head_dir(DEFAULT_TARGET, "eagle"), "eagle")
    own, V = head.token_ids(), target.embed.shape[0]
    docs = torch.arange(len(data.starts) - 1)
    rest = torch.ones(V, dtype=torch.bool)
    rest[own] = False
    for size in (int(s) or V for s in args.sizes.split(",")):
        ids = torch.cat([own, torch.arange(V)[rest][:max(0, size - len(own))]])
        w = output_weight(target, ids).float()
        top = as_draft_indices(data.top.long(), len(ids), ids)
        covered = float((top[:, 0] >= 0).float().mean())
        mlp = train._agreement(head, data, target.embed, w, train.start_rows(data, docs, 3), 3, top)
        layer = eagle_agreement(eagle, data, stretches(data, docs, 512), target.embed, w, 3, top)
        print(f"{len(ids)} ids: covered {covered:.4f}, MLP head {mlp}, EAGLE layer {layer}", flush=True)


if __name__ == "__main__":
    main()
