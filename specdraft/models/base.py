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
    # [T', k, H] the residual stream after each of the k decoder layers asked for (``taps``) at
    # the same rows, if asked (EAGLE-3 style drafters read a low, a middle and a late layer)
    taps: torch.Tensor | None = None


def check_taps(taps: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """``taps`` if they are ascending layer indices before the last layer (whose output the final
    norm turns into ``hidden``), else ValueError."""
    taps = tuple(int(i) for i in taps)
    if list(taps) != sorted(set(taps)) or (taps and not 0 <= taps[0] <= taps[-1] < num_layers - 1):
        raise ValueError(f"tapped layers must be ascending indices below {num_layers - 1}, got {list(taps)}")
    return taps


class CausalLM(Protocol):
    vocab_size: int  # rows of the output head (may exceed the tokenizer's vocabulary)
    max_length: int  # cache capacity in positions
    length: int  # positions the cache holds now
    epoch: int  # counts what changes the cache's contents (reset, forward, restore): a prefix.PrefixCache
    # record holds only while it is unchanged
    supports_tree: bool  # True when forward accepts a tree attention mask

    def forward(
        self,
        ids: torch.Tensor,  # [T] int64, new tokens
        *,
        positions: torch.Tensor | None = None,  # [T] rotary positions; default length + arange(T)
        tree_mask: torch.Tensor | None = None,  # [T, T] bool, new token i may see new token j
        # (the native model also takes [T, L0 + T] over the whole cache: models.packed)
        last_only: bool = False,  # compute logits only for the last row (prefill)
        need_hidden: bool = False,  # also return the final-norm hidden states [T, H] (every row)
        taps: tuple[int, ...] = (),  # with need_hidden: also these layers' outputs (ModelOutput.taps)
        hidden_last_only: bool = False,  # with last_only and need_hidden: hidden states and taps of the last row alone
    ) -> ModelOutput: ...

    def rollback(self, length: int) -> None: ...

    def reset(self) -> None: ...
