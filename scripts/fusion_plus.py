"""The bench with ``fusion+NAME`` methods: fusion's own components plus drafter NAME (one that
needs no model of its own, e.g. recycle or lookahead), so a candidate third prophet runs
interleaved with fusion as it ships.

    python scripts/fusion_plus.py recycle -- --per-category 1 --methods none,fusion,fusion+recycle --max-new-tokens 128
"""
from __future__ import annotations

import sys
from dataclasses import replace

from specdraft.cli import main
from specdraft.drafters import base, build_drafter
from specdraft.drafters.fusion import Fusion
from specdraft.drafters.fusion import _build as fusion_build


def add_fused(name: str) -> str:
    """Register ``fusion+name``."""

    def factory(ctx):
        shipped = fusion_build(ctx)
        return Fusion(shipped.components + [build_drafter(name, ctx)], trees=shipped.trees)

    base._REGISTRY[f"fusion+{name}"] = replace(base._REGISTRY["fusion"], factory=factory)
    return f"fusion+{name}"


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit(__doc__)
    for name in sys.argv[1].split(","):
        add_fused(name)
    sys.exit(main(["bench", *sys.argv[3:]]))
