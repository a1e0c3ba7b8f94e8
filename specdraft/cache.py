"""Where specdraft keeps what it makes once: joined GGUFs, converted models, packed kernel
records, compiled kernels (``$SPECDRAFT_CACHE`` or ``~/.cache/specdraft``), and the stderr console
its progress goes to. The bottom layer: imports nothing of the package."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where joined GGUFs and converted models live: ``$SPECDRAFT_CACHE`` or ``~/.cache/specdraft``."""
    env = os.environ.get("SPECDRAFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdraft"


def console():
    """A stderr console, so progress never mixes with generated text on stdout. Its status lines
    draw only on a terminal and are erased when done: they never reach a log or an error message."""
    from rich.console import Console

    return Console(stderr=True)
