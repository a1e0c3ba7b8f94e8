"""The engine's draft policy (policy.DraftPolicy): which part of a proposal the target checks,
which proposed nodes the verifier judged, and skipping a drafter whose steps do not pay."""
from __future__ import annotations

import time

import torch

from _tiny import FakeTokenizer, tree_target
from specdraft.config import DEFAULT_K, RULED_K, GenerationConfig, SamplingConfig, SpecConfig, draft_cap
from specdraft.costs import ForwardCosts, Payoff
from specdraft.drafters.base import Draft, Drafter
from specdraft.engine import Engine
from specdraft.policy import DraftPolicy, Sent


def costs(**ms) -> ForwardCosts:
    c = ForwardCosts()
    for t, v in ms.items():
        c.record(int(t[1:]), v / 1000)
    return c


def fixed_costs(**ms) -> ForwardCosts:
    """The same table, not learning from the forwards an engine times while it generates."""
    return ForwardCosts.fixed({int(t[1:]): v / ms["t1"] for t, v in ms.items() if t != "t1"}, ms["t1"] / 1000)


FLAT = dict(t1=60, t2=61, t3=62, t4=63, t5=64, t6=65, t7=66)  # checking more guesses nearly free
STEEP = dict(t1=60, t2=90, t3=120, t4=150, t5=180, t6=210, t7=240)  # half a forward a guess
# a tree: 5 -> (6 -> 8, 7), 9; its nodes' chances of being on the accepted path
TREE = Draft([5, 6, 7, 8, 9], parents=[-1, 0, 0, 1, -1], chances=[0.9, 0.6, 0.2, 0.5, 0.01],
             probs=torch.eye(10)[[5, 6, 7, 8, 9]])


def test_a_chain_is_cut_to_the_guesses_that_pay():
    chain = Draft([1, 2, 3, 4], chances=[0.9, 0.8, 0.3, 0.1], probs=torch.rand(4, 10))
    assert DraftPolicy(ForwardCosts()).cut(chain, 4).draft is chain  # nothing timed yet: all of it
    assert DraftPolicy(ForwardCosts()).cut(chain, 2).draft.tokens == [1, 2]  # never deeper than k
    flat, steep = DraftPolicy(costs(**FLAT)), DraftPolicy(costs(**STEEP))
    assert flat.cut(chain, 4).draft.tokens == [1, 2, 3, 4]
    sent = steep.cut(chain, 4)
    assert sent.draft.tokens == [1, 2] and sent.nodes == [0, 1] and sent.draft.parents is None
    assert torch.equal(sent.draft.probs, chain.probs[:2]) and sent.draft.chances == [0.9, 0.8]
    assert DraftPolicy(costs(**STEEP), enabled=False).cut(chain, 4).draft is chain  # the rule off
    unrated = Draft([1, 2, 3, 4])
    assert steep.cut(unrated, 4).draft is unrated  # no chances: sent whole (e.g. a sampled draft)


def test_the_draft_cap_is_the_rule_s_where_the_rule_sizes_drafts():
    """With the cost rule the cap only bounds how far a long right guess may run (RULED_K); without
    it each drafter keeps its own measured length; an explicit k wins either way."""
    assert SpecConfig(method="prompt-lookup").draft_len == RULED_K > DEFAULT_K["prompt-lookup"]
    assert SpecConfig(method="prompt-lookup", cost_rule=False).draft_len == DEFAULT_K["prompt-lookup"]
    assert SpecConfig(method="suffix", cost_rule=False).draft_len == 8  # not listed: 8
    assert SpecConfig(method="hybrid-head", k=3).draft_len == 3
    assert draft_cap("head") == RULED_K and draft_cap("head", cost_rule=False) == DEFAULT_K["head"]


def test_a_tree_keeps_its_likeliest_nodes_parents_first():
    sent = DraftPolicy(ForwardCosts()).cut(TREE, 8)
    assert sent.draft is TREE  # nothing timed, 5 nodes <= k
    sent = DraftPolicy(ForwardCosts()).cut(TREE, 3)  # the k likeliest: 5, 6, 8
    assert sent.nodes == [0, 1, 3] and sent.draft.tokens == [5, 6, 8]
    assert sent.draft.parents is None  # a chain now: checked as one
    assert torch.equal(sent.draft.probs, TREE.probs[[0, 1, 3]]) and sent.proposed == 5
    assert DraftPolicy(ForwardCosts()).cut(TREE, 1).nodes == [0]  # no node deeper than k, at most k nodes
    assert DraftPolicy(costs(**FLAT)).cut(TREE, 1).nodes == [0]  # depth 1 only (and 9's 1% does not pay)
    flat = DraftPolicy(costs(**FLAT)).cut(TREE, 8)
    assert flat.nodes == [0, 1, 2, 3] and flat.draft.parents == [-1, 0, 0, 1]  # 9 (1%) does not pay even here
    steep = DraftPolicy(costs(**STEEP)).cut(TREE, 8)
    assert steep.nodes == [0] and steep.draft.tokens == [5]


def test_a_tree_grows_while_one_more_round_pays_once():
    """worth_expanding charges a drafting round once, not once per node: where checks are free a
    tree of many weak nodes still grows along its likely branch (a per-node charge stopped such
    trees at depth 2), and a round stops paying when its best child is too unlikely for what the
    round costs; where checks are dear only the likeliest nodes are worth expanding."""
    free = DraftPolicy(ForwardCosts.fixed({t: 1.0 for t in range(2, 33)}, 0.02))
    steep = DraftPolicy(costs(**STEEP))
    # 12 nodes: a likely branch (0.9, then 0.8) and ten weak ones; the newest layer is [1, 2, 3]
    chance = [0.9, 0.8] + [0.05] * 10
    layer = [1, 2, 3]
    assert free.worth_expanding(layer, chance, draft_cost=0.07) == layer  # every node pays; 0.8 is worth a round
    assert free.worth_expanding([2, 3], chance, draft_cost=0.07) == []  # a 5% child is not
    assert free.worth_expanding(layer, chance, draft_cost=2.0) == []  # nor a round costing 2 forwards
    assert steep.worth_expanding(layer, chance, draft_cost=0.07) == [1]  # half a forward a node: the likely one
    # the per-node charge stops the first tree: one more guess at 0.07 each looks worse than 2
    ranked = sorted(chance, reverse=True)
    assert free.best_length([*ranked, chance[1]], 0.07) <= len(ranked)


def test_the_judged_nodes_are_the_children_of_the_root_and_of_the_accepted_path():
    tree = Sent(Draft([5, 6, 7, 8, 9], parents=[-1, 0, 0, 1, -1]), [10, 11, 12, 13, 14], 15)
    # accepted 5 then 6: judged are the root's children (5, 9), 5's (6, 7) and 6's (8)
    assert DraftPolicy.judged(tree, [0, 1]) == [(10, True), (11, True), (12, False), (13, False), (14, False)]
    assert DraftPolicy.judged(tree, []) == [(10, False), (14, False)]  # nothing passed: the root's children
    chain = Sent(Draft([1, 2, 3]), [0, 1, 2], 3)
    assert DraftPolicy.judged(chain, [0]) == [(0, True), (1, False)]  # the third guess was never judged
    assert DraftPolicy.judged(chain, [0, 1, 2]) == [(0, True), (1, True), (2, True)]


def test_a_drafter_is_credited_with_the_passed_nodes_it_proposed():
    """A format's forced tokens (Sent.nodes -1) would go out without the drafter: its payoff
    counts only the passed nodes it proposed, at the whole check's cost."""
    policy = DraftPolicy(costs(**FLAT))
    drafter = object()
    # forced 5 -> 6 merged with the drafter's 5 (its node 0) and its 7 under 6 (its node 2)
    sent = Sent(Draft([5, 6, 7], parents=[-1, 0, 1]), [0, -1, 2], 3)
    policy.record(drafter, sent, [0, 1, 2], 0.0)
    assert policy.payoff(drafter).tokens == 3.0  # 1 + its 5 and 7, not the forced 6
    assert policy.payoff(drafter).cost == policy.costs.ratio(4)
    alone = DraftPolicy(costs(**FLAT))
    alone.record(drafter, Sent(Draft([5, 6]), [-1, -1], 0), [0, 1], 0.0)  # nothing of its own passed
    assert alone.payoff(drafter).tokens == 1.0


class Fixed(Drafter):
    """Proposes the same tree every step, taking ``seconds`` (slept) to draft it; records what it learns."""

    def __init__(self, seconds: float = 0.0):
        self.learned, self.calls, self.seconds = [], 0, seconds

    def propose(self, context, k, sampling, generator):
        self.calls += 1
        if self.seconds:
            time.sleep(self.seconds)
        # guesses the target never makes (token 0 at the root, ...): cut or rejected
        return Draft([0, 1, 2, 3], parents=[-1, 0, -1, 2], chances=[0.9, 0.3, 0.8, 0.2])

    def learn(self, judged):
        self.learned.append(judged)


def test_the_payoff_leaves_a_drafters_catching_up_out(tmp_path):
    """What a step's drafting cost the payoff is its time less the drafter's catch_up_seconds: a
    drafter skipped for a while catches up when it next drafts, a cost that running every step
    would not have."""
    target = tree_target("dense", tmp_path)
    for catch_up in (0.0, 1e6):
        drafter = Fixed()
        drafter.catch_up_seconds = catch_up
        e = Engine(target, FakeTokenizer(), drafter, SpecConfig(method="fixed", k=2))
        seen = []
        e.policy.record = lambda source, sent, path, seconds, seen=seen: seen.append((source, seconds))
        e.generate([3, 4, 5, 3], SamplingConfig(), GenerationConfig(max_new_tokens=5, ignore_eos=True))
        assert seen and all(source is drafter for source, _ in seen)
        assert all(s > 0.0 for _, s in seen) if catch_up == 0.0 else all(s == 0.0 for _, s in seen)


def test_the_engine_cuts_learns_by_proposed_node_and_skips_what_does_not_pay(tmp_path):
    target = tree_target("dense", tmp_path)
    drafter = Fixed()
    e = Engine(target, FakeTokenizer(), drafter, SpecConfig(method="fixed", k=2, cost_rule=False))
    e.generate([3, 4, 5, 3], SamplingConfig(), GenerationConfig(max_new_tokens=6))
    plain = Engine(target, FakeTokenizer(), None, SpecConfig(method="none"))
    plain.generate([3, 4, 5, 3], SamplingConfig(), GenerationConfig(max_new_tokens=6))
    assert e.token_ids == plain.token_ids
    # the rule off: the k = 2 likeliest nodes, the root's children 0 and 2, went out as sent nodes 0
    # and 1; both are judged every step, named by their place in the proposal
    assert [j for j, _ in drafter.learned[0]] == [0, 2]
    assert all({j for j, _ in judged} <= {0, 2} for judged in drafter.learned)  # (the last step: room for 1)

    drafter = Fixed(seconds=0.003)  # 0.05 of the curve's one-token forward a step: not free
    steep = fixed_costs(**STEEP)
    e = Engine(target, FakeTokenizer(), drafter, SpecConfig(method="fixed", k=2), costs=steep)  # kept while generating
    steps = Payoff.WARMUP + 6 * Payoff.EXPLORE
    e.generate([3, 4, 5, 3], SamplingConfig(), GenerationConfig(max_new_tokens=steps, ignore_eos=True))
    assert e.token_ids[:6] == plain.token_ids
    payoff = e.policy.payoff(drafter)
    assert payoff.skipped > 0 and drafter.calls < e.stats.target_forwards  # skipped after its warm-up
    assert drafter.calls >= Payoff.WARMUP + 2  # explored now and then: after 8 skipped steps, then 16
    assert payoff.period >= 4 * Payoff.EXPLORE  # each explored step still not paying: a longer wait


def test_a_drafter_that_costs_nothing_to_run_is_never_skipped(tmp_path):
    # the skip test's drafter, curve and steps, its drafting free (as a copy prophet's): the cost
    # rule alone sizes its drafts, and it proposes every step
    target = tree_target("dense", tmp_path)
    drafter = Fixed()
    steep = fixed_costs(**STEEP)
    e = Engine(target, FakeTokenizer(), drafter, SpecConfig(method="fixed", k=2), costs=steep)
    e.generate([3, 4, 5, 3], SamplingConfig(), GenerationConfig(max_new_tokens=Payoff.WARMUP + 6 * Payoff.EXPLORE,
                                                                ignore_eos=True))
    payoff = e.policy.payoff(drafter)
    assert payoff.steps > Payoff.WARMUP and payoff.tokens < payoff.cost  # its steps do not pay...
    assert payoff.skipped == 0 and drafter.calls == e.stats.target_forwards - 1  # ...and asked every step (after the prefill's)
