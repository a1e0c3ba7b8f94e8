"""Whatever a client sends to the Responses and Messages APIs (generated bodies: known fields with
any JSON values, input items and content blocks of any shape), the answer is a 2xx or a 4xx,
never a server error; a stream that starts ends with its API's closing (or error) event."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tiny import tiny_client, tools_speculator

KEYS = ["type", "role", "content", "text", "name", "input", "call_id", "output", "arguments", "format", "schema",
        "tool_use_id", "id", "input_schema", "parameters"]
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.floats(-3, 3, allow_nan=False), st.text(max_size=8),
                 st.sampled_from(["message", "function_call", "function_call_output", "user", "assistant", "text",
                                  "tool_use", "tool_result", "get_weather", "json_schema", "function"]))
VALUE = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                     max_leaves=10)
RESPONSES_FIELDS = st.sampled_from(["input", "instructions", "temperature", "tools", "tool_choice", "text",
                                    "previous_response_id", "top_logprobs", "include", "store", "metadata"])
MESSAGES_FIELDS = st.sampled_from(["messages", "system", "stop_sequences", "tools", "tool_choice", "output_config",
                                   "temperature"])
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with tiny_client(tools_speculator(tmp_path_factory.mktemp("fuzz") / "tiny"), request_timeout=30) as c:
        yield c


def _ends_whole(r, closings: tuple[str, ...]) -> bool:
    last = r.text.strip().split("\n\n")[-1]
    return any(c in last for c in closings)


@FUZZ
@given(body=st.dictionaries(RESPONSES_FIELDS, VALUE, max_size=5), stream=st.booleans(), limit=st.integers(1, 30))
def test_responses_answer_any_body_without_a_server_error(api, body, stream, limit):
    r = api.post("/v1/responses", json={"input": "weather in paris", **body, "stream": stream,
                                        "max_output_tokens": limit})
    assert r.status_code < 500, (body, r.text)
    if stream and r.status_code == 200:
        assert _ends_whole(r, ("response.completed", "response.incomplete", "event: error")), (body, r.text[-300:])


@FUZZ
@given(body=st.dictionaries(MESSAGES_FIELDS, VALUE, max_size=5), stream=st.booleans(), limit=st.integers(1, 30))
def test_messages_answer_any_body_without_a_server_error(api, body, stream, limit):
    r = api.post("/v1/messages", json={"messages": [{"role": "user", "content": "weather in paris"}], **body,
                                       "stream": stream, "max_tokens": limit})
    assert r.status_code < 500, (body, r.text)
    if stream and r.status_code == 200:
        assert _ends_whole(r, ("message_stop", "event: error")), (body, r.text[-300:])


NAME = st.one_of(st.sampled_from(["get_weather", "noop"]), st.text(max_size=4))
IDS = st.sampled_from(["c1", "c2", "toolu_1"])
TEXT = st.text(max_size=6)
# items and blocks of the right shapes with their fields in any combination (some missing, calls
# and results that do not match): what reaches the translation to chat messages
ITEM = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer"])},
                          optional={"type": st.just("message"), "content": st.one_of(TEXT, st.lists(
                              st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]),
                                                     "text": TEXT}), max_size=2))}),
    st.fixed_dictionaries({"type": st.just("function_call")},
                          optional={"call_id": IDS, "name": NAME, "arguments": st.one_of(TEXT, st.just('{"city": "x"}'))}),
    st.fixed_dictionaries({"type": st.just("function_call_output")}, optional={"call_id": IDS, "output": TEXT}),
    st.dictionaries(st.sampled_from(KEYS), VALUE, max_size=4))
BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text")}, optional={"text": TEXT}),
    st.fixed_dictionaries({"type": st.just("tool_use")},
                          optional={"id": IDS, "name": NAME, "input": st.one_of(st.just({}), st.just({"city": "x"}))}),
    st.fixed_dictionaries({"type": st.just("tool_result")},
                          optional={"tool_use_id": IDS, "content": st.one_of(TEXT, st.lists(st.fixed_dictionaries(
                              {"type": st.just("text"), "text": TEXT}), max_size=2)), "is_error": st.booleans()}),
    st.dictionaries(st.sampled_from(KEYS), VALUE, max_size=4))


@FUZZ
@given(items=st.lists(ITEM, min_size=1, max_size=4),
       turns=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                             "content": st.one_of(TEXT, st.lists(BLOCK, max_size=3))}),
                      min_size=1, max_size=4))
def test_items_and_blocks_of_any_shape_are_answered_or_refused(api, items, turns):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    r = api.post("/v1/responses", json={"input": items, "tools": tools, "max_output_tokens": 3})
    assert r.status_code < 500, (items, r.text)
    r = api.post("/v1/messages", json={"messages": turns, "max_tokens": 3,
                                       "tools": [{"name": "get_weather", "input_schema": WEATHER}]})
    assert r.status_code < 500, (turns, r.text)
