"""A smaller language model as the prophet.

The draft model keeps its own KV cache. ``seq`` lists the tokens whose KV it holds. On each
``propose`` it feeds what it has not seen yet of the committed context in one forward (the
accepted guesses it never fed plus the target's token), then drafts k tokens one by one, sampling
from its own distribution q when the target samples.

Cache invariant: after ``propose(context, k)``, the draft cache holds ``context + draft[:-1]``
(the last draft token is never fed: its KV is only needed if all k are accepted, and then the
next ``propose`` feeds it together with the bonus token). ``observe(context, n)`` rewinds it by
count to the context and the first n guesses it fed (gpt-fast's rule: n is known, no token
lists are compared), so between steps ``seq`` is always a prefix of the committed context.

``window``: when > 0 and the prompt is longer, the draft model sees only the prompt's last
``window`` tokens (and everything generated after them). Its prefill of a long prompt (a RAG
document, an article to summarise) then costs a bounded time; lossless, since only the guesses
change. ``seq`` and the cache then hold ``context[offset:]``.

Drafts, once the engine has timed its target forwards (``use_policy``), are rated as the head's
are (drafters.feature_head): the draft's confidences calibrated by how often such guesses passed
(costs.PassRates; a sampled guess by its own probability under q, in a table of its own: how
often the verifier's min(1, p/q) kept guesses like it), another draft forward only while the
longer draft is expected to commit more per unit of cost (a draft forward counted in one-token
target forwards); the engine's policy sends the guesses that pay. While the draft model's steps
commit less per unit of cost than plain steps the engine does not ask it to draft; its cache
then catches up in one block when it next drafts, and that block's time over a step's forward
(``catch_up_seconds``) is left out of whether its steps pay: charged (its prompt's prefill
too), it kept a skipped draft model skipped (measured, Zen 4 EPYC, 13 prompts of 128 tokens: on
the first prompt 15 tokens drafted in 115 steps against 170 in 49, 1.15x `none` against 1.22x).

Greedy drafts are EAGLE-2 dynamic trees where the target verifies trees (``trees``): each round
feeds the likeliest nodes of the newest layer as one block (each at the position of its depth,
seeing the context and its ancestors' rows: a tree mask), whose logits give their children; a
block of 3 rows costs the draft little more than one row on a memory-bound CPU (0.5B draft,
Q4_K: 5.9 ms one row, 6.8 ms three, Zen 5). The root's children come from the forward that
catches up. After verification the accepted path's rows are kept (``compact``), the rest of the
tree forgotten, so the cache invariant above holds for trees as for chains.
"""
from __future__ import annotations

import time

import torch

from ..config import SamplingConfig
from ..costs import PassRates, running_mean
from ..heads.vocab import to_target
from .base import Draft, DrafterContext, RatedGuesses, choose, follow_format, register
from .trees import GrownTree, branch_of, node_depths, node_mask


class DraftModel(RatedGuesses):
    name = "draft-model"

    def __init__(self, model, *, min_confidence: float = 0.0, window: int = 0, trees: bool = False):
        super().__init__()  # rates: greedy confidences -> how often such guesses passed
        self.model = model
        # logit j of the draft model is token ids[j] where its output head lists its ids (the
        # target's frequent choices: pipeline.Speculator), token j where ids is None
        self.ids: torch.Tensor | None = getattr(model, "vocab_ids", None)
        self.trees = trees  # greedy drafts as dynamic trees (target and draft model take tree masks)
        # the tree drafted last, until observed: its nodes' cache rows (node -> row) after the
        # context's ``tree_base`` rows
        self.tree: GrownTree | None = None
        self.fed: dict[int, int] = {}
        self.tree_base = 0
        self.chain_base: int | None = None  # the cache's length before the chain drafted last fed its guesses
        self.q_rates = PassRates()  # sampled guesses: their probability under q -> how often they passed
        self.drawn = False  # the latest draft was sampled from q (its guesses count in q_rates)
        self.window = window
        self.offset = 0  # context[offset:] is what the draft model sees
        # Greedy without the cost rule: another draft forward only while the product of the probabilities of
        # the guesses so far is at least this (see propose).
        self.min_confidence = min_confidence
        self.seq: list[int] = []
        self.forward_seconds = 0.0  # running mean seconds of one draft forward of a step (1-3 tokens; not a catch-up)

    def begin(self, prompt: list[int]) -> None:
        self.model.reset()
        self.seq = []
        self.tree, self.fed, self.chain_base = None, {}, None
        self.offset = max(0, len(prompt) - self.window) if self.window > 0 else 0

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to ``context`` (``seq`` is a prefix of it: the cache invariant) and
        return the logits [V] for the next token."""
        context = context[self.offset:]
        n = min(len(self.seq), len(context) - 1)  # always feed at least one token to get fresh logits
        self.model.rollback(n)
        t0 = time.perf_counter()
        logits = self._forward(context[n:])
        if len(context) - n > 2:  # more than a step feeds: the part over a step's forward is catching up
            self.catch_up_seconds = max(0.0, time.perf_counter() - t0 - self.forward_seconds)
        self.seq = list(context)
        return logits

    def _forward(self, ids: list[int]) -> torch.Tensor:
        """Logits [V] after feeding ids; forwards of 1-2 tokens (a step's, not a prompt's catch-up)
        update the running mean of what a draft forward costs."""
        t0 = time.perf_counter()
        logits = self.model.forward(torch.tensor(ids, dtype=torch.int64), last_only=True).logits[-1]
        if len(ids) <= 2:
            self.forward_seconds = running_mean(self.forward_seconds, time.perf_counter() - t0)
        return logits

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        k = min(k, self.model.max_length - (len(context) - self.offset))
        if k <= 0:
            return Draft()
        # with timed target forwards: rated and stopped by cost (else by the confidence rule)
        costed = self.costed
        draft_cost = self.policy.in_forwards(self.forward_seconds) if costed else 0.0  # in one-token forwards
        self.tree, self.fed = None, {}
        self.catch_up_seconds = 0.0
        logits = self._sync(context)  # the first guess comes from the forward that catches up
        self.drawn = not sampling.greedy
        if self.trees and sampling.greedy:
            return self._propose_tree(logits, k, costed, draft_cost)
        self.chain_base = len(self.seq)  # the guesses fed below follow
        rates = self.judged_rates()
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        confidences, cumulative = [], []
        p_all_pass = 1.0  # the chance that every guess so far passes
        for i in range(k):
            if self.format_mask is not None:  # (q, when sampled, is then over what the format allows)
                logits = follow_format(logits[None], [tokens], self.format_mask, self.ids)[0]
            tok, q, p = choose(logits, sampling, generator, costed or self.min_confidence > 0.0)
            if q is not None and costed:
                p = float(q[tok])  # a sampled guess is rated by its probability under q
            if self.ids is not None:  # index j -> id ids[j]; q onto the ids
                tok, q = to_target(self.ids, tok, q, self.model.vocab_size)
            confidences.append(p)
            p_all_pass *= rates.rate(p) if costed else p
            cumulative.append(p_all_pass)
            if q is not None:
                qs.append(q)
            tokens.append(tok)
            # Another guess costs a draft forward and pays only if every guess before it passes.
            # With costs: go on while the longer draft is worth its forward and its verification;
            # without: while the draft itself is p_all_pass enough (the guess in hand is still proposed).
            more = (self.policy.best_length(cumulative + [p_all_pass * rates.rate(p)], draft_cost, free=1) > i + 1
                    if costed else p_all_pass >= self.min_confidence)
            if i + 1 < k and more:
                logits = self._forward([tok])
                self.seq.append(tok)
            else:
                break
        self.proposed = confidences if costed else []
        return Draft(tokens, torch.stack(qs) if qs else None, chances=cumulative if costed else None)

    def _propose_tree(self, logits: torch.Tensor, k: int, costed: bool, draft_cost: float) -> Draft:
        """An EAGLE-2 dynamic tree of up to k rounds (trees.grow_tree) after the synced cache;
        ``logits`` [V'] give the root's children. Round r feeds the nodes to expand as one block
        and leaves their rows in the cache (``fed``) for their descendants to attend to."""
        base = self.model.length  # the context's rows; the root (newest token) is row base - 1
        k = min(k, 1 + (self.model.max_length - base) // self.beam)  # every round but the first feeds <= beam rows

        def expand(layer: list[int], tree: GrownTree):
            if layer == [-1]:
                rows = logits[None]  # [1, V']
            else:
                t0 = time.perf_counter()
                depth = node_depths(tree.parents)
                before = self.model.length
                mask = node_mask(layer, tree.parents, self.fed, base, before)  # [B, before + B]
                out = self.model.forward(torch.tensor([tree.tokens[j] for j in layer], dtype=torch.int64),
                                         positions=torch.tensor([base - 1 + depth[j] for j in layer]),
                                         tree_mask=mask)
                self.fed.update((j, before + b) for b, j in enumerate(layer))
                rows = out.logits  # [B, V']
                self.forward_seconds = running_mean(self.forward_seconds, time.perf_counter() - t0)
            rows = rows.float()
            if self.format_mask is not None:  # children among what the output format allows after each branch
                rows = follow_format(rows, [[tree.tokens[i] for i in branch_of(j, tree.parents)] for j in layer],
                                     self.format_mask, self.ids)
            top = torch.softmax(rows, -1).topk(min(self.topk, rows.shape[-1]))
            return top.values.tolist(), (top.indices if self.ids is None else self.ids[top.indices]).tolist()

        self.tree_base = base
        self.tree = self.grow(expand, k, costed, draft_cost)
        self.proposed = self.tree.conf if costed else []
        return Draft(self.tree.tokens, parents=self.tree.parents, chances=self.tree.chance)

    def judged_rates(self) -> PassRates:
        """Sampled guesses are counted apart from greedy ones (their pass rate is min(1, p/q))."""
        return self.q_rates if self.drawn else self.rates

    def observe(self, context: list[int], num_accepted: int) -> None:
        """Keep in the cache the context and the accepted guesses it fed: after a chain, the
        first ``num_accepted`` of them (a rollback by length; the last guess and the target's
        token are fed by the next propose); after a tree, the accepted path's fed rows, moved
        next to the context's. After a step this drafter did not draft, nothing."""
        chain_base, self.chain_base = self.chain_base, None
        if chain_base is not None:
            keep = chain_base + min(num_accepted, len(self.seq) - chain_base)
            self.model.rollback(keep)
            del self.seq[keep:]
            return
        tree, self.tree = self.tree, None
        if tree is None:
            return
        node, rows = -1, []
        for tok in context[len(context) - 1 - num_accepted:len(context) - 1]:  # the accepted guesses
            node = next((j for j, (t, a) in enumerate(zip(tree.tokens, tree.parents)) if a == node and t == tok), -2)
            if node not in self.fed:
                break
            rows.append(self.fed[node])
        self.model.compact(self.tree_base, torch.tensor(rows, dtype=torch.int64))
        self.seq = self.seq[:self.tree_base] + context[len(context) - 1 - num_accepted:][:len(rows)]
        self.fed = {}


def trees_for(ctx: DrafterContext) -> bool:
    """Whether a draft model drafts trees: asked for, and both models take tree masks."""
    return ctx.spec.trees and all(getattr(m, "supports_tree", False) for m in (ctx.target, ctx.draft_model))


@register("draft-model", needs_draft_model=True)
def _build(ctx: DrafterContext) -> DraftModel:
    return DraftModel(ctx.draft_model, min_confidence=ctx.spec.min_confidence, window=ctx.spec.window,
                      trees=trees_for(ctx))
