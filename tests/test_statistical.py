"""Speculative sampling is lossless: its output is distributed exactly as sampling from the target.

A tiny synthetic "language model" with vocabulary V = 6: at absolute position j the target's
distribution is p_j = transform(TARGET[j]) and the draft's q_j = transform(DRAFT[j]), whatever
came before (so the target's joint of the first two tokens is p_0 x p_1). The speculative loop
drafts K = 2 tokens, verifies them with ``verify_sampling``, commits n + 1 tokens and repeats
until two tokens exist. Over many seeded runs the empirical joint of the first two committed
tokens must match p_0 x p_1 (chi-square test), for drafts with probabilities (q given) and for
deterministic drafts (draft_probs None, one-hot), with temperature/top-k/top-p applied to both.

The same check must FAIL for deliberately wrong rules (resample from p instead of the residual;
accept every draft token), which shows it has the power to catch a broken verifier.
"""
from __future__ import annotations

import math

import pytest
import torch

from specdraft.config import SamplingConfig
from specdraft.sampling import make_generator, probs_from_logits, sample
from specdraft.verify import Verdict, verify_sampling

try:
    from scipy.stats import chisquare
except ImportError:  # pragma: no cover - scipy is optional
    chisquare = None

V = 6
K = 2
POSITIONS = 4  # the loop reads rows pos .. pos + K with pos in {0, 1}
_g = torch.Generator().manual_seed(20240611)
TARGET = 1.2 * torch.randn(POSITIONS, V, generator=_g)
DRAFT = 1.2 * torch.randn(POSITIONS, V, generator=_g)

PLAIN = SamplingConfig(temperature=1.0)
TRANSFORMS = [
    SamplingConfig(temperature=0.7, top_k=4, top_p=0.9),
    SamplingConfig(temperature=1.5, top_p=0.8),
    SamplingConfig(temperature=1.2, min_p=0.25),
]
ALPHA_PASS = 1e-3  # a correct rule fails with probability 1e-3 per check (the seeds are fixed anyway)
ALPHA_FAIL = 1e-6  # a wrong rule must be rejected far more decisively


def simulate(verifier, cfg: SamplingConfig, n_runs: int, one_hot: bool, seed: int) -> torch.Tensor:
    """[V, V] counts of the first two committed tokens over n_runs runs of the speculative loop."""
    g = make_generator(seed)  # the verifier's generator (acceptance draws and resampling)
    g_draft = torch.Generator().manual_seed(seed + 1)  # the drafter's own randomness
    q = probs_from_logits(DRAFT, cfg)  # [POSITIONS, V]
    if one_hot:
        # A deterministic drafter may propose any token, even one the target can never produce:
        # draft tokens come from some other (non-uniform) rule and are passed without q. (With a
        # uniform chooser the resample-from-p mistake happens to be exact, so avoid that.)
        chooser = 0.7 * q + 0.3 / V
    else:
        chooser = q
    # Pre-draw every draft token the runs can need: step 1 at pos 0, step 2 at pos 1.
    pre = {pos: torch.stack([torch.multinomial(chooser[pos + i], n_runs, replacement=True, generator=g_draft)
                             for i in range(K)], dim=1).tolist() for pos in (0, 1)}
    counts = torch.zeros(V, V, dtype=torch.int64)
    for r in range(n_runs):
        out: list[int] = []
        pos = 0
        while len(out) < 2:
            draft = pre[pos][r]
            probs = None if one_hot else q[pos:pos + K]
            verdict = verifier(TARGET[pos:pos + K + 1], draft, probs, cfg, g)
            new = verdict.tokens(draft)
            assert 1 <= len(new) <= K + 1
            out += new
            pos += len(new)
        counts[out[0], out[1]] += 1
    return counts


def expected_joint(cfg: SamplingConfig) -> torch.Tensor:
    p = probs_from_logits(TARGET, cfg).double()
    return torch.outer(p[0], p[1])  # [V, V]


def goodness_of_fit(counts: torch.Tensor, expected: torch.Tensor) -> tuple[float, str]:
    """p-value that ``counts`` were drawn from ``expected`` (chi-square; a TV bound without scipy).

    Cells the target can never produce must have zero counts (else the p-value is 0). Cells with
    an expected count below 5 are pooled so the chi-square approximation holds.
    """
    n = int(counts.sum())
    obs = counts.flatten().double()
    exp = expected.flatten() / expected.sum() * n
    if bool((obs[exp == 0] > 0).any()):
        return 0.0, "a token pair the target cannot produce was committed"
    support = exp > 0
    obs, exp = obs[support], exp[support]
    small = exp < 5
    if bool(small.any()):
        obs = torch.cat([obs[~small], obs[small].sum()[None]])
        exp = torch.cat([exp[~small], exp[small].sum()[None]])
    if chisquare is not None:
        res = chisquare(obs.numpy(), exp.numpy())
        return float(res.pvalue), f"chi2={float(res.statistic):.1f}, cells={len(obs)}, n={n}"
    # Without scipy: Weissman et al. (2003), P(||p_hat - p||_1 >= eps) <= (2^C - 2) exp(-n eps^2 / 2).
    l1 = float((obs / n - exp / n).abs().sum())
    cells = len(obs)
    bound = (2 ** cells - 2) * math.exp(-n * l1 * l1 / 2)
    return min(1.0, bound), f"L1={l1:.4f}, cells={cells}, n={n}"


def check(verifier, cfg, n_runs, one_hot, seed) -> tuple[float, str]:
    counts = simulate(verifier, cfg, n_runs, one_hot, seed)
    return goodness_of_fit(counts, expected_joint(cfg))


# ------------------------------------------------------------------------------ wrong rules

def verify_resample_from_p(target_logits, draft, draft_probs, cfg, generator) -> Verdict:
    """WRONG: accepts with min(1, p/q) but resamples a rejection from p instead of the residual."""
    p = probs_from_logits(target_logits, cfg)
    for i, x in enumerate(draft):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        r = float(torch.rand((), generator=generator))
        if q_x > 0 and r < min(1.0, float(p[i, x]) / q_x):
            continue
        return Verdict(i, int(sample(p[i:i + 1], generator)[0]), False)
    return Verdict(len(draft), int(sample(p[len(draft):], generator)[0]), True)


def verify_always_accept(target_logits, draft, draft_probs, cfg, generator) -> Verdict:
    """WRONG: trusts the draft blindly, adding a bonus token from p."""
    p = probs_from_logits(target_logits, cfg)
    return Verdict(len(draft), int(sample(p[len(draft):], generator)[0]), True)


# ------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
def test_speculative_sampling_matches_target_joint(one_hot):
    counts = simulate(verify_sampling, PLAIN, 5000, one_hot, seed=1)
    pvalue, info = goodness_of_fit(counts, expected_joint(PLAIN))
    assert pvalue > ALPHA_PASS, info
    # The first committed token alone (finer resolution on p_0).
    pvalue, info = goodness_of_fit(counts.sum(1), probs_from_logits(TARGET, PLAIN)[0].double())
    assert pvalue > ALPHA_PASS, info


@pytest.mark.parametrize("cfg", TRANSFORMS, ids=["T0.7-k4-p0.9", "T1.5-p0.8", "T1.2-minp0.25"])
@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
def test_speculative_sampling_matches_target_with_transforms(cfg, one_hot):
    # The transforms really cut tokens here, so "never commit a masked token" is tested too.
    assert int((probs_from_logits(TARGET, cfg)[:2] == 0).sum()) > 0
    pvalue, info = check(verify_sampling, cfg, 2000, one_hot, seed=2)
    assert pvalue > ALPHA_PASS, info


@pytest.mark.parametrize("wrong, one_hot, cfg", [
    (verify_resample_from_p, False, PLAIN),
    (verify_resample_from_p, True, TRANSFORMS[0]),
    (verify_always_accept, False, PLAIN),
    (verify_always_accept, True, TRANSFORMS[0]),
], ids=["resample-from-p/draft-probs", "resample-from-p/one-hot/T0.7-k4-p0.9", "always-accept/draft-probs",
        "always-accept/one-hot/T0.7-k4-p0.9"])
def test_the_check_detects_a_wrong_rule(wrong, one_hot, cfg):
    pvalue, info = check(wrong, cfg, 2000, one_hot, seed=3)
    assert pvalue < ALPHA_FAIL, f"the check did not detect {wrong.__name__}: {info}, p-value {pvalue:.3g}"


def test_sample_draws_each_token_with_its_probability_and_never_an_impossible_one():
    """sampling.sample (inverse CDF of one uniform draw a row) against crafted rows with zeros,
    unnormalised, and shown able to fail: the same draws scored against a shifted distribution."""
    p = torch.tensor([[0.0, 0.5, 0.2, 0.0, 0.3], [0.2, 0.0, 0.0, 1.8, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
    n = 20000
    g = make_generator(7)
    draws = torch.stack([sample(p, g) for _ in range(n // 100) for _ in range(100)])  # [n, 3]
    for r in range(2):
        counts = torch.bincount(draws[:, r], minlength=5).double()
        pvalue, detail = goodness_of_fit(counts, p[r].double())
        assert pvalue > ALPHA_PASS, (r, detail)
    assert bool((draws[:, 2] == 4).all())
    shifted = torch.tensor([0.0, 0.45, 0.25, 0.0, 0.3], dtype=torch.float64)
    assert goodness_of_fit(torch.bincount(draws[:, 0], minlength=5).double(), shifted)[0] < ALPHA_FAIL
    # a batch of rows draws as many rows alone do, each from its own row
    assert sample(p.repeat(4, 1), make_generator(1)).view(4, 3)[:, 1:].tolist() == [[3, 4]] * 4


def test_min_p_keeps_what_is_likely_enough_beside_the_likeliest():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, min_p=0.25))  # threshold 0.125
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.0, 0.0]]) / 0.8)
    assert torch.equal(probs_from_logits(logits, SamplingConfig(temperature=1.0, min_p=1.0)), torch.tensor([[1.0, 0, 0, 0]]))
    with pytest.raises(Exception, match="min-p"):
        SamplingConfig(min_p=1.5)
