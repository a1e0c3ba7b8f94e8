"""Adapter over transformers' AutoModelForCausalLM, for architectures the native runtime lacks.

Chain drafts only (no tree masks). Rollback crops transformers' DynamicCache to a length.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ModelFileError
from .base import ModelOutput, check_taps


class HFModel:
    supports_tree = False

    def __init__(self, model, max_length: int):
        self.model = model.eval()
        self.vocab_size = model.config.vocab_size
        self.max_length = max_length
        self.length = 0
        self.epoch = 0  # reset / forward calls: a PrefixCache's record holds only while this is unchanged
        self.cache = None

    @classmethod
    def from_dir(cls, path: str | Path, *, dtype=torch.bfloat16, max_length: int = 4096) -> HFModel:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        except Exception as e:
            first = str(e).splitlines()[0][:200] if str(e) else ""
            raise ModelFileError(f"transformers cannot load {path} ({type(e).__name__}: {first})") from None
        limit = getattr(model.config, "max_position_embeddings", max_length) or max_length
        return cls(model, min(max_length, limit))

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        self.epoch += 1  # whoever changes the cache voids what a PrefixCache recorded

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5 crops by a negative count
        self.length = length

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, *, positions=None, tree_mask=None, last_only: bool = False,
                need_hidden: bool = False, taps: tuple[int, ...] = (), hidden_last_only: bool = False) -> ModelOutput:
        if tree_mask is not None:
            raise NotImplementedError("the transformers adapter verifies chains only")
        if self.cache is None:
            self.reset()
        self.epoch += 1
        T = int(ids.shape[0])
        pos = torch.arange(self.length, self.length + T)[None]
        out = self.model(input_ids=ids[None], past_key_values=self.cache, use_cache=True, position_ids=pos,
                         output_hidden_states=need_hidden, logits_to_keep=1 if last_only else 0)
        self.length += T
        hidden = out.hidden_states[-1][0] if need_hidden else None  # [T, H] every row
        # hidden_states[i + 1] is layer i's output (the last one normed, so a tap on it is refused)
        tapped = torch.stack([out.hidden_states[i + 1][0] for i in check_taps(taps, len(out.hidden_states) - 1)], 1) \
            if need_hidden and taps else None
        if last_only and hidden_last_only and hidden is not None:
            hidden, tapped = hidden[-1:], None if tapped is None else tapped[-1:]
        return ModelOutput(logits=out.logits[0].float(), hidden=hidden, taps=tapped)
