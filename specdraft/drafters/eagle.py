"""EAGLE as the prophet: one trained decoder layer over the target's features (heads.eagle,
any form: the EAGLE-1 layer, attention in front of the MLP head's step with fused taps, or
EAGLE-3's layer over the fused raw outputs of the taps).

The layer keeps its own KV cache of the *real* pairs (f_p, x_{p+1}) of the context: the
engine hands over the target's features of every committed row (take_features), and the next
``propose`` runs the layer over the pairs whose next token is now known (a few rows, one
batched call) and appends them. Its last output is the feature the first guesses are read
from. Drafting then steps draft nodes: node j at depth d holds (feature its token was chosen
from, its token) at position n-1+d and attends to the cached real pairs plus its own ancestors'
steps, the same view training gives it (heads.eagle_train). Draft nodes never enter the cache,
so nothing has to be rolled back: the committed rows come back as real features.

Chains, EAGLE-2 dynamic trees, the cost rule and sampling are the head drafter's
(drafters.feature_head); this file supplies only the step.
"""
from __future__ import annotations

import torch

from ..heads.eagle import attend
from ..models.small_linear import drafter_linear_of
from .base import DrafterContext, register
from .feature_head import FeatureHeadDrafter, drafter_of
from .trees import node_depths, node_mask


class EagleDrafter(FeatureHeadDrafter):
    name = "eagle"
    prompt_features = True  # every prompt row's feature fills its layer's cache

    def __init__(self, target, head, **options):
        super().__init__(target, head, **options)
        c = head.cfg
        self.max_length = target.max_length
        self.k_cache = torch.zeros(self.max_length, c.num_kv_heads, c.head_dim)  # [L, nkv, hd] real pairs
        self.v_cache = torch.zeros_like(self.k_cache)
        self.cached = 0  # pairs in the cache: positions 0..cached-1
        self.pending: list[torch.Tensor] = []  # [m, H] features whose pairs are not cached yet
        self.node_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # this draft's stepped nodes
        rows = self.out  # the output head reads a step's output through the form's readout
        self.out = lambda h: rows(head.readout(h))  # (eagle3: rms(h) * g_out; the others: h)

    def build_step(self, head) -> dict:
        """The layer's matrices (head.LINEARS) quantized (models.small_linear): guesses only, the
        target checks each, so their rounding never changes the output."""
        return {name: drafter_linear_of(getattr(head, name)) for name in head.LINEARS}

    def begin(self, prompt: list[int]) -> None:
        super().begin(prompt)  # no feature yet; the extension's index afresh
        self.cached, self.pending, self.root = 0, [], None

    @torch.inference_mode()
    def take_features(self, hidden: torch.Tensor) -> None:
        """hidden [n, H], or [n, (k + 1) H] with the tapped layers' outputs first: every row is a
        real pair's feature (fused, with taps) for the cache."""
        f = self.fused(hidden)
        self.pending.append(f)
        self.feature = f[-1]  # ready() and the cost rule read it

    def _layer(self, f: torch.Tensor, ids: list[int], positions: torch.Tensor, keys, values, mask):
        """The layer over rows (f [R, H], tokens ids [R]) at ``positions`` [R], attending to
        keys/values [S, nkv, hd] (masked by mask [R, S]) and to the rows' own keys appended after
        them: returns (h [R, H], k [R, nkv, hd], v [R, nkv, hd])."""
        head = self.head
        x = head.inputs(f, self.embed[ids].float(), self.step)  # [R, H] (form "head": [R, 2H])
        cos, sin = head.rope_tables(positions)
        q, k, v = head.project(x, cos, sin, self.step)
        o = attend(q, torch.cat([keys, k]), torch.cat([values, v]), mask)
        return head.finish(x, o, self.step), k, v

    def advance(self, nodes: list[int], ids: list[int], parents: list[int], feats: list[torch.Tensor]) -> torch.Tensor:
        n = self.cached
        if nodes == [-1]:  # the root: cache the pairs whose tokens are now known; the last is the root's
            self.node_kv = {}
            if not self.pending:  # no forward since the last draft: the same root
                return self.root
            f = torch.cat(self.pending)  # [m, H] rows n..n+m-1; their tokens are the next m context tokens
            self.pending = []
            m = f.shape[0]
            ids = self.context[n + 1:n + 1 + m]
            causal = torch.ones(m, n + m, dtype=torch.bool)
            causal[:, n:] = torch.ones(m, m, dtype=torch.bool).tril_()
            h, k, v = self._layer(f, ids, torch.arange(n, n + m), self.k_cache[:n], self.v_cache[:n], causal)
            self.k_cache[n:n + m], self.v_cache[n:n + m] = k, v
            self.cached = n + m
            self.root = h[-1:]
            return self.root
        # draft nodes: node j at depth d sits at position (cached - 1) + d and sees the cache,
        # its ancestors' steps and itself
        depth = node_depths(parents)
        stepped = list(self.node_kv)  # nodes stepped earlier in this draft (every ancestor is one)
        row_of = {j: n + i for i, j in enumerate(stepped)}  # node -> its key's row after the cache
        mask = node_mask(nodes, parents, row_of, n, n + len(stepped))  # [R, n + stepped + R]
        keys = torch.cat([self.k_cache[:n], *[self.node_kv[s][0][None] for s in stepped]])
        values = torch.cat([self.v_cache[:n], *[self.node_kv[s][1][None] for s in stepped]])
        f = torch.stack([feats[j] for j in nodes])
        positions = torch.tensor([n - 1 + depth[j] for j in nodes])
        h, k, v = self._layer(f, ids, positions, keys, values, mask)
        for b, j in enumerate(nodes):
            self.node_kv[j] = (k[b], v[b])
        return h

    def propose(self, context, k, sampling, generator):
        self.context = context  # the root step reads the tokens of the pending pairs from it
        return super().propose(context, k, sampling, generator)


@register("eagle", needs_head="eagle")
def _build(ctx: DrafterContext) -> EagleDrafter:
    return drafter_of(EagleDrafter, ctx)
