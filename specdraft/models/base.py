"""The model interface the engine and the drafters talk to.

A model owns a preallocated KV cache. ``length`` is the number of positions the cache holds;
``forward`` appends the KV of its new tokens at ``[length, length + T)`` and moves ``length``;
``rollback(n)`` forgets everything past position ``n`` by moving ``length`` back (no copy).

Invariant used by the engine: after every step, the target's cache holds all committed tokens
except the last one, which is fed at the start of the next forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [T', V] float32, T' = T (all rows) or 1 (last row only)
    hidden: torch.Tensor | None  # [T', H] final-norm hidden states of the same rows, if asked


class CausalLM(Protocol):
    vocab_size: int  # rows of the output head (may exceed the tokenizer's vocabulary)
    max_length: int  # cache capacity in positions
    length: int  # positions the cache holds now
    supports_tree: bool  # True when forward accepts a tree attention mask

    def forward(
        self,
        ids: torch.Tensor,  # [T] int64, new tokens
        *,
        positions: torch.Tensor | None = None,  # [T] rotary positions; default length + arange(T)
        tree_mask: torch.Tensor | None = None,  # [T, T] bool, new token i may see new token j
        last_only: bool = False,  # compute logits only for the last row (prefill)
        need_hidden: bool = False,  # also return the final-norm hidden states [T, H] (every row)
    ) -> ModelOutput: ...

    def rollback(self, length: int) -> None: ...

    def reset(self) -> None: ...
