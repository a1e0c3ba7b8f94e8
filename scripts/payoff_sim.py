"""costs.Payoff on made-up step streams: how long a prophet that turns good again stays skipped,
and what share of the steps prophets that never pay still run (and lose). Every step drafts for
DRAFTING one-token forwards (a model prophet's: free ones are never skipped).

    python scripts/payoff_sim.py
"""
import random

from specdraft.costs import Payoff

DRAFTING = 0.3


def recovery(bad=(1.0, 1.3), good=(2.2, 1.4), before=200, limit=2000) -> int | None:
    """Steps after a stretch of ``before`` steps committing bad[0] tokens for bad[1] forwards until
    the payoff runs the prophet again for steps of ``good``."""
    p = Payoff()
    for _ in range(before):
        if p.worth_running():
            p.record(*bad, DRAFTING)
    for i in range(limit):
        if p.worth_running():
            p.record(*good, DRAFTING)
            if p.tokens >= p.cost:
                return i
    return None


def share(pass_rate: float, cost: float, steps=20000, seed=0) -> tuple[float, float]:
    """(share of steps run, forwards lost a step) for a prophet whose one guess passes at
    ``pass_rate`` and whose steps cost ``cost`` one-token forwards."""
    rng, p = random.Random(seed), Payoff()
    ran, lost = 0, 0.0
    for _ in range(steps):
        if p.worth_running():
            tokens = 1 + (rng.random() < pass_rate)
            p.record(tokens, cost, DRAFTING)
            ran += 1
            lost += cost - tokens
    return ran / steps, lost / steps


def main() -> None:
    print("skipped steps before a prophet that turned good runs again:", recovery())
    for rate, cost in ((0.77, 1.83), (0.3, 1.6), (0.5, 1.6), (0.9, 1.6)):
        ran, lost = share(rate, cost)
        print(f"guess passes {rate}, step costs {cost} (commits {1 + rate:.2f}): runs {ran:.3f} of the steps, "
              f"loses {lost:+.3f} forwards a step")


if __name__ == "__main__":
    main()
