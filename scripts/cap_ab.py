"""The bench with each named method also run under another draft cap, interleaved, so two caps meet
the same phases of the machine: ``<method>@K`` is the same drafter with its draft cap (the
engine's, and a hybrid's model part's) K instead of config.draft_cap's.

    python scripts/cap_ab.py 16 prompt-lookup,hybrid-head -- --prompts benchmarks/coding_edits.jsonl \\
        --methods none,prompt-lookup,prompt-lookup@16,hybrid-head,hybrid-head@16 --max-new-tokens 256
"""
from __future__ import annotations

import sys
from dataclasses import replace

from specdraft import config
from specdraft.cli import main
from specdraft.drafters import base

CAPS: dict[str, int] = {}  # alias -> its cap
_default_cap = config.draft_cap


def _cap(method: str, cost_rule: bool = True) -> int:
    return CAPS[method] if method in CAPS else _default_cap(method, cost_rule)


def add_alias(method: str, k: int) -> str:
    """Register ``method@k``: ``method``'s drafter under draft cap k."""
    entry = base._REGISTRY[method]
    alias = f"{method}@{k}"

    def factory(ctx, _build=entry.factory):
        return _build(replace(ctx, spec=replace(ctx.spec, k=k)))

    base._REGISTRY[alias] = replace(entry, factory=factory)
    CAPS[alias] = k
    return alias


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[3] != "--":
        raise SystemExit(__doc__)
    config.draft_cap = _cap  # SpecConfig.draft_len reads it by name at call time
    for name in sys.argv[2].split(","):
        add_alias(name, int(sys.argv[1]))
    sys.exit(main(["bench", *sys.argv[4:]]))
