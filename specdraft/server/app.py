"""The OpenAI-compatible HTTP server: FastAPI routes over one Speculator and one Worker.

Endpoints: POST /v1/chat/completions, POST /v1/completions (plain JSON, or server-sent events
with ``stream: true``), GET /v1/models, GET /health, GET /metrics (Prometheus), GET / (a chat
page that colours each token by its origin).

Every error a client can cause is a 4xx in OpenAI's format ``{"error": {"message", "type",
"param", "code"}}``: invalid JSON or fields (400), an unknown model (404), a body over the size
limit (413), a full queue or a request that waited past its time limit (429).
Each streamed chunk carries, beside OpenAI's fields, ``origins``: per token of its text,
"draft" (an accepted guess) or "target" (produced by the target itself). The ``usage`` object
adds ``speculation``: the request's SpecStats.
"""
from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from importlib import resources
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import drafter_names, needs_draft_model
from ..errors import SpecdraftError
from .metrics import ServerMetrics
from .schemas import ChatRequest, CompletionRequest
from .worker import Job, Outcome, QueueFull, TimedOut, Worker

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the id clients pass as "model"
    spec: SpecConfig = SpecConfig()  # the default speculation; requests may pick another method / k
    max_waiting: int = 16  # queue bound: the next request gets 429
    request_timeout: float = 300.0  # seconds from arrival; a running generation stops there
    max_body_bytes: int = 1 << 20


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status_code=status)


@dataclass(frozen=True)
class GenRequest:
    """What the worker needs for one generation."""

    prompt_ids: list[int]
    spec: SpecConfig
    sampling: SamplingConfig
    gen: GenerationConfig


class Gate:
    """ASGI middleware: bounds request bodies (413 before the app parses anything) and counts
    /v1/ responses by status. The body (at most ``limit`` bytes) is read here and replayed."""

    def __init__(self, app, limit: int, metrics: ServerMetrics):
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")

        async def counting_send(message):
            if message["type"] == "http.response.start" and path.startswith("/v1/"):
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, counting_send)
        too_big = error_response(413, f"the request body exceeds {self.limit} bytes")
        size = dict(scope["headers"]).get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > self.limit):
            return await too_big(scope, receive, counting_send)
        chunks, total, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.limit:
                return await too_big(scope, receive, counting_send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, counting_send)


def create_app(speculator, config: ServerConfig) -> FastAPI:
    metrics = ServerMetrics()
    max_len = speculator.target.model.max_length

    def run(job: Job) -> Outcome:
        req: GenRequest = job.request
        engine = speculator.engine(req.spec)
        pieces = engine.stream(req.prompt_ids, req.sampling, req.gen)
        timed_out = False
        try:
            for piece in pieces:
                st = engine.stats  # live counters, for the page's figures
                job.emit("piece", (piece, {"draft_tokens": st.draft_tokens, "accepted_tokens": st.accepted_tokens,
                                           "target_forwards": st.target_forwards, "step_tokens": st.step_tokens}))
                if job.stopped:
                    timed_out = not job.cancelled.is_set()
                    break
        finally:
            pieces.close()  # ends the engine's loop; its statistics are final
        n = len(engine.token_ids)
        reason = "length" if timed_out or n >= req.gen.max_new_tokens else "stop"
        return Outcome(engine.stats, reason)

    worker = Worker(run, max_waiting=config.max_waiting)

    @asynccontextmanager
    async def lifespan(app):
        yield
        worker.close()

    app = FastAPI(title="specdraft", description="Lossless speculative decoding, OpenAI-compatible API.",
                  lifespan=lifespan)
    app.add_middleware(Gate, limit=config.max_body_bytes, metrics=metrics)
    app.state.worker, app.state.metrics, app.state.config = worker, metrics, config

    # ------------------------------------------------------------------ errors and limits
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON")
        msg = err.get("msg", "invalid request")
        param = ".".join(loc) or None
        return error_response(400, f"{param}: {msg}" if param else msg, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail),
                              "not_found_error" if exc.status_code == 404 else "invalid_request_error")

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError):
        return exc.response()

    # ------------------------------------------------------------------ plain endpoints
    @app.get("/health")
    def health():
        methods = ["none"] + [m for m in drafter_names() if speculator.draft is not None or not needs_draft_model(m)]
        return {"status": "ok", "model": config.model_name, "waiting": worker.waiting,
                "running": worker.running is not None, "methods": methods, "default_method": config.spec.method}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": 0,
                                            "owned_by": "specdraft"}]}

    @app.get("/metrics")
    def prometheus():
        return Response(metrics.render(worker.waiting, worker.running is not None),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse)
    def page():
        return resources.files("specdraft.server").joinpath("page.html").read_text(encoding="utf-8")

    # ------------------------------------------------------------------ generation
    def build(body, prompt_ids: list[int]) -> GenRequest:
        if body.model not in (None, config.model_name):
            raise APIError(404, f"model {body.model!r} is not served here; GET /v1/models lists {config.model_name!r}",
                           param="model", code="model_not_found")
        method = body.method or config.spec.method
        try:
            spec = replace(config.spec, method=method, k=body.k if body.k is not None else config.spec.k)
            if method != "none":
                needs = needs_draft_model(method)
                if needs and speculator.draft is None:
                    raise APIError(400, f"method {method!r} needs a draft model, which this server did not load",
                                   param="method")
            sampling = SamplingConfig(temperature=float(body.temperature), top_k=body.top_k,
                                      top_p=float(body.top_p), seed=body.seed)
        except SpecdraftError as e:
            raise APIError(400, str(e), param="method" if "method" in str(e) else None) from None
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        room = max_len - len(prompt_ids)
        limit = body.token_limit
        if limit is None:
            limit = min(DEFAULT_MAX_TOKENS, room)
        if room < 1 or limit > room:
            raise APIError(400, f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({limit}) exceeds the "
                                f"context of {max_len} tokens", param="max_tokens", code="context_length_exceeded")
        return GenRequest(prompt_ids, spec, sampling, GenerationConfig(max_new_tokens=limit, stop=tuple(body.stop or ())))

    async def generate(request: Request, body, prompt_ids: list[int], kind: str):
        gen_req = build(body, prompt_ids)
        arrived = time.monotonic()
        job = Job(gen_req, asyncio.get_running_loop(), deadline=arrived + config.request_timeout)
        try:
            worker.submit(job)
        except QueueFull as e:
            raise APIError(429, f"the server is busy ({e}); retry later", "rate_limit_error", code="queue_full") from None
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{job.id}"
        if body.stream:
            return StreamingResponse(_sse(request, job, body, rid, kind, arrived), media_type="text/event-stream")
        text, origins, outcome = [], [], None
        try:
            async for ev, value in _events(request, job, arrived):
                if ev == "piece":
                    text.append(value[0].text)
                    origins.append(value[0].origin)
                else:
                    outcome = value
        finally:
            worker.cancel(job)  # no-op when finished; frees the worker if the client left
        if outcome is None:  # the client disconnected
            return Response(status_code=499)
        choice = {"index": 0, "finish_reason": outcome.finish_reason, "logprobs": None}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": "".join(text)}
        else:
            choice["text"] = "".join(text)
        return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()), "model": config.model_name, "choices": [choice],
                "usage": _usage(outcome), "origins": origins}

    async def _events(request: Request, job: Job, arrived: float) -> AsyncIterator[tuple[str, object]]:
        """The job's pieces and then its Outcome; raises APIError for a job that failed to start;
        stops (without an Outcome) when the client disconnects."""
        first = True
        while True:
            try:
                ev, value = await asyncio.wait_for(job.events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            if ev == "error":
                if isinstance(value, TimedOut):
                    raise APIError(429, str(value), "rate_limit_error", code="timeout")
                if isinstance(value, SpecdraftError):
                    raise APIError(400, str(value))
                raise value
            if ev == "piece" and first:
                metrics.ttft.observe(time.monotonic() - arrived)
                first = False
            if ev == "done":
                metrics.record(value.stats, time.monotonic() - arrived)
                yield ev, value
                return
            yield ev, value

    async def _sse(request: Request, job: Job, body, rid: str, kind: str, arrived: float):
        created = int(time.time())
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(delta_text: str | None, origins: list[str], finish=None, role=False, live=None) -> str:
            if kind == "chat":
                delta = {"role": "assistant"} if role else {}
                if delta_text is not None:
                    delta["content"] = delta_text
                choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta_text or "", "finish_reason": finish, "logprobs": None}
            data = {"id": rid, "object": obj, "created": created, "model": config.model_name,
                    "choices": [choice], "origins": origins}
            if live is not None:
                data["speculation"] = live
            return f"data: {json.dumps(data)}\n\n"

        try:
            if kind == "chat":
                yield chunk("", [], role=True)
            async for ev, value in _events(request, job, arrived):
                if ev == "piece":
                    piece, live = value
                    yield chunk(piece.text, [piece.origin], live=live)
                else:
                    yield chunk(None if kind == "chat" else "", [], finish=value.finish_reason)
                    if body.include_usage:
                        usage = {"id": rid, "object": obj, "created": created, "model": config.model_name,
                                 "choices": [], "usage": _usage(value)}
                        yield f"data: {json.dumps(usage)}\n\n"
                    yield "data: [DONE]\n\n"
        except APIError as e:  # the job never started (timed out in the queue): say so in the stream
            yield f"data: {json.dumps({'error': {'message': e.message, 'type': e.type, 'code': e.code}})}\n\n"
        finally:
            worker.cancel(job)  # client gone or stream over: free the worker at once

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest):
        try:
            ids = speculator.encode_messages([{"role": m.role, "content": m.text} for m in body.messages])
        except SpecdraftError as e:
            raise APIError(400, str(e), param="messages") from None
        return await generate(request, body, ids, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], int):
            vocab = speculator.target.model.vocab_size
            if any(not 0 <= t < vocab for t in p):
                raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
            ids = list(p)
        else:
            ids = speculator.encode_prompt(p[0] if isinstance(p, list) else p, chat=False)
        return await generate(request, body, ids, "completion")

    return app


def _usage(outcome: Outcome) -> dict:
    s = outcome.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.new_tokens,
            "total_tokens": s.prompt_tokens + s.new_tokens, "speculation": s.to_dict()}
