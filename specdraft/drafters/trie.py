"""A prophet whose guesses are a trie of continuations seen elsewhere: what followed the
context's suffix in the context itself and earlier requests (drafters.suffix), or in a datastore
of text (drafters.retrieval). Subclasses say where the continuations come from; this class turns
them into the draft.

Each trie node's chance of passing given its parent is how often the parent's occurrences went
on with it, calibrated online by costs.PassRates; a node's chance of being on the accepted path
is the product along its branch. The nodes are ranked by it and the engine's measured forward
costs pick how many to send (costs.ForwardCosts.choose_length: expected committed tokens per unit
of cost). Without measured costs (cost_rule off) the draft keeps its k most likely nodes. A
target without tree masks gets the likeliest branch as a chain.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..config import SamplingConfig
from .base import Draft
from .cost_aware import CostAware
from .trees import best_branch, best_nodes, judged_confidences, keep_nodes, sent_nodes, trie_of


class TrieProphet(CostAware, ABC):
    def __init__(self, trees: bool = True):
        super().__init__()
        self.trees = trees  # False: the best branch only, as a chain (a target without tree masks)
        self.proposed: tuple[list[int], list[int], list[float]] | None = None  # tokens, parents, conditional chances

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
        keep = best_nodes(chance, len(tokens)) if self.trees else best_branch(parents, chance)
        kept = sent_nodes(keep, chance, k, self.costs)
        sent_tokens, sent_parents = keep_nodes(tokens, parents, kept)
        self.proposed = (sent_tokens, sent_parents, [cond[j] for j in kept])
        return Draft(sent_tokens, parents=sent_parents, chances=[chance[j] for j in kept])

    def observe(self, context: list[int], num_accepted: int) -> None:
        if self.proposed is not None:
            self.rates.record(judged_confidences(*self.proposed, context, num_accepted), num_accepted)
        self.proposed = None

