"""Anthropic's Messages API (server.messages_api): each answer is the one chat completions give the
same conversation (greedy: plain decoding's), whole or streamed as the API's events; system text,
tool_use / tool_result blocks, tool_choice, stop_sequences, count_tokens; errors in its shape.
Read through the official client (anthropic) where it is installed."""
from __future__ import annotations

import json

import pytest

from _tiny import NOOP, WEATHER, tiny_client, tools_speculator
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig

anthropic = pytest.importorskip("anthropic")

QUESTION = "abcabcabd abcab"
NEW = 24
TOOLS = [{"name": t["function"]["name"], **({"description": t["function"]["description"]}
                                          if "description" in t["function"] else {}),
          "input_schema": t["function"].get("parameters", {"type": "object", "properties": {}})} for t in (WEATHER, NOOP)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    sd = tools_speculator(tmp_path_factory.mktemp("messages") / "tiny")
    with tiny_client(sd, request_timeout=30) as c:
        yield sd, c, anthropic.Anthropic(base_url="http://testserver", api_key="unused", http_client=c, max_retries=0)


def plain(sd, messages, new=NEW, tools=None, stop=()) -> str:
    """Plain decoding's answer to ``messages``."""
    return sd.generate(sd.encode_messages(messages, tools), spec=SpecConfig(method="none"), sampling=SamplingConfig(),
                       gen=GenerationConfig(max_new_tokens=new, stop=tuple(stop))).text


def test_an_answer_is_plain_decodings_and_streams_the_same(served):
    sd, _, client = served
    kw = dict(model="tiny", max_tokens=NEW, extra_body={"temperature": 0}, system="bca",
              messages=[{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cab"},
                        {"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
    m = client.messages.create(**kw)
    expected = plain(sd, [{"role": "system", "content": "bca"}, {"role": "user", "content": "abc"},
                          {"role": "assistant", "content": "cab"}, {"role": "user", "content": QUESTION}])
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.content[0].text == expected
    assert m.stop_reason == ("max_tokens" if m.usage.output_tokens == NEW else "end_turn")
    extra = m.model_dump()
    assert extra["usage"]["speculation"]["draft_tokens"] > 0 and len(extra["origins"]) == m.usage.output_tokens
    with client.messages.stream(**kw) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(deltas) == expected == final.content[0].text and final.stop_reason == m.stop_reason
    assert client.messages.count_tokens(model="tiny", system="bca", messages=kw["messages"]).input_tokens == \
        m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_a_stop_sequence_ends_the_answer_and_is_named(served):
    sd, _, client = served
    full = plain(sd, [{"role": "user", "content": QUESTION}], new=NEW)
    stop = full[5:7]
    assert stop not in full[:6]
    m = client.messages.create(model="tiny", max_tokens=NEW, extra_body={"temperature": 0}, stop_sequences=[stop],
                               messages=[{"role": "user", "content": QUESTION}])
    assert m.content[0].text == full[:full.index(stop)]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop


def test_a_tool_is_used_and_its_result_answered(served):
    sd, _, client = served
    kw = dict(model="tiny", max_tokens=150, extra_body={"temperature": 0}, tools=TOOLS,
              tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
              messages=[{"role": "user", "content": "weather in paris for 3 days"}])
    m = client.messages.create(**kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    assert set(uses[0].input) == {"city", "days"} and uses[0].id.startswith("toolu_")
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(uses[0].name, uses[0].input)]
    # the result, in the next user turn: the conversation with the call and its result
    follow = client.messages.create(model="tiny", max_tokens=NEW, extra_body={"temperature": 0}, tools=TOOLS,
                                    tool_choice={"type": "none"},
                                    messages=[*kw["messages"], {"role": "assistant", "content": m.content},
                                              {"role": "user", "content": [{"type": "tool_result",
                                                                            "tool_use_id": uses[0].id,
                                                                            "content": "sunny"}]}])
    call = {"id": uses[0].id, "type": "function", "function": {"name": "get_weather", "arguments": uses[0].input}}
    assert follow.content[0].text == plain(sd, [{"role": "user", "content": "weather in paris for 3 days"},
                                                {"role": "assistant", "content": "", "tool_calls": [call]},
                                                {"role": "tool", "tool_call_id": uses[0].id, "name": "get_weather",
                                                 "content": "sunny"}])


def test_an_output_format_holds_the_answer(served):
    _, _, client = served
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    m = client.messages.create(model="tiny", max_tokens=40, messages=[{"role": "user", "content": QUESTION}],
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    value = json.loads(m.content[0].text)
    assert set(value) == {"a"} and isinstance(value["a"], int)


@pytest.mark.parametrize("body, where", [
    ({"messages": [{"role": "user", "content": "a"}]}, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image'"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "a"}], "temperature": 1.5}, "temperature"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "a"}], "tool_choice": {"type": "any"}}, "tool"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "a"}], "tools": [{"type": "web_search_20250305",
                                                                                   "name": "web_search"}]}, "web_search"),
    ({"max_tokens": 1000, "messages": [{"role": "user", "content": "a"}]}, "exceeds the context"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "a"}], "output_config": {"format": {"type": "x"}}},
     "output_config.format"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "a"}], "model": "claude-9"}, "not served here"),
])
def test_requests_it_cannot_answer_are_4xx_in_the_apis_shape(served, body, where):
    _, api, _ = served
    r = api.post("/v1/messages", json=body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()
    assert err["type"] == "error" and where in err["error"]["message"], err
    assert err["error"]["type"] in ("invalid_request_error", "not_found_error")


def test_the_official_client_sees_its_own_errors_and_the_api_key(served):
    sd, _, client = served
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="tiny", max_tokens=4, messages=[])
    with tiny_client(sd, api_key="s3cret") as keyed:
        def ask(key):
            return anthropic.Anthropic(base_url="http://testserver", api_key=key, http_client=keyed,
                                       max_retries=0).messages.create(model="tiny", max_tokens=2,
                                                                      messages=[{"role": "user", "content": "a"}])
        assert ask("s3cret").content  # x-api-key, as this API sends it
        with pytest.raises(anthropic.AuthenticationError):
            ask("other")
        r = keyed.post("/v1/messages", json={"max_tokens": 2, "messages": [{"role": "user", "content": "a"}]})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert json.loads(json.dumps(TOOLS))  # (plain JSON, as sent)
