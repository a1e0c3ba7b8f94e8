"""Suffix drafting (SuffixDecoding-style): a token tree of what followed the context's suffix
wherever it occurred before, the branches scored by how often each continuation was seen.

No model runs. The longest suffix n-gram of the context (n from ngram_max down to ngram_min)
is looked up in the context (the prompt plus every committed token); the continuations after
its most recent OCCURRENCES occurrences are merged into a trie, and each node's chance of
passing given its parent is how often the parent's occurrences went on with it; drafters.trie
ranks the nodes by calibrated chance and sizes the tree by the measured forward costs.

Example, k = 3: context ``a b x a b y a b`` -> suffix ``a b`` was followed by ``x a b`` and
``y a b``: a tree with two branches from the root, each 1/2 likely.
"""
from __future__ import annotations

import itertools
import threading

import torch

from .base import DrafterContext, register
from .trees import trie_of
from .trie import TrieProphet

OCCURRENCES = 16  # most recent matches merged into the tree


class History:
    """Token sequences of this process's requests (the server's history), for suffix drafting
    across requests: every suffix drafter keeps its sequence here as it grows (keyed by the
    drafter), and looks up its own suffix in the others. Oldest sequences go first beyond
    ``max_sequences``. Greedy output never depends on it; a seeded sampled output may (the
    drafts change which random draws verification makes), while its distribution does not."""

    def __init__(self, max_sequences: int = 64):
        self.max_sequences = max_sequences
        self._seqs: dict[int, torch.Tensor] = {}  # key -> [n] int64, in insertion order
        self._lock = threading.Lock()  # generations decoded together (specdraft.batch) draft on threads of their own

    def update(self, key: int, context: list[int]) -> None:
        seq = torch.tensor(context, dtype=torch.int64)
        with self._lock:
            self._seqs.pop(key, None)
            self._seqs[key] = seq
            while len(self._seqs) > self.max_sequences:
                del self._seqs[next(iter(self._seqs))]

    def others(self, key: int) -> list[torch.Tensor]:
        """The other sequences, newest first."""
        with self._lock:
            return [seq for k, seq in reversed(self._seqs.items()) if k != key]

    def clear(self) -> None:
        with self._lock:
            self._seqs.clear()


HISTORY = History()  # shared by the suffix drafters of one process
_KEYS = itertools.count()


def _matches(seq: torch.Tensor, gram: torch.Tensor) -> list[int]:
    """Start positions of what follows each occurrence of ``gram`` in seq, newest first (only
    occurrences followed by a token: a context's own suffix is not one of them)."""
    n, end = gram.numel(), seq.numel()
    if end - n < 1:
        return []
    windows = seq[:end - 1].unfold(0, n, 1)  # [end - n, n]
    hits = (windows == gram).all(-1).nonzero().flatten()
    return (hits + n).flip(0).tolist()


def found_continuations(context: list[int], depth: int, ngram_max: int, ngram_min: int,
                        occurrences: int = OCCURRENCES, others: list[torch.Tensor] = ()) -> list[list[int]]:
    """The continuations (up to ``depth`` tokens, at most ``occurrences`` of them) after the
    longest suffix n-gram's occurrences, in the context first (newest first) and then in
    ``others`` (earlier requests); [] when nothing matches."""
    n_ctx = len(context)
    if n_ctx < 2 or depth <= 0:
        return []
    ids = torch.tensor(context, dtype=torch.int64)
    for n in range(min(ngram_max, n_ctx - 1), ngram_min - 1, -1):
        gram = ids[n_ctx - n:]
        found = []
        for seq in [ids, *others]:
            for start in _matches(seq, gram):
                found.append(seq[start:start + depth].tolist())
                if len(found) >= occurrences:
                    return found
        if found:
            return found
    return []


def continuation_tree(context: list[int], depth: int, ngram_max: int, ngram_min: int,
                      occurrences: int = OCCURRENCES, others: list[torch.Tensor] = ()
                      ) -> tuple[list[int], list[int], list[float]]:
    """(tokens, parents, conditional) of the trie (trees.trie_of) of found_continuations."""
    return trie_of(found_continuations(context, depth, ngram_max, ngram_min, occurrences, others))


class SuffixTree(TrieProphet):
    name = "suffix"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 1, trees: bool = True):
        super().__init__(trees)
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.key = next(_KEYS)  # this drafter's sequence in HISTORY

    def continuations(self, context: list[int], depth: int) -> list[list[int]]:
        HISTORY.update(self.key, context)
        return found_continuations(context, depth, self.ngram_max, self.ngram_min, others=HISTORY.others(self.key))


@register("suffix")
def _build(ctx: DrafterContext) -> SuffixTree:
    return SuffixTree(ctx.spec.ngram_max, ctx.spec.ngram_min, trees=getattr(ctx.target, "supports_tree", False))
