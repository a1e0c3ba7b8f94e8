"""The engine's forward-cost table (costs.ForwardCosts) through a change of the machine's phase that
changes the curve's shape, simulated, against a variant that levels every size at each due anchor:

    python scripts/phase_sim.py [--seeds 8] [--noise 0.03]

The curves are the Zen 4 EPYC's, `specdraft calibrate --blocks 1,2,3,4,5,6` twice in a row: fast
(23.7 ms a token; 2-6 tokens 1.13 / 1.43 / 1.56 / 1.86 / 1.96x one) and slow (34.1 ms; 1.04 /
1.15 / 1.14 / 1.27 / 1.36x). Each forward is off by lognormal noise (--noise).

- Open loop: 600 forwards in one phase, then 1,500 in the other (or the same: `steady`), each
  over 2-5 tokens at random unless the table asks for a one-token anchor. Prints the worst ratio
  error over 2-5 tokens per 100 forwards after the change, and the one-token forwards.
- Closed loop: four phases of 1,500 forwards, fast / slow / fast / slow, each step's draft
  length chosen by the table (``choose_length``) for chances around 0.62 / 0.42 / 0.30 / 0.21 /
  0.15 (each step's drawn around them). Prints the expected committed tokens per unit of true
  cost, over what the true curve's best length gives at the mean chances, per phase.

`Levelled`: a due anchor that finds its neighbour's ratio off moves every size by LEVEL of the
error (clipped at CLIP) and calls the next anchor after SOON forwards while the table is found off
by more than OFF. It follows a change in ~150 forwards where the table takes ~2,000 (open loop),
but commits no more per unit of cost (closed loop): the value of a length is flat near its best,
and the policy stops choosing the sizes it believes dear, so their errors cost nothing.
"""
from __future__ import annotations

import argparse
import math
import random

from specdraft.costs import ForwardCosts

FAST = {1: 1.0, 2: 1.13, 3: 1.43, 4: 1.56, 5: 1.86, 6: 1.96}
SLOW = {1: 1.0, 2: 1.04, 3: 1.15, 4: 1.14, 5: 1.27, 6: 1.36}
ONE = {id(FAST): 0.0237, id(SLOW): 0.0341}  # a one-token forward's seconds in each phase
CHANCES = [0.62, 0.42, 0.30, 0.21, 0.15]  # P(the first i + 1 guesses all pass), a head's on the dev prompts


class Levelled(ForwardCosts):
    """ForwardCosts whose due anchors level every size (see the module's docstring)."""

    SOON, LEVEL, OFF, CLIP = 16, 0.3, 0.1, 0.15

    def __init__(self):
        super().__init__()
        self.anchor_every = self.ANCHOR

    def wants_one(self) -> bool:
        return not self.measured or self.since_one >= self.anchor_every

    def record(self, tokens: int, seconds: float) -> None:
        last = self.last
        due = tokens == 1 and self.measured and self.since_one >= self.anchor_every
        before = self.log_ratio.get(last[0]) if last is not None and last[0] != 1 else None  # the neighbour's estimate
        super().record(tokens, seconds)
        if due and before is not None and last[1] > 0.0 and seconds > 0.0:
            off = math.log(last[1] / seconds) - before  # measured log r(neighbour) - its estimate
            step = self.LEVEL * max(-self.CLIP, min(self.CLIP, off))
            for t in self.log_ratio:
                if t != 1:
                    self.log_ratio[t] += step
            self._ratios.clear()
            self.anchor_every = self.SOON if abs(off) > self.OFF else min(self.ANCHOR, 2 * self.anchor_every)


def open_loop(cls, first, then, seed: int, noise: float) -> tuple[list[float], int]:
    """(worst ratio error per 100 forwards after the change, one-token forwards after it)."""
    rnd = random.Random(seed)
    costs, errors, ones = cls(), [], 0
    for i in range(600 + 1500):
        curve = first if i < 600 else then
        t = 1 if costs.wants_one() else rnd.choice((2, 3, 4, 5))
        costs.record(t, ONE[id(curve)] * curve[t] * math.exp(rnd.gauss(0.0, noise)))
        if i >= 600:
            ones += t == 1
            errors.append(max(abs(costs.ratio(s) / curve[s] - 1.0) for s in (2, 3, 4, 5)))
    return [sum(errors[j:j + 100]) / 100 for j in range(0, 1500, 100)], ones


def closed_loop(cls, seed: int, noise: float) -> list[float]:
    """Per phase (fast, slow, fast, slow): expected tokens per unit of true cost over the best at the mean chances."""
    rnd = random.Random(seed)
    costs, out = cls(), []
    for curve in (FAST, SLOW, FAST, SLOW):
        best = max((1 + sum(CHANCES[:n])) / curve[n + 1] for n in range(len(CHANCES) + 1))
        tokens = cost = 0.0
        for _ in range(1500):
            chances = [min(0.95, c * math.exp(rnd.gauss(0.0, 0.3))) for c in CHANCES]
            n = 0 if costs.wants_one() else costs.choose_length(chances)
            r = curve[n + 1] * math.exp(rnd.gauss(0.0, noise))
            costs.record(n + 1, ONE[id(curve)] * r)
            tokens += 1 + sum(chances[:n])
            cost += r
        out.append(tokens / cost / best)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--noise", type=float, default=0.03, help="sd of each forward's log time")
    args = p.parse_args()
    seeds = range(args.seeds)
    print("open loop: worst |learnt / true - 1| over 2-5 tokens per 100 forwards after the change; one-token forwards of 1,500")
    for name, cls in (("shipped", ForwardCosts), ("levelled", Levelled)):
        for change, (a, b) in (("fast->slow", (FAST, SLOW)), ("slow->fast", (SLOW, FAST)), ("steady", (FAST, FAST))):
            runs = [open_loop(cls, a, b, s, args.noise) for s in seeds]
            mean = [sum(r[0][j] for r in runs) / len(runs) for j in range(15)]
            print(f"  {name:9s} {change:10s} " + " ".join(f"{x:.2f}" for x in mean)
                  + f"   ones {sum(r[1] for r in runs) / len(runs):.1f}")
    print("closed loop: tokens per unit of cost over the true curve's best, phases fast / slow / fast / slow")
    for name, cls in (("shipped", ForwardCosts), ("levelled", Levelled)):
        runs = [closed_loop(cls, s, args.noise) for s in seeds]
        print(f"  {name:9s} " + " / ".join(f"{sum(r[i] for r in runs) / len(runs):.4f}" for i in range(4)))


if __name__ == "__main__":
    main()
