"""Small helpers shared by the model-file modules (join, convert, packaged): the mode a
published file gets, one-line error text, and the progress shown while copying or converting."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..cache import console


def umask() -> int:
    """The process umask (reading it means setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: an exception as one line of a user-facing error."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextmanager
def byte_progress(total: int, label: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A rich byte progress bar on stderr; yields ``advance(n)``. A no-op when disabled."""
    if not enabled:
        yield lambda n: None
        return
    # imported here: rich.progress costs ~150 ms to import, and most starts show no bar
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console(), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def step(label: str, enabled: bool) -> Iterator[None]:
    """A rich spinner for a step of unknown length, then a line with its duration."""
    if not enabled:
        yield
        return
    out = console()
    t0 = time.perf_counter()
    with out.status(f"{label} ..."):
        yield
    out.print(f"[green]done[/] {label} ({time.perf_counter() - t0:.1f} s)")
