"""Tool calling (server.tools): OpenAI's tools / tool_choice over a chat template that takes tools;
calls held to their format where asked for, parsed out of the answer, streamed as tool_calls."""
from __future__ import annotations

import json

import pytest

from _tiny import NOOP, WEATHER, make_cli_model, tiny_client, tools_speculator
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.grammar import check
from specdraft.pipeline import Speculator
from specdraft.server import tools
from specdraft.server.tools import CallStream, Function, Tool, call_format, forced_names, parse_calls

USER = [{"role": "user", "content": "weather in paris for 3 days"}]


def _tools(*ts) -> list[Tool]:
    return [Tool.model_validate(t) for t in ts]


# ------------------------------------------------------------------------------ parsing, formats
def test_calls_are_parsed_out_of_tagged_blocks_and_bare_json():
    names = {"get_weather", "noop"}
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris", "days": 3}}\n</tool_call>\n'
            '<tool_call>\n{"name": "noop", "arguments": "{}"}\n</tool_call>\n<tool_call>\n{not json}\n</tool_call>')
    rest, calls = parse_calls(text, names)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "noop"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "paris", "days": 3}
    assert calls[1]["function"]["arguments"] == "{}"  # (arguments written as a JSON text)
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert rest.strip().startswith("Let me look.") and "{not json}" in rest  # what does not parse stays text
    # a call to a function not among the tools is text
    assert parse_calls('<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>', names)[1] == []
    # an answer that is only a call's JSON, bare or fenced (or a list of calls)
    for bare in ('{"name": "noop", "arguments": {}}', '```json\n{"name": "noop", "arguments": {}}\n```',
                 '[{"name": "noop"}, {"name": "get_weather", "arguments": {"city": "x", "days": 1}}]'):
        rest, calls = parse_calls(bare, names)
        assert rest == "" and calls and calls[0]["function"]["name"] == "noop", bare
    assert parse_calls('{"name": "noop", "arguments": [1]}', names)[1] == []
    assert parse_calls('{"answer": 4}', names) == ('{"answer": 4}', [])


@pytest.mark.parametrize("text, shown", [
    ("Hello there <tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>", "Hello there "),
    ("```python\nprint(1)\n```", "```python\nprint(1)\n```"),  # not a call: all of it, once it cannot be one
    ("```json\n{\"name\": \"noop\", \"arguments\": {}}\n```", ""),  # a bare call: held to the end
    ("a < b and <tool", "a < b and "),  # (a partial tag at the end waits)
])
def test_a_stream_holds_back_what_may_be_a_call(text, shown):
    for step in (1, 3, len(text)):
        held = CallStream({"noop"})
        out = "".join(held.feed(text[i:i + step]) for i in range(0, len(text), step))
        rest, calls = held.finish()
        assert out == shown
        assert (out + rest if not calls else out) == (text if not calls else shown)
        assert len(calls) == (("noop" in text and "tool_call>" in text) or text.startswith("```json"))


def test_tool_choice_and_the_call_format():
    ts = _tools(WEATHER, NOOP)
    assert forced_names(None, ts) == "auto" and forced_names(None, None) == "none"
    assert forced_names("required", ts) == ["get_weather", "noop"]
    assert forced_names({"type": "function", "function": {"name": "noop"}}, ts) == ["noop"]
    assert forced_names("none", ts) == "none"
    for bad, says in (("always", "none, auto, required"), ({"type": "function", "function": {"name": "rm"}}, "not among"),
                      ({"function": "noop"}, "names a function")):
        with pytest.raises(ValueError, match=says):
            forced_names(bad, ts)
    with pytest.raises(ValueError, match="needs tools"):
        forced_names("required", None)
    for tag_tokens in (False, True):
        fmt = call_format(ts, ["get_weather", "noop"], parallel=True, tag_tokens=tag_tokens)
        assert fmt.kind == "lark" and ('"<tool_call>"' in fmt.spec) != tag_tokens
        check(fmt)
    with pytest.raises(ValueError, match="two tools"):
        tools.check_tools(_tools(NOOP, NOOP))
    with pytest.raises(ValueError, match="letters"):
        tools.check_tools([Tool(type="function", function=Function(name="rm -rf"))])


# ------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    return tools_speculator(tmp_path_factory.mktemp("tools") / "tiny")


@pytest.fixture(scope="module")
def api(sd):
    with tiny_client(sd, request_timeout=30) as c:
        yield c


def chat(api, **fields):
    body = {"messages": USER, "tools": [WEATHER, NOOP], "max_tokens": 150, "temperature": 0, **fields}
    return api.post("/v1/chat/completions", json=body)


def _checked(call: dict) -> dict:
    """A call's arguments, checked against its function's parameters."""
    args = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        assert set(args) == {"city", "days"} and isinstance(args["city"], str) and 1 <= args["days"] <= 9
    else:
        assert call["function"]["name"] == "noop" and args == {}
    return args


@pytest.mark.parametrize("fields", [
    {"tool_choice": "required"},
    {"tool_choice": "required", "parallel_tool_calls": False, "method": "prompt-lookup"},
    {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "method": "none"},
    {"tool_choice": "required", "temperature": 0.9, "seed": 4, "n": 2},
])
def test_calls_asked_for_are_calls(api, sd, fields):
    r = chat(api, **fields)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        msg = choice["message"]
        assert msg["tool_calls"], choice  # (a random model writes calls until the token limit, unless held to one)
        for call in msg["tool_calls"]:
            _checked(call)
        if choice["finish_reason"] == "tool_calls":
            assert msg["content"] is None
        else:  # cut at the limit: the call it was writing stays text
            assert choice["finish_reason"] == "length" and "<tool_call>".startswith(msg["content"][:11])
        if fields.get("parallel_tool_calls") is False:
            assert choice["finish_reason"] == "tool_calls" and len(msg["tool_calls"]) == 1
        if isinstance(fields["tool_choice"], dict):
            assert {c["function"]["name"] for c in msg["tool_calls"]} == {"get_weather"}


def test_called_tools_equal_constrained_plain_decoding_and_stream_the_same(api, sd):
    """Greedy, speculation under the calls' format gives plain decoding's calls; streamed, the
    same calls in one tool_calls delta and the finish reason tool_calls."""
    fields = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False}
    got = chat(api, **fields).json()["choices"][0]
    req = tools.template_messages([type("M", (), {"role": "user", "text": USER[0]["content"], "tool_calls": None})])
    ids = sd.encode_messages(req, [WEATHER, NOOP])
    fmt = call_format(_tools(WEATHER, NOOP), ["get_weather"], parallel=False)
    plain = sd.generate(ids, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=150, output_format=fmt))
    assert plain.text.startswith("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {")
    want = parse_calls(plain.text, {"get_weather"})[1]
    assert [c["function"] for c in got["message"]["tool_calls"]] == [c["function"] for c in want]
    r = chat(api, stream=True, **fields)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    streamed = [call for d in deltas for call in d.get("tool_calls", [])]
    assert [c["function"] for c in streamed] == [c["function"] for c in want] and streamed[0]["index"] == 0
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_earlier_calls_and_results_reach_the_template(api, sd):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": '{"city": "paris", "days": 3}'}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = api.post("/v1/chat/completions", json={"messages": messages, "tools": [WEATHER], "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    from specdraft.server.schemas import ChatRequest

    body = ChatRequest.model_validate({"messages": messages, "tools": [WEATHER]})
    text = sd.tokenizer.decode(sd.encode_messages(tools.template_messages(body.messages), body.template_tools))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris", "days": 3}}\n</tool_call>' in text
    assert "<tool>sunny[/]" in text and text.startswith("<tools>get_weather;</tools>")
    # tool_choice none: the tools stay out of the prompt, the answer is text
    body = ChatRequest.model_validate({"messages": USER, "tools": [WEATHER], "tool_choice": "none"})
    assert body.template_tools is None and not body.calls_tools


@pytest.mark.parametrize("fields, says", [
    ({"tool_choice": "required", "tools": None}, "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "rm"}}}, "not among the tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "letters, digits"),
    ({"tools": [{"type": "retrieval"}]}, "function"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "not both"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 7}}}}}]}, "parameters"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "noop", "arguments": "{oops"}}]}]}, "not JSON"),
])
def test_bad_tool_requests_are_400s(api, fields, says):
    r = chat(api, **fields)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_tools_need_a_template_that_takes_them(tmp_path):
    d = make_cli_model(tmp_path / "plain", byte_level=True)  # (no chat template at all)
    sd = Speculator(str(d), dtype="fp32", target_format="w8a8", max_length=256, load_draft=False, progress=False)
    with tiny_client(sd, spec=SpecConfig(method="none")) as c:
        r = c.post("/v1/chat/completions", json={"messages": USER, "tools": [WEATHER], "max_tokens": 4})
        assert r.status_code == 400 and "does not take tools" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": "x", "tools": [WEATHER], "max_tokens": 4})
        assert r.status_code == 400 and "chat completions take tools" in r.json()["error"]["message"]


def test_sampled_calls_follow_their_seed(sd):
    """Held to the calls' format, a sampled answer is its seed's (speculation changes nothing)."""
    req = tools.template_messages([type("M", (), {"role": "user", "text": USER[0]["content"], "tool_calls": None})])
    ids = sd.encode_messages(req, [WEATHER, NOOP])
    fmt = call_format(_tools(WEATHER, NOOP), ["get_weather", "noop"], parallel=True)
    gen = GenerationConfig(max_new_tokens=120, output_format=fmt)
    spec = SpecConfig(method="draft-model", k=4, cost_rule=False)
    a = sd.generate(ids, spec=spec, sampling=SamplingConfig(temperature=0.8, seed=7), gen=gen)
    b = sd.generate(ids, spec=spec, sampling=SamplingConfig(temperature=0.8, seed=7), gen=gen)
    assert a.token_ids == b.token_ids
    if a.stats.new_tokens < 120:
        assert parse_calls(a.text, {"get_weather", "noop"})[1]


def test_the_official_client_reads_the_calls(api):
    """openai's client, whole and streamed: message.tool_calls with their functions, the same."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=api, max_retries=0)
    kw = dict(model="tiny", messages=USER, tools=[WEATHER, NOOP], max_tokens=150, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
    r = client.chat.completions.create(**kw)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather" and set(json.loads(calls[0].function.arguments)) == {"city", "days"}
    streamed = [c for chunk in client.chat.completions.create(stream=True, **kw) if chunk.choices
                for c in chunk.choices[0].delta.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed] == \
        [(calls[0].function.name, calls[0].function.arguments)]


def test_tokenize_takes_the_tools_as_chat_does(api, sd):
    """/tokenize with messages and tools: the ids a chat request with them prefills."""
    r = api.post("/tokenize", json={"messages": USER, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == sd.encode_messages(USER, [WEATHER])
    assert r.json()["tokens"] != sd.encode_messages(USER)
    assert api.post("/tokenize", json={"messages": USER, "tools": [{"type": "nope"}]}).status_code == 400
