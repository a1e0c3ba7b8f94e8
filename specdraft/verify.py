"""Verification: target logits + a draft -> the accepted tokens and the next token.

Vocabulary (as in vLLM): draft tokens the target agrees with are *accepted*; at the first
rejection the target's token is *recovered* (resampled); when every draft token passes, the
target adds a *bonus* token from its last distribution. Either way each verification yields
``num_accepted + 1`` tokens, so no target forward is wasted.

Greedy: accept while the target's argmax equals the draft token; the next token is the argmax
at the first mismatch (or after the last draft token).

Sampling (Leviathan et al. 2023; Chen et al. 2023): with p the target's and q the draft's
distribution after the same transforms, accept draft token x with probability min(1, p(x)/q(x));
at the first rejection sample from norm(max(0, p - q)); if all pass, sample the bonus from p.
The output is distributed exactly as sampling from p alone. A draft without probabilities
(prompt lookup) is deterministic: q is one-hot at x, so acceptance is p(x) and the residual is
p with x removed.

Trees (SpecInfer, Medusa, EAGLE): a draft may be a token tree, node j with parent parents[j]
(-1: a child of the last committed token). The target scores every node in one forward; the
committed path walks down from the root. Greedy: to the child holding the target's argmax, while
there is one. Sampling: recursive rejection over a node's children in order, child c accepted
with min(1, p(x_c) / q_c(x_c)); after a rejection p becomes norm(max(0, p - q_c)) for the next
child; when every child is rejected the recovered token is sampled from what is left of p. With
one-hot children (distinct deterministic guesses) this is sampling from p by testing candidates
in turn; with children drawn independently from one q it is SpecInfer's multi-step rule: lossless
either way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SamplingConfig
from .sampling import argmax, probs_from_logits, sample


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one chain draft of K tokens."""

    num_accepted: int  # n: draft tokens accepted, a prefix of the draft, 0 <= n <= K
    next_token: int  # recovered token (n < K) or bonus token (n == K), from the target
    bonus: bool  # n == K: every draft token passed

    def tokens(self, draft: list[int]) -> list[int]:
        """The n + 1 tokens this verification commits."""
        return list(draft[: self.num_accepted]) + [self.next_token]


def verify_greedy(target_logits: torch.Tensor, draft: list[int]) -> Verdict:
    """target_logits [K+1, V]: row i predicts the token after draft[:i]."""
    K = len(draft)
    best = argmax(target_logits).tolist()  # [K+1]
    n = 0
    while n < K and best[n] == draft[n]:
        n += 1
    return Verdict(n, int(best[n]), n == K)


class RowProbs:
    """probs_from_logits of [N, V] target logits, one row at a time as a verification walks to
    it: a walk reads the root's row and those of the nodes it accepts (~2-3 of a tree's 5-7), and
    each row is its own (temperature, top-k and top-p apply row by row)."""

    def __init__(self, logits: torch.Tensor, cfg: SamplingConfig):
        self.logits, self.cfg, self.rows = logits, cfg, {}
        self.width = logits.shape[-1]

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self.rows:
            self.rows[i] = probs_from_logits(self.logits[i:i + 1], self.cfg)[0]
        return self.rows[i]


def verify_sampling(target_logits: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None,
                    cfg: SamplingConfig, generator: torch.Generator) -> Verdict:
    """Speculative sampling. target_logits [K+1, V]; draft_probs [K, V] (q) or None (one-hot)."""
    K = len(draft)
    p = RowProbs(target_logits, cfg)  # p[i]: [V], row i's alone, as the walk reaches it
    if draft_probs is not None and draft_probs.shape[-1] != p.width:
        # Same tokenizer, differently padded output heads: ids past the tokenizer's vocabulary
        # carry no mass in either model, so q is cut or zero-padded to the target's width.
        draft_probs = _match_width(draft_probs, p.width)
    for i, x in enumerate(draft):
        p_x = float(p[i][x])
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        # q_x > 0 whenever the drafter sampled x from q; guard the division anyway.
        r = float(torch.rand((), generator=generator))
        if q_x > 0.0 and r < min(1.0, p_x / q_x):
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - draft_probs[i]).clamp_min_(0.0)
        total = float(residual.sum())
        # total == 0 only when p == q on the support (then rejection has probability 0) or
        # through float round-off; falling back to p keeps the draw well-defined.
        dist = residual / total if total > 0.0 else p[i]
        return Verdict(i, int(sample(dist[None], generator)[0]), False)
    return Verdict(K, int(sample(p[K][None], generator)[0]), True)


@dataclass(frozen=True)
class TreeVerdict:
    """The outcome of verifying a token tree: the accepted path and the target's next token."""

    path: tuple[int, ...]  # accepted node indices, root to leaf (each the child of the one before)
    next_token: int  # recovered token (a rejection below the path's end) or bonus (the end is a leaf)
    bonus: bool  # the path ends at a leaf: every guess on it passed and nothing more was drafted

    @property
    def num_accepted(self) -> int:
        return len(self.path)

    def tokens(self, draft: list[int]) -> list[int]:
        """The len(path) + 1 tokens this verification commits."""
        return [draft[j] for j in self.path] + [self.next_token]


def children_of(parents: list[int]) -> list[list[int]]:
    """parents [N] (-1 = root) -> children lists, root first: [root's, node 0's, ..., node N-1's].

    >>> children_of([-1, -1, 0])
    [[0, 1], [2], [], []]
    """
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for j, parent in enumerate(parents):
        if not -1 <= parent < j:
            raise ValueError(f"node {j}: parent {parent} must be -1 or an earlier node")
        kids[parent + 1].append(j)
    return kids


def verify_tree(target_logits: torch.Tensor, draft: list[int], parents: list[int], draft_probs: torch.Tensor | None,
                cfg: SamplingConfig, generator: torch.Generator) -> TreeVerdict:
    """target_logits [N+1, V]: row 0 predicts the token after the committed context, row j + 1 the
    token after node j (and its ancestors); parents [N]; draft_probs [N, V] (node j's q) or None."""
    kids = children_of(parents)
    path: list[int] = []
    node = -1  # the root: the last committed token
    if cfg.greedy:
        best = argmax(target_logits).tolist()  # [N+1]
        while True:
            nxt = next((c for c in kids[node + 1] if draft[c] == best[node + 1]), None)
            if nxt is None:
                return TreeVerdict(tuple(path), int(best[node + 1]), not kids[node + 1])
            path.append(nxt)
            node = nxt
    p_all = RowProbs(target_logits, cfg)  # row j + 1: after node j
    if draft_probs is not None and draft_probs.shape[-1] != p_all.width:
        draft_probs = _match_width(draft_probs, p_all.width)
    while True:
        p = p_all[node + 1]
        for c in kids[node + 1]:
            x = draft[c]
            q = None if draft_probs is None else draft_probs[c]
            q_x = 1.0 if q is None else float(q[x])
            r = float(torch.rand((), generator=generator))
            if q_x > 0.0 and r < min(1.0, float(p[x]) / q_x):
                break  # accepted: walk down to c
            if q is None:
                p = p.clone()
                p[x] = 0.0
            else:
                p = (p - q).clamp_min_(0.0)
            total = float(p.sum())
            # 0 only through round-off when every candidate had all of p's mass: fall back to it
            p = p / total if total > 0.0 else p_all[node + 1]
        else:  # every child rejected (or a leaf): the next token comes from what is left of p
            return TreeVerdict(tuple(path), int(sample(p[None], generator)[0]), not kids[node + 1])
        path.append(c)
        node = c


def _match_width(q: torch.Tensor, width: int) -> torch.Tensor:
    if q.shape[-1] > width:
        return q[..., :width]
    return torch.nn.functional.pad(q, (0, width - q.shape[-1]))


def verify(target_logits: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None,
           cfg: SamplingConfig, generator: torch.Generator) -> Verdict:
    """Dispatch on the sampling mode; the one verifier every drafter's output goes through."""
    if cfg.greedy:
        return verify_greedy(target_logits, draft)
    return verify_sampling(target_logits, draft, draft_probs, cfg, generator)
