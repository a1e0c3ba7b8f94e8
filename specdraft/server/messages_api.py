"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) over the chat
machinery, for clients that speak it: ``system`` and ``messages`` (text, ``tool_use`` and
``tool_result`` blocks) become chat messages and a ChatRequest (``tools`` with their
``input_schema``, ``tool_choice``, ``stop_sequences``), so an answer is exactly the one
/v1/chat/completions gives those messages; it goes back as a message object (``text`` and
``tool_use`` content blocks, ``stop_reason``) or, streamed, as the API's events (``message_start``,
``content_block_delta`` ... ``message_stop``). Errors take this API's shape (errors.py),
``{"type": "error", "error": {"type", "message"}}``. ``origins`` (per token: "draft" or
"target") and ``usage.speculation`` are this server's extensions, as on chat completions.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from .errors import APIError, anthropic_error
from .schemas import MAX_STOP, MAX_TOOLS, ChatRequest, Sampled
from .tools import CallStream, parse_calls
from .worker import Outcome


class Block(BaseModel):
    """A content block: text, a tool's use (assistant) or its result (user); images, documents and
    the like are refused (a text model), thinking blocks passed over."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[dict] | None = None
    is_error: StrictBool = False

    @property
    def result_text(self) -> str:
        """A tool_result's content as text (its text blocks joined)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.get("text", "") for b in self.content or () if isinstance(b, dict) and b.get("type") == "text")


class Turn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, v):
        if isinstance(v, list):
            for b in v:
                kind = b.get("type") if isinstance(b, dict) else None
                if kind not in ("text", "tool_use", "tool_result", "thinking", "redacted_thinking"):
                    raise ValueError(f"content blocks of type {kind!r} are not supported (text, tool_use and "
                                     "tool_result are)")
        return v


class MessagesRequest(Sampled):
    """The body of POST /v1/messages (and, without max_tokens, of count_tokens). Beside
    Anthropic's fields: this server's ``method``, ``k``, ``min_p`` and ``seed`` (``temperature``,
    ``top_p`` and ``top_k`` are Anthropic's, which its newer clients send as extra body fields)."""

    messages: list[Turn] = Field(min_length=1)
    system: str | list[dict] | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP)
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    tools: list[dict] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: dict | None = None
    output_config: dict | None = None  # its "format": {"type": "json_schema", "schema"}: the answer held to it

    @field_validator("output_config")
    @classmethod
    def _format(cls, v):
        fmt = (v or {}).get("format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"
                                or not isinstance(fmt.get("schema"), dict)):
            raise ValueError("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}")
        return v

    @property
    def response_format(self) -> dict | None:
        """output_config.format as the chat's response_format."""
        fmt = (self.output_config or {}).get("format")
        return None if fmt is None else {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}

    @property
    def system_text(self) -> str:
        if isinstance(self.system, list):
            return "".join(b.get("text", "") for b in self.system if isinstance(b, dict))
        return self.system or ""


def chat_messages(body: MessagesRequest) -> list[dict]:
    """The conversation as chat messages: the system text first; an assistant's tool_use blocks
    as its tool_calls; a user's tool_result blocks as tool messages (named by their call), then
    its text."""
    out = [{"role": "system", "content": body.system_text}] if body.system_text else []
    names: dict[str, str] = {}
    for turn in body.messages:
        if isinstance(turn.content, str):
            out.append({"role": turn.role, "content": turn.content})
            continue
        text = "".join(b.text or "" for b in turn.content if b.type == "text")
        if turn.role == "assistant":
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input or {})}}
                     for b in turn.content if b.type == "tool_use"]
            names.update((c["id"], c["function"]["name"]) for c in calls)
            out.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
            continue
        for b in turn.content:
            if b.type == "tool_result":
                result = {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.result_text}
                if b.tool_use_id in names:
                    result["name"] = names[b.tool_use_id]
                out.append(result)
        if text or not any(b.type == "tool_result" for b in turn.content):
            out.append({"role": "user", "content": text})
    return out


def _tool_choice(choice: dict | None):
    """Anthropic's tool_choice in the chat's form (and whether calls may come several at once)."""
    if not choice:
        return None, True
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise APIError(400, f"tool_choice type must be auto, any, tool (with a name) or none, got {kind!r}",
                   param="tool_choice")


def chat_request(body: MessagesRequest) -> ChatRequest:
    """The chat request that answers ``body``'s conversation with its settings (a 400 naming the
    field for what the chat's validation refuses)."""
    choice, parallel = _tool_choice(body.tool_choice)
    payload = {"model": body.model, "messages": chat_messages(body), "max_tokens": body.max_tokens,
               "stop": body.stop_sequences, "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
               "min_p": body.min_p, "seed": body.seed, "method": body.method, "k": body.k, "tool_choice": choice,
               "parallel_tool_calls": parallel, "response_format": body.response_format}
    if body.tools:
        for t in body.tools:
            if "input_schema" not in t and t.get("type") not in (None, "custom"):
                raise APIError(400, f"tools of type {t.get('type')!r} are not supported (custom tools with an "
                                    "input_schema are)", param="tools")
        payload["tools"] = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                                              "parameters": t.get("input_schema")}}
                            for t in body.tools]
    try:
        return ChatRequest.model_validate(payload)
    except ValidationError as e:
        err = e.errors()[0]
        where = {"messages": "messages", "stop": "stop_sequences", "response_format": "output_config.format"}.get(
            str(err["loc"][0]) if err.get("loc") else "")
        where = where or ".".join(str(p) for p in err.get("loc", ())) or None
        msg = err.get("msg", "invalid request").removeprefix("Value error, ")
        raise APIError(400, f"{where}: {msg}" if where else msg, param=where) from None


def _blocks(text: str, calls: list[dict]) -> list[dict]:
    """The answer's content blocks: its text (where it has any, or nothing was called), then a
    tool_use block per call."""
    blocks = [{"type": "text", "text": text}] if text or not calls else []
    return blocks + [{"type": "tool_use", "id": c["id"].replace("call_", "toolu_", 1), "name": c["function"]["name"],
                      "input": json.loads(c["function"]["arguments"])} for c in calls]


def _stop(outcome: Outcome, calls: list[dict], leftover: str, stops: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): ``leftover`` is the decoded answer past its text, where a
    stop string cut it."""
    if calls:
        return "tool_use", None
    if outcome.finish_reason == "length":
        return "max_tokens", None
    hit = next((s for s in stops if leftover.startswith(s)), None)
    return ("stop_sequence", hit) if hit is not None else ("end_turn", None)


def _usage(stats, output_tokens: int | None = None) -> dict:
    return {"input_tokens": stats.prompt_tokens - stats.cached_prompt_tokens,
            "cache_read_input_tokens": stats.cached_prompt_tokens, "cache_creation_input_tokens": 0,
            "output_tokens": stats.new_tokens if output_tokens is None else output_tokens}


class Reply:
    """One message being made: its id and what the request asked, and the text of its pieces."""

    def __init__(self, body: MessagesRequest, model_name: str, tool_names: set[str] | None, decode):
        self.body, self.model_name, self.tool_names, self.decode = body, model_name, tool_names, decode
        self.id = f"msg_{uuid.uuid4().hex}"

    def head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_name, "content": [],
                "stop_reason": None, "stop_sequence": None}

    def ended(self, pieces: list, text: str, outcome: Outcome) -> tuple[list[dict], str, str | None]:
        """(content blocks, stop_reason, stop_sequence) of the answer whose pieces made ``text``."""
        content, calls = parse_calls(text, self.tool_names) if self.tool_names is not None else (text, [])
        whole = self.decode([p.token_id for p in pieces if p.token_id >= 0])
        leftover = whole[len(text):] if whole.startswith(text) else ""
        reason, sequence = _stop(outcome, calls, leftover, self.body.stop_sequences or [])
        return _blocks(content.strip() if calls else content, calls), reason, sequence


def finished_message(reply: Reply, pieces: list, outcome: Outcome) -> dict:
    text = "".join(p.text for p in pieces)
    content, reason, sequence = reply.ended(pieces, text, outcome)
    return {**reply.head(), "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": {**_usage(outcome.stats), "speculation": outcome.stats.to_dict()},
            "origins": [p.origin for p in pieces]}


def _event(kind: str, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


async def event_stream(reply: Reply, prompt_tokens: int, events: AsyncIterator,
                       cancel: Callable[[], None]) -> AsyncIterator[str]:
    """The Messages API's events for one answer's job (generation.job_events): message_start, a
    text block opened at the first text with a text_delta per piece (its ``origins`` beside),
    closed at the end; each call as a tool_use block with its input in one input_json_delta; then
    message_delta (stop_reason, usage) and message_stop. With tools, text is held from where a
    call may begin (tools.CallStream). A job that cannot start ends the stream with an ``error``
    event. The worker is freed when the stream ends or the client leaves."""
    held = CallStream(reply.tool_names) if reply.tool_names is not None else None
    pieces, text, index, opened = [], "", 0, False
    try:
        start = {**reply.head(), "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
        yield _event("message_start", message=start)
        yield _event("ping")
        outcome = None
        async for ev, value in events:
            if ev == "piece":
                piece, _ = value
                pieces.append(piece)
                out = piece.text if held is None else held.feed(piece.text)
                text += piece.text
                if out:
                    if not opened:
                        opened = True
                        yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                    yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": out},
                                 origins=[piece.origin])
            elif ev == "done":
                outcome = value
        if outcome is None:  # the client left
            return
        content, reason, sequence = reply.ended(pieces, text, outcome)
        rest = held.finish()[0] if held is not None else ""
        if content and content[0]["type"] == "text":
            if not opened:
                opened = True
                yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
            if rest.strip():
                yield _event("content_block_delta", index=0,
                             delta={"type": "text_delta", "text": rest.strip() if reason == "tool_use" else rest},
                             origins=[])
        if opened:
            yield _event("content_block_stop", index=0)
            index = 1
        for block in content:
            if block["type"] != "tool_use":
                continue
            yield _event("content_block_start", index=index, content_block={**block, "input": {}})
            yield _event("content_block_delta", index=index,
                         delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
            yield _event("content_block_stop", index=index)
            index += 1
        stats = outcome.stats
        yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                     usage={**_usage(stats), "speculation": stats.to_dict()})
        yield _event("message_stop")
    except APIError as e:  # the job never started (a full queue, timed out in it)
        yield _event("error", error=anthropic_error(e.status, e.message)["error"])
    finally:
        cancel()
