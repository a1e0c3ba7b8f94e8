"""What a target forward costs, by block size, measured while decoding: cost-aware draft lengths.

A draft of n tokens is verified by one target forward over n + 1 tokens. It pays when the
tokens it is expected to commit, 1 + P1 + ... + Pn (Pi: the chance that the first i guesses all
pass), are worth more than what the longer block costs over a one-token forward. How much more a
block costs depends on the machine and the weight format (measured here, AVX2 EPYC, 1.5B target:
w8a8 1/2/4/8 tokens 84/88/100/145 ms, gguf 60/68/91/161 ms), so the engine times its own
forwards and its policy (policy.DraftPolicy) sends the guesses with the most expected tokens
per second.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator

PRIOR_SLOPE = 0.05  # assumed extra cost per token of a block size not yet measured (optimistic:
# an unmeasured length gets tried, and measured)
ALPHA = 0.2  # weight of a new measurement in the running mean


def running_mean(mean: float, x: float) -> float:
    """The running mean (weight ALPHA) after x; the first measurement (mean 0) is taken whole."""
    return x if mean == 0.0 else mean + ALPHA * (x - mean)


class ForwardCosts:
    """What a target forward over T new tokens costs against a one-token forward of the same
    moment, learnt from the forwards the engine times while decoding.

    These machines run in phases minutes long, one up to ~2x slower than the other, and a
    speculating engine runs few one-token forwards (only steps with nothing to check). Dividing
    a block's time by a one-token mean timed minutes earlier mixed the phases (AVX2 EPYC, head
    chains, 13 prompts, scripts/engine_ratios.py: 2 and 3 tokens learnt as 0.89x and 0.98x one,
    timed side by side 1.10x and 1.33x). So ratios are learnt from neighbours: two forwards in a row run in the same
    phase, and log(s_b / s_a) estimates log r(b) - log r(a); each pair of different sizes moves
    both estimates toward it (one-token forwards fix r(1) = 1). One-token forwards anchor the
    chain of pairs; the engine runs one when none was timed for ANCHOR forwards
    (``wants_one``)."""

    EXPLORE = 16  # choose_length: one in EXPLORE cuts to nothing sends a draft anyway
    ANCHOR = 128  # forwards after which a one-token forward is due again

    def __init__(self):
        self.seconds: dict[int, float] = {}  # T -> running mean seconds (mixes phases; see ratio)
        self.log_ratio: dict[int, float] = {1: 0.0}  # T -> estimated log(cost(T) / cost(1))
        self.one_now = 0.0  # a one-token forward's seconds in the current phase (latest forwards)
        self.last: tuple[int, float] | None = None  # the previous forward: (T, seconds)
        self.since_one = 0  # forwards since the latest one-token forward
        self.cuts = 0  # drafts choose_length cut to nothing
        self.frozen = False  # record() learns nothing (ForwardCosts.fixed)
        # T -> ratio(T) since the latest record (the policy asks ~80 times a tree step, for the same
        # few sizes; each answer sorts the measured sizes)
        self._ratios: dict[int, float] = {}

    @classmethod
    def fixed(cls, ratios: dict[int, float], one_seconds: float) -> ForwardCosts:
        """A table that does not learn: cost(T) / cost(1) = ratios[T] (T = 1 implied), a one-token
        forward ``one_seconds`` (tests, and runs that should not adapt)."""
        c = cls()
        c.frozen = True
        c.seconds = {1: one_seconds} | {t: r * one_seconds for t, r in ratios.items()}
        c.log_ratio |= {t: math.log(r) for t, r in ratios.items() if t > 1}
        c.one_now = one_seconds
        return c

    @property
    def measured(self) -> bool:
        """A one-token forward has been timed: ratios mean something."""
        return bool(self.seconds.get(1))

    def wants_one(self) -> bool:
        """Whether the next step should be a one-token forward, to anchor the ratios: none timed
        yet, or none for ANCHOR forwards."""
        return not self.measured or self.since_one >= self.ANCHOR

    def record(self, tokens: int, seconds: float) -> None:
        if self.frozen:
            return
        self._ratios.clear()
        self.seconds[tokens] = running_mean(self.seconds.get(tokens, 0.0), seconds)
        self.since_one = 0 if tokens == 1 else self.since_one + 1
        if self.last is not None and self.last[0] != tokens:
            self._pair(*self.last, tokens, seconds)
        self.last = (tokens, seconds)
        if tokens in self.log_ratio and self.measured and seconds > 0.0:
            self.one_now = running_mean(self.one_now, seconds / self._ratio_at(tokens))

    def _pair(self, a: int, sa: float, b: int, sb: float) -> None:
        """Forwards over a then b tokens, timed one after the other (one phase)."""
        if sa <= 0.0 or sb <= 0.0:  # a clock too coarse to time it: nothing to learn
            return
        seen = self.log_ratio
        step = math.log(sb / sa)  # ~ log r(b) - log r(a)
        if a in seen and b not in seen:
            seen[b] = seen[a] + step
        elif b in seen and a not in seen:
            seen[a] = seen[b] - step
        elif a in seen and b in seen:
            err = step - (seen[b] - seen[a])
            for t, sign in ((a, -1.0), (b, 1.0)):
                if t != 1:
                    seen[t] += sign * ALPHA * err

    def _ratio_at(self, tokens: int) -> float:
        """cost(tokens) / cost(1) for a measured size."""
        return math.exp(self.log_ratio[tokens])

    def ratio(self, tokens: int) -> float:
        """cost(tokens) / cost(1); linear between measured sizes, beyond them the last measured
        segment's slope (at least the prior's)."""
        got = self._ratios.get(tokens)
        if got is None:
            got = self._ratios[tokens] = self._estimate(tokens)
        return got

    def _estimate(self, tokens: int) -> float:
        """ratio(tokens) from the table as it stands."""
        if not self.measured or tokens <= 1:
            return 1.0 + PRIOR_SLOPE * (max(tokens, 1) - 1)
        known = sorted(t for t in self.log_ratio if t <= tokens)
        lo = known[-1]
        if lo == tokens:
            return self._ratio_at(tokens)
        above = [t for t in self.log_ratio if t > tokens]
        if above:
            hi = min(above)
            r_lo, r_hi = self._ratio_at(lo), self._ratio_at(hi)
            return r_lo + (r_hi - r_lo) * (tokens - lo) / (hi - lo)
        # past the largest measured size: the steeper of the prior and the last measured segment
        # (costs per token only grow with the block on these CPUs; the prior alone let early
        # trees of 20-30 nodes look nearly free)
        slope = PRIOR_SLOPE
        if len(known) >= 2:
            prev = known[-2]
            slope = max(slope, (self._ratio_at(lo) - self._ratio_at(prev)) / (lo - prev))
        return self._ratio_at(lo) + slope * (tokens - lo)

    def _values(self, sure: list[float], drafting) -> Iterator[tuple[int, float]]:
        """(n, expected committed tokens per unit of cost of sending the first n guesses) for n =
        1..len(sure), sure[i] = P(the first i + 1 guesses all pass); ``drafting(n)``: what making
        them costs, in one-token forwards."""
        expected = 1.0
        for n, p in enumerate(sure, start=1):
            expected += p
            yield n, expected / (self.ratio(n + 1) + drafting(n))

    def best_length(self, sure: list[float], draft_cost: float = 0.0, free: int = 0, least: int = 0) -> int:
        """How many of the guesses to send: the n (least..len(sure)) that maximises expected
        committed tokens per unit of cost, where sure[i] = P(the first i + 1 guesses all pass) and
        draft_cost is what one guess costs in one-token forwards (the first ``free`` guesses cost
        nothing more: a draft model's first guess comes from the forward that catches it up)."""
        best_n, best = 0, (1.0 if least == 0 else -1.0)
        for n, value in self._values(sure, lambda n: draft_cost * max(n - free, 0)):
            if n >= least and value > best:
                best_n, best = n, value
        return best_n

    def best_value(self, ranked: list[float], round_cost: float = 0.0) -> float:
        """A tree's side of best_length: the most expected committed tokens per unit of cost that
        sending its n likeliest nodes gives (n = 0..; ``ranked``: the nodes' chances, likeliest
        first), where drafting costs ``round_cost`` one-token forwards once, whatever n (one more
        round of a batched drafter), and the check its block's ratio."""
        return max([1.0 / (1.0 + round_cost), *(value for _, value in self._values(ranked, lambda n: round_cost))])

    def choose_length(self, sure: list[float], draft_cost: float = 0.0, free: int = 0) -> int:
        """best_length for the draft actually sent, exploring: of the steps it would cut to
        nothing, every EXPLORE-th sends the best non-empty draft instead. Without that a cut is
        final: a block cost timed once in a slow phase of the machine, or pass rates learnt on a
        stretch of unpredictable text, are never measured again, and the prophet stays silent."""
        n = self.best_length(sure, draft_cost, free)
        if n == 0 and sure:
            self.cuts += 1
            if self.cuts % self.EXPLORE == 0:
                n = self.best_length(sure, draft_cost, free, least=1)
        return n


class PassRates:
    """How often a prophet's guesses of a given confidence actually passed: its confidences,
    calibrated online.

    A trained head's softmax probability is not the chance that the target agrees (a head can be
    sure and wrong), and the cost rule above sends a guess only when that chance pays for the
    longer verification. Guesses are counted in confidence bins; each bin starts from a prior of
    its own confidence (weight PRIOR), so an unseen bin trusts the prophet and a seen one learns.
    Only guesses the verifier judged count (policy.DraftPolicy.judged).
    """

    BINS = 10
    PRIOR = 2.0

    def __init__(self):
        self.tried = [self.PRIOR] * self.BINS
        self.passed = [self.PRIOR * (b + 0.5) / self.BINS for b in range(self.BINS)]

    def _bin(self, confidence: float) -> int:
        return min(max(int(confidence * self.BINS), 0), self.BINS - 1)

    def rate(self, confidence: float) -> float:
        b = self._bin(confidence)
        return self.passed[b] / self.tried[b]

    def record(self, confidence: float, passed: bool) -> None:
        """A judged guess of this confidence passed or not."""
        b = self._bin(confidence)
        self.tried[b] += 1
        self.passed[b] += passed


class BetterOfTwo:
    """Which of two ways of guessing passes more often here: counts of judged first guesses per way
    (a prior of 1 in 2 each); ``pick`` returns the way with the higher pass rate, and every
    EXPLORE-th pick the other, so a way that starts badly is measured again."""

    EXPLORE = 8

    def __init__(self):
        self.passed = {False: 1.0, True: 1.0}
        self.tried = {False: 2.0, True: 2.0}
        self.picks = 0

    def rate(self, way: bool) -> float:
        return self.passed[way] / self.tried[way]

    def pick(self) -> bool:
        self.picks += 1
        best = self.rate(True) > self.rate(False)
        return (not best) if self.picks % self.EXPLORE == 0 else best

    def record(self, way: bool, passed: bool) -> None:
        self.tried[way] += 1
        self.passed[way] += passed


class CopyRates:
    """How often the i-th copied token of a copy (prompt lookup) passed given that the ones before
    it did (counts with a prior of 2 in 3): a copy's chances, by which the engine's policy sends
    as many copied tokens as pay for their check. Copies cost nothing to make, but each one
    lengthens the target's forward: on a CPU where a forward over 4 tokens costs ~2.3 one-token
    forwards, an 8-token copy after a chance 3-gram match loses time."""

    SIZE = 64

    def __init__(self):
        self.tried = [3.0] * self.SIZE
        self.passed = [2.0] * self.SIZE

    def chances(self, n: int) -> list[float]:
        """[n] P(the first i + 1 copied tokens all pass)."""
        sure, out = 1.0, []
        for i in range(n):
            j = min(i, self.SIZE - 1)
            sure *= self.passed[j] / self.tried[j]
            out.append(sure)
        return out

    def record(self, i: int, passed: bool) -> None:
        """The verifier judged the copy's i-th token (0-based)."""
        if i < self.SIZE:
            self.tried[i] += 1
            self.passed[i] += passed


class Payoff:
    """Whether running a prophet at all pays: running means of what its steps committed (1 + the
    guesses accepted) and what they cost (the verification's ratio plus the drafting, in
    one-token forwards), against plain decoding's 1 token for 1 forward (policy.DraftPolicy).

    The cost rule cuts drafts that do not pay, but computing even one guess costs something (a
    head step with its output rows was ~8% of a forward on the AVX2 machine, ~5% with int8
    matrices): when the prophet's steps commit less
    per unit of cost than plain steps, it is skipped, run again after EXPLORE skipped steps to
    notice when the text turns predictable. Each explored step that leaves it still not paying
    doubles the wait, up to MAX_EXPLORE: exploring costs what a step that does not pay loses, and
    a prophet that never pays on this machine (a layer-skipped copy of the target whose guesses
    cost 0.7 of a forward each, Zen 4 EPYC) lost 4% to its explored steps every 8th.

    An explored step weighs EXPLORED in the means, not ALPHA: the means describe the text of the
    last ~1 / ALPHA steps the prophet ran, and after 8-64 skipped ones the explored step is the one
    word on the text now. At ALPHA a prophet that turned good again (2.2 tokens for 1.4 forwards
    after 1.0 for 1.3) stayed skipped for 447 steps, past a whole answer, once its wait had grown
    to 64; at EXPLORED it runs again after 63 (the first explored step), and one that never pays
    runs 2-11% of the steps, losing under 0.01 forward a step (scripts/payoff_sim.py).

    A prophet whose drafting costs nearly nothing (under FREE one-token forwards a step on
    average: prompt lookup, suffix trees, retrieval, lookahead's pool, ~0.1-0.3 ms against a 25
    ms forward) is never skipped: what its steps could lose is the check, which the cost rule
    already sizes by its calibrated chances, while skipping it silences it for the text where
    copies come in bursts (Zen 4 EPYC, 13 dev prompts: with the waits grown to 64, prompt lookup
    and suffix drafted nothing on 10-11 of them, 1.00x and 0.99x `none`).
    """

    ALPHA = 0.05  # weight of a new step once WARMUP steps were seen (plain mean before)
    EXPLORED = 0.3  # weight of an explored step
    FREE = 0.02  # mean drafting, in one-token forwards a step, below which a prophet is never skipped
    WARMUP = 16
    EXPLORE = 8
    MAX_EXPLORE = 64

    def __init__(self):
        self.tokens = self.cost = 0.0
        self.drafting = 0.0  # mean drafting cost a step, in one-token forwards (part of cost)
        self.steps = 0  # steps recorded
        self.skipped = 0  # steps skipped
        self.period = self.EXPLORE  # skipped steps before the next explored one
        self.waited = 0  # skipped since the last explored step
        self.exploring = False  # the step last allowed to run was explored

    def record(self, tokens: float, cost: float, drafting: float = 0.0) -> None:
        """A step committed ``tokens`` for ``cost`` one-token forwards, ``drafting`` of them drafting."""
        self.steps += 1
        a = max(self.EXPLORED if self.exploring else self.ALPHA, 1.0 / self.steps)
        self.tokens += a * (tokens - self.tokens)
        self.cost += a * (cost - self.cost)
        self.drafting += a * (drafting - self.drafting)
        if self.exploring:  # what an explored step found sets the next wait
            self.exploring = False
            self.period = self.EXPLORE if self.tokens >= self.cost else min(2 * self.period, self.MAX_EXPLORE)

    def worth_running(self) -> bool:
        """Run the prophet this step? (A no counts as a skipped step.)"""
        if self.steps < self.WARMUP or self.tokens >= self.cost or self.drafting < self.FREE:
            self.period, self.waited = self.EXPLORE, 0
            return True
        self.skipped += 1
        self.waited += 1
        if self.waited < self.period:
            return False
        self.waited, self.exploring = 0, True
        return True


class KeyRates:
    """How often guesses of one kind passed, given their parent did: a kind is a key (lookahead's
    depth on a branch, token recycling's depth and rank), each starting from ``prior(key)``
    weighing WEIGHT guesses, so an unseen kind is tried and a seen one learns."""

    WEIGHT = 4.0

    def __init__(self, prior: Callable[[Hashable], float] | float = 0.3):
        self.prior = prior if callable(prior) else (lambda key, p=float(prior): p)
        self.tried: dict[Hashable, float] = {}
        self.passed: dict[Hashable, float] = {}

    def rate(self, key: Hashable) -> float:
        return (self.passed.get(key, 0.0) + self.prior(key) * self.WEIGHT) / (self.tried.get(key, 0.0) + self.WEIGHT)

    def record(self, key: Hashable, passed: bool) -> None:
        self.tried[key] = self.tried.get(key, 0.0) + 1
        self.passed[key] = self.passed.get(key, 0.0) + passed
