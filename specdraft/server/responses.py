"""The bodies the generation endpoints send: a whole completion, or server-sent events.

Both carry, beside OpenAI's fields, ``origins``: per token of the text, "draft" (an accepted
guess) or "target" (produced by the target itself); ``usage`` adds ``speculation``, the
request's SpecStats. ``kind`` is "chat" (/v1/chat/completions) or "completion" (/v1/completions).
Log-probabilities, where asked, are the target's (the raw softmax of its logits, as vLLM's
default), so a speculative answer's are plain decoding's.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..metrics import SpecStats
from .errors import APIError
from .worker import Outcome


def usage(outcome: Outcome, prompts: SpecStats | None = None) -> dict:
    """OpenAI's usage object of ``outcome`` (several choices: their merged statistics, and
    ``prompts`` those of one choice per prompt, so that a prompt counts once whatever n)."""
    s = outcome.stats
    p = prompts or s
    return {"prompt_tokens": p.prompt_tokens, "completion_tokens": s.new_tokens,
            "total_tokens": p.prompt_tokens + s.new_tokens,
            # OpenAI's field for prompt tokens served from a cache: here, the target's kept cache
            "prompt_tokens_details": {"cached_tokens": p.cached_prompt_tokens},
            "speculation": s.to_dict()}


@dataclass(frozen=True)
class Finished:
    """One choice of a non-streamed request, generated."""

    text: str
    origins: list[str]
    outcome: Outcome
    logprobs: dict | None = None
    first_of_prompt: bool = True  # the first choice of its prompt (n > 1: the others repeat it)


class Logprobs:
    """OpenAI's ``logprobs`` object for the pieces of one completion (all at once, or a stream's
    chunk by chunk): chat's ``{"content": [{token, logprob, bytes, top_logprobs}]}``, or the
    legacy completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``, a token named
    by its bytes as text (models.token_bytes). Pieces without a log-probability (text held back
    and released at the end) are left out."""

    def __init__(self, kind: str, spell):
        self.kind, self.spell = kind, spell
        self.offset = 0  # completions: where the next token's text starts in the whole completion

    def _named(self, token_id: int, logprob: float) -> dict:
        return {"token": self.spell.text(token_id), "logprob": logprob, "bytes": list(self.spell(token_id))}

    def of(self, pieces) -> dict | None:
        scored = [p for p in pieces if p.logprob is not None]
        if not scored:
            return None
        if self.kind == "chat":
            return {"content": [{**self._named(p.token_id, p.logprob),
                                 "top_logprobs": [self._named(i, lp) for i, lp in p.top_logprobs]} for p in scored]}
        return self._legacy([(p.token_id, p.logprob, p.top_logprobs) for p in scored])

    def of_prompt(self, ids: list[int], scores) -> dict:
        """Completions' echo: the prompt's tokens (the first unscored: null, as OpenAI's), then
        each with its score from the prefill (engine.prompt_scores)."""
        return self._legacy([(ids[0], None, None)] + [(i, lp, top) for i, (lp, top) in zip(ids[1:], scores)])

    def _legacy(self, entries) -> dict:
        """(token id, logprob or None, top pairs or None) -> completions' lists, offsets running on."""
        tokens, offsets = [], []
        for token_id, _, _ in entries:
            tokens.append(self.spell.text(token_id))
            offsets.append(self.offset)
            self.offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [None if top is None else {self.spell.text(i): lp for i, lp in top}
                                 for _, _, top in entries],
                "text_offset": offsets}


def joined(first: dict | None, then: dict | None) -> dict | None:
    """Two pieces of completions' logprobs lists (the echoed prompt's, the completion's) as one."""
    if first is None or then is None:
        return first or then
    return {key: first[key] + then[key] for key in first}


def completion_body(rid: str, kind: str, model_name: str, finished: list[Finished]) -> dict:
    """The JSON of a finished, non-streamed completion: its choices in order (index i: prompt
    i // n, its (i % n)-th answer), each with its ``origins`` when there are several (one choice:
    ``origins`` beside ``usage``, as always), and one usage over them all."""
    choices = []
    for i, f in enumerate(finished):
        choice = {"index": i, "finish_reason": f.outcome.finish_reason, "logprobs": f.logprobs}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": f.text}
        else:
            choice["text"] = f.text
        if len(finished) > 1:
            choice["origins"] = f.origins
        choices.append(choice)
    if len(finished) == 1:
        total = usage(finished[0].outcome)
    else:
        merged = Outcome(SpecStats.merged([f.outcome.stats for f in finished]), "")
        total = usage(merged, SpecStats.merged([f.outcome.stats for f in finished if f.first_of_prompt]))
    body = {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model_name, "choices": choices, "usage": total}
    if len(finished) == 1:
        body["origins"] = finished[0].origins
    return body


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


class _Chunks:
    """The chunk objects of one stream: same id, object type, creation time and model."""

    def __init__(self, rid: str, kind: str, model_name: str):
        self.kind = kind
        self.head = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                     "created": int(time.time()), "model": model_name}

    def text(self, delta_text: str | None, origins: list[str], finish=None, role=False, live=None,
             logprobs: dict | None = None) -> str:
        if self.kind == "chat":
            delta = {"role": "assistant"} if role else {}
            if delta_text is not None:
                delta["content"] = delta_text
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": delta_text or "", "finish_reason": finish, "logprobs": logprobs}
        data = {**self.head, "choices": [choice], "origins": origins}
        if live is not None:
            data["speculation"] = live
        return _sse(data)

    def usage(self, outcome: Outcome) -> str:
        return _sse({**self.head, "choices": [], "usage": usage(outcome)})


async def event_stream(events: AsyncIterator[tuple[str, object]], rid: str, kind: str, model_name: str,
                       include_usage: bool, on_close, logprobs: Logprobs | None = None,
                       echo: tuple[str, list[int], bool] | None = None) -> AsyncIterator[str]:
    """Server-sent events for a job's ``events`` (see generation.job_events): a chunk per piece
    (with the live counters as ``speculation``, and its token's log-probabilities by ``logprobs``
    when the request asked for them), a final chunk with the finish reason, the usage if asked,
    then ``[DONE]``. ``echo`` (completions: the prompt's text and ids, and whether the job scores
    them) comes first, in a chunk of its own, with the scores when the job's "prompt" event brings
    them. A job that never started
    ends the stream with an error event. ``on_close()`` runs when the stream ends or the client
    leaves."""
    chunks = _Chunks(rid, kind, model_name)
    try:
        if kind == "chat":
            yield chunks.text("", [], role=True)
        if echo is not None and not echo[2]:
            yield chunks.text(echo[0], [])
        async for ev, value in events:
            if ev == "prompt":  # the prompt's scores: its echo (with them, when asked for)
                yield chunks.text(echo[0], [], logprobs=None if logprobs is None else logprobs.of_prompt(echo[1], value))
            elif ev == "piece":
                piece, live = value
                yield chunks.text(piece.text, [piece.origin], live=live,
                                  logprobs=logprobs.of([piece]) if logprobs is not None else None)
            else:
                yield chunks.text(None if kind == "chat" else "", [], finish=value.finish_reason)
                if include_usage:
                    yield chunks.usage(value)
                yield "data: [DONE]\n\n"
    except APIError as e:  # the job never started (timed out in the queue): say so in the stream
        yield _sse({"error": {"message": e.message, "type": e.type, "code": e.code}})
    finally:
        on_close()
