"""MTP (DeepSeek-V3's multi-token prediction): K sequential modules on the target's features.

Module k (1..K) combines the previous depth's hidden state with the embedding of the token
that follows it, and the target's own output head (shared, like its embedding) reads the next
guess from the result:

    h^0   = f_t                          the target's final-norm hidden state at t (chose x_{t+1})
    h^k   = h^{k-1} + W2_k silu(W1_k [rms(h^{k-1}) * g_h ; rms(E[x_{t+k}]) * g_e])
    guess x_{t+k+1} = argmax  W_out[:vocab] h^k

Each module is the MLP head's step (heads.model.FeatureHead) with weights of its own: DeepSeek's
projection M_k of the two normed inputs is W1_k, and its transformer block is replaced by the
residual MLP (no attention: on these features the EAGLE layer's attention guessed below the MLP
step, see BENCHMARKS.md). Where the MLP head runs one step again and again on its own
predictions, module k is trained only at depth k, on what module k - 1 hands it: the chain is
unrolled in training exactly as it drafts (heads.train, fed the true tokens x_{t+k}). A draft
has at most K guesses.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .model import FeatureHead, HeadConfig, read_drafter, save_drafter
from .vocab import ListedVocab

KIND = "mtp"


@dataclass(frozen=True)
class MTPConfig:
    hidden_size: int  # H: the target's hidden size
    inner: int  # D: each module's MLP width
    depth: int  # K: modules, module k guessing k + 1 tokens past the feature's row
    vocab: int  # guesses come from `vocab` token ids: the first ones, or those listed (heads.vocab)
    target: str = ""  # what it was trained on (informative)
    eps: float = 1e-6
    kind: str = KIND
    listed_vocab: bool = False  # the ids are the buffer vocab_ids [vocab] (frequency-ranked), not 0..vocab-1


class MTPModules(ListedVocab, torch.nn.Module):
    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.cfg = cfg
        self.init_vocab()
        step = HeadConfig(hidden_size=cfg.hidden_size, inner=cfg.inner, vocab=cfg.vocab, target=cfg.target, eps=cfg.eps)
        self.depths = torch.nn.ModuleList(FeatureHead(step) for _ in range(cfg.depth))

    def at_depth(self, s: int) -> FeatureHead:
        """The module of drafting step s (0-based: step 0 reads the target's own feature)."""
        return self.depths[s]

    def save(self, directory: str | Path) -> None:
        save_drafter(self, directory)

    @classmethod
    def load(cls, directory: str | Path) -> MTPModules:
        return read_drafter(cls, MTPConfig, directory, what="MTP drafter", command="train-drafter --kind mtp")
