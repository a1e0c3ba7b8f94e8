"""A trained head on the target's features as the prophet (EAGLE-style, see heads.model).

The engine hands the drafter the target's final-norm hidden state f at the row that produced
the newest committed token x (after the prefill and after every verification: the verify
forward computes it anyway); a head with taps (heads.model) also gets the outputs of its target
layers at that row and fuses them into f once per verification. A draft is then ``k`` head steps: (f, E[x]) -> f' -> guess from
the target's output head cut to the head's vocabulary -> (f', E[guess]) -> ... No cache, no
prefill, no catching up: a step costs a few ms, against ~38 ms for a 0.5B draft model's forward.

Each guess is rated by the product of the head's confidences along its branch, each calibrated
by how often guesses of that confidence passed (costs.PassRates); drafting stops where a further
guess would not pay for its step and its share of the check (the engine's policy, which also
sends only the guesses that pay and skips the head while its steps do not pay). When the
target samples, a chain's guesses are either drawn from the head's own distribution q (over its
vocabulary, zero elsewhere) or its most confident ones, verified one-hot, whichever way's first
guesses pass more often here (``sample_from_q``); trees are always the most confident children.
Speculative sampling stays exact either way.
"""
from __future__ import annotations

import time
import weakref

import torch

from ..config import SamplingConfig
from ..costs import BetterOfTwo, PassRates, running_mean
from ..errors import ParameterError
from ..heads.vocab import to_target
from ..models.quant import DenseLinear, W8A8Linear
from ..models.small_linear import drafter_linear, drafter_linear_of
from .base import Draft, DrafterContext, RatedGuesses, choose, follow_format, register
from .extend import LookupExtension, lookup_extension
from .trees import GrownTree, branch_of


def output_weight(target, n: int | torch.Tensor) -> torch.Tensor:
    """[n, H] float32: the target's output head over its first n token ids, or over the ids ``n``
    [n] (int8 rows dequantized)."""
    head = getattr(target, "lm_head", None)
    rows = slice(None, n) if isinstance(n, int) else n
    if hasattr(head, "dequantize_rows"):  # GGUF weights
        return head.dequantize_rows(n)
    if getattr(head, "qweight", None) is not None:
        return head.qweight[rows].float() * head.scales[rows, None]
    if getattr(head, "packed", None) is not None:  # fp32 weights in oneDNN's layout
        return head.packed.to_dense()[rows].float()
    if getattr(head, "weight", None) is not None:
        return head.weight[rows].float()
    raise ParameterError("this target's output head cannot be read by a drafting head; use the native runtime")


# target -> {which rows: output_rows' linear}: every drafter of the process over one target and one
# vocabulary reads the same rows (answers decoded together hold a drafter each; gathering the
# shipped head's 16,384 rows of the default target's Q6_K output head took ~0.1 s and ~21 MB a
# drafter, Zen 5 EPYC)
_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def output_rows(target, n: int | torch.Tensor):
    """A fast linear [B, H] float32 -> [B, n] float32 over the same rows (the first n, or the ids
    ``n`` [n]; a w8a8 target's int8 rows are reused); made once a target and rows (read only)."""
    key = n if isinstance(n, int) else n.numpy().tobytes()
    try:
        made = _ROWS.setdefault(target, {})
    except TypeError:  # a target that cannot be weakly referenced: made each time
        return _output_rows(target, n)
    if key not in made:
        made[key] = _output_rows(target, n)
    return made[key]


def _output_rows(target, n: int | torch.Tensor):
    head = getattr(target, "lm_head", None)
    if hasattr(head, "first_rows"):  # GGUF weights: the same kernel over those rows
        return head.first_rows(n) if isinstance(n, int) else head.select_rows(n)
    if getattr(head, "qweight", None) is not None:
        rows = slice(None, n) if isinstance(n, int) else n
        return W8A8Linear(None, quantized=(head.qweight[rows].contiguous(), head.scales[rows].contiguous()))
    dense = DenseLinear(output_weight(target, n).to(target.dtype).contiguous())
    # the drafter's features are float32; a bf16 target's rows take them in its own dtype (the
    # dtype held, not the target: _ROWS keeps this while the target lives)
    dtype = target.dtype
    return lambda f: dense(f.to(dtype)).float()


GREEDY = SamplingConfig()  # how a guess is chosen unless drawn from q (sample_from_q)


class QuantizedStep:
    """The head's step (heads.model.FeatureHead.forward) with its two matrices quantized
    (models.small_linear: Q6_K through the GGUF kernels, or int8): 8.0 MB read per step instead of
    37.6 MB in fp32 (measured on the AVX2 machine: 3.2 ms per step in fp32). Guesses only: the
    target checks every one, so the head's rounding cannot change the output."""

    def __init__(self, head):
        self.head = head
        self.w1 = drafter_linear_of(head.w1)
        self.w2 = drafter_linear_of(head.w2)

    def __call__(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.head.step(f, e, self.w1, self.w2)


class FeatureHeadDrafter(RatedGuesses):
    name = "head"
    uses_features = True
    prompt_features = False  # a draft starts from the newest committed row alone

    def __init__(self, target, head, *, min_confidence: float = 0.0, trees: bool = False,
                 extension: LookupExtension | None = None):
        super().__init__()  # rates: the head's confidences -> how often such guesses passed
        # its trees' likeliest nodes extended by lookup after them (drafters.extend; greedy only),
        # where it drafts alone: inside hybrid-head and fusion the composite extends the whole tree
        self.extension = extension if trees else None
        self.feature_layers = getattr(head.cfg, "taps", ())  # EAGLE-3 fused features (heads.model)
        self.fuse = None if not self.feature_layers else \
            drafter_linear(head.fuse.weight)  # [(k+1)H] -> [H], quantized like the step
        self.trees = trees  # greedy drafts as EAGLE-2 dynamic trees (the target verifies tree masks)
        self.head = head  # heads.model.FeatureHead (fp32, eval)
        self.step = self.build_step(head)  # its step as the drafter runs it
        self.embed = target.embed  # [V, H] the target's token embedding
        self.vocab = head.cfg.vocab
        # the target ids of the head's guesses [V'] (heads.vocab), None when they are 0..V'-1
        self.ids = head.token_ids() if getattr(head.cfg, "listed_vocab", False) else None
        self.out = output_rows(target, self.vocab if self.ids is None else self.ids)  # [H] -> [V']
        self.min_confidence = min_confidence
        self._feature: torch.Tensor | None = None  # [H] f at the newest committed token's row (``feature``)
        self._row: torch.Tensor | None = None  # [1, H] or [1, (k + 1) H]: that row as handed over, not yet fused
        self.step_seconds = 0.0  # running mean seconds of one head guess
        # sampling, chains: each guess drawn from the head's q (True), or its most confident one,
        # verified one-hot (False); lossless either way. None: whichever way's first guesses pass
        # more often in this process (costs.BetterOfTwo). Drawn from q passes more where q is close
        # to the target's p; for the shipped head the measurements disagree (temperature 0.7, AVX2
        # EPYC, 13 dev prompts: scripts/sampled_guesses.py, argmax 1.47-1.52 tokens a forward
        # against 1.35-1.36 from q; the bench 1.40 choosing against 1.43-1.46 from q; BENCHMARKS.md).
        self.sample_from_q: bool | None = None
        self.ways = BetterOfTwo()
        self.q_rates = PassRates()  # the pass rates of guesses drawn from q (all rated 1.0)
        self.drawn: bool | None = None  # the way of the chain proposed last (None: greedy, or a tree)

    def build_step(self, head):
        """What ``advance`` runs: the head's step with quantized matrices."""
        return QuantizedStep(head)

    def begin(self, prompt: list[int]) -> None:
        self.feature = None
        if self.extension is not None:
            self.extension.begin()

    def to_target(self, index: int, q: torch.Tensor | None = None) -> tuple[int, torch.Tensor | None]:
        """A guess's draft index as the target's token id, and its distribution q [V'] over the
        target's ids (zero outside the head's vocabulary), as the verifier reads them."""
        return to_target(self.ids, index, q, len(self.embed))

    @torch.inference_mode()
    def take_features(self, hidden: torch.Tensor) -> None:
        self.feature = None
        self._row = hidden[-1:]  # the row that chose the newest token, fused when a draft reads it

    @property
    def feature(self) -> torch.Tensor | None:
        """[H] the fused feature of the newest committed token's row (None before one is seen).
        Fused on first read: with taps, the fusion is a [(k + 1) H] -> [H] product (0.2-0.5 ms a
        row on a 2-core Zen 5 EPYC), wasted on the steps the policy skips the drafter, which in a
        batch of answers decoded together are most of them (costs.Payoff)."""
        if self._feature is None and self._row is not None:
            with torch.inference_mode():
                self._feature = self.fused(self._row)[0]
            self._row = None
        return self._feature

    @feature.setter
    def feature(self, value: torch.Tensor | None) -> None:
        self._feature, self._row = value, None

    def fused(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows as the engine hands them over ([n, H], or [n, (k + 1) H] with the tapped layers'
        outputs first) -> [n, H] float32 features, fused by the head's entry when it has taps."""
        rows = rows.float()
        if not self.feature_layers:
            return rows
        k, H = len(self.feature_layers), self.head.cfg.hidden_size
        return self.head.entry(rows[:, k * H:], rows[:, :k * H].view(-1, k, H), self.fuse)

    def ready(self) -> bool:
        """Whether a draft can start (a feature has been seen since ``begin``)."""
        return self._feature is not None or self._row is not None

    def advance(self, nodes: list[int], ids: list[int], parents: list[int], feats: list[torch.Tensor]) -> torch.Tensor:
        """[B, H] the features predicted from draft nodes (-1: the root) whose tokens are ``ids``
        [B]; ``parents`` and ``feats`` describe every node drafted so far (node j's token was
        chosen from feats[j]). The head needs only each node's own feature."""
        f = torch.stack([self.feature if j < 0 else feats[j] for j in nodes])  # [B, H]
        return self.step(f, self.embed[ids].float())

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        if not self.ready() or k <= 0:
            return Draft()
        node, tok = -1, context[-1]  # node -1: the root, the newest committed token
        tokens: list[int] = []
        parents: list[int] = []
        feats: list[torch.Tensor] = []  # [H] the feature each node's token was chosen from
        qs: list[torch.Tensor] = []
        p_all_pass, cumulative, confidences = 1.0, [], []  # P(all guesses so far pass), after each guess
        costed = self.costed
        draft_cost = self.policy.in_forwards(self.step_seconds) if costed else 0.0  # a guess, in one-token forwards
        if self.trees:  # (sampling too: deterministic children, verified one-hot, are lossless)
            tree = self._propose_tree(context, k, costed, draft_cost)
            return tree if self.extension is None else self.extension.extend(context, tree, k, sampling)
        t0 = time.perf_counter()
        self.drawn = None if sampling.greedy else \
            (self.sample_from_q if self.sample_from_q is not None else self.ways.pick())
        rates = self.judged_rates()
        for _ in range(k):
            f = self.advance([node], [tok], parents, feats)  # [1, H] predicted next feature
            logits = self.out(f)[0]  # [V']
            if self.format_mask is not None:  # (q, when sampled, is then over what the format allows)
                logits = follow_format(logits[None], [tokens], self.format_mask, self.ids)[0]
            tok, q, p = choose(logits, sampling if self.drawn else GREEDY, generator,
                               self.min_confidence > 0.0 or costed)
            tok, q = self.to_target(tok, q)
            confidences.append(p)
            p_all_pass *= rates.rate(p) if costed else p
            cumulative.append(p_all_pass)
            if q is not None:
                qs.append(q)  # [V']
            tokens.append(tok)
            parents.append(node)
            feats.append(f[0])
            node = len(tokens) - 1
            if costed and self.policy.best_length(cumulative, draft_cost) < len(cumulative):
                break  # this guess does not pay for its share of the verification: stop here
            if p_all_pass < self.min_confidence:  # the guess in hand is still proposed
                break
        self.step_seconds = running_mean(self.step_seconds, (time.perf_counter() - t0) / len(tokens))
        self.proposed = confidences
        return Draft(tokens, torch.stack(qs) if qs else None, chances=cumulative)

    def _propose_tree(self, context: list[int], k: int, costed: bool, draft_cost: float) -> Draft:
        """An EAGLE-2 dynamic tree of up to k rounds (trees.grow_tree), each round one batched head
        step; every node rated by its chance of being on the accepted path (the product of
        calibrated confidences along its branch), by which the engine's policy keeps the best ones.
        Children are deterministic guesses (one-hot for the verifier)."""
        self.drawn = None
        feats: list[torch.Tensor] = []  # [H] per node: the feature its token was chosen from

        def expand(layer: list[int], tree: GrownTree):
            ids = [context[-1] if j < 0 else tree.tokens[j] for j in layer]
            f = self.advance(layer, ids, tree.parents, feats)  # [B, H] the next features
            logits = self.out(f).float()  # [B, V']
            if self.format_mask is not None:  # children among what the output format allows after each branch
                logits = follow_format(logits, [[tree.tokens[i] for i in branch_of(j, tree.parents)] for j in layer],
                                       self.format_mask, self.ids)
            top = torch.softmax(logits, -1).topk(self.topk)  # values, indices [B, topk]
            feats.extend(f[b] for b in range(len(layer)) for _ in range(self.topk))  # grow_tree's child order
            return top.values.tolist(), [[self.to_target(t)[0] for t in row] for row in top.indices.tolist()]

        t0 = time.perf_counter()
        tree = self.grow(expand, k, costed, draft_cost)
        self.step_seconds = running_mean(self.step_seconds, (time.perf_counter() - t0) / tree.rounds)
        self.proposed = tree.conf
        return Draft(tree.tokens, parents=tree.parents, chances=tree.chance)

    def judged_rates(self) -> PassRates:
        """Guesses drawn from q (all rated 1.0) are counted apart from the most confident ones."""
        return self.q_rates if self.drawn else self.rates

    def learn(self, judged: list[tuple[int, bool]]) -> None:
        """RatedGuesses.learn, and the first guess's outcome for the way it was guessed (BetterOfTwo);
        the extension's nodes teach the extension."""
        if self.extension is not None:
            judged = self.extension.learn(judged)
        if self.drawn is not None:
            for j, passed in judged:
                if j == 0:
                    self.ways.record(self.drawn, passed)
        super().learn(judged)


def drafter_of(cls, ctx: DrafterContext, alone: bool = True) -> FeatureHeadDrafter:
    """A drafter on the target's features of class ``cls`` as ``--method`` builds it: trees where
    the target verifies them, extended by lookup after a guess unless ``--no-extend``, when it
    drafts ``alone`` (a composite's part is not: the composite extends its whole tree)."""
    trees = ctx.spec.trees and getattr(ctx.target, "supports_tree", False)
    return cls(ctx.target, ctx.head, min_confidence=ctx.spec.min_confidence, trees=trees,
               extension=lookup_extension(ctx.spec, trees) if alone else None)


@register("head", needs_head=True)
def _build(ctx: DrafterContext) -> FeatureHeadDrafter:
    return drafter_of(FeatureHeadDrafter, ctx)
