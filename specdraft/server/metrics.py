"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..metrics import SpecStats

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdraft_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter("specdraft_prompt_tokens", "prompt tokens of finished generations", registry=r)
        self.cached_prompt_tokens = Counter("specdraft_cached_prompt_tokens",
                                            "of them, held in the target's cache already (not prefilled)", registry=r)
        self.completion_tokens = Counter("specdraft_completion_tokens", "tokens generated", registry=r)
        self.target_forwards = Counter("specdraft_target_forwards", "target decode/verify forwards", registry=r)
        self.step_tokens = Counter("specdraft_step_tokens", "tokens committed by target forwards", registry=r)
        self.drafted = Counter("specdraft_draft_tokens", "draft tokens proposed", registry=r)
        self.accepted = Counter("specdraft_accepted_tokens", "draft tokens accepted", registry=r)
        self.mean_accepted = Gauge("specdraft_mean_accepted_tokens", "tokens per target forward, over all requests",
                                   registry=r)
        self.acceptance = Gauge("specdraft_acceptance_rate", "accepted / drafted tokens, over all requests", registry=r)
        self.latency = Histogram("specdraft_request_latency_seconds", "generation requests, arrival to last token",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("specdraft_time_to_first_token_seconds", "arrival to first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.waiting = Gauge("specdraft_queue_waiting", "requests waiting for the worker", registry=r)
        self.running = Gauge("specdraft_queue_running", "requests generating now (several when decoded together)",
                             registry=r)
        self._totals = [0, 0, 0, 0]  # forwards, step tokens, drafted, accepted

    def record(self, stats: SpecStats, latency: float) -> None:
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_prompt_tokens.inc(stats.cached_prompt_tokens)
        self.completion_tokens.inc(stats.new_tokens)
        self.target_forwards.inc(stats.target_forwards)
        self.step_tokens.inc(stats.step_tokens)
        self.drafted.inc(stats.draft_tokens)
        self.accepted.inc(stats.accepted_tokens)
        t = self._totals
        t[0] += stats.target_forwards
        t[1] += stats.step_tokens
        t[2] += stats.draft_tokens
        t[3] += stats.accepted_tokens
        if t[0]:
            self.mean_accepted.set(t[1] / t[0])
        if t[2]:
            self.acceptance.set(t[3] / t[2])
        self.latency.observe(latency)

    def render(self, waiting: int, running: int) -> bytes:
        self.waiting.set(waiting)
        self.running.set(running)
        return generate_latest(self.registry)
