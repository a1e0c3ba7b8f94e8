"""What a prophet that sizes its drafts by cost keeps between propose and observe."""
from __future__ import annotations

from ..costs import ForwardCosts, PassRates, Payoff
from .base import Drafter


class CostAware(Drafter):
    """What a prophet that sizes its drafts by cost keeps between ``propose`` and ``observe``
    (drafters.feature_head, drafters.draft_model): the engine's forward costs (``use_costs``),
    its calibrated confidences (``rates``), whether its steps pay at all (``payoff``), and the
    confidences and cost of the draft it proposed last (``proposed_confidences``, ``step_cost``),
    learnt from by ``learn_from_verdict`` once the verifier has judged them."""

    def __init__(self):
        self.costs: ForwardCosts | None = None  # from the engine: drafts cut to the best length
        self.rates = PassRates()  # confidences -> how often such guesses passed
        self.payoff = Payoff()  # do its steps commit more per unit of cost than plain ones?
        self.proposed_confidences: list[float] = []  # confidences of the guesses proposed last, until observed
        self.step_cost: float | None = None  # the last step's cost in one-token forwards, until observed

    def use_costs(self, costs: ForwardCosts) -> None:
        self.costs = costs

    def learn_from_verdict(self, num_accepted: int) -> None:
        """The last draft was judged: its confidences learn how often they were right (nothing
        to learn when this step's draft came from another prophet: proposed_confidences = [])."""
        self.rates.record(self.proposed_confidences, num_accepted)
        if self.step_cost is not None:
            self.payoff.record(1 + num_accepted, self.step_cost)
        self.proposed_confidences, self.step_cost = [], None
