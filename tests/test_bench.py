"""Fast tests of the benchmark: prompt files, method lists, exactness, aggregation, Markdown, run order.

No model is loaded; per-prompt records are crafted by hand so the expected numbers are exact.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdraft import cli
from specdraft.bench import harness
from specdraft.bench.errors import BenchError
from specdraft.bench.machine import CPU_FLAGS, cpu_info, gguf_kernel_path, machine_line, rates_line, vector_rates
from specdraft.bench.methods import drop_unavailable, parse_methods
from specdraft.bench.mismatches import analyse_mismatches
from specdraft.bench.prompts import (
    PACKAGED_PROMPTS,
    BenchPrompt,
    categories_in_order,
    load_prompts,
    prompts_from_args,
    prompts_path,
    select_prompts,
)
from specdraft.bench.records import (
    Outcome,
    PromptRecord,
    aggregate,
    first_mismatch,
    mark_exactness,
    strip_eos,
)
from specdraft.bench.report import OVERALL_COLUMNS, check_output_path, markdown_report, overall_cells
from specdraft.cli import build_parser, main
from specdraft.drafters import drafter_names
from specdraft.errors import SpecdraftError


def write_lines(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def line(qid, category, first="hello", *more):
    return json.dumps({"question_id": qid, "category": category, "turns": [first, *more]})


SAMPLE = [line(1, "coding"), line(2, "math"), line(3, "coding", "again"), line(4, "qa"), line(5, "coding"),
          line(6, "math")]


# ----------------------------------------------------------------------------- prompt files
def test_load_prompts_reads_first_turn_and_skips_blank_lines(tmp_path):
    path = write_lines(tmp_path, [line(7, "qa", "first turn", "second turn"), "", "   ", line("x8", "qa")])
    prompts = load_prompts(path)
    assert [(p.question_id, p.category, p.text) for p in prompts] == [(7, "qa", "first turn"), ("x8", "qa", "hello")]


def test_bad_json_names_the_line(tmp_path):
    path = write_lines(tmp_path, [line(1, "qa"), "", '{"question_id": 2, "category": '])
    with pytest.raises(BenchError, match=r"line 3: not valid JSON"):
        load_prompts(path)


@pytest.mark.parametrize("obj, message", [
    ({"category": "qa", "turns": ["x"]}, "missing field.*question_id"),
    ({"question_id": 1, "turns": ["x"]}, "missing field.*category"),
    ({"question_id": 1}, "missing field.*category, turns"),
    ({"question_id": 1, "category": "qa", "turns": []}, "turns must be a non-empty list"),
    ({"question_id": 1, "category": "qa", "turns": "x"}, "turns must be a non-empty list"),
    ({"question_id": 1, "category": "qa", "turns": ["x", 3]}, "turns must be a non-empty list of non-empty strings"),
    ({"question_id": 1, "category": "", "turns": ["x"]}, "category must be"),
    ({"question_id": [1], "category": "qa", "turns": ["x"]}, "question_id must be"),
])
def test_bad_fields_name_the_line(tmp_path, obj, message):
    path = write_lines(tmp_path, [line(0, "qa"), json.dumps(obj)])
    with pytest.raises(BenchError, match=f"line 2: {message}"):
        load_prompts(path)


def test_not_an_object(tmp_path):
    with pytest.raises(BenchError, match="line 1: expected a JSON object"):
        load_prompts(write_lines(tmp_path, ["[1, 2]"]))


def test_missing_empty_binary_and_duplicate_files(tmp_path):
    with pytest.raises(BenchError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(BenchError, match="is a directory"):
        load_prompts(tmp_path)
    with pytest.raises(BenchError, match="holds no prompts"):
        load_prompts(write_lines(tmp_path, [""], "empty.jsonl"))
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\x89PNG\xff\xfe\x00")
    with pytest.raises(BenchError, match="not UTF-8"):
        load_prompts(binary)
    with pytest.raises(BenchError, match="repeats question_id 1"):
        load_prompts(write_lines(tmp_path, [line(1, "qa"), line(1, "math")], "dup.jsonl"))


def test_errors_are_one_line_specdraft_errors(tmp_path):
    try:
        load_prompts(write_lines(tmp_path, ["{oops"]))
    except SpecdraftError as e:
        assert "\n" not in str(e)
    else:
        pytest.fail("no error")


def test_per_category_takes_the_first_n_in_file_order(tmp_path):
    prompts = load_prompts(write_lines(tmp_path, SAMPLE))
    assert [p.question_id for p in select_prompts(prompts, per_category=2)] == [1, 2, 3, 4, 6]
    assert [p.question_id for p in select_prompts(prompts, per_category=1)] == [1, 2, 4]
    assert [p.question_id for p in select_prompts(prompts, ["math", "coding"], 1)] == [1, 2]
    assert [p.question_id for p in select_prompts(prompts)] == [1, 2, 3, 4, 5, 6]


def test_unknown_category_and_bad_per_category(tmp_path):
    prompts = load_prompts(write_lines(tmp_path, SAMPLE))
    with pytest.raises(BenchError, match="unknown category poetry; the prompts file has: coding, math, qa"):
        select_prompts(prompts, ["coding", "poetry"])
    with pytest.raises(BenchError, match="at least 1"):
        select_prompts(prompts, per_category=0)


# ----------------------------------------------------------------------------- methods
def test_methods_put_the_baseline_first_and_reject_unknown_names():
    assert parse_methods("prompt-lookup, none,hf-generate") == ["none", "prompt-lookup", "hf-generate"]
    assert parse_methods("draft-model,draft-model") == ["none", "draft-model"]  # baseline added once
    with pytest.raises(BenchError, match=r"unknown method 'jacobi'; choose from: all, none, .*hf-assisted"):
        parse_methods("none,jacobi")


def test_all_expands_to_every_registered_method_and_peers_may_follow():
    ours = drafter_names()
    assert ours[0] == "none" and {"draft-model", "prompt-lookup", "suffix", "head"} <= set(ours)
    assert parse_methods("all") == ours
    assert parse_methods("prompt-lookup,all") == ["none", "prompt-lookup"] + [m for m in ours[1:] if m != "prompt-lookup"]
    assert parse_methods("all,llama-cpp,hf-generate") == [*ours, "llama-cpp", "hf-generate"]
    with pytest.raises(BenchError, match=r"unknown method 'everything'; choose from: all, none, "):
        parse_methods("everything")


# methods `all` skips for a model with no trained drafter shipped, no --index and no --draft
NEED_TRAINED_OR_INDEX = {"head", "hybrid-head", "fusion", "retrieval", "eagle", "medusa", "hydra", "mtp"}
NEED_DRAFT = {"draft-model", "hybrid"}  # another target than the default: the default draft's tokenizer may not fit


def test_all_skips_methods_that_cannot_run_but_a_named_one_stays(tmp_path):
    def bench_args(*extra):
        return build_parser().parse_args(["bench", "--target", str(tmp_path / "my-model"), *extra])  # no head shipped

    no_head = bench_args()
    methods, skipped = drop_unavailable(parse_methods("all,hf-generate"), "all,hf-generate", no_head)
    assert set(skipped) == NEED_TRAINED_OR_INDEX | NEED_DRAFT and "pass --head DIR" in skipped["head"]
    assert "pass --draft" in skipped["draft-model"]
    assert "pass --eagle DIR" in skipped["eagle"] and "pass --medusa DIR" in skipped["medusa"]
    assert "pass --mtp DIR" in skipped["mtp"]
    assert "--index" in skipped["retrieval"]
    assert methods == [m for m in parse_methods("all,hf-generate") if m not in skipped]
    named, skipped = drop_unavailable(parse_methods("all,head"), "all,head", no_head)
    assert "head" in named and set(skipped) == (NEED_TRAINED_OR_INDEX | NEED_DRAFT) - {"head"}  # named: it stays
    with_head = bench_args(*(a for n in ("draft", "head", "eagle", "medusa", "hydra", "mtp", "index")
                             for a in (f"--{n}", str(tmp_path / n))))
    assert drop_unavailable(parse_methods("all"), "all", with_head) == (drafter_names(), {})


def test_cli_reports_user_errors_in_one_line(tmp_path, capsys):
    prompts = write_lines(tmp_path, ["not json"])
    code = main(["bench", "--prompts", str(prompts), "--json", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "line 1" in err and err.count("\n") == 1


def test_cli_bench_options():
    args = build_parser().parse_args(["bench", "--prompts", "p.jsonl", "--json", "o.json", "--no-warmup"])
    assert args.warmup is False and args.hf_dtype_plain == "fp32" and args.hf_dtype_assisted == "auto"
    assert args.func is cli._run_bench and str(args.prompts) == "p.jsonl" and str(args.json_out) == "o.json"


def test_cli_start_leaves_the_bench_and_transformers_models_unimported():
    # what `specdraft generate` pays before it loads a model: the bench's harness (its reports,
    # httpx, the peers' transformers models) is imported by `specdraft bench` alone
    code = ("import sys, specdraft.cli; "
            "print(sorted(m for m in ('specdraft.bench.harness', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------- packaged prompts
def test_packaged_dev_prompts_load():
    prompts = load_prompts(PACKAGED_PROMPTS)
    assert len(prompts) == 240 and len(categories_in_order(prompts)) == 13
    assert all(p.question_id % 2 == 0 for p in prompts)  # the dev half: even question ids
    assert (PACKAGED_PROMPTS.parent / "LICENSE-spec-bench.txt").read_text().lstrip().startswith("Apache License")


def test_bench_without_prompts_or_json_uses_the_packaged_prompts():
    args = build_parser().parse_args(["bench", "--per-category", "1"])
    assert args.prompts is None and args.json_out is None
    assert prompts_path(args.prompts) == PACKAGED_PROMPTS
    prompts = prompts_from_args(args)
    assert len(prompts) == 13 and len(categories_in_order(prompts)) == 13  # the first of each category
    assert prompts_path("mine.jsonl").name == "mine.jsonl"


def test_output_directory_is_checked_before_models_load(tmp_path):
    with pytest.raises(BenchError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "o.json", "--json")
    with pytest.raises(BenchError, match="is a directory"):
        check_output_path(tmp_path, "--json")
    check_output_path(None, "--json")  # not given: nothing to check


# ----------------------------------------------------------------------------- exactness
def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 9, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2  # one stopped (EOS) where the other went on
    assert first_mismatch([], []) is None


def test_strip_eos_cuts_at_the_first_eos():
    assert strip_eos([5, 6, 2, 2, 2], {2}) == [5, 6]
    assert strip_eos([5, 6], {2}) == [5, 6]


# ----------------------------------------------------------------------------- aggregation
def rec(method, qid, category, new, seconds, forwards=None, step=None, drafted=None, accepted=None, tokens=None):
    return PromptRecord(method, qid, category, 10, new, seconds, forwards, step, drafted, accepted,
                        token_ids=tokens if tokens is not None else list(range(new)))


def crafted_records():
    return [
        # baseline: 10 tok/s on coding (20 tokens / 2 s), 5 tok/s on math (10 / 2 s)
        rec("none", 1, "coding", 10, 1.0, 9, 9, 0, 0),
        rec("none", 2, "coding", 10, 1.0, 9, 9, 0, 0),
        rec("none", 3, "math", 10, 2.0, 9, 9, 0, 0),
        # a drafter: twice as fast on coding, as fast on math; one math prompt differs
        rec("draft-model", 1, "coding", 10, 0.5, 3, 9, 8, 6),
        rec("draft-model", 2, "coding", 10, 0.5, 3, 9, 8, 6),
        rec("draft-model", 3, "math", 10, 2.0, 9, 9, 8, 0, tokens=[0, 1, 2, 7, 4, 5, 6, 7, 8, 9]),
        # a peer that knows nothing about drafts
        rec("hf-assisted", 1, "coding", 10, 0.25, 4, 11),
        rec("hf-assisted", 2, "coding", 10, 0.25, 4, 11),
        rec("hf-assisted", 3, "math", 10, 4.0, 4, 11),
    ]


def test_aggregate_speedup_exactness_and_overall_row():
    records = crafted_records()
    mark_exactness(records)
    rows = {(r["method"], r["category"]): r for r in aggregate(records, ["none", "draft-model", "hf-assisted"],
                                                                ["coding", "math"])}
    assert rows[("none", "coding")]["tokens_per_s"] == pytest.approx(10.0)
    assert rows[("none", "overall")]["tokens_per_s"] == pytest.approx(30 / 4)
    assert rows[("none", "overall")]["speedup"] == pytest.approx(1.0)
    assert rows[("none", "overall")]["acceptance_rate"] is None  # nothing drafted
    assert rows[("none", "overall")]["mean_accepted_tokens"] == pytest.approx(1.0)

    d = rows[("draft-model", "coding")]
    assert d["speedup"] == pytest.approx(2.0)
    assert d["mean_accepted_tokens"] == pytest.approx(18 / 6)
    assert d["acceptance_rate"] == pytest.approx(12 / 16)
    assert d["exact_match_rate"] == 1.0
    o = rows[("draft-model", "overall")]
    # overall = total tokens / total seconds, not a mean of per-category speedups
    assert o["tokens_per_s"] == pytest.approx(30 / 3.0)
    assert o["speedup"] == pytest.approx((30 / 3.0) / (30 / 4.0))
    assert o["exact_match_rate"] == pytest.approx(2 / 3)
    assert o["acceptance_rate"] == pytest.approx(12 / 24)
    assert o["mean_accepted_tokens"] == pytest.approx(27 / 15)
    assert (o["prompts"], o["new_tokens"], o["seconds"], o["target_forwards"]) == (3, 30, 3.0, 15)

    h = rows[("hf-assisted", "overall")]
    assert h["acceptance_rate"] is None  # unknown stays unknown
    assert h["mean_accepted_tokens"] == pytest.approx(33 / 12)
    assert rows[("hf-assisted", "math")]["speedup"] == pytest.approx(0.5)


def test_mismatch_index_is_recorded():
    records = crafted_records()
    mark_exactness(records)
    bad = [r for r in records if r.exact is False]
    assert [(r.method, r.question_id, r.mismatch_at) for r in bad] == [("draft-model", 3, 3)]


def test_unknown_counts_make_the_aggregate_unknown():
    records = [rec("none", 1, "qa", 5, 1.0, 4, 4, 0, 0), rec("x", 1, "qa", 5, 1.0, None, None)]
    mark_exactness(records)
    row = next(r for r in aggregate(records, ["none", "x"], ["qa"]) if r["method"] == "x")
    assert row["mean_accepted_tokens"] is None and row["target_forwards"] is None and row["speedup"] == 1.0


def test_decode_speed_leaves_out_the_target_prefill():
    # none: 11 tokens in 3 s, 1 s of it prefill -> 10 decode tokens in 2 s; x: same, 0.5 s decoding
    records = [rec("none", 1, "qa", 11, 3.0, 10, 10, 0, 0), rec("x", 1, "qa", 11, 1.5, 4, 10, 8, 6)]
    records[0].prefill_seconds, records[1].prefill_seconds = 1.0, 1.0
    mark_exactness(records)
    rows = {(r["method"], r["category"]): r for r in aggregate(records, ["none", "x"], ["qa"])}
    assert rows[("none", "qa")]["decode_tokens_per_s"] == pytest.approx(5.0)
    assert rows[("x", "overall")]["decode_tokens_per_s"] == pytest.approx(20.0)
    assert rows[("x", "overall")]["decode_speedup"] == pytest.approx(4.0)
    assert rows[("x", "overall")]["speedup"] == pytest.approx(2.0)


def test_draft_and_check_time_per_forward():
    # x: 4 forwards, 0.2 s drafting and 1.0 s checking -> 50 ms and 250 ms a forward; a peer
    # that cannot tell its drafting time shows none, and one record without it hides the sum
    records = [rec("none", 1, "qa", 11, 3.0, 10, 10, 0, 0), rec("x", 1, "qa", 11, 1.5, 4, 10, 8, 6),
               rec("x", 2, "qa", 11, 1.5, 4, 10, 8, 6), rec("peer", 1, "qa", 11, 1.5, 4, 10)]
    records[0].draft_seconds, records[0].check_seconds = 0.0, 2.0
    records[1].draft_seconds, records[1].check_seconds = 0.2, 1.0
    records[2].draft_seconds, records[2].check_seconds = 0.2, 1.0
    mark_exactness(records)
    rows = {(r["method"], r["category"]): r for r in aggregate(records, ["none", "x", "peer"], ["qa"])}
    assert rows[("none", "overall")]["draft_ms_per_forward"] == pytest.approx(0.0)
    assert rows[("none", "overall")]["check_ms_per_forward"] == pytest.approx(200.0)
    assert rows[("x", "overall")]["draft_ms_per_forward"] == pytest.approx(50.0)
    assert rows[("x", "overall")]["check_ms_per_forward"] == pytest.approx(250.0)
    assert rows[("peer", "overall")]["draft_ms_per_forward"] is None
    records[2].draft_seconds = None
    row = next(r for r in aggregate(records, ["x"], ["qa"]) if r["category"] == "overall")
    assert row["draft_ms_per_forward"] is None and row["check_ms_per_forward"] == pytest.approx(250.0)
    cells = dict(zip(OVERALL_COLUMNS, overall_cells(rows[("x", "overall")])))
    assert (cells["draft ms/forward"], cells["check ms/forward"]) == ("50.0", "250.0")
    assert dict(zip(OVERALL_COLUMNS, overall_cells(rows[("peer", "overall")])))["draft ms/forward"] == "–"


def test_markdown_has_overall_and_category_tables():
    records = crafted_records()
    mark_exactness(records)
    methods, cats = ["none", "draft-model", "hf-assisted"], ["coding", "math"]
    md = markdown_report(aggregate(records, methods, cats), methods, cats)
    lines = md.splitlines()
    assert lines[0] == "## Overall"
    assert "| method | tokens/s | speedup |" in lines[2]
    assert "| draft-model | 10.00 | 1.33x | – | – | 1.80 | 50% | 67% | – | – | 3 | 30 | 3.0 |" in lines
    assert "| hf-assisted | 6.67 | 0.89x | – | – | 2.75 | – | 100% | – | – | 3 | 30 | 4.5 |" in lines
    i = lines.index("## Speedup by category")
    assert lines[i + 2] == "| method | coding | math | overall |"
    assert lines[i + 3] == "|---|---:|---:|---:|"
    assert lines[i + 5] == "| draft-model | 2.00x | 1.00x | 1.33x |"
    assert all(ln.count("|") == lines[2].count("|") for ln in lines[2:7])


# ----------------------------------------------------------------------------- mismatch analysis
class FakeTarget:
    """Logits depend only on the context length: even -> top-2 gap 2.0, odd -> gap 0.05."""

    LOGITS = ((3.0, 1.0, 0.0, -1.0), (0.0, 1.0, 0.95, 0.0))

    def __init__(self):
        self.model = self
        self.eos_ids = {3}
        self.calls = 0

    def reset(self):
        pass

    def forward(self, ids, last_only=False):
        from types import SimpleNamespace

        import torch

        self.calls += 1
        return SimpleNamespace(logits=torch.tensor([self.LOGITS[len(ids) % 2]]))


def test_mismatch_gaps_flag_only_real_disagreements():
    records = [rec("none", 1, "qa", 3, 1.0, tokens=[5, 6, 7]), rec("none", 2, "qa", 2, 1.0, tokens=[5, 6]),
               rec("a", 1, "qa", 3, 1.0, tokens=[5, 2, 7]), rec("b", 1, "qa", 3, 1.0, tokens=[5, 2, 9]),
               rec("a", 2, "qa", 3, 1.0, tokens=[5, 0])]
    mark_exactness(records)
    target, warnings = FakeTarget(), []
    prompt_ids = {1: [1, 1, 1], 2: [1, 1]}  # context lengths at the mismatches: 3 + 1 = 4, 2 + 1 = 3
    found = analyse_mismatches(records, prompt_ids, target, 0.1, warnings.append)
    assert [(m["method"], m["question_id"], m["index"]) for m in found] == [("a", 1, 1), ("b", 1, 1), ("a", 2, 1)]
    assert found[0]["top2_gap"] == pytest.approx(2.0) and found[0]["near_tie"] is False
    assert found[0]["method_token_gap"] == pytest.approx(3.0 - 0.0)
    assert found[2]["top2_gap"] == pytest.approx(0.05) and found[2]["near_tie"] is True
    assert found[2]["method_token_gap"] == pytest.approx(1.0)
    assert target.calls == 2  # a and b diverge alike on question 1: one forward serves both
    assert len(warnings) == 2 and "question 1 at token 1" in warnings[0]


def test_mismatch_where_a_sequence_ended_compares_eos():
    records = [rec("none", 1, "qa", 1, 1.0, tokens=[5]), rec("a", 1, "qa", 2, 1.0, tokens=[5, 2])]
    mark_exactness(records)
    found = analyse_mismatches(records, {1: [1, 1]}, FakeTarget(), 0.1, lambda _: None)
    assert found[0]["baseline_token"] is None and found[0]["method_token"] == 2  # none stopped at EOS


# ----------------------------------------------------------------------------- peers on a tiny random model
@pytest.fixture(scope="module")
def tiny_hf_model():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    from specdraft.bench.peers import clean_generation_config

    model.generation_config = clean_generation_config([63])
    return model


def test_peer_runner_counts_forwards_and_matches_plain_greedy(tiny_hf_model):
    import copy

    from specdraft.bench.peers import PEERS, PeerRunner

    ids = [1, 5, 9, 5, 9, 5]
    plain = PeerRunner(PEERS["hf-generate"], tiny_hf_model, None, [63])(ids, 12)
    assert plain.target_forwards == plain.step_tokens  # one token per forward, the prefill's included
    assert len(plain.token_ids) <= 12 and 63 not in plain.token_ids
    assistant = copy.deepcopy(tiny_hf_model)
    assisted = PeerRunner(PEERS["hf-assisted"], tiny_hf_model, assistant, [63])(ids, 12)
    assert assisted.token_ids == plain.token_ids  # lossless: same greedy tokens
    assert assisted.target_forwards < plain.target_forwards  # identical assistant: everything accepted
    lookup = PeerRunner(PEERS["hf-prompt-lookup"], tiny_hf_model, None, [63])(ids, 12)
    assert lookup.token_ids == plain.token_ids


def test_peer_runners_with_ignore_eos_run_past_eos_to_the_same_tokens(tiny_hf_model):
    """--ignore-eos: a token that would end the answer is kept and decoding goes on, greedy tokens
    unchanged (transformers' min_new_tokens would mask EOS out and change them)."""
    import copy

    from specdraft.bench.peers import PEERS, PeerRunner

    ids = [1, 5, 9, 5, 9, 5]
    plain = PeerRunner(PEERS["hf-generate"], tiny_hf_model, None, [63])(ids, 12).token_ids
    assert len(plain) == 12
    eos = plain[3]  # an EOS id that the answer reaches at its 4th token
    assert len(PeerRunner(PEERS["hf-generate"], tiny_hf_model, None, [eos])(ids, 12).token_ids) == 3
    assistant = copy.deepcopy(tiny_hf_model)
    for name, helper in (("hf-generate", None), ("hf-assisted", assistant), ("hf-prompt-lookup", None)):
        out = PeerRunner(PEERS[name], tiny_hf_model, helper, [eos], ignore_eos=True)(ids, 12)
        assert out.token_ids == plain and out.step_tokens == 12, name


def test_chart_is_a_png(tmp_path):
    from specdraft.bench.chart import draw, main

    records = crafted_records()
    mark_exactness(records)
    results = aggregate(records, ["none", "draft-model", "hf-assisted"], ["coding", "math"])
    draw(results, tmp_path / "c.png", "title")
    data = (tmp_path / "c.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    (tmp_path / "r.json").write_text(json.dumps({"results": results}))
    assert main([str(tmp_path / "r.json"), str(tmp_path / "d.png")]) == 0
    assert (tmp_path / "d.png").stat().st_size > 10_000


@pytest.mark.parametrize("order", ["interleaved", "by-method"])
def test_run_order_interleaves_prompts_and_rotates_methods(monkeypatch, order):
    """interleaved: every method on a prompt before the next prompt, the first method rotating;
    by-method: one method's prompts, then the next. Records and saves are the same either way."""
    import argparse
    import io

    from rich.console import Console

    calls = []

    def fake_runner(method, args, speculator, peers):
        def run(ids, max_new_tokens):
            calls.append((method, tuple(ids)))
            return Outcome([7] * max_new_tokens, max_new_tokens, max_new_tokens, None, None)
        return run

    class Speculator:
        def encode_prompt(self, text):
            return [0]

    monkeypatch.setattr(harness, "make_runner", fake_runner)
    prompts = [BenchPrompt(i, "c", f"p{i}") for i in (1, 2, 3, 4)]
    ids = {p.question_id: [p.question_id] for p in prompts}
    saves = []
    args = argparse.Namespace(warmup=True, max_new_tokens=3, order=order)
    records, rss = harness.run_all(["none", "a", "b"], prompts, ids, args, Speculator(), None,
                                   Console(file=io.StringIO()), lambda recs, rss: saves.append(len(recs)))
    timed = [c for c in calls if c[1] != (0,)]  # (0,) is the warm-up prompt
    assert sorted(c[0] for c in calls if c[1] == (0,)) == ["a", "b", "none"]  # each warmed up once
    if order == "interleaved":
        assert timed == [("none", (1,)), ("a", (1,)), ("b", (1,)), ("a", (2,)), ("b", (2,)), ("none", (2,)),
                         ("b", (3,)), ("none", (3,)), ("a", (3,)), ("none", (4,)), ("a", (4,)), ("b", (4,))]
        assert saves == [3, 6, 9, 12]
    else:
        assert [c[0] for c in timed] == ["none"] * 4 + ["a"] * 4 + ["b"] * 4
        assert saves == [4, 8, 12]
    assert sorted((r.method, r.question_id) for r in records) == sorted((m, q) for m in ("none", "a", "b") for q in ids)
    assert set(rss) == {"none", "a", "b"}
    mark_exactness(records)
    assert all(r.exact for r in records)


# ----------------------------------------------------------------------------- machine facts
def test_cpu_info_names_the_model_and_only_known_flags():
    info = cpu_info()
    assert info["model"] and set(info["vector_flags"]) <= set(CPU_FLAGS)
    assert list(info["vector_flags"]) == [f for f in CPU_FLAGS if f in info["vector_flags"]]  # in CPU_FLAGS' order


@pytest.mark.parametrize("fact, attribute, method, expected", [
    (gguf_kernel_path, "kernel_path", lambda self: "avx512-vnni", "avx512-vnni"),
    (vector_rates, "issue_rates", lambda self, seconds: [8.8e9, 4.7e9], dict(vpaddw=8.8, vpmaddubsw=4.7)),
])
def test_kernel_facts_are_none_when_the_kernels_are_unavailable_or_too_old(monkeypatch, fact, attribute, method,
                                                                           expected):
    from specdraft.bench import machine
    from specdraft.kernels import KernelUnavailable

    def unavailable():
        raise KernelUnavailable("no compiler")

    monkeypatch.setattr(machine, "gguf_ops", unavailable)
    assert fact() is None
    monkeypatch.setattr(machine, "gguf_ops", lambda: object())  # a build without the function
    assert fact() is None
    monkeypatch.setattr(machine, "gguf_ops", lambda: type("Ops", (), {attribute: method})())
    assert fact() == expected


def test_machine_line_names_cpu_flags_and_kernel_path():
    info = dict(cpu=dict(model="AMD EPYC 9B45", logical_cpus=4, vector_flags=["avx2", "avx512f", "avx512_vnni"]),
                gguf_kernel_path="avx512-vnni", torch="2.13.0", torch_threads=4)
    line = machine_line(info)
    assert line.startswith("machine: AMD EPYC 9B45 (4 logical CPUs; flags: avx2, avx512f, avx512_vnni)")
    assert "GGUF kernel path: avx512-vnni" in line
    assert "GGUF kernel path: none" in machine_line(dict(info, gguf_kernel_path=None))
    numbered = dict(info, cpu=dict(info["cpu"], model="AMD EPYC", family=25, model_number=1, stepping=1))
    assert machine_line(numbered).startswith("machine: AMD EPYC (family 25 model 1 stepping 1; 4 logical CPUs;")


def test_cpu_info_gives_the_family_and_model_numbers_where_proc_cpuinfo_has_them(monkeypatch):
    import builtins
    import io

    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n" \
           "model name\t: AMD EPYC 9B45\nstepping\t: 1\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\n" \
           "processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC 9B45\n"
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(text) if path == "/proc/cpuinfo"
                        else real_open(path, *a, **k))
    info = cpu_info()
    assert (info["model"], info["family"], info["model_number"], info["stepping"]) == ("AMD EPYC 9B45", 26, 2, 1)
    assert info["vector_flags"] == ["avx2", "avx512f", "avx512_vnni"]


def test_a_cpu_is_filed_under_its_name_numbers_flags_and_cores():
    from specdraft.cpu import cpu_key, cpu_words

    cpu = dict(model="AMD EPYC", family=26, model_number=2, stepping=1, logical_cpus=2,
               vector_flags=["avx2", "avx512_vnni"])
    assert cpu_words(cpu) == "AMD EPYC (family 26 model 2 stepping 1)"
    assert cpu_key(cpu) == "AMD EPYC (family 26 model 2 stepping 1); 2 logical CPUs; avx2,avx512_vnni"
    assert cpu_key(dict(cpu, family=25)) != cpu_key(cpu) and cpu_key(dict(cpu, logical_cpus=4)) != cpu_key(cpu)
    assert cpu_words(dict(model="Some CPU", logical_cpus=1, vector_flags=[])) == "Some CPU"
    assert cpu_key() == cpu_key(cpu_info())


def test_the_runs_probes_are_said_in_one_line():
    assert rates_line([]) is None
    line = rates_line([dict(at="start", vpaddw=8.8, vpmaddubsw=4.7), dict(at="after 2 runs", vpaddw=4.1, vpmaddubsw=2.4),
                       dict(at="end", vpaddw=6.5, vpmaddubsw=4.5)])
    assert line == ("Vector units (one core, G instructions/s): vpaddw 8.8 at the start, 6.5 at the end, 4.1-8.8 "
                    "over 3 probes; vpmaddubsw 4.7 at the start, 4.5 at the end, 2.4-4.7 over 3 probes")


# ----------------------------------------------------------------------------- sampled runs on a tiny model
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from _tiny import make_cli_model

    return make_cli_model(tmp_path_factory.mktemp("bench") / "tiny")


@pytest.fixture
def no_kernel_build(monkeypatch):
    """The report's machine facts would load the GGUF kernels, which wait (a minute or more) while
    another process builds them into the shared cache; these dense tiny models never use them."""
    from specdraft.bench import machine
    from specdraft.kernels import KernelUnavailable

    def unavailable():
        raise KernelUnavailable("not loaded by this test")

    monkeypatch.setattr(machine, "gguf_ops", unavailable)


def bench_tiny(tiny_dir, tmp_path, capsys, name: str, *options: str) -> tuple[dict, str]:
    """``specdraft bench`` on two prompts of the tiny model (the draft is the target itself) -> (report, stderr)."""
    prompts = write_lines(tmp_path, [line(1, "coding", "abc abc abc abc ab"), line(2, "qa", "hello world, hello w")],
                          "tiny.jsonl")
    out = tmp_path / f"{name}.json"
    code = main(["bench", "--prompts", str(prompts), "--target", str(tiny_dir), "--draft", str(tiny_dir),
                 "--dtype", "fp32", "--target-format", "dense", "--draft-format", "dense", "--max-context", "128",
                 "--max-new-tokens", "16", "--no-warmup", "--json", str(out), *options])
    err = capsys.readouterr().err
    assert code == 0, err
    return json.loads(out.read_text()), err


def tokens_by_run(report: dict) -> dict:
    return {(p["method"], p["question_id"]): p["token_ids"] for p in report["prompts"]}


def test_bench_with_ignore_eos_runs_every_answer_to_its_full_length(tiny_dir, tmp_path, capsys, no_kernel_build):
    """Greedy and sampled: every method's answer is --max-new-tokens long; greedy ones equal none's."""
    import shutil

    report, _ = bench_tiny(tiny_dir, tmp_path, capsys, "tokens", "--methods", "none")
    eos = tokens_by_run(report)[("none", 1)][3]  # this model never ends an answer: an EOS it meets
    model = shutil.copytree(tiny_dir, tmp_path / "eos-model")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    report, _ = bench_tiny(model, tmp_path, capsys, "stops", "--methods", "none,prompt-lookup")
    assert len(tokens_by_run(report)[("none", 1)]) == 3  # ends there without --ignore-eos
    for extra in ((), ("--temperature", "0.8", "--seed", "3")):
        report, _ = bench_tiny(model, tmp_path, capsys, "full", "--methods", "none,prompt-lookup,draft-model",
                               "--ignore-eos", *extra)
        runs = tokens_by_run(report)
        assert len(runs) == 6 and all(len(t) == 16 for t in runs.values())
        assert report["config"]["ignore_eos"] is True
        if not extra:
            assert eos in runs[("none", 1)]  # past an EOS
            assert all(r["exact_match_rate"] == 1.0 for r in report["results"])
            assert all(runs[(m, q)] == runs[("none", q)] for m, q in runs)


def test_bench_records_the_vnni_forms_as_the_run_took_them(tiny_dir, tmp_path, capsys, no_kernel_build, monkeypatch):
    """The forms are timed as the products run, so the report takes them at the end of the run."""
    from specdraft.bench import harness

    said = "form timed per product and rows; zmm share so far 4 rows 50%"
    monkeypatch.setattr(harness, "gguf_kernel_forms", lambda: said)
    report, err = bench_tiny(tiny_dir, tmp_path, capsys, "forms", "--methods", "none")
    assert report["config"]["machine"]["gguf_kernel_forms"] == said
    assert f"VNNI forms in this run: {said}" in err.replace("\n", "")


def test_bench_probes_the_machine_phase_through_the_run(tiny_dir, tmp_path, capsys, no_kernel_build, monkeypatch):
    """A probe at the start, after each prompt's round (interleaved) and at the end, in the JSON
    report, on stderr and in the Markdown report with the machine's line."""
    from specdraft.bench import harness

    rates = iter(range(100))
    monkeypatch.setattr(harness, "vector_rates", lambda: dict(vpaddw=float(next(rates)), vpmaddubsw=1.0))
    md = tmp_path / "phase.md"
    report, err = bench_tiny(tiny_dir, tmp_path, capsys, "phase", "--methods", "none,prompt-lookup",
                             "--markdown", str(md))
    probes = report["config"]["machine"]["vector_rates"]
    assert [p["at"] for p in probes] == ["start", "after 2 runs", "after 4 runs", "end"]
    assert [p["vpaddw"] for p in probes] == [0.0, 1.0, 2.0, 3.0]
    said = "vpaddw 0.0 at the start, 3.0 at the end, 0.0-3.0 over 4 probes"
    assert said in err.replace("\n", "")
    text = md.read_text()
    assert text.startswith("## Overall\n\nmachine: ") and said in text


def test_sampled_bench_runs_every_method_and_marks_exactness_not_applicable(tiny_dir, tmp_path, capsys,
                                                                            no_kernel_build):
    md = tmp_path / "r.md"
    report, err = bench_tiny(tiny_dir, tmp_path, capsys, "all", "--methods", "all", "--temperature", "0.8",
                             "--top-p", "0.9", "--seed", "5", "--markdown", str(md))
    # no drafting head is shipped for the tiny model, no --index: all skips those methods and says why
    assert set(report["config"]["skipped_methods"]) == NEED_TRAINED_OR_INDEX
    assert "skipped method head: it needs a drafting head" in err
    ran = [m for m in drafter_names() if m not in NEED_TRAINED_OR_INDEX]
    assert report["config"]["methods"] == ran and {r["method"] for r in report["results"]} == set(ran)
    s = report["config"]["sampling"]
    assert (s["temperature"], s["top_p"], s["top_k"], s["seed"], s["greedy"]) == (0.8, 0.9, 0, 5, False)
    assert report["config"]["greedy"] is False and s["exact_match"].startswith("n/a (sampled)")
    assert all(r["exact_match_rate"] is None for r in report["results"])
    assert all(p["exact"] is None and p["mismatch_at"] is None for p in report["prompts"])
    assert report["mismatches"] is None and report["config"]["complete"] is True  # no analysis, not an empty one
    rows = {r["method"]: r for r in report["results"] if r["category"] == "overall"}
    # the speculative path ran under sampling: a draft equal to the target passes every guess (as
    # many as its costs allow: a tiny draft's forward costs about what the target's does)
    assert rows["draft-model"]["acceptance_rate"] == 1.0 and rows["draft-model"]["mean_accepted_tokens"] > 1.0
    assert rows["none"]["mean_accepted_tokens"] == 1.0
    lines = md.read_text().splitlines()
    assert lines[2].startswith("Sampled at temperature 0.8, top-k off, top-p 0.9, min-p off, seed 5")
    overall = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| method")][:len(ran)]
    assert len(overall) == len(ran) and all(ln.split(" | ")[7] == "n/a (sampled)" for ln in overall)
    assert "%" not in "".join(ln.split(" | ")[7] for ln in overall)
    assert err.rstrip().splitlines()[-1].startswith("exactness and mismatch analysis: n/a (sampled)")


def test_sampled_bench_repeats_with_its_seed_and_draws_with_another(tiny_dir, tmp_path, capsys, no_kernel_build):
    # --no-cost-rule: drafts that never follow measured timings, so the draws repeat with the seed
    methods = ["--methods", "none,draft-model,prompt-lookup", "--temperature", "1.0", "--no-cost-rule"]
    first, _ = bench_tiny(tiny_dir, tmp_path, capsys, "a", *methods, "--seed", "7")
    again, _ = bench_tiny(tiny_dir, tmp_path, capsys, "b", *methods, "--seed", "7", "--order", "by-method")
    other, _ = bench_tiny(tiny_dir, tmp_path, capsys, "c", *methods, "--seed", "8")
    greedy, _ = bench_tiny(tiny_dir, tmp_path, capsys, "d", "--methods", "none,draft-model")
    # the same seed gives the same tokens, whatever order the prompts run in
    assert tokens_by_run(first) == tokens_by_run(again)
    assert tokens_by_run(first) != tokens_by_run(other)
    assert tokens_by_run(first)[("none", 1)] != tokens_by_run(greedy)[("none", 1)]  # it did sample
    assert greedy["config"]["sampling"]["greedy"] is True and greedy["mismatches"] == []
    assert all(p["exact"] for p in greedy["prompts"])  # greedy: exactness still checked


def test_prompt_seeds_depend_on_the_seed_and_the_prompt_only():
    from specdraft.bench.sampled import for_prompt, prompt_seed
    from specdraft.config import SamplingConfig

    assert prompt_seed(3, [1, 2, 3]) == prompt_seed(3, [1, 2, 3])
    assert len({prompt_seed(3, [1, 2, 3]), prompt_seed(4, [1, 2, 3]), prompt_seed(3, [1, 2, 4]),
                prompt_seed(3, "abc")}) == 4
    assert 0 <= prompt_seed(2**40, "x") < 2**31
    sampled = SamplingConfig(temperature=0.7, top_p=0.9, seed=3)
    assert for_prompt(sampled, [1, 2, 3]) == SamplingConfig(temperature=0.7, top_p=0.9, seed=prompt_seed(3, [1, 2, 3]))
    assert for_prompt(SamplingConfig(seed=3), [1, 2, 3]).seed == 3  # greedy draws nothing: left alone


def fake_engine_runner(on_stream, sampling, ignore_eos=False, gens=None):
    """bench.runners.engine_runner over a stand-in engine whose stream(ids, sampling) calls on_stream
    (and appends each generation config to ``gens``)."""
    from types import SimpleNamespace

    from specdraft.bench.runners import engine_runner
    from specdraft.config import SpecConfig

    class Engine:
        drafter = None
        stats = SimpleNamespace(target_forwards=1, step_tokens=1, time_prefill=0.0, time_draft=0.0, time_verify=0.0)
        token_ids = (5,)

        def stream(self, ids, sampling, gen):
            on_stream(ids, sampling)
            if gens is not None:
                gens.append(gen)
            return iter(())

    return engine_runner(SimpleNamespace(engine=lambda spec: Engine()), SpecConfig(method="none"), sampling,
                         ignore_eos=ignore_eos)


def test_engine_runner_passes_ignore_eos_to_every_generation():
    from specdraft.config import SamplingConfig

    for ignore in (False, True):
        gens = []
        run = fake_engine_runner(lambda ids, sampling: None, SamplingConfig(), ignore_eos=ignore, gens=gens)
        run([1, 2], 4), run([3], 5)
        assert [(g.max_new_tokens, g.ignore_eos) for g in gens] == [(4, ignore), (5, ignore)]


def test_engine_runner_seeds_each_prompt_from_the_run_seed_and_the_prompt():
    from specdraft.bench.sampled import prompt_seed
    from specdraft.config import SamplingConfig

    seeds = []
    run = fake_engine_runner(lambda ids, sampling: seeds.append(sampling.seed), SamplingConfig(temperature=0.7, seed=11))
    run([1, 2], 4), run([1, 3], 4), run([1, 2], 4)
    assert seeds == [prompt_seed(11, [1, 2]), prompt_seed(11, [1, 3]), prompt_seed(11, [1, 2])]
    assert seeds[0] != seeds[1]


def test_engine_runner_starts_each_run_without_earlier_answers_in_the_suffix_history():
    from specdraft.config import SamplingConfig
    from specdraft.drafters.suffix import HISTORY

    seen = []

    def stream(ids, sampling):
        seen.append([t.tolist() for t in HISTORY.others(-1)])
        HISTORY.update(len(seen), ids + [5])  # what a suffix drafter leaves behind

    HISTORY.update(99, [1, 2, 7])  # another method's answer to the same prompt
    run = fake_engine_runner(stream, SamplingConfig())
    run([1, 2], 4), run([1, 2], 4)
    assert seen == [[], []]
    HISTORY.clear()


def test_endpoint_requests_carry_the_sampling_settings():
    from specdraft.bench.endpoint import request_body
    from specdraft.bench.sampled import prompt_seed
    from specdraft.config import SamplingConfig

    greedy = request_body("m", "hi", 8, SamplingConfig())
    assert greedy["temperature"] == 0 and "seed" not in greedy and "top_p" not in greedy and greedy["model"] == "m"
    body = request_body(None, "hi", 8, SamplingConfig(temperature=0.7, top_p=0.9, seed=1))
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.7, 0.9, prompt_seed(1, "hi"))
    assert "top_k" not in body and "model" not in body  # top_k is not OpenAI's: sent only when asked for
    assert request_body(None, "hi", 8, SamplingConfig(temperature=0.7, top_k=20, seed=1))["top_k"] == 20
    assert "ignore_eos" not in greedy and request_body(None, "hi", 8, SamplingConfig(), ignore_eos=True)["ignore_eos"]


def test_later_turns_follow_the_baselines_answers(monkeypatch):
    """--turns 2: each two-turn prompt is followed by its second turn, whose prompt is the
    conversation with none's answer, the same for every method (interleaved and by method)."""
    import argparse
    import io

    from rich.console import Console

    from specdraft.bench import harness
    from specdraft.bench.report import markdown_report
    from specdraft.bench.turns import PromptIds, by_turn, conversation_items

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(96 + i) for i in ids)

    class Speculator:
        tokenizer = Tok()

        class target:
            eos_ids = frozenset({9})

            class model:
                max_length = 4096

        def encode_prompt(self, text):
            return [len(text)]

        def encode_messages(self, messages):
            return [ord(c) for m in messages for c in m["content"]]

    def fake_runner(method, args, speculator, peers):
        def run(ids, max_new_tokens):
            answer = [1, 2, 9, 4] if method == "none" else [3]  # only none's answer may shape turn 2, to its EOS
            return Outcome(answer, 1, 1, None, None)
        return run

    monkeypatch.setattr(harness, "make_runner", fake_runner)
    firsts = [BenchPrompt(1, "c", "p1", ("q1",)), BenchPrompt(2, "c", "p2")]
    items, later = conversation_items(firsts, 2)
    assert [p.question_id for p in items] == [1, "1#2", 2] and items[1].text == "q1"
    assert [p.question_id for p in conversation_items(firsts, 1)[0]] == [1, 2]
    for order in ("interleaved", "by-method"):
        ids = PromptIds(Speculator(), firsts, later, 8)
        args = argparse.Namespace(warmup=False, max_new_tokens=2, order=order)
        records, _ = harness.run_all(["none", "a"], items, ids, args, Speculator(), None,
                                     Console(file=io.StringIO()), lambda recs, rss: None)
        assert ids["1#2"] == [ord(c) for c in "p1" + "ab" + "q1"]  # turn 1, none's answer "ab", turn 2
        assert sorted(str(r.question_id) for r in records if r.method == "a") == ["1", "1#2", "2"]
        rows, labels = by_turn(records, ["none", "a"], later)
        assert labels == ["turn 1", "turn 2"]
        assert {(r["method"], r["category"], r["prompts"]) for r in rows} == {
            (m, c, n) for m in ("none", "a") for c, n in (("turn 1", 2), ("turn 2", 1), ("overall", 3))}
        assert "## Speedup by turn" in markdown_report(rows, ["none", "a"], ["c"], turns=(rows, labels))
    assert by_turn(records, ["none", "a"], {}) == ([], [])  # first turns only: no table
    with pytest.raises(BenchError, match="--turns must be at least 1"):
        conversation_items(firsts, 0)
