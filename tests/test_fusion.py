"""Several prophets in one tree (drafters.fusion): proposals merged with shared prefixes, ranked
by each component's own ratings, greedy output equal to plain decoding, and every component
told how far the accepted path ran along its own proposal."""
from __future__ import annotations

import torch
from test_suffix_tree import PROMPT, run, target, twin  # noqa: F401  (fixtures)

from _tiny import FakeTokenizer
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters import Draft, Drafter
from specdraft.drafters.fusion import Fusion, matched_depth
from specdraft.drafters.suffix import HISTORY, SuffixTree
from specdraft.drafters.trees import merge_drafts
from specdraft.engine import Engine


def test_merge_shares_prefixes_and_keeps_the_best_rating():
    chain = Draft([1, 2, 4], chances=[0.5, 0.2, 0.1])
    tree = Draft([1, 3, 2], parents=[-1, 0, 0], chances=[0.7, 0.3, 0.25])
    tokens, parents, chance, where = merge_drafts([chain, tree, Draft([9])])  # the last is unrated: 0
    assert tokens == [1, 2, 4, 3, 9] and parents == [-1, 0, 1, 0, -1]
    assert chance == [0.7, 0.25, 0.1, 0.3, 0.0]
    assert where == [[0, 1, 2], [0, 3, 1], [4]]  # each draft's nodes in the merged tree
    assert merge_drafts([Draft(), Draft()]) == ([], [], [], [[], []])


class Learner(Drafter):
    """Proposes the same draft every step; keeps what the verifier judged of it."""

    def __init__(self, draft):
        self.draft, self.judged = draft, []

    def propose(self, context, k, sampling, generator):
        return self.draft

    def learn(self, judged):
        self.judged += judged


def test_each_component_learns_from_its_own_judged_nodes():
    a = Learner(Draft([1, 2, 4], chances=[0.5, 0.2, 0.1]))
    b = Learner(Draft([1, 3, 2], parents=[-1, 0, 0], chances=[0.7, 0.3, 0.25]))
    f = Fusion([a, b])
    f.propose([5], 3, SamplingConfig(), torch.Generator())  # merged: 1 -> (2 -> 4, 3)
    f.learn([(0, True), (1, True), (3, False), (2, False)])  # 1 and 2 passed, 3 and 4 did not
    assert a.judged == [(0, True), (1, True), (2, False)]
    assert b.judged == [(0, True), (1, False), (2, True)]


def test_components_get_the_target_s_outputs_of_their_own_nodes():
    class Reader(Drafter):
        wants_outputs = True
        output_topk = 2

        def __init__(self, draft):
            self.draft, self.choices, self.tops = draft, [], []

        def propose(self, context, k, sampling, generator):
            return self.draft

        def take_outputs(self, choices):
            self.choices.append(choices)

        def take_topk(self, ids, top):
            self.tops.append((ids, top.tolist()))

    a = Reader(Draft([1, 2], chances=[0.5, 0.2]))
    b = Reader(Draft([1, 3], parents=[-1, -1], chances=[0.7, 0.3]))
    b.output_topk = 1
    f = Fusion([a, b, Drafter()])
    assert f.wants_outputs and f.output_topk == 2
    assert f.propose([0], 4, SamplingConfig(), torch.Generator()).tokens == [1, 2, 3]
    f.take_outputs([10, 11, 12, None])  # after the root, merged nodes 0, 1 and (not sent) 2
    assert a.choices == [[10, 11, 12]] and b.choices == [[10, 11, None]]
    f.take_topk([0, 1, 2], torch.tensor([[5, 6], [7, 8], [9, 4]]))
    assert a.tops == [([0, 1, 2], [[5, 6], [7, 8], [9, 4]])] and b.tops == [([0, 1, 2], [[5], [7], [9]])]
    f.observe([0, 1, 7], 1)
    f.take_outputs([13])  # a step without a draft (a plain forward): no node of theirs was checked
    assert len(a.choices) == len(b.choices) == 1


def test_matched_depth_follows_one_branch():
    tree = Draft([1, 3, 2, 5], parents=[-1, 0, 0, 2])
    assert matched_depth(tree, [1, 2, 5, 7]) == 3
    assert matched_depth(tree, [1, 4]) == 1 and matched_depth(tree, [6]) == 0
    assert matched_depth(Draft([1, 2]), [1, 2, 3]) == 2  # a chain


class Twin(Drafter):
    """The target's greedy continuation from a twin model, as a rated chain; records what it observes."""

    def __init__(self, model, depth: int = 3):
        self.twin, self.depth = model, depth
        self.seen: list[tuple[list[int], int]] = []
        self.proposed: list[int] = []

    def propose(self, context, k, sampling, generator):
        self.twin.reset()
        logits = self.twin.forward(torch.tensor(context), last_only=True).logits[-1]
        tokens = []
        for _ in range(min(k, self.depth)):
            tokens.append(int(logits.argmax()))
            logits = self.twin.forward(torch.tensor(tokens[-1:])).logits[-1]
        self.proposed = tokens
        return Draft(tokens, chances=[0.9 ** (i + 1) for i in range(len(tokens))])

    def observe(self, context, num_accepted):
        # its first num_accepted guesses are the committed tokens before the newest one
        assert context[len(context) - 1 - num_accepted:len(context) - 1] == self.proposed[:num_accepted]
        self.seen.append((list(context), num_accepted))


def generate(model, drafter, sampling=SamplingConfig(), n=32):
    HISTORY.clear()
    spec = SpecConfig(method="fusion", k=6, cost_rule=False)
    engine = Engine(model, FakeTokenizer(), drafter, spec)
    engine.generate(PROMPT, sampling, GenerationConfig(max_new_tokens=n))
    return list(engine.token_ids), engine.stats


def test_greedy_fusion_equals_plain_and_both_prophets_are_accepted(target, twin):  # noqa: F811
    plain, _, _ = run(target, "none", n=32)
    twin_drafter = Twin(twin)
    fusion = Fusion([SuffixTree(trees=True), twin_drafter], trees=True)
    ids, stats = generate(target, fusion)
    assert ids == plain
    assert stats.drafts > 0 and stats.accepted_tokens > 0, stats.summary()
    assert fusion.accepted_by[1] > 0 and twin_drafter.seen  # the twin's guesses passed, and it was told so
    assert sum(m for _, m in twin_drafter.seen) == fusion.accepted_by[1]


def test_chains_without_tree_masks_and_seeded_sampling(target, twin):  # noqa: F811
    plain, _, _ = run(target, "none", n=32)
    ids, stats = generate(target, Fusion([SuffixTree(trees=False), Twin(twin)], trees=False))
    assert ids == plain and stats.accepted_tokens > 0
    cfg = SamplingConfig(temperature=1.0, seed=3)
    a, stats = generate(target, Fusion([SuffixTree(trees=True), Twin(twin)], trees=True), cfg)
    b, _ = generate(target, Fusion([SuffixTree(trees=True), Twin(twin)], trees=True), cfg)
    assert a == b and len(a) == 32 and stats.drafts > 0
