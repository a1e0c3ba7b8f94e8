"""Several generations decoded together (specdraft.batch): each answer is the one its prompt gets
alone, greedy and sampled, chains and trees; the pipeline's generate_batch; the batch's costs."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tiny import VOCAB, FakeTokenizer, make_cli_model, tiny_client, tree_target
from specdraft.batch import Batch, BatchCosts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.costs import ForwardCosts
from specdraft.drafters import DrafterContext, build_drafter
from specdraft.engine import Engine
from specdraft.errors import ContextLengthError
from specdraft.pipeline import Speculator


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tree_target("q4k", tmp_path_factory.mktemp("batch") / "target")


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:  # repeated stretches, so the copying prophets find something to copy
        head = torch.randint(0, VOCAB - 1, (max(2, n // 3),), generator=g).tolist()
        out.append((head * 4)[:n])
    return out


def _spec(method):
    return SpecConfig(method=method, k=4, ngram_min=1, min_confidence=0.0, cost_rule=False)


def _engine(model, method, costs=None):
    spec = _spec(method)
    drafter = None if method == "none" else build_drafter(method, DrafterContext(spec, model, None, None))
    return Engine(model, FakeTokenizer(), drafter, spec, eos_ids={VOCAB - 1}, costs=costs)


def _alone(target, method, prompt, sampling, gen):
    e = _engine(target, method)
    e.generate(prompt, sampling, gen)
    return list(e.token_ids), e.stats


def _together(target, method, prompts, samplings, gen):
    batch = Batch(target, sum(len(p) + gen.max_new_tokens + 128 for p in prompts), ForwardCosts())
    views = [batch.view() for _ in prompts]
    engines = [_engine(v, method, v.costs) for v in views]
    batch.run([lambda e=e, p=p, s=s: e.generate(p, s, gen) for e, p, s in zip(engines, prompts, samplings)], views)
    return [list(e.token_ids) for e in engines], [e.stats for e in engines], batch


# (suffix sampled is left out: it drafts from the process's other sequences too, the batch's here,
# and a seeded sampled answer follows the drafts' random draws; its greedy answers are exact)
@pytest.mark.parametrize("method, temperature", [(m, t) for m in ("none", "prompt-lookup", "suffix", "lookahead")
                                                 for t in (0.0, 0.8) if (m, t) != ("suffix", 0.8)])
def test_answers_decoded_together_are_each_prompts_own(target, method, temperature):
    prompts = _prompts((5, 17, 9, 40))
    samplings = [SamplingConfig(temperature=temperature, seed=i) for i in range(len(prompts))]
    gen = GenerationConfig(max_new_tokens=24)
    got, stats, batch = _together(target, method, prompts, samplings, gen)
    alone = [_alone(target, method, p, s, gen) for p, s in zip(prompts, samplings)]
    assert got == [ids for ids, _ in alone]
    if method != "suffix":  # (suffix drafts from the process's other sequences too: the batch's, here)
        assert [st.target_forwards for st in stats] == [st.target_forwards for _, st in alone]
    # one joint forward a step: fewer than the generations' checks one after another
    assert batch.forwards < sum(st.target_forwards for st in stats)
    assert batch.forwards >= max(st.target_forwards for st in stats)
    if method != "none" and temperature == 0.0:
        assert sum(st.accepted_tokens for st in stats) > 0
    assert batch.model.length == 0 and (batch.owner == 0).all()  # every slot freed at the end


@pytest.mark.parametrize("method, temperature", [("none", 0.0), ("prompt-lookup", 0.0), ("prompt-lookup", 0.8),
                                                 ("lookahead", 0.0)])
def test_prefills_joining_a_batch_run_in_chunks_beside_its_checks(target, method, temperature):
    """Generations admitted while others check their guesses prefill PREFILL_CHUNK rows a step,
    packed into the checks' forward (two answers to one prompt sharing the chunks); every answer
    is still its prompt's own."""
    prompts = _prompts((6, 17, 31, 9), seed=5)
    prompts.insert(3, prompts[2])  # two answers to one prompt: they share its chunks
    samplings = [SamplingConfig(temperature=temperature, seed=20 + i) for i in range(len(prompts))]
    gen = GenerationConfig(max_new_tokens=16)
    batch = Batch(target, sum(len(p) + gen.max_new_tokens + 128 for p in prompts), ForwardCosts(), prefill_chunk=4)
    engines, later = [], list(range(1, len(prompts)))

    def job(i, view):
        e = _engine(view, method, view.costs)
        engines.append((i, e))
        return lambda: e.generate(prompts[i], samplings[i], gen)

    def admit():  # one generation first; the others join two steps apart, the two same prompts together
        if batch.forwards % 2 or not later:
            return []
        take = [later.pop(0)]
        if later and prompts[later[0]] == prompts[take[0]]:
            take.append(later.pop(0))
        out = []
        for i in take:
            v = batch.view()
            out.append((job(i, v), v))
        return out

    first = batch.view()
    batch.run([job(0, first)], [first], admit)
    got = {i: list(e.token_ids) for i, e in engines}
    assert sorted(got) == list(range(len(prompts)))
    for i, p in enumerate(prompts):
        assert got[i] == _alone(target, method, p, samplings[i], gen)[0], i
    assert batch.chunks > batch.prefills  # (prefills went on in several chunks)
    assert batch.prefills == len(prompts) - 1  # (one for the two answers to one prompt)
    assert batch.model.length == 0 and (batch.owner == 0).all()


@pytest.mark.parametrize("method", ["none", "prompt-lookup"])
def test_answers_to_one_prompt_share_its_prefill(target, method):
    """n sampled answers to one prompt: one prefill for all, each answer its seed's own."""
    prompt = _prompts((23,), seed=4)[0]
    samplings = [SamplingConfig(temperature=0.9, seed=10 + i) for i in range(4)]
    gen = GenerationConfig(max_new_tokens=20)
    got, _, batch = _together(target, method, [prompt] * 4, samplings, gen)
    assert batch.prefills == 1
    assert got == [_alone(target, method, prompt, s, gen)[0] for s in samplings]
    assert len({tuple(ids) for ids in got}) > 1  # the seeds drew different answers


def test_generations_of_different_lengths_and_an_early_end(target):
    """One answer ends at its first token (an end-of-sequence id), one at a stop of max tokens,
    the others go on; the batch keeps running those left."""
    prompts = _prompts((6, 11, 30), seed=2)
    gen = GenerationConfig(max_new_tokens=30)
    first = _alone(target, "none", prompts[1], SamplingConfig(), GenerationConfig(max_new_tokens=1))[0][0]
    engines_eos = {first}
    batch = Batch(target, 400, ForwardCosts())
    views = [batch.view() for _ in prompts]
    engines = [_engine(v, "prompt-lookup", v.costs) for v in views]
    engines[1].eos_ids = engines_eos
    gens = [gen, gen, GenerationConfig(max_new_tokens=5)]
    batch.run([lambda e=e, p=p, g=g: e.generate(p, SamplingConfig(), g) for e, p, g in zip(engines, prompts, gens)],
              views)
    assert engines[1].token_ids == []
    assert len(engines[2].token_ids) == 5
    assert engines[0].token_ids == _alone(target, "prompt-lookup", prompts[0], SamplingConfig(), gen)[0]


def test_an_error_in_one_generation_reaches_the_caller(target):
    batch = Batch(target, 400, ForwardCosts())
    views = [batch.view() for _ in range(2)]
    engines = [_engine(v, "none", v.costs) for v in views]
    gen = GenerationConfig(max_new_tokens=8)
    with pytest.raises(ContextLengthError):
        batch.run([lambda: engines[0].generate([1, 2, 3], SamplingConfig(), gen),
                   lambda: engines[1].generate([], SamplingConfig(), gen)], views)
    assert len(engines[0].token_ids) == 8  # the other one ran to its end


def test_batch_costs_price_a_check_against_the_whole_step():
    shared = ForwardCosts.fixed({2: 1.1, 3: 1.2, 4: 1.3, 5: 1.45, 6: 1.6, 8: 2.0, 9: 2.2}, 0.02)
    costs = BatchCosts(shared)
    for t in (1, 2, 4, 6):  # alone: the target's own ratios
        assert costs.ratio(t) == pytest.approx(shared.ratio(t))
    costs.set_others(rows=3.0, tokens=3.0)  # three others, one row and one token a step each
    # a check of 2 rows: the step goes from 4 rows to 5 (1.3 -> 1.45), for the 4 tokens the step commits
    assert costs.ratio(2) == pytest.approx(1.0 + 4.0 * (1.45 / 1.3 - 1.0))
    # so a guess that passes 40% of the time pays alone (1.4 tokens for 1.1) and not in this batch
    # (its 0.4 tokens against 4 x 0.115)
    assert shared.best_length([0.4]) == 1 and costs.best_length([0.4]) == 0
    assert costs.best_length([0.95]) == 1  # a sure one still does
    # a second of its drafting holds up the step's 4 tokens: it weighs 4 / 1.3 times what it weighs alone
    assert costs.measured and costs.one_now == pytest.approx(0.02 * 1.3 / 4.0)
    costs.record(3, 1.0)  # the batch times its joint forwards into the shared table, not the views
    assert shared.seconds[3] == pytest.approx(1.2 * 0.02)


def test_an_answer_not_yet_measured_counts_one_token_a_step_for_the_others(target):
    batch = Batch(target, 64, ForwardCosts())
    a, b, c = batch.view(), batch.view(), batch.view()
    a.rows_mean, a.tokens_mean = 3.0, 2.5  # measured over its checks
    b.rows_mean = 4.0  # one check so far: it commits one token a step at least
    # c: still prefilling, no check yet: no rows, no tokens
    batch._others({v.seq: None for v in (a, b, c)})
    assert (a.costs.others_rows, a.costs.others_tokens) == (4.0, 1.0)
    assert (b.costs.others_rows, b.costs.others_tokens) == (3.0, 2.5)
    assert (c.costs.others_rows, c.costs.others_tokens) == (7.0, 3.5)


@pytest.fixture(scope="module")
def sd(tmp_path_factory, target):  # (target: skips where the native kernels do not build)
    d = str(make_cli_model(tmp_path_factory.mktemp("batchpipe") / "tiny"))
    return Speculator(d, d, dtype="fp32", draft_format="w8a8", target_format="q4k", max_length=256, progress=False)


@pytest.mark.parametrize("method", ["prompt-lookup", "draft-model"])
def test_generate_batch_gives_each_prompts_own_answer(sd, method):
    prompts = [sd.encode_prompt(p, chat=False) for p in ("abcabcabd abcab", "hello hello hel", "xyz")]
    samplings = [SamplingConfig(temperature=0.7, seed=5 + i) for i in range(3)]
    gen = GenerationConfig(max_new_tokens=20, logprobs=2)
    spec = _spec(method)
    seen = []
    got = sd.generate_batch(prompts, spec=spec, samplings=samplings, gen=gen,
                            on_piece=lambda i, piece, engine: seen.append((i, piece.token_id)))
    assert sd.why_not_batched(spec) is None  # (draft-model: each answer's draft over a cache of its own)
    for p, s, res in zip(prompts, samplings, got):
        alone = sd.generate(p, spec=spec, sampling=s, gen=gen)
        assert res.token_ids == alone.token_ids and res.text == alone.text
        assert res.logprobs == alone.logprobs and res.top_logprobs == alone.top_logprobs
        assert res.prompt_ids == p
    for i, res in enumerate(got):
        assert [t for j, t in seen if j == i] == res.token_ids


@pytest.mark.parametrize("method", ["draft-model", "hybrid"])
def test_draft_model_answers_together_grow_their_draft_caches(sd, method, monkeypatch):
    """Draft-model methods decoded together: each number in a batch drafts over a cache of its
    own (the draft model's weights shared), grown for longer answers; greedy trees under the cost
    rule, every answer its prompt's own."""
    from specdraft import pipeline
    monkeypatch.setattr(pipeline, "DRAFT_PLACE_START", 8)  # (grown at once: every answer needs more)
    monkeypatch.setattr(sd, "_draft_places", [])
    prompts = [sd.encode_prompt(p, chat=False) for p in ("abcabcabd abcab", "hello hello hel", "xyz", "cab cab")]
    spec = SpecConfig(method=method)
    gen = GenerationConfig(max_new_tokens=24)
    got = sd.generate_batch(prompts, spec=spec, samplings=[SamplingConfig()] * len(prompts), gen=gen)
    assert [r.token_ids for r in got] == [sd.generate(p, spec=SpecConfig(method="none"), gen=gen).token_ids
                                          for p in prompts]
    assert len(sd._draft_places) == len(prompts)
    assert all(m.max_length >= len(p) + gen.max_new_tokens for m, p in zip(sd._draft_places, prompts))
    assert all(m.k_cache[0].data_ptr() != sd.draft.model.k_cache[0].data_ptr() for m in sd._draft_places)
    assert sum(r.stats.accepted_tokens for r in got) > 0


def test_a_grown_cache_keeps_its_rows(target):
    """LlamaModel.grow_cache: the rows held stay, the next rows land after them, the logits are
    those of a cache that was long enough from the start."""
    ids = torch.tensor(_prompts((30,), seed=9)[0], dtype=torch.int64)
    whole = target.with_cache(64)
    want = whole.forward(ids).logits
    small = target.with_cache(12)
    first = small.forward(ids[:10]).logits
    small.grow_cache(40)
    assert small.max_length == 40 and small.length == 10
    rest = small.forward(ids[10:]).logits
    assert torch.equal(torch.cat([first, rest]), want)
    small.grow_cache(20)  # (never shrinks)
    assert small.max_length == 40
    with pytest.raises(ValueError, match="RoPE"):
        small.grow_cache(target.max_length + 1)


def _server(sd, **config):
    return tiny_client(sd, spec=SpecConfig(method="prompt-lookup", k=4, ngram_min=1, min_confidence=0.0,
                                           cost_rule=False), **config)


def _streamed(response) -> dict[int, dict]:
    """Each choice's text, finish reason and log-probabilities out of a completions stream."""
    out: dict[int, dict] = {}
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        c = json.loads(line[6:])["choices"][0]
        got = out.setdefault(c["index"], {"text": "", "finish": None, "logprobs": []})
        got["text"] += c["text"]
        got["finish"] = c["finish_reason"] or got["finish"]
        got["logprobs"] += (c.get("logprobs") or {}).get("token_logprobs") or []
    return out


def test_server_decodes_several_choices_together(sd):
    """A list of prompts with n answers each, decoded together: choice i is prompt i // n's
    (i % n)-th answer (seed + j), as generated alone; streamed the same, chunk by chunk."""
    texts = ["abcabcabd abcab", "cab cab ca"]
    body = {"model": "tiny", "prompt": texts, "n": 2, "max_tokens": 10, "temperature": 0.9, "seed": 3, "logprobs": 1}
    spec = SpecConfig(method="prompt-lookup", k=4, ngram_min=1, min_confidence=0.0, cost_rule=False)
    want = []
    for t in texts:
        for j in range(2):
            want.append(sd.generate(sd.encode_prompt(t, chat=False), spec=spec, sampling=SamplingConfig(
                temperature=0.9, seed=3 + j), gen=GenerationConfig(max_new_tokens=10, logprobs=1)))
    assert sd.why_not_batched(spec) is None
    with _server(sd, max_waiting=8, request_timeout=60) as c:
        r = c.post("/v1/completions", json=body).json()
        assert [ch["index"] for ch in r["choices"]] == [0, 1, 2, 3]
        assert [ch["text"] for ch in r["choices"]] == [w.text for w in want]
        assert [ch["logprobs"]["token_logprobs"] for ch in r["choices"]] == [w.logprobs for w in want]
        assert r["usage"]["completion_tokens"] == sum(len(w.token_ids) for w in want)
        assert r["usage"]["prompt_tokens"] == sum(len(sd.encode_prompt(t, chat=False)) for t in texts)
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
            streamed = _streamed(s)
        assert [streamed[i]["text"] for i in range(4)] == [w.text for w in want]
        assert [streamed[i]["logprobs"] for i in range(4)] == [w.logprobs for w in want]
        assert all(streamed[i]["finish"] in ("stop", "length") for i in range(4))
        # the prompts scored alone (max_tokens 0, echo): each choice its prompt's scores
        r = c.post("/v1/completions", json={**body, "max_tokens": 0, "echo": True, "n": 1}).json()
        for ch, t in zip(r["choices"], texts):
            scored = sd.generate(sd.encode_prompt(t, chat=False), spec=spec, gen=GenerationConfig(
                max_new_tokens=0, prompt_logprobs=1))
            assert ch["text"] == t and ch["logprobs"]["token_logprobs"] == [None, *scored.prompt_logprobs]


def test_a_long_prompt_joining_a_servers_session_prefills_in_chunks(sd, monkeypatch):
    """Over HTTP: a request arriving while a session decodes (a request's two choices) joins it,
    its prompt prefilled --prefill-chunk rows a step beside their checks; every answer is the one
    its request gets alone."""
    import threading
    import time

    from specdraft import batch

    forward, chunks, forwards = batch.Batch._forward, [], []

    def slow(self, pieces, answered, asked=None, alone=False):  # (steps long enough for a request to arrive)
        chunks.extend(p for p in pieces if isinstance(p, batch._Prefill) and not alone)
        forwards.append(len(pieces))
        time.sleep(0.03)
        return forward(self, pieces, answered, asked, alone)

    monkeypatch.setattr(batch.Batch, "_forward", slow)
    first = {"model": "tiny", "prompt": "abcabcabd abcab", "n": 2, "max_tokens": 40, "temperature": 0.8, "seed": 1,
             "ignore_eos": True}
    long_text = "the cache holds the rows; " * 4
    joining = {"model": "tiny", "prompt": long_text, "max_tokens": 12, "temperature": 0.0}
    got = {}
    with _server(sd, max_waiting=8, request_timeout=60, prefill_chunk=4) as c:
        t = threading.Thread(target=lambda: got.setdefault("first", c.post("/v1/completions", json=first).json()))
        t.start()
        deadline = time.monotonic() + 30
        while len(forwards) < 3 and time.monotonic() < deadline:  # the session is decoding
            time.sleep(0.01)
        got["joining"] = c.post("/v1/completions", json=joining).json()
        t.join(60)
    spec = SpecConfig(method="prompt-lookup", k=4, ngram_min=1, min_confidence=0.0, cost_rule=False)
    want = [sd.generate(sd.encode_prompt("abcabcabd abcab", chat=False), spec=spec, sampling=SamplingConfig(
        temperature=0.8, seed=1 + j), gen=GenerationConfig(max_new_tokens=40, ignore_eos=True)).text for j in range(2)]
    assert [ch["text"] for ch in got["first"]["choices"]] == want
    assert got["joining"]["choices"][0]["text"] == sd.generate(sd.encode_prompt(long_text, chat=False), spec=spec,
                                                               gen=GenerationConfig(max_new_tokens=12)).text
    assert len(sd.encode_prompt(long_text, chat=False)) > 8 and len(chunks) >= 2  # its prompt went on in chunks


def test_server_choices_together_that_wait_too_long_fail_together(sd):
    with _server(sd, max_waiting=8, request_timeout=0.0) as c:
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "n": 3, "max_tokens": 5})
        assert r.status_code == 429 and "time limit" in r.json()["error"]["message"]


def test_more_answers_than_a_batch_join_as_others_end(sd, monkeypatch):
    """Past MAX_BATCH answers at once, the next joins the batch as soon as one ends (and fits)."""
    from specdraft import pipeline

    monkeypatch.setattr(pipeline, "MAX_BATCH", 2)
    texts = ["abcabcabd abcab", "xyz", "hello hello hel", "ab", "cab cab cab ca"]
    prompts = [sd.encode_prompt(t, chat=False) for t in texts]
    gens = []
    spec = _spec("prompt-lookup")
    got = sd.generate_batch(prompts, spec=spec, samplings=[SamplingConfig()] * 5, gen=GenerationConfig(max_new_tokens=12),
                            on_done=lambda i, r: gens.append(i))
    for p, res in zip(prompts, got):
        assert res.token_ids == sd.generate(p, spec=spec, gen=GenerationConfig(max_new_tokens=12)).token_ids
    assert sorted(gens) == list(range(5))


def test_requests_waiting_together_are_decoded_together(sd):
    """Requests that wait while one runs alone are decoded together once it ends (a session),
    a non-batchable one at the front of the queue waits for the session to drain, and every
    answer is the one its request gets alone."""
    import asyncio
    import functools
    import threading
    import time

    from specdraft.server.generation import GenRequest, decodes_together, run_generation, run_together
    from specdraft.server.worker import Job, Worker

    gate, sessions = threading.Event(), []
    prompts = [sd.encode_prompt(t, chat=False) for t in ("abcabcabd abcab", "xyz xyz", "hello hello hel", "cab ca")]
    gen = GenerationConfig(max_new_tokens=10)
    specs = [_spec("prompt-lookup"), _spec("none"), _spec("prompt-lookup"), _spec("self-draft")]
    samplings = [SamplingConfig(temperature=0.8, seed=i) for i in range(4)]

    def alone(job):
        gate.wait(10)  # the first request holds the worker until the others wait
        return run_generation(sd, job)

    def together(job, take):
        taken = [job]
        sessions.append(taken)
        run_together(sd, job, lambda fits: taken.append(take(fits)) or taken[-1], 4096)

    async def main():
        loop = asyncio.get_running_loop()
        w = Worker(alone, together=functools.partial(decodes_together, sd), run_together=together)
        jobs = [Job(GenRequest(p, s, x, gen), loop, deadline=time.monotonic() + 60) for p, s, x in
                zip([prompts[0], *prompts], [specs[0], *specs], [samplings[0], *samplings])]
        try:
            for j in jobs:
                w.submit(j)
                await asyncio.sleep(0.05)
            gate.set()
            out = []
            for j in jobs:
                pieces = []
                while (ev := await asyncio.wait_for(j.events.get(), 30))[0] != "done":
                    assert ev[0] == "piece", ev
                    pieces.append(ev[1][0].token_id)
                out.append(pieces)
            return out
        finally:
            w.close()

    got = asyncio.run(main())
    # the first ran alone; the next three (the queue's front, batchable) together; self-draft alone after
    assert [[j.request.spec.method for j in s if j is not None] for s in sessions] == \
        [["prompt-lookup", "none", "prompt-lookup"]]
    for ids, p, s, x in zip(got, [prompts[0], *prompts], [specs[0], *specs], [samplings[0], *samplings]):
        assert ids == sd.generate(p, spec=s, sampling=x, gen=gen).token_ids


def test_answers_together_find_and_leave_the_servers_prefixes(sd, tmp_path):
    """With a prefix cache (the server's), an answer decoded together starts from the held copy
    that covers most of its prompt (here: a conversation the target's own cache held), and leaves
    a copy of its own conversation, which a later request alone continues; every answer is the
    one a whole prefill gives."""
    d = sd.target.path
    kept = Speculator(str(d), dtype="fp32", target_format="q4k", max_length=256, load_draft=False, progress=False,
                      reuse_prefix=True)
    kept.prefix.min_cut = 8  # (tiny prompts)
    spec, gen = _spec("prompt-lookup"), GenerationConfig(max_new_tokens=12)
    first = sd.encode_prompt("abcabcabd abcab", chat=False)
    a = kept.generate(first, spec=spec, gen=gen)  # alone: the target's own cache holds it after
    follow = first + a.token_ids + sd.encode_prompt(" cab cab", chat=False)
    other = sd.encode_prompt("hello hello hel", chat=False)
    got = kept.generate_batch([follow, other], spec=spec, samplings=[SamplingConfig()] * 2, gen=gen)
    assert got[0].stats.cached_prompt_tokens == len(first) + len(a.token_ids) - 1
    assert got[1].stats.cached_prompt_tokens == 0
    for p, res in zip((follow, other), got):
        assert res.token_ids == sd.generate(p, spec=spec, gen=gen).token_ids
    then = other + got[1].token_ids + sd.encode_prompt(" xyz", chat=False)
    alone = kept.generate(then, spec=spec, gen=gen)  # finds the copy the batched answer left
    assert alone.stats.cached_prompt_tokens == len(other) + len(got[1].token_ids) - 1
    assert alone.token_ids == sd.generate(then, spec=spec, gen=gen).token_ids


@pytest.fixture(scope="module")
def batch_client(sd):
    from fastapi.testclient import TestClient

    from specdraft.server.app import ServerConfig, create_app

    app = create_app(sd, ServerConfig(model_name="tiny", max_waiting=8, request_timeout=30,
                                      spec=SpecConfig(method="prompt-lookup", k=4)))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.fixed_dictionaries({"model": st.just("tiny"), "prompt": st.text(min_size=1, max_size=12)
                                   | st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3)
                                   | st.lists(st.integers(0, 95), min_size=1, max_size=4)}, optional={
    "n": st.integers(1, 3), "stream": st.booleans(), "echo": st.booleans(), "logprobs": st.integers(0, 2),
    "max_tokens": st.integers(0, 6), "temperature": st.sampled_from([0, 0.8]), "seed": st.integers(0, 5),
    "method": st.sampled_from(["none", "prompt-lookup", "suffix", "draft-model"]),
    "stop": st.lists(st.text(max_size=2), max_size=2)}))
def test_fuzzed_choices_decoded_together_end_well(batch_client, body):
    """Several choices on the native runtime (decoded together, or one after another for
    draft-model): no 5xx, every stream ends, a whole answer has a choice per prompt and n."""
    r = batch_client.post("/v1/completions", json=body)
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert "message" in r.json()["error"]
    elif body.get("stream"):
        assert r.text.rstrip().endswith("data: [DONE]") or '"error"' in r.text, (body, r.text)
    else:
        prompt = body.get("prompt")
        prompts = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) else 1
        assert len(r.json()["choices"]) == prompts * body.get("n", 1)


def test_a_restored_prefix_takes_only_the_rows_kept(target):
    """PrefixCache.prepare restores the part of a saved copy its prompt keeps: the target's own
    cache and a batch's view both take just those rows (a long copy never overfills a batch)."""
    target.reset()
    target.forward(torch.arange(1, 9))
    saved = target.snapshot()  # 8 rows
    target.reset()
    target.restore(saved, 3)
    assert target.length == 3 and torch.equal(target.k_cache[0][:, :3], saved[0][0][:, :3])
    batch = Batch(target, 5, ForwardCosts())  # room for 5 slots: the whole copy would not fit
    view = batch.view()
    view.restore(saved, 3)
    assert view.length == 3 and view.slots == [0, 1, 2] and batch.model.length == 3
    assert torch.equal(batch.model.k_cache[1][:, :3], saved[0][1][:, :3])
    target.reset()
