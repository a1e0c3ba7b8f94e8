"""Several prophets in one tree: every component drafter proposes, the proposals merge into one
token tree (shared prefixes merged), and the target verifies it in one forward.

Each component rates its own nodes: P(node on the accepted path), from its confidences
calibrated online by how often its guesses of that confidence passed (``Draft.chances``). A
merged node takes the best rating any component gave it, by which the engine's policy sends the
likeliest nodes that pay for their check. So the budget goes, step by step, to the components
whose guesses are passing in this context. Each component then learns which of its own nodes
the verifier judged, and observes how far the accepted path ran along its own proposal.

Drafts are sent as deterministic guesses (one-hot for the verifier), also when a component
sampled its guesses: verification against a one-hot draft is exact whatever chose the token, so
a node two components share needs no common q.

Components: ``suffix`` and the head (``head``), and ``retrieval`` where an ``--index`` is given.
The fused tree's likeliest nodes are then extended by lookup after them (drafters.extend; greedy only).

Example: suffix proposes ``a b`` and ``a c`` (a tree), the head the chain ``a b d``: one tree
a -> (b -> d, c), whose ``a`` and ``b`` carry the better of the two ratings.
"""
from __future__ import annotations

import torch

from ..config import SamplingConfig
from .base import Draft, Drafter, DrafterContext, build_drafter, register
from .extend import LookupExtension, lookup_extension
from .feature_head import FeatureHeadDrafter, drafter_of
from .suffix import SuffixTree
from .trees import best_branch, merge_drafts


def matched_depth(draft: Draft, accepted: list[int]) -> int:
    """How many of the accepted tokens the draft had proposed, along one of its branches."""
    own = draft.parents if draft.parents is not None else list(range(-1, len(draft) - 1))
    node, depth = -1, 0
    for tok in accepted:
        node = next((j for j in range(len(draft)) if own[j] == node and draft.tokens[j] == tok), None)
        if node is None:
            break
        depth += 1
    return depth


class Fusion(Drafter):
    name = "fusion"

    def __init__(self, components: list[Drafter], trees: bool = True, extension: LookupExtension | None = None):
        self.components = components
        self.extension = extension if trees else None  # the likeliest nodes extended by lookup (drafters.extend)
        self.uses_features = any(c.uses_features for c in components)
        self.prompt_features = any(c.prompt_features for c in components if c.uses_features)
        readers = {c.feature_layers for c in components if c.uses_features}
        if len(readers) > 1:
            raise ValueError("fused prophets must read the same target layers")
        self.feature_layers = next(iter(readers), ())
        self.wants_outputs = any(c.wants_outputs for c in components)
        self.output_topk = max((c.output_topk for c in components), default=0)
        self.trees = trees  # False: the likeliest branch only, as a chain (a target without tree masks)
        self.proposals: list[Draft] = []  # each component's draft this step, until observed
        self.where: list[list[int]] = []  # component i's node j -> node of the fused proposal
        self.accepted_by = [0] * len(components)  # accepted tokens each component had proposed

    def use_policy(self, policy) -> None:
        super().use_policy(policy)
        for c in self.components:
            c.use_policy(policy)

    def use_format(self, mask) -> None:
        super().use_format(mask)
        for c in self.components:
            c.use_format(mask)

    def begin(self, prompt: list[int]) -> None:
        for c in self.components:
            c.begin(prompt)
        if self.extension is not None:
            self.extension.begin()
        self.accepted_by = [0] * len(self.components)

    def take_features(self, hidden: torch.Tensor) -> None:
        for c in self.components:
            if c.uses_features:
                c.take_features(hidden)

    def take_outputs(self, choices: list[int | None]) -> None:
        """Each component that reads them gets the target's choices after its own nodes."""
        for c, merged in zip(self.components, self.where):
            if c.wants_outputs:
                c.take_outputs([choices[0]] + [choices[1 + node] if node >= 0 else None for node in merged])

    def take_topk(self, ids: list[int], top: torch.Tensor) -> None:
        for c in self.components:
            if c.output_topk:
                c.take_topk(ids, top[:, :c.output_topk])

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        self.proposals = [c.propose(context, k, sampling, generator) for c in self.components]
        tokens, parents, chance, self.where = merge_drafts(self.proposals)
        if not self.trees:  # the likeliest branch, as a chain
            branch = best_branch(parents, chance)
            at = {node: i for i, node in enumerate(branch)}
            self.where = [[at.get(node, -1) for node in merged] for merged in self.where]
            return Draft([tokens[j] for j in branch], chances=[chance[j] for j in branch])
        fused = Draft(tokens, parents=parents, chances=chance)
        return self.extension.extend(context, fused, k, sampling) if self.extension is not None else fused

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        """Each component learns from the judged nodes it had proposed."""
        verdict = dict(judged)
        for c, merged in zip(self.components, self.where):
            own = [(j, verdict[node]) for j, node in enumerate(merged) if node in verdict]
            if own:
                c.learn(own)
        if self.extension is not None:
            self.extension.learn(judged)

    def observe(self, context: list[int], num_accepted: int) -> None:
        accepted = context[len(context) - 1 - num_accepted:len(context) - 1]
        for i, (c, d) in enumerate(zip(self.components, self.proposals or [Draft()] * len(self.components))):
            m = matched_depth(d, accepted)
            self.accepted_by[i] += m
            # the component sees the step as its own: its first m guesses passed, and the next
            # committed token is the one the target chose where its proposal left the path
            c.observe(context[:len(context) - num_accepted + m], m)
        self.proposals, self.where = [], []  # a step that drafts nothing hands no outputs on


@register("fusion", needs_head=True)
def _build(ctx: DrafterContext) -> Fusion:
    """suffix and the head, and retrieval too where an --index is given."""
    trees = getattr(ctx.target, "supports_tree", False)
    suffix = SuffixTree(ctx.spec.ngram_max, ctx.spec.ngram_min, trees=trees)
    head = drafter_of(FeatureHeadDrafter, ctx, alone=False)
    components: list[Drafter] = [suffix, head]
    if ctx.spec.index is not None:
        components.append(build_drafter("retrieval", ctx))
    return Fusion(components, trees=trees,
                  extension=lookup_extension(ctx.spec, trees))
