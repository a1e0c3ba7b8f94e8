"""Medusa and Hydra as the prophet: K trained heads on the newest feature (heads.medusa).

The engine hands over f, the target's feature at the row that chose the newest committed token;
head i guesses the token i places after that one. A node at depth d (the root: 0) gets its
children from head d + 1: with Medusa whatever its own token (its heads never see the draft),
with Hydra from its token too, so each node has children of its own. Chains,
trees (EAGLE-2 selection by the product of calibrated confidences), the cost rule and sampling
are the head drafter's (drafters.feature_head); this file supplies the step.
"""
from __future__ import annotations

import torch

from ..models.small_linear import drafter_linear_of
from .base import DrafterContext, register
from .feature_head import FeatureHeadDrafter, drafter_of
from .trees import child_steps


class MedusaDrafter(FeatureHeadDrafter):
    name = "medusa"

    def build_step(self, head) -> list:
        """The heads' blocks quantized (models.small_linear): guesses only."""
        return [drafter_linear_of(b) for b in head.blocks]

    def advance(self, nodes: list[int], ids: list[int], parents: list[int], feats: list[torch.Tensor]) -> torch.Tensor:
        d = child_steps(nodes, parents)  # the head each node's children come from
        f = self.feature.float().expand(len(nodes), -1)  # [R, H] every head reads the root's feature
        e = self.embed[ids].float() if self.head.cfg.reads_token else None  # [R, H] Hydra: the node's token
        return self.head.rows(f, d, e, self.step)

    def propose(self, context, k, sampling, generator):
        return super().propose(context, min(k, self.head.cfg.num_heads), sampling, generator)


class HydraDrafter(MedusaDrafter):
    name = "hydra"


def _build(ctx: DrafterContext, cls=MedusaDrafter) -> MedusaDrafter:
    return drafter_of(cls, ctx)


register("medusa", needs_head="medusa")(_build)
register("hydra", needs_head="hydra")(lambda ctx: _build(ctx, HydraDrafter))
