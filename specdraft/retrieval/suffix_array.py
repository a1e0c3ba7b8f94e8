"""Bounded-depth suffix sorting by prefix doubling, in numpy.

A datastore lookup needs the suffixes of its token stream ordered by their first ``depth``
tokens only (its n-grams are at most that long), which prefix doubling gives in about
log2(depth) stable argsorts of n int64 keys: rank every suffix by its first token, then by the
pair (rank of its first h tokens, rank of the h after them) for h = 1, 2, 4, ... A full suffix
array (no depth bound) would need log2(n) rounds.

Example, depth 2: seq ``[2, 1, 2, 1]`` -> suffixes ``21 12 21 1`` ordered ``1`` (3), ``12``
(1), ``21`` (0), ``21`` (2): ``[3, 1, 0, 2]`` (a suffix that ends sooner sorts first; ties by
position).
"""
from __future__ import annotations

import numpy as np


def sort_suffixes(seq: np.ndarray, depth: int) -> np.ndarray:
    """Start positions [n] int64 of seq's suffixes in order of their first ``depth`` elements
    (the end of seq sorts below every value), equal ones by position."""
    n = len(seq)
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # rank[i] orders suffix i by its first h elements: 1..n, equal ranks for equal prefixes; 0 = past the end
    rank = np.unique(seq, return_inverse=True)[1].astype(np.int64).reshape(-1) + 1
    order = np.argsort(rank, kind="stable")
    h = 1
    while h < depth and rank[order[-1]] < n:  # stop early once every prefix is unique
        step = min(h, depth - h)  # the last round covers [h, depth) by ranks of [depth - h, depth)
        nxt = np.zeros(n, dtype=np.int64)
        nxt[:n - step] = rank[step:]
        key = rank * (n + 1) + nxt  # < (n + 1)^2: fits int64 for n < 3e9
        order = np.argsort(key, kind="stable")  # stable: equal keys stay in position order
        ordered = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        h += step
    return order
