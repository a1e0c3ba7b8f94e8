"""What each generation produced, marked against the baseline, and summed per method and category.

:class:`Outcome` is what every runner (our engine, a transformers peer, llama.cpp) returns for one
prompt; :class:`PromptRecord` adds the prompt and the time; :func:`mark_exactness` compares each
record's tokens with the baseline's; :func:`aggregate` turns the records into the report's rows.
A count a method cannot tell is None, and any sum that includes one is None too: never a made-up
number.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .prompts import BenchPrompt

BASELINE = "none"  # plain decoding by our runtime: speedups and exactness are measured against it


@dataclass
class Outcome:
    """What one generation produced, in the fields every method can fill (None = not known)."""

    token_ids: list[int]  # new tokens, EOS excluded (with --ignore-eos: every token, EOS and what follows it)
    target_forwards: int | None
    step_tokens: int | None  # tokens committed by those forwards
    drafted: int | None
    accepted: int | None
    prefill_seconds: float | None = None  # only our engine times its prefill separately
    draft_seconds: float | None = None  # our engine: time its drafter spent proposing
    check_seconds: float | None = None  # our engine: time in the target's forwards after the prefill and their verdicts


Runner = Callable[[list[int], int], Outcome]  # (prompt ids, max new tokens) -> outcome


def stop_ids(eos_ids, ignore_eos: bool) -> set[int]:
    """The ids where a peer's answer ends: its EOS ids, none with --ignore-eos."""
    return set() if ignore_eos else set(eos_ids)


def strip_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """The tokens before the first of ``eos_ids`` (generate may pad after it; our engine stops there
    unless told to ignore EOS, and then the runners pass no ids: stop_ids)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i]
    return tokens


@dataclass
class PromptRecord:
    """One (method, prompt) generation. None = the method cannot tell (never a made-up number)."""

    method: str
    question_id: int | str
    category: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    target_forwards: int | None
    step_tokens: int | None
    drafted: int | None
    accepted: int | None
    prefill_seconds: float | None = None  # part of seconds (our engine only)
    draft_seconds: float | None = None  # part of seconds: the drafter proposing (our engine only)
    check_seconds: float | None = None  # part of seconds: target forwards after the prefill, verdicts (our engine only)
    token_ids: list[int] = field(default_factory=list)
    exact: bool | None = None  # token ids equal the baseline's
    mismatch_at: int | None = None  # first differing index

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 else None

    @property
    def mean_accepted_tokens(self) -> float | None:
        return ratio(self.step_tokens, self.target_forwards)

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted, self.drafted)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, mean_accepted_tokens=self.mean_accepted_tokens,
                 acceptance_rate=self.acceptance_rate)
        return d


def make_record(method: str, prompt: BenchPrompt, ids: list[int], outcome: Outcome, seconds: float) -> PromptRecord:
    return PromptRecord(method, prompt.question_id, prompt.category, len(ids), len(outcome.token_ids), seconds,
                        outcome.target_forwards, outcome.step_tokens, outcome.drafted, outcome.accepted,
                        outcome.prefill_seconds, outcome.draft_seconds, outcome.check_seconds,
                        list(outcome.token_ids))


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def sum_known(recs: list, name: str) -> int | None:
    """The sum of a field over records, or None when any record lacks it (a partial sum would mislead)."""
    values = [getattr(r, name) for r in recs]
    return None if any(v is None for v in values) else sum(values)


# ---------------------------------------------------------------------------- exactness
def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first difference (a shorter sequence differs where it ended), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # lengths may differ: see the return
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def mark_exactness(records: list[PromptRecord]) -> None:
    """Set each record's ``exact`` and ``mismatch_at`` against the baseline's tokens on its prompt."""
    baseline = {r.question_id: r.token_ids for r in records if r.method == BASELINE}
    for r in records:
        if r.question_id in baseline:
            r.mismatch_at = first_mismatch(baseline[r.question_id], r.token_ids)
            r.exact = r.mismatch_at is None


# ---------------------------------------------------------------------------- aggregation
def summarise(method: str, category: str, recs: list[PromptRecord]) -> dict:
    new_tokens = sum(r.new_tokens for r in recs)
    seconds = sum(r.seconds for r in recs)
    prefill = sum_known(recs, "prefill_seconds")
    forwards = sum_known(recs, "target_forwards")
    return dict(
        method=method, category=category,
        tokens_per_s=ratio(new_tokens, seconds),
        speedup=None,  # filled once the baseline's row is known
        decode_tokens_per_s=None if prefill is None else ratio(new_tokens - len(recs), seconds - prefill),
        decode_speedup=None,
        mean_accepted_tokens=ratio(sum_known(recs, "step_tokens"), forwards),
        # where a step's time goes: what drafting costs a forward against what the check costs
        draft_ms_per_forward=ratio(_ms(sum_known(recs, "draft_seconds")), forwards),
        check_ms_per_forward=ratio(_ms(sum_known(recs, "check_seconds")), forwards),
        acceptance_rate=ratio(sum_known(recs, "accepted"), sum_known(recs, "drafted")),
        exact_match_rate=(None if any(r.exact is None for r in recs)
                          else sum(r.exact for r in recs) / len(recs)),
        prompts=len(recs), new_tokens=new_tokens, seconds=seconds,
        target_forwards=forwards,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def aggregate(records: list[PromptRecord], methods: list[str], categories: list[str]) -> list[dict]:
    """Rows per (method, category) plus each method's ``overall`` row, with speedups vs the baseline."""
    rows = []
    for method in methods:
        mine = [r for r in records if r.method == method]
        for category in categories:
            recs = [r for r in mine if r.category == category]
            if recs:
                rows.append(summarise(method, category, recs))
        if mine:
            rows.append(summarise(method, "overall", mine))
    base = {row["category"]: row for row in rows if row["method"] == BASELINE}
    for row in rows:
        ref = base.get(row["category"], {})
        row["speedup"] = ratio(row["tokens_per_s"], ref.get("tokens_per_s"))
        row["decode_speedup"] = ratio(row["decode_tokens_per_s"], ref.get("decode_tokens_per_s"))
    return rows
