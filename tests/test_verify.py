"""Crafted-logit unit tests of the verifier, the sampling transforms and the config checks."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.errors import ParameterError, SpecdraftError
from specdraft.sampling import argmax, make_generator, next_token, probs_from_logits, topk_indices
from specdraft.verify import Verdict, verify, verify_greedy, verify_sampling

V = 8
SAMPLE = SamplingConfig(temperature=1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from([-math.inf, -1.0, 0.0, -0.0, 0.5, 2.0, math.inf, math.nan]),
                         min_size=1, max_size=12), min_size=1, max_size=4).filter(lambda r: len({len(x) for x in r}) == 1),
       st.sampled_from([torch.float32, torch.float64]))
def test_argmax_is_torchs(rows, dtype):
    """sampling.argmax (NumPy's) picks what torch.argmax picks: the first of tied maxima, the
    first NaN, every shape from one row to a block."""
    x = torch.tensor(rows, dtype=dtype)
    assert torch.equal(argmax(x), x.argmax(-1))
    assert int(argmax(x[0])) == int(x[0].argmax())
    assert argmax(x).dtype == torch.int64


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(2000, 3000), st.integers(0, 2**31 - 1), st.booleans())
def test_topk_indices_has_torchs_values(T, k, V, seed, coarse):
    """sampling.topk_indices finds each row's k largest values, largest first, through the chunks
    with the largest maxima; rows with many equal values (coarse) and a padded last chunk too."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, V, generator=g)
    if coarse:
        x = x.mul(2).round()  # a handful of distinct values: ties everywhere
    got = topk_indices(x, k, chunk=16)
    assert got.shape == (T, k) and got.dtype == torch.int64
    assert torch.equal(x.gather(1, got), x.topk(k, -1).values)
    assert all(len(set(row)) == k for row in got.tolist())  # k distinct positions
    if not coarse:
        assert torch.equal(got, x.topk(k, -1).indices)


def peaked(rows: list[int], V: int = V, high: float = 10.0) -> torch.Tensor:
    """[len(rows), V] logits whose argmax in row i is rows[i]."""
    logits = torch.zeros(len(rows), V)
    for i, t in enumerate(rows):
        logits[i, t] = high
    return logits


def from_probs(p: torch.Tensor) -> torch.Tensor:
    """Logits that give exactly p (zeros -> -inf) under temperature 1."""
    return torch.where(p > 0, p.log(), torch.full_like(p, float("-inf")))


# ------------------------------------------------------------------------------------ greedy

def test_greedy_all_accepted_gives_bonus():
    draft = [3, 1, 4]
    v = verify_greedy(peaked([3, 1, 4, 5]), draft)
    assert v == Verdict(3, 5, True)
    assert v.tokens(draft) == [3, 1, 4, 5]


def test_greedy_first_rejected_recovers_target_argmax():
    draft = [3, 1, 4]
    v = verify_greedy(peaked([2, 1, 4, 5]), draft)
    assert v == Verdict(0, 2, False)
    assert v.tokens(draft) == [2]


def test_greedy_rejection_in_the_middle():
    draft = [3, 1, 4, 1]
    v = verify_greedy(peaked([3, 1, 6, 1, 7]), draft)
    assert v == Verdict(2, 6, False)
    assert v.tokens(draft) == [3, 1, 6]


def test_greedy_does_not_resume_after_a_rejection():
    # Row 2 agrees with draft[2] again, but only a prefix may be accepted.
    v = verify_greedy(peaked([3, 0, 4, 5]), [3, 1, 4])
    assert v == Verdict(1, 0, False)


def test_greedy_empty_draft_is_just_the_next_token():
    v = verify_greedy(peaked([6]), [])
    assert v == Verdict(0, 6, True)
    assert v.tokens([]) == [6]


def test_verify_dispatches_on_temperature():
    g = make_generator(0)
    logits = peaked([3, 1, 4])
    assert verify(logits, [3, 2], None, SamplingConfig(), g) == Verdict(1, 1, False)
    # Sampling with a near one-hot target behaves like greedy.
    assert verify(logits * 10, [3, 2], None, SAMPLE, g) == Verdict(1, 1, False)


# ------------------------------------------------------------------------------------ sampling

def test_sampling_empty_draft_samples_from_p():
    g = make_generator(1)
    p = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0])
    seen = set()
    for _ in range(200):
        v = verify_sampling(from_probs(p)[None], [], None, SAMPLE, g)
        assert v.num_accepted == 0 and v.bonus
        seen.add(v.next_token)
    assert seen == {1, 3}


def test_one_hot_draft_with_p_one_always_accepts():
    g = make_generator(2)
    target = torch.full((3, V), float("-inf"))
    target[0, 5] = 0.0  # p(5) = 1 at position 0
    target[1, 2] = 0.0  # p(2) = 1 at position 1
    target[2] = 0.0  # uniform bonus
    bonus = set()
    for _ in range(300):
        v = verify_sampling(target, [5, 2], None, SAMPLE, g)
        assert v.num_accepted == 2 and v.bonus
        bonus.add(v.next_token)
    assert len(bonus) > 1  # the bonus token is sampled from p, not fixed


def test_one_hot_draft_with_p_zero_always_rejects_and_never_recovers_x():
    g = make_generator(3)
    p = torch.tensor([0.3, 0.0, 0.2, 0.1, 0.4, 0.0, 0.0, 0.0])
    target = from_probs(p).expand(2, V).clone()
    seen = set()
    for _ in range(500):
        v = verify_sampling(target, [1], None, SAMPLE, g)
        assert v.num_accepted == 0 and not v.bonus
        assert v.next_token != 1
        seen.add(v.next_token)
    assert seen == {0, 2, 3, 4}


def test_one_hot_draft_recovered_token_never_equals_rejected_token():
    g = make_generator(4)
    p = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0])
    target = from_probs(p).expand(2, V).clone()
    rejected = 0
    for _ in range(500):
        v = verify_sampling(target, [1], None, SAMPLE, g)
        if v.num_accepted == 0:
            rejected += 1
            assert v.next_token != 1
    assert 120 < rejected < 280  # P(reject) = 1 - p(1) = 0.4


def test_sampling_with_q_equal_to_p_always_accepts():
    g = make_generator(5)
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    q = probs_from_logits(logits[:3], SAMPLE)
    for _ in range(200):
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(3)]
        v = verify_sampling(logits, draft, q, SAMPLE, g)
        assert v.num_accepted == 3 and v.bonus


def test_sampling_with_q_rejects_where_p_is_zero_and_resamples_from_residual():
    g = make_generator(6)
    p = torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    target = from_probs(p).expand(2, V).clone()
    for _ in range(300):
        # x = 1: p(1) = 0 -> always rejected; residual max(0, p - q) is one-hot at 2.
        v = verify_sampling(target, [1], q, SAMPLE, g)
        assert v == Verdict(0, 2, False)
        # x = 0: p(0) / q(0) = 1 -> always accepted.
        v = verify_sampling(target, [0], q, SAMPLE, g)
        assert v.num_accepted == 1 and v.bonus and v.next_token in (0, 2)


def test_sampling_acceptance_probability_is_p_over_q():
    g = make_generator(7)
    p = torch.tensor([0.2, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    q = torch.tensor([[0.8, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    target = from_probs(p).expand(2, V).clone()
    n = 2000
    accepted = sum(verify_sampling(target, [0], q, SAMPLE, g).num_accepted for _ in range(n))
    # min(1, 0.2 / 0.8) = 0.25; 5 sigma = 5 * sqrt(0.25 * 0.75 / n) ~ 0.048
    assert abs(accepted / n - 0.25) < 0.05
    # A rejected 0 is replaced from norm(max(0, p - q)) = one-hot at 1.
    for _ in range(100):
        v = verify_sampling(target, [0], q, SAMPLE, g)
        assert v.tokens([0]) in ([0, 0], [0, 1], [1])


@pytest.mark.parametrize("width", [6, 8, 11])
def test_sampling_with_q_of_another_width(width):
    # Same tokenizer, differently padded output heads: q is cut or zero-padded to p's width.
    g = make_generator(8)
    p = torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    q = torch.zeros(1, width)
    q[0, :2] = 0.5
    target = from_probs(p).expand(2, V).clone()
    for _ in range(50):
        assert verify_sampling(target, [1], q, SAMPLE, g) == Verdict(0, 2, False)
        assert verify_sampling(target, [0], q, SAMPLE, g).num_accepted == 1


def test_sampling_is_reproducible_with_a_seed():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(1))
    q = probs_from_logits(torch.randn(3, V, generator=torch.Generator().manual_seed(2)), SAMPLE)

    def run(seed):
        g = make_generator(seed)
        return [verify_sampling(logits, [0, 1, 2], q, SAMPLE, g) for _ in range(50)]

    assert run(11) == run(11)
    assert run(11) != run(12)


# ------------------------------------------------------------------------------------ transforms

def test_probs_doc_example():
    p = probs_from_logits(torch.tensor([[2.0, 1.0, 0.0]]), SamplingConfig(temperature=1.0, top_k=2))
    torch.testing.assert_close(p, torch.tensor([[math.e / (math.e + 1), 1 / (math.e + 1), 0.0]]))


def test_top_k_larger_than_vocab_is_a_no_op():
    logits = torch.randn(2, 5)
    a = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_k=50))
    torch.testing.assert_close(a, torch.softmax(logits, -1))


def test_top_p_keeps_the_most_likely_token_even_for_tiny_p():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=1e-6))
    assert p.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_p_worked_example():
    # probs 0.5, 0.3, 0.15, 0.05: top_p 0.8 keeps {0.5, 0.3} (mass 0.8 reached), top_p 0.81 adds 0.15.
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    logits = probs.log()
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.79))
    torch.testing.assert_close(p, torch.tensor([[0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]]))
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.81))
    torch.testing.assert_close(p, torch.tensor([[0.15, 0.5, 0.0, 0.3]]) / 0.95)


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 4.0]])
    p = probs_from_logits(logits, SamplingConfig(temperature=0.5))
    torch.testing.assert_close(p, torch.softmax(logits / 0.5, -1))


def test_next_token_greedy_and_sampled():
    logits = torch.tensor([0.0, 5.0, 1.0])
    assert next_token(logits, SamplingConfig(), make_generator(0)) == 1
    p_one = torch.tensor([float("-inf"), float("-inf"), 0.0])
    assert next_token(p_one, SAMPLE, make_generator(0)) == 2


logit_rows = st.lists(st.floats(-20, 20, allow_nan=False, allow_infinity=False, width=32), min_size=2, max_size=24)
temperatures = st.floats(0.05, 5.0)


@settings(max_examples=150, deadline=None)
@given(row=logit_rows, t=temperatures, k=st.integers(0, 30), top_p=st.floats(0.01, 1.0))
def test_rows_are_distributions(row, t, k, top_p):
    logits = torch.tensor([row, row[::-1]])
    p = probs_from_logits(logits, SamplingConfig(temperature=t, top_k=k, top_p=top_p))
    assert p.dtype == torch.float32 and p.shape == logits.shape
    assert bool((p >= 0).all())
    torch.testing.assert_close(p.sum(-1), torch.ones(2), atol=1e-5, rtol=0)
    # a most likely token always survives every mask
    ref = torch.softmax(logits / t, -1)
    for r in range(2):
        assert p[r][ref[r] == ref[r].max()].sum() > 0


@settings(max_examples=150, deadline=None)
@given(row=st.lists(st.integers(-50, 50), min_size=2, max_size=24, unique=True), t=st.floats(0.5, 5.0),
       k=st.integers(1, 30))
def test_top_k_keeps_exactly_k_without_ties(row, t, k):
    logits = torch.tensor([row], dtype=torch.float32) / 10
    assume(len(set((logits[0] / t).tolist())) == len(row))  # no ties after scaling either
    p = probs_from_logits(logits, SamplingConfig(temperature=t, top_k=k))[0]
    kept = set(torch.nonzero(p > 0).flatten().tolist())
    assert len(kept) == min(k, len(row))
    assert kept == set(torch.topk(logits[0], min(k, len(row))).indices.tolist())
    # the kept tokens keep their relative probabilities
    ref = torch.softmax(logits[0] / t, -1)
    ref_kept = ref * (p > 0)
    torch.testing.assert_close(p, ref_kept / ref_kept.sum(), atol=1e-5, rtol=1e-4)


@settings(max_examples=200, deadline=None)
@given(row=st.lists(st.floats(-6, 6, allow_nan=False, width=32), min_size=2, max_size=16, unique=True),
       top_p=st.floats(0.01, 0.99))
def test_top_p_keeps_the_minimal_set(row, top_p):
    logits = torch.tensor([row], dtype=torch.float32)
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=top_p))[0]
    ref = torch.softmax(logits[0].double(), -1)
    order = torch.argsort(ref, descending=True)
    assume(bool((ref[order][:-1] - ref[order][1:] > 1e-6).all()))  # no ties (in float32) among probs
    cum = ref[order].cumsum(0)
    # Stay away from float round-off at the boundary: no prefix mass within 1e-4 of top_p.
    assume(bool(((cum - top_p).abs() > 1e-4).all()))
    m = int((cum < top_p).sum()) + 1  # the smallest prefix whose mass reaches top_p
    expected = set(order[:m].tolist())
    kept = set(torch.nonzero(p > 0).flatten().tolist())
    assert kept == expected
    torch.testing.assert_close(p.double(), (ref * (p > 0)) / ref[order[:m]].sum(), atol=1e-5, rtol=1e-4)


def _nucleus_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over the whole vocabulary ranked at once: what sampling._nucleus must equal."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p.masked_fill(before >= top_p, 0.0))
    return kept / kept.sum(-1, keepdim=True)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.floats(-8, 8, allow_nan=False, width=32), min_size=12, max_size=12, unique=True),
                     min_size=1, max_size=3),
       top_p=st.floats(0.01, 0.999), first=st.integers(1, 12))
def test_top_p_ranks_the_most_likely_first_and_keeps_what_a_full_sort_keeps(rows, top_p, first):
    """The nucleus is looked for among the ``first`` most likely ids, then 8x as many, ...: the
    same bits as ranking the whole vocabulary (no tied probabilities here)."""
    import specdraft.sampling as sampling

    probs = torch.softmax(torch.tensor(rows), -1)
    assume(all(len(set(r)) == len(r) for r in probs.tolist()))
    saved, sampling.NUCLEUS_FIRST = sampling.NUCLEUS_FIRST, first
    try:
        got = sampling._nucleus(probs, top_p)
    finally:
        sampling.NUCLEUS_FIRST = saved
    assert torch.equal(got, _nucleus_by_full_sort(probs, top_p))


@settings(max_examples=100, deadline=None)
@given(row=st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=2, max_size=24),
       k=st.integers(0, 30), top_p=st.floats(0.01, 1.0))
def test_greedy_is_one_hot_at_argmax(row, k, top_p):
    logits = torch.tensor([row])
    p = probs_from_logits(logits, SamplingConfig(temperature=0.0, top_k=k, top_p=top_p))
    expected = torch.zeros_like(p)
    expected[0, logits[0].argmax()] = 1.0
    assert torch.equal(p, expected)


# ------------------------------------------------------------------------------------ configs

@pytest.mark.parametrize("kwargs", [
    dict(temperature=-0.1), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(temperature="1"), dict(top_k=-1), dict(top_k=1.5), dict(top_k=True), dict(top_p=0.0),
    dict(top_p=-0.5), dict(top_p=1.01), dict(top_p=float("nan")), dict(seed=-1), dict(seed=1.5),
    dict(seed=True),
])
def test_invalid_sampling_config(kwargs):
    with pytest.raises(ParameterError):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(k=0), dict(k=-3), dict(k=65), dict(k=2.0), dict(k=True), dict(ngram_min=0),
    dict(ngram_min=4, ngram_max=3), dict(ngram_max=0), dict(min_confidence=-0.1), dict(min_confidence=1.0),
    dict(min_confidence=float("nan")), dict(min_confidence="0.5"), dict(ngram_min=1.5), dict(ngram_max=2.5),
    dict(draft_window=-1), dict(draft_window=1.5), dict(draft_window=True),
])
def test_invalid_spec_config(kwargs):
    with pytest.raises(ParameterError):
        SpecConfig(**kwargs)


def test_draft_window_defaults_per_drafter():
    assert SpecConfig(method="hybrid").window == 256
    assert SpecConfig(method="draft-model").window == 256
    assert SpecConfig(method="prompt-lookup").window == 0  # no draft model: nothing to bound
    assert SpecConfig(method="hybrid", draft_window=0).window == 0  # explicit: the whole prompt
    assert SpecConfig(method="draft-model", draft_window=64).window == 64


@pytest.mark.parametrize("kwargs", [
    dict(max_new_tokens=0), dict(max_new_tokens=-1), dict(max_new_tokens=2.0), dict(max_new_tokens=True),
    dict(stop=("",)), dict(stop=("ok", 3)),
])
def test_invalid_generation_config(kwargs):
    with pytest.raises(ParameterError):
        GenerationConfig(**kwargs)


def test_a_bare_string_is_not_split_into_one_character_stop_strings():
    # GenerationConfig(stop="END") means the one stop string "END"; iterating the str would
    # silently turn it into the stop strings "E", "N", "D".
    assert GenerationConfig(stop="END").stop == ("END",)


def test_parameter_error_is_a_user_error_with_exit_code_2():
    with pytest.raises(SpecdraftError) as info:
        SamplingConfig(top_p=0)
    assert info.value.exit_code == 2
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("cls, kwargs", [
    (SamplingConfig, dict(temperature=0.7, top_k=5, top_p=0.9, seed=3)),
    (SpecConfig, dict(method="prompt-lookup", k=1, ngram_min=2, ngram_max=2)),
    (GenerationConfig, dict(max_new_tokens=1, stop=("\n",))),
])
def test_valid_configs_keep_their_values_and_are_frozen(cls, kwargs):
    import dataclasses

    cfg = cls(**kwargs)
    assert {k: getattr(cfg, k) for k in kwargs} == kwargs
    name = next(iter(kwargs))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, name, kwargs[name])
    defaults = cls()  # every field has its default in the dataclass itself
    assert all(getattr(defaults, f.name) == f.default for f in dataclasses.fields(cls)
               if f.default is not dataclasses.MISSING)


def test_unknown_method_raises_parameter_error():
    from specdraft.drafters import build_drafter, needs_draft_model

    with pytest.raises(ParameterError, match="unknown method"):
        needs_draft_model("no-such-drafter")
    with pytest.raises(ParameterError):
        build_drafter("no-such-drafter", None)
