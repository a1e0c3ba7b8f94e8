"""One generation at a time, in request order: the scheduler behind the HTTP server.

The models hold one KV cache each, so requests run one after another on a single worker thread
(first come, first served: fair, and a long prompt cannot starve others of their turn for longer
than one request). The event loop never runs model code; it talks to the worker through
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

    def emit(self, kind: str, value) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop (server shutting down): nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    @property
    def stopped(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline


class Worker:
    """The worker thread and its bounded waiting list."""

    def __init__(self, run: Callable[[Job], Outcome], max_waiting: int = 16):
        self._run = run  # runs a job to its end, emitting pieces; returns its Outcome
        self.max_waiting = max_waiting
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.running: Job | None = None
        self._thread = threading.Thread(target=self._loop, name="specdraft-worker", daemon=True)
        self._thread.start()

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
                self.running = job
            try:
                if job.cancelled.is_set():
                    continue
                if time.monotonic() > job.deadline:
                    job.emit("error", TimedOut("the request waited past its time limit; retry later"))
                    continue
                job.started = time.monotonic()
                job.emit("done", self._run(job))
            except Exception as e:  # reported to the request, the worker lives on
                job.emit("error", e)
            finally:
                with self._cond:
                    self.running = None
