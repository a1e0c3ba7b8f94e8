"""Helpers for token trees: depths, a node's branch, the best nodes or branch of a tree, a
subtree, the trie of several continuations or of several drafts, the attention mask of drafted nodes, and EAGLE-2's
dynamic tree."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

TOPK = 3  # children per expanded node of a dynamic tree
BEAM = 3  # nodes expanded per round (EAGLE-2: the likeliest of the newest layer)
MIN_CHANCE = 0.02  # a round whose likeliest node is below this ends the tree


def keep_nodes(tokens: list[int], parents: list[int], keep: list[int]) -> tuple[list[int], list[int]]:
    """The subtree of nodes ``keep`` (closed under parents) re-indexed in their original order.

    >>> keep_nodes([7, 8, 9], [-1, -1, 0], [2, 0])
    ([7, 9], [-1, 0])
    """
    keep = sorted(keep)
    index = {j: i for i, j in enumerate(keep)}
    return [tokens[j] for j in keep], [index[parents[j]] if parents[j] >= 0 else -1 for j in keep]


def merge_drafts(drafts: list) -> tuple[list[int], list[int], list[float], list[list[int]]]:
    """(tokens, parents, chance, where) of the trie of every draft's nodes, parents before
    children; a node's chance is the best any draft gave it (a draft without chances rates its
    nodes 0: sent only where nothing else competes); where[i][j]: draft i's node j in the trie.

    >>> from specdraft.drafters.base import Draft
    >>> merge_drafts([Draft([1, 2], chances=[0.5, 0.2]), Draft([1, 3], parents=[-1, -1], chances=[0.7, 0.1])])
    ([1, 2, 3], [-1, 0, -1], [0.7, 0.2, 0.1], [[0, 1], [0, 2]])
    """
    tokens: list[int] = []
    parents: list[int] = []
    chance: list[float] = []
    where: list[list[int]] = []
    index: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for d in drafts:
        own = d.parents if d.parents is not None else list(range(-1, len(d) - 1))  # a chain
        rated = d.chances if d.chances is not None else [0.0] * len(d)
        merged: list[int] = []  # this draft's node j -> merged node
        for tok, parent, c in zip(d.tokens, own, rated):
            key = (merged[parent] if parent >= 0 else -1, tok)
            node = index.get(key)
            if node is None:
                node = index[key] = len(tokens)
                tokens.append(tok)
                parents.append(key[0])
                chance.append(c)
            else:
                chance[node] = max(chance[node], c)
            merged.append(node)
        where.append(merged)
    return tokens, parents, chance, where


def node_depths(parents: list[int]) -> list[int]:
    """Depth of each node (a child of the root: 1), parents before children.

    >>> node_depths([-1, -1, 0, 2])
    [1, 1, 2, 3]
    """
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def branch_of(node: int, parents: list[int]) -> list[int]:
    """The nodes from the root's child down to ``node`` (-1, the root: none).

    >>> branch_of(3, [-1, 0, -1, 1])
    [0, 1, 3]
    """
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def row_branches(tokens: list[int], parents: list[int] | None) -> list[list[int]]:
    """The guesses before each row of a check over [last token] + a draft: row 0 none, row j + 1
    node j's branch (a chain: the guesses up to and including j; ``parents`` None).

    >>> row_branches([7, 8, 9], [-1, -1, 0])
    [[], [7], [8], [7, 9]]
    """
    if parents is None:
        return [tokens[:i] for i in range(len(tokens) + 1)]
    return [[]] + [[tokens[j] for j in branch_of(node, parents)] for node in range(len(tokens))]


def child_steps(nodes: list[int], parents: list[int]) -> list[int]:
    """For draft nodes (-1: the root), the 0-based drafting step their children come from: their
    depth (Medusa's head, MTP's module).

    >>> child_steps([-1, 0, 1], [-1, 0])
    [0, 1, 2]
    """
    depth = node_depths(parents)
    return [0 if j < 0 else depth[j] for j in nodes]


def best_nodes(chance: list[float], n: int) -> list[int]:
    """The n nodes most likely to be on the accepted path (a child never before its parent:
    its chance is at most its parent's, and ties keep the earlier node first)."""
    return sorted(range(len(chance)), key=lambda j: (-chance[j], j))[:n]


def best_branch(parents: list[int], chance: list[float]) -> list[int]:
    """The likeliest branch as a chain: from the root, the likeliest child at every node.

    >>> best_branch([-1, -1, 0, 1], [0.3, 0.6, 0.2, 0.5])
    [1, 3]
    """
    keep, node = [], -1
    while True:
        kids = [j for j in range(len(parents)) if parents[j] == node]
        if not kids:
            return keep
        node = max(kids, key=lambda j: chance[j])
        keep.append(node)


def trie_of(continuations: list[list[int]]) -> tuple[list[int], list[int], list[float]]:
    """(tokens, parents, conditional) of the trie that merges ``continuations`` (token lists that
    each start at the root); conditional[j] = count(j) / count(parent), the root's count being
    the number of continuations. Parents come before their children, nodes in order of first sight.

    >>> trie_of([[3, 4], [5, 6], [3, 7]])
    ([3, 4, 5, 6, 7], [-1, 0, -1, 2, 0], [0.6666666666666666, 0.5, 0.3333333333333333, 1.0, 0.5])
    """
    children: dict[int, dict[int, int]] = {-1: {}}  # node -> {token: child}; root = -1
    counts: dict[int, int] = {-1: len(continuations)}
    tokens: list[int] = []
    parents: list[int] = []
    for continuation in continuations:
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
    return tokens, parents, [counts[j] / counts[parents[j]] for j in range(len(tokens))]


def node_mask(nodes: list[int], parents: list[int], row_of: dict[int, int], prefix: int, before: int) -> torch.Tensor:
    """[B, before + B] bool, True = may attend: the mask of draft ``nodes`` [B] fed as one block
    after ``before`` cache rows, of which the first ``prefix`` are the committed context (seen
    whole) and the rest earlier draft nodes at rows ``row_of`` (node -> row); each node sees the
    context, its ancestors' rows (every ancestor must have a row) and itself.

    >>> node_mask([1], [-1, 0], {0: 2}, 2, 3).int().tolist()
    [[1, 1, 1, 1]]
    >>> node_mask([2, 3], [-1, -1, 0, 1], {0: 2, 1: 3}, 2, 4).int().tolist()
    [[1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]]
    """
    B = len(nodes)
    mask = torch.zeros(B, before + B, dtype=torch.bool)
    mask[:, :prefix] = True
    for b, j in enumerate(nodes):
        for a in branch_of(parents[j], parents):
            mask[b, row_of[a]] = True
        mask[b, before + b] = True
    return mask


@dataclass
class GrownTree:
    """A dynamic tree: per node its token, parent (-1: the root), the drafter's confidence in the
    token and its chance of being on the accepted path; ``rounds``: expansions run."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    conf: list[float] = field(default_factory=list)
    chance: list[float] = field(default_factory=list)
    rounds: int = 0


# expand(layer, tree) -> (confidences [B][TOPK], token ids [B][TOPK]): the most confident children
# of the nodes ``layer`` (-1: the root) of ``tree``, likeliest first
Expand = Callable[[list[int], GrownTree], tuple[Sequence[Sequence[float]], Sequence[Sequence[int]]]]


def grow_tree(expand: Expand, rounds: int, rate: Callable[[float], float] = float,
              prune: Callable[[list[int], list[float]], list[int]] | None = None, beam: int = BEAM) -> GrownTree:
    """EAGLE-2's dynamic tree: each round expands the ``beam`` likeliest nodes of the newest layer
    (one ``expand``: a batched drafter step) into their most confident children, a child's chance
    being its parent's times ``rate``(its confidence) (the calibrated pass rate); at most
    ``rounds`` rounds, none after a round whose likeliest node is below MIN_CHANCE. ``prune``
    (layer likeliest first, chances) keeps the nodes worth expanding further (the engine's
    policy.worth_expanding). Children are appended parent by parent, TOPK at a time, in the order
    ``expand`` gives them.

    >>> t = grow_tree(lambda layer, tree: ([[0.9, 0.1, 0.0]] * len(layer), [[5, 6, 7]] * len(layer)), 2)
    >>> t.tokens[:4], t.parents[:4], t.rounds
    ([5, 6, 7, 5], [-1, -1, -1, 0], 2)
    """
    tree = GrownTree()
    layer = [-1]
    while layer and tree.rounds < rounds:
        probs, ids = expand(layer, tree)
        tree.rounds += 1
        new = []
        for b, parent in enumerate(layer):
            up = 1.0 if parent < 0 else tree.chance[parent]
            for p, tok in zip(probs[b], ids[b]):
                tree.tokens.append(int(tok))
                tree.parents.append(parent)
                tree.conf.append(float(p))
                tree.chance.append(up * rate(float(p)) if p > 0 else 0.0)  # (0: a child ruled out, drafters.base.follow_format)
                new.append(len(tree.tokens) - 1)
        layer = sorted(new, key=lambda j: -tree.chance[j])[:beam]
        if tree.chance[layer[0]] < MIN_CHANCE:  # nothing below here would be worth its verification
            break
        if prune is not None:
            layer = prune(layer, tree.chance)
    return tree
