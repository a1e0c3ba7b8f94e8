"""``specdraft bench``: time methods on Spec-Bench prompts and check they decode what plain decoding does.

The protocol follows Spec-Bench: greedy decoding, batch size 1, the first turn of each question
through the target's chat template (``--turns 2``: the second turns as well, each after the
conversation so far, see :mod:`specdraft.bench.turns`). Every method gets the same prompts, the same
max-new-tokens and stops at the same EOS ids (with ``--ignore-eos`` at none: every answer is
max-new-tokens long, so that sampled runs' speeds compare per category too). ``none`` (plain
decoding by our runtime) runs first: speedups are relative to it and every other method's tokens
are compared with its tokens.
With ``--temperature`` > 0 our methods sample instead (each prompt seeded from ``--seed``), the
peers are refused, and exactness is not applicable (see :mod:`specdraft.bench.sampled`).

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
  exact_match_rate      fraction of prompts whose tokens equal ``none``'s (null when sampled)

A greedy method that disagrees with ``none`` is either wrong or meets a near-tie that rounding
broke differently (bf16 vs fp32, a block forward vs a one-token forward). To tell which, the
mismatch analysis reruns our target on the shared prefix and reports the gap between its two
largest logits there; a gap above ``--tie-gap`` gets a warning line.

This module runs the benchmark; the pieces it puts together each have their own module:
  arguments   the options of ``specdraft bench``
  prompts     prompt files: reading, validating, selecting (the dev prompts ship in ``data/``)
  turns       later turns as items of their own, after the baseline's answers (``--turns``)
  methods     which methods exist, the baseline first, and which ``all`` skips
  sampled     seeds per prompt and the rules of a sampled run
  runners     one runner per method (our engine, transformers peers, llama.cpp)
  records     per-prompt records, exactness against the baseline, aggregation into rows
  mismatches  logit gaps where a method diverges from the baseline
  report      Markdown and terminal tables, report files
  machine     CPU model and flags, GGUF kernel path, threads, memory
  endpoint    the same benchmark against an OpenAI-compatible server
"""
from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..config import GenerationConfig, SamplingConfig
from ..options import sampling_from_args, spec_from_args
from ..pipeline import resolve_dtype
from .chart import draw
from .endpoint import run_endpoint
from .errors import BenchError
from .machine import gguf_kernel_forms, machine_info, machine_line, peak_rss_mb, rates_line, vector_rates
from .methods import ALL, BASELINE, drop_unavailable, is_peer, parse_methods
from .mismatches import analyse_mismatches
from .peers import PEERS
from .prompts import (
    BenchPrompt,
    categories_in_order,
    parse_list,
    prompts_from_args,
    prompts_path,
)
from .records import PromptRecord, aggregate, make_record, mark_exactness, summarise
from .report import (
    check_output_path,
    markdown_report,
    method_line,
    print_tables,
    report_location,
    write_text,
)
from .runners import PeerSetup, Runner, load_speculator, make_runner, peer_setup, timed
from .sampled import NOT_APPLICABLE, refuse_peers, sampling_report
from .turns import PromptIds, by_turn, conversation_items

WARMUP_PROMPT = "Write one sentence about the sea."
WARMUP_TOKENS = 32  # enough for a prefill and several decode/verify shapes


def check_context(prompt_ids: dict, max_new_tokens: int, max_length: int, context_flag: str = "--max-context") -> None:
    for qid, ids in prompt_ids.items():
        if len(ids) + max_new_tokens > max_length:
            raise BenchError(f"question {qid!r}: prompt ({len(ids)} tokens) + max-new-tokens ({max_new_tokens}) "
                             f"exceeds the context of {max_length}; raise {context_flag} or lower --max-new-tokens")


def run_config(args, methods: list[str], sampling: SamplingConfig, speculator, peers: PeerSetup | None) -> dict:
    """The report's ``config``: the command, its arguments, the machine, the models and the settings."""
    plain_args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    spec = {k: v for k, v in asdict(spec_from_args("draft-model", args)).items() if k != "method"}
    target = speculator.target
    cfg = dict(command=sys.argv[:], args=plain_args, prompts_file=str(prompts_path(args.prompts)),
               date=datetime.now(UTC).isoformat(timespec="seconds"),
               machine=machine_info(), methods=methods, max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
               greedy=sampling.greedy, sampling=sampling_report(sampling),
               target=dict(name=target.name, path=str(target.path), dtype=resolve_dtype(args.dtype),
                           eos_ids=sorted(target.eos_ids)),
               spec=spec, warmup=args.warmup, tie_gap=args.tie_gap)
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
        records.append(_noted(prompt_ids, make_record(method, prompt, ids, outcome, seconds)))
        progress.advance(task)
    return records


def _noted(prompt_ids: dict, record: PromptRecord) -> PromptRecord:
    """``record``, shown to the prompt ids first when later turns are built from the baseline's answers."""
    if isinstance(prompt_ids, PromptIds):
        prompt_ids.note(record)
    return record


def run_all(methods, prompts, prompt_ids, args, speculator, peers, console,
            after_method: Callable[[list[PromptRecord], dict], None]) -> tuple[list[PromptRecord], dict]:
    """Every (method, prompt) pair under one progress bar, in ``args.order``.

    ``after_method(records so far, peak RSS per method)`` runs after each method (by-method) or each
    prompt (interleaved): partial saves.
    """
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
            records.append(_noted(prompt_ids, make_record(method, prompt, ids, outcome, seconds)))
            progress.advance(task)
        rss = dict.fromkeys(methods, peak_rss_mb())  # one process: the peak of all methods so far
        after_method(records, rss)
    return records, rss


def run_bench(args) -> int:
    """``specdraft bench``: validate, load, time every (method, prompt), analyse, report."""
    if args.endpoint:
        if args.turns != 1:
            raise BenchError("--turns applies to local runs, not to --endpoint")
        return run_endpoint(args)

    # Everything cheap is validated before any model loads.
    methods, skipped = drop_unavailable(parse_methods(args.methods), args.methods, args)
    GenerationConfig(max_new_tokens=args.max_new_tokens)
    sampling = sampling_from_args(args)
    refuse_peers(methods, sampling)
    for method in methods:  # each method's speculation (retrieval: --index given) before any model loads
        if not is_peer(method):
            spec_from_args(method, args)
    if not args.tie_gap >= 0:
        raise BenchError(f"--tie-gap must be >= 0, got {args.tie_gap}")
    firsts = prompts_from_args(args)
    prompts, later = conversation_items(firsts, args.turns)  # each conversation's turns in order
    categories = categories_in_order(prompts)
    check_output_path(args.json_out, "--json")
    check_output_path(args.markdown, "--markdown")
    check_output_path(args.chart, "--chart")
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)  # no 80-column wrap in logs
    named = parse_list(args.methods) or []
    if BASELINE not in named and ALL not in named:
        console.print("note: added method none (plain decoding): it is the baseline of speedups and exactness")
    for method, why in skipped.items():
        console.print(f"note: skipped method {method}: {why}")

    speculator = load_speculator(args, methods)
    peers = peer_setup(args, methods, speculator)
    prompt_ids = PromptIds(speculator, firsts, later, args.max_new_tokens)  # later turns: built as they come
    check_context(prompt_ids, args.max_new_tokens, speculator.target.model.max_length)

    config = dict(run_config(args, methods, sampling, speculator, peers), skipped_methods=skipped)
    console.print(machine_line(config["machine"]))
    # the machine's phase through the run: a probe now, after each save (each prompt or method) and at the end
    probes = config["machine"]["vector_rates"] = []

    def probe(at: str) -> None:
        rates = vector_rates()
        if rates is not None:
            probes.append(dict(at=at, **rates))

    probe("start")

    def save(records, rss, mismatches=None, complete=False) -> list[dict]:
        """Write the JSON report; partial (no mismatch analysis yet) until the run completes.
        A sampled run has no exactness and no mismatch analysis: ``exact`` and ``mismatches`` stay null."""
        probe("end" if complete else f"after {len(records)} runs")
        if sampling.greedy:
            mark_exactness(records)
        results = aggregate(records, methods, categories)
        for row in results:
            if row["category"] == "overall":
                row["peak_rss_mb_after"] = rss.get(row["method"])  # ru_maxrss only grows: peak so far
        if complete:  # the VNNI forms as the run took them (timed per product: known only now)
            config["machine"]["gguf_kernel_forms"] = gguf_kernel_forms()
        report = dict(config=dict(config, peak_rss_mb=peak_rss_mb(), complete=complete),
                      results=results, results_by_turn=by_turn(records, methods, later)[0] or None,
                      prompts=[r.to_dict() for r in records],
                      mismatches=(mismatches or []) if sampling.greedy else None)
        if args.json_out is not None:
            write_text(args.json_out, json.dumps(report, indent=1) + "\n")
        return results

    records, rss = run_all(methods, prompts, prompt_ids, args, speculator, peers, console, save)
    mismatches = []
    if sampling.greedy:
        mismatches = analyse_mismatches(records, prompt_ids, speculator.target, args.tie_gap,
                                        lambda line: console.print(f"[yellow]warning:[/] {line}"))
    results = save(records, rss, mismatches, complete=True)
    turns = by_turn(records, methods, later)
    phase = rates_line(probes)
    if args.markdown is not None:
        write_text(args.markdown, markdown_report(results, methods, categories, sampling, turns,
                                                  notes=(machine_line(config["machine"]), phase)))
    if args.chart is not None:
        title = f"{speculator.target.name}, {len(prompts)} prompts, {args.max_new_tokens} new tokens"
        draw(results, args.chart, title if sampling.greedy else f"{title}, temperature {sampling.temperature:g}")
    # Off a terminal (a log file, a pipe) rich assumes 80 columns and truncates the headers.
    print_tables(Console(width=None if sys.stdout.isatty() else 160), results, methods, categories, sampling, turns)
    if config["machine"].get("gguf_kernel_forms"):
        console.print(f"GGUF kernels' VNNI forms in this run: {config['machine']['gguf_kernel_forms']}")
    if phase:
        console.print(phase)
    where = report_location(args.json_out)
    if not sampling.greedy:
        console.print(f"exactness and mismatch analysis: {NOT_APPLICABLE}; {where}")
        return 0
    near = sum(m["near_tie"] for m in mismatches)
    console.print(f"{len(mismatches)} mismatching generations ({near} at near-ties); {where}")
    return 0
