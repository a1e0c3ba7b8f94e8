"""EAGLE: one decoder layer over the target's features that predicts the next feature.

Where the MLP head (heads.model) sees only the newest feature, EAGLE's layer attends over the
features of the whole context through its own small KV cache. Position p holds the pair

    (f_p, x_{p+1}):   f_p [H] the target's final-norm hidden state at p (it chose x_{p+1})

and the layer maps it to h_p ~= f_{p+1}, from which the target's own output head (its first
``vocab`` rows) reads a guess for x_{p+2}. Drafting further feeds (h_p, guess) at position p+1,
attending to the real pairs up to p and to the draft's own earlier steps: so training unrolls
the same way (training-time test, EAGLE-3 / HASS), see heads.eagle_train.

    x   = fc([f ; rms(E[x]) * g_e])                      fc [H, 2H]  (f is normed by the target)
    x  += o(attn(rope(q), rope(k), v))  over rms(x) * ln1    grouped-query heads, like the target
    x  += down(silu(gate) * up)         over rms(x) * ln2
    h   = rms(x) * g_out                                 (the target's features are normed too)

This is the EAGLE-1 / HASS layer with layernorms (vLLM speculators' "eagle" model with
``layernorms=True``: embedding norm, the decoder layer's input norm, a norm before the output
head), so it exports to that layout exactly (heads.export). Every function takes rows with any
leading dims ([..., H]) and its linear maps as arguments (default: the module's own), so the
drafter can run int8 copies of the same weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import read_drafter, rms, save_drafter

KIND = "eagle"


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int  # H: the target's hidden size
    num_heads: int  # query heads of the layer
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int
    inner: int  # MLP width
    vocab: int  # guesses come from the target's first `vocab` token ids
    rope_theta: float = 10000.0
    target: str = ""  # what it was trained on (informative)
    eps: float = 1e-6
    kind: str = KIND


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., heads, hd] by position tables cos, sin [..., hd] (half-split layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


class EagleHead(torch.nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.cfg = cfg
        H, hd = cfg.hidden_size, cfg.head_dim
        self.g_e = torch.nn.Parameter(torch.ones(H))
        self.ln1 = torch.nn.Parameter(torch.ones(H))
        self.ln2 = torch.nn.Parameter(torch.ones(H))
        self.g_out = torch.nn.Parameter(torch.ones(H))
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.qkv = torch.nn.Linear(H, (cfg.num_heads + 2 * cfg.num_kv_heads) * hd)
        self.o = torch.nn.Linear(cfg.num_heads * hd, H, bias=False)
        self.gate_up = torch.nn.Linear(H, 2 * cfg.inner, bias=False)
        self.down = torch.nn.Linear(cfg.inner, H, bias=False)
        torch.nn.init.zeros_(self.o.weight)  # the layer starts as fc alone; attention and MLP grow in
        torch.nn.init.zeros_(self.down.weight)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)  # [hd/2]
        self.register_buffer("inv_freq", inv, persistent=False)

    # ------------------------------------------------------------------ the layer, in pieces
    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.cfg.eps)

    def inputs(self, f: torch.Tensor, e: torch.Tensor, fc=None) -> torch.Tensor:
        """f, e [..., H] (a feature, the embedding of the token chosen from it) -> x [..., H]."""
        return (fc or self.fc)(torch.cat([f, self._rms(e) * self.g_e], -1))

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., hd] for integer positions [...]."""
        angles = positions.float().unsqueeze(-1) * self.inv_freq  # [..., hd/2]
        angles = torch.cat([angles, angles], -1)
        return angles.cos(), angles.sin()

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qkv=None):
        """x [..., H] -> q [..., nh, hd], k and v [..., nkv, hd] (q and k rotated)."""
        c = self.cfg
        out = (qkv or self.qkv)(self._rms(x) * self.ln1)
        q, k, v = out.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1)
        q = q.unflatten(-1, (c.num_heads, c.head_dim))
        k = k.unflatten(-1, (c.num_kv_heads, c.head_dim))
        return rope(q, cos, sin), rope(k, cos, sin), v.unflatten(-1, (c.num_kv_heads, c.head_dim))

    def finish(self, x: torch.Tensor, attended: torch.Tensor, o=None, gate_up=None, down=None) -> torch.Tensor:
        """x [..., H] the layer's input, attended [..., nh, hd] -> h [..., H] the predicted feature."""
        x = x + (o or self.o)(attended.flatten(-2))
        gate, up = (gate_up or self.gate_up)(self._rms(x) * self.ln2).chunk(2, -1)
        x = x + (down or self.down)(F.silu(gate) * up)
        return self._rms(x) * self.g_out

    # ------------------------------------------------------------------ files
    def save(self, directory: str | Path) -> None:
        save_drafter(self, directory)

    @classmethod
    def load(cls, directory: str | Path) -> EagleHead:
        return read_drafter(cls, EagleConfig, directory, what="EAGLE drafter", command="train-drafter --kind eagle")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention of rows q [R, nh, hd] over keys k, v [S, nkv, hd]; mask [R, S]
    (True = may attend) or None (all) -> [R, nh, hd]."""
    R, nh, hd = q.shape
    S, nkv, _ = k.shape
    qg = q.view(R, nkv, nh // nkv, hd)  # query heads grouped by the key head they read
    scores = torch.einsum("rkgd,skd->kgrs", qg, k) * hd ** -0.5  # [nkv, g, R, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.einsum("kgrs,skd->rkgd", scores.softmax(-1), v)  # [R, nkv, g, hd]
    return out.reshape(R, nh, hd)
