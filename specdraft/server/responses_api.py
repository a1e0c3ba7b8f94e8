"""OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}) over the chat
machinery: a request's ``input`` (a text, or items: messages, function calls and their outputs),
its ``instructions`` and the conversation of a ``previous_response_id`` become chat messages and a
ChatRequest (tools, tool_choice, ``text.format`` as the chat's response_format), so an answer is
exactly the one /v1/chat/completions gives those messages; it goes back as a response object whose
``output`` holds a message item (its ``output_text``) and a ``function_call`` item per call, or,
streamed, as the Responses API's typed server-sent events (``response.output_text.delta`` ...
``response.completed``).

Stored responses (``store``, default true) are kept in memory, the latest STORED of them: enough
for a client that continues a conversation by ``previous_response_id`` or reads one back; they are
not written anywhere. ``origins`` (per token: "draft" or "target") and ``usage.speculation`` are
this server's extensions, as on chat completions.
"""
from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from ..config import MAX_TOP_LOGPROBS
from .errors import APIError
from .responses import Logprobs
from .schemas import MAX_TOOLS, ChatRequest, Sampled
from .tools import CallStream, parse_calls
from .worker import Outcome

STORED = 256  # responses kept for previous_response_id and GET, the oldest forgotten first
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class InputPart(BaseModel):
    """A part of a message's content: text (images and files are refused, InputItem._parts: a text model)."""

    model_config = ConfigDict(extra="ignore")
    type: str
    text: str


class InputItem(BaseModel):
    """An item of ``input``: a message (``role``, ``content``), a function call the assistant made
    (``call_id``, ``name``, ``arguments``), or a call's output (``call_id``, ``output``).
    Reasoning items are passed over."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None

    @field_validator("content", "output", mode="before")
    @classmethod
    def _parts(cls, v):
        if not isinstance(v, list):
            return v
        parts = []
        for part in v:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
                raise ValueError(f"content parts of type {kind!r} are not supported (input_text and output_text, "
                                 "with their text, are)")
            parts.append(InputPart.model_validate(part))
        return parts

    @model_validator(mode="after")
    def _complete(self):
        need = {"message": ("role",), "function_call": ("call_id", "name", "arguments"),
                "function_call_output": ("call_id", "output"), "reasoning": ()}[self.type]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type} item needs {', '.join(missing)}")
        return self


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content or ())


class ResponsesRequest(Sampled):
    """The body of POST /v1/responses. Beside OpenAI's fields: this server's ``method``, ``k``,
    ``top_k``, ``min_p`` and ``seed``, as on chat completions."""

    input: str | list[InputItem]  # (items checked one by one in _items, to name the one at fault)
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    store: StrictBool = True
    metadata: dict[str, str] | None = None
    tools: list[dict] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict | None = None
    parallel_tool_calls: StrictBool = True
    text: dict | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", "name", "schema", "strict"}}
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[str] | None = None
    background: StrictBool = False

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, v):
        if isinstance(v, list):
            items = []
            for i, item in enumerate(v):
                try:
                    items.append(InputItem.model_validate(item))
                except ValidationError as e:
                    err = e.errors()[0]
                    where = ".".join(str(p) for p in (i, *err.get("loc", ())))
                    raise ValueError(f"item {where}: {err.get('msg', 'invalid').removeprefix('Value error, ')}") from None
            return items
        return v

    @field_validator("text")
    @classmethod
    def _format(cls, v):
        fmt = (v or {}).get("format")
        if fmt is None:
            return v
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(f"text.format type must be text, json_object or json_schema, got {kind!r}")
        if kind == "json_schema" and not isinstance(fmt.get("schema"), dict):
            raise ValueError("text.format: a json_schema format needs its schema (an object)")
        return v

    @model_validator(mode="after")
    def _supported(self):
        if isinstance(self.input, list) and not self.input:
            raise ValueError("input is empty")
        if isinstance(self.input, str) and not self.input:
            raise ValueError("input is empty")
        if self.background:
            raise ValueError("background responses are not supported; leave background false")
        for t in self.tools or ():
            if t.get("type") != "function":
                raise ValueError(f"tools of type {t.get('type')!r} are not supported (function tools are)")
        return self

    @property
    def logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS_INCLUDE in (self.include or ())


def input_messages(items: str | list[InputItem], earlier: list[dict]) -> list[dict]:
    """``input`` as chat messages (OpenAI's chat shape): function calls join the assistant message
    before them (or make one), a call's output is a tool message named by its call (found in
    ``earlier`` messages or in this input)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    names = {c["id"]: c["function"]["name"] for m in earlier for c in m.get("tool_calls") or ()}
    for item in items:
        if item.type == "message":
            out.append({"role": item.role, "content": _text(item.content)})
        elif item.type == "function_call":
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            names[item.call_id] = item.name
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.type == "function_call_output":
            message = {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)}
            if item.call_id in names:
                message["name"] = names[item.call_id]
            out.append(message)
    return out


def _chat_tool_choice(choice):
    """Responses' tool_choice (``{"type": "function", "name": N}``) in the chat's form."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(text: dict | None) -> dict | None:
    """``text.format`` as the chat's response_format."""
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type", "text") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return {"type": fmt.get("type")}


def chat_request(body: ResponsesRequest, conversation: list[dict]) -> ChatRequest:
    """The chat request that answers ``conversation`` (instructions first) with ``body``'s
    settings; a 400 naming the field for what the chat's validation refuses."""
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
    payload = {"model": body.model, "messages": messages, "max_tokens": body.max_output_tokens,
               "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "min_p": body.min_p,
               "seed": body.seed, "method": body.method, "k": body.k, "parallel_tool_calls": body.parallel_tool_calls,
               "response_format": _response_format(body.text), "tool_choice": _chat_tool_choice(body.tool_choice)}
    if body.tools:
        payload["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters",
                                                                                "strict") if k in t}}
                            for t in body.tools]
    if body.logprobs:
        payload.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    try:
        return ChatRequest.model_validate(payload)
    except ValidationError as e:
        err = e.errors()[0]
        where = {"response_format": "text.format", "max_tokens": "max_output_tokens",
                 "messages": "input"}.get(str(err["loc"][0]) if err.get("loc") else "")
        where = where or ".".join(str(p) for p in err.get("loc", ())) or None
        msg = err.get("msg", "invalid request").removeprefix("Value error, ")
        raise APIError(400, f"{where}: {msg}" if where else msg, param=where) from None


class ResponseStore:
    """The latest STORED responses by id: each one's object and the conversation it ended
    (chat messages, without its instructions: a later response brings its own)."""

    def __init__(self, capacity: int = STORED):
        self.capacity = capacity
        self.kept: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, response: dict, conversation: list[dict]) -> None:
        self.kept[response["id"]] = (response, conversation)
        while len(self.kept) > self.capacity:
            self.kept.popitem(last=False)

    def get(self, rid: str) -> tuple[dict, list[dict]]:
        if rid not in self.kept:
            raise APIError(404, f"no stored response has id {rid!r} (this server keeps its latest {self.capacity}, in "
                                "memory)", param="previous_response_id", code="not_found")
        return self.kept[rid]

    def delete(self, rid: str) -> None:
        self.get(rid)
        del self.kept[rid]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Answer:
    """One response being made: its id, the request's settings as the object echoes them, and
    its output items as the answer's text and calls come (non-streamed: all at the end)."""

    def __init__(self, body: ResponsesRequest, model_name: str, tool_names: set[str] | None):
        self.body, self.model_name, self.tool_names = body, model_name, tool_names
        self.id = _item_id("resp")
        self.created = int(time.time())
        self.message_id = _item_id("msg")
        self.text = ""
        self.origins: list[str] = []
        self.logprobs: list[dict] = []
        self.calls: list[dict] = []

    def message_item(self, status: str = "completed") -> dict:
        part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": self.logprobs}
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant",
                "content": [part] if status == "completed" else []}

    @staticmethod
    def call_item(call: dict, status: str = "completed") -> dict:
        return {"id": call["item_id"], "type": "function_call", "status": status, "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"] if status == "completed" else ""}

    def output(self) -> list[dict]:
        """The output items: the message (where it has text, or nothing was called), then the calls."""
        items = [self.message_item()] if self.text or not self.calls else []
        return items + [self.call_item(c) for c in self.calls]

    def ended(self, text: str, calls: list[dict]) -> None:
        """The answer's text (outside its calls) and calls, once it is whole."""
        self.text = text.strip() if calls else text
        self.calls = [{**c, "item_id": _item_id("fc")} for c in calls]

    def object(self, outcome: Outcome | None, status: str | None = None) -> dict:
        """The response object: in progress (no outcome yet) or ended with ``outcome``."""
        b = self.body
        if outcome is None:
            status, incomplete, output, usage = status or "in_progress", None, [], None
        else:
            cut = outcome.finish_reason == "length" and not self.calls
            status = "incomplete" if cut else "completed"
            incomplete = {"reason": "max_output_tokens"} if cut else None
            output = self.output()
            s = outcome.stats
            usage = {"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": s.cached_prompt_tokens},
                     "output_tokens": s.new_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": s.prompt_tokens + s.new_tokens, "speculation": s.to_dict()}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
                "incomplete_details": incomplete, "instructions": b.instructions,
                "max_output_tokens": b.max_output_tokens, "model": self.model_name, "output": output,
                "parallel_tool_calls": b.parallel_tool_calls, "previous_response_id": b.previous_response_id,
                "reasoning": None, "store": b.store, "temperature": b.temperature,
                "text": {"format": (b.text or {}).get("format") or {"type": "text"}},
                "tool_choice": b.tool_choice or ("auto" if b.tools else "none"), "tools": b.tools or [],
                "top_p": b.top_p, "truncation": "disabled", "usage": usage, "metadata": b.metadata or {},
                "user": None, "origins": self.origins}

    def assistant_message(self) -> dict:
        """The answer as the chat message a later response's conversation holds."""
        message = {"role": "assistant", "content": self.text or None}
        if self.calls:
            message["tool_calls"] = [{"id": c["id"], "type": "function", "function": c["function"]} for c in self.calls]
        return message


def finished_response(answer: Answer, pieces: list, outcome: Outcome, spell) -> dict:
    """A non-streamed answer's response object, from its pieces and outcome."""
    text = "".join(p.text for p in pieces)
    answer.origins = [p.origin for p in pieces]
    if answer.body.logprobs:
        answer.logprobs = (Logprobs("chat", spell).of(pieces) or {}).get("content", [])
    content, calls = parse_calls(text, answer.tool_names) if answer.tool_names is not None else (text, [])
    answer.ended(content, calls)
    return answer.object(outcome)


def _event(kind: str, seq: int, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **fields})}\n\n"


async def event_stream(answer: Answer, events: AsyncIterator, cancel: Callable[[], None], spell,
                       done: Callable[[dict], None]) -> AsyncIterator[str]:
    """The Responses API's server-sent events for one answer's job (generation.job_events): the
    response created, the message item opened at its first text, a text delta per piece (with its
    ``origins`` and, where asked, log-probabilities), the item closed, each call as a
    function_call item with its arguments, then ``response.completed`` (``response.incomplete``
    when cut at max_output_tokens) with the whole object, which ``done`` then gets (to store it).
    With tools, text is held from where a call may begin (tools.CallStream). A job that cannot
    start ends the stream with an ``error`` event. The worker is freed when the stream ends or the
    client leaves."""
    seq = iter(range(1 << 62))
    lp = Logprobs("chat", spell) if answer.body.logprobs else None
    held = CallStream(answer.tool_names) if answer.tool_names is not None else None
    opened = False
    item = answer.message_id

    def open_message() -> list[str]:
        return [_event("response.output_item.added", next(seq), output_index=0, item=answer.message_item("in_progress")),
                _event("response.content_part.added", next(seq), item_id=item, output_index=0, content_index=0,
                       part={"type": "output_text", "text": "", "annotations": []})]

    def delta(text: str, origins: list[str], scores: list[dict]) -> str:
        return _event("response.output_text.delta", next(seq), item_id=item, output_index=0, content_index=0,
                      delta=text, logprobs=scores, origins=origins)

    try:
        yield _event("response.created", next(seq), response=answer.object(None))
        yield _event("response.in_progress", next(seq), response=answer.object(None))
        outcome = None
        async for ev, value in events:
            if ev == "piece":
                piece, _ = value
                answer.origins.append(piece.origin)
                scores = (lp.of([piece]) or {}).get("content", []) if lp is not None else []
                answer.logprobs += scores
                text = piece.text if held is None else held.feed(piece.text)
                answer.text += text
                if text or scores:
                    if not opened:
                        opened = True
                        for e in open_message():
                            yield e
                    yield delta(text, [piece.origin], scores)
            elif ev == "done":
                outcome = value
        if outcome is None:  # the client left
            return
        calls = []
        if held is not None:
            rest, calls = held.finish()
            answer.text += rest
        answer.ended(answer.text, calls)
        if answer.text or not calls:
            if not opened:
                for e in open_message():
                    yield e
            if held is not None and rest.strip():
                yield delta(rest.strip() if calls else rest, [], [])
            message = answer.message_item()
            yield _event("response.output_text.done", next(seq), item_id=item, output_index=0, content_index=0,
                         text=answer.text, logprobs=answer.logprobs)
            yield _event("response.content_part.done", next(seq), item_id=item, output_index=0, content_index=0,
                         part=message["content"][0])
            yield _event("response.output_item.done", next(seq), output_index=0, item=message)
        first = 1 if answer.text or not calls else 0
        for j, call in enumerate(answer.calls):
            index = first + j
            yield _event("response.output_item.added", next(seq), output_index=index,
                         item=answer.call_item(call, "in_progress"))
            args = call["function"]["arguments"]
            yield _event("response.function_call_arguments.delta", next(seq), item_id=call["item_id"],
                         output_index=index, delta=args)
            yield _event("response.function_call_arguments.done", next(seq), item_id=call["item_id"],
                         output_index=index, arguments=args, name=call["function"]["name"])
            yield _event("response.output_item.done", next(seq), output_index=index, item=answer.call_item(call))
        final = answer.object(outcome)
        done(final)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield _event(kind, next(seq), response=final)
    except APIError as e:  # the job never started (a full queue, timed out in it)
        yield _event("error", next(seq), code=e.code, message=e.message, param=e.param)
    finally:
        cancel()
