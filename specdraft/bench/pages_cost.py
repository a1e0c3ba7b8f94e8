"""What 2 MB pages cost a start and save a forward on this machine (``specdraft calibrate --pages``),
filed for the runtime's page choice (models.hugepages.measured_payback).

Starts are timed in fresh processes, as a user's command starts, alternating 4 KB and 2 MB pages
(SPECDRAFT_HUGE_PAGES=0 / 1), each its model's load and first forward: how long the kernel takes
to hand out ~1.1 GB of huge pages depends on the state of its free memory, not on this process
(measured on the Zen 5 EPYC: the first 2 MB read of a process 4.5 s, a second in the same process
0.1 s; generate's whole start 2.3 s in 4 KB pages, 5.9-9.6 s in 2 MB). Forwards are timed in
this process, one model of each kind side by side, interleaved (forward_costs' round robin, so a
phase of the machine hits both alike). A first 4 KB process fills the page cache and pays what a
first load pays once (a kernel build, snapshots).
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from ..cpu import cpu_info, cpu_words
from ..errors import ParameterError, SpecdraftError
from ..models.hugepages import forced, payback_forwards, process_huge_bytes, thp_mode
from .forward_cost import forward_costs

KINDS = ("4K", "2M")
FORWARD_ROUNDS = 3  # rounds of forwards a round of starts (a round of forwards ~0.6 s for the default target)


def forward_pair(forwards: dict[str, list[list[float]]]) -> tuple[float, float]:
    """(a forward's seconds in 4 KB pages, in 2 MB pages) from rounds of paired timings ([[per
    block] per round] by kind): a round's forward is its mean over the blocks (a speculating engine
    checks 1-5 tokens); 4 KB the median over rounds, 2 MB that over the median of the rounds'
    paired ratios (a slow phase moves a round's both times, not their ratio)."""
    means = {k: [statistics.fmean(r) for r in forwards[k]] for k in KINDS}
    ratio = statistics.median(a / b for a, b in zip(means["4K"], means["2M"], strict=True))
    four_k = statistics.median(means["4K"])
    return four_k, four_k / ratio


def _load(name: str, fmt: str, dtype: str, max_length: int):
    from ..pipeline import load_model  # here: the child imports what its start needs, no more

    return load_model(name, dtype=dtype, weight_format=fmt, max_length=max_length, progress=False).model


def _started(name: str, fmt: str, dtype: str, max_length: int):
    """(model, seconds to load it and run its first one-token forward). The first forward belongs
    to the start: a mapped model's pages are faulted in by it."""
    t0 = time.perf_counter()
    model = _load(name, fmt, dtype, max_length)
    model.reset()
    model.forward(torch.zeros(1, dtype=torch.long), last_only=True)
    return model, time.perf_counter() - t0


def _start_in_a_process(kind: str, name: str, fmt: str, dtype: str, max_length: int) -> float:
    """Seconds a fresh process takes to load the model in ``kind`` pages and run its first forward."""
    env = dict(os.environ, SPECDRAFT_HUGE_PAGES="1" if kind == "2M" else "0")
    run = subprocess.run([sys.executable, "-m", __name__, name, fmt, dtype, str(max_length), str(torch.get_num_threads())],
                         env=env, capture_output=True, text=True)
    if run.returncode:
        last = (run.stderr.strip().splitlines() or ["no message"])[-1]
        raise SpecdraftError(f"a {kind} start failed: {last}")
    return json.loads(run.stdout.strip().splitlines()[-1])["seconds"]


def pages_payback(name: str, fmt: str, dtype: str, blocks: tuple[int, ...] = (1, 4), context: int = 300,
                  repeats: int = 5, rounds: int = 5) -> dict:
    """The measurement ``hugepages.save_payback`` files: {"forwards" (payback_forwards: int, or
    None for never), "start_seconds": {kind: [per round]}, "forward_seconds": {kind: [[per block]
    per forward round]}, "huge_bytes", "thp", "date", "cpu", ...}. A one-line ParameterError where THP is
    off or a 2 MB load gets no huge pages."""
    if thp_mode() not in ("always", "madvise"):
        raise ParameterError(f"transparent huge pages are {thp_mode()!r} here: no 2 MB pages to measure")
    if rounds < 1:
        raise ParameterError("--rounds must be >= 1")
    max_length = context + max(blocks) + 1
    _start_in_a_process("4K", name, fmt, dtype, max_length)  # warm-up
    starts: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(rounds):  # each 2 MB start after a 4 KB one, as a user's commands mix
        for kind in KINDS:
            starts[kind].append(_start_in_a_process(kind, name, fmt, dtype, max_length))
    with forced("4K"):
        small, _ = _started(name, fmt, dtype, max_length)
    before = process_huge_bytes()
    with forced("2M"):
        big, _ = _started(name, fmt, dtype, max_length)
    huge = process_huge_bytes() - before
    models = {"4K": small, "2M": big}
    if huge <= 0:
        raise ParameterError("the 2 MB load got no huge pages (its buffers are too small, or the kernel has none "
                             "free): nothing to measure")
    forwards: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    for _ in range(FORWARD_ROUNDS * rounds):  # both kinds side by side, interleaved: each round's pair is paired
        got = forward_costs(models, blocks=blocks, context=context, repeats=repeats)
        for kind in KINDS:
            forwards[kind].append(got[kind]["seconds"])
    start = {k: statistics.median(starts[k]) for k in KINDS}
    four_k, two_m = forward_pair(forwards)
    return dict(forwards=payback_forwards(start["4K"], start["2M"], four_k, two_m),
                thp=thp_mode(), date=datetime.date.today().isoformat(), cpu=cpu_words(cpu_info()),
                threads=torch.get_num_threads(), blocks=list(blocks), context=context, rounds=rounds,
                start_seconds=starts, forward_seconds=forwards, huge_bytes=huge)


def payback_lines(record: dict) -> list[str]:
    """``pages_payback``'s record in words, a line each."""
    start = {k: statistics.median(v) for k, v in record["start_seconds"].items()}
    lines = [f"start of a process (load + first forward), median of {record['rounds']}: 4 KB pages {start['4K']:.2f} s, "
             f"2 MB pages {start['2M']:.2f} s ({record['huge_bytes'] / 2**20:.0f} MiB in huge pages)"]
    for i, k in enumerate(record["blocks"]):  # each block alone, by the rule the payback uses (forward_pair)
        a, b = forward_pair({kind: [[r[i]] for r in rounds] for kind, rounds in record["forward_seconds"].items()})
        lines.append(f"{k:3d} new tokens: {a * 1e3:7.2f} ms in 4 KB pages, {b * 1e3:7.2f} ms in 2 MB ({a / b:.3f}x)")
    n = record["forwards"]
    if n is None:
        lines.append("2 MB pages save nothing measurable a forward on this CPU: no process makes them unasked (the "
                     "records' map still takes the page cache's 2 MB folios where it holds them)")
    elif n == 0:
        lines.append("2 MB pages start no slower than 4 KB pages on this CPU and save time every forward: every "
                     "process takes them, `specdraft generate` from its first token")
    else:
        lines.append(f"2 MB pages pay back their start after ~{n} forwards on this CPU: `specdraft generate` takes them "
                     f"from {n} new tokens, long-lived processes always")
    return lines


if __name__ == "__main__":  # one timed start: NAME FORMAT DTYPE MAX_LENGTH THREADS
    torch.set_num_threads(int(sys.argv[5]))
    _, seconds = _started(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
    print(json.dumps({"seconds": seconds}))
