"""The one drafter protocol and the registry of drafters by name.

Every drafter ("prophet") is a :class:`Drafter` and answers the same calls, each with a no-op
default so a new drafter writes only what it needs:

* ``begin(prompt)``: a new sequence starts;
* ``propose(context, k, sampling, generator) -> Draft``: guesses that follow ``context`` (the
  prompt plus every committed token, as a list of ids), a chain or a tree no deeper than k, each
  node rated by its chance of being on the accepted path (``Draft.chances``). The engine's
  policy (policy.DraftPolicy) sends the likeliest nodes that pay for their check;
* ``learn(judged)``: after verification, (node, passed) for each proposed node the verifier
  judged (policy.DraftPolicy.judged): what calibrates the drafter's chances;
* ``observe(context, num_accepted)``: after verification, ``context`` is the new committed
  sequence and ``num_accepted`` says how many draft tokens made it, so stateful drafters can
  roll back (a draft model's KV cache) or learn (a datastore);
* ``catch_up_seconds``: what of the last ``propose`` went to catching the drafter's own state up
  with the context (a draft model's cache after its prompt or after steps it did not draft), which
  the engine's payoff leaves out;
* ``use_policy(policy)``: the engine's DraftPolicy (only when SpecConfig.cost_rule is on), for
  drafters whose guesses cost time to make: they stop drafting where a further guess would not
  pay (``policy.best_length``);
* ``take_features(hidden)``, for drafters with ``uses_features = True``: hidden [n, H] are the
  target's final-norm hidden states at the rows just committed to its cache, in order (after
  the prefill every prompt row; after a verification the newest context token's row and the
  accepted guesses' rows), so the last row is the one that chose the newest committed token.
  Called before ``observe``.
* ``take_outputs(choices)``, for drafters with ``wants_outputs = True``: after a verification,
  the target's greedy choice after every row of that forward: choices[0] after the newest
  committed token, choices[1 + j] after proposed node j (what the target would say next had the
  draft been right up to j; None for a node the policy did not send; lookahead's Jacobi
  iteration feeds on them). Called before ``observe``.
* ``take_topk(ids, top)``, for drafters with ``output_topk = K`` > 0: after the prefill and
  after every verification, ids [n] the tokens of the rows whose logits the forward gave (the
  prefill: the last prompt token; a check: the newest committed token, then every node sent)
  and top [n, K] the target's K likeliest next tokens after each (token recycling feeds on
  them). Called before ``observe``.

Plain decoding is the empty drafter, registered as "none". A draft carries optional per-token
probabilities q (None = deterministic, treated as one-hot by the verifier), optional tree
parents (None = a chain) and optionally the drafter's own rating of each node (``chances``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import SamplingConfig, SpecConfig
from ..costs import PassRates
from ..errors import ParameterError
from ..sampling import argmax, probs_from_logits, sample
from .trees import BEAM, TOPK, Expand, GrownTree, grow_tree


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)  # [K] draft token ids
    probs: torch.Tensor | None = None  # [K, V] q per position after sampling transforms, or None
    parents: list[int] | None = None  # [K] tree parent index (-1 = root), or None for a chain
    # [K] P(node on the accepted path) as the drafter judges it (its calibrated confidences; a
    # child's at most its parent's), or None: the engine's policy sends the likeliest nodes that
    # pay (None: the first ones), drafters that merge others' proposals rank nodes by it
    chances: list[float] | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter:
    """The drafter protocol, with no-op defaults (this base alone is plain decoding: no guesses)."""

    name = "none"
    uses_features = False  # True: the engine calls take_features after every target forward
    # after the prefill, take_features gets every prompt row (True) or the last one alone, the
    # row that chose the first new token (False: the target then skips its last layer's
    # attention and MLP for the other rows, as plain decoding's prefill does)
    prompt_features = True
    wants_outputs = False  # True: the engine calls take_outputs after every verification
    output_topk = 0  # K > 0: the engine calls take_topk with the target's top K after every row it scores
    feature_layers: tuple[int, ...] = ()  # target layers whose outputs take_features also gets
    policy = None  # the engine's policy.DraftPolicy (use_policy), when the cost rule is on
    format_mask = None  # an output format's allowed ids after a branch (use_format), or None
    # seconds of the last propose spent catching the drafter's own state up with the context (a
    # draft model's cache: its prompt, or the tokens of steps it did not draft): a drafter that
    # drafts every step never pays them, so whether its steps pay (costs.Payoff) leaves them out
    catch_up_seconds = 0.0

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        return Draft()

    def observe(self, context: list[int], num_accepted: int) -> None:
        pass

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        pass

    def use_policy(self, policy) -> None:
        self.policy = policy

    def use_format(self, mask: Callable[[list[int]], torch.Tensor] | None) -> None:
        """An answer held to an output format (grammar.Constraint.mask_after: the tokens after the
        committed context -> bool [V] over the target's ids, the ones the format allows next), or
        None for free text. A drafter that can drafts only what it allows (the trained drafters'
        trees: feature_head); the engine drops the rest of a deterministic proposal anyway."""
        self.format_mask = mask

    @property
    def source(self) -> Drafter | None:
        """Which drafter made the draft proposed last, for the policy's payoff: this one (a
        composite that drafts with one of its parts a step names that part, or None when it
        drafted nothing because that part's steps do not pay)."""
        return self

    @property
    def costed(self) -> bool:
        """The engine's cost rule is on and a target forward has been timed."""
        return self.policy is not None and self.policy.active

    def take_features(self, hidden: torch.Tensor) -> None:
        pass

    def take_outputs(self, choices: list[int]) -> None:
        pass

    def take_topk(self, ids: list[int], top: torch.Tensor) -> None:
        pass


class RatedGuesses(Drafter):
    """A drafter whose guesses carry a confidence (a head's or a draft model's probability, a trie
    node's share of its parent's occurrences), calibrated by how often guesses of that confidence
    passed (costs.PassRates): ``rates``, and ``proposed``, the confidence of each node proposed
    last, which ``learn`` turns into pass counts."""

    topk, beam = TOPK, BEAM  # a dynamic tree's children per expanded node, nodes expanded per round

    def __init__(self):
        self.rates = PassRates()
        self.proposed: list[float] = []  # per proposed node, until judged

    def grow(self, expand: Expand, k: int, costed: bool, draft_cost: float) -> GrownTree:
        """An EAGLE-2 dynamic tree of up to k rounds of ``expand`` (trees.grow_tree): with the cost
        rule, chances are the calibrated rates and only the nodes the engine's policy could still
        send are expanded (a round costing ``draft_cost`` one-token forwards); else raw confidences."""
        prune = (lambda layer, chance: self.policy.worth_expanding(layer, chance, draft_cost)) if costed else None
        return grow_tree(expand, k, self.rates.rate if costed else float, prune, self.beam)

    def judged_rates(self) -> PassRates:
        """The pass rates the latest proposal's guesses count toward (one table unless a drafter
        rates several ways of guessing apart)."""
        return self.rates

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        rates = self.judged_rates()
        for j, passed in judged:
            if j < len(self.proposed):
                rates.record(self.proposed[j], passed)
        self.proposed = []


def follow_format(logits: torch.Tensor, branches: list[list[int]], mask: Callable[[list[int]], torch.Tensor],
                  ids: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of ``logits`` [B, V'] with what an output format rules out after each row's branch
    (the tokens after the committed context; ``mask``: Drafter.format_mask) at -inf. The rows are
    over the drafter's ids: ``ids`` [V'] maps them to the target's (None: the first V'). A row
    whose allowed ids all lie outside the drafter's vocabulary stays as it is (the engine drops
    what it then guesses)."""
    V = logits.shape[-1]
    keep = torch.ones(logits.shape, dtype=torch.bool)
    for b, branch in enumerate(branches):
        allowed = mask(branch)  # [V] over the target's ids
        if ids is not None:
            allowed = allowed[ids]
        elif len(allowed) < V:  # a drafter's vocabulary past the target's
            allowed = torch.cat([allowed, allowed.new_zeros(V - len(allowed))])
        allowed = allowed[:V]
        if bool(allowed.any()):
            keep[b] = allowed
    return logits.masked_fill(~keep, float("-inf"))


def choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator,
           confidence: bool) -> tuple[int, torch.Tensor | None, float]:
    """A model drafter's next guess from its logits [V]: (token, q [V] when sampling else None,
    the guess's probability when greedy and ``confidence`` is asked for, else 1.0)."""

    if sampling.greedy:
        tok = int(argmax(logits))
        return tok, None, float(torch.softmax(logits.float(), -1)[tok]) if confidence else 1.0
    q = probs_from_logits(logits[None].float(), sampling)  # [1, V]
    return int(sample(q, generator)[0]), q[0], 1.0


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter factory may use to build a drafter."""

    spec: SpecConfig
    target: object  # the target model (CausalLM)
    draft_model: object | None  # the draft model (CausalLM), when one was loaded
    head: object | None = None  # a trained drafting head (heads.model.FeatureHead), when one was loaded
    target_dir: Path | None = None  # the target's model directory: its tokenizer.json names the vocabulary


DrafterFactory = Callable[[DrafterContext], Drafter]


@dataclass(frozen=True)
class _Entry:
    factory: DrafterFactory
    needs_draft_model: bool  # DrafterContext.draft_model must be loaded
    head_kind: str | None  # DrafterContext.head must be loaded, of this kind ("mlp", "eagle")


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, *, needs_draft_model: bool = False,
             needs_head: bool | str = False) -> Callable[[DrafterFactory], DrafterFactory]:
    """Class/function decorator: make a drafter available under ``name`` (``needs_head``: True
    for the MLP head, or the kind of trained drafter it reads, e.g. "eagle")."""

    def deco(factory: DrafterFactory) -> DrafterFactory:
        kind = "mlp" if needs_head is True else (needs_head or None)
        _REGISTRY[name] = _Entry(factory, needs_draft_model, kind)
        return factory

    return deco


def drafter_names() -> list[str]:
    """Every method name, "none" (plain decoding) first."""
    return sorted(_REGISTRY, key=lambda n: (n != "none", n))


def needs_draft_model(name: str) -> bool:
    _check(name)
    return _REGISTRY[name].needs_draft_model


def needs_head(name: str) -> bool:
    return head_kind(name) is not None


def head_kind(name: str) -> str | None:
    """The kind of trained drafter a method reads ("mlp", "eagle"), or None."""
    _check(name)
    return _REGISTRY[name].head_kind


def build_drafter(name: str, ctx: DrafterContext) -> Drafter:
    _check(name)
    return _REGISTRY[name].factory(ctx)


def _check(name: str) -> None:
    if name not in _REGISTRY:
        raise ParameterError(f"unknown method {name!r}; choose one of: {', '.join(drafter_names())}")


register("none")(lambda ctx: Drafter())  # plain decoding: the empty drafter
