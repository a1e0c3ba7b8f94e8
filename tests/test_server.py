"""The OpenAI-compatible server on a tiny model: the official client, streaming, errors, load, fuzzing.

A live uvicorn server on 127.0.0.1 (a free port) serves the openai client and the load test;
the fuzzing goes through the in-process test client. The scheduler's queue rules are tested on
:class:`Worker` directly with a run function that blocks on demand.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tiny import make_cli_model
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.pipeline import Speculator
from specdraft.server.app import ServerConfig, create_app
from specdraft.server.worker import Job, Outcome, QueueFull, TimedOut, Worker

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

MODEL = "tiny"
QUESTION = "abcabcabd abcab"


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    d = make_cli_model(tmp_path_factory.mktemp("srv") / "tiny")
    return Speculator(str(d), str(d), dtype="fp32", target_format="w8a8", draft_format="w8a8", max_length=256,
                      progress=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(sd):
    """A live server; yields its base URL."""
    # cost_rule off: a tiny model's forward times would let the cost rule cut every draft, and a
    # test that needs draft tokens must not depend on how fast this CPU is
    app = create_app(sd, ServerConfig(model_name=MODEL, spec=SpecConfig(method="draft-model", k=4, min_confidence=0.0,
                                                                        cost_rule=False),
                                      max_waiting=64, request_timeout=60))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    assert srv.started
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def expected(sd, method="none", max_new_tokens=24, **sampling) -> str:
    ids = sd.encode_messages([{"role": "user", "content": QUESTION}])
    res = sd.generate(ids, spec=SpecConfig(method=method, k=4, min_confidence=0.0),
                      sampling=SamplingConfig(**sampling), gen=GenerationConfig(max_new_tokens=max_new_tokens))
    return res.text


# ------------------------------------------------------------------------------ the official client
def test_chat_greedy_equals_plain_decoding(client, sd):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=24, temperature=0)
    assert r.choices[0].message.content == expected(sd)
    assert r.choices[0].finish_reason in ("length", "stop")
    usage = r.usage.model_dump()
    assert usage["completion_tokens"] <= 24 and usage["prompt_tokens"] > 0
    spec = usage["speculation"]
    assert spec["method"] == "draft-model" and spec["draft_tokens"] > 0
    assert spec["mean_accepted_tokens"] >= 1.0


def test_streamed_text_equals_plain_text_for_a_seed(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0.9,
              top_p=0.95, seed=7)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts, usage = [], None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(parts) == whole
    assert usage is not None and usage.completion_tokens > 0


def test_completions_plain_and_streaming(client, sd):
    r = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=16, temperature=0, extra_body={"method": "none"})
    ids = sd.encode_prompt(QUESTION, chat=False)
    want = sd.generate(ids, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=16)).text
    assert r.choices[0].text == want
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=QUESTION, max_tokens=16, temperature=0, stream=True, extra_body={"method": "prompt-lookup"}))
    assert streamed == want


def _plain_logprobs(sd, top: int, chat: bool = True, n: int = 16):
    """Plain decoding's tokens and log-probabilities (the target's own, no drafter)."""
    ids = sd.encode_messages([{"role": "user", "content": QUESTION}]) if chat else sd.encode_prompt(QUESTION, chat=False)
    return sd.generate(ids, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=n, logprobs=top))


def test_chat_logprobs_are_plain_decodings(client, sd):
    """A speculative answer's log-probabilities are the target's, as plain decoding gives them (up
    to rounding: this server's draft-model trees are checked through torch's attention over a
    tree mask, test_engine_tiny), each token's and its top alternatives, named by their bytes;
    streamed chunk by chunk, the same numbers."""
    from specdraft.models.token_bytes import TokenBytes

    want = _plain_logprobs(sd, 3)
    spell = TokenBytes(sd.tokenizer)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, temperature=0,
              logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    assert r.usage.model_dump()["speculation"]["accepted_tokens"] > 0  # guesses were taken
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(want.logprobs, rel=1e-5, abs=1e-6)
    assert [[t.token for t in c.top_logprobs] for c in content] == \
        [[spell.text(i) for i, _ in top] for top in want.top_logprobs]
    assert [[t.logprob for t in c.top_logprobs] for c in content] == \
        [pytest.approx([lp for _, lp in top], rel=1e-5, abs=1e-6) for top in want.top_logprobs]
    assert [c.token for c in content] == [spell.text(i) for i in want.token_ids]
    assert b"".join(bytes(c.bytes) for c in content).decode() == r.choices[0].message.content == want.text
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(c.token, c.logprob, c.top_logprobs) for c in streamed] == [(c.token, c.logprob, c.top_logprobs)
                                                                      for c in content]
    # none asked: none given
    assert client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None}).choices[0].logprobs is None


def test_completion_logprobs_legacy_form(client, sd):
    want = _plain_logprobs(sd, 2, chat=False)
    r = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=16, temperature=0, logprobs=2,
                                  extra_body={"method": "prompt-lookup"})
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == want.logprobs
    assert "".join(lp.tokens) == r.choices[0].text == want.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) == 2 and max(top.values()) >= lp.token_logprobs[i] for i, top in enumerate(lp.top_logprobs))
    assert r.choices[0].logprobs is not None
    plain = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_penalties_are_applied_as_in_the_library(client, sd):
    """OpenAI's frequency / presence penalties and vLLM's repetition penalty reach the engine: the
    server's speculative answer is the library's plain one under the same penalties (and not
    the unpenalised one)."""
    penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0)
    r = client.chat.completions.create(**kw, **penalties, extra_body={"repetition_penalty": 1.2})
    want = expected(sd, **penalties, repetition_penalty=1.2)
    assert r.choices[0].message.content == want != expected(sd)
    # logit_bias: a token banned from the greedy answer
    first = sd.tokenizer(want[:1], add_special_tokens=False)["input_ids"][0]
    r = client.chat.completions.create(**kw, logit_bias={str(first): -100})
    assert r.choices[0].message.content == expected(sd, logit_bias={first: -100.0}) and not \
        r.choices[0].message.content.startswith(want[:1])
    # min-p (vLLM's field) reaches the sampler too: a seeded plain answer is the library's
    r = client.chat.completions.create(**{**kw, "temperature": 1.0, "seed": 3}, extra_body={"min_p": 0.3, "method": "none"})
    assert r.choices[0].message.content == expected(sd, temperature=1.0, seed=3, min_p=0.3) != \
        expected(sd, temperature=1.0, seed=3)


def test_completion_echo_scores_the_prompt_as_lm_eval_asks(server, client, sd):
    """lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens 0 (or
    1): the prompt's text and its tokens' log-probabilities (the first null), as the library's
    prefill scores them; streamed, the prompt's chunk first."""
    ids = sd.encode_prompt(QUESTION, chat=False)
    want = sd.generate(ids, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=0, prompt_logprobs=1))
    r = client.completions.create(model=MODEL, prompt=[ids], max_tokens=0, temperature=0, logprobs=1, echo=True)
    c = r.choices[0]  # ([ids]: a batch of one, as lm-evaluation-harness sends it)
    assert c.text == sd.tokenizer.decode(ids) and c.finish_reason == "length" and r.usage.completion_tokens == 0
    assert c.logprobs.token_logprobs == [None, *want.prompt_logprobs] and c.logprobs.top_logprobs[0] is None
    assert len(c.logprobs.tokens) == len(ids) and all(len(t) == 1 for t in c.logprobs.top_logprobs[1:])
    # max_tokens 1: the prompt's entries, then the completion's one
    r = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=3, temperature=0, logprobs=2, echo=True)
    c, gen = r.choices[0], _plain_logprobs(sd, 2, chat=False, n=3)
    assert c.text == QUESTION + gen.text
    assert c.logprobs.token_logprobs == [None, *want.prompt_logprobs, *gen.logprobs]
    assert c.logprobs.text_offset == [sum(len(t) for t in c.logprobs.tokens[:i]) for i in range(len(c.logprobs.tokens))]
    streamed = list(client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=3, temperature=0, logprobs=2,
                                              echo=True, stream=True))
    assert streamed[0].choices[0].text == QUESTION and "".join(x.choices[0].text for x in streamed) == c.text
    assert [lp for x in streamed if x.choices[0].logprobs for lp in x.choices[0].logprobs.token_logprobs] == \
        c.logprobs.token_logprobs
    # echo alone: the text, no scores; with max_tokens 0 the prompt alone, streamed too
    r = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=3, temperature=0, echo=True)
    assert r.choices[0].text == QUESTION + gen.text and r.choices[0].logprobs is None
    for stream in (False, True):
        got = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=0, echo=True, stream=stream)
        chunks = list(got) if stream else [got]
        assert "".join(x.choices[0].text for x in chunks) == QUESTION
        assert all(x.choices[0].logprobs is None for x in chunks)
    bad = post(server, "/v1/completions", json.dumps({"prompt": QUESTION, "max_tokens": 0}))
    assert bad.status_code == 400 and "echo" in bad.json()["error"]["message"]
    for refused in ({"suffix": "x"}, {"best_of": 2}):  # asked for, not done: refused, never ignored
        bad = post(server, "/v1/completions", json.dumps({"prompt": QUESTION, "max_tokens": 2, **refused}))
        assert bad.status_code == 400 and "not supported" in bad.json()["error"]["message"]


def test_tokenizer_endpoints(server, sd):
    """vLLM's /tokenize, /detokenize and /tokenizer_info, as lm-evaluation-harness's remote tokenizer
    calls them: the served tokenizer's ids, text and special tokens; bad bodies are 400s."""
    r = httpx.post(server + "/tokenize", json={"prompt": QUESTION, "add_special_tokens": False}).json()
    assert r["tokens"] == sd.tokenizer(QUESTION, add_special_tokens=False)["input_ids"] and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == sd.target.model.max_length
    chat = httpx.post(server + "/tokenize", json={"messages": [{"role": "user", "content": QUESTION}]}).json()
    assert chat["tokens"] == sd.encode_messages([{"role": "user", "content": QUESTION}])
    back = httpx.post(server + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == QUESTION
    info = httpx.get(server + "/tokenizer_info").json()
    assert info["eos_token"] == sd.tokenizer.eos_token and info["model_max_length"] == sd.target.model.max_length
    for path, body in [("/tokenize", {}), ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}),
                       ("/tokenize", {"prompt": 5}), ("/detokenize", {"tokens": [10**9]}), ("/detokenize", {"tokens": "a"}),
                       ("/tokenize", {"messages": [{"role": "user", "content": "a"}], "add_generation_prompt": False})]:
        bad = httpx.post(server + path, json=body)
        assert bad.status_code == 400 and bad.json()["error"]["message"], (path, body, bad.text)


def test_several_prompts_and_answers_are_choices_in_order(client, sd):
    """A list of prompts (lm-evaluation-harness batches) and n answers each: choice i is prompt
    i // n's (i % n)-th answer, generated one after another, the j-th sampled with seed + j; usage
    counts each prompt once."""
    texts = [QUESTION, "cab cab ca"]
    r = client.completions.create(model=MODEL, prompt=texts, max_tokens=8, temperature=0)
    for choice, text in zip(r.choices, texts, strict=True):
        ids = sd.encode_prompt(text, chat=False)
        assert choice.text == sd.generate(ids, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=8)).text
        assert len(choice.model_dump()["origins"]) >= 1
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == sum(len(sd.encode_prompt(t, chat=False)) for t in texts)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=1.0, seed=11,
              extra_body={"method": "none"})
    r = client.chat.completions.create(n=3, **kw)
    assert [c.message.content for c in r.choices] == [expected(sd, max_new_tokens=12, temperature=1.0, seed=11 + j)
                                                      for j in range(3)]
    assert r.usage.prompt_tokens == len(sd.encode_messages([{"role": "user", "content": QUESTION}]))
    assert r.usage.completion_tokens == sum(len(c.model_dump()["origins"]) for c in r.choices)
    # streamed: the same choices, one after another, each chunk with its index, one usage at the end
    texts, usage = {}, None
    for chunk in client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        usage = chunk.usage or usage
    assert [texts[j] for j in range(3)] == [c.message.content for c in r.choices]
    assert usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens
    streamed = list(client.completions.create(model=MODEL, prompt=["abc", "cab"], max_tokens=4, temperature=0, echo=True,
                                              logprobs=1, stream=True))
    by_index = {}
    for chunk in streamed:
        by_index.setdefault(chunk.choices[0].index, []).append(chunk.choices[0])
    whole = client.completions.create(model=MODEL, prompt=["abc", "cab"], max_tokens=4, temperature=0, echo=True,
                                      logprobs=1)
    for c in whole.choices:
        assert "".join(x.text for x in by_index[c.index]) == c.text
        assert [lp for x in by_index[c.index] if x.logprobs for lp in x.logprobs.token_logprobs] == \
            c.logprobs.token_logprobs


def test_stop_string_ends_the_text(client, sd):
    full = expected(sd)
    stop = full[3:5]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].message.content == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-9")
    h = httpx.get(server + "/health").json()
    assert h["status"] == "ok" and "draft-model" in h["methods"] and h["default_method"] == "draft-model"
    text = httpx.get(server + "/metrics").text
    assert 'specdraft_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    assert "specdraft_time_to_first_token_seconds_bucket" in text
    assert "specdraft_mean_accepted_tokens" in text and "specdraft_acceptance_rate" in text
    page = httpx.get(server + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"] and "specdraft" in page.text


def test_ignore_eos_runs_to_the_token_limit(client, sd):
    """vLLM's extension field: the request's generation goes past EOS, up to max_tokens."""
    from specdraft.server.generation import build_request
    from specdraft.server.schemas import ChatRequest

    config = ServerConfig(model_name=MODEL)
    for ignore in (False, True):
        body = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=9, ignore_eos=ignore)
        assert build_request(body, [1, 2], config, sd).gen.ignore_eos is ignore
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=20,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 20 and r.choices[0].finish_reason == "length"


def test_stream_chunks_carry_token_origins(server):
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12, "temperature": 0, "stream": True}
    origins = []
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                origins += json.loads(line[6:])["origins"]
    assert len(origins) == 12 and set(origins) <= {"draft", "target"} and "draft" in origins


# ------------------------------------------------------------------------------ errors
def post(server, path, content, headers=None):
    return httpx.post(server + path, content=content, headers={"content-type": "application/json", **(headers or {})},
                      timeout=30)


GOOD = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("body, status, param", [
    ("{not json", 400, None),
    ({}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ({**GOOD, "temperature": -1}, 400, "temperature"),
    ({**GOOD, "temperature": "hot"}, 400, "temperature"),
    ({**GOOD, "top_p": 0}, 400, "top_p"),
    ({**GOOD, "top_k": -3}, 400, "top_k"),
    ({**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": "4"}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": 100000}, 400, "max_tokens"),
    ({**GOOD, "n": 65}, 400, "n"),
    ({**GOOD, "seed": -1}, 400, "seed"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({**GOOD, "logprobs": 3}, 400, "logprobs"),  # chat's is a bool; completions' an int
    ({**GOOD, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ({**GOOD, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs"),
    ({**GOOD, "top_logprobs": 2}, 400, None),  # without logprobs: true
    ({**GOOD, "min_p": 1.5}, 400, "min_p"),
    ({**GOOD, "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ({**GOOD, "logit_bias": {"5": 150}}, 400, "logit_bias"),
    ({**GOOD, "logit_bias": {"100000000": 5}}, 400, "logit_bias"),
    ({**GOOD, "response_format": {"type": "json_object"}}, 400, "response_format"),  # (this tokenizer: not byte-level)
    ({**GOOD, "response_format": {"type": "xml"}}, 400, None),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({**GOOD, "frequency_penalty": 2.5}, 400, "frequency_penalty"),
    ({**GOOD, "presence_penalty": -3}, 400, "presence_penalty"),
    ({**GOOD, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({**GOOD, "method": "crystal-ball"}, 400, "method"),
    ({**GOOD, "k": 0}, 400, "k"),
    ({**GOOD, "ignore_eos": "yes"}, 400, "ignore_eos"),
    ({**GOOD, "model": "gpt-7"}, 404, "model"),
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    r = post(server, "/v1/chat/completions", body if isinstance(body, str) else json.dumps(body))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param


def test_bad_completion_prompts(server):
    for prompt in ([], [10**9], None, [[1, 2], []], [[]], [[10**9]], [["a"]], ["a"] * 65):
        r = post(server, "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 2}))
        assert r.status_code == 400, (prompt, r.text)


def test_oversized_bodies_get_413(server):
    big = json.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * (2 << 20)}]})
    assert post(server, "/v1/chat/completions", big).status_code == 413

    def chunks():  # no content-length: counted as it arrives
        for _ in range(40):
            yield b" " * 65536
    r = httpx.post(server + "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.get(server + "/health").json()["status"] == "ok"


def test_unknown_route_is_a_json_404(server):
    r = httpx.get(server + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


# ------------------------------------------------------------------------------ load
def test_concurrent_clients_some_disconnecting(server, sd):
    want = expected(sd, max_new_tokens=16)
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16, "temperature": 0}

    async def one_client(i: int, ac: httpx.AsyncClient) -> list[str]:
        got = []
        for j in range(5):
            if (i + j) % 4 == 3:  # leave mid-stream after the first chunks
                async with ac.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    n = 0
                    async for line in r.aiter_lines():
                        n += line.startswith("data: ")
                        if n >= 3:
                            break
                continue
            r = await ac.post("/v1/chat/completions", json={**body, "stream": j % 2 == 0})
            assert r.status_code == 200, r.text
            if j % 2 == 0:
                text = "".join(json.loads(ln[6:])["choices"][0]["delta"].get("content") or ""
                               for ln in r.text.splitlines() if ln.startswith("data: {"))
            else:
                text = r.json()["choices"][0]["message"]["content"]
            got.append(text)
        return got

    async def main():
        async with httpx.AsyncClient(base_url=server, timeout=120) as ac:
            return await asyncio.gather(*(one_client(i, ac) for i in range(8)))

    results = asyncio.run(main())
    texts = [t for r in results for t in r]
    assert len(texts) == 30 and all(t == want for t in texts)
    h = httpx.get(server + "/health").json()
    assert h["status"] == "ok"
    for _ in range(100):  # abandoned streams stop within a step
        if not h["running"] and h["waiting"] == 0:
            break
        time.sleep(0.05)
        h = httpx.get(server + "/health").json()
    assert not h["running"] and h["waiting"] == 0


# ------------------------------------------------------------------------------ the scheduler
class Blocking:
    """A run function that holds the worker until released."""

    def __init__(self):
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, job: Job) -> Outcome:
        self.started.set()
        while not self.release.is_set() and not job.stopped:
            time.sleep(0.01)
        return Outcome(stats=None, finish_reason="length" if job.stopped else "stop")


def with_worker(test) -> None:
    """Run ``async test(worker, run, loop)`` against a fresh Worker (2 waiting places) over Blocking."""
    async def main():
        run = Blocking()
        w = Worker(run, max_waiting=2)
        try:
            await test(w, run, asyncio.get_running_loop())
        finally:
            w.close()

    asyncio.run(main())


def test_worker_queue_bound_cancel_and_deadline():
    async def test(w, run, loop):
        first = Job("a", loop, deadline=time.monotonic() + 30)
        w.submit(first)
        await asyncio.to_thread(run.started.wait, 5)
        waiting = [Job(x, loop, deadline=time.monotonic() + 30) for x in "bc"]
        for j in waiting:
            w.submit(j)
        with pytest.raises(QueueFull):
            w.submit(Job("d", loop, deadline=time.monotonic() + 30))
        w.cancel(waiting[0])  # a client that left frees its place at once
        assert w.waiting == 1
        late = Job("e", loop, deadline=time.monotonic() + 0.05)
        w.submit(late)
        await asyncio.sleep(0.2)
        run.release.set()
        kind, outcome = await asyncio.wait_for(first.events.get(), 5)
        assert kind == "done" and outcome.finish_reason == "stop"
        kind, _ = await asyncio.wait_for(waiting[1].events.get(), 5)
        assert kind == "done"
        kind, err = await asyncio.wait_for(late.events.get(), 5)
        assert kind == "error" and isinstance(err, TimedOut)
        assert waiting[0].events.empty()

    with_worker(test)


def test_a_running_job_stops_when_cancelled():
    async def test(w, run, loop):
        job = Job("a", loop, deadline=time.monotonic() + 30)
        w.submit(job)
        await asyncio.to_thread(run.started.wait, 5)
        w.cancel(job)
        kind, outcome = await asyncio.wait_for(job.events.get(), 5)
        assert kind == "done" and outcome.finish_reason == "length"

    with_worker(test)


# ------------------------------------------------------------------------------ fuzzing
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
                       | st.text(max_size=8),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                       max_leaves=6)
FIELDS = {
    "model": st.sampled_from([MODEL, "other", None, 3]),
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "bad", 1]),
                                                "content": st.text(max_size=20) | JSONISH}), max_size=3) | JSONISH,
    "prompt": st.text(max_size=20) | st.lists(st.integers(-5, 300), max_size=5)
    | st.lists(st.lists(st.integers(-5, 300), max_size=4) | st.text(max_size=6), max_size=3) | JSONISH,
    "max_tokens": st.integers(-2, 6) | st.sampled_from([10**6, None, "3", 2.5]),
    "temperature": st.floats(-1, 3, allow_nan=False) | JSONISH,
    "top_p": st.floats(-0.5, 1.5, allow_nan=False) | JSONISH,
    "top_k": st.integers(-3, 50) | JSONISH,
    "seed": st.integers(-3, 2**64) | JSONISH,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=5) | JSONISH,
    "n": st.integers(-1, 3),
    "stream": st.booleans() | JSONISH,
    "stream_options": JSONISH,
    "method": st.sampled_from(["none", "draft-model", "prompt-lookup", "hybrid", "x", ""]) | JSONISH,
    "k": st.integers(-1, 70) | JSONISH,
    "logprobs": st.booleans() | st.integers(-1, 22) | JSONISH,
    "top_logprobs": st.integers(-1, 22) | JSONISH,
    "echo": st.booleans() | JSONISH,
    "min_p": st.floats(-0.5, 1.5, allow_nan=False) | JSONISH,
    "frequency_penalty": st.floats(-3, 3, allow_nan=False) | JSONISH,
    "presence_penalty": st.floats(-3, 3, allow_nan=False) | JSONISH,
    "repetition_penalty": st.floats(-1, 12, allow_nan=False) | JSONISH,
    "add_special_tokens": st.booleans() | JSONISH,
    "tokens": st.lists(st.integers(-5, 300), max_size=5) | JSONISH,
    "logit_bias": st.dictionaries(st.sampled_from(["1", "5", "-2", "x", "999999"]), st.floats(-200, 200, allow_nan=False),
                                  max_size=3) | JSONISH,
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"},
                                        {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}]) | JSONISH,
    "structured_outputs": st.fixed_dictionaries({}, optional={"json": JSONISH, "regex": st.text(max_size=6),
                                                              "choice": JSONISH, "grammar": st.text(max_size=12)}) | JSONISH,
    "guided_json": JSONISH,
    "guided_regex": st.text(max_size=8) | JSONISH,
    "guided_choice": st.lists(st.text(max_size=4), max_size=3) | JSONISH,
    "tools": JSONISH,
    "suffix": JSONISH,
    "best_of": st.integers(-1, 3) | JSONISH,
}


@pytest.fixture(scope="module")
def test_client(sd):
    from fastapi.testclient import TestClient

    app = create_app(sd, ServerConfig(model_name=MODEL, max_waiting=8, request_timeout=30))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]),
       body=st.fixed_dictionaries({}, optional=FIELDS) | JSONISH)
def test_fuzzed_requests_never_get_a_5xx(test_client, path, body):
    r = test_client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert "message" in r.json()["error"]
    elif "text/event-stream" in r.headers.get("content-type", ""):  # a stream that ran to its end
        assert r.text.rstrip().endswith("data: [DONE]") or '"error"' in r.text, (body, r.text)


def test_openapi_spec_lists_the_endpoints(test_client):
    paths = test_client.get("/openapi.json").json()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(paths)


# ------------------------------------------------------------------------------ bench --endpoint
def test_bench_times_an_openai_endpoint(server, tmp_path, capsys):
    from specdraft.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [QUESTION[:8 + i]]})
                                 for i, c in enumerate(["a", "a", "b"])) + "\n")
    out = tmp_path / "r.json"
    assert main(["bench", "--endpoint", server + "/v1", "--prompts", str(prompts), "--max-new-tokens", "6",
                 "--json", str(out), "--endpoint-name", "ours"]) == 0
    report = json.loads(out.read_text())
    rows = {(r["method"], r["category"]): r for r in report["results"]}
    assert set(rows) == {("ours", "a"), ("ours", "b"), ("ours", "overall")}
    o = rows[("ours", "overall")]
    assert o["prompts"] == 3 and 3 <= o["new_tokens"] <= 18 and o["tokens_per_s"] > 0 and o["ttft_s"] > 0
    assert o["mean_accepted_tokens"] >= 1.0  # our server reports its speculation
    assert o["new_tokens"] == sum(p["new_tokens"] for p in report["prompts"])
    # three requests in flight at once: every prompt timed, in order, and the run's throughput
    assert main(["bench", "--endpoint", server + "/v1", "--prompts", str(prompts), "--max-new-tokens", "6",
                 "--json", str(out), "--endpoint-name", "ours", "--concurrency", "3"]) == 0
    report = json.loads(out.read_text())
    o = report["results"][-1]
    assert report["config"]["concurrency"] == 3 and [p["question_id"] for p in report["prompts"]] == [0, 1, 2]
    assert o["throughput_tokens_per_s"] == pytest.approx(o["new_tokens"] / o["wall_s"])
    assert 0 < o["latency_p50_s"] <= o["latency_p90_s"] and o["wall_s"] <= o["seconds"] + 1.0
    assert main(["bench", "--endpoint", server + "/v1", "--prompts", str(prompts), "--concurrency", "0"]) == 2


def test_bench_samples_at_an_endpoint_with_the_settings_in_the_report(server, tmp_path, capsys):
    from specdraft.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "a", "turns": [QUESTION[:12]]}) + "\n")
    out = tmp_path / "r.json"
    assert main(["bench", "--endpoint", server + "/v1", "--prompts", str(prompts), "--max-new-tokens", "6",
                 "--json", str(out), "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--seed", "2",
                 "--ignore-eos"]) == 0
    report = json.loads(out.read_text())  # our server took top_k, the prompt's seed and ignore_eos
    s = report["config"]["sampling"]
    assert (s["temperature"], s["top_p"], s["top_k"], s["seed"], s["greedy"]) == (0.7, 0.9, 5, 2, False)
    assert report["config"]["ignore_eos"] is True
    assert report["results"][-1]["new_tokens"] == 6 and report["results"][-1]["exact_match_rate"] is None


def test_bench_endpoint_unreachable_is_one_line(tmp_path, capsys):
    from specdraft.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["hi"]}) + "\n")
    code = main(["bench", "--endpoint", f"http://127.0.0.1:{_free_port()}/v1", "--prompts", str(prompts),
                 "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code != 0 and "is the server running?" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ the chat page, in a browser
def _browser():
    """Headless Chromium through selenium, or None where either is missing (Debian: chromium,
    chromium-driver)."""
    import shutil

    driver_path = shutil.which("chromedriver")
    if driver_path is None or (shutil.which("chromium") or shutil.which("chromium-browser")) is None:
        return None
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,900"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver_path), options=opts)


def test_chat_page_streams_coloured_tokens_and_figures(server, sd, tmp_path):
    import os

    driver = _browser()
    if driver is None:
        pytest.skip("headless Chromium (Debian chromium + chromium-driver) or selenium is not installed")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    try:
        driver.get(server + "/")
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: len(Select(d.find_element(By.ID, "method")).options) >= 3)
        Select(driver.find_element(By.ID, "method")).select_by_value("draft-model")
        box = driver.find_element(By.ID, "question")
        box.clear()
        box.send_keys(QUESTION)
        for field, value in (("max", "12"), ("temp", "0")):
            el = driver.find_element(By.ID, field)
            el.clear()
            el.send_keys(value)
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.ID, "ntok").text == "12" and d.find_element(By.ID, "send").is_enabled())
        spans = driver.find_elements(By.CSS_SELECTOR, "#answer span")
        assert len(spans) == 12 and {s.get_attribute("class") for s in spans} <= {"draft", "target"}
        assert any(s.get_attribute("class") == "draft" for s in spans)
        assert float(driver.find_element(By.ID, "tps").text) > 0
        assert float(driver.find_element(By.ID, "mal").text) >= 1.0
        assert driver.find_element(By.ID, "acc").text.endswith("%")
        shown = driver.execute_script("return document.getElementById('answer').textContent")
        assert shown == expected(sd, method="draft-model", max_new_tokens=12)
        shot = os.environ.get("SPECDRAFT_SCREENSHOT")
        driver.save_screenshot(shot or str(tmp_path / "page.png"))
    finally:
        driver.quit()


def test_a_session_counts_only_the_requests_still_generating():
    async def test(w, run, loop):
        jobs = [Job(x, loop, deadline=time.monotonic() + 30) for x in "ab"]
        w.running = list(jobs)  # as a session holds them
        assert w.generating == 2
        jobs[0].emit("done", Outcome(stats=None, finish_reason="stop"))
        assert w.generating == 1 and jobs[0].ended and not jobs[1].ended
        jobs[1].emit("error", RuntimeError("x"))
        assert w.generating == 0
        w.running = []

    with_worker(test)


def test_an_api_key_guards_the_v1_routes(sd):
    """serve --api-key: /v1/ answers 401 without the key (or with another), as OpenAI does, and
    as usual with it; /health, /metrics and the page stay open."""
    from _tiny import tiny_client

    with tiny_client(sd, api_key="s3cret") as c:
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.post("/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.get("/v1/models").status_code == 401
        assert c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert all(c.get(path).status_code == 200 for path in ("/health", "/metrics", "/"))
        keyed = openai.OpenAI(base_url="http://testserver/v1", api_key="s3cret", http_client=c, max_retries=0)
        assert keyed.chat.completions.create(model=MODEL, max_tokens=4, **{k: v for k, v in body.items()
                                                                           if k == "messages"}).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url="http://testserver/v1", api_key="other", http_client=c,
                          max_retries=0).models.list()
        assert 'status="401"' in c.get("/metrics").text
