"""Token trees end to end: the suffix drafter's continuation trees, the engine's tree forward
(positions by depth, ancestor mask, the accepted path compacted in the cache), greedy output equal
to plain decoding token for token, and reproducible sampling."""
from __future__ import annotations

import pytest
import torch

from _tiny import FakeTokenizer, tree_target
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters import Draft, Drafter, DrafterContext, build_drafter
from specdraft.drafters.suffix import HISTORY, continuation_tree
from specdraft.engine import Engine, tree_layout
from specdraft.models.llama import LlamaModel

# repetitive, with branching continuations after "5 17"
PROMPT = [5, 17, 33, 2, 5, 17, 40, 8, 41, 5, 17, 33, 3, 5, 17, 60, 9, 5, 17, 33, 2, 5, 17]


def test_continuation_tree_counts_branches():
    # "1 2" was followed by 3 4, 5 6 and 3 7: root -> 3 (2/3) -> {4, 7}; root -> 5 (1/3) -> 6
    ctx = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 7, 1, 2]
    tokens, parents, cond = continuation_tree(ctx, depth=2, ngram_max=2, ngram_min=2)
    tree = {(tokens[j], tokens[parents[j]] if parents[j] >= 0 else None): c for j, c in enumerate(cond)}
    assert tree == {(3, None): pytest.approx(2 / 3), (4, 3): 0.5, (5, None): pytest.approx(1 / 3), (6, 5): 1.0,
                    (7, 3): 0.5}
    assert all(parents[j] < j for j in range(len(tokens)))
    assert continuation_tree([1, 2, 3], depth=2, ngram_max=2, ngram_min=1) == ([], [], [])


def test_earlier_requests_feed_the_tree():
    ctx = [9, 1, 2]  # "1 2" never occurred before in this context
    assert continuation_tree(ctx, depth=2, ngram_max=2, ngram_min=2) == ([], [], [])
    earlier = [torch.tensor([5, 1, 2, 3, 4]), torch.tensor([1, 2, 7])]
    tokens, parents, cond = continuation_tree(ctx, depth=2, ngram_max=2, ngram_min=2, others=earlier)
    assert (tokens, parents, cond) == ([3, 4, 7], [-1, 0, -1], [0.5, 1.0, 0.5])


def test_history_keeps_the_newest_sequences():
    from specdraft.drafters.suffix import History

    h = History(max_sequences=2)
    h.update(1, [1, 2])
    h.update(2, [3])
    h.update(1, [1, 2, 5])  # a growing sequence stays one entry, now the newest
    h.update(3, [4])
    assert [t.tolist() for t in h.others(3)] == [[1, 2, 5]]  # 2 was the oldest: dropped


def test_tree_layout():
    positions, mask = tree_layout([-1, -1, 0, 2], start=7)
    assert positions.tolist() == [7, 8, 8, 9, 10]
    assert mask.int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]


@pytest.fixture(scope="module", params=["dense", "q4k"])
def target(request, tmp_path_factory):
    """A tiny qwen2 on the torch path (dense fp32) and on the native kernels (q4k)."""
    return tree_target(request.param, tmp_path_factory.mktemp("tree") / "target")


def run(target, method, sampling=SamplingConfig(), n=48):
    HISTORY.clear()  # earlier runs' sequences would change the drafts (a seeded sample with them)
    spec = SpecConfig(method=method, k=6, ngram_min=1, cost_rule=False)
    drafter = build_drafter(method, DrafterContext(spec=spec, target=target, draft_model=None))
    engine = Engine(target, FakeTokenizer(), drafter, spec)
    engine.generate(PROMPT, sampling, GenerationConfig(max_new_tokens=n))
    return list(engine.token_ids), engine.stats, drafter


def test_greedy_trees_equal_plain_decoding(target):
    plain, _, _ = run(target, "none")
    ids, stats, drafter = run(target, "suffix")
    assert ids == plain
    assert drafter.trees and stats.drafts > 0 and stats.accepted_tokens > 0, stats.summary()


class TwinTree(Drafter):
    """Guesses the target's greedy continuation with a twin of it, plus a wrong sibling at every
    level: every draft is a tree with branches, and most of its main branch passes."""

    def __init__(self, twin, depth: int = 3):
        self.twin, self.depth = twin, depth
        self.sent = 0

    def propose(self, context, k, sampling, generator):
        self.twin.reset()
        logits = self.twin.forward(torch.tensor(context), last_only=True).logits[-1]
        tokens, parents, main = [], [], -1
        for _ in range(min(k, self.depth)):
            best = int(logits.argmax())
            tokens += [best, (best + 1) % logits.shape[-1]]
            parents += [main, main]
            main = len(tokens) - 2
            logits = self.twin.forward(torch.tensor([best])).logits[-1]
        self.sent += 1
        return Draft(tokens, parents=parents)


@pytest.fixture(scope="module")
def twin(target):
    return LlamaModel.from_dir(target.source_dir, dtype=torch.float32, max_length=256, weight_format=target.weight_format)


def test_a_branched_tree_commits_its_path_and_the_cache_stays_consistent(target, twin):
    plain, _, _ = run(target, "none", n=24)
    spec = SpecConfig(method="twin-tree", k=6, cost_rule=False)
    drafter = TwinTree(twin)
    engine = Engine(target, FakeTokenizer(), drafter, spec)
    engine.generate(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=24))
    assert list(engine.token_ids) == plain
    assert drafter.sent > 0 and engine.stats.accepted_tokens >= drafter.sent, engine.stats.summary()
    # the cache holds exactly the committed context minus its newest token: the next forward's
    # logits are a fresh prefill's
    context = PROMPT + list(engine.token_ids)
    assert target.length == len(context) - 1
    after = target.forward(torch.tensor(context[-1:])).logits
    target.reset()
    fresh = target.forward(torch.tensor(context), last_only=True).logits
    assert torch.allclose(after, fresh, atol=1e-4)


def test_tree_sampling_is_reproducible(target):
    cfg = SamplingConfig(temperature=1.0, seed=5)
    a, stats, _ = run(target, "suffix", cfg)
    b, _, _ = run(target, "suffix", cfg)
    assert a == b and len(a) == 48 and stats.drafts > 0
