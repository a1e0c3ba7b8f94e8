"""Two prophets at once: prompt lookup where the text repeats, a model prophet elsewhere.

``hybrid`` pairs lookup with the draft model, ``hybrid-head`` with a trained head on the
target's features (drafters.feature_head).

Each step first looks for the context's suffix n-gram earlier in the context (free: no model
runs). A match proposes up to k copied tokens; only when there is none does the draft model pay
for its forwards, with its own shorter draft length. A copied draft carries no probabilities
(one-hot for the verifier); a model draft carries q, so sampling stays exact either way.

Why: a 0.5B draft round costs a quarter to two fifths of a 1.5B target forward (Zen 5, AVX2
EPYC), so the draft model pays only where it guesses well, while copies are free and long where the answer quotes the
prompt (summaries, RAG, code edits). The draft model's cache catches up lazily: after a run of
copied steps its next ``propose`` feeds every committed token it has not seen in one block.

``hybrid-head`` with trees also extends each greedy draft's likeliest nodes by lookup after them
(drafters.extend): a node the head guessed right is often where a copy starts.
"""
from __future__ import annotations

import torch

from ..config import SamplingConfig
from .base import Draft, Drafter, DrafterContext, register
from .draft_model import DraftModel, trees_for
from .extend import LookupExtension, lookup_extension
from .feature_head import FeatureHeadDrafter, drafter_of
from .prompt_lookup import PromptLookup


class Hybrid(Drafter):
    name = "hybrid"

    def __init__(self, model, *, model_k: int, ngram_max: int, ngram_min: int,
                 extension: LookupExtension | None = None):
        self.model = model  # the model prophet: DraftModel or FeatureHeadDrafter
        self.uses_features = model.uses_features
        self.prompt_features = model.prompt_features
        self.feature_layers = model.feature_layers
        self.model_k = model_k  # draft length when the draft model drafts
        self.lookup = PromptLookup(ngram_max, ngram_min)  # the copies, rated as prompt-lookup rates them
        self.copied = 0  # steps drafted by lookup in the current sequence (for statistics)
        self.modelled = 0  # steps drafted by the model
        self.drafter: Drafter | None = None  # the part that drafted the last step (None: neither did)
        self.extension = extension  # its drafts' likeliest nodes extended by lookup (drafters.extend; trees only)

    def use_policy(self, policy) -> None:
        super().use_policy(policy)
        self.lookup.use_policy(policy)
        self.model.use_policy(policy)

    def use_format(self, mask) -> None:
        super().use_format(mask)
        self.lookup.use_format(mask)
        self.model.use_format(mask)

    def begin(self, prompt: list[int]) -> None:
        self.model.begin(prompt)
        if self.extension is not None:
            self.extension.begin()
        self.copied = self.modelled = 0

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        draft = self._propose(context, k, sampling, generator)
        return self.extension.extend(context, draft, k, sampling) if self.extension is not None else draft

    def _propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        copy = self.lookup.propose(context, k, sampling, generator)
        if copy:
            self.copied += 1
            self.drafter = self.lookup
            return copy
        if self.policy is not None and not self.policy.draft_now(self.model):  # its steps do not pay now
            self.drafter = None
            return Draft()
        self.modelled += 1
        self.drafter = self.model
        return self.model.propose(context, min(k, self.model_k), sampling, generator)

    @property
    def source(self) -> Drafter | None:
        return self.drafter

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        if self.extension is not None:  # the extension learns from its nodes, the part from its own
            judged = self.extension.learn(judged)
        if self.drafter is not None:
            self.drafter.learn(judged)

    def take_features(self, hidden: torch.Tensor) -> None:
        self.model.take_features(hidden)

    def observe(self, context: list[int], num_accepted: int) -> None:
        self.model.observe(context, num_accepted)


@register("hybrid", needs_draft_model=True)
def _build(ctx: DrafterContext) -> Hybrid:
    spec = ctx.spec
    model = DraftModel(ctx.draft_model, min_confidence=spec.min_confidence, window=spec.window, trees=trees_for(ctx))
    # An explicit --k caps both; by default each part has its own cap (config.draft_cap).
    model_k = spec.cap_for("draft-model")
    return Hybrid(model, model_k=model_k, ngram_max=spec.ngram_max, ngram_min=spec.ngram_min)


@register("hybrid-head", needs_head=True)
def _build_head(ctx: DrafterContext) -> Hybrid:
    spec = ctx.spec
    model = drafter_of(FeatureHeadDrafter, ctx, alone=False)
    model_k = spec.cap_for("head")
    hybrid = Hybrid(model, model_k=model_k, ngram_max=spec.ngram_max, ngram_min=spec.ngram_min,
                    extension=lookup_extension(spec, model.trees))
    hybrid.name = "hybrid-head"
    return hybrid
