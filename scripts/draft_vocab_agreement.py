"""How often the draft model picks the target's next token when its logits cover only some ids:

    python scripts/draft_vocab_agreement.py BENCH_JSON [--method none]

Teacher-forced over the answers a bench report holds (BENCH_JSON's generations by --method): the
target's argmax at every position against the draft model's (Q4_K, every id scored once) argmax
over each id set: every id, the first N, the shipped head's listed ids (the target's most frequent
choices in its own answers) and those then the lowest others up to N. Prints, per set, the share
of the target's choices it holds and the draft's agreement with the target.
"""
from __future__ import annotations

import torch
from draft_skip_agreement import report_answers  # scripts/ is on the path of a script run from it

from specdraft.drafters.self_draft import greedy_choices
from specdraft.heads.model import shipped_frequent_ids
from specdraft.heads.vocab import filled_ids
from specdraft.pipeline import DEFAULT_TARGET


def main() -> None:
    _, seqs, target, draft_with = report_answers(__doc__.splitlines()[0])
    draft = draft_with(None)
    V = draft.vocab_size
    frequent = shipped_frequent_ids(DEFAULT_TARGET)
    sets = {"every id": torch.arange(V), f"shipped head's {len(frequent)}": frequent}
    for n in (16384, 24576, 32768, 40960, 49152):
        sets[f"first {n}"] = torch.arange(n)
        if n > len(frequent):
            sets[f"head's, then lowest, {n}"] = filled_ids(frequent, V, n)
    masks = {}
    for name, ids in sets.items():
        masks[name] = torch.full((V,), float("-inf"))
        masks[name][ids] = 0.0
    held, agree, total = dict.fromkeys(sets, 0), dict.fromkeys(sets, 0), 0
    for s in seqs:
        want = greedy_choices(target, s)
        draft.reset()
        logits = draft.forward(s).logits.float().reshape(len(s), -1)[:, :V]
        draft.reset()
        for name, m in masks.items():
            agree[name] += int(((logits + m).argmax(-1) == want).sum())
            held[name] += int((m[want] == 0).sum())
        total += len(s)
    print(f"{total} positions of {len(seqs)} answers")
    for name in sorted(sets, key=lambda k: len(sets[k])):
        print(f"{name:32s} {len(sets[name]):7d} ids  holds {held[name] / total:.4f}  agrees {agree[name] / total:.4f}")


if __name__ == "__main__":
    main()
