"""The OpenAI-compatible HTTP server: FastAPI routes over one Speculator and one Worker.

Endpoints: POST /v1/chat/completions, POST /v1/completions (plain JSON, or server-sent events
with ``stream: true``), POST /v1/responses with GET / DELETE /v1/responses/{id} (OpenAI's
Responses API, over the chat machinery: ``responses_api``), POST /v1/messages and
/v1/messages/count_tokens (Anthropic's Messages API, the same way: ``messages_api``), GET
/v1/models and /v1/models/{id}, GET /health, GET /metrics (Prometheus), GET / (a chat page
that colours each token by its origin), and vLLM's tokenizer endpoints POST /tokenize, POST
/detokenize, GET /tokenizer_info (which lm-evaluation-harness's client uses). With an API key set, /v1/ asks for it.

Every error a client can cause is a 4xx in OpenAI's format ``{"error": {"message", "type",
"param", "code"}}``: invalid JSON or fields (400), a missing or wrong API key (401), an unknown
model (404), a body over the size limit (413), a full queue or a request that waited past its
time limit (429).
Each streamed chunk carries, beside OpenAI's fields, ``origins``: per token of its text,
"draft" (an accepted guess) or "target" (produced by the target itself). The ``usage`` object
adds ``speculation``: the request's SpecStats.

The pieces: ``config`` (ServerConfig), ``errors`` (the error format and handlers), ``gate`` (body
limit, request counts), ``schemas`` (request bodies), ``generation`` (request -> engine -> events),
``responses`` (JSON and server-sent event bodies), ``responses_api`` (the Responses API's
requests, objects, events and stored responses), ``messages_api`` (Anthropic's), ``tools`` (tool calls: their format, parsed out
of answers), ``worker`` (the one-at-a-time scheduler),
``metrics`` (Prometheus). The routes read what they serve from ``app.state``.
"""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from ..drafters import drafter_names, needs_draft_model
from ..errors import SpecdraftError
from ..models.token_bytes import TokenBytes
from . import messages_api, responses_api, tools
from .config import ServerConfig
from .errors import APIError, add_error_handlers
from .gate import Gate
from .generation import (
    DEFAULT_MAX_TOKENS,
    BatchJob,
    GenRequest,
    build_request,
    decodes_together,
    job_events,
    run_generation,
    run_together,
)
from .metrics import ServerMetrics
from .responses import Finished, Logprobs, StreamedChoice, completion_body, event_stream, joined
from .schemas import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from .worker import Job, QueueFull, Worker

__all__ = ["DEFAULT_MAX_TOKENS", "APIError", "GenRequest", "ServerConfig", "create_app"]

router = APIRouter()


def create_app(speculator, config: ServerConfig) -> FastAPI:
    """The app serving ``speculator`` as ``config.model_name``; its worker stops with the app."""
    metrics = ServerMetrics()
    # a request runs alone, on the target's own cache (a chat's next turn finds it there), unless
    # others wait beside it that can be decoded with it: then they run together, and requests
    # arriving meanwhile join them (server.worker)
    together = config.batch_slots > 0
    worker = Worker(functools.partial(run_generation, speculator), max_waiting=config.max_waiting,
                    together=functools.partial(decodes_together, speculator) if together else None,
                    run_together=(lambda job, take: run_together(speculator, job, take, config.batch_slots,
                                                                 config.prefill_chunk))
                    if together else None)

    @asynccontextmanager
    async def lifespan(app):
        yield
        worker.close()

    app = FastAPI(title="specdraft", description="Lossless speculative decoding, OpenAI-compatible API.",
                  lifespan=lifespan)
    app.add_middleware(Gate, limit=config.max_body_bytes, metrics=metrics, api_key=config.api_key)
    app.state.speculator, app.state.worker, app.state.metrics, app.state.config = speculator, worker, metrics, config
    app.state.token_bytes = TokenBytes(speculator.tokenizer)  # names the tokens of log-probabilities
    app.state.responses = responses_api.ResponseStore()  # the Responses API's stored responses, in memory
    add_error_handlers(app)
    app.include_router(router)
    return app


# ------------------------------------------------------------------ plain endpoints


@router.get("/health")
def health(request: Request):
    speculator, config, worker = request.app.state.speculator, request.app.state.config, request.app.state.worker
    methods = [m for m in drafter_names() if speculator.draft is not None or not needs_draft_model(m)]
    return {"status": "ok", "model": config.model_name, "waiting": worker.waiting,
            "running": worker.generating, "methods": methods, "default_method": config.spec.method}


def _model(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "specdraft"}


@router.get("/v1/models")
def models(request: Request):
    return {"object": "list", "data": [_model(request.app.state.config.model_name)]}


@router.get("/v1/models/{name:path}")
def model(request: Request, name: str):
    served = request.app.state.config.model_name
    if name != served:
        raise APIError(404, f"model {name!r} is not served here; this server serves {served!r}", param="model",
                       code="model_not_found")
    return _model(served)


@router.get("/metrics")
def prometheus(request: Request):
    worker = request.app.state.worker
    return Response(request.app.state.metrics.render(worker.waiting, worker.generating),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/", response_class=HTMLResponse)
def page():
    return resources.files("specdraft.server").joinpath("page.html").read_text(encoding="utf-8")


# ------------------------------------------------------------------ the tokenizer (vLLM's endpoints)


@router.get("/tokenizer_info")
def tokenizer_info(request: Request):
    speculator = request.app.state.speculator
    tok = speculator.tokenizer
    return {"tokenizer_class": type(tok).__name__, "eos_token": getattr(tok, "eos_token", None),
            "bos_token": getattr(tok, "bos_token", None), "pad_token": getattr(tok, "pad_token", None),
            "chat_template": getattr(tok, "chat_template", None),
            "model_max_length": speculator.target.model.max_length}


@router.post("/tokenize")
def tokenize(request: Request, body: TokenizeRequest):
    speculator = request.app.state.speculator
    if body.messages is not None:
        if not body.add_generation_prompt:
            raise APIError(400, "messages are tokenized ready for the assistant's answer (add_generation_prompt: true)",
                           param="add_generation_prompt")
        try:
            ids = speculator.encode_messages(tools.template_messages(body.messages),
                                             tools.template_tools(body.tools) if body.tools else None)
        except (SpecdraftError, ValueError) as e:
            raise APIError(400, str(e), param="tools" if "tools" in str(e) else "messages") from None
    else:
        ids = speculator.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"]
    return {"count": len(ids), "max_model_len": speculator.target.model.max_length, "tokens": ids}


@router.post("/detokenize")
def detokenize(request: Request, body: DetokenizeRequest):
    speculator = request.app.state.speculator
    vocab = speculator.target.model.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
    return {"prompt": speculator.tokenizer.decode(body.tokens)}


# ------------------------------------------------------------------ generation


def _chat_prompt(speculator, body: ChatRequest, messages_param: str = "messages") -> tuple[list[int], set[str] | None]:
    """A chat request's prompt ids through the chat template, and, where the answer may call the
    tools, their names (the calls are parsed out of its text; a call format the answer is held
    to is set on ``body``). A 400 for messages or tools the template refuses."""
    try:
        ids = speculator.encode_messages(tools.template_messages(body.messages), body.template_tools)
    except (SpecdraftError, ValueError) as e:
        raise APIError(400, str(e), param="tools" if "tools" in str(e) else messages_param) from None
    names = None
    if body.calls_tools:
        names = {t.function.name for t in body.tools}
        body.hold_to_calls(tools.tags_are_tokens(speculator.tokenizer))
    return ids, names


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatRequest):
    ids, names = _chat_prompt(request.app.state.speculator, body)
    return await _generate(request, body, [(ids, None)], "chat", names)


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest):
    speculator = request.app.state.speculator
    prompts = []  # (ids, echoed text or None) per prompt
    for i, p in enumerate(body.prompts):
        if isinstance(p, list):
            vocab = speculator.target.model.vocab_size
            if any(not 0 <= t < vocab for t in p):
                raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt" + (f".{i}" if i else ""))
            ids, text = list(p), None
        else:
            ids, text = speculator.encode_prompt(p, chat=False), p
        # echo: the prompt as given (token ids: their text)
        prompts.append((ids, (text if text is not None else speculator.tokenizer.decode(ids)) if body.echo else None))
    return await _generate(request, body, prompts, "completion")


@router.post("/v1/responses")
async def create_response(request: Request, body: responses_api.ResponsesRequest):
    """OpenAI's Responses API: the input (after a previous response's conversation, where named)
    answered as a chat request is, as a response object or its typed events (responses_api)."""
    state = request.app.state
    speculator, store = state.speculator, state.responses
    earlier = store.get(body.previous_response_id)[1] if body.previous_response_id else []
    conversation = earlier + responses_api.input_messages(body.input, earlier)
    chat = responses_api.chat_request(body, conversation)
    ids, names = _chat_prompt(speculator, chat, "input")
    try:
        gen_req = build_request(chat, ids, state.config, speculator)
    except APIError as e:  # named as this API names them
        if e.param in ("max_tokens", "response_format"):
            name = "max_output_tokens" if e.param == "max_tokens" else "text.format"
            raise APIError(e.status, e.message.replace(e.param, name), param=name, code=e.code) from None
        raise
    answer = responses_api.Answer(body, state.config.model_name, names)

    def done(response: dict) -> None:
        if body.store:
            store.put(response, conversation + [answer.assistant_message()])

    job, events = _queued(request, gen_req)
    if body.stream:
        stream = responses_api.event_stream(answer, events, lambda: state.worker.cancel(job), state.token_bytes, done)
        return StreamingResponse(stream, media_type="text/event-stream")
    pieces, outcome = await _ended(state.worker, job, events)
    if outcome is None:  # the client disconnected
        return Response(status_code=499)
    response = responses_api.finished_response(answer, pieces, outcome, state.token_bytes)
    done(response)
    return response


@router.post("/v1/messages")
async def create_message(request: Request, body: messages_api.MessagesRequest):
    """Anthropic's Messages API: the conversation answered as a chat request is, as a message
    object or its events (messages_api)."""
    state = request.app.state
    speculator = state.speculator
    if body.max_tokens is None:
        raise APIError(400, "max_tokens: Field required", param="max_tokens")
    chat = messages_api.chat_request(body)
    ids, names = _chat_prompt(speculator, chat)
    gen_req = build_request(chat, ids, state.config, speculator)
    reply = messages_api.Reply(body, state.config.model_name, names, speculator.tokenizer.decode)
    job, events = _queued(request, gen_req)
    if body.stream:
        stream = messages_api.event_stream(reply, len(ids), events, lambda: state.worker.cancel(job))
        return StreamingResponse(stream, media_type="text/event-stream")
    pieces, outcome = await _ended(state.worker, job, events)
    if outcome is None:  # the client disconnected
        return Response(status_code=499)
    return messages_api.finished_message(reply, pieces, outcome)


@router.post("/v1/messages/count_tokens")
def count_message_tokens(request: Request, body: messages_api.MessagesRequest):
    """The prompt tokens a /v1/messages request with this conversation (and tools) prefills."""
    ids, _ = _chat_prompt(request.app.state.speculator, messages_api.chat_request(body))
    return {"input_tokens": len(ids)}


@router.get("/v1/responses/{rid}")
def get_response(request: Request, rid: str):
    return request.app.state.responses.get(rid)[0]


@router.delete("/v1/responses/{rid}")
def delete_response(request: Request, rid: str):
    request.app.state.responses.delete(rid)
    return {"id": rid, "object": "response.deleted", "deleted": True}


async def _collected(events: AsyncIterator) -> tuple[list, object, list | None]:
    """A job's events (generation.job_events) gathered: its pieces, its Outcome (None where the
    client left first) and its prompt's scores (where asked for)."""
    pieces, outcome, prompt_scores = [], None, None
    async for ev, value in events:
        if ev == "piece":
            pieces.append(value[0])
        elif ev == "prompt":
            prompt_scores = value
        else:
            outcome = value
    return pieces, outcome, prompt_scores


async def _ended(worker, job: Job, events: AsyncIterator) -> tuple[list, object]:
    """A lone job's pieces and Outcome once it ends (None where the client left first); the
    worker is freed from it either way."""
    outcome = None
    try:
        pieces, outcome, _ = await _collected(events)
    finally:  # no-op when finished; frees the worker if the client left
        worker.cancel(job)
    return pieces, outcome


def _queued(request: Request, gen_req: GenRequest) -> tuple[Job, AsyncIterator]:
    """``gen_req`` as a job in the worker's queue (429 when it is full), and its events."""
    state = request.app.state
    arrived = time.monotonic()
    job = Job(gen_req, asyncio.get_running_loop(), deadline=arrived + state.config.request_timeout)
    _submit(state.worker, job)
    return job, job_events(request, job, arrived, state.metrics)


def _submit(worker, job: Job) -> None:
    try:
        worker.submit(job)
    except QueueFull as e:
        raise APIError(429, f"the server is busy ({e}); retry later", "rate_limit_error", code="queue_full") from None


def _queued_together(request: Request, gen_reqs: list[GenRequest]) -> tuple[BatchJob, list[AsyncIterator]]:
    """Several choices as one job in the worker's queue, decoded together (429 when the queue
    is full), and each choice's events."""
    state = request.app.state
    arrived = time.monotonic()
    loop = asyncio.get_running_loop()
    deadline = arrived + state.config.request_timeout
    choices = [Job(r, loop, deadline=deadline) for r in gen_reqs]
    job = BatchJob(gen_reqs, loop, deadline=deadline, choices=choices)
    _submit(state.worker, job)
    return job, [job_events(request, c, arrived, state.metrics) for c in choices]


async def _generate(request: Request, body, prompts: list[tuple[list[int], str | None]], kind: str,
                    tool_names: set[str] | None = None):
    """Queue the generations (each prompt's n answers, one after another), then answer with their
    stream or, once all are done, the whole texts (after their prompts', where echoed); with
    ``tool_names`` each answer's calls to those tools parsed out of its text (server.tools)."""
    state = request.app.state
    config, worker = state.config, state.worker
    gen_reqs = [build_request(body, ids, config, state.speculator, j) for ids, _ in prompts for j in range(body.n)]
    wants = gen_reqs[0].gen  # every choice asks for the same things
    # several choices: decoded together where the method and target allow it (each answer the
    # same as alone), else one after another
    together = len(gen_reqs) > 1 and config.batch_slots > 0 and state.speculator.why_not_batched(gen_reqs[0].spec) is None
    if together:
        batch_job, batch_events = _queued_together(request, gen_reqs)
    if body.stream:
        # the first choice is queued now (a full queue: a 429), the others as the stream reaches them
        job, events = (batch_job, batch_events[0]) if together else _queued(request, gen_reqs[0])
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{job.id}"
        scored = wants.prompt_logprobs is not None

        def starter(i: int):
            if together:  # every choice is running already
                return lambda: (batch_events[i], lambda: batch_job.cancel_choice(worker, i))
            if i == 0:
                return lambda: (events, lambda: worker.cancel(job))

            def start():
                later, its_events = _queued(request, gen_reqs[i])
                return its_events, lambda: worker.cancel(later)
            return start

        choices = [StreamedChoice(starter(i), None if echo is None else (echo, ids, scored), i % body.n == 0)
                   for i, (ids, echo) in enumerate(p for p in prompts for _ in range(body.n))]
        logprobs = (lambda: Logprobs(kind, state.token_bytes)) if wants.logprobs is not None else None
        stream = event_stream(choices, rid, kind, config.model_name, body.include_usage, logprobs, tool_names)
        return StreamingResponse(stream, media_type="text/event-stream")
    finished, rid = [], None
    for i, gen_req in enumerate(gen_reqs):
        ids, echo = prompts[i // body.n]
        job, events = (batch_job, batch_events[i]) if together else _queued(request, gen_req)
        rid = rid or f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{job.id}"
        outcome = None
        try:
            pieces, outcome, prompt_scores = await _collected(events)
        finally:  # no-op when finished; frees the worker if the client left
            if together:
                batch_job.cancel_choice(worker, i) if outcome is not None else worker.cancel(job)
            else:
                worker.cancel(job)
        if outcome is None:  # the client disconnected
            return Response(status_code=499)
        scores = None
        if wants.logprobs is not None:
            logprobs = Logprobs(kind, state.token_bytes)
            echoed = logprobs.of_prompt(ids, prompt_scores) if prompt_scores is not None else None
            scores = joined(echoed, logprobs.of(pieces))  # (the prompt's first, for its offsets)
        finished.append(Finished((echo or "") + "".join(p.text for p in pieces), [p.origin for p in pieces], outcome,
                                 scores, i % body.n == 0))
    return completion_body(rid, kind, config.model_name, finished, tool_names)
