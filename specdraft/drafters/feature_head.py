"""A trained head on the target's features as the prophet (EAGLE-style, see heads.model).

The engine hands the drafter the target's final-norm hidden state f at the row that produced
the newest committed token x (after the prefill and after every verification: the verify
forward computes it anyway). A draft is then ``k`` head steps: (f, E[x]) -> f' -> guess from
the target's output head cut to the head's vocabulary -> (f', E[guess]) -> ... No cache, no
prefill, no catching up: a step costs a few ms, against ~38 ms for a 0.5B draft model's forward.

Greedy drafts stop early on the same cumulative-confidence rule as the draft model, with the
head's confidences calibrated by how often guesses of that confidence passed (costs.PassRates),
and the head is not run at all while its steps commit less per unit of cost than plain steps
(costs.Payoff). When the
target samples, each guess is sampled from the head's own distribution q (over its vocabulary,
zero elsewhere), so speculative sampling stays exact.
"""
from __future__ import annotations

import time

import torch

from ..config import SamplingConfig
from ..costs import running_mean
from ..errors import ParameterError
from ..models.quant import DenseLinear, W8A8Linear
from .base import Draft, DrafterContext, choose, register
from .cost_aware import CostAware


def output_weight(target, n: int) -> torch.Tensor:
    """[n, H] float32: the target's output head over its first n token ids (int8 rows dequantized)."""
    head = getattr(target, "lm_head", None)
    if hasattr(head, "dequantize_rows"):  # GGUF weights
        return head.dequantize_rows(n)
    if getattr(head, "qweight", None) is not None:
        return head.qweight[:n].float() * head.scales[:n, None]
    if getattr(head, "packed", None) is not None:  # fp32 weights in oneDNN's layout
        return head.packed.to_dense()[:n].float()
    if getattr(head, "weight", None) is not None:
        return head.weight[:n].float()
    raise ParameterError("this target's output head cannot be read by a drafting head; use the native runtime")


def output_rows(target, n: int):
    """A fast linear [B, H] float32 -> [B, n] float32 over the same rows (a w8a8 target's int8 rows
    are reused)."""
    head = getattr(target, "lm_head", None)
    if hasattr(head, "first_rows"):  # GGUF weights: the same kernel over the first n rows
        return head.first_rows(n)
    if getattr(head, "qweight", None) is not None:
        return W8A8Linear(None, quantized=(head.qweight[:n], head.scales[:n]))
    dense = DenseLinear(output_weight(target, n).to(target.dtype).contiguous())
    # the drafter's features are float32; a bf16 target's rows take them in its own dtype
    return lambda f: dense(f.to(target.dtype)).float()


class Int8Head:
    """The head's step (heads.model.FeatureHead.forward) with its two matrices in int8 (per output
    channel) and ~14-bit activations (W8A8Linear, 2 passes): 9.4 MB read per step instead of
    37.6 MB in fp32 (measured on the AVX2 machine: 3.2 ms per step in fp32). Guesses only: the
    target checks every one, so the head's rounding cannot change the output."""

    def __init__(self, head):
        self.head = head
        self.w1 = W8A8Linear(head.w1.weight.detach().float(), head.w1.bias.detach(), passes=2)
        self.w2 = W8A8Linear(head.w2.weight.detach().float(), head.w2.bias.detach(), passes=2)

    def __call__(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.head.step(f, e, self.w1, self.w2)


class FeatureHeadDrafter(CostAware):
    name = "head"
    uses_features = True

    def __init__(self, target, head, *, min_confidence: float = 0.0):
        super().__init__()
        self.head = head  # heads.model.FeatureHead (fp32, eval)
        self.step = Int8Head(head)  # its step as the drafter runs it
        self.embed = target.embed  # [V, H] the target's token embedding
        self.vocab = head.cfg.vocab
        self.out = output_rows(target, self.vocab)  # [H] -> [V']
        self.min_confidence = min_confidence
        self.feature: torch.Tensor | None = None  # [H] f at the newest committed token's row
        self.step_seconds = 0.0  # running mean seconds of one head guess

    def begin(self, prompt: list[int]) -> None:
        self.feature = None

    def take_features(self, hidden: torch.Tensor) -> None:
        self.feature = hidden.float()

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        if self.feature is None or k <= 0:
            return Draft()
        f = self.feature[None]  # [1, H]
        tok = context[-1]
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        p_all_pass, cumulative, confidences = 1.0, [], []  # P(all guesses so far pass), after each guess
        costed = self.costs is not None and self.costs.measured
        if costed and not self.payoff.worth_running():
            return Draft()
        draft_cost = self.step_seconds / self.costs.seconds[1] if costed else 0.0  # in one-token forwards
        t0 = time.perf_counter()
        for _ in range(k):
            f = self.step(f, self.embed[tok:tok + 1].float())  # [1, H] predicted next feature
            logits = self.out(f)[0]  # [V']
            tok, q, p = choose(logits, sampling, generator, self.min_confidence > 0.0 or costed)
            confidences.append(p)
            p_all_pass *= self.rates.rate(p) if costed else p
            cumulative.append(p_all_pass)
            if q is not None:
                qs.append(q)  # [V']
            tokens.append(tok)
            if costed and self.costs.best_length(cumulative, draft_cost) < len(cumulative):
                break  # this guess does not pay for its share of the verification: stop here
            if p_all_pass < self.min_confidence:  # the guess in hand is still proposed
                break
        self.step_seconds = running_mean(self.step_seconds, (time.perf_counter() - t0) / len(tokens))
        if costed:
            n = self.costs.choose_length(cumulative, draft_cost)
            tokens, qs = tokens[:n], qs[:n]
            self.step_cost = self.costs.ratio(n + 1) + draft_cost * len(confidences)
        self.proposed_confidences = confidences[:len(tokens)]
        return Draft(tokens, torch.stack(qs) if qs else None)

    def observe(self, context: list[int], num_accepted: int) -> None:
        self.learn_from_verdict(num_accepted)  # the feature itself is refreshed by take_features


@register("head", needs_head=True)
def _build(ctx: DrafterContext) -> FeatureHeadDrafter:
    return FeatureHeadDrafter(ctx.target, ctx.head, min_confidence=ctx.spec.min_confidence)
