"""Prompt prefix reuse: the target's KV cache kept from one generation to the next.

A chat sends its whole conversation with every turn; without reuse each turn prefills all of it
again (at ~380 prompt tokens/s on 2 cores, seconds per turn of a long chat). The cache rolls back
by length, so a new prompt that starts with what the cache holds needs only its new tail run.

:class:`PrefixCache` records what one target's cache holds after a generation (the *live*
prefix): the token ids of its positions [L] and, when the drafter read the target's features,
their feature rows [L, F] (a feature drafter's ``take_features`` then gets the same rows a whole
prefill gives it). Before a prompt cuts the live prefix short (another conversation's turn), a
copy of its cache rows is saved (``snapshot()``, where the model has one), so that conversations
taking turns each find theirs again; saved prefixes are dropped oldest first past ``budget_bytes``.

The live record holds while nothing else used the target: the model's ``epoch`` counts every
reset, forward and restore, and a record made at another epoch, or for another cache length, is
not used (saved copies stay valid: they are copies). So several records (one per bench method)
may share one target safely.

Output is unchanged by reuse: the runtime's rows do not depend on the block they are computed in
(tests/test_batch_invariance.py), the guarantee that keeps speculation exact, so a prompt
prefilled as kept prefix + tail gives the logits and features of a whole prefill, and a restored
copy is the same bits. Reuse is opt-in (the server turns it on; the bench prefills every prompt
whole unless --reuse-prefix). Only a target whose rows are known to be block-independent reuses
(:func:`reuses_exactly`); on any other the output could move by a rounding, so it prefills whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_BUDGET = 1 << 30  # bytes of saved prefixes (the default target's cache: ~57 KB a position in fp32)
# a live prefix is saved when a prompt would cut at least this many of its positions: a chat's own
# next turn cuts a few (its answer comes back as text, whose tokens may differ near the end), and
# a few positions prefill again faster than the copy of a whole conversation is made
MIN_SAVED_CUT = 64
# weight formats whose fp32 rows do not depend on their block (tests/test_batch_invariance.py);
# torch's dense matmuls pick kernels by row count, and transformers' models are not tested so
ROW_EXACT_FORMATS = ("gguf", "q4k", "w8a8", "w8a8-fast")


def shared_prefix(held, prompt: list[int]) -> int:
    """Positions of ``prompt`` a cache holding the tokens ``held`` can keep: their common prefix, at
    most len(prompt) - 1 (the last prompt token is always run: its logits choose the next token)."""
    n, limit = 0, min(len(held), len(prompt) - 1)
    while n < limit and held[n] == prompt[n]:
        n += 1
    return n


def reuses_exactly(model) -> bool:
    """Whether a kept prefix plus a prefilled tail give ``model`` a whole prefill's bits."""
    return getattr(model, "weight_format", None) in ROW_EXACT_FORMATS and getattr(model, "dtype", None) == torch.float32


@dataclass(frozen=True)
class Held:
    """A prefix: ids [L], feature rows [L, F] or None and the taps they came with, and (saved
    ones) the copy of its cache rows."""

    ids: tuple[int, ...]
    features: torch.Tensor | None
    taps: tuple[int, ...]
    kv: object = None  # the model's snapshot(); None for the live prefix, which is in the cache itself

    def shared(self, prompt: list[int]) -> int:
        return shared_prefix(self.ids, prompt)

    def serves(self, features: bool, taps: tuple[int, ...]) -> bool:
        return not features or (self.features is not None and self.taps == taps)

    @property
    def nbytes(self) -> int:
        tensors = [*(self.kv[0] if self.kv else ()), *(self.kv[1] if self.kv else ())]
        if self.features is not None:
            tensors.append(self.features)
        return sum(t.numel() * t.element_size() for t in tensors)


class PrefixCache:
    """What one target's cache holds across generations, and copies of earlier prefixes."""

    def __init__(self, target, budget_bytes: int = DEFAULT_BUDGET, min_cut: int = MIN_SAVED_CUT,
                 eager: bool = False, saved: list[Held] | None = None):
        """``eager``: save a copy after every generation, not only when a prompt of this record's
        would cut the live prefix: for several records on one target (the bench keeps one a method),
        where another record's generation overwrites the cache without this one seeing it.
        ``saved``: another record's saved copies, shared (answers decoded together find and leave
        copies among the server's own: specdraft.batch)."""
        self.target = target
        self.budget = budget_bytes
        self.min_cut = min_cut
        self.eager = eager
        self.live: Held | None = None
        self._stamp: tuple[int, int] | None = None  # the model's (epoch, length) when live was recorded
        self.saved: list[Held] = saved if saved is not None else []  # oldest first (changed in place only)
        self.can_save = hasattr(target, "snapshot") and budget_bytes > 0

    def prepare(self, prompt: list[int], features: bool, taps: tuple[int, ...]) -> tuple[int, torch.Tensor | None]:
        """Put the prefix that holds most of ``prompt`` into the target's cache and return
        (positions kept, their feature rows [n, F] when ``features``); (0, None) when none does:
        the caller rolls the cache back to the count, or resets it at 0. Until record(), nothing
        is live."""
        live = self.live if self._live_valid() else None
        best, n = None, 0
        for held in ([live] if live is not None else []) + self.saved[::-1]:
            m = held.shared(prompt) if held.serves(features, taps) else 0
            if m > n:
                best, n = held, m
        if live is not None and self.can_save and len(live.ids) - (n if best is live else 0) >= self.min_cut:
            self._save(live)  # this prompt cuts it short: keep a copy for its conversation's next turn
        if best is not None and best is not live:
            self.target.restore(best.kv, n)  # the rows this prompt keeps
            self.saved.remove(best)
            self.saved.append(best)  # the most recently used last
        self.live, self._stamp = None, None
        rows = best.features[:n] if best is not None and features else None
        return n, rows

    def record(self, ids: list[int], features: torch.Tensor | None, taps: tuple[int, ...]) -> None:
        """The cache now holds ``ids`` (its length must say so: otherwise nothing is kept)."""
        t = self.target
        if len(ids) != t.length or (features is not None and features.shape[0] != len(ids)):
            return
        self.live = Held(tuple(ids), features, taps)
        self._stamp = (getattr(t, "epoch", None), t.length)
        if self.eager and self.can_save and len(ids) >= self.min_cut:
            self._save(self.live)

    def save_live(self) -> None:
        """Keep a copy of the live prefix among the saved ones (where it is long enough), so that
        generations on other caches find it too (answers decoded together: specdraft.batch)."""
        if self._live_valid() and self.can_save and len(self.live.ids) >= self.min_cut:
            self._save(self.live)

    def _live_valid(self) -> bool:
        t = self.target
        return self.live is not None and self._stamp == (getattr(t, "epoch", None), t.length) \
            and self._stamp[0] is not None

    def _save(self, live: Held) -> None:
        """A copy of the live prefix's cache rows joins the saved ones, replacing those it extends."""
        held = Held(live.ids, live.features, live.taps, self.target.snapshot())
        self.saved[:] = [h for h in self.saved if not (h.ids == held.ids[:len(h.ids)] and (
            h.features is None or (held.features is not None and h.taps == held.taps)))]
        self.saved.append(held)
        while self.saved and sum(h.nbytes for h in self.saved) > self.budget:
            self.saved.pop(0)
