"""Helpers for token trees: depths, the best nodes or branch of a tree, a subtree, the trie of
several continuations."""
from __future__ import annotations


def keep_nodes(tokens: list[int], parents: list[int], keep: list[int]) -> tuple[list[int], list[int]]:
    """The subtree of nodes ``keep`` (closed under parents) re-indexed in their original order.

    >>> keep_nodes([7, 8, 9], [-1, -1, 0], [2, 0])
    ([7, 9], [-1, 0])
    """
    keep = sorted(keep)
    index = {j: i for i, j in enumerate(keep)}
    return [tokens[j] for j in keep], [index[parents[j]] if parents[j] >= 0 else -1 for j in keep]


def node_depths(parents: list[int]) -> list[int]:
    """Depth of each node (a child of the root: 1), parents before children.

    >>> node_depths([-1, -1, 0, 2])
    [1, 1, 2, 3]
    """
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


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
