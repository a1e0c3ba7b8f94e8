"""``specdraft bench``: time methods on Spec-Bench prompts and check they decode what plain decoding does.

The protocol follows Spec-Bench: greedy decoding, batch size 1, the first turn of each question
through the target's chat template. Every method gets the same prompts, the same
max-new-tokens and stops at the same EOS ids. ``none`` (plain decoding by our runtime) runs
first: speedups are relative to it and every other method's tokens are compared with its tokens.

Per method and category (and ``overall``):
  tokens_per_s          total new tokens / total seconds (prefill included) over those prompts
  speedup               tokens_per_s / the same for ``none``
  decode_tokens_per_s   (new tokens - 1) / (seconds - target prefill): speed after the first token,
                        draft prefill included (our engine only; null for the transformers peers,
                        whose prefill time is not observed)
  decode_speedup        decode_tokens_per_s / the same for ``none``
  mean_accepted_tokens  tokens committed per target forward (decode/verify forwards; for the
                        transformers peers every target call, see :mod:`specdraft.bench.peers`)
  acceptance_rate       accepted / drafted tokens (null where the method does not say)
  exact_match_rate      fraction of prompts whose tokens equal ``none``'s

A greedy method that disagrees with ``none`` is either wrong or meets a near-tie that rounding
broke differently (bf16 vs fp32, a block forward vs a one-token forward). To tell which, the
mismatch analysis reruns our target on the shared prefix and reports the gap between its two
largest logits there; a gap above ``--tie-gap`` gets a warning line.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..cli import spec_from_args
from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..errors import SpecdraftError
from ..pipeline import resolve_dtype
from .llama_cpp import NAME as LLAMA_CPP
from .peers import PEERS, Outcome, PeerModels, PeerRunner, assistant_key, target_key

BASELINE = "none"
GREEDY = SamplingConfig()  # temperature 0: the only mode whose outputs can be compared token for token
WARMUP_PROMPT = "Write one sentence about the sea."
WARMUP_TOKENS = 32  # enough for a prefill and several decode/verify shapes
DEFAULT_TIE_GAP = 0.1  # logits; bf16 rounding moves logits by a few hundredths on our models


class BenchError(SpecdraftError):
    """The benchmark's input (prompts file, method list, output path) is unusable."""


# ============================================================================ arguments
def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", required=True, type=Path,
                   help="Spec-Bench prompts, JSON lines with question_id, category, turns")
    p.add_argument("--methods", default="none,draft-model,prompt-lookup",
                   help="comma-separated: none, our drafters, the transformers peers "
                        f"{', '.join(PEERS)} and {LLAMA_CPP} (llama.cpp on the target's GGUF; needs "
                        "llama-cpp-python) (none always runs first: it is the baseline)")
    p.add_argument("--max-new-tokens", type=int, default=GenerationConfig.max_new_tokens)
    p.add_argument("--per-category", type=int, default=None, help="first N prompts of each category (file order)")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep (default: all)")
    p.add_argument("--json", dest="json_out", required=True, type=Path, help="write the full report here")
    p.add_argument("--markdown", type=Path, default=None, help="also write Markdown tables here")
    p.add_argument("--chart", type=Path, default=None,
                   help="also draw a PNG: speedup per category per method, tokens per target forward")
    p.add_argument("--order", choices=["interleaved", "by-method"], default="interleaved",
                   help="interleaved: each prompt runs every method in turn (the order rotating from prompt to "
                        "prompt), so a machine that slows down for minutes slows every method alike; by-method: "
                        "all prompts of one method, then the next (loads one peer's models at a time)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="run each method once on a short prompt before timing (first calls set up kernels)")
    dtypes = ["auto", "bf16", "fp32"]
    p.add_argument("--hf-dtype-plain", choices=dtypes, default="fp32",
                   help="dtype of hf-generate (plain HF decoding is fastest in fp32 on the CPUs we measured)")
    p.add_argument("--hf-dtype-assisted", choices=dtypes, default="auto",
                   help="dtype of hf-assisted, target and assistant (auto: bf16 with native bf16, else fp32)")
    p.add_argument("--hf-dtype-prompt-lookup", choices=dtypes, default="auto",
                   help="dtype of hf-prompt-lookup (it verifies blocks, like hf-assisted)")
    p.add_argument("--endpoint", default=None,
                   help="time an OpenAI-compatible server instead (base URL, e.g. http://127.0.0.1:8000/v1); "
                        "--methods is then ignored")
    p.add_argument("--endpoint-model", default=None, help="the model field sent to --endpoint")
    p.add_argument("--endpoint-name", default=None, help="the method name of --endpoint in the report")
    p.add_argument("--endpoint-timeout", type=float, default=600.0, help="seconds per request to --endpoint")
    p.add_argument("--tie-gap", type=float, default=DEFAULT_TIE_GAP,
                   help="a mismatch whose top-2 logit gap is below this counts as a rounding tie")


# ============================================================================ prompts
@dataclass(frozen=True)
class BenchPrompt:
    question_id: int | str
    category: str
    text: str  # the first turn


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
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
        raise BenchError(f"{where}: turns must be a list whose first item is a non-empty string")
    return BenchPrompt(qid, category, turns[0])


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


# ============================================================================ methods
def known_methods() -> list[str]:
    from ..drafters import drafter_names

    return [BASELINE, *drafter_names(), *PEERS, LLAMA_CPP]


def parse_methods(text: str) -> list[str]:
    """Validated method names with the baseline first (added when missing: speedups need it)."""
    names = parse_list(text) or []
    valid = known_methods()
    for name in names:
        if name not in valid:
            raise BenchError(f"unknown method {name!r}; choose from: {', '.join(valid)}")
    return [BASELINE] + [n for n in names if n != BASELINE]


def needs_our_draft(methods: list[str]) -> bool:
    from ..drafters import needs_draft_model

    return any(m != BASELINE and not is_peer(m) and needs_draft_model(m) for m in methods)


def is_peer(method: str) -> bool:
    """A method run by another library (transformers, llama.cpp), not by our engine."""
    return method in PEERS or method == LLAMA_CPP


# ============================================================================ records
@dataclass
class PromptRecord:
    """One (method, prompt) generation. None = the method cannot tell (never a made-up number)."""

    method: str
    question_id: int | str
    category: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    target_forwards: int | None
    step_tokens: int | None
    drafted: int | None
    accepted: int | None
    prefill_seconds: float | None = None  # part of seconds (our engine only)
    token_ids: list[int] = field(default_factory=list)
    exact: bool | None = None  # token ids equal the baseline's
    mismatch_at: int | None = None  # first differing index

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 else None

    @property
    def mean_accepted_tokens(self) -> float | None:
        return ratio(self.step_tokens, self.target_forwards)

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted, self.drafted)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, mean_accepted_tokens=self.mean_accepted_tokens,
                 acceptance_rate=self.acceptance_rate)
        return d


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def make_record(method: str, prompt: BenchPrompt, ids: list[int], outcome: Outcome, seconds: float) -> PromptRecord:
    return PromptRecord(method, prompt.question_id, prompt.category, len(ids), len(outcome.token_ids), seconds,
                        outcome.target_forwards, outcome.step_tokens, outcome.drafted, outcome.accepted,
                        outcome.prefill_seconds, list(outcome.token_ids))


# ============================================================================ runners
Runner = Callable[[list[int], int], Outcome]  # (prompt ids, max new tokens) -> outcome


def engine_runner(speculator, spec: SpecConfig) -> Runner:
    """Our engine for one method; one Engine serves every prompt (stream() resets its state)."""
    engine = speculator.engine(spec)
    has_drafter = engine.drafter is not None

    def run(ids: list[int], max_new_tokens: int) -> Outcome:
        for _ in engine.stream(ids, GREEDY, GenerationConfig(max_new_tokens=max_new_tokens)):
            pass
        s = engine.stats
        drafted, accepted = (s.draft_tokens, s.accepted_tokens) if has_drafter else (None, None)
        return Outcome(list(engine.token_ids), s.target_forwards, s.step_tokens, drafted, accepted, s.time_prefill)

    return run


@dataclass
class PeerSetup:
    """What the transformers peers need: paths, EOS ids, dtypes, and the lazily loaded models."""

    target_path: Path
    draft_path: Path | None
    eos_ids: list[int]
    dtypes: dict[str, str]  # peer name -> dtype
    models: PeerModels

    def keys_for(self, method: str | None) -> set:
        if method not in PEERS:
            return set()
        dtype = self.dtypes[method]
        keys = {target_key(self.target_path, dtype)}
        if PEERS[method].needs_assistant:
            keys.add(assistant_key(self.draft_path, dtype))
        return keys

    def runner(self, method: str) -> Runner:
        dtype = self.dtypes[method]
        model = self.models.get(target_key(self.target_path, dtype))
        assistant = (self.models.get(assistant_key(self.draft_path, dtype))
                     if PEERS[method].needs_assistant else None)
        return PeerRunner(PEERS[method], model, assistant, self.eos_ids)


def timed(runner: Runner, ids: list[int], max_new_tokens: int) -> tuple[Outcome, float]:
    t0 = time.perf_counter()
    outcome = runner(ids, max_new_tokens)
    return outcome, time.perf_counter() - t0


# ============================================================================ exactness
def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first difference (a shorter sequence differs where it ended), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def mark_exactness(records: list[PromptRecord]) -> None:
    baseline = {r.question_id: r.token_ids for r in records if r.method == BASELINE}
    for r in records:
        if r.question_id in baseline:
            r.mismatch_at = first_mismatch(baseline[r.question_id], r.token_ids)
            r.exact = r.mismatch_at is None


def logit_gaps(model, context: list[int], token: int | None, eos_ids: set[int]) -> tuple[float, float | None]:
    """Our target's top-2 logit gap after ``context``, and how far ``token`` (None = EOS) trails the top."""
    import torch

    model.reset()
    logits = model.forward(torch.tensor(context, dtype=torch.int64), last_only=True).logits[-1]
    model.reset()
    top = torch.topk(logits, 2).values
    choices = [token] if token is not None else sorted(eos_ids)
    best_choice = max(float(logits[t]) for t in choices) if choices else None
    trail = None if best_choice is None else float(top[0]) - best_choice
    return float(top[0] - top[1]), trail


def analyse_mismatches(records: list[PromptRecord], prompt_ids: dict, target, tie_gap: float, warn) -> list[dict]:
    """One entry per mismatching (method, prompt), with the logit gaps at the divergence."""
    baseline = {r.question_id: r.token_ids for r in records if r.method == BASELINE}
    found = []
    gaps: dict[tuple, tuple[float, float | None]] = {}  # methods often diverge at the same place; a prefill each is slow
    for r in records:
        if r.exact is not False:
            continue
        ref, i = baseline[r.question_id], r.mismatch_at
        base_tok = ref[i] if i < len(ref) else None  # None: the sequence ended there (EOS)
        method_tok = r.token_ids[i] if i < len(r.token_ids) else None
        key = (r.question_id, i, method_tok)
        if key not in gaps:
            gaps[key] = logit_gaps(target.model, prompt_ids[r.question_id] + ref[:i], method_tok, target.eos_ids)
        gap, trail = gaps[key]
        entry = dict(method=r.method, question_id=r.question_id, category=r.category, index=i,
                     baseline_token=base_tok, method_token=method_tok, top2_gap=gap, method_token_gap=trail,
                     near_tie=gap < tie_gap)
        found.append(entry)
        if not entry["near_tie"]:
            warn(f"{r.method} diverges from none on question {r.question_id} at token {i}: top-2 logit gap "
                 f"{gap:.3f} >= {tie_gap} is not a rounding tie (its token trails the top by "
                 f"{'?' if trail is None else f'{trail:.3f}'})")
    return found


# ============================================================================ aggregation
def summarise(method: str, category: str, recs: list[PromptRecord]) -> dict:
    new_tokens = sum(r.new_tokens for r in recs)
    seconds = sum(r.seconds for r in recs)
    prefill = _sum_known(recs, "prefill_seconds")
    return dict(
        method=method, category=category,
        tokens_per_s=ratio(new_tokens, seconds),
        speedup=None,  # filled once the baseline's row is known
        decode_tokens_per_s=None if prefill is None else ratio(new_tokens - len(recs), seconds - prefill),
        decode_speedup=None,
        mean_accepted_tokens=ratio(_sum_known(recs, "step_tokens"), _sum_known(recs, "target_forwards")),
        acceptance_rate=ratio(_sum_known(recs, "accepted"), _sum_known(recs, "drafted")),
        exact_match_rate=(None if any(r.exact is None for r in recs)
                          else sum(r.exact for r in recs) / len(recs)),
        prompts=len(recs), new_tokens=new_tokens, seconds=seconds,
        target_forwards=_sum_known(recs, "target_forwards"),
    )


def _sum_known(recs: list[PromptRecord], name: str) -> int | None:
    """The sum of a field, or None when any record lacks it (a partial sum would mislead)."""
    values = [getattr(r, name) for r in recs]
    return None if any(v is None for v in values) else sum(values)


def aggregate(records: list[PromptRecord], methods: list[str], categories: list[str]) -> list[dict]:
    """Rows per (method, category) plus each method's ``overall`` row, with speedups vs the baseline."""
    rows = []
    for method in methods:
        mine = [r for r in records if r.method == method]
        for category in categories:
            recs = [r for r in mine if r.category == category]
            if recs:
                rows.append(summarise(method, category, recs))
        if mine:
            rows.append(summarise(method, "overall", mine))
    base = {row["category"]: row for row in rows if row["method"] == BASELINE}
    for row in rows:
        ref = base.get(row["category"], {})
        row["speedup"] = ratio(row["tokens_per_s"], ref.get("tokens_per_s"))
        row["decode_speedup"] = ratio(row["decode_tokens_per_s"], ref.get("decode_tokens_per_s"))
    return rows


# ============================================================================ reports
def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


OVERALL_COLUMNS = ("method", "tokens/s", "speedup", "decode tok/s", "decode speedup", "tokens/forward",
                   "acceptance", "exact match", "prompts", "new tokens", "seconds")


def overall_cells(row: dict) -> list[str]:
    return [row["method"], fmt(row["tokens_per_s"]), fmt(row["speedup"], ".2f", "x"),
            fmt(row.get("decode_tokens_per_s")), fmt(row.get("decode_speedup"), ".2f", "x"),
            fmt(row["mean_accepted_tokens"]), fmt(row["acceptance_rate"], ".0%"), fmt(row["exact_match_rate"], ".0%"),
            str(row["prompts"]), str(row["new_tokens"]), fmt(row["seconds"], ".1f")]


def speedup_grid(results: list[dict], methods: list[str], categories: list[str],
                 key: str = "speedup") -> list[list[str]]:
    """Rows of [method, speedup per category..., overall]."""
    cell = {(r["method"], r["category"]): r.get(key) for r in results}
    return [[m] + [fmt(cell.get((m, c)), ".2f", "x") for c in [*categories, "overall"]] for m in methods]


def markdown_report(results: list[dict], methods: list[str], categories: list[str]) -> str:
    overall = [r for r in results if r["category"] == "overall"]
    lines = ["## Overall", "", _md_row(OVERALL_COLUMNS), _md_rule(len(OVERALL_COLUMNS))]
    lines += [_md_row(overall_cells(r)) for r in overall]
    header = ["method", *categories, "overall"]
    lines += ["", "## Speedup by category", "", _md_row(header), _md_rule(len(header))]
    lines += [_md_row(row) for row in speedup_grid(results, methods, categories)]
    lines += ["", "## Decode speedup by category (after the first token; our methods only)", "",
              _md_row(header), _md_rule(len(header))]
    lines += [_md_row(row) for row in speedup_grid(results, methods, categories, "decode_speedup")]
    return "\n".join(lines) + "\n"


def _md_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _md_rule(n: int) -> str:
    return "|" + "|".join(["---"] + ["---:"] * (n - 1)) + "|"  # numbers right-aligned


def print_tables(console, results: list[dict], methods: list[str], categories: list[str]) -> None:
    from rich.table import Table

    table = Table(title="overall")
    for i, name in enumerate(OVERALL_COLUMNS):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in results:
        if row["category"] == "overall":
            table.add_row(*overall_cells(row))
    console.print(table)
    grid = Table(title="speedup by category")
    for i, name in enumerate(["method", *categories, "overall"]):
        grid.add_column(name, justify="left" if i == 0 else "right")
    for row in speedup_grid(results, methods, categories):
        grid.add_row(*row)
    console.print(grid)


# ============================================================================ machine info
def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def cpu_info() -> dict:
    """CPU model and the vector extensions that decide bf16 vs fp32 speed."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model is None:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass  # not Linux: platform's answer is the best we have
    model = model or platform.processor() or "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
    return dict(model=model, logical_cpus=os.cpu_count(), vector_flags=[f for f in wanted if f in flags])


def machine_info() -> dict:
    import torch
    import transformers

    return dict(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                platform=platform.platform(), cpu=cpu_info(), torch_threads=torch.get_num_threads(),
                torch_interop_threads=torch.get_num_interop_threads())


def run_config(args, methods: list[str], speculator, peers: PeerSetup | None) -> dict:
    plain_args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    cfg = dict(command=sys.argv[:], args=plain_args, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               machine=machine_info(), methods=methods, max_new_tokens=args.max_new_tokens, greedy=True,
               target=dict(name=speculator.target.name, path=str(speculator.target.path), dtype=resolve_dtype(args.dtype),
                           eos_ids=sorted(speculator.target.eos_ids)),
               spec={k: v for k, v in asdict(spec_from_args("draft-model", args)).items() if k != "method"}, warmup=args.warmup, tie_gap=args.tie_gap)
    if speculator.draft is not None:
        cfg["draft"] = dict(name=speculator.draft.name, path=str(speculator.draft.path))
    if peers is not None:
        cfg["peers"] = dict(dtypes=peers.dtypes, draft_path=str(peers.draft_path) if peers.draft_path else None,
                            prompt_lookup_num_tokens=dict(PEERS["hf-prompt-lookup"].generate_kwargs)
                            ["prompt_lookup_num_tokens"],
                            note="generation config blank but for EOS/pad, so transformers' global defaults "
                                 "apply (assisted: its default num_assistant_tokens/schedule/confidence); "
                                 "target_forwards count every target call, the prefill included")
    return cfg


# ============================================================================ the run
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


def check_context(prompt_ids: dict, max_new_tokens: int, max_length: int, context_flag: str = "--max-context") -> None:
    for qid, ids in prompt_ids.items():
        if len(ids) + max_new_tokens > max_length:
            raise BenchError(f"question {qid!r}: prompt ({len(ids)} tokens) + max-new-tokens ({max_new_tokens}) "
                             f"exceeds the context of {max_length}; raise {context_flag} or lower --max-new-tokens")


def load_speculator(args, methods: list[str]):
    from ..cli import speculator_options  # the options `generate` passes too (e.g. --draft-format)
    from ..pipeline import Speculator

    return Speculator(args.target, args.draft, dtype=args.dtype, runtime=args.runtime, max_length=args.max_context,
                      load_draft=needs_our_draft(methods), **speculator_options(args))


def peer_setup(args, methods: list[str], speculator) -> PeerSetup | None:
    """Paths and dtypes for the peers; the draft path resolves here only when hf-assisted runs."""
    used = [m for m in methods if m in PEERS]
    if not used:
        return None
    draft_path = None
    if any(PEERS[m].needs_assistant for m in used):
        draft_path = speculator.draft.path if speculator.draft is not None else _resolve_draft(args, speculator)
    eos = sorted(speculator.target.eos_ids)
    if not eos:
        raise BenchError(f"target {speculator.target.name!r} declares no EOS token; the peers could not stop")
    return PeerSetup(speculator.target.path, draft_path, eos,
                     {m: getattr(args, PEERS[m].dtype_option) for m in used}, PeerModels(eos))


def _resolve_draft(args, speculator) -> Path:
    from transformers import AutoTokenizer

    from ..models.packaged import DEFAULT_DRAFT, resolve_model_dir
    from ..pipeline import check_tokenizers

    name = args.draft or DEFAULT_DRAFT
    path = resolve_model_dir(name)
    check_tokenizers(speculator.tokenizer, AutoTokenizer.from_pretrained(path), speculator.target.name, name)
    return path


def make_runner(method: str, args, speculator, peers: PeerSetup | None) -> Runner:
    if method in PEERS:
        return peers.runner(method)
    if method == LLAMA_CPP:
        from ..models.packaged import DEFAULT_TARGET, gguf_file
        from .llama_cpp import LlamaCppRunner

        return LlamaCppRunner(gguf_file(args.target or DEFAULT_TARGET), speculator.target.eos_ids,
                              n_ctx=speculator.target.model.max_length)
    return engine_runner(speculator, spec_from_args(method, args))


def run_method(method: str, runner: Runner, prompts: list[BenchPrompt], prompt_ids: dict, args,
               progress, task, warm_ids: list[int] | None) -> list[PromptRecord]:
    if warm_ids is not None:
        progress.update(task, description=f"{method}: warming up")
        runner(warm_ids, min(WARMUP_TOKENS, args.max_new_tokens))
    records = []
    for prompt in prompts:
        progress.update(task, description=f"{method}: question {prompt.question_id} ({prompt.category})")
        ids = prompt_ids[prompt.question_id]
        outcome, seconds = timed(runner, ids, args.max_new_tokens)
        records.append(make_record(method, prompt, ids, outcome, seconds))
        progress.advance(task)
    return records


def method_line(method: str, recs: list[PromptRecord], baseline_tps: float | None) -> str:
    row = summarise(method, "overall", recs)
    speed = ratio(row["tokens_per_s"], baseline_tps) if method != BASELINE else 1.0
    return (f"{method}: {row['new_tokens']} tokens in {row['seconds']:.1f} s, {fmt(row['tokens_per_s'])} tok/s, "
            f"speedup {fmt(speed, '.2f', 'x')}, {fmt(row['mean_accepted_tokens'])} tokens/forward")


def run_all(methods, prompts, prompt_ids, args, speculator, peers, console,
            after_method: Callable[[list[PromptRecord], dict], None]) -> tuple[list[PromptRecord], dict]:
    """Every (method, prompt) pair under one progress bar, in ``args.order``.

    ``after_method(records so far, peak RSS per method)`` runs after each method (by-method) or each
    prompt (interleaved): partial saves.
    """
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    warm_ids = speculator.encode_prompt(WARMUP_PROMPT) if args.warmup else None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("starting", total=len(methods) * len(prompts))
        if args.order == "by-method":  # prints each method's line as it ends
            return _run_by_method(methods, prompts, prompt_ids, args, speculator, peers, progress, task, warm_ids,
                                  after_method)
        records, rss = _run_interleaved(methods, prompts, prompt_ids, args, speculator, peers, progress, task,
                                        warm_ids, after_method)
        baseline_tps = summarise(BASELINE, "overall", [r for r in records if r.method == BASELINE])["tokens_per_s"]
        for method in methods:
            progress.console.print(method_line(method, [r for r in records if r.method == method], baseline_tps))
    return records, rss


def _run_by_method(methods, prompts, prompt_ids, args, speculator, peers, progress, task, warm_ids, after_method):
    """All prompts of one method, then the next; a peer's models are freed as soon as unused."""
    records: list[PromptRecord] = []
    rss: dict[str, float] = {}
    baseline_tps = None
    for i, method in enumerate(methods):
        if peers is not None:
            peers.models.keep_only(peers.keys_for(method))
        progress.update(task, description=f"{method}: loading" if is_peer(method) else method)
        runner = make_runner(method, args, speculator, peers)
        recs = run_method(method, runner, prompts, prompt_ids, args, progress, task, warm_ids)
        del runner
        if peers is not None:  # free this method's models unless the next one uses them too
            peers.models.keep_only(peers.keys_for(methods[i + 1] if i + 1 < len(methods) else None))
        gc.collect()
        rss[method] = peak_rss_mb()
        if method == BASELINE:
            baseline_tps = summarise(method, "overall", recs)["tokens_per_s"]
        progress.console.print(method_line(method, recs, baseline_tps))
        records += recs
        after_method(records, rss)
    return records, rss


def _run_interleaved(methods, prompts, prompt_ids, args, speculator, peers, progress, task, warm_ids, after_method):
    """Each prompt under every method before the next prompt; prompt j starts with method j mod n, so
    no method always runs first (or right after another). Every method's runner (and peer models)
    stay loaded for the whole run."""
    if peers is not None:
        peers.models.keep_only(set().union(*(peers.keys_for(m) for m in methods)))
    runners = {}
    for method in methods:
        progress.update(task, description=f"{method}: loading" if is_peer(method) else method)
        runners[method] = make_runner(method, args, speculator, peers)
        if warm_ids is not None:
            progress.update(task, description=f"{method}: warming up")
            runners[method](warm_ids, min(WARMUP_TOKENS, args.max_new_tokens))
    records: list[PromptRecord] = []
    rss = dict.fromkeys(methods, peak_rss_mb())
    for j, prompt in enumerate(prompts):
        ids = prompt_ids[prompt.question_id]
        for method in methods[j % len(methods):] + methods[:j % len(methods)]:
            progress.update(task, description=f"{method}: question {prompt.question_id} ({prompt.category})")
            outcome, seconds = timed(runners[method], ids, args.max_new_tokens)
            records.append(make_record(method, prompt, ids, outcome, seconds))
            progress.advance(task)
        rss = dict.fromkeys(methods, peak_rss_mb())  # one process: the peak of all methods so far
        after_method(records, rss)
    return records, rss


def run_bench(args) -> int:
    from rich.console import Console

    if args.endpoint:
        from .endpoint import run_endpoint

        return run_endpoint(args)

    # Everything cheap is validated before any model loads.
    methods = parse_methods(args.methods)
    GenerationConfig(max_new_tokens=args.max_new_tokens)
    spec_from_args("draft-model", args)
    if not args.tie_gap >= 0:
        raise BenchError(f"--tie-gap must be >= 0, got {args.tie_gap}")
    prompts = select_prompts(load_prompts(args.prompts), parse_list(args.categories), args.per_category)
    categories = categories_in_order(prompts)
    check_output_path(args.json_out, "--json")
    check_output_path(args.markdown, "--markdown")
    check_output_path(args.chart, "--chart")
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)  # no 80-column wrap in logs
    if BASELINE not in (parse_list(args.methods) or []):
        console.print("note: added method none (plain decoding): it is the baseline of speedups and exactness")

    speculator = load_speculator(args, methods)
    peers = peer_setup(args, methods, speculator)
    prompt_ids = {p.question_id: speculator.encode_prompt(p.text) for p in prompts}
    check_context(prompt_ids, args.max_new_tokens, speculator.target.model.max_length)

    config = run_config(args, methods, speculator, peers)

    def save(records, rss, mismatches=None) -> list[dict]:
        """Write the JSON report; partial (no mismatch analysis yet) until the run completes."""
        mark_exactness(records)
        results = aggregate(records, methods, categories)
        for row in results:
            if row["category"] == "overall":
                row["peak_rss_mb_after"] = rss.get(row["method"])  # ru_maxrss only grows: peak so far
        report = dict(config=dict(config, peak_rss_mb=peak_rss_mb(), complete=mismatches is not None),
                      results=results, prompts=[r.to_dict() for r in records], mismatches=mismatches or [])
        write_text(args.json_out, json.dumps(report, indent=1) + "\n")
        return results

    records, rss = run_all(methods, prompts, prompt_ids, args, speculator, peers, console, save)
    mismatches = analyse_mismatches(records, prompt_ids, speculator.target, args.tie_gap,
                                    lambda line: console.print(f"[yellow]warning:[/] {line}"))
    results = save(records, rss, mismatches)
    if args.markdown is not None:
        write_text(args.markdown, markdown_report(results, methods, categories))
    if args.chart is not None:
        from .chart import draw

        draw(results, args.chart, f"{speculator.target.name}, {len(prompts)} prompts, {args.max_new_tokens} new tokens")
    # Off a terminal (a log file, a pipe) rich assumes 80 columns and truncates the headers.
    print_tables(Console(width=None if sys.stdout.isatty() else 160), results, methods, categories)
    near = sum(m["near_tie"] for m in mismatches)
    console.print(f"{len(mismatches)} mismatching generations ({near} at near-ties); report: {args.json_out}")
    return 0
