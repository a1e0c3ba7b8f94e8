"""The scheduler behind the HTTP server: requests in arrival order, on one worker thread.

A request runs alone (its generation on the target's own cache, which a chat's next turn finds
again) unless others wait beside it that can be decoded with it: then the worker runs a session
of them together (``run_together``: one target forward a step for all, specdraft.batch), and
requests arriving while it runs join it at a step's end, as long as the waiting list's first is
one that can (first come, first served: one that cannot waits for the session to drain, and
nothing overtakes it). The event loop never runs model code; it talks to the worker through
:class:`Job` objects:

- ``submit`` places a job in a bounded waiting list (``QueueFull`` when it is full: HTTP 429);
- the worker streams each committed piece back into the job's asyncio queue, thread-safely;
- ``cancel`` (a client that disconnected) removes a waiting job at once, or makes the running
  job stop after its current step, freeing the worker for the next request;
- a job that outlives its deadline stops and finishes with reason "length" (still waiting:
  ``TimedOut``).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..metrics import SpecStats


class QueueFull(Exception):
    """The waiting list is full."""


class TimedOut(Exception):
    """The job's deadline passed before it started."""


@dataclass
class Outcome:
    stats: SpecStats
    finish_reason: str  # "stop" (EOS or a stop string), "length" (max tokens or time limit)


@dataclass(eq=False)
class Job:
    """One request's generation. ``events`` receives ("piece", Piece), then ("done", Outcome) or
    ("error", Exception)."""

    request: Any  # whatever the run function needs (prompt ids, configs)
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() after which the job stops
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    id: int = field(default_factory=itertools.count().__next__)
    started: float | None = None  # monotonic time the worker picked it up
    ended: bool = False  # its "done" or "error" has gone out

    def emit(self, kind: str, value) -> None:
        self.ended = self.ended or kind in ("done", "error")
        with contextlib.suppress(RuntimeError):  # a closed loop (server shutting down): nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    @property
    def stopped(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline


class Worker:
    """The worker thread and its bounded waiting list."""

    def __init__(self, run: Callable[[Job], Outcome], max_waiting: int = 16,
                 together: Callable[[Job], bool] | None = None,
                 run_together: Callable[[Job, Callable[[Callable[[Job], bool]], Job | None]], None] | None = None):
        self._run = run  # runs a job to its end, emitting pieces; returns its Outcome
        # whether a job can be decoded with others, and the run function of a session: it runs its
        # first job and those ``take(fits)`` hands it (each the waiting list's first, when
        # together() and fits() say so) to their ends, emitting every event of theirs, "done" too
        self._together, self._run_together = together, run_together
        self.max_waiting = max_waiting
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.running: list[Job] = []  # the jobs generating now
        self._thread = threading.Thread(target=self._loop, name="specdraft-worker", daemon=True)
        self._thread.start()

    @property
    def generating(self) -> int:
        """Requests generating now (a session's that have not ended)."""
        return sum(not job.ended for job in list(self.running))

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting")
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """The client is gone: forget the job if it still waits, else stop it after this step."""
        job.cancelled.set()
        with self._cond, contextlib.suppress(ValueError):  # ValueError: not waiting any more
            self._waiting.remove(job)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._waiting:
                job.cancelled.set()
            self._waiting.clear()
            self._cond.notify()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._waiting.popleft()
                self.running = [job]
                session = self._run_together is not None and self._together(job) and (
                    getattr(job, "choices", None) or (self._waiting and self._together(self._waiting[0])))
            try:
                if not _ready(job):
                    continue
                if session:
                    self._run_together(job, self._take)
                else:
                    job.emit("done", self._run(job))
            except Exception as e:  # reported to the request(s), the worker lives on
                for j in self.running:
                    j.emit("error", e)
            finally:
                with self._cond:
                    self.running = []

    def _take(self, fits: Callable[[Job], bool]) -> Job | None:
        """For a session: the waiting list's first job, started, when it can be decoded with
        the others and ``fits`` (jobs cancelled or past their time limit are dropped first)."""
        with self._cond:
            while self._waiting:
                job = self._waiting[0]
                if job.cancelled.is_set() or time.monotonic() > job.deadline:
                    self._waiting.popleft()
                    _ready(job)
                    continue
                if not self._together(job) or not fits(job):
                    return None
                self._waiting.popleft()
                self.running.append(job)
                job.started = time.monotonic()
                return job
            return None


def _ready(job: Job) -> bool:
    """Whether a job taken from the waiting list runs: not when cancelled, nor past its time
    limit (it is told so); a job that runs is marked started."""
    if job.cancelled.is_set():
        return False
    if time.monotonic() > job.deadline:
        job.emit("error", TimedOut("the request waited past its time limit; retry later"))
        return False
    job.started = time.monotonic()
    return True
