"""A wider MLP head that starts exactly as the shipped one, fine-tuned on an answer set:
python scripts/widen_head.py INNER ANSWERS.pt OUT_DIR

The shipped head's inner units are copied; the new ones get random w1 rows and zero w2 columns, so
the wider head computes what the shipped one does until training moves it. Then the shipped
head's last recipe (2 epochs, lr 3e-4, soft labels 0.5, 5% of the documents held out, its taps and
16,384 listed ids). Judge it with scripts/heldout_agreement.py.
"""
from __future__ import annotations

import json
import sys

import torch

from specdraft.drafters.feature_head import output_weight
from specdraft.heads import train
from specdraft.heads.data import FeatureSet
from specdraft.heads.model import load_head, shipped_head_dir
from specdraft.models.registry import DEFAULT_TARGET
from specdraft.pipeline import Speculator


def widen(head, init) -> None:
    """Copy ``init`` (inner D) into ``head`` (inner >= D): its units first, new w2 columns at zero."""
    D = init.cfg.inner
    mine = head.state_dict()
    with torch.no_grad():
        for k, v in init.state_dict().items():
            p = mine[k]
            if k == "w1.weight":
                p[:D].copy_(v)
                p[D:].normal_(0, float(v.std()))
            elif k == "w1.bias":
                p[:D].copy_(v)
                p[D:].zero_()
            elif k == "w2.weight":
                p[:, :D].copy_(v)
                p[:, D:].zero_()
            else:
                p.copy_(v)


def main() -> None:
    inner, answers, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    sd = Speculator(DEFAULT_TARGET, dtype="fp32", runtime="native", load_draft=False)
    target = sd.target.model
    shipped = load_head(shipped_head_dir(DEFAULT_TARGET))
    train.start_from = widen  # train_head starts its head from ``init`` through this
    ids = shipped.token_ids()
    cfg = train.TrainConfig(inner=inner, vocab=len(ids), epochs=2, lr=3e-4, holdout=0.05, soft_labels=0.5,
                            taps=shipped.cfg.taps)
    head, report = train.train_head(FeatureSet.load(answers), target.embed, output_weight(target, ids), cfg,
                                    init=shipped, vocab_ids=ids)
    head.save(out)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
