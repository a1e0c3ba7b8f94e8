"""The methods a bench run can time: ``none`` (the baseline), our drafters, and the peers."""
from __future__ import annotations

from ..drafters import drafter_names, head_kind, needs_draft_model
from ..errors import ParameterError
from ..heads.model import shipped_head_dir
from ..models.packaged import DEFAULT_TARGET
from ..options import spec_from_args
from .errors import BenchError
from .llama_cpp import METHODS as LLAMA_CPP_METHODS
from .peers import PEERS
from .prompts import parse_list
from .records import BASELINE

ALL = "all"  # every method of ours: the registered drafters, none included (peers are named one by one)


def known_methods() -> list[str]:
    return [*drafter_names(), *PEERS, *LLAMA_CPP_METHODS]  # drafter_names starts with none, the baseline


def parse_methods(text: str) -> list[str]:
    """Validated method names with ``all`` expanded and the baseline first (added when missing:
    speedups need it). ``"all,llama-cpp"`` -> none, every drafter, llama-cpp."""
    valid = known_methods()
    names: list[str] = []
    for name in parse_list(text) or []:
        if name == ALL:
            names += drafter_names()
        elif name in valid:
            names.append(name)
        else:
            raise BenchError(f"unknown method {name!r}; choose from: {ALL}, {', '.join(valid)}")
    return [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]


def drop_unavailable(methods: list[str], text: str, args) -> tuple[list[str], dict[str, str]]:
    """Drop the methods that ``all`` brought in but that cannot run with these options, each with
    its reason. A method named on its own stays: the user asked for it, so it fails with its error."""
    named = set(parse_list(text) or [])
    skipped = {m: why for m in methods if m not in named and (why := unavailable(m, args)) is not None}
    return [m for m in methods if m not in skipped], skipped


def unavailable(method: str, args) -> str | None:
    """Why one of our methods cannot run with these options, or None; decided before any model loads."""
    if is_peer(method):
        return None
    try:  # its speculation settings (retrieval: an --index)
        spec_from_args(method, args)
    except ParameterError as e:
        return str(e)
    target = args.target or DEFAULT_TARGET
    if needs_draft_model(method) and getattr(args, "draft", None) is None and target != DEFAULT_TARGET:
        # the default draft shares the default target's tokenizer; another target's is unknown until it loads
        return f"it needs a draft model sharing the tokenizer of {target!r} (pass --draft NAME|DIR|FILE.gguf)"
    kind = head_kind(method)
    if kind is None:
        return None
    option = "--head" if kind == "mlp" else f"--{kind}"
    if getattr(args, option[2:]) is None and shipped_head_dir(target, kind) is None:
        what = "a drafting head" if kind == "mlp" else f"a trained {kind} drafter"
        return f"it needs {what} and none is shipped for {target!r} (pass {option} DIR)"
    return None


def needs_our_draft(methods: list[str]) -> bool:
    return any(m != BASELINE and not is_peer(m) and needs_draft_model(m) for m in methods)


def is_peer(method: str) -> bool:
    """A method run by another library (transformers, llama.cpp), not by our engine."""
    return method in PEERS or method in LLAMA_CPP_METHODS
