"""Why a greedy method's tokens differ from the baseline's: a real error or a rounding near-tie.

At the first differing token, our target is rerun on the shared prefix and the gap between its two
largest logits there is reported; a gap above ``--tie-gap`` cannot be explained by rounding
(bf16 vs fp32, a block forward vs a one-token forward) and gets a warning line.
"""
from __future__ import annotations

import torch

from .records import BASELINE, PromptRecord

DEFAULT_TIE_GAP = 0.1  # logits; bf16 rounding moves logits by a few hundredths on our models


def logit_gaps(model, context: list[int], token: int | None, eos_ids: set[int]) -> tuple[float, float | None]:
    """Our target's top-2 logit gap after ``context``, and how far ``token`` (None = EOS) trails the top."""
    model.reset()
    logits = model.forward(torch.tensor(context, dtype=torch.int64), last_only=True).logits[-1]
    model.reset()
    top = torch.topk(logits, 2).values
    choices = [token] if token is not None else sorted(eos_ids)
    best_choice = max(float(logits[t]) for t in choices) if choices else None
    trail = None if best_choice is None else float(top[0]) - best_choice
    return float(top[0] - top[1]), trail


def analyse_mismatches(records: list[PromptRecord], prompt_ids: dict, target, tie_gap: float, warn) -> list[dict]:
    """One entry per mismatching (method, prompt), with the logit gaps at the divergence."""
    baseline = {r.question_id: r.token_ids for r in records if r.method == BASELINE}
    found = []
    gaps: dict[tuple, tuple[float, float | None]] = {}  # methods often diverge at the same place; a prefill each is slow
    for r in records:
        if r.exact is not False:
            continue
        ref, i = baseline[r.question_id], r.mismatch_at
        base_tok = ref[i] if i < len(ref) else None  # None: the sequence ended there (EOS)
        method_tok = r.token_ids[i] if i < len(r.token_ids) else None
        key = (r.question_id, i, method_tok)
        if key not in gaps:
            gaps[key] = logit_gaps(target.model, prompt_ids[r.question_id] + ref[:i], method_tok, target.eos_ids)
        gap, trail = gaps[key]
        entry = dict(method=r.method, question_id=r.question_id, category=r.category, index=i,
                     baseline_token=base_tok, method_token=method_tok, top2_gap=gap, method_token_gap=trail,
                     near_tie=gap < tie_gap)
        found.append(entry)
        if not entry["near_tie"]:
            warn(f"{r.method} diverges from none on question {r.question_id} at token {i}: top-2 logit gap "
                 f"{gap:.3f} >= {tie_gap} is not a rounding tie (its token trails the top by "
                 f"{'?' if trail is None else f'{trail:.3f}'})")
    return found
