"""Cost-aware draft lengths: the forward-cost table and the length it picks."""
from __future__ import annotations

import random

import pytest

from specdraft.costs import ALPHA, PRIOR_SLOPE, BetterOfTwo, ForwardCosts, running_mean
from specdraft.drafters.base import Draft, Drafter
from specdraft.drafters.hybrid import Hybrid
from specdraft.policy import DraftPolicy


def table(**ms) -> ForwardCosts:
    c = ForwardCosts()
    for t, v in ms.items():
        c.record(int(t[1:]), v / 1000)
    return c


def test_ratio_measured_interpolated_and_beyond():
    c = table(t1=60, t2=68, t4=92)
    assert c.ratio(1) == 1.0 and c.ratio(2) == pytest.approx(68 / 60)
    assert c.ratio(3) == pytest.approx(80 / 60)  # linear between 2 and 4
    assert c.ratio(6) == pytest.approx(92 / 60 + 2 * (92 - 68) / 60 / 2)  # the last segment's slope beyond it
    flat = table(t1=60, t2=61, t4=62)  # a segment flatter than the prior: the prior's slope
    assert flat.ratio(8) == pytest.approx(62 / 60 + 4 * PRIOR_SLOPE)
    assert table(t1=60).ratio(3) == pytest.approx(1 + 2 * PRIOR_SLOPE)  # one size measured: the prior
    assert ForwardCosts().ratio(5) == pytest.approx(1 + 4 * PRIOR_SLOPE)  # nothing measured yet


def test_running_mean():
    assert running_mean(0.0, 3.0) == 3.0  # the first measurement is taken whole
    assert running_mean(1.0, 2.0) == pytest.approx(1.0 + ALPHA)
    c = ForwardCosts()
    c.record(1, 1.0)
    c.record(1, 2.0)
    assert c.seconds[1] == pytest.approx(1.0 + ALPHA)
    c.record(4, 3.0)  # a block's cost is taken against the forward just before it
    assert c.ratio(4) == pytest.approx(3.0 / 2.0)


def test_ratios_come_from_neighbouring_forwards():
    """Each pair of forwards of different sizes in a row moves both sizes' ratios toward their
    times' ratio; one-token forwards are fixed at 1 and anchor the rest."""
    c = ForwardCosts()
    c.record(2, 0.050)  # nothing to anchor a 2-token forward to yet
    assert not c.measured and 2 not in c.log_ratio
    c.record(1, 0.040)  # ... now there is: the 2-token forward before it was 1.25x
    assert c.ratio(2) == pytest.approx(1.25)
    c.record(3, 0.060)
    assert c.ratio(3) == pytest.approx(1.5)
    c.record(2, 0.045)  # 2 after 3: 0.75x, while the table says 1.25 / 1.5; both move toward it
    assert 1.0 < c.ratio(2) < 1.25 and c.ratio(3) > 1.5
    c.record(2, 0.045)  # same size again: nothing learnt
    r2 = c.ratio(2)
    c.record(2, 0.045)
    assert c.ratio(2) == r2
    assert c.one_now == pytest.approx(0.045 / r2, rel=0.2)  # a one-token forward of this phase


def test_ratios_asked_between_forwards_are_those_of_the_table_as_it_stands():
    """ratio keeps its answers until the next forward is recorded: asked after every forward, a
    table answers as a new one fed the same forwards does (a kept answer would lag a forward
    behind: the first check after 1.25x was learnt for 2 tokens would still say the prior)."""
    rnd = random.Random(7)
    forwards = [(rnd.choice([1, 2, 3, 4, 6, 9]), rnd.uniform(0.02, 0.06)) for _ in range(120)]
    c = ForwardCosts()
    for i, (tokens, seconds) in enumerate(forwards):
        c.record(tokens, seconds)
        if i % 7:
            continue
        fresh = ForwardCosts()
        for t, sec in forwards[:i + 1]:
            fresh.record(t, sec)
        assert [c.ratio(t) for t in range(1, 20)] == [fresh.ratio(t) for t in range(1, 20)]


@pytest.mark.parametrize("seed", range(4))
def test_ratios_hold_through_phases(seed):
    """A machine that turns 1.8x slower every 60 forwards, where 1 forward in 25 is a one-token
    one (a head drafts nearly every step): the ratios stay within 10% of the truth. Dividing by
    the one-token mean of an earlier phase was off by up to 35% here (2 tokens 1.55x for 1.15x)."""
    rnd = random.Random(seed)
    truth = {1: 1.0, 2: 1.15, 3: 1.3, 4: 1.6, 6: 2.1}
    c = ForwardCosts()
    for i in range(1500):
        phase = 1.0 if (i // 60) % 2 == 0 else 1.8
        t = rnd.choices(list(truth), [0.04, 0.6, 0.2, 0.1, 0.06])[0]
        c.record(t, 0.04 * phase * truth[t] * rnd.uniform(0.92, 1.08))
    for t, r in truth.items():
        assert c.ratio(t) == pytest.approx(r, rel=0.1)


def test_a_one_token_forward_is_due_now_and_then():
    c = ForwardCosts()
    assert c.wants_one()  # nothing anchors the ratios yet
    c.record(1, 0.04)
    assert not c.wants_one()
    for _ in range(ForwardCosts.ANCHOR - 1):
        c.record(2, 0.045)
    assert not c.wants_one()
    c.record(3, 0.05)
    assert c.wants_one()  # ANCHOR forwards without one
    c.record(1, 0.04)
    assert not c.wants_one()


def test_best_length_follows_costs_and_confidence():
    flat = table(t1=60, t2=61, t3=62, t4=63, t5=64)  # verification nearly free: send every guess
    steep = table(t1=60, t2=90, t3=120, t4=150, t5=180)  # each token costs half a forward
    sure = [0.9, 0.8, 0.7, 0.6]
    assert flat.best_length(sure) == 4
    assert steep.best_length(sure) == 3  # (1 + .9 + .8 + .7) / 2.5 beats 2.7 / 2 and 4 / 3
    assert steep.best_length([0.4, 0.2]) == 0  # a 40% guess does not pay for half a forward
    assert steep.best_length([0.9, 0.3, 0.1]) == 1
    assert flat.best_length([0.05]) == 1 and flat.best_length([0.05], draft_cost=0.1) == 0
    assert flat.best_length([]) == 0


def test_block_costs_survive_a_change_of_phase():
    """A 2-token block timed in a slow phase (1 token 120 ms, 2 tokens 140) keeps its ratio
    when the machine turns fast (1 token 60 ms): 140 / 60 would cut every copy."""
    c = ForwardCosts()
    for _ in range(5):
        c.record(1, 0.120)
    c.record(2, 0.140)
    c.record(2, 0.070)  # the phase turns between two 2-token forwards: nothing learnt from them
    for _ in range(20):
        c.record(1, 0.060)
    assert c.ratio(2) == pytest.approx(70 / 60)  # 2 then 1 in the fast phase: 70 / 60
    assert c.choose_length([0.5]) == 1
    c.record(3, 0.090)  # a block timed now: against the one-token time of now
    assert c.ratio(3) == pytest.approx(0.090 / 0.060)
    assert c.ratio(2) < c.ratio(3)


def test_a_cut_to_nothing_is_not_final():
    """A block cost timed in a slow phase (here a 2-token forward at 3x a 1-token one) would cut
    every draft forever and never be timed again; choose_length sends one in EXPLORE anyway,
    and the new measurement lifts the cut."""
    stale = table(t1=60, t2=180)
    picks = [stale.choose_length([0.7, 0.6]) for _ in range(2 * ForwardCosts.EXPLORE)]
    assert picks.count(0) == 2 * ForwardCosts.EXPLORE - 2
    assert picks[ForwardCosts.EXPLORE - 1] >= 1 and picks[-1] >= 1
    assert stale.best_length([0.7, 0.6], least=1) >= 1 and stale.best_length([], least=1) == 0
    for _ in range(10):  # what the explored drafts measured beside plain steps: two tokens cost barely more than one
        stale.record(2, 0.062)
        stale.record(1, 0.060)
    assert stale.choose_length([0.7]) == 1


def test_hybrid_learns_how_far_copies_pass():
    h = Hybrid(Drafter(), model_k=3, ngram_max=3, ngram_min=1)  # the empty drafter as its model prophet
    policy = DraftPolicy(table(t1=60, t2=70, t3=80, t4=90, t5=100, t6=110))
    h.use_policy(policy)
    copy = Draft([1, 2, 3, 4, 5], chances=h.lookup.rates.chances(5))
    assert len(policy.cut(copy, 5).draft) == 3  # prior pass rate 2/3 per token: three pay
    for _ in range(30):  # copies keep failing at their second token
        h.drafter = h.lookup
        h.learn([(0, True), (1, False)])
    copy = Draft([1, 2, 3, 4, 5], chances=h.lookup.rates.chances(5))
    assert len(policy.cut(copy, 5).draft) == 1


def test_prompt_lookup_copies_are_cut_by_cost():
    """The policy sends whole copies until forward costs are measured, then as many copied
    tokens as pay, learned from how far prompt lookup's copies passed."""
    import torch

    from specdraft.config import SamplingConfig
    from specdraft.drafters.prompt_lookup import PromptLookup

    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]  # the 3-gram 1 2 3 continues 4 5 6 ...
    pl = PromptLookup(ngram_max=3, ngram_min=3)
    sent = lambda policy: policy.cut(pl.propose(ctx, 6, SamplingConfig(), torch.Generator()), 6).draft.tokens  # noqa: E731
    assert sent(DraftPolicy(ForwardCosts())) == [4, 5, 6, 7, 8, 9]  # no costs: the whole copy
    policy = DraftPolicy(table(t1=60, t2=70, t3=80, t4=90, t5=100, t6=110, t7=120))
    assert sent(policy) == [4, 5, 6]  # prior 2/3 a token: three pay
    assert sent(DraftPolicy(policy.costs, enabled=False)) == [4, 5, 6, 7, 8, 9]  # the cost rule off
    for _ in range(30):  # copies keep passing whole
        pl.learn([(i, True) for i in range(6)])
    assert sent(policy) == [4, 5, 6, 7, 8, 9]
    for _ in range(60):  # then keep failing at their first token
        pl.learn([(0, False)])
    assert sent(policy) != []  # a 1 in 3 chance still pays for a 70 ms verification instead of 60
    assert sent(DraftPolicy(table(t1=60, t2=90, t3=120, t4=150, t5=180, t6=210, t7=240))) == []  # not at half a forward a token


def test_pass_rates_calibrate_confidences():
    """A prophet sure of itself (0.95) but right one time in four: its bin learns ~25%, and the
    cost rule then stops sending such guesses; other bins keep trusting their confidence."""
    from specdraft.costs import PassRates

    r = PassRates()
    assert r.rate(0.95) == pytest.approx(0.95) and r.rate(0.12) == pytest.approx(0.15)
    for i in range(200):
        r.record(0.95, i % 4 == 0)
    assert r.rate(0.95) == pytest.approx(50 / 202, abs=0.03)  # 50 passes in 200 judged guesses
    assert r.rate(0.55) == pytest.approx(0.55)
    steep = table(t1=60, t2=90, t3=120)
    assert steep.best_length([0.95]) == 1 and steep.best_length([r.rate(0.95)]) == 0
    for _ in range(3):
        r.record(0.3, True)
    assert r.tried[3] == PassRates.PRIOR + 3 and r.passed[3] == pytest.approx(PassRates.PRIOR * 0.35 + 3)


def test_payoff_skips_a_prophet_that_does_not_pay_and_explores():
    from specdraft.costs import Payoff

    p = Payoff()
    for _ in range(Payoff.WARMUP):
        assert p.worth_running()
        p.record(1.2, 1.3, 0.3)  # 1.2 tokens for 1.3 forwards: worse than plain's 1 for 1
    runs = [p.worth_running() for _ in range(4 * Payoff.EXPLORE)]
    assert sum(runs) == 4 and runs[Payoff.EXPLORE - 1]  # every EXPLORE-th step still runs
    for _ in range(60):
        p.record(2.0, 1.3, 0.3)  # the text turned predictable
    assert p.worth_running() and p.tokens > p.cost


def test_payoff_waits_longer_while_explored_steps_still_do_not_pay():
    from specdraft.costs import Payoff

    p = Payoff()
    for _ in range(Payoff.WARMUP):
        p.worth_running()
        p.record(1.0, 1.5, 0.3)
    waits = []
    for _ in range(6):  # each explored step recorded, still not paying
        n = 1
        while not p.worth_running():
            n += 1
        waits.append(n)
        p.record(1.0, 1.5, 0.3)
    assert waits == [8, 16, 32, 64, 64, 64]
    n = 1
    while not p.worth_running():
        n += 1
    for _ in range(40):  # an explored step finds the text predictable: it pays again
        p.record(3.0, 1.5, 0.3)
    assert p.worth_running() and p.period == Payoff.EXPLORE


def test_a_prophet_that_pays_again_runs_after_one_explored_step():
    from specdraft.costs import Payoff

    p = Payoff()
    for _ in range(200):  # a long stretch where its steps do not pay: the wait grows to its longest
        if p.worth_running():
            p.record(1.0, 1.3, 0.3)
    assert p.period == Payoff.MAX_EXPLORE
    skipped = 0
    while not p.worth_running():
        skipped += 1
    assert skipped < Payoff.MAX_EXPLORE
    p.record(2.2, 1.4, 0.3)  # the explored step finds the text predictable
    assert p.tokens >= p.cost and p.period == Payoff.EXPLORE
    assert all(p.worth_running() for _ in range(8))  # it runs every step again, not 7 explored steps later


def test_payoff_never_skips_a_prophet_whose_drafting_is_free():
    from specdraft.costs import Payoff

    p = Payoff()
    for _ in range(200):  # steps that do not pay, drafting nothing (a copy that fails costs its check only)
        assert p.worth_running()
        p.record(1.0, 1.3, 0.0)
    assert p.skipped == 0
    for _ in range(40):  # the same steps, drafting a tenth of a forward each: skipped
        p.record(1.0, 1.4, 0.1)
    assert not p.worth_running()


def test_the_better_of_two_ways_is_picked_and_the_other_still_tried():
    ways = BetterOfTwo()
    for _ in range(20):
        ways.record(True, False)  # drawn from q: never passes here
        ways.record(False, True)
    picks = [ways.pick() for _ in range(4 * BetterOfTwo.EXPLORE)]
    assert picks.count(True) == 4 and all(p == (i % BetterOfTwo.EXPLORE == BetterOfTwo.EXPLORE - 1)
                                          for i, p in enumerate(picks))
    for _ in range(60):  # the text turns: q's guesses pass, the argmax ones do not
        ways.record(True, True)
        ways.record(False, False)
    assert ways.pick() is True
