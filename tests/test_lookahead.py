"""Lookahead (drafters/lookahead): the Jacobi window and the n-gram pool in one tree.

Pool entries must come from the context and from the Jacobi trajectories exactly as the module
says, the window must move past what a step committed, the engine must hand the drafter the
target's choice after every row it verified, and decoding must stay the target's own greedy
output (dense and the native q4k kernels) with pool guesses accepted; token recycling
(test_recycle.py) goes through the same engine tests.
"""
from __future__ import annotations

import pytest
import torch

from _tiny import FakeTokenizer, drafted, greedy_runs_equal_plain, tree_target
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters.lookahead import Lookahead
from specdraft.engine import Engine

GREEDY = SamplingConfig()
GEN = torch.Generator()


def test_the_context_fills_the_pool_latest_first():
    d = Lookahead(window=3, ngram=3, guesses=2)
    d.begin([1, 2, 3, 1, 2, 4])
    assert d.pool == {1: [(2, 4), (2, 3)], 2: [(3, 1)], 3: [(1, 2)]}
    d.observe([1, 2, 3, 1, 2, 4, 1, 2, 3], 0)  # committed 1 2 3: (1, 2, 3) is the latest again
    assert d.pool[1] == [(2, 3), (2, 4)] and d.pool[4] == [(1, 2)]


def test_window_and_pool_form_one_tree_and_the_iteration_moves_on():
    d = Lookahead(window=3, ngram=3, guesses=2)
    d.begin([7, 8, 9, 7, 5])  # pool[7] = [(8, 9)]
    context = [7, 8, 9, 7, 5, 7]  # the first new token sits at position 6
    draft = d.propose(context, 8, GREEDY, GEN)
    # the window (no iteration yet: the context's last 3 tokens) at 6, 7, 8, then the pool's 8 9
    assert draft.tokens == [7, 5, 7, 8, 9] and draft.parents == [-1, 0, 1, -1, 3]
    d.take_outputs([10, 20, 21, 22, 0, 0])  # the target's choice after the root, then after each node
    assert d.window == {6: 10, 7: 20, 8: 21, 9: 22}
    d.observe(context + [10], 0)  # nothing accepted, the target's 10 committed
    assert d.pool[5][0] == (7, 10)  # the context's n-grams: (5, 7, 10)
    draft = d.propose(context + [10], 8, GREEDY, GEN)
    assert draft.tokens[:3] == [20, 21, 22]  # the window moved on: positions 7, 8, 9
    d.take_outputs([11, 30, 31, 32] + [0] * (len(draft) - 3))  # choices for 7 (root), 8, 9, 10
    # N = 3 trajectories: the first forward's window token at a, this one's at a + 1, its choice at a + 2
    assert d.pool[7][:2] == [(22, 32), (20, 30)] and d.pool[5][0] == (21, 31)
    assert d.window == {7: 11, 8: 30, 9: 31, 10: 32}


def test_the_engine_hands_over_a_choice_after_every_row(tmp_path):
    target = tree_target("dense", tmp_path)
    seen = []

    class Recording(Lookahead):
        def take_outputs(self, choices):
            seen.append((len(self.proposed.tokens) if self.proposed else 0, choices))  # no draft: the last token
            super().take_outputs(choices)

    e = Engine(target, FakeTokenizer(), Recording(), SpecConfig(method="lookahead", cost_rule=False, k=4))
    e.generate([3, 4, 5, 3, 4, 5, 3], GREEDY, GenerationConfig(max_new_tokens=12))
    # one choice after the root and after every proposed node; None after those not sent (4 at most)
    assert seen and all(len(c) == n + 1 and c[0] is not None for n, c in seen)
    assert any(n > 4 for n, _ in seen) and all(sum(x is not None for x in c) <= 5 for _, c in seen)


@pytest.fixture(scope="module", params=["dense", "q4k"])
def target(request, tmp_path_factory):
    return tree_target(request.param, tmp_path_factory.mktemp("lookahead") / "target")


@pytest.mark.parametrize("method", ["lookahead", "recycle"])  # the training-free tree prophets
def test_greedy_equals_plain_and_guesses_pass(target, method):
    prompts = [[5, 17, 33, 2, 5, 17, 33, 8, 5, 17], [41, 5, 17, 60, 3, 41, 5], [9, 9, 1, 70, 12, 30]]
    runs = greedy_runs_equal_plain(target, method, None, prompts)
    assert sum(s.accepted_tokens for s in runs) > 0


@pytest.mark.parametrize("method", ["lookahead", "recycle"])
def test_seeded_sampling_is_reproducible(target, method):
    sampling = SamplingConfig(temperature=0.8, seed=5)
    first, stats = drafted(target, method, [5, 17, 33, 5, 17], sampling=sampling)
    again, _ = drafted(target, method, [5, 17, 33, 5, 17], sampling=sampling)
    assert first == again and stats.drafts > 0
