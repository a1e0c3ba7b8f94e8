"""Prompt lookup: draft by copying what followed the last n-gram where it occurred before.

No model runs. The longest suffix n-gram (n from ngram_max down to ngram_min) of the context is
searched for in the earlier context, most recent occurrence first; the tokens that followed it
there become the draft. Once the engine has timed its forwards (``use_costs``), a copy is cut
to the length that pays for its verification given how often copied tokens passed so far
(costs.CopyRates): on CPUs where a block forward costs several one-token forwards, long copies
after chance matches would otherwise slow decoding down.

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
        self.costs = None  # costs.ForwardCosts from the engine (cost_rule): copies cut to the best length
        self.rates = CopyRates()
        self.proposed_length = 0  # length of the copy proposed last

    def use_costs(self, costs) -> None:
        self.costs = costs

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        copy = find_continuation(context, k, self.ngram_max, self.ngram_min)
        copy = copy[:self.rates.length(len(copy), self.costs)]
        self.proposed_length = len(copy)
        return Draft(copy)

    def observe(self, context: list[int], num_accepted: int) -> None:
        self.rates.record(self.proposed_length, num_accepted)
        self.proposed_length = 0


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
