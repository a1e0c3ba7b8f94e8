"""Prompt lookup: draft by copying what followed the last n-gram where it occurred before.

No model runs. The longest suffix n-gram (n from ngram_max down to ngram_min) of the context is
searched for in the earlier context, most recent occurrence first; the tokens that followed it
there become the draft, each copied token rated by how often copied tokens at its place passed
so far (costs.CopyRates), so that the engine's policy sends as much of the copy as pays for its
check: on CPUs where a block forward costs several one-token forwards, long copies after chance
matches would otherwise slow decoding down.

Example, ngram_max=2, k=3: context ``a b c d a b`` -> suffix ``a b`` occurred at 0, followed by
``c d a`` -> draft ``[c, d, a]``.
"""
from __future__ import annotations

import torch

from ..config import SamplingConfig
from ..costs import CopyRates
from .base import Draft, Drafter, DrafterContext, register


class PromptLookup(Drafter):
    name = "prompt-lookup"

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.rates = CopyRates()

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        copy = find_continuation(context, k, self.ngram_max, self.ngram_min)
        return Draft(copy, chances=self.rates.chances(len(copy)))

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        for i, passed in judged:  # node i: the copy's i-th token
            self.rates.record(i, passed)


def find_continuation(context: list[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the context's suffix n-gram."""
    n_ctx = len(context)
    ids = torch.tensor(context, dtype=torch.int64)
    for n in range(min(ngram_max, n_ctx - 1), ngram_min - 1, -1):
        # windows [n_ctx - n, n] over positions whose continuation starts inside the context
        windows = ids[:-1].unfold(0, n, 1)  # [n_ctx - n, n]; the last window is the suffix itself
        hits = (windows == ids[n_ctx - n:]).all(-1).nonzero().flatten()
        hits = hits[hits < n_ctx - n]  # exclude the suffix matching itself
        if hits.numel():
            start = int(hits[-1]) + n  # most recent occurrence
            return context[start:start + k]
    return []


@register("prompt-lookup")
def _build(ctx: DrafterContext) -> PromptLookup:
    return PromptLookup(ctx.spec.ngram_max, ctx.spec.ngram_min)
