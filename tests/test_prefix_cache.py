"""Prompt prefix reuse (specdraft.prefix): a prompt that starts with what the target's cache holds
from the previous generation prefills only its tail, and nothing it produces changes: the tokens,
and the feature rows a drafter gets, equal those of a whole prefill. A reset by anyone else voids
the record. Tiny models on the native kernels (q4k: rows independent of their block)."""
from __future__ import annotations

import pytest
import torch

from _tiny import FakeTokenizer, make_cli_model, tree_target
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters import DrafterContext, build_drafter
from specdraft.drafters.base import Drafter
from specdraft.engine import Engine
from specdraft.prefix import PrefixCache

PROMPT = [5, 17, 33, 2, 5, 17, 33, 8, 41, 5, 17, 60, 3, 5, 17, 33]
GEN = GenerationConfig(max_new_tokens=24)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tree_target("q4k", tmp_path_factory.mktemp("prefix"))


class FeatureProbe(Drafter):
    """Plain decoding that keeps every feature row the engine hands over."""

    uses_features = True

    def begin(self, prompt):
        self.rows = []

    def take_features(self, hidden):
        self.rows.append(hidden.clone())


def engine(target, method="none", prefix=None, drafter=None):
    spec = SpecConfig(method=method, ngram_min=1, min_confidence=0.0, cost_rule=False)
    if drafter is None and method != "none":
        drafter = build_drafter(method, DrafterContext(spec=spec, target=target, draft_model=None))
    return Engine(target, FakeTokenizer(), drafter, spec, prefix=prefix)


def tokens(e, prompt, sampling=SamplingConfig()):
    e.generate(prompt, sampling, GEN)
    return list(e.token_ids)


@pytest.mark.parametrize("method", ["none", "prompt-lookup", "suffix"])
def test_next_turn_prefills_its_tail_only_and_decodes_the_same(target, method):
    first = tokens(engine(target, method), PROMPT)
    turn = PROMPT + first + [7, 9, 11, 5, 17]  # the conversation so far and a new message
    fork = PROMPT[:6] + [50, 51, 52]  # a prompt that leaves the held text early
    whole = {len(p): tokens(engine(target, method), p) for p in (turn, fork)}  # whole prefills, no record
    cache = PrefixCache(target)
    assert tokens(engine(target, method, cache), PROMPT) == first
    e = engine(target, method, cache)
    assert tokens(e, turn) == whole[len(turn)]
    # the cache held the prompt and the answer but its newest token (the engine's invariant)
    assert e.stats.cached_prompt_tokens == len(PROMPT) + len(first) - 1
    e = engine(target, method, cache)
    assert tokens(e, fork) == whole[len(fork)] and e.stats.cached_prompt_tokens == 6  # the shared part only


def test_the_same_prompt_again_runs_its_last_token(target):
    cache = PrefixCache(target)
    a = tokens(engine(target, prefix=cache), PROMPT)
    e = engine(target, prefix=cache)
    assert tokens(e, PROMPT) == a and e.stats.cached_prompt_tokens == len(PROMPT) - 1


def test_a_feature_drafter_gets_the_rows_of_a_whole_prefill(target):
    first = tokens(engine(target), PROMPT)
    turn = PROMPT + first + [3, 4]
    kept, whole = FeatureProbe(), FeatureProbe()
    reference = tokens(engine(target, "probe", None, whole), turn)
    cache = PrefixCache(target)
    tokens(engine(target, "probe", cache, FeatureProbe()), PROMPT)
    e = engine(target, "probe", cache, kept)
    assert tokens(e, turn) == reference
    assert e.stats.cached_prompt_tokens > len(PROMPT)
    assert len(kept.rows) == len(whole.rows)
    assert all(torch.equal(a, b) for a, b in zip(kept.rows, whole.rows))
    # a record made without feature rows serves no feature drafter
    plain = PrefixCache(target)
    tokens(engine(target, prefix=plain), PROMPT)
    e = engine(target, "probe", plain, FeatureProbe())
    tokens(e, PROMPT + [1, 2])
    assert e.stats.cached_prompt_tokens == 0


class LastRowProbe(FeatureProbe):
    """A feature drafter that reads the prompt's last row alone (as the trained heads do)."""

    prompt_features = False


def test_a_last_row_drafter_gets_the_last_row_and_any_record_serves_it(target):
    long_prompt = (PROMPT * 5)[:75]  # past the fused decoder's blocks: the prefill's loop path
    every, last = FeatureProbe(), LastRowProbe()
    reference = tokens(engine(target, "probe", None, every), long_prompt)
    assert tokens(engine(target, "probe", None, last), long_prompt) == reference
    assert every.rows[0].shape[0] == len(long_prompt) and last.rows[0].shape[0] == 1
    assert torch.equal(last.rows[0], every.rows[0][-1:])
    assert all(torch.equal(a, b) for a, b in zip(last.rows[1:], every.rows[1:]))
    plain = PrefixCache(target)  # a record without feature rows serves it, with the same rows
    tokens(engine(target, prefix=plain), long_prompt)
    kept = LastRowProbe()
    e = engine(target, "probe", plain, kept)
    assert tokens(e, long_prompt + reference + [3, 4]) == tokens(engine(target), long_prompt + reference + [3, 4])
    assert e.stats.cached_prompt_tokens > len(long_prompt) and kept.rows[0].shape[0] == 1


def test_anyone_elses_reset_voids_the_record(target):
    cache = PrefixCache(target)
    tokens(engine(target, prefix=cache), PROMPT)
    tokens(engine(target), [1, 2, 3])  # an engine without the record: it resets the target
    e = engine(target, prefix=cache)
    assert tokens(e, PROMPT + [4]) == tokens(engine(target), PROMPT + [4]) and e.stats.cached_prompt_tokens == 0
    # refilled to the very same length by someone else: the reset count still tells
    tokens(engine(target, prefix=cache), PROMPT)
    held = target.length
    target.reset()
    target.forward(torch.tensor([1] * held))
    assert target.length == held and cache.prepare(PROMPT + [4], False, ()) == (0, None)


@pytest.mark.parametrize("method", ["none", "prompt-lookup"])
def test_conversations_taking_turns_each_find_their_own(target, method):
    a1, b1 = PROMPT, [9, 8, 7, 6, 5, 4, 3, 2, 9, 8, 7]
    answers = {name: tokens(engine(target, method), p) for name, p in (("a", a1), ("b", b1))}
    a2, b2 = a1 + answers["a"] + [12, 13], b1 + answers["b"] + [14]
    whole = {len(p): tokens(engine(target, method), p) for p in (a2, b2)}
    cache = PrefixCache(target, min_cut=1)
    for p in (a1, b1):
        tokens(engine(target, method, cache), p)
    for p, first in ((a2, a1), (b2, b1)):  # a's prefix was saved when b's first turn came
        e = engine(target, method, cache)
        assert tokens(e, p) == whole[len(p)] and e.stats.cached_prompt_tokens > len(first)
    assert len(cache.saved) == 2
    # with no room for copies, a conversation that lost the cache to another prefills again
    small = PrefixCache(target, budget_bytes=1, min_cut=1)
    for p in (a1, b1):
        tokens(engine(target, method, small), p)
    e = engine(target, method, small)
    assert tokens(e, a2) == whole[len(a2)] and e.stats.cached_prompt_tokens == 0 and not small.saved


def test_records_of_several_methods_on_one_target(target):
    """The bench's --reuse-prefix: each method keeps its own (eager) record on the shared target;
    another method's generations void a record (epoch) but not its copies."""
    a1, b1 = PROMPT, [9, 8, 7, 6, 5, 4, 3, 2, 9, 8, 7]
    first = {m: tokens(engine(target, m), a1) for m in ("none", "prompt-lookup")}
    a2 = {m: a1 + first[m] + [12, 13] for m in first}
    whole = {m: tokens(engine(target, m), a2[m]) for m in first}
    caches = {m: PrefixCache(target, min_cut=1, eager=True) for m in first}
    for m in first:
        tokens(engine(target, m, caches[m]), a1)
    tokens(engine(target), b1)  # someone else between the turns
    for m in first:
        e = engine(target, m, caches[m])
        assert tokens(e, a2[m]) == whole[m] and e.stats.cached_prompt_tokens > len(a1)
    # without copies, a record that another generation overwrote is void, however long its cache
    lazy = PrefixCache(target, min_cut=10**6)
    tokens(engine(target, prefix=lazy), a1)
    tokens(engine(target, prefix=PrefixCache(target)), a1)  # the same tokens again, by another record
    e = engine(target, prefix=lazy)
    assert tokens(e, a2["none"]) == whole["none"] and e.stats.cached_prompt_tokens == 0


def test_snapshot_and_restore_give_back_the_same_bits(target):
    ids = torch.tensor(PROMPT)
    target.reset()
    target.forward(ids[:10])
    saved = target.snapshot()
    want = target.forward(ids[10:]).logits
    target.reset()
    target.forward(torch.tensor([1, 2, 3]))
    target.restore(saved)
    assert target.length == 10 and torch.equal(target.forward(ids[10:]).logits, want)


def test_sampled_generation_reuses_too(target):
    sampling = SamplingConfig(temperature=0.8, seed=3)
    first = tokens(engine(target, "prompt-lookup"), PROMPT, sampling)
    turn = PROMPT + first + [8]
    reference = tokens(engine(target, "prompt-lookup"), turn, sampling)
    cache = PrefixCache(target)
    tokens(engine(target, "prompt-lookup", cache), PROMPT, sampling)
    e = engine(target, "prompt-lookup", cache)
    # the same draws from the same seed: reuse changes no logit
    assert tokens(e, turn, sampling) == reference
    assert e.stats.cached_prompt_tokens > len(PROMPT)


def test_server_reports_cached_prompt_tokens(tmp_path):
    from fastapi.testclient import TestClient

    from specdraft.pipeline import Speculator
    from specdraft.server.app import ServerConfig, create_app

    d = make_cli_model(tmp_path / "tiny")
    answers = {}
    for reuse in (True, False):
        sd = Speculator(str(d), dtype="fp32", target_format="w8a8", max_length=256, load_draft=False, progress=False,
                        reuse_prefix=reuse)
        app = create_app(sd, ServerConfig(model_name="tiny", spec=SpecConfig(method="prompt-lookup")))
        got = []
        with TestClient(app) as client:
            messages = [{"role": "user", "content": "abcabcabd abcab"}]
            for _ in range(2):
                r = client.post("/v1/chat/completions",
                                json={"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0})
                body = r.json()
                assert r.status_code == 200, body
                got.append((body["choices"][0]["message"]["content"], body["usage"]))
                messages += [{"role": "assistant", "content": got[-1][0]}, {"role": "user", "content": "again"}]
            metrics = client.get("/metrics").text
            cached = [line for line in metrics.splitlines() if line.startswith("specdraft_cached_prompt_tokens_total")]
            assert cached and float(cached[0].split()[-1]) == got[-1][1]["prompt_tokens_details"]["cached_tokens"]
        answers[reuse] = got
    assert [text for text, _ in answers[True]] == [text for text, _ in answers[False]]
    assert answers[False][1][1]["prompt_tokens_details"]["cached_tokens"] == 0
    second = answers[True][1][1]
    assert 0 < second["prompt_tokens_details"]["cached_tokens"] < second["prompt_tokens"]


def test_only_targets_with_block_independent_rows_reuse(target, tmp_path):
    from specdraft.pipeline import Speculator
    from specdraft.prefix import reuses_exactly

    assert reuses_exactly(target)  # q4k in fp32
    d = make_cli_model(tmp_path / "tiny")
    dense = Speculator(str(d), dtype="fp32", target_format="dense", max_length=256, load_draft=False, progress=False,
                       reuse_prefix=True)
    assert not reuses_exactly(dense.target.model) and dense.prefix is None  # prefilled whole, every prompt
