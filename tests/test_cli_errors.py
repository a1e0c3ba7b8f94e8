"""The command line turns user errors into one line ``error: ...`` and exit status 2, no traceback.

Parameter checks run before any model is loaded, so most tests need no model at all; the rest use
a tiny random model directory (with a character-level tokenizer) built in the test.
"""
from __future__ import annotations

import json

import pytest
import torch

from _tiny import make_cli_model
from specdraft.cli import main


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI; argparse's own errors raise SystemExit, which counts as the exit status."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, out, err, *, contains: str = ""):
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("error:"), lines[0]
    assert contains.lower() in lines[0].lower(), lines[0]


@pytest.mark.parametrize("args, contains", [
    (["--temperature", "-1"], "temperature"),
    (["--temperature", "nan"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--top-k", "-2"], "top-k"),
    (["--k", "0"], "k"),
    (["--k", "100"], "k"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--seed", "-4"], "seed"),
    (["--min-confidence", "1.5"], "min-confidence"),
    (["--ngram-min", "0"], "n-gram"),
    (["--ngram-min", "4", "--ngram-max", "2"], "n-gram"),
    (["--stop", ""], "stop"),
    (["--min-p", "2"], "min-p"),
    (["--frequency-penalty", "3"], "frequency-penalty"),
    (["--repetition-penalty", "0"], "repetition-penalty"),
    (["--logit-bias", "x=1"], "logit-bias"),
    (["--logit-bias", "5=300"], "logit bias"),
    (["--logprobs", "30"], "logprobs"),
    (["--regex", "[0-9]+("], "does not compile"),
    (["--json-schema", "/nonexistent/schema.json"], "cannot read the JSON schema"),
    (["--json-schema", '{"type": "nonsense"}'], "does not compile"),
    (["--json-schema", "[1]"], "JSON object"),
    (["--grammar", "/nonexistent/g.lark"], "cannot read the grammar"),
])
def test_bad_parameters_give_one_line_and_status_2(capsys, args, contains):
    # --target points nowhere: the parameters must be rejected before any model is looked up.
    rc, out, err = call(["generate", "hello", "--target", "/nonexistent/model", *args], capsys)
    assert_one_line_error(rc, out, err, contains=contains)


@pytest.mark.parametrize("args", [
    ["--method", "no-such-method"],
    ["--temperature", "warm"],
    ["--k", "four"],
])
def test_argparse_errors_also_give_one_line_and_status_2(capsys, args):
    rc, out, err = call(["generate", "hello", "--method", "none", *args], capsys)
    assert_one_line_error(rc, out, err)


@pytest.mark.parametrize("target, contains", [
    ("/nonexistent/dir/model", "does not exist"),
    ("./missing-model.gguf", "does not exist"),
    ("no-such-packaged-model", "unknown model"),
])
def test_missing_target_gives_one_line(capsys, target, contains):
    rc, out, err = call(["generate", "hello", "--method", "none", "--target", target], capsys)
    assert_one_line_error(rc, out, err, contains=contains)


def test_directory_without_config_gives_one_line(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    rc, out, err = call(["generate", "hello", "--method", "none", "--target", str(tmp_path / "empty")], capsys)
    assert_one_line_error(rc, out, err, contains="config.json")


def test_file_that_is_not_a_model_gives_one_line(capsys, tmp_path):
    junk = tmp_path / "weights.bin"
    junk.write_bytes(b"not a model at all")
    rc, out, err = call(["generate", "hello", "--method", "none", "--target", str(junk)], capsys)
    assert_one_line_error(rc, out, err)


def test_corrupt_config_gives_one_line(capsys, tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text("{ not json")
    rc, out, err = call(["generate", "hello", "--method", "none", "--target", str(d)], capsys)
    assert_one_line_error(rc, out, err)


# ---------------------------------------------------------------------------- with a tiny model

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_cli_model(tmp_path_factory.mktemp("cli") / "tiny")


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    return make_cli_model(tmp_path_factory.mktemp("cli") / "shuffled", seed=1, shuffle_seed=3)


def test_generate_with_ignore_eos_runs_past_eos(capsys, tiny_dir, tmp_path):
    import shutil

    def new_tokens(model, *extra):
        rc, out, err = call(["generate", "hello", "--target", str(model), "--dtype", "fp32", "--method", "none",
                             "--max-new-tokens", "8", "--no-chat", "--color", "never", "--json", *extra], capsys)
        assert rc == 0, err
        return json.loads(out.strip().splitlines()[-1])["new_tokens"]

    from specdraft.config import GenerationConfig, SpecConfig
    from specdraft.pipeline import Speculator

    sd = Speculator(str(tiny_dir), dtype="fp32", load_draft=False, progress=False)
    answer = sd.generate("hello", spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=3), chat=False)
    eos = answer.token_ids[1]  # a token its answer meets
    model = shutil.copytree(tiny_dir, tmp_path / "eos-model")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert new_tokens(model) == 1 and new_tokens(model, "--ignore-eos") == 8


def test_generate_runs_on_a_tiny_model(capsys, tiny_dir):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--draft", str(tiny_dir), "--dtype", "fp32",
                         "--method", "draft-model", "--draft-format", "dense", "--max-new-tokens", "8", "--no-chat",
                         "--color", "never", "--no-trees",
                         "--json"], capsys)
    assert rc == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["method"] == "draft-model" and stats["new_tokens"] <= 8
    assert stats["draft_tokens"] > 0 and stats["acceptance_rate"] == 1.0  # draft == target, chains


def test_generate_holds_the_answer_to_a_format(capsys, tmp_path):
    d = make_cli_model(tmp_path / "bytes", byte_level=True)  # (llguidance reads byte-level tokenizers)
    base = ["generate", "hello", "--target", str(d), "--dtype", "fp32", "--method", "prompt-lookup", "--no-chat",
            "--color", "never", "--max-new-tokens", "40"]
    rc, out, err = call([*base, "--choice", "alpha", "--choice", "beta"], capsys)
    assert rc == 0, err
    assert out.splitlines()[0] in ("alpha", "beta")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                  "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}))
    rc, out, err = call([*base, "--json-schema", str(schema)], capsys)
    assert rc == 0, err
    assert json.loads(out.splitlines()[0]) in ({"ok": True}, {"ok": False})
    rc, out, err = call([*base, "--regex", "x", "--choice", "a"], capsys)  # one format at a time
    assert_one_line_error(rc, out, err, contains="not allowed with")


def test_prompt_too_long_for_the_context_gives_one_line(capsys, tiny_dir):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "none", "--no-chat",
                         "--max-context", "16", "--max-new-tokens", "40"], capsys)
    assert_one_line_error(rc, out, err, contains="max-new-tokens")


@pytest.mark.parametrize("value", ["0", "-5"])
def test_bad_max_context_gives_one_line(capsys, tiny_dir, value):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "none", "--no-chat",
                         "--max-context", value, "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err)


def test_mismatched_tokenizers_give_one_line(capsys, tiny_dir, other_vocab_dir):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--draft", str(other_vocab_dir),
                         "--method", "draft-model", "--no-chat", "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="tokenizer")


def test_draft_method_without_draft_model_is_a_parameter_error():
    from specdraft.errors import ParameterError
    from specdraft.pipeline import Speculator

    sd = Speculator.__new__(Speculator)  # no model needed to reach the check
    sd.draft = None
    with pytest.raises(ParameterError, match="needs a draft model"):
        from specdraft.config import SpecConfig

        sd.engine(SpecConfig(method="draft-model"))


def test_calibrate_prints_and_saves_the_forward_cost(capsys, tiny_dir, tmp_path):
    out_json = tmp_path / "cost.json"
    rc, out, err = call(["calibrate", "--model", str(tiny_dir), "--format", "dense", "--dtype", "fp32",
                         "--context", "8", "--blocks", "1,2,4", "--repeats", "2", "--json", str(out_json)], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    assert report["tokens"] == [1, 2, 4] and len(report["seconds"]) == 3 and min(report["seconds"]) > 0
    assert out.count("new tokens") == 3


def test_calibrate_compares_formats_interleaved(capsys, tiny_dir, tmp_path):
    out_json = tmp_path / "cost.json"
    rc, out, err = call(["calibrate", "--model", str(tiny_dir), "--format", "dense:fp32,w8a8", "--context", "8",
                         "--blocks", "1,2", "--repeats", "2", "--json", str(out_json)], capsys)
    assert rc == 0, err
    formats = json.loads(out_json.read_text())["formats"]
    assert set(formats) == {"dense:fp32", "w8a8"} and formats["w8a8"]["weight_format"] == "w8a8"
    assert out.count("new tokens") == 4 and out.count("the fastest") == 2


def test_calibrate_peer_needs_a_gguf_model(capsys, tiny_dir):
    rc, out, err = call(["calibrate", "--model", str(tiny_dir), "--format", "dense", "--dtype", "fp32",
                         "--context", "8", "--blocks", "1", "--repeats", "1", "--peer", "llama-cpp"], capsys)
    assert_one_line_error(rc, out, err, contains="GGUF")


@pytest.mark.parametrize("args, contains", [
    (["--format", "dense:fp64"], "FORMAT:DTYPE"),
    (["--format", "gguf,gguf"], "twice"),
    (["--blocks", "1,x"], "blocks"),
    (["--blocks", "0"], "blocks"),
    (["--context", "0"], "context"),
    (["--peer", "llama-cpp", "--pages"], "--peer"),
    (["--peer", "llama-cpp", "--steps"], "--peer"),
    (["--peer", "vllm"], "--peer"),
])
def test_calibrate_bad_arguments_give_one_line(capsys, args, contains):
    rc, out, err = call(["calibrate", "--model", "/nonexistent/model", *args], capsys)
    assert_one_line_error(rc, out, err, contains=contains)


@pytest.mark.parametrize("args, contains", [
    (["--temperature", "-1"], "temperature"),
    (["--temperature", "inf"], "temperature"),
    (["--temperature", "0.7", "--top-p", "0"], "top-p"),
    (["--temperature", "0.7", "--top-k", "-1"], "top-k"),
    (["--temperature", "0.7", "--seed", "-3"], "seed"),
    (["--temperature", "0.7", "--methods", "all,llama-cpp"], "llama-cpp run greedy only"),
    (["--temperature", "0.7", "--methods", "none,hf-generate,hf-assisted"], "hf-generate, hf-assisted run greedy only"),
    (["--methods", "all,jacobi"], "unknown method 'jacobi'"),
])
def test_bench_bad_sampling_and_methods_give_one_line(capsys, args, contains):
    # --target points nowhere: the options must be rejected before any model is looked up.
    rc, out, err = call(["bench", "--per-category", "1", "--target", "/nonexistent/model", *args], capsys)
    assert_one_line_error(rc, out, err, contains=contains)


def test_bench_endpoint_rejects_bad_sampling_before_connecting(capsys):
    rc, out, err = call(["bench", "--endpoint", "http://127.0.0.1:9/v1", "--per-category", "1",
                         "--temperature", "0.7", "--top-p", "2"], capsys)
    assert_one_line_error(rc, out, err, contains="top-p")


def test_head_method_without_a_head_gives_one_line(capsys, tiny_dir):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "head", "--no-chat",
                         "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="train-head")


def test_head_from_a_bad_directory_gives_one_line(capsys, tiny_dir, tmp_path):
    (tmp_path / "head.json").write_text("{not json")
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "hybrid-head", "--no-chat",
                         "--head", str(tmp_path), "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="head")


def test_gguf_format_for_a_model_directory_gives_one_line(capsys, tiny_dir):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "none", "--no-chat",
                         "--target-format", "gguf", "--dtype", "fp32", "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="gguf")


def test_auto_format_without_a_gguf_file_falls_back(capsys, tiny_dir):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "none", "--no-chat",
                         "--dtype", "fp32", "--max-new-tokens", "4", "--json"], capsys)
    assert rc == 0, err


def test_cli_offers_every_weight_format():
    from specdraft.models.quant import WEIGHT_FORMATS
    from specdraft.options import FORMATS

    assert ["auto", *WEIGHT_FORMATS] == FORMATS


# ---------------------------------------------------------------------------- retrieval indexes

@pytest.mark.parametrize("command", [["generate", "hello", "--method", "retrieval"], ["serve", "--method", "retrieval"],
                                     ["bench", "--methods", "retrieval"]])
def test_retrieval_without_an_index_gives_one_line(capsys, command):
    # --target points nowhere: the missing index must be found before any model is looked up
    rc, out, err = call([*command, "--target", "/nonexistent/model"], capsys)
    assert_one_line_error(rc, out, err, contains="--index")


def build_index_cli(capsys, tmp_path, target) -> str:
    text = tmp_path / "notes.txt"
    text.write_text("the cache holds the keys; the cache holds the values; " * 20)
    index = tmp_path / "index"
    rc, out, err = call(["index", "build", str(text), "-o", str(index), "--target", str(target)], capsys)
    assert rc == 0 and "indexed 1 files, 1,080 tokens" in out, out + err
    return str(index)


def test_index_build_then_generate_with_retrieval(capsys, tiny_dir, tmp_path):
    index = build_index_cli(capsys, tmp_path, tiny_dir)
    rc, out, err = call(["index", "info", index], capsys)
    assert rc == 0 and json.loads(out)["tokens"] == 1080
    rc, out, err = call(["generate", "the cache holds", "--target", str(tiny_dir), "--method", "retrieval",
                         "--index", index, "--dtype", "fp32", "--max-new-tokens", "8", "--no-chat", "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["method"] == "retrieval"


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_index_gives_one_line(capsys, tiny_dir, tmp_path, command, damage):
    index = tmp_path / "nowhere"
    if damage == "corrupt":
        index = build_index_cli(capsys, tmp_path, tiny_dir)
        (tmp_path / "index" / "order.npy").write_bytes(b"\x93NUMPY garbage")
    args = ["generate", "hello", "--no-chat", "--max-new-tokens", "4"] if command == "generate" else ["serve", "--no-draft"]
    rc, out, err = call([*args, "--target", str(tiny_dir), "--method", "retrieval", "--index", str(index)], capsys)
    assert_one_line_error(rc, out, err, contains="index")


def test_an_index_of_another_tokenizer_gives_one_line(capsys, tiny_dir, other_vocab_dir, tmp_path):
    index = build_index_cli(capsys, tmp_path, other_vocab_dir)
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "retrieval", "--index", index,
                         "--no-chat", "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="another tokenizer")


@pytest.mark.parametrize("args, contains", [
    (["/nonexistent/notes"], "does not exist"),
    (["NOTES", "--max-tokens", "0"], "max-tokens"),
    (["NOTES", "--glob", ""], "glob"),
    (["BENCH"], "benchmark prompts"),
    (["NOTES", "-o", "NOTES"], "not a retrieval index"),
])
def test_index_build_bad_arguments_give_one_line(capsys, tiny_dir, tmp_path, args, contains):
    from specdraft.retrieval.build import BENCH_DATA

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("text")
    names = {"NOTES": str(tmp_path / "notes"), "BENCH": str(BENCH_DATA)}
    args = [names.get(a, a) for a in args]
    out_dir = [] if "-o" in args else ["-o", str(tmp_path / "index")]
    rc, out, err = call(["index", "build", *args, *out_dir, "--target", str(tiny_dir)], capsys)
    assert_one_line_error(rc, out, err, contains=contains)


def test_eagle_without_a_drafter_or_with_a_head_of_another_kind_gives_one_line(capsys, tiny_dir, tmp_path):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "eagle", "--no-chat",
                         "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="train-drafter --kind eagle")
    (tmp_path / "head.json").write_text('{"hidden_size": 64, "inner": 8, "vocab": 10}')
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "eagle", "--no-chat",
                         "--eagle", str(tmp_path), "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="holds a 'mlp' drafter")


@pytest.mark.parametrize("args,contains", [
    (["--epochs", "0"], "epochs"),
    (["--batch", "0"], "batch"),
    (["--record-batch", "0"], "record-batch >= 1"),
    (["--lr", "2"], "lr must be"),
    (["--holdout", "1"], "holdout must be"),
    (["--kind", "medusa", "--inner", "64"], "--inner does not apply"),
    (["--kind", "mlp", "--start", "random"], "--start applies to --kind eagle without --init or --taps only"),
    (["--kind", "eagle", "--taps", "1", "--start", "random"], "--start applies to --kind eagle without --init or"),
    (["--kind", "eagle", "--init", "shipped", "--start", "random"], "--start applies to --kind eagle without --init"),
    (["--kind", "eagle", "--init", "shipped", "--vocab", "100"], "takes its width, taps and vocabulary from the MLP"),
    (["--kind", "medusa", "--taps", "1"], "--taps applies to --kind mlp and eagle only"),
    (["--kind", "mlp", "--taps", "one,two"], "--taps takes comma-separated layer numbers"),
    (["--kind", "mtp", "--init", "shipped"], "--init applies to --kind mlp and eagle only"),
    (["--kind", "eagle", "--draft-vocab", "frequent"], "--draft-vocab frequent does not apply to --kind eagle without"),
    (["--kind", "eagle", "--feature-noise", "0.1"], "--feature-noise applies to --kind mlp and mtp only"),
    (["--kind", "mlp", "--feature-noise", "-1"], "feature-noise must be in [0, 10]"),
    (["--kind", "mlp", "--weight-decay", "2"], "weight-decay must be in [0, 1)"),
    (["--kind", "hydra", "--soft-labels", "0.5"], "--soft-labels applies to --kind mlp and mtp only"),
    (["--kind", "mtp", "--soft-labels", "1.5"], "soft-labels must be in [0, 1]"),
    (["--kind", "mlp", "--with-requests"], "--with-requests applies to --kind eagle only"),
])
def test_train_drafter_refuses_bad_settings_in_one_line(capsys, tmp_path, args, contains):
    rc, out, err = call(["train-drafter", "--out", str(tmp_path), *args], capsys)
    assert_one_line_error(rc, out, err, contains=contains)


def test_train_drafter_with_taps_past_the_layers_gives_one_line(capsys, tiny_dir, tmp_path):
    rc, out, err = call(["train-drafter", "--out", str(tmp_path / "h"), "--kind", "mlp", "--taps", "0,7",
                         "--target", str(tiny_dir)], capsys)
    assert_one_line_error(rc, out, err, contains="--taps: tapped layers must be ascending indices below")
    assert not (tmp_path / "h").exists()
    rc, out, err = call(["train-drafter", "--out", str(tmp_path / "h"), "--kind", "mlp", "--init", "shipped",
                         "--target", str(tiny_dir)], capsys)
    assert_one_line_error(rc, out, err, contains="no head is shipped for")
    rc, out, err = call(["train-drafter", "--out", str(tmp_path / "h"), "--kind", "mlp", "--init", str(tmp_path / "none"),
                         "--target", str(tiny_dir)], capsys)
    assert_one_line_error(rc, out, err, contains="no drafting head in")
    assert not (tmp_path / "h").exists()
    import torch

    from specdraft.heads.data import FeatureSet  # a file recorded without taps and without its requests

    FeatureSet(torch.zeros(4, 8).half(), torch.arange(4), torch.zeros(4, 16, dtype=torch.int64),
               torch.tensor([0, 4])).save(tmp_path / "old.pt")
    rc, out, err = call(["train-drafter", "--out", str(tmp_path / "h"), "--kind", "mlp", "--taps", "0",
                         "--features", str(tmp_path / "old.pt"), "--target", str(tiny_dir)], capsys)
    assert_one_line_error(rc, out, err, contains="cannot be recorded again")
    assert not (tmp_path / "h").exists()
    rc, out, err = call(["train-drafter", "--out", str(tmp_path / "h"), "--kind", "eagle", "--with-requests",
                         "--answers", str(tmp_path / "old.pt"), "--record-minutes", "0", "--target", str(tiny_dir)], capsys)
    assert_one_line_error(rc, out, err, contains="was recorded without its requests; --with-requests needs them")
    assert not (tmp_path / "h").exists() and not (tmp_path / "old.requests.pt").exists()


def test_self_draft_with_too_many_layers_skipped_gives_one_line(capsys, tiny_dir):
    for skip, contains in (("0", "skip-layers must be an integer >= 1"), ("2", "between 1 and 1")):
        rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "self-draft", "--no-chat",
                             "--skip-layers", skip, "--max-new-tokens", "4"], capsys)
        assert_one_line_error(rc, out, err, contains=contains)


def test_medusa_or_mtp_without_heads_and_unwritten_layouts_give_one_line(capsys, tiny_dir, tmp_path):
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "medusa", "--no-chat",
                         "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="train-drafter --kind medusa")
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "mtp", "--no-chat",
                         "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, out, err, contains="train-drafter --kind mtp")
    rc, out, err = call(["export", "--to", "sglang", "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(rc, out, err, contains="'head' form")
    assert not (tmp_path / "out").exists()


def test_export_of_a_head_of_another_kind_gives_one_line(capsys, tmp_path):
    (tmp_path / "head.json").write_text('{"hidden_size": 64, "inner": 8, "vocab": 10}')
    rc, out, err = call(["export", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(rc, out, err, contains="holds a 'mlp' drafter")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_cost_rule_and_trees_flags_reach_the_spec(command):
    from specdraft.cli import build_parser
    from specdraft.options import spec_from_args

    given = [command] + (["hi"] if command == "generate" else [])
    default = spec_from_args("draft-model", build_parser().parse_args(given))
    off = spec_from_args("draft-model", build_parser().parse_args([*given, "--no-cost-rule", "--no-trees"]))
    assert (default.cost_rule, default.trees) == (True, True)
    assert (off.cost_rule, off.trees) == (False, False)


@pytest.mark.parametrize("device, contains", [
    ("tpu", "--device tpu"),
    *([] if torch.cuda.is_available() else [("cuda", "no CUDA GPU")]),
])
def test_train_drafter_bad_device_gives_one_line_before_loading_the_target(capsys, tmp_path, device, contains):
    # --target points nowhere: the device must be refused before any model is looked up.
    rc, out, err = call(["train-drafter", "--target", "/nonexistent/model", "--out", str(tmp_path / "d"),
                         "--device", device], capsys)
    assert_one_line_error(rc, out, err, contains=contains)


def test_train_drafter_freeze_step_without_init_gives_one_line(capsys, tmp_path):
    rc, out, err = call(["train-drafter", "--target", "/nonexistent/model", "--out", str(tmp_path / "d"),
                         "--kind", "eagle", "--freeze-step"], capsys)
    assert_one_line_error(rc, out, err, contains="--freeze-step")


@pytest.mark.parametrize("flag", ["--prefill-chunk", "--batch-slots"])
def test_serve_refuses_a_negative_batch_setting(capsys, flag):
    rc, out, err = call(["serve", "--target", "/nonexistent/model", flag, "-1"], capsys)
    assert_one_line_error(rc, out, err, contains=flag.lstrip("-"))


def test_serve_refuses_a_negative_prefix_cache(capsys):
    rc, out, err = call(["serve", "--target", "/nonexistent/model", "--prefix-cache-mb", "-1"], capsys)
    assert_one_line_error(rc, out, err, contains="prefix-cache-mb")


def test_generate_several_answers_decoded_together(capsys, tiny_dir):
    """generate --n 3: three answers decoded together, the j-th sampled with seed + j, each the
    answer its seed gives alone."""
    from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
    from specdraft.kernels import KernelUnavailable, gguf_ops
    from specdraft.pipeline import Speculator

    try:
        gguf_ops()  # q4k: the native runtime
    except KernelUnavailable as e:
        pytest.skip(str(e))
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--dtype", "fp32", "--target-format", "q4k",
                         "--method", "none", "--n", "3", "--temperature", "0.8", "--seed", "7",
                         "--max-new-tokens", "10", "--no-chat", "--json"], capsys)
    assert rc == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    assert got["together"] and len(got["answers"]) == 3
    sd = Speculator(str(tiny_dir), dtype="fp32", target_format="q4k", load_draft=False, progress=False)
    for j, answer in enumerate(got["answers"]):
        alone = sd.generate("hello", spec=SpecConfig(method="none"), chat=False,
                            sampling=SamplingConfig(temperature=0.8, seed=7 + j), gen=GenerationConfig(max_new_tokens=10))
        assert answer["text"] == alone.text and answer["new_tokens"] == len(alone.token_ids)
    assert len({a["text"] for a in got["answers"]}) > 1
    rc, out, err = call(["generate", "hello", "--target", str(tiny_dir), "--method", "none", "--n", "0"], capsys)
    assert_one_line_error(rc, out, err, contains="--n")


def test_generate_reads_its_prompt_from_stdin_for_a_dash(capsys, tiny_dir, monkeypatch):
    import io
    import sys

    args = ["--target", str(tiny_dir), "--dtype", "fp32", "--method", "none", "--max-new-tokens", "8", "--no-chat",
            "--color", "never"]
    rc, given, err = call(["generate", "abc\nabd", *args], capsys)
    assert rc == 0, err
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc\nabd"))
    rc, piped, err = call(["generate", "-", *args], capsys)
    assert rc == 0 and piped.splitlines()[:-1] == given.splitlines()[:-1]  # the same text (the stats line aside)
    for bad in (io.StringIO(" \n"), io.TextIOWrapper(io.BytesIO(b"\xff\xfe abc"), encoding="utf-8")):
        monkeypatch.setattr(sys, "stdin", bad)
        assert_one_line_error(*call(["generate", "-", *args], capsys))
