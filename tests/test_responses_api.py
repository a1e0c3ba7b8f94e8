"""OpenAI's Responses API (server.responses_api): each response's text is the one chat completions
give the same messages (greedy: plain decoding's), whole or streamed as typed events; instructions,
previous_response_id, stored responses, function calls and their outputs, text.format; 4xx for
what it cannot do. Read through the official client where it has the call."""
from __future__ import annotations

import json

import pytest

from _tiny import NOOP, WEATHER, tiny_client, tools_speculator
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig

openai = pytest.importorskip("openai")

QUESTION = "abcabcabd abcab"
NEW = 24
FN_WEATHER = {"type": "function", **WEATHER["function"]}  # the Responses API's flat function tools
FN_NOOP = {"type": "function", **NOOP["function"]}


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    return tools_speculator(tmp_path_factory.mktemp("responses") / "tiny")


@pytest.fixture(scope="module")
def api(sd):
    with tiny_client(sd, request_timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=api, max_retries=0)


def plain(sd, messages, new=NEW, tools=None) -> str:
    """Plain decoding's answer to ``messages``."""
    ids = sd.encode_messages(messages, tools)
    return sd.generate(ids, spec=SpecConfig(method="none"), sampling=SamplingConfig(),
                       gen=GenerationConfig(max_new_tokens=new)).text


def test_a_text_input_is_answered_as_plain_decoding_answers_it(client, sd):
    r = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=NEW, temperature=0)
    assert r.output_text == plain(sd, [{"role": "user", "content": QUESTION}])
    assert r.object == "response" and r.id.startswith("resp_") and r.output[0].type == "message"
    assert r.usage.input_tokens == len(sd.encode_messages([{"role": "user", "content": QUESTION}]))
    assert 0 < r.usage.output_tokens <= NEW and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    extra = r.model_dump()
    assert extra["usage"]["speculation"]["method"] == "draft-model" and extra["usage"]["speculation"]["draft_tokens"] > 0
    assert len(extra["origins"]) == r.usage.output_tokens and "draft" in extra["origins"]
    cut = r.status == "incomplete"
    assert cut == (r.usage.output_tokens == NEW) and (r.incomplete_details is not None) == cut


def test_instructions_and_message_items_are_the_conversation(client, sd):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "abc"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "cab"}]},
             {"type": "message", "role": "user", "content": QUESTION}]
    r = client.responses.create(model="tiny", input=items, instructions="bca", max_output_tokens=NEW, temperature=0)
    assert r.output_text == plain(sd, [{"role": "system", "content": "bca"}, {"role": "user", "content": "abc"},
                                       {"role": "assistant", "content": "cab"}, {"role": "user", "content": QUESTION}])
    assert r.instructions == "bca"


def test_a_previous_response_continues_and_stored_ones_are_read_back_and_deleted(client, sd, api):
    first = client.responses.create(model="tiny", input="abc", max_output_tokens=NEW, temperature=0)
    second = client.responses.create(model="tiny", input="bca", previous_response_id=first.id, max_output_tokens=NEW,
                                     temperature=0)
    assert second.previous_response_id == first.id
    assert second.output_text == plain(sd, [{"role": "user", "content": "abc"},
                                            {"role": "assistant", "content": first.output_text},
                                            {"role": "user", "content": "bca"}])
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert api.post("/v1/responses", json={"input": "c", "previous_response_id": first.id}).status_code == 404
    unkept = client.responses.create(model="tiny", input="abc", max_output_tokens=4, store=False, temperature=0)
    assert api.get(f"/v1/responses/{unkept.id}").status_code == 404


def test_streamed_events_carry_the_same_text_and_object(client):
    kw = dict(model="tiny", input=QUESTION, max_output_tokens=NEW, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if whole.status == "incomplete" else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert client.responses.retrieve(events[-1].response.id).output_text == text  # stored at its end
    with client.responses.stream(**kw) as stream:  # the client's own accumulation of the events
        snapshots = [e.snapshot for e in stream if e.type == "response.output_text.delta"]
    assert snapshots[-1] == text


def test_log_probabilities_come_with_the_text(client, api):
    r = api.post("/v1/responses", json={"input": QUESTION, "max_output_tokens": 8, "temperature": 0,
                                        "top_logprobs": 2, "include": ["message.output_text.logprobs"]}).json()
    part = r["output"][0]["content"][0]
    assert len(part["logprobs"]) == r["usage"]["output_tokens"]
    assert all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in part["logprobs"])
    assert "".join(t["token"] for t in part["logprobs"]) == part["text"]


def test_a_required_call_comes_as_a_function_call_item_and_its_output_is_answered(client, sd):
    kw = dict(model="tiny", input="weather in paris for 3 days", tools=[FN_WEATHER, FN_NOOP], max_output_tokens=150,
              temperature=0, tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False)
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    assert set(json.loads(calls[0].arguments)) == {"city", "days"} and calls[0].call_id.startswith("call_")
    events = list(client.responses.create(stream=True, **kw))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [(calls[0].name, calls[0].arguments)]
    # the call's output, after the response that made it: the conversation with the call and its result
    follow = client.responses.create(model="tiny", previous_response_id=r.id, tools=[FN_WEATHER, FN_NOOP],
                                     tool_choice="none", max_output_tokens=NEW, temperature=0,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "sunny"}])
    call = {"id": calls[0].call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": json.loads(calls[0].arguments)}}
    assert follow.output_text == plain(sd, [{"role": "user", "content": "weather in paris for 3 days"},
                                            {"role": "assistant", "content": "", "tool_calls": [call]},
                                            {"role": "tool", "tool_call_id": calls[0].call_id, "name": "get_weather",
                                             "content": "sunny"}])


def test_a_json_schema_text_format_holds_the_answer(client):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    r = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "a", "schema": schema}})
    value = json.loads(r.output_text)
    assert set(value) == {"a"} and isinstance(value["a"], int)
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize("body, where", [
    ({"input": ""}, "input is empty"),
    ({"input": []}, "input is empty"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "needs call_id, arguments"),
    ({"input": "a", "tools": [{"type": "web_search"}]}, "web_search"),
    ({"input": "a", "background": True}, "background"),
    ({"input": "a", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "a", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"input": "a", "tool_choice": "required"}, "tool"),
    ({"input": "a", "max_output_tokens": 1000}, "max_output_tokens (1000) exceeds the context"),
    ({"input": "a", "model": "other"}, "not served here"),
])
def test_requests_it_cannot_answer_are_4xx_with_a_message(api, body, where):
    r = api.post("/v1/responses", json=body)
    assert 400 <= r.status_code < 500 and where in r.json()["error"]["message"], r.text
