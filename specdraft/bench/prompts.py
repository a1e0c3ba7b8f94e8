"""Benchmark prompts: reading and validating Spec-Bench JSON-lines files, and picking a subset.

Each line is ``{"question_id": ..., "category": ..., "turns": [first user turn, ...]}``; the
benchmark uses the first turn, and with ``--turns N`` the later ones too (see
:mod:`specdraft.bench.turns`). The Spec-Bench dev prompts ship with the package
(:data:`PACKAGED_PROMPTS`, see ``data/README.md``) and are used when ``--prompts`` is not given.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import BenchError

PACKAGED_PROMPTS = Path(__file__).parent / "data" / "spec_bench_dev.jsonl"  # 240 prompts, 13 categories


@dataclass(frozen=True)
class BenchPrompt:
    question_id: int | str
    category: str
    text: str  # the first turn
    later: tuple[str, ...] = ()  # the user's later turns, if any (Spec-Bench's MT-bench prompts have a second)


def prompts_path(given: Path | None) -> Path:
    """The prompts file to read: ``--prompts`` when given, else the packaged Spec-Bench dev prompts."""
    return PACKAGED_PROMPTS if given is None else Path(given)


def load_prompts(path: Path) -> list[BenchPrompt]:
    """Read a Spec-Bench JSON-lines file; every problem is a BenchError naming the line."""
    text = _read_text(path)
    prompts = [parse_prompt_line(line, n, path) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not prompts:
        raise BenchError(f"prompts file {path} holds no prompts; it needs one JSON object per line")
    _check_unique_ids(prompts, path)
    return prompts


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchError(f"prompts file {path} does not exist; pass a Spec-Bench .jsonl file with --prompts") from None
    except IsADirectoryError:
        raise BenchError(f"prompts path {path} is a directory; pass a .jsonl file with --prompts") from None
    except UnicodeDecodeError as e:
        raise BenchError(f"prompts file {path} is not UTF-8 text (bad byte at offset {e.start}); "
                         "is it the right file?") from None
    except OSError as e:
        raise BenchError(f"cannot read prompts file {path} ({e.strerror}); check the path and permissions") from None


def parse_prompt_line(line: str, lineno: int, path: Path | str = "prompts") -> BenchPrompt:
    where = f"{path}, line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BenchError(f"{where}: not valid JSON ({e.msg}, column {e.colno}); each line must be one JSON object") from None
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: expected a JSON object with question_id, category, turns; got {type(obj).__name__}")
    missing = [k for k in ("question_id", "category", "turns") if k not in obj]
    if missing:
        raise BenchError(f"{where}: missing field(s) {', '.join(missing)}; each line needs question_id, category, turns")
    qid, category, turns = obj["question_id"], obj["category"], obj["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise BenchError(f"{where}: question_id must be an integer or a string, got {qid!r}")
    if not isinstance(category, str) or not category.strip():
        raise BenchError(f"{where}: category must be a non-empty string, got {category!r}")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise BenchError(f"{where}: turns must be a non-empty list of non-empty strings")
    return BenchPrompt(qid, category, turns[0], tuple(turns[1:]))


def _check_unique_ids(prompts: list[BenchPrompt], path: Path) -> None:
    # Results are matched to the baseline by question_id, so a repeated id would compare wrong pairs.
    seen: set = set()
    for p in prompts:
        if p.question_id in seen:
            raise BenchError(f"prompts file {path} repeats question_id {p.question_id!r}; ids must be unique")
        seen.add(p.question_id)


def categories_in_order(prompts: list[BenchPrompt]) -> list[str]:
    return list(dict.fromkeys(p.category for p in prompts))


def parse_list(text: str | None) -> list[str] | None:
    """Comma-separated names, blanks dropped, duplicates dropped in order; None stays None."""
    if text is None:
        return None
    return list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))


def select_prompts(prompts: list[BenchPrompt], categories: list[str] | None = None,
                   per_category: int | None = None) -> list[BenchPrompt]:
    """Keep the named categories (file order) and at most ``per_category`` prompts of each."""
    known = categories_in_order(prompts)
    if categories is not None:
        unknown = [c for c in categories if c not in known]
        if unknown or not categories:
            raise BenchError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown) or '(none given)'}; "
                             f"the prompts file has: {', '.join(known)}")
        prompts = [p for p in prompts if p.category in categories]
    if per_category is not None:
        if per_category < 1:
            raise BenchError(f"--per-category must be at least 1, got {per_category}")
        taken: dict[str, int] = {}
        kept = []
        for p in prompts:
            if taken.get(p.category, 0) < per_category:
                taken[p.category] = taken.get(p.category, 0) + 1
                kept.append(p)
        prompts = kept
    return prompts


def prompts_from_args(args) -> list[BenchPrompt]:
    """The prompts a bench run times: ``--prompts`` (or the packaged ones), ``--categories``, ``--per-category``."""
    return select_prompts(load_prompts(prompts_path(args.prompts)), parse_list(args.categories), args.per_category)
