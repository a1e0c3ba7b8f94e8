"""The bodies the generation endpoints send: a whole completion, or server-sent events.

Both carry, beside OpenAI's fields, ``origins``: per token of the text, "draft" (an accepted
guess) or "target" (produced by the target itself); ``usage`` adds ``speculation``, the
request's SpecStats. ``kind`` is "chat" (/v1/chat/completions) or "completion" (/v1/completions).
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from .errors import APIError
from .worker import Outcome


def usage(outcome: Outcome) -> dict:
    s = outcome.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.new_tokens,
            "total_tokens": s.prompt_tokens + s.new_tokens,
            # OpenAI's field for prompt tokens served from a cache: here, the target's kept cache
            "prompt_tokens_details": {"cached_tokens": s.cached_prompt_tokens},
            "speculation": s.to_dict()}


def completion_body(rid: str, kind: str, model_name: str, text: str, origins: list[str], outcome: Outcome) -> dict:
    """The JSON of a finished, non-streamed completion."""
    choice = {"index": 0, "finish_reason": outcome.finish_reason, "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model_name, "choices": [choice],
            "usage": usage(outcome), "origins": origins}


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


class _Chunks:
    """The chunk objects of one stream: same id, object type, creation time and model."""

    def __init__(self, rid: str, kind: str, model_name: str):
        self.kind = kind
        self.head = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                     "created": int(time.time()), "model": model_name}

    def text(self, delta_text: str | None, origins: list[str], finish=None, role=False, live=None) -> str:
        if self.kind == "chat":
            delta = {"role": "assistant"} if role else {}
            if delta_text is not None:
                delta["content"] = delta_text
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta_text or "", "finish_reason": finish, "logprobs": None}
        data = {**self.head, "choices": [choice], "origins": origins}
        if live is not None:
            data["speculation"] = live
        return _sse(data)

    def usage(self, outcome: Outcome) -> str:
        return _sse({**self.head, "choices": [], "usage": usage(outcome)})


async def event_stream(events: AsyncIterator[tuple[str, object]], rid: str, kind: str, model_name: str,
                       include_usage: bool, on_close) -> AsyncIterator[str]:
    """Server-sent events for a job's ``events`` (see generation.job_events): a chunk per piece
    (with the live counters as ``speculation``), a final chunk with the finish reason, the usage
    if asked, then ``[DONE]``. A job that never started ends the stream with an error event.
    ``on_close()`` runs when the stream ends or the client leaves."""
    chunks = _Chunks(rid, kind, model_name)
    try:
        if kind == "chat":
            yield chunks.text("", [], role=True)
        async for ev, value in events:
            if ev == "piece":
                piece, live = value
                yield chunks.text(piece.text, [piece.origin], live=live)
            else:
                yield chunks.text(None if kind == "chat" else "", [], finish=value.finish_reason)
                if include_usage:
                    yield chunks.usage(value)
                yield "data: [DONE]\n\n"
    except APIError as e:  # the job never started (timed out in the queue): say so in the stream
        yield _sse({"error": {"message": e.message, "type": e.type, "code": e.code}})
    finally:
        on_close()
