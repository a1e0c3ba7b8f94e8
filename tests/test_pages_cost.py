"""calibrate --pages: 2 MB pages' start against their gain a forward, filed for this CPU, and
what generate then does with it."""
from __future__ import annotations

import json
import statistics

import pytest
from test_cli_errors import assert_one_line_error, call

from _tiny import make_cli_model
from specdraft.bench import pages_cost
from specdraft.models import hugepages

needs_thp = pytest.mark.skipif(hugepages.thp_mode() not in ("always", "madvise"),
                               reason=f"transparent huge pages are off here ({hugepages.thp_mode()})")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The payback filed in a file of the test's own (the rest of the cache kept: its kernels)."""
    monkeypatch.setattr(hugepages, "payback_path", lambda: tmp_path / "machine" / "pages.json")
    monkeypatch.delenv("SPECDRAFT_HUGE_PAGES", raising=False)


@pytest.mark.slow  # starts in fresh processes: ~15 s
@needs_thp
def test_calibrate_pages_times_both_kinds_and_files_the_payback(cache, tmp_path, capsys, monkeypatch):
    """A tiny q4k model (its buffers given huge pages however small): both kinds of page loaded
    and timed, the payback filed under this CPU, read back by the runtime, and --json the same."""
    monkeypatch.setattr(hugepages, "MIN_BYTES", 0)
    model, out_json = make_cli_model(tmp_path / "tiny"), tmp_path / "pages.json"
    rc, out, err = call(["calibrate", "--pages", "--model", str(model), "--format", "q4k", "--context", "8",
                         "--rounds", "2", "--repeats", "1", "--json", str(out_json)], capsys)
    assert rc == 0, err
    record = json.loads(out_json.read_text())
    assert record["blocks"] == [1, 4] and record["rounds"] == 2 and record["huge_bytes"] > 0
    assert all(len(record["start_seconds"][k]) == 2 and min(record["start_seconds"][k]) > 0 for k in ("4K", "2M"))
    assert all(len(r) == 2 and min(r) > 0 for k in ("4K", "2M") for r in record["forward_seconds"][k])  # 2 blocks
    assert all(len(record["forward_seconds"][k]) == 2 * pages_cost.FORWARD_ROUNDS for k in ("4K", "2M"))
    # the filed count follows from the filed times
    start = {k: statistics.median(v) for k, v in record["start_seconds"].items()}
    n = record["forwards"]
    assert n == hugepages.payback_forwards(start["4K"], start["2M"], *pages_cost.forward_pair(record["forward_seconds"]))
    assert hugepages.measured_payback()["forwards"] == n and "calibrate --pages" in record["command"]
    # the verdict's line is the one for the filed count (none, from the first token, after n)
    verdict = {None: "save nothing", 0: "from its first token"}.get(n, f"pay back their start after ~{n} forwards")
    assert "filed in" in out and verdict in out


@pytest.mark.parametrize("args, contains", [
    (["--steps"], "--pages"),
    (["--kernels", "all"], "--pages"),
    (["--format", "gguf,w8a8"], "one weight format"),
])
def test_calibrate_pages_bad_arguments_give_one_line(cache, capsys, args, contains):
    assert_one_line_error(*call(["calibrate", "--pages", "--model", "/nonexistent/model", *args], capsys),
                          contains=contains)


def test_calibrate_pages_says_in_one_line_where_there_are_no_huge_pages(cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "never")
    monkeypatch.setattr("specdraft.bench.pages_cost.thp_mode", lambda: "never")
    model = make_cli_model(tmp_path / "tiny")
    assert_one_line_error(*call(["calibrate", "--pages", "--model", str(model), "--format", "q4k", "--context", "8",
                                 "--rounds", "1", "--repeats", "1"], capsys), contains="transparent huge pages")
    assert not hugepages.payback_path().exists()


def test_the_forward_pair_takes_the_median_paired_ratio():
    """A slow phase moves both times of a round: the ratio of each round, not of the medians."""
    forwards = {"4K": [[0.010, 0.012], [0.020, 0.024], [0.011, 0.013]],
                "2M": [[0.010, 0.010], [0.020, 0.020], [0.012, 0.012]]}
    four_k, two_m = pages_cost.forward_pair(forwards)
    assert four_k == pytest.approx(0.012)  # the rounds' means 0.011, 0.022, 0.012
    assert four_k / two_m == pytest.approx(1.1)  # the rounds' ratios 1.1, 1.1, 1.0


@pytest.mark.parametrize("starts, forwards, says", [
    ((1.04, 0.93), (0.0512, 0.0500), "start no slower"),  # the page cache's 2 MB folios: a free start
    ((1.0, 3.0), (0.0512, 0.0500), "pay back their start after ~1667 forwards"),
    ((1.0, 1.0), (0.0500, 0.0499), "save nothing measurable"),
])
def test_the_payback_in_words_says_which_case_it_is(starts, forwards, says):
    """The verdict line follows the filed count: never, from the first token (a start no slower),
    or after n forwards."""
    start_seconds = {"4K": [starts[0]], "2M": [starts[1]]}
    forward_seconds = {"4K": [[forwards[0]]], "2M": [[forwards[1]]]}
    record = dict(forwards=hugepages.payback_forwards(*starts, *forwards), start_seconds=start_seconds,
                  forward_seconds=forward_seconds, rounds=1, huge_bytes=1 << 30, blocks=[1])
    lines = pages_cost.payback_lines(record)
    assert says in lines[-1] and len(lines) == 3
