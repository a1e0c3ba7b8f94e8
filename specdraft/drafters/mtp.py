"""MTP modules as the prophet (heads.mtp): module d drafts the guess at depth d + 1.

The engine hands over f, the target's feature at the row that chose the newest committed token.
A draft node at depth d (the root: 0) gets its children from module d + 1 (0-based: d), fed the
node's own predicted feature and token, as in training. Chains, EAGLE-2 trees, the cost rule and
sampling are the head drafter's (drafters.feature_head); a draft has at most K guesses.
"""
from __future__ import annotations

import torch

from .base import DrafterContext, register
from .feature_head import FeatureHeadDrafter, QuantizedStep, drafter_of
from .trees import child_steps


class MTPDrafter(FeatureHeadDrafter):
    name = "mtp"

    def build_step(self, head) -> list[QuantizedStep]:
        """Every module's two matrices quantized (models.small_linear): guesses only."""
        return [QuantizedStep(module) for module in head.depths]

    def advance(self, nodes: list[int], ids: list[int], parents: list[int], feats: list[torch.Tensor]) -> torch.Tensor:
        d = child_steps(nodes, parents)  # the module each node's children come from
        f = torch.stack([self.feature if j < 0 else feats[j] for j in nodes]).float()  # [R, H]
        e = self.embed[ids].float()  # [R, H] each node's token
        out = torch.empty_like(f)
        for i in sorted(set(d)):
            at = [r for r, m in enumerate(d) if m == i]
            out[at] = self.step[i](f[at], e[at])
        return out

    def propose(self, context, k, sampling, generator):
        return super().propose(context, min(k, self.head.cfg.depth), sampling, generator)


@register("mtp", needs_head="mtp")
def _build(ctx: DrafterContext) -> MTPDrafter:
    return drafter_of(MTPDrafter, ctx)
