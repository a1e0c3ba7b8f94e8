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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..metrics import SpecStats
from . import tools
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


def merged_usage(outcomes: list[Outcome], first_of_prompt: list[bool]) -> dict:
    """The usage of a request's choices: one's own, or their statistics merged, each prompt's
    tokens counted once (``first_of_prompt``: the choices that are their prompt's first answer)."""
    if len(outcomes) == 1:
        return usage(outcomes[0])
    merged = Outcome(SpecStats.merged([o.stats for o in outcomes]), "")
    return usage(merged, SpecStats.merged([o.stats for o, first in zip(outcomes, first_of_prompt) if first]))


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


def completion_body(rid: str, kind: str, model_name: str, finished: list[Finished],
                    tool_names: set[str] | None = None) -> dict:
    """The JSON of a finished, non-streamed completion: its choices in order (index i: prompt
    i // n, its (i % n)-th answer), each with its ``origins`` when there are several (one choice:
    ``origins`` beside ``usage``, as always), and one usage over them all. With ``tool_names``, a
    chat answer's calls to those tools go out as its message's ``tool_calls`` (server.tools)."""
    choices = []
    for i, f in enumerate(finished):
        choice = {"index": i, "finish_reason": f.outcome.finish_reason, "logprobs": f.logprobs}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": f.text}
            if tool_names is not None:
                content, calls = tools.parse_calls(f.text, tool_names)
                if calls:
                    choice["message"] = {"role": "assistant", "content": content.strip() or None, "tool_calls": calls}
                    choice["finish_reason"] = _with_calls(f.outcome.finish_reason)
        else:
            choice["text"] = f.text
        if len(finished) > 1:
            choice["origins"] = f.origins
        choices.append(choice)
    total = merged_usage([f.outcome for f in finished], [f.first_of_prompt for f in finished])
    body = {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model_name, "choices": choices, "usage": total}
    if len(finished) == 1:
        body["origins"] = finished[0].origins
    return body


def _with_calls(finish_reason: str) -> str:
    """An answer that called tools ends with "tool_calls" (OpenAI's), unless cut at its length."""
    return "tool_calls" if finish_reason == "stop" else finish_reason


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


class _Chunks:
    """The chunk objects of one stream: same id, object type, creation time and model."""

    def __init__(self, rid: str, kind: str, model_name: str):
        self.kind = kind
        self.head = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                     "created": int(time.time()), "model": model_name}

    def text(self, delta_text: str | None, origins: list[str], finish=None, role=False, live=None,
             logprobs: dict | None = None, index: int = 0) -> str:
        if self.kind == "chat":
            delta = {"role": "assistant"} if role else {}
            if delta_text is not None:
                delta["content"] = delta_text
            choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": index, "text": delta_text or "", "finish_reason": finish, "logprobs": logprobs}
        data = {**self.head, "choices": [choice], "origins": origins}
        if live is not None:
            data["speculation"] = live
        return _sse(data)

    def calls(self, calls: list[dict], index: int) -> str:
        """A chat chunk with an answer's tool calls (each whole: its id, name and arguments)."""
        delta = {"tool_calls": [{"index": j, **c} for j, c in enumerate(calls)]}
        return _sse({**self.head, "choices": [{"index": index, "delta": delta, "finish_reason": None,
                                                "logprobs": None}], "origins": []})

    def usage(self, outcomes: list[Outcome], first_of_prompt: list[bool]) -> str:
        return _sse({**self.head, "choices": [], "usage": merged_usage(outcomes, first_of_prompt)})


@dataclass(frozen=True)
class StreamedChoice:
    """One choice of a stream: ``start()`` queues its job (APIError when it cannot) and gives its
    events and the call that frees the worker from it; ``echo`` (completions: the prompt's text
    and ids, and whether the job scores them) comes before its text."""

    start: Callable[[], tuple[AsyncIterator, Callable[[], None]]]
    echo: tuple[str, list[int], bool] | None = None
    first_of_prompt: bool = True


async def event_stream(choices: list[StreamedChoice], rid: str, kind: str, model_name: str, include_usage: bool,
                       logprobs: Callable[[], Logprobs] | None = None,
                       tool_names: set[str] | None = None) -> AsyncIterator[str]:
    """Server-sent events for the choices' jobs (see generation.job_events), one choice after
    another, each chunk with its choice's index: a chunk per piece (with the live counters as
    ``speculation``, and its token's log-probabilities when ``logprobs`` makes them), a final
    chunk with the finish reason; after the last choice the usage if asked, then ``[DONE]``. A
    choice's echo comes first, in a chunk of its own, with the scores when its job's "prompt" event
    brings them. A job that cannot start (a full queue, a wait past its time limit) ends the stream
    with an error event. The worker is freed from the running job when the stream ends or the
    client leaves. With ``tool_names`` (chat), an answer's text is held from where a call may
    begin (tools.CallStream: its pieces' chunks go out with their log-probabilities and the text
    before it), and its calls go out as one ``tool_calls`` chunk before the final one."""
    chunks = _Chunks(rid, kind, model_name)
    outcomes, cancel = [], None
    try:
        for index, choice in enumerate(choices):
            events, cancel = choice.start()
            lp = logprobs() if logprobs is not None else None
            echo = choice.echo
            held = tools.CallStream(tool_names) if tool_names is not None else None
            if kind == "chat":
                yield chunks.text("", [], role=True, index=index)
            if echo is not None and not echo[2]:
                yield chunks.text(echo[0], [], index=index)
            async for ev, value in events:
                if ev == "prompt":  # the prompt's scores: its echo (with them, when asked for)
                    yield chunks.text(echo[0], [], logprobs=None if lp is None else lp.of_prompt(echo[1], value),
                                      index=index)
                elif ev == "piece":
                    piece, live = value
                    yield chunks.text(piece.text if held is None else held.feed(piece.text), [piece.origin], live=live,
                                      logprobs=lp.of([piece]) if lp is not None else None, index=index)
                else:
                    finish = value.finish_reason
                    if held is not None:
                        rest, calls = held.finish()
                        if calls:
                            rest, finish = rest.strip(), _with_calls(finish)
                        if rest:
                            yield chunks.text(rest, [], index=index)
                        if calls:
                            yield chunks.calls(calls, index)
                    yield chunks.text(None if kind == "chat" else "", [], finish=finish, index=index)
                    outcomes.append(value)
            if len(outcomes) <= index:  # the client left
                return
            cancel()
            cancel = None
        if include_usage:
            yield chunks.usage(outcomes, [c.first_of_prompt for c in choices])
        yield "data: [DONE]\n\n"
    except APIError as e:  # a job never started (a full queue, timed out in it): say so in the stream
        yield _sse({"error": {"message": e.message, "type": e.type, "code": e.code}})
    finally:
        if cancel is not None:
            cancel()
