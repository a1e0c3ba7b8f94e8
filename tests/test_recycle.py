"""Token recycling (drafters/recycle): the target's runners-up as an adjacency table, drafted as
a tree best first.

The table must hold each token's latest top-k, the tree must be grown by chance (a child never
before its parent, never deeper than k), pass rates must learn per depth and rank, the engine
must hand over the top-k of every row it scored (the prefill's last one too), and decoding must
stay the target's own greedy output with recycled guesses accepted (test_lookahead.py runs both
training-free tree prophets through the engine, dense and q4k).
"""
from __future__ import annotations

import pytest
import torch

from _tiny import FakeTokenizer, tree_target
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters.recycle import Recycle
from specdraft.engine import Engine

GREEDY = SamplingConfig()
GEN = torch.Generator()


def table(d: Recycle, rows: dict[int, list[int]]) -> None:
    d.take_topk(list(rows), torch.tensor(list(rows.values())))


def test_the_table_keeps_each_token_s_latest_followers():
    d = Recycle(topk=2)
    table(d, {7: [3, 9], 3: [4, 5]})
    table(d, {7: [8, 3]})
    assert d.follow == {7: [8, 3], 3: [4, 5]}


def test_the_tree_grows_best_first_within_k():
    d = Recycle(topk=2)
    table(d, {7: [3, 9], 3: [4, 5], 4: [6, 1], 9: [2, 0]})
    draft = d.propose([1, 7], 2, GREEDY, GEN)  # no deeper than 2
    # priors: rank 0 passes 0.3, rank 1 0.15: 3 (0.3), 9 (0.15), 3 -> 4 (0.09), 3 -> 5, 9 -> 2 (0.045), 9 -> 0
    assert draft.tokens == [3, 9, 4, 5, 2, 0] and draft.parents == [-1, -1, 0, 0, 1, 1]
    assert draft.chances == pytest.approx([0.3, 0.15, 0.09, 0.045, 0.045, 0.0225])
    assert all(draft.chances[j] <= draft.chances[p] for j, p in enumerate(draft.parents) if p >= 0)
    assert Recycle().propose([1, 5], 4, GREEDY, GEN).tokens == []  # nothing known after 5
    d.nodes = 3
    assert d.propose([1, 7], 4, GREEDY, GEN).tokens == [3, 9, 4]


def test_pass_rates_learn_by_depth_and_rank():
    d = Recycle(topk=2)
    table(d, {7: [3, 9], 3: [4, 5]})
    for _ in range(20):  # the runner-up at depth 1 always passes, the first choice never
        tokens = d.propose([7], 2, GREEDY, GEN).tokens
        d.learn([(tokens.index(3), False), (tokens.index(9), True)])
    draft = d.propose([7], 2, GREEDY, GEN)
    assert draft.tokens[0] == 9 and draft.chances[0] > 0.8
    assert d.rates.rate((1, 0)) < 0.1 and d.rates.rate((2, 0)) == pytest.approx(0.3)


def test_without_tree_masks_the_likeliest_branch_is_a_chain():
    d = Recycle(topk=2, trees=False)
    table(d, {7: [3, 9], 3: [4, 5]})
    draft = d.propose([7], 3, GREEDY, GEN)
    assert draft.tokens == [3, 4] and draft.parents is None
    d.learn([(0, True), (1, True)])
    assert d.rates.tried == {(1, 0): 1.0, (2, 0): 1.0}


def test_the_engine_hands_over_the_top_k_of_every_scored_row(tmp_path):
    target = tree_target("dense", tmp_path)
    seen = []

    class Recording(Recycle):
        def take_topk(self, ids, top):
            seen.append((list(ids), top.clone()))
            super().take_topk(ids, top)

    e = Engine(target, FakeTokenizer(), Recording(), SpecConfig(method="recycle", cost_rule=False, k=4))
    prompt = [3, 4, 5, 3, 4, 5, 3]
    e.generate(prompt, GREEDY, GenerationConfig(max_new_tokens=12))
    assert seen[0][0] == [3] and seen[0][1].shape == (1, 8)  # the prefill's last row
    assert any(len(ids) > 1 for ids, _ in seen)  # checks of drafted trees: a row per node sent
    for ids, top in seen[1:]:
        assert top.shape == (len(ids), 8) and all(len(set(r)) == 8 for r in top.tolist())
