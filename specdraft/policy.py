"""The engine's draft policy: how much of a proposal the target checks, and whether to draft at all.

A drafter proposes a chain or a tree of guesses and rates each node: ``Draft.chances``, its
chance of being on the accepted path (the drafter's confidences, calibrated by how often such
guesses passed). What a check of n guesses costs is the target's forward over n + 1 tokens, timed
while decoding (costs.ForwardCosts), and differs by CPU: ~1.1x one token for 2 tokens and ~1.6x
for 4 on a Zen 4 EPYC with the VNNI kernels, ~2.5x for 4 on an AVX2 EPYC. So one rule, here, for
every drafter:

* ``cut``: keep the n likeliest nodes (a child never before its parent) where n maximises
  expected committed tokens per unit of forward cost (ForwardCosts.choose_length); before a
  forward is timed, or with the cost rule off, the k likeliest;
* ``draft_now``: skip a drafter while its steps commit less per unit of cost (the check's
  cost plus the drafting time, both measured here) than plain steps do (costs.Payoff, one per
  drafter: a composite asks for its parts, e.g. hybrid for its model prophet, its copies being
  free; a drafter whose drafting costs nearly nothing is never skipped);
* ``judged``: which of the proposed nodes the verifier judged and whether each passed, for the
  drafter to calibrate its confidences on (Drafter.learn).

Drafters whose guesses cost time to make (a head step, a draft model's forward) also read
``best_length`` while drafting, to stop where a further guess would not pay.
"""
from __future__ import annotations

from dataclasses import dataclass

from .costs import ForwardCosts, Payoff
from .drafters.base import Draft
from .drafters.trees import best_nodes, keep_nodes, node_depths


@dataclass(frozen=True)
class Sent:
    """What the target checks: ``draft``, whose node i is the proposal's node ``nodes[i]`` (-1: a
    node the drafter did not propose, an output format's forced token), of a proposal of
    ``proposed`` nodes."""

    draft: Draft
    nodes: list[int]
    proposed: int


class DraftPolicy:
    """The engine's cost rule over one drafter (``enabled``: SpecConfig.cost_rule)."""

    def __init__(self, costs: ForwardCosts, enabled: bool = True):
        self.costs = costs  # the target's forward times by block size, shared with the engine
        self.enabled = enabled
        self.payoffs: dict[int, Payoff] = {}  # id(drafter) -> whether its steps pay

    def payoff(self, drafter) -> Payoff:
        return self.payoffs.setdefault(id(drafter), Payoff())

    @property
    def active(self) -> bool:
        """The rule applies: it is on and a one-token forward has been timed."""
        return self.enabled and self.costs.measured

    def in_forwards(self, seconds: float) -> float:
        """``seconds`` in one-token target forwards of the current phase (0 before one is timed)."""
        one = self.costs.one_now
        return seconds / one if one else 0.0

    def best_length(self, sure: list[float], draft_cost: float = 0.0, free: int = 0) -> int:
        """ForwardCosts.best_length: how many guesses of these chances (sure[i]: P(the first
        i + 1 all pass)) pay, each costing ``draft_cost`` one-token forwards to make."""
        return self.costs.best_length(sure, draft_cost, free)

    def worth_expanding(self, layer: list[int], chance: list[float], draft_cost: float) -> list[int]:
        """For a dynamic tree (drafters.trees.grow_tree): the nodes of ``layer`` (likeliest first)
        whose children could still be sent: those at least as likely as the least likely node
        this rule would send now (drafting so far sunk), while one more round, costing
        ``draft_cost`` one-token forwards once, could raise the step's tokens per cost: its best
        child, at most as likely as its parent, joining the nodes sent. On a CPU where each checked
        node costs much (AVX2: 2 tokens 1.1x one, 4 tokens 1.6x) this is mostly one node a round,
        as in a chain, with the siblings of each round for free; where checks are cheap the tree
        goes deeper as long as its likeliest branch is worth a round."""
        ranked = sorted(chance, reverse=True)
        n = self.best_length(ranked)
        if n == 0:
            return []
        floor = ranked[n - 1]
        keep = [j for j in layer if chance[j] >= floor]
        # the round's cost is charged once, whatever the number of nodes sent (charged per node,
        # it would stop trees at depth 2 wherever many cheap nodes pay their checks)
        with_child = sorted([*ranked, chance[keep[0]]], reverse=True) if keep else []
        if keep and self.costs.best_value(with_child, draft_cost) <= self.costs.best_value(ranked):
            return []
        return keep

    def wants_one(self) -> bool:
        """The cost rule is on and a one-token forward is due to anchor its ratios (ForwardCosts)."""
        return self.enabled and self.costs.wants_one()

    def draft_now(self, drafter) -> bool:
        """Run ``drafter`` this step? No while its steps do not pay (then now and then: Payoff)."""
        return not self.active or self.payoff(drafter).worth_running()

    def cut(self, draft: Draft, k: int) -> Sent:
        """The part of a proposal the target checks: no node deeper than ``k``; then the likeliest
        nodes, as many as pay (cost rule active and the draft rated) or at most k. A tree whose kept
        nodes form a chain goes out as a chain."""
        depth = node_depths(draft.parents) if draft.parents is not None else list(range(1, len(draft) + 1))
        nodes = [j for j in range(len(draft)) if depth[j] <= k]  # closed under parents
        if draft.parents is None:  # a chain: its first n guesses (chances: P(all up to i pass))
            if draft.chances is not None and self.active:
                nodes = nodes[:self.costs.choose_length(draft.chances[:len(nodes)])]
        elif draft.chances is not None:
            ranked = best_nodes([draft.chances[j] for j in nodes], len(nodes))  # indices into nodes
            n = self.costs.choose_length([draft.chances[nodes[i]] for i in ranked]) if self.active \
                else min(k, len(ranked))
            nodes = sorted(nodes[i] for i in ranked[:n])
        else:
            nodes = nodes[:k]  # an unrated tree: its first k nodes (parents come first)
        if len(nodes) == len(draft):
            sent = draft
        else:
            tokens, parents = (draft.tokens[:len(nodes)], None) if draft.parents is None else \
                keep_nodes(draft.tokens, draft.parents, nodes)
            sent = Draft(tokens, None if draft.probs is None else draft.probs[nodes], parents,
                         None if draft.chances is None else [draft.chances[j] for j in nodes])
        if sent.parents is not None and sent.parents == list(range(-1, len(sent) - 1)):
            sent = Draft(sent.tokens, sent.probs, None, sent.chances)
        return Sent(sent, nodes, len(draft))

    def record(self, drafter, sent: Sent, path: list[int], draft_seconds: float) -> None:
        """A step ``drafter`` drafted was verified: the sent nodes ``path`` passed, for the check of
        ``sent`` and ``draft_seconds`` of drafting. It is credited with 1 + the passed nodes it
        proposed: an output format's forced tokens (Sent.nodes -1) would have been sent without
        it, so they do not make its steps look better than they were."""
        if self.active:
            drafting = self.in_forwards(draft_seconds)
            own = sum(1 for j in path if sent.nodes[j] >= 0)
            self.payoff(drafter).record(1 + own, self.costs.ratio(len(sent.draft) + 1) + drafting, drafting)

    @staticmethod
    def judged(sent: Sent, path: list[int]) -> list[tuple[int, bool]]:
        """(proposed node, passed) for every sent node the verifier judged: the children of the
        root and of the accepted nodes (``path``: sent nodes, root side first), which passed when
        on the path. Greedy, the target's choice is compared with each of them; sampling, a child
        after the accepted one counts as judged too (a slight undercount of its chance)."""
        parents = sent.draft.parents if sent.draft.parents is not None else list(range(-1, len(sent.draft) - 1))
        on_path = set(path)
        return [(sent.nodes[j], j in on_path) for j, parent in enumerate(parents)
                if (parent < 0 or parent in on_path) and sent.nodes[j] >= 0]
