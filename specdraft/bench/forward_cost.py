"""Cost of one target forward over k new tokens: the economics of verification.

Speculative decoding pays when checking k guesses costs little more than decoding one token.
This measures exactly that on the current machine: the median time of a forward over k new
tokens on top of a KV cache of ``context`` tokens.
"""
from __future__ import annotations

import statistics
import time

import torch

DEFAULT_BLOCKS = (1, 2, 4, 8, 16, 32)


def forward_cost(model, blocks=DEFAULT_BLOCKS, context: int = 300, repeats: int = 5,
                 warmup: int = 2) -> dict[str, list]:
    """{"tokens": [k...], "seconds": [median forward time...]} for a CausalLM ``model``."""
    gen = torch.Generator().manual_seed(0)
    vocab = min(model.vocab_size, 32000)
    prefix = torch.randint(0, vocab, (context,), generator=gen)
    model.reset()
    model.forward(prefix, last_only=True)
    seconds = []
    for k in blocks:
        ids = torch.randint(0, vocab, (k,), generator=gen)
        times = []
        for r in range(warmup + repeats):
            model.rollback(context)
            t0 = time.perf_counter()
            model.forward(ids)
            if r >= warmup:
                times.append(time.perf_counter() - t0)
        seconds.append(statistics.median(times))
    model.rollback(context)
    return {"tokens": list(blocks), "seconds": seconds}
