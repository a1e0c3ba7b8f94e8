"""Suffix drafting (SuffixDecoding-style): a token tree of what followed the context's suffix
wherever it occurred before, the branches scored by how often each continuation was seen.

No model runs. The longest suffix n-gram of the context (n from ngram_max down to ngram_min)
is looked up in the context (the prompt plus every committed token); the continuations after
its most recent OCCURRENCES occurrences are merged into a trie, and each node's chance of
passing given its parent is how often the parent's occurrences went on with it (calibrated
online by costs.PassRates, as the head's confidences are). A node's chance of being on the
accepted path is the product along its branch; the nodes are ranked by it and the engine's
measured forward costs pick how many to send (costs.ForwardCosts.choose_length: expected
committed tokens per unit of cost, the cost of a forward over that many tokens as measured on
this machine). Without measured costs (cost_rule off) the tree keeps its k most likely nodes.

Example, k = 3: context ``a b x a b y a b`` -> suffix ``a b`` was followed by ``x a b`` and
``y a b``: a tree with two branches from the root, each 1/2 likely.
"""
from __future__ import annotations

import torch

from ..config import SamplingConfig
from .base import Draft, DrafterContext, register
from .cost_aware import CostAware
from .trees import best_nodes, judged_confidences, keep_nodes

OCCURRENCES = 16  # most recent matches merged into the tree


def continuation_tree(context: list[int], depth: int, ngram_max: int, ngram_min: int,
                      occurrences: int = OCCURRENCES) -> tuple[list[int], list[int], list[float]]:
    """(tokens, parents, conditional) of the trie of continuations (up to ``depth`` tokens) after
    the longest suffix n-gram's earlier occurrences; conditional[j] = count(j) / count(parent).
    Nodes are in breadth-first order (parents before children); empty when nothing matches."""
    n_ctx = len(context)
    if n_ctx < 2 or depth <= 0:
        return [], [], []
    ids = torch.tensor(context, dtype=torch.int64)
    for n in range(min(ngram_max, n_ctx - 1), ngram_min - 1, -1):
        windows = ids[:-1].unfold(0, n, 1)  # [n_ctx - n, n]
        hits = (windows == ids[n_ctx - n:]).all(-1).nonzero().flatten()
        hits = hits[hits < n_ctx - n]  # not the suffix itself
        if hits.numel():
            starts = (hits[-occurrences:] + n).tolist()
            break
    else:
        return [], [], []
    # trie: node -> {token: child}; counts per node; root = -1
    children: dict[int, dict[int, int]] = {-1: {}}
    counts: dict[int, int] = {-1: len(starts)}
    tokens: list[int] = []
    parents: list[int] = []
    for s in starts:
        node = -1
        for tok in context[s:s + depth]:
            nxt = children[node].get(tok)
            if nxt is None:
                nxt = len(tokens)
                tokens.append(tok)
                parents.append(node)
                children[node][tok] = nxt
                children[nxt] = {}
                counts[nxt] = 0
            counts[nxt] += 1
            node = nxt
    # breadth-first order keeps every parent before its children (insertion order already does)
    conditional = [counts[j] / counts[parents[j]] for j in range(len(tokens))]
    return tokens, parents, conditional


class SuffixTree(CostAware):
    name = "suffix"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 1, trees: bool = True):
        super().__init__()
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.trees = trees  # False: the best branch only, as a chain (a target without tree masks)
        self.proposed: tuple[list[int], list[int], list[float]] | None = None  # tokens, parents, conditional chances

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        tokens, parents, cond = continuation_tree(context, k, self.ngram_max, self.ngram_min)
        if not tokens:
            return Draft()
        chance = []  # P(node on the accepted path) = product of calibrated chances along its branch
        for j, c in enumerate(cond):
            up = 1.0 if parents[j] < 0 else chance[parents[j]]
            chance.append(up * self.rates.rate(c))
        if not self.trees:  # the most likely branch: follow the likeliest child down
            keep, node = [], -1
            while True:
                kids = [j for j in range(len(tokens)) if parents[j] == node]
                if not kids:
                    break
                node = max(kids, key=lambda j: chance[j])
                keep.append(node)
        else:
            keep = best_nodes(chance, len(tokens))
        ranked = [chance[j] for j in keep]
        n = self.costs.choose_length(ranked) if self.costs is not None and self.costs.measured else min(k, len(keep))
        kept = sorted(keep[:n])
        sent_tokens, sent_parents = keep_nodes(tokens, parents, kept)
        self.proposed = (sent_tokens, sent_parents, [cond[j] for j in kept])
        return Draft(sent_tokens, parents=sent_parents)

    def observe(self, context: list[int], num_accepted: int) -> None:
        if self.proposed is not None:
            self.rates.record(judged_confidences(*self.proposed, context, num_accepted), num_accepted)
        self.proposed = None


@register("suffix")
def _build(ctx: DrafterContext) -> SuffixTree:
    return SuffixTree(ctx.spec.ngram_max, ctx.spec.ngram_min, trees=getattr(ctx.target, "supports_tree", False))
