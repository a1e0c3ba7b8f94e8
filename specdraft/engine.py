"""The draft -> verify -> commit loop.

Each step:
  1. the drafter proposes a chain or tree of guesses after the committed context, and the
     engine's policy (policy.DraftPolicy) keeps the likeliest ones that pay for their check on
     this machine (or skips drafting while the drafter's steps do not pay);
  2. the target runs one forward over [last committed token] + draft (K+1 tokens), whose
     row i predicts the token after draft[:i] (a tree: after node i's branch);
  3. the verifier accepts a prefix (a branch) of n draft tokens and adds one target token
     (recovered at the first rejection, bonus when all pass);
  4. the target's cache rolls back to the committed context minus its last token (the engine's
     cache invariant), and the drafter learns which guesses passed and observes the outcome.
Plain decoding (method "none") is the same loop with an empty draft, so the baseline runs the
very same runtime code. With a :class:`~specdraft.prefix.PrefixCache` the prefill runs only the part
of the prompt the target's cache does not already hold from the previous generation.

Every committed token is yielded as a :class:`Piece` that says where it came from (and, when
asked, its log-probability under the target); the prompt's tokens can be scored too, from the
prefill's rows (``prompt_scores``).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .config import GenerationConfig, SamplingConfig, SpecConfig
from .costs import ForwardCosts
from .drafters.base import Draft, Drafter
from .drafters.trees import node_depths, row_branches
from .errors import ContextLengthError, ParameterError
from .grammar import Constraint
from .metrics import SpecStats
from .models.base import ModelOutput
from .policy import DraftPolicy
from .prefix import PrefixCache, reuses_exactly
from .sampling import apply_penalties, argmax, make_generator, next_token, token_logprobs, topk_indices
from .verify import verify, verify_tree

SCORED_BLOCK = 128  # prompt rows a scored prefill runs at a time (their logits: 78 MB for 151,936 ids)
DRAFT = "draft"  # an accepted draft token
TARGET = "target"  # a token the target produced itself (prefill, recovered, bonus, plain)


@dataclass(frozen=True)
class Piece:
    token_id: int
    text: str  # the text this token adds ("" while a multi-byte character is incomplete)
    origin: str  # DRAFT or TARGET
    # with GenerationConfig.logprobs: the token's log-probability under the target (raw softmax)
    # and the most likely (id, log-probability) pairs of its row, most likely first
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


class Detokenizer:
    """Incremental decoding that never splits a multi-byte character.

    Decodes a short window of recent ids so the cost per token stays constant, and emits text
    only once it no longer ends in the replacement character of an incomplete byte sequence.
    """

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # ids up to here have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Text of ids still held back (an incomplete character at the very end), as decoded."""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]


class Engine:
    """Speculative generation with one target, one drafter (or none) and one tokenizer."""

    def __init__(self, target, tokenizer, drafter: Drafter | None, spec: SpecConfig,
                 eos_ids: set[int] | None = None, costs: ForwardCosts | None = None,
                 prefix: PrefixCache | None = None):
        self.target = target
        self.prefix = prefix  # what the target's cache holds from the previous generation, if kept
        # seconds per target forward by block size, measured as we go; the policy sizes drafts by it
        self.costs = costs if costs is not None else ForwardCosts()
        self.drafter = drafter if drafter is not None else Drafter()  # None: plain decoding, the empty drafter
        self.policy = DraftPolicy(self.costs, enabled=spec.cost_rule)
        if spec.cost_rule:
            self.drafter.use_policy(self.policy)
        self.tokenizer = tokenizer
        self.spec = spec
        self.eos_ids = set(eos_ids or ())
        self.stats = SpecStats(method=spec.method if drafter is not None else "none")
        self.token_ids: list[int] = []
        self.prompt_scores = None  # the latest stream's prompt scores (GenerationConfig.prompt_logprobs)

    def stream(self, prompt_ids: list[int], sampling: SamplingConfig = SamplingConfig(),
               gen: GenerationConfig = GenerationConfig()) -> Iterator[Piece]:
        """Yield committed tokens as Pieces; ``self.stats`` and ``self.token_ids`` hold the run."""
        if not prompt_ids:
            raise ContextLengthError("the prompt is empty; give at least one token of prompt")
        need = len(prompt_ids) + gen.max_new_tokens
        if need > self.target.max_length:
            raise ContextLengthError(
                f"prompt ({len(prompt_ids)} tokens) + max-new-tokens ({gen.max_new_tokens}) exceeds the "
                f"context of {self.target.max_length} tokens; shorten the prompt or lower max-new-tokens")
        if sampling.logit_bias and sampling.logit_bias[-1][0] >= self.target.vocab_size:
            raise ParameterError(f"logit bias names token id {sampling.logit_bias[-1][0]}, past the target's "
                                 f"vocabulary of {self.target.vocab_size}")
        stats = self.stats = SpecStats(method=self.stats.method, prompt_tokens=len(prompt_ids))
        # with an output format: the matcher of what the answer may be, fed every committed token
        constraint = None if gen.output_format is None else \
            Constraint(gen.output_format, self.tokenizer, self.target.vocab_size, self.eos_ids)
        # the format shapes the guesses: the drafter guesses what it allows, and the tokens it
        # forces go out as guesses too (drafting methods only: "none" stays plain decoding)
        format_guesses = constraint is not None and self.spec.format_guesses and stats.method != "none"
        # with GenerationConfig.prompt_logprobs: (logprob, most likely) of prompt tokens 1 .. n-1
        self.prompt_scores = None
        generator = make_generator(sampling.seed)
        detok = Detokenizer(self.tokenizer)
        pending = ""  # text held back: it may be the start of a stop string
        stopped = False  # a stop string ended the text
        context = list(prompt_ids)
        self.token_ids = generated = []
        prefix = self.prefix
        verified = list(prompt_ids)  # the prompt and every token a verdict committed: the cache holds a prefix of it
        held_rows: list[torch.Tensor] = []  # with a prefix cache: feature rows of the cache's positions, in order
        features, tap_key, rows_kept = False, (), False
        t_start = time.perf_counter()
        try:
            # Prefill: the cache takes the prompt (past what it holds already, when the previous
            # generation's cache is kept); the last prompt row's logits give the first token.
            # The drafter begins first: a begin that used the target changed its epoch, and the record is void.
            self.drafter.begin(list(prompt_ids))
            self.drafter.use_format(constraint.mask_after if format_guesses else None)
            features = self.drafter.uses_features  # the drafter reads target hidden states
            # and, for EAGLE-3 style drafters, the outputs of some layers (omitted when none, so a
            # model without taps serves every other drafter)
            taps = {"taps": self.drafter.feature_layers} if features and self.drafter.feature_layers else {}
            tap_key = tuple(taps.get("taps", ()))
            # every prompt row's features, or the last row's alone (the prefill then skips the
            # other rows' last-layer attention and MLP); a prefix cache holds rows for the first kind
            rows_kept = features and self.drafter.prompt_features
            # the held prefix that covers most of the prompt, put into the cache (until this
            # generation records what the cache then holds, nothing is live)
            kept, kept_rows = prefix.prepare(prompt_ids, rows_kept, tap_key) if prefix is not None else (0, None)
            scoring = gen.prompt_logprobs is not None
            if scoring:  # every prompt row's logits are wanted: the whole prompt runs
                kept, kept_rows = 0, None
            if kept:
                self.target.rollback(kept)
            else:
                self.target.reset()
            stats.cached_prompt_tokens = kept
            last_row = {"hidden_last_only": True} if features and not rows_kept else {}
            if scoring:
                out, self.prompt_scores = self._scored_prefill(prompt_ids, gen.prompt_logprobs, features, taps,
                                                               bool(last_row))
            else:
                out = self.target.forward(torch.tensor(prompt_ids[kept:], dtype=torch.int64), last_only=True,
                                          need_hidden=features, **taps, **last_row)
            # the repetition penalty's prompt ids (made only when a penalty or bias is asked for)
            prompt_set = torch.unique(torch.tensor(prompt_ids, dtype=torch.int64)) if sampling.penalized else None
            first = apply_penalties(out.logits[-1:], [], [[]], prompt_set, sampling)
            if constraint is not None:
                first = constraint.apply(first, Draft())
            new = [next_token(first[-1], sampling, generator)]
            if constraint is not None:
                constraint.commit(new)
            scores = self._scores(out.logits, [-1], new, gen)
            verified += new
            if self.drafter.output_topk:  # the target's runners-up after the last prompt token
                self.drafter.take_topk(prompt_ids[-1:], topk_indices(out.logits[-1:], self.drafter.output_topk))
            if features:  # every prompt row (the kept ones first), or the last; the last one chose the first new token
                prompt_rows = _features(out, slice(None))
                if kept_rows is not None:
                    prompt_rows = torch.cat([kept_rows, prompt_rows])
                self.drafter.take_features(prompt_rows)
                if prefix is not None and rows_kept:
                    held_rows.append(prompt_rows)
            origins = [TARGET]
            stats.time_prefill = time.perf_counter() - t_start
            if gen.max_new_tokens == 0:  # the prompt scored, nothing to generate
                return
            while True:
                # Commit: stop at EOS / max tokens; stream text; look for stop strings.
                done = False
                for tok, origin, (logprob, top) in zip(new, origins, scores):
                    if tok in self.eos_ids and (not gen.ignore_eos or constraint is not None):
                        done = True
                        break
                    generated.append(tok)
                    context.append(tok)
                    pending += detok.add(tok)
                    if gen.stop:
                        cut = _find_stop(pending, gen.stop)
                        if cut is not None:
                            pending = pending[:cut]
                            done = stopped = True
                        keep = 0 if done else _partial_stop(pending, gen.stop)
                    else:
                        keep = 0
                    text, pending = pending[:len(pending) - keep], pending[len(pending) - keep:]
                    yield Piece(tok, text, origin, logprob, top)
                    if done or len(generated) >= gen.max_new_tokens:
                        done = True
                        break
                stats.new_tokens = len(generated)
                if constraint is not None and constraint.stopped:  # the format is complete
                    done = True
                if done:
                    if not stopped:  # release an incomplete character held at the very end
                        pending += detok.flush()
                    break

                # 1. Draft.
                t0 = time.perf_counter()
                room = min(self.spec.draft_len, gen.max_new_tokens - len(generated) - 1)
                # (a plain step now and then: a one-token forward anchors the cost ratios, see costs)
                # (the tokens an output format forces: sure guesses, sent even where a plain step would anchor)
                forced = constraint.forced()[:room] if format_guesses and room > 0 else []
                drafted = room > 0 and (bool(forced) or not self.policy.wants_one()) and self.policy.draft_now(self.drafter)
                proposal = self.drafter.propose(context, room, sampling, generator) if drafted else Draft()
                cut = functools.partial(self.policy.cut, k=max(room, 0))
                # (with an output format: what it allows of the proposal, and what it forces)
                sent = cut(proposal) if constraint is None else constraint.fit(proposal, cut, forced)
                draft = sent.draft
                t1 = time.perf_counter()
                # 2. Verify: one target forward over [last token] + draft (a chain, or a tree whose
                # nodes sit at positions by depth and see only their ancestors).
                ids = torch.tensor([context[-1]] + draft.tokens, dtype=torch.int64)
                if draft.parents is None:
                    out = self.target.forward(ids, need_hidden=features, **taps)  # logits [K+1, V]
                    judged = self._judged(out.logits, generated, draft, prompt_set, sampling, constraint)
                    verdict = verify(judged, draft.tokens, draft.probs, sampling, generator)
                    path = list(range(verdict.num_accepted))
                    rows = list(range(verdict.num_accepted + 1))  # the committed tokens' rows
                else:
                    positions, mask = tree_layout(draft.parents, len(context) - 1)
                    out = self.target.forward(ids, positions=positions, tree_mask=mask, need_hidden=features, **taps)
                    judged = self._judged(out.logits, generated, draft, prompt_set, sampling, constraint)
                    verdict = verify_tree(judged, draft.tokens, draft.parents, draft.probs, sampling, generator)
                    path = verdict.path
                    rows = [0] + [1 + j for j in path]
                self.costs.record(len(ids), time.perf_counter() - t1)
                # 3. Keep the committed context minus its newest token in the target's cache: a
                # chain rolls back by length, a tree's accepted path moves next to the prefix.
                n = verdict.num_accepted
                if features:  # the committed rows; the last one chose the newest token
                    committed = _features(out, rows)
                    self.drafter.take_features(committed)
                    if prefix is not None and rows_kept:
                        held_rows.append(committed)
                if self.drafter.wants_outputs:  # the target's choice after every proposed node sent, right or not
                    self.drafter.take_outputs(_by_proposed_node(argmax(out.logits).tolist(), sent))
                if self.drafter.output_topk:  # its runners-up after every row, right or not
                    self.drafter.take_topk(ids.tolist(), topk_indices(out.logits, self.drafter.output_topk))
                if len(draft) and drafted:
                    self.drafter.learn(DraftPolicy.judged(sent, path))
                if draft.parents is None:
                    self.target.rollback(len(context) + n)
                else:
                    self.target.compact(len(context), torch.tensor([len(context) - 1 + r for r in rows[1:]],
                                                                   dtype=torch.int64))
                new = verdict.tokens(draft.tokens)
                if constraint is not None:
                    constraint.commit(new)
                scores = self._scores(out.logits, rows, new, gen)
                verified += new
                origins = [DRAFT] * n + [TARGET]
                stats.record_step(len(draft), n, len(new))
                self.drafter.observe(context + new, n)
                if drafted and self.drafter.source is not None:  # its steps' cost, less any catching up
                    source = self.drafter.source
                    self.policy.record(source, sent, path, max(0.0, t1 - t0 - source.catch_up_seconds))
                t2 = time.perf_counter()
                stats.time_draft += t1 - t0
                stats.time_verify += t2 - t1
        finally:
            stats.new_tokens = len(generated)
            stats.time_total = time.perf_counter() - t_start
            if prefix is not None:  # the cache's positions hold verified[:length] (record() checks the count)
                prefix.record(verified[:self.target.length], torch.cat(held_rows) if rows_kept and held_rows else None,
                              tap_key)
        if pending:  # generation ended on a partial stop string that never completed
            yield Piece(generated[-1] if generated else -1, pending, TARGET)

    def _scored_prefill(self, prompt_ids: list[int], top: int, features: bool, taps: dict,
                        last_hidden_only: bool) -> tuple[ModelOutput, list]:
        """The prompt's prefill with every row's logits, each scoring the prompt token after it:
        (the output a one-block prefill gives the engine, (logprob, top) of prompt tokens 1..n-1).
        In blocks of SCORED_BLOCK rows (logits [rows, V] each, not [n, V] at once) where the
        target's rows do not depend on their block, so the output keeps a whole prefill's bits;
        in one block otherwise."""
        n = len(prompt_ids)
        block = SCORED_BLOCK if reuses_exactly(self.target) else n
        scores, hidden, tapped = [], [], []
        for s in range(0, n, block):
            ids = prompt_ids[s:s + block]
            out = self.target.forward(torch.tensor(ids, dtype=torch.int64), need_hidden=features, **taps)
            following = prompt_ids[s + 1:s + 1 + len(ids)]  # what these rows predict (the last row: none)
            scores += token_logprobs(out.logits[:len(following)], following, top)
            hidden.append(out.hidden)
            tapped.append(out.taps)
        if not features:
            return ModelOutput(out.logits[-1:], None), scores
        h = torch.cat(hidden)
        t = torch.cat(tapped) if tapped[0] is not None else None
        if last_hidden_only:
            h, t = h[-1:], (None if t is None else t[-1:])
        return ModelOutput(out.logits[-1:], h, t), scores

    @staticmethod
    def _judged(logits: torch.Tensor, generated: list[int], draft: Draft, prompt: torch.Tensor | None,
                sampling: SamplingConfig, constraint: Constraint | None) -> torch.Tensor:
        """The check's logits [K+1, V] as the verifier judges them: with the sampling's penalties,
        row 0 by the generated tokens, a guess's row by them and its branch (chain: the guesses
        before and including it; tree: its ancestors and itself); with an output format, each
        row's ruled-out ids at -inf (grammar.Constraint.apply: by the same branches)."""
        judged = Engine._penalized(logits, generated, draft, prompt, sampling)
        return judged if constraint is None else constraint.apply(judged, draft)

    @staticmethod
    def _penalized(logits: torch.Tensor, generated: list[int], draft: Draft, prompt: torch.Tensor | None,
                   sampling: SamplingConfig) -> torch.Tensor:
        if not sampling.penalized:
            return logits
        return apply_penalties(logits, generated, row_branches(draft.tokens, draft.parents), prompt, sampling)

    @staticmethod
    def _scores(logits: torch.Tensor, rows: list[int], tokens: list[int], gen: GenerationConfig) -> list:
        """Per committed token, (its log-probability, its row's most likely), or (None, ()) when
        the generation asks for none: logits [N, V], of which rows[i] chose (or passed) tokens[i]
        (gathered only when asked: [len(rows), V] is ~0.6 MB a row of the 152k vocabulary)."""
        if gen.logprobs is None:
            return [(None, ())] * len(tokens)
        return token_logprobs(logits[rows], tokens, gen.logprobs)

    def generate(self, prompt_ids: list[int], sampling: SamplingConfig = SamplingConfig(),
                 gen: GenerationConfig = GenerationConfig()) -> tuple[str, list[Piece]]:
        pieces = list(self.stream(prompt_ids, sampling, gen))
        return "".join(p.text for p in pieces), pieces


def tree_layout(parents: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [N+1] and attention mask [N+1, N+1] of a tree forward over [last token] + nodes:
    the last committed token sits at ``start``, node j at start + its depth, and each row sees
    itself and its ancestors (the root row 0 is every node's ancestor).

    >>> tree_layout([-1, -1, 0], 10)[0].tolist()
    [10, 11, 11, 12]
    """
    N = len(parents)
    mask = torch.zeros(N + 1, N + 1, dtype=torch.bool)
    mask[:, 0] = True
    for j, parent in enumerate(parents):
        mask[j + 1] = mask[parent + 1]
        mask[j + 1, j + 1] = True
    return torch.tensor([0, *node_depths(parents)], dtype=torch.int64) + start, mask


def _features(out, rows) -> torch.Tensor:
    """What take_features gets for ``rows`` of a target forward: hidden [n, H], or [n, (k + 1) H]
    with the tapped layers' outputs first when the forward tapped k layers."""
    if out.taps is None:
        return out.hidden[rows]
    return torch.cat([out.taps[rows].flatten(1), out.hidden[rows]], -1)


def _by_proposed_node(choices: list[int], sent) -> list[int | None]:
    """The target's choices after the rows of a check ([root] + the sent nodes; ``sent``:
    policy.Sent) by proposed node: [0] after the root, [1 + j] after proposed node j, None where
    node j was not sent."""
    out: list[int | None] = [choices[0]] + [None] * sent.proposed
    for i, j in enumerate(sent.nodes):
        if j >= 0:  # (-1: a node the drafter did not propose, grammar.Constraint.fit)
            out[1 + j] = choices[1 + i]
    return out


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string starts in text, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _partial_stop(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
