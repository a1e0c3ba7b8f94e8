"""A prophet whose guesses are a trie of continuations seen elsewhere: what followed the
context's suffix in the context itself and earlier requests (drafters.suffix), or in a datastore
of text (drafters.retrieval). Subclasses say where the continuations come from; this class turns
them into the draft.

Each trie node's chance of passing given its parent is how often the parent's occurrences went
on with it, calibrated online by costs.PassRates; a node's chance of being on the accepted path
is the product along its branch, by which the engine's policy sends the likeliest nodes that pay
for their check (policy.DraftPolicy). A target without tree masks gets the likeliest branch as
a chain.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..config import SamplingConfig
from .base import Draft, RatedGuesses
from .trees import best_branch, trie_of


class TrieProphet(RatedGuesses, ABC):
    def __init__(self, trees: bool = True):
        super().__init__()  # rates: a node's share of its parent's occurrences -> how often such nodes passed
        self.trees = trees  # False: the best branch only, as a chain (a target without tree masks)

    @abstractmethod
    def continuations(self, context: list[int], depth: int) -> list[list[int]]:
        """Token lists (up to ``depth`` tokens each) that may follow ``context``, one per
        occurrence found; [] when nothing matches."""

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        tokens, parents, cond = trie_of(self.continuations(context, k))
        if not tokens:
            return Draft()
        chance = []  # P(node on the accepted path) = product of calibrated chances along its branch
        for j, c in enumerate(cond):
            up = 1.0 if parents[j] < 0 else chance[parents[j]]
            chance.append(up * self.rates.rate(c))
        if not self.trees:  # the likeliest branch, as a chain
            branch = best_branch(parents, chance)
            self.proposed = [cond[j] for j in branch]
            return Draft([tokens[j] for j in branch], chances=[chance[j] for j in branch])
        self.proposed = cond
        return Draft(tokens, parents=parents, chances=chance)

