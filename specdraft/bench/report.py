"""The benchmark's output: Markdown tables, terminal tables, per-method lines, and report files."""
from __future__ import annotations

import os
from pathlib import Path

from rich.table import Table

from ..config import SamplingConfig
from .errors import BenchError
from .records import BASELINE, PromptRecord, ratio, summarise
from .sampled import NOT_APPLICABLE, sampling_note

GREEDY = SamplingConfig()  # the tables' default: a greedy run, exactness against none

OVERALL_COLUMNS = ("method", "tokens/s", "speedup", "decode tok/s", "decode speedup", "tokens/forward",
                   "acceptance", "exact match", "draft ms/forward", "check ms/forward", "prompts", "new tokens",
                   "seconds")


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def overall_cells(row: dict, sampling: SamplingConfig = GREEDY) -> list[str]:
    exact = fmt(row["exact_match_rate"], ".0%") if sampling.greedy else NOT_APPLICABLE  # not a misleading "–" or 0%
    return [row["method"], fmt(row["tokens_per_s"]), fmt(row["speedup"], ".2f", "x"),
            fmt(row.get("decode_tokens_per_s")), fmt(row.get("decode_speedup"), ".2f", "x"),
            fmt(row["mean_accepted_tokens"]), fmt(row["acceptance_rate"], ".0%"), exact,
            fmt(row.get("draft_ms_per_forward"), ".1f"), fmt(row.get("check_ms_per_forward"), ".1f"),
            str(row["prompts"]), str(row["new_tokens"]), fmt(row["seconds"], ".1f")]


def speedup_grid(results: list[dict], methods: list[str], categories: list[str],
                 key: str = "speedup", suffix: str = "x") -> list[list[str]]:
    """Rows of [method, ``key`` (a speedup) per category..., overall]."""
    cell = {(r["method"], r["category"]): r.get(key) for r in results}
    return [[m] + [fmt(cell.get((m, c)), ".2f", suffix) for c in [*categories, "overall"]] for m in methods]


# ---------------------------------------------------------------------------- Markdown
def markdown_report(results: list[dict], methods: list[str], categories: list[str],
                    sampling: SamplingConfig = GREEDY, turns: tuple[list[dict], list[str]] = ([], []),
                    notes: tuple[str | None, ...] = ()) -> str:
    """``turns``: rows and labels by turn (bench.turns.by_turn), a table of their own when given;
    ``notes``: lines said before the tables (the machine, its phase; None skipped)."""
    overall = [r for r in results if r["category"] == "overall"]
    note = sampling_note(sampling)
    said = [line for line in notes if line]
    lines = ["## Overall", "", *([note[0].upper() + note[1:] + ".", ""] if note else []),
             *([" ".join(f"{n}." if not n.endswith(".") else n for n in said), ""] if said else []),
             _md_row(OVERALL_COLUMNS), _md_rule(len(OVERALL_COLUMNS))]
    lines += [_md_row(overall_cells(r, sampling)) for r in overall]
    header = ["method", *categories, "overall"]
    lines += ["", "## Speedup by category", "", _md_row(header), _md_rule(len(header))]
    lines += [_md_row(row) for row in speedup_grid(results, methods, categories)]
    lines += ["", "## Decode speedup by category (after the first token; our methods only)", "",
              _md_row(header), _md_rule(len(header))]
    lines += [_md_row(row) for row in speedup_grid(results, methods, categories, "decode_speedup")]
    turn_rows, turn_labels = turns
    if turn_rows:
        header = ["method", *turn_labels, "overall"]
        for title, key in (("Speedup by turn", "speedup"), ("Tokens per target forward by turn", "mean_accepted_tokens")):
            lines += ["", f"## {title}", "", _md_row(header), _md_rule(len(header))]
            lines += [_md_row(row) for row in speedup_grid(turn_rows, methods, turn_labels, key,
                                                           "x" if key == "speedup" else "")]
    return "\n".join(lines) + "\n"


def _md_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _md_rule(n: int) -> str:
    return "|" + "|".join(["---"] + ["---:"] * (n - 1)) + "|"  # numbers right-aligned


# ---------------------------------------------------------------------------- terminal
def print_tables(console, results: list[dict], methods: list[str], categories: list[str],
                 sampling: SamplingConfig = GREEDY, turns: tuple[list[dict], list[str]] = ([], [])) -> None:
    overall = [overall_cells(row, sampling) for row in results if row["category"] == "overall"]
    console.print(_table("overall", OVERALL_COLUMNS, overall, caption=sampling_note(sampling)))
    console.print(_table("speedup by category", ["method", *categories, "overall"],
                         speedup_grid(results, methods, categories)))
    turn_rows, turn_labels = turns
    if turn_rows:
        console.print(_table("speedup by turn", ["method", *turn_labels, "overall"],
                             speedup_grid(turn_rows, methods, turn_labels)))


def _table(title: str, columns: list[str], rows: list[list[str]], caption: str | None = None) -> Table:
    """A terminal table, its first column (the method) left-aligned, the numbers right-aligned."""
    table = Table(title=title, caption=caption)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def method_line(method: str, recs: list[PromptRecord], baseline_tps: float | None) -> str:
    """One method's totals in a line, printed as soon as its prompts are done."""
    row = summarise(method, "overall", recs)
    speed = ratio(row["tokens_per_s"], baseline_tps) if method != BASELINE else 1.0
    return (f"{method}: {row['new_tokens']} tokens in {row['seconds']:.1f} s, {fmt(row['tokens_per_s'])} tok/s, "
            f"speedup {fmt(speed, '.2f', 'x')}, {fmt(row['mean_accepted_tokens'])} tokens/forward")


# ---------------------------------------------------------------------------- files
def check_output_path(path: Path | None, flag: str) -> None:
    """Fail before any model loads, not after an hour of benchmarking."""
    if path is None:
        return
    if path.is_dir():
        raise BenchError(f"{flag} {path} is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise BenchError(f"{flag}: directory {parent} does not exist; create it or pick another path")
    if not os.access(parent, os.W_OK):
        raise BenchError(f"{flag}: cannot write into {parent}; pick another path")


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise BenchError(f"cannot write {path} ({e.strerror}); pick another path") from None


def report_location(path: Path | None) -> str:
    """The last line's pointer to the JSON report (``--json`` is optional)."""
    return f"report: {path}" if path is not None else "pass --json FILE to keep the full report"
