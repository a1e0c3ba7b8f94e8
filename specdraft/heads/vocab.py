"""A drafter's vocabulary: the target token ids its guesses come from.

A drafting head scores its guesses with rows of the target's output head; reading all 151,936 of
them would cost a step more than the rest of the head, so a head reads V' of them. The first V'
ids (BPE's earliest merges, mostly frequent) leave out many of the target's actual choices: on
its own answers only 91.5% of them are among the first 32,768 ids. A frequency-ranked vocabulary
(FR-Spec; EAGLE-3's draft vocabulary with its d2t / t2d maps) takes the ids the target chose most
often in the training features instead, then the lowest ids not yet taken (BPE order stands in
for frequency where counts run out): 97.6% of held-out choices within 32,768 ids.
"""
from __future__ import annotations

import torch


def choice_counts(top: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size] int64: how often each id is the target's choice, over ``top`` [N, TOP] (a
    FeatureSet's candidates, its choice first)."""
    return torch.bincount(top[:, 0].long(), minlength=vocab_size)[:vocab_size]


def frequent_ids(counts: torch.Tensor, size: int) -> torch.Tensor:
    """[size] int64 ascending: the ``size`` ids with the most counts, ties (and ids never counted)
    going to the lowest ids."""
    V = len(counts)
    size = min(size, V)
    # counts first, then a lower id: both in one int64 key (counts < 2**40 here)
    key = counts.long() * V + (V - 1 - torch.arange(V))
    return key.topk(size).indices.sort().values


def filled_ids(frequent: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """[min(size, vocab_size)] int64 ascending: the ids ``frequent`` lists (below vocab_size; a
    trained drafter's vocabulary: the target's most frequent choices), then the lowest others."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    counts[frequent[(frequent >= 0) & (frequent < vocab_size)].long()] = 1
    return frequent_ids(counts, size)


def first_ids(size: int) -> torch.Tensor:
    return torch.arange(size)


def draft_index(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size] int64: each target id's place in ``ids`` (the draft index), -1 where absent
    (EAGLE-3's t2d, with places instead of booleans)."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.int64, device=ids.device)
    t2d[ids] = torch.arange(len(ids), device=ids.device)
    return t2d


def to_target(ids: torch.Tensor | None, index: int, q: torch.Tensor | None, width: int) -> tuple[int, torch.Tensor | None]:
    """A guess's draft index as the target's token id, and its distribution q [V'] put on the
    target's ``width`` ids (zero outside the listed ``ids``), as the verifier reads them; ``ids``
    None: the first V' ids, index and q as they are."""
    if ids is None:
        return index, q
    if q is not None:
        q = torch.zeros(width, dtype=q.dtype).index_copy_(0, ids, q)
    return int(ids[index]), q


def as_draft_indices(cand: torch.Tensor, vocab: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Target ids ``cand`` [...] as draft indices: for the first ``vocab`` ids (``ids`` None)
    themselves, else their place in ``ids``; -1 outside the vocabulary."""
    if ids is None:
        return cand.masked_fill(cand >= vocab, -1)
    return draft_index(ids, max(int(cand.max()), int(ids.max())) + 1)[cand]


class ListedVocab:
    """For a drafting module whose config has ``vocab`` and ``listed_vocab``: the buffer
    ``vocab_ids`` [vocab] (saved with the weights) when the ids are listed, and ``token_ids()``."""

    def init_vocab(self) -> None:
        if self.cfg.listed_vocab:
            self.register_buffer("vocab_ids", torch.arange(self.cfg.vocab))

    def token_ids(self) -> torch.Tensor:
        """[vocab] int64: the target ids the module guesses among, in the order of its scores."""
        return self.vocab_ids if self.cfg.listed_vocab else first_ids(self.cfg.vocab)
