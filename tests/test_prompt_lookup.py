"""Worked examples of prompt lookup's n-gram matching."""
from __future__ import annotations

import pytest
import torch

from specdraft.config import SamplingConfig, SpecConfig
from specdraft.drafters import DrafterContext, build_drafter, needs_draft_model
from specdraft.drafters.prompt_lookup import PromptLookup, find_continuation

a, b, c, d, e, f, x, y = range(10, 18)


def test_docstring_example():
    assert find_continuation([a, b, c, d, a, b], 3, 2, 1) == [c, d, a]


def test_longest_ngram_wins_over_a_more_recent_shorter_match():
    # suffix "a b c": the trigram occurred at 0 (-> d e); the unigram "c" occurred later at 7 (-> f).
    ctx = [a, b, c, d, e, x, y, c, f, a, b, c]
    assert find_continuation(ctx, 2, 3, 1) == [d, e]
    # Limited to unigrams, the most recent "c" wins.
    assert find_continuation(ctx, 2, 1, 1) == [f, a]


def test_falls_back_to_shorter_ngrams():
    # "x y c" and "y c" never occurred before; "c" did, at 2.
    ctx = [a, b, c, d, x, y, c]
    assert find_continuation(ctx, 3, 3, 1) == [d, x, y]
    # ngram_min = 2 forbids the unigram fallback.
    assert find_continuation(ctx, 3, 3, 2) == []


def test_most_recent_occurrence_wins():
    ctx = [a, b, c, a, b, d, a, b]
    assert find_continuation(ctx, 1, 2, 2) == [d]
    assert find_continuation(ctx, 4, 2, 1) == [d, a, b]  # the continuation stops at the context end


def test_k_truncates():
    ctx = [a, b, c, d, e, f, a, b]
    assert find_continuation(ctx, 1, 2, 1) == [c]
    assert find_continuation(ctx, 3, 2, 1) == [c, d, e]
    assert find_continuation(ctx, 100, 2, 1) == [c, d, e, f, a, b]


def test_no_match_gives_empty_draft():
    assert find_continuation([a, b, c, d], 5, 3, 1) == []
    assert find_continuation([a], 5, 3, 1) == []
    assert find_continuation([], 5, 3, 1) == []


def test_overlapping_repetition():
    # "a a a a": the suffix "a a a" occurred at 0, followed by the last a.
    assert find_continuation([a, a, a, a], 5, 3, 1) == [a]
    # a period-2 cycle continues the cycle
    assert find_continuation([a, b, a, b, a], 4, 3, 1) == [b, a]


def test_ngram_max_larger_than_context():
    assert find_continuation([a, b, a], 3, 10, 1) == [b, a]


def test_continuation_never_starts_past_the_context():
    ctx = list(range(20)) + [3]
    assert find_continuation(ctx, 5, 3, 1) == [4, 5, 6, 7, 8]


def test_registry_builds_prompt_lookup_from_spec():
    assert not needs_draft_model("prompt-lookup")
    assert needs_draft_model("draft-model")
    spec = SpecConfig(method="prompt-lookup", ngram_max=2, ngram_min=2)
    drafter = build_drafter("prompt-lookup", DrafterContext(spec=spec, target=None, draft_model=None))
    assert isinstance(drafter, PromptLookup)
    drafter.begin([a, b])
    draft = drafter.propose([a, b, c, d, a, b], 2, SamplingConfig(), torch.Generator())
    assert draft.tokens == [c, d] and draft.probs is None and draft.parents is None
    # the bigram "d b" never occurred; only the unigram "b" did, and ngram_min=2 forbids it
    assert drafter.propose([a, b, c, d, b], 2, SamplingConfig(), torch.Generator()).tokens == []
    drafter.observe([a, b, c, d], 1)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_matches_a_brute_force_reference(n):
    g = torch.Generator().manual_seed(n)
    for _ in range(200):
        ctx = torch.randint(0, 4, (int(torch.randint(0, 14, (1,), generator=g)),), generator=g).tolist()
        k = int(torch.randint(1, 6, (1,), generator=g))
        assert find_continuation(ctx, k, 3, n) == _reference(ctx, k, 3, n), ctx


def _reference(ctx, k, ngram_max, ngram_min):
    for m in range(ngram_max, ngram_min - 1, -1):
        if m >= len(ctx):
            continue
        suffix = ctx[len(ctx) - m:]
        for start in range(len(ctx) - m - 1, -1, -1):  # most recent earlier occurrence first
            if ctx[start:start + m] == suffix:
                return ctx[start + m:start + m + k]
    return []
