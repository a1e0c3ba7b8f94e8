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

import itertools

import torch

from ..config import SamplingConfig
from .base import Draft, DrafterContext, register
from .cost_aware import CostAware
from .trees import best_branch, best_nodes, judged_confidences, keep_nodes, sent_nodes

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

    def update(self, key: int, context: list[int]) -> None:
        self._seqs.pop(key, None)
        self._seqs[key] = torch.tensor(context, dtype=torch.int64)
        while len(self._seqs) > self.max_sequences:
            del self._seqs[next(iter(self._seqs))]

    def others(self, key: int) -> list[torch.Tensor]:
        """The other sequences, newest first."""
        return [seq for k, seq in reversed(self._seqs.items()) if k != key]

    def clear(self) -> None:
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


def continuation_tree(context: list[int], depth: int, ngram_max: int, ngram_min: int,
                      occurrences: int = OCCURRENCES, others: list[torch.Tensor] = ()
                      ) -> tuple[list[int], list[int], list[float]]:
    """(tokens, parents, conditional) of the trie of continuations (up to ``depth`` tokens) after
    the longest suffix n-gram's occurrences, in the context first (newest first) and then in
    ``others`` (earlier requests); conditional[j] = count(j) / count(parent). Parents come before
    their children; empty when nothing matches."""
    n_ctx = len(context)
    if n_ctx < 2 or depth <= 0:
        return [], [], []
    ids = torch.tensor(context, dtype=torch.int64)
    found: list[list[int]] = []  # the continuations, up to `occurrences`
    for n in range(min(ngram_max, n_ctx - 1), ngram_min - 1, -1):
        gram = ids[n_ctx - n:]
        for seq in [ids, *others]:
            for start in _matches(seq, gram):
                found.append(seq[start:start + depth].tolist())
                if len(found) >= occurrences:
                    break
            if len(found) >= occurrences:
                break
        if found:
            break
    if not found:
        return [], [], []
    # trie: node -> {token: child}; counts per node; root = -1
    children: dict[int, dict[int, int]] = {-1: {}}
    counts: dict[int, int] = {-1: len(found)}
    tokens: list[int] = []
    parents: list[int] = []
    for continuation in found:
        node = -1
        for tok in continuation:
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
        self.key = next(_KEYS)  # this drafter's sequence in HISTORY

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        HISTORY.update(self.key, context)
        tokens, parents, cond = continuation_tree(context, k, self.ngram_max, self.ngram_min,
                                                  others=HISTORY.others(self.key))
        if not tokens:
            return Draft()
        chance = []  # P(node on the accepted path) = product of calibrated chances along its branch
        for j, c in enumerate(cond):
            up = 1.0 if parents[j] < 0 else chance[parents[j]]
            chance.append(up * self.rates.rate(c))
        # a target without tree masks gets the likeliest branch as a chain
        keep = best_nodes(chance, len(tokens)) if self.trees else best_branch(parents, chance)
        kept = sent_nodes(keep, chance, k, self.costs)
        sent_tokens, sent_parents = keep_nodes(tokens, parents, kept)
        self.proposed = (sent_tokens, sent_parents, [cond[j] for j in kept])
        return Draft(sent_tokens, parents=sent_parents, chances=[chance[j] for j in kept])

    def observe(self, context: list[int], num_accepted: int) -> None:
        if self.proposed is not None:
            self.rates.record(judged_confidences(*self.proposed, context, num_accepted), num_accepted)
        self.proposed = None


@register("suffix")
def _build(ctx: DrafterContext) -> SuffixTree:
    return SuffixTree(ctx.spec.ngram_max, ctx.spec.ngram_min, trees=getattr(ctx.target, "supports_tree", False))
