"""Prompt prefix reuse: the target's KV cache kept from one generation to the next.

A chat sends its whole conversation with every turn; without reuse each turn prefills all of it
again (at ~380 prompt tokens/s on 2 cores, seconds per turn of a long chat). The cache rolls back
by length, so a new prompt that starts with what the cache holds needs only its new tail run.

:class:`PrefixCache` records what one target's cache holds after a generation: the token ids of
its positions [L] and, when the drafter read the target's features, their feature rows [L, F]
(a feature drafter's ``take_features`` then gets the same rows a whole prefill gives it). The
record holds while nothing else used the target: every other user starts with ``reset()``, which
counts in the model's ``resets``; a record made before the latest reset, or for another cache
length, is not used.

Output is unchanged by reuse: the runtime's rows do not depend on the block they are computed in
(tests/test_batch_invariance.py), the guarantee that keeps speculation exact, so a prompt
prefilled as cached prefix + tail gives the logits and features of a whole prefill. Reuse is
opt-in (the server turns it on): the bench prefills every prompt whole, as its peers do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Held:
    """What the cache holds: ids [L], feature rows [L, F] or None, the taps they came with, and
    the model's reset count and length when recorded."""

    ids: tuple[int, ...]
    features: torch.Tensor | None
    taps: tuple[int, ...]
    resets: int
    length: int


class PrefixCache:
    """The record of one target's cache contents across generations."""

    def __init__(self, target):
        self.target = target
        self.held: Held | None = None

    def reusable(self, prompt: list[int], features: bool, taps: tuple[int, ...]) -> int:
        """Positions of ``prompt`` the cache already holds, at most len(prompt) - 1 (the last
        prompt token is always run: its logits choose the first new token); 0 when the record is
        stale or lacks the feature rows this drafter needs."""
        h = self.held
        t = self.target
        if h is None or h.resets != getattr(t, "resets", None) or h.length != t.length:
            return 0
        if features and (h.features is None or h.taps != taps):
            return 0
        n, limit = 0, min(len(h.ids), len(prompt) - 1)
        while n < limit and h.ids[n] == prompt[n]:
            n += 1
        return n

    def features(self, n: int) -> torch.Tensor:
        """The first ``n`` recorded feature rows [n, F] (reusable() vouched for them)."""
        assert self.held is not None and self.held.features is not None
        return self.held.features[:n]

    def record(self, ids: list[int], features: torch.Tensor | None, taps: tuple[int, ...]) -> None:
        """The cache now holds ``ids`` (its length must say so: otherwise nothing is kept)."""
        t = self.target
        if len(ids) != t.length or (features is not None and features.shape[0] != len(ids)):
            self.held = None
            return
        self.held = Held(tuple(ids), features, taps, getattr(t, "resets", 0), t.length)

    def clear(self) -> None:
        self.held = None
