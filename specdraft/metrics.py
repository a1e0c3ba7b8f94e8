"""Speculation statistics, filled the same way by every method."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpecStats:
    method: str
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of them, held in the target's cache from the previous generation (not prefilled)
    new_tokens: int = 0  # tokens committed (the first one comes from the prefill)
    target_forwards: int = 0  # decode/verify forwards of the target after the prefill
    drafts: int = 0  # verifications that had a non-empty draft
    draft_tokens: int = 0  # draft tokens proposed, over all drafts
    accepted_tokens: int = 0  # draft tokens accepted
    step_tokens: int = 0  # tokens committed by decode/verify forwards (accepted + recovered/bonus)
    proposed_per_position: list[int] = field(default_factory=list)  # [i]: drafts with a token at i
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts whose token i passed
    time_prefill: float = 0.0  # seconds
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0

    def record_step(self, proposed: int, accepted: int, committed: int) -> None:
        """One target forward that checked ``proposed`` draft tokens and committed ``committed``."""
        self.target_forwards += 1
        self.step_tokens += committed
        if proposed:
            self.drafts += 1
            self.draft_tokens += proposed
            self.accepted_tokens += accepted
            grow = proposed - len(self.proposed_per_position)
            if grow > 0:
                self.proposed_per_position += [0] * grow
                self.accepted_per_position += [0] * grow
            for i in range(proposed):
                self.proposed_per_position[i] += 1
            for i in range(accepted):
                self.accepted_per_position[i] += 1

    @classmethod
    def merged(cls, runs: list[SpecStats]) -> SpecStats:
        """The statistics of several generations taken together (counts, positions and times summed;
        the method the first one's, or "mixed")."""
        methods = {r.method for r in runs}
        total = cls(method=runs[0].method if len(methods) == 1 else "mixed")
        for r in runs:
            for name in ("prompt_tokens", "cached_prompt_tokens", "new_tokens", "target_forwards", "drafts",
                         "draft_tokens", "accepted_tokens", "step_tokens", "time_prefill", "time_draft",
                         "time_verify", "time_total"):
                setattr(total, name, getattr(total, name) + getattr(r, name))
            for name in ("proposed_per_position", "accepted_per_position"):
                mine, theirs = getattr(total, name), getattr(r, name)
                setattr(total, name, [a + b for a, b in zip(mine + [0] * (len(theirs) - len(mine)),
                                                            theirs + [0] * (len(mine) - len(theirs)))])
        return total

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens per target forward, counting the recovered/bonus token (1.0 for plain decoding)."""
        return self.step_tokens / self.target_forwards if self.target_forwards else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_per_position, self.proposed_per_position)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, mean_accepted_tokens=self.mean_accepted_tokens,
                 acceptance_rate=self.acceptance_rate, acceptance_by_position=self.acceptance_by_position)
        return d

    def summary(self) -> str:
        """One line for the terminal."""
        line = (f"{self.new_tokens} tokens in {self.time_total:.2f} s ({self.tokens_per_s:.2f} tok/s) | "
                f"{self.method} | {self.target_forwards} target forwards, "
                f"{self.mean_accepted_tokens:.2f} tokens/forward")
        if self.draft_tokens:
            line += (f" | acceptance {self.acceptance_rate:.0%} of {self.draft_tokens} drafted"
                     f" | draft {self.time_draft:.2f} s, verify {self.time_verify:.2f} s")
        return line
