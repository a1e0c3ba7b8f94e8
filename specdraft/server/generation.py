"""One generation request, from its validated body to its stream of events.

- :func:`build_request` checks what only the served model can check (its name, the method's
  needs, the context length) and fixes the configs of the generation;
- :func:`run_generation` is the worker's run function: it drives the engine on the worker
  thread and emits each committed piece into the job; :func:`run_together` runs a session of
  jobs decoded together (a :class:`BatchJob`, several choices of one request, among them), each
  piece into its answer's job;
- :func:`job_events` is the event-loop side: the job's pieces, then its Outcome.
"""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from fastapi import Request

from .. import grammar
from ..batch import MAX_BATCH
from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import needs_draft_model
from ..errors import SpecdraftError
from ..metrics import SpecStats
from ..pipeline import Answer, GenerationResult, run_answer
from .config import ServerConfig
from .errors import APIError
from .metrics import ServerMetrics
from .worker import Job, Outcome, TimedOut

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class GenRequest:
    """What the worker needs for one generation."""

    prompt_ids: list[int]
    spec: SpecConfig
    sampling: SamplingConfig
    gen: GenerationConfig


def _speculation(body, config: ServerConfig, has_draft_model: bool, choice: int = 0) -> tuple[SpecConfig, SamplingConfig]:
    """The request's speculation (its method / k over the server's default) and sampling (the
    ``choice``-th answer to a prompt: its seed, when one is given, that many past the request's)."""
    method = body.method or config.spec.method
    try:
        spec = replace(config.spec, method=method, k=body.k if body.k is not None else config.spec.k)
        if needs_draft_model(method) and not has_draft_model:
            raise APIError(400, f"method {method!r} needs a draft model, which this server did not load",
                           param="method")
        sampling = SamplingConfig(temperature=float(body.temperature), top_k=body.top_k,
                                  top_p=float(body.top_p), min_p=float(body.min_p),
                                  seed=None if body.seed is None else (body.seed + choice) % 2**63,
                                  frequency_penalty=float(body.frequency_penalty),
                                  presence_penalty=float(body.presence_penalty),
                                  repetition_penalty=float(body.repetition_penalty), logit_bias=body.bias)
    except SpecdraftError as e:
        raise APIError(400, str(e), param="method" if "method" in str(e) else None) from None
    return spec, sampling


def build_request(body, prompt_ids: list[int], config: ServerConfig, speculator, choice: int = 0) -> GenRequest:
    """A validated body (ChatRequest / CompletionRequest) and one of its prompts' ids -> the
    GenRequest of its ``choice``-th answer (n > 1: a seed, when given, that many past the
    request's); raises APIError (404 for another model, 400 for what this model cannot do)."""
    if body.model not in (None, config.model_name):
        raise APIError(404, f"model {body.model!r} is not served here; GET /v1/models lists {config.model_name!r}",
                       param="model", code="model_not_found")
    spec, sampling = _speculation(body, config, speculator.draft is not None, choice)
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    vocab = speculator.target.model.vocab_size
    if sampling.logit_bias and sampling.logit_bias[-1][0] >= vocab:
        raise APIError(400, f"logit_bias: token ids must be below {vocab}", param="logit_bias")
    max_len = speculator.target.model.max_length
    room = max_len - len(prompt_ids)
    limit = body.token_limit
    if limit is None:
        limit = min(DEFAULT_MAX_TOKENS, room)
    if room < 1 or limit > room:
        raise APIError(400, f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({limit}) exceeds the "
                            f"context of {max_len} tokens", param="max_tokens", code="context_length_exceeded")
    gen = GenerationConfig(max_new_tokens=limit, stop=tuple(body.stop or ()), ignore_eos=body.ignore_eos,
                           logprobs=body.logprob_count, prompt_logprobs=body.prompt_logprob_count,
                           output_format=body.output_format)
    if gen.output_format is not None:  # (the format compiled in the body; this tokenizer must take it too)
        try:
            grammar.Constraint(gen.output_format, speculator.tokenizer, vocab, speculator.target.eos_ids)
        except SpecdraftError as e:
            raise APIError(400, str(e), param="response_format") from None
    return GenRequest(prompt_ids, spec, sampling, gen)


@dataclass(eq=False)
class BatchJob(Job):
    """A request's several choices (its GenRequests in ``request``) decoded together: the worker
    runs this job in a session (run_together); each choice's events go to its own job in
    ``choices`` (never queued), an error to all of them."""

    choices: list[Job] = field(default_factory=list)
    choices_ended: set[int] = field(default_factory=set)  # the choices whose Outcome has gone out

    def cancel_choice(self, worker, i: int) -> None:
        """Choice i's listener is done with it: the job stops if that choice had not ended (the
        client left) or it was the last one."""
        if i not in self.choices_ended or i == len(self.choices) - 1:
            worker.cancel(self)

    def emit(self, kind: str, value) -> None:
        self.ended = self.ended or kind in ("done", "error")
        if kind == "error":  # "done": each choice has had its own
            for choice in self.choices:
                choice.emit(kind, value)


def _counters(st) -> dict:
    """The live counters a piece goes out with (the page's figures)."""
    return {"draft_tokens": st.draft_tokens, "accepted_tokens": st.accepted_tokens,
            "target_forwards": st.target_forwards, "step_tokens": st.step_tokens}


def _reason(stopped: bool, n: int, gen: GenerationConfig) -> str:
    return "length" if stopped or n >= gen.max_new_tokens else "stop"


def run_generation(speculator, job: Job) -> Outcome:
    """Run ``job`` (its request a GenRequest) to its end on the worker thread: each piece is
    emitted with the live counters the page shows (after the prompt's scores, when they are asked
    for); stops early when the job is stopped. Returns its Outcome (the worker sends it)."""
    outcome: list[Outcome] = []
    run_answer(speculator.engine(job.request.spec), _answer(job.request, job, job, outcome.append))
    return outcome[0]


def decodes_together(speculator, job: Job) -> bool:
    """Whether ``job`` can be decoded with others (a BatchJob always is)."""
    return isinstance(job, BatchJob) or speculator.why_not_batched(job.request.spec) is None


def run_together(speculator, first: Job, take: Callable[[Callable[[Job], bool]], Job | None], slots: int,
                 prefill_chunk: int | None = None) -> None:
    """A session of jobs decoded together (Speculator.decode_together), ``first`` and the jobs
    ``take(fits)`` hands over while it runs (a job whose answers each fit the batch's cache):
    each answer joins as soon as the batch has a place and room for it, in order, its events
    going to its job as run_generation's do (a BatchJob's choices: to each choice's job).
    ``slots``: the batch's cache (larger where the first job's answers need it); ``prefill_chunk``:
    prompt rows a step of a joining answer's prefill (batch.Batch)."""
    pending = _answers(first)
    capacity = max(slots, *(a.need for a in pending))

    def more(room: int, places: int) -> list[Answer]:
        out = []
        while len(out) < places:
            while pending and pending[0].stop():  # stopped before it began: it ends empty
                a = pending.pop(0)
                a.on_done(GenerationResult("", [], [], SpecStats(method=a.spec.method), a.prompt_ids))
            if not pending:
                job = take(lambda j: all(a.need <= capacity for a in _answers(j)))
                if job is None:
                    break
                pending.extend(_answers(job))
                continue
            if pending[0].need > room:
                break
            room -= pending[0].need
            out.append(pending.pop(0))
        return out

    speculator.decode_together(more(capacity, MAX_BATCH), more=more, capacity=capacity, prefill_chunk=prefill_chunk)


def _answers(job: Job) -> list[Answer]:
    """The answers a job asks for, each emitting into its own job (a BatchJob: its choices')."""
    if isinstance(job, BatchJob):
        return [_answer(c.request, c, job, functools.partial(_ended, job, i)) for i, c in enumerate(job.choices)]
    return [_answer(job.request, job, job, functools.partial(job.emit, "done"))]


def _ended(job: BatchJob, i: int, outcome: Outcome) -> None:
    """Choice i of ``job`` has ended with ``outcome``."""
    job.choices_ended.add(i)
    job.choices[i].emit("done", outcome)


def _answer(req: GenRequest, out: Job, ctl: Job, finished: Callable[[Outcome], None]) -> Answer:
    """An Answer for ``req`` whose events go to ``out`` (the prompt's scores when asked for,
    before any piece; each piece with the live counters), stopped by ``ctl`` (its client gone or
    its time up); ``finished(outcome)`` at its end."""
    scored = [req.gen.prompt_logprobs is None]  # the prompt's scores go out once, before any piece
    stopped = [False]  # the stop ended it

    def scores(values) -> None:
        if not scored[0]:
            out.emit("prompt", values)
            scored[0] = True

    def on_piece(piece, engine) -> None:
        scores(engine.prompt_scores)
        out.emit("piece", (piece, _counters(engine.stats)))

    def stop() -> bool:
        stopped[0] = ctl.stopped
        return stopped[0]

    def on_done(result: GenerationResult) -> None:
        scores(list(zip(result.prompt_logprobs, result.prompt_top_logprobs)))  # max_tokens 0: scored alone
        timed_out = stopped[0] and not ctl.cancelled.is_set()
        finished(Outcome(result.stats, _reason(timed_out, len(result.token_ids), req.gen)))

    return Answer(req.prompt_ids, req.spec, req.sampling, req.gen, on_piece, on_done, stop=stop)


async def job_events(request: Request, job: Job, arrived: float,
                     metrics: ServerMetrics) -> AsyncIterator[tuple[str, object]]:
    """The job's ("prompt", its scores) event when the prompt is scored, its ("piece", (Piece,
    live counters)) events and then ("done", Outcome); raises
    APIError for a job that failed to start; stops (without an Outcome) when the client
    disconnects. Records time to first token and the finished request in ``metrics``."""
    first = True
    while True:
        try:
            ev, value = await asyncio.wait_for(job.events.get(), timeout=0.5)
        except TimeoutError:
            if await request.is_disconnected():
                return
            continue
        if ev == "error":
            if isinstance(value, TimedOut):
                raise APIError(429, str(value), "rate_limit_error", code="timeout")
            if isinstance(value, SpecdraftError):
                raise APIError(400, str(value))
            raise value
        if ev == "piece" and first:
            metrics.ttft.observe(time.monotonic() - arrived)
            first = False
        if ev == "done":
            metrics.record(value.stats, time.monotonic() - arrived)
            yield ev, value
            return
        yield ev, value
