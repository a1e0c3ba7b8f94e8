"""Lookup after a guess (drafters.extend): the n-gram index, the extension of a tree's likeliest
nodes, its ratings learnt by depth, and fusion with it greedy-exact on a real tree forward."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_fusion import Learner, Twin, generate
from test_suffix_tree import run, target, twin  # noqa: F401  (fixtures)

from specdraft.config import SamplingConfig
from specdraft.drafters import Draft, Drafter
from specdraft.drafters.extend import LookupExtension, NgramIndex
from specdraft.drafters.fusion import Fusion
from specdraft.drafters.suffix import SuffixTree
from specdraft.drafters.trees import branch_of

GREEDY = SamplingConfig()


def scan_after(seq: list[int], tail: list[int], lo: int, hi: int) -> tuple[int, int] | None:
    """The index's definition, by brute force: for the longest suffix n-gram of tail (n from hi
    down to lo) that occurs in seq followed by a token, where its latest such occurrence ends, and n."""
    for n in range(min(hi, len(tail)), lo - 1, -1):
        gram = tail[len(tail) - n:]
        ends = [e for e in range(n, len(seq)) if seq[e - n:e] == gram]
        if ends:
            return ends[-1], n
    return None


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), min_size=1, max_size=5),
       st.integers(0, 40))
def test_index_grown_in_steps_finds_what_a_scan_finds(seq, tail, cut):
    ix = NgramIndex(2, 4)
    ix.update(seq[:cut])  # grown in two steps, as a sequence's context grows
    ix.update(seq)
    assert ix.after(tail) == scan_after(seq, tail, 2, 4)


def test_index_starts_over_on_another_sequence():
    ix = NgramIndex(2, 3)
    ix.update([1, 2, 3, 1, 2])
    assert ix.after([1, 2]) == (2, 2)
    ix.update([7, 8, 9])  # not a continuation of the last one: a new request
    assert ix.after([1, 2]) is None and ix.after([7, 8]) == (2, 2)
    ix.update([5, 8, 9, 7, 8])  # the same token where the last one ended, but another sequence
    assert ix.after([7, 8]) is None and ix.after([8, 9]) == (3, 2)


def test_a_new_request_is_indexed_afresh():
    ext = LookupExtension(ngram_max=3)
    f = Fusion([Drafter()], trees=True, extension=ext)
    ext.index.update([1, 2, 3, 4])
    f.begin([9])
    assert ext.index.seen == [] and ext.index.after([2, 3]) is None


def test_branch_of_walks_to_the_root():
    assert branch_of(3, [-1, 0, -1, 1]) == [0, 1, 3] and branch_of(2, [-1, 0, -1, 1]) == [2]


def test_likeliest_nodes_are_extended_by_what_followed_them():
    ext = LookupExtension(ngram_max=3, nodes=2, min_chance=0.2)
    context = [1, 2, 3, 4, 5, 9, 1, 2]
    # tree: 3 (0.8) -> 7 (0.3); 6 (0.1, too unlikely to extend)
    tree = Draft([3, 7, 6], parents=[-1, 0, -1], chances=[0.8, 0.3, 0.1])
    d = ext.extend(context, tree, 5, GREEDY)
    # "1 2 3" occurred, 4 5 9 1 followed (k - 1 of them below a depth-1 node); "3 7" never did
    assert d.tokens == [3, 7, 6, 4, 5, 9, 1] and d.parents == [-1, 0, -1, 0, 3, 4, 5]
    assert d.chances == pytest.approx([0.8, 0.3, 0.1] + [0.8 * r for r in ext.rates[3].chances(4)])  # a 3-gram match
    assert ext.depths == [None] * 3 + [(3, 0), (3, 1), (3, 2), (3, 3)]
    assert ext.extend(context, tree, 1, GREEDY) is tree  # no room below a depth-1 node
    assert ext.extend(context, Draft([3, 3], parents=[-1, -1], chances=[0.8, 0.7]), 5, GREEDY).tokens == [3, 3]  # not a trie


def test_an_existing_node_keeps_its_number_and_takes_the_better_rating():
    ext = LookupExtension(ngram_max=3, nodes=1, min_chance=0.0)
    chain = Draft([3, 4, 8], chances=[0.9, 0.1, 0.05])  # a chain: the copy 4 5 runs through node 1
    d = ext.extend([1, 2, 3, 4, 5, 1, 2], chain, 4, GREEDY)
    assert d.tokens == [3, 4, 8, 5, 1] and d.parents == [-1, 0, 1, 1, 3]  # 4 5 1 followed "1 2 3"
    first = ext.rates[3].chances(1)[0]
    assert d.chances[1] == pytest.approx(max(0.1, 0.9 * first)) and ext.depths == [None] * 3 + [(3, 1), (3, 2)]


def test_fusion_numbers_component_nodes_first_and_learns_extension_depths():
    head = Learner(Draft([3, 8], parents=[-1, -1], chances=[0.9, 0.05]))
    f = Fusion([head], trees=True, extension=LookupExtension(ngram_max=3))
    d = f.propose([1, 2, 3, 4, 5, 6, 1, 2], 4, SamplingConfig(), torch.Generator())
    assert d.tokens == [3, 8, 4, 5, 6] and d.parents == [-1, -1, 0, 2, 3]  # head's nodes keep 0, 1
    rates = f.extension.rates[3]  # "1 2 3" matched
    before = list(rates.passed), list(rates.tried)
    f.learn([(0, True), (1, False), (2, True), (3, False)])  # 4 passed, 5 did not, 6 not judged
    assert head.judged == [(0, True), (1, False)]
    passed, tried = rates.passed, rates.tried
    assert sum(f.extension.rates[2].tried) == sum(LookupExtension().rates[2].tried)  # no 2-gram match
    assert (tried[0] - before[1][0], passed[0] - before[0][0]) == (1, 1)  # depth 0: one judged, passed
    assert (tried[1] - before[1][1], passed[1] - before[0][1]) == (1, 0)  # depth 1: judged, failed
    assert tried[2] == before[1][2]


def test_hybrid_parts_learn_only_their_own_nodes():
    from specdraft.drafters.hybrid import Hybrid

    model = Learner(Draft([3], chances=[0.9]))
    h = Hybrid(model, model_k=4, ngram_max=3, ngram_min=3, extension=LookupExtension(ngram_max=3))
    d = h.propose([1, 2, 3, 4, 5, 6, 1, 2], 4, SamplingConfig(), torch.Generator())  # no 3-gram copy: the model
    assert d.tokens == [3, 4, 5, 6] and d.parents == [-1, 0, 1, 2]
    h.learn([(0, True), (1, True), (2, False)])
    assert model.judged == [(0, True)]


def test_no_extension_without_tree_masks():
    assert Fusion([Drafter()], trees=False, extension=LookupExtension()).extension is None


def test_greedy_fusion_with_extension_equals_plain(target, twin):  # noqa: F811
    plain, _, _ = run(target, "none", n=32)
    for components in ([SuffixTree(trees=True), Twin(twin)], [Twin(twin, depth=1)]):
        fusion = Fusion(components, trees=True, extension=LookupExtension())
        ids, stats = generate(target, fusion)
        assert ids == plain and stats.accepted_tokens > 0
    if target.weight_format == "dense":  # its answer repeats bigrams ("95 55", "23 54"): lookup after a
        # right guess finds what followed, and with the one-guess twin every deeper node is the extension's
        fresh = LookupExtension().rates
        assert sum(sum(r.tried) for r in fusion.extension.rates.values()) > sum(sum(r.tried) for r in fresh.values())


def test_sampled_drafts_are_not_extended():
    from specdraft.drafters.hybrid import Hybrid

    context, sampled = [1, 2, 3, 4, 5, 6, 1, 2], SamplingConfig(temperature=0.7, seed=0)
    one = Draft([3], chances=[0.9])
    f = Fusion([Learner(one)], trees=True, extension=LookupExtension(ngram_max=3))
    h = Hybrid(Learner(one), model_k=4, ngram_max=3, ngram_min=3, extension=LookupExtension(ngram_max=3))
    for d in (f, h):
        assert d.propose(context, 4, GREEDY, torch.Generator()).tokens == [3, 4, 5, 6]  # greedy: extended
        assert d.propose(context, 4, sampled, torch.Generator()).tokens == [3]
        before = [list(r.tried) for r in d.extension.rates.values()]
        d.learn([(0, True), (1, True), (2, False)])  # a sampled step: no stale extension node learns
        assert [list(r.tried) for r in d.extension.rates.values()] == before
