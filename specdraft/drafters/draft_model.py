"""A smaller language model as the prophet.

The draft model keeps its own KV cache. ``seq`` lists the tokens whose KV it holds. On each
``propose`` it rolls back to the longest common prefix of ``seq`` and the committed context,
feeds what it has not seen yet in one forward (the accepted tail plus the target's token), then
drafts k tokens one by one, sampling from its own distribution q when the target samples.

Cache invariant: after ``propose(context, k)``, the draft cache holds ``context + draft[:-1]``
(the last draft token is never fed: its KV is only needed if all k are accepted, and then the
next ``propose`` feeds it together with the bonus token).

``window``: when > 0 and the prompt is longer, the draft model sees only the prompt's last
``window`` tokens (and everything generated after them). Its prefill of a long prompt (a RAG
document, an article to summarise) then costs a bounded time; lossless, since only the guesses
change. ``seq`` and the cache then hold ``context[offset:]``.
"""
from __future__ import annotations

import torch

from ..config import SamplingConfig
from .base import Draft, DrafterContext, choose, register


class DraftModel:
    name = "draft-model"

    def __init__(self, model, *, min_confidence: float = 0.0, window: int = 0):
        self.model = model
        self.window = window
        self.offset = 0  # context[offset:] is what the draft model sees
        # Greedy only: run another draft forward only while the product of the probabilities of
        # the guesses so far is at least this (see propose).
        self.min_confidence = min_confidence
        self.seq: list[int] = []

    def begin(self, prompt: list[int]) -> None:
        self.model.reset()
        self.seq = []
        self.offset = max(0, len(prompt) - self.window) if self.window > 0 else 0

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to ``context`` and return the logits [V] for the next token."""
        context = context[self.offset:]
        n = _common_prefix(self.seq, context)
        n = min(n, len(context) - 1)  # always feed at least one token to get fresh logits
        self.model.rollback(n)
        out = self.model.forward(torch.tensor(context[n:], dtype=torch.int64), last_only=True)
        self.seq = list(context)
        return out.logits[-1]

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        k = min(k, self.model.max_length - (len(context) - self.offset))
        if k <= 0:
            return Draft()
        logits = self._sync(context)  # paid on every step anyway: the first guess costs no forward
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        sure = 1.0  # greedy: the draft's own probability that every guess so far is right
        for i in range(k):
            tok, q, p = choose(logits, sampling, generator, self.min_confidence > 0.0)
            sure *= p
            if q is not None:
                qs.append(q)
            tokens.append(tok)
            # Another guess costs a draft forward, and pays only if every guess before it is
            # accepted: stop once the draft itself doubts that (the guess in hand is still
            # proposed; checking it costs the target almost nothing).
            if i + 1 < k and sure >= self.min_confidence:
                logits = self.model.forward(torch.tensor([tok], dtype=torch.int64)).logits[-1]
                self.seq.append(tok)
            else:
                break
        probs = torch.stack(qs) if qs else None
        return Draft(tokens, probs)

    def observe(self, context: list[int], num_accepted: int) -> None:
        # Nothing to do eagerly: the next propose rolls back to the common prefix, which covers
        # both a rejection (drop the rejected tail) and full acceptance (feed the last draft
        # token and the bonus token).
        pass


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Most steps share everything but a short tail: compare big chunks first.
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@register("draft-model", needs_draft_model=True)
def _build(ctx: DrafterContext) -> DraftModel:
    return DraftModel(ctx.draft_model, min_confidence=ctx.spec.min_confidence, window=ctx.spec.window)
