"""The methods a bench run can time: ``none`` (the baseline), our drafters, and the peers."""
from __future__ import annotations

from ..drafters import drafter_names, needs_draft_model
from .errors import BenchError
from .llama_cpp import NAME as LLAMA_CPP
from .peers import PEERS
from .prompts import parse_list
from .records import BASELINE


def known_methods() -> list[str]:
    return [*drafter_names(), *PEERS, LLAMA_CPP]  # drafter_names starts with none, the baseline


def parse_methods(text: str) -> list[str]:
    """Validated method names with the baseline first (added when missing: speedups need it)."""
    names = parse_list(text) or []
    valid = known_methods()
    for name in names:
        if name not in valid:
            raise BenchError(f"unknown method {name!r}; choose from: {', '.join(valid)}")
    return [BASELINE] + [n for n in names if n != BASELINE]


def needs_our_draft(methods: list[str]) -> bool:
    return any(m != BASELINE and not is_peer(m) and needs_draft_model(m) for m in methods)


def is_peer(method: str) -> bool:
    """A method run by another library (transformers, llama.cpp), not by our engine."""
    return method in PEERS or method == LLAMA_CPP
