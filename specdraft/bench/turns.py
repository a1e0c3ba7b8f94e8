"""``--turns N``: the bench's prompts as conversations, later turns after the baseline's answers.

Spec-Bench's MT-bench prompts have two user turns; the second asks about or reworks the first
answer ("rewrite your previous response..."), so it is a prompt that carries text the target wrote.
With ``--turns 2`` each such prompt is followed by a second item, question id ``"<id>#2"``, whose
prompt is the conversation so far through the chat template: turn 1, the answer, turn 2. The
answer is ``none``'s (decoded to text, as a chat client sends it back): every greedy method of ours
answers as ``none`` does, so this is the conversation each of them would have, and every method,
peers too, gets the same prompt, so their times and tokens compare item by item. Items run in order
(a conversation's turns one after the other), so the baseline has answered turn k before any
method needs turn k + 1. Each item's prompt is prefilled whole, as every bench prompt is.
"""
from __future__ import annotations

from dataclasses import replace

from .errors import BenchError
from .prompts import BenchPrompt
from .records import BASELINE, PromptRecord, aggregate, strip_eos

SEPARATOR = "#"  # "<question id>#<turn>" for turns after the first


def conversation_items(prompts: list[BenchPrompt], turns: int) -> tuple[list[BenchPrompt], dict]:
    """The items to time, each conversation's turns in order (at most ``turns`` of each), and for
    every later item (its id) -> (its first turn's prompt, its turn number)."""
    if turns < 1:
        raise BenchError(f"--turns must be at least 1, got {turns}")
    items, later = [], {}
    for p in prompts:
        items.append(p)
        for k, text in enumerate(p.later[:turns - 1], start=2):
            qid = f"{p.question_id}{SEPARATOR}{k}"
            items.append(replace(p, question_id=qid, text=text, later=()))
            later[qid] = (p, k)
    return items, later


class PromptIds(dict):
    """question id -> prompt token ids: first turns encoded up front, later turns on first use from
    the baseline's answers so far (``note`` each record as it is made)."""

    def __init__(self, speculator, prompts: list[BenchPrompt], later: dict, max_new_tokens: int):
        super().__init__((p.question_id, speculator.encode_prompt(p.text)) for p in prompts)
        self.speculator = speculator
        self.later = later
        self.max_new_tokens = max_new_tokens
        self.answers: dict = {}  # question id -> the baseline's tokens

    def note(self, record: PromptRecord) -> None:
        if record.method == BASELINE:
            self.answers[record.question_id] = record.token_ids

    def __missing__(self, qid):
        if qid not in self.later:
            raise KeyError(qid)
        first, k = self.later[qid]
        tok = self.speculator.tokenizer
        eos = self.speculator.target.eos_ids  # with --ignore-eos an answer runs past its end: the turn ends there
        messages = []
        for i in range(1, k):
            earlier = first.question_id if i == 1 else f"{first.question_id}{SEPARATOR}{i}"
            if earlier not in self.answers:
                raise BenchError(f"turn {k} of question {first.question_id} needs none's answer to turn {i}, "
                                 "which has not run")
            text = first.text if i == 1 else first.later[i - 2]
            messages += [{"role": "user", "content": text},
                         {"role": "assistant", "content": tok.decode(strip_eos(self.answers[earlier], eos),
                                                                     skip_special_tokens=True)}]
        messages.append({"role": "user", "content": first.later[k - 2]})
        ids = self.speculator.encode_messages(messages)
        limit = self.speculator.target.model.max_length
        if len(ids) + self.max_new_tokens > limit:
            raise BenchError(f"turn {k} of question {first.question_id} ({len(ids)} tokens) + max-new-tokens "
                             f"({self.max_new_tokens}) exceeds the context of {limit} tokens; raise --max-context "
                             "or use fewer --turns")
        self[qid] = ids
        return ids


def by_turn(records: list[PromptRecord], methods: list[str], later: dict) -> tuple[list[dict], list[str]]:
    """Rows per (method, "turn k") and each method's overall row, with speedups, and the turn labels;
    ([], []) when the run has first turns only."""
    def label(r: PromptRecord) -> str:
        return f"turn {later[r.question_id][1] if r.question_id in later else 1}"

    labelled = [replace(r, category=label(r)) for r in records]
    labels = sorted({r.category for r in labelled}, key=lambda c: int(c.split()[1]))
    if len(labels) < 2:
        return [], []
    return aggregate(labelled, methods, labels), labels
