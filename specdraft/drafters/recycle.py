"""Token Recycling (Luo et al., 2024): the target's own runners-up as the prophet, nothing trained.

Every check already ranks the whole vocabulary at every row: the target's K likeliest next
tokens after that row's token, of which the verifier uses one. This drafter keeps them
(``take_topk``, every row of every check, rejected branches included: each is still the
target's view of what follows that token) in an adjacency table, token -> its latest K
followers, kept across the requests of the process. A draft is the tree reached from the newest
committed token through the table, grown best first: a node's chance is its parent's times the
measured pass rate of a guess at its depth and rank (costs.KeyRates, learnt from the verifier's
verdicts), so the engine's policy sends the likeliest nodes that pay for their check.

Example: the table says 7 -> [3, 9], 3 -> [4]; with context [..., 7] the tree is 7 -> (3 -> 4, 9)
while those rates make each node's chance worth growing.

Guesses are deterministic (one-hot for the verifier): greedy output is the target's and sampling
keeps its distribution. A target without tree masks gets the likeliest branch as a chain.
"""
from __future__ import annotations

import heapq

import torch

from ..config import SamplingConfig
from ..costs import KeyRates
from .base import Draft, Drafter, DrafterContext, register
from .trees import MIN_CHANCE, best_branch

TOPK = 8  # followers kept per token (the paper's k)
NODES = 64  # nodes grown a step at most; the policy sends the ones that pay
DEEPEST_RATE = 6  # guesses deeper than this share its pass rates


def _prior(key: tuple[int, int]) -> float:
    """A guess of rank r starts at 0.3 / (r + 1): the target's first choice passes most often."""
    return 0.3 / (key[1] + 1)


class Recycle(Drafter):
    name = "recycle"
    output_topk = TOPK

    def __init__(self, topk: int = TOPK, nodes: int = NODES, trees: bool = True):
        if topk < 1 or nodes < 1:
            raise ValueError("recycle needs topk >= 1 and nodes >= 1")
        self.output_topk, self.nodes, self.trees = topk, nodes, trees
        self.follow: dict[int, list[int]] = {}  # token -> the target's latest top-k after it
        self.rates = KeyRates(_prior)  # (depth, rank) -> pass rate given the parent passed
        self.keys: list[tuple[int, int]] = []  # per node proposed last: its rate's key

    def take_topk(self, ids: list[int], top: torch.Tensor) -> None:
        for tok, row in zip(ids, top.tolist()):
            self.follow[tok] = row

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        chance: list[float] = []
        depths: list[int] = []
        self.keys = []
        # candidates: (-chance, order, parent, key, token); a node's children enter once it is in
        heap: list[tuple[float, int, int, tuple[int, int], int]] = []
        order = 0

        def offer(parent: int, up: float, depth: int) -> None:
            nonlocal order
            after = context[-1] if parent < 0 else tokens[parent]
            for rank, tok in enumerate(self.follow.get(after, ())):
                key = (min(depth, DEEPEST_RATE), rank)
                heapq.heappush(heap, (-up * self.rates.rate(key), order, parent, key, tok))
                order += 1

        if k > 0:
            offer(-1, 1.0, 1)
        while heap and len(tokens) < self.nodes:
            neg, _, parent, key, tok = heapq.heappop(heap)
            if -neg < MIN_CHANCE:
                break
            tokens.append(tok)
            parents.append(parent)
            chance.append(-neg)
            self.keys.append(key)
            depth = 1 if parent < 0 else depths[parent] + 1
            depths.append(depth)
            if depth < k:
                offer(len(tokens) - 1, -neg, depth + 1)
        if not self.trees and tokens:  # the likeliest branch, as a chain
            kept = best_branch(parents, chance)
            self.keys = [self.keys[j] for j in kept]
            return Draft([tokens[j] for j in kept], chances=[chance[j] for j in kept])
        return Draft(tokens, parents=parents if tokens else None, chances=chance)

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        for j, passed in judged:
            if j < len(self.keys):
                self.rates.record(self.keys[j], passed)
        self.keys = []


@register("recycle")
def _build(ctx: DrafterContext) -> Recycle:
    return Recycle(trees=getattr(ctx.target, "supports_tree", False))
