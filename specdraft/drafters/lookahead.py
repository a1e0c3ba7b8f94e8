"""Lookahead decoding (Fu et al., 2024) as one token tree: a Jacobi window and an n-gram pool.

The window holds W guesses for the positions right after the committed context. Sent as a chain,
the target's forward returns, at every row, its choice for the next position given the window
up to there (``take_outputs``): one Jacobi iteration. Those choices are the next window (past
what the step committed; missing positions padded with recent context tokens). The iterations
leave n-grams along their trajectories: the window token at position a of the forward N-2 steps
ago, the next forward's token at a + 1, ..., this forward's choice at a + N - 1, each chosen
after the one before (the paper's 2-D lookahead window, kept as the last N-2 windows). The pool
keeps, per first token, the latest distinct continuations of N-1 tokens, from those trajectories
and from the context itself (the paper's pool seeded by the prompt); the ones keyed by the newest
committed token are the verification branch. Window and pool go out as one tree (shared
prefixes merged), so one mask both verifies the pool's guesses and advances the iteration.

Each node's chance of being on the accepted path is the product of pass rates measured online
per branch (window / pool) and depth, by which the engine's policy sends the likeliest nodes that
pay for their check. Where a block forward costs several one-token forwards, that keeps
lookahead to the nodes that pay. Guesses are deterministic (one-hot for the
verifier), so greedy output is the target's and sampling keeps its distribution. A target
without tree masks gets the likeliest branch as a chain.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..config import SamplingConfig
from ..costs import KeyRates
from .base import Draft, Drafter, DrafterContext, register
from .trees import best_branch, node_depths, trie_of

WINDOW = 5  # W: Jacobi guesses a step
NGRAM = 3  # N: pool entries are a token and the N - 1 that followed it
GUESSES = 4  # G: pool continuations verified a step
POOL = 8  # continuations kept per first token (the latest)


class Proposed(NamedTuple):
    """The tree proposed last, until the target's outputs come."""

    start: int  # L: the position of its first layer (the first new token)
    tokens: list[int]
    kinds: list[str]  # per node: "window" or "pool"
    depth: list[int]  # per node: its depth (1: a child of the root)
    window_at: dict[int, int]  # window node -> its position


class Lookahead(Drafter):
    name = "lookahead"
    wants_outputs = True

    def __init__(self, window: int = WINDOW, ngram: int = NGRAM, guesses: int = GUESSES, trees: bool = True):
        if window < 1 or ngram < 2 or guesses < 0:
            raise ValueError("lookahead needs window >= 1, ngram >= 2, guesses >= 0")
        self.W, self.N, self.G = window, ngram, guesses
        self.trees = trees  # False: the likeliest branch only, as a chain (a target without tree masks)
        self.rates = {"window": KeyRates(), "pool": KeyRates()}  # per branch, by depth
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> continuations, latest first
        self.window: dict[int, int] = {}  # position -> guessed token, for the next iteration
        self.past: list[dict[int, int]] = []  # the last N - 2 forwards' window tokens by position
        self.proposed: Proposed | None = None
        self.seen = 0  # context tokens whose n-grams are in the pool
        self._pool_context(prompt)

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        L = len(context)  # the first new token's position
        recent = context[-self.W:]
        chain = [self.window.get(L + j, recent[j % len(recent)]) for j in range(min(k, self.W))]
        candidates = [list(c[:k]) for c in self.pool.get(context[-1], [])[:self.G]]
        tokens, parents, _ = trie_of([chain] + candidates)  # the chain's nodes come first: 0..W-1
        kinds = ["window" if j < len(chain) else "pool" for j in range(len(tokens))]
        depth = node_depths(parents)
        chance: list[float] = []
        for j, parent in enumerate(parents):
            chance.append((1.0 if parent < 0 else chance[parent]) * self.rates[kinds[j]].rate(depth[j]))
        if not self.trees:  # the likeliest branch, as a chain
            kept = best_branch(parents, chance)
            tokens, kinds, depth, chance = ([x[j] for j in kept] for x in (tokens, kinds, depth, chance))
            parents = None
        else:
            kept = list(range(len(tokens)))
        at = {i: L + j for i, j in enumerate(kept) if j < len(chain)}  # window node -> its position
        self.proposed = Proposed(L, tokens, kinds, depth, at)
        return Draft(tokens, parents=parents, chances=chance)

    def take_outputs(self, choices: list[int | None]) -> None:
        if self.proposed is None:
            return
        sent = {i: p for i, p in self.proposed.window_at.items() if choices[1 + i] is not None}  # window nodes checked
        inputs = {p: self.proposed.tokens[i] for i, p in sent.items()}  # this iteration's window by position
        outputs = {self.proposed.start: choices[0], **{p + 1: choices[1 + i] for i, p in sent.items()}}
        levels = (self.past[-(self.N - 2):] if self.N > 2 else []) + [inputs]  # oldest first
        if len(levels) == self.N - 1:  # a trajectory through every level, then this forward's choice
            for a in sorted(levels[0]):
                gram = [levels[i].get(a + i) for i in range(self.N - 1)] + [outputs.get(a + self.N - 1)]
                if None not in gram:
                    self._add(gram)
        self.past = (self.past + [inputs])[-max(self.N - 2, 1):]
        self.window = outputs

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        for j, passed in judged:
            self.rates[self.proposed.kinds[j]].record(self.proposed.depth[j], passed)

    def observe(self, context: list[int], num_accepted: int) -> None:
        self.proposed = None
        self._pool_context(context)

    def _pool_context(self, context: list[int]) -> None:
        """The n-grams ending at context tokens not yet pooled."""
        for end in range(max(self.seen, self.N - 1), len(context)):
            self._add(context[end - self.N + 1:end + 1])
        self.seen = len(context)

    def _add(self, gram: list[int]) -> None:
        kept = self.pool.setdefault(gram[0], [])
        rest = tuple(gram[1:])
        if rest in kept:
            kept.remove(rest)
        kept.insert(0, rest)
        del kept[POOL:]


@register("lookahead")
def _build(ctx: DrafterContext) -> Lookahead:
    return Lookahead(trees=getattr(ctx.target, "supports_tree", False))
