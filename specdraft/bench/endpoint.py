"""``specdraft bench --endpoint URL``: time any OpenAI-compatible server (ours, vLLM, llama.cpp).

Each prompt goes to ``URL/chat/completions`` as one user turn, streaming, with
``max_tokens`` = --max-new-tokens; greedy, or with --temperature > 0 sampled with ``top_p``,
``top_k`` (when set; not OpenAI's field, but ours, vLLM's and llama.cpp's servers take it) and a
``seed`` per prompt from --seed and the prompt's text (see :mod:`specdraft.bench.sampled`);
with --ignore-eos also ``ignore_eos`` (ours, vLLM's and SGLang's servers take it).

Per prompt: the time to the first content chunk, the time to the end, and the tokens generated
(``usage.completion_tokens`` when the server reports it, else the number of content chunks,
which is one token per chunk on llama.cpp and on our server).
A specdraft server's ``usage.speculation`` also gives tokens per target forward and acceptance.

The report has the same flat rows as the local benchmark (speedup and exactness are null: there
is no baseline in the same run), plus ``ttft_s`` (mean time to first token), ``latency_p50_s``
and ``latency_p90_s`` (a request's seconds); with --concurrency N, N requests are in flight at
once (N clients, each sending the next prompt as its previous one ends: a serving load) and the
overall row adds ``wall_s`` and ``throughput_tokens_per_s``, all tokens over the run's wall time
(``tokens_per_s`` stays each request's own rate).
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress

from ..config import SamplingConfig
from ..errors import ParameterError, SpecdraftError
from ..options import sampling_from_args
from .prompts import categories_in_order, prompts_from_args
from .records import ratio, sum_known
from .report import check_output_path, report_location, write_text
from .sampled import prompt_seed, sampling_report


class EndpointError(SpecdraftError):
    """The endpoint cannot be reached or does not answer like an OpenAI server."""


@dataclass
class Timing:
    question_id: int | str
    category: str
    new_tokens: int
    seconds: float  # request sent -> stream ended
    ttft: float | None  # request sent -> first content
    step_tokens: int | None = None  # from usage.speculation, when the server says
    target_forwards: int | None = None
    drafted: int | None = None
    accepted: int | None = None


def request_body(model: str | None, text: str, max_tokens: int, sampling: SamplingConfig,
                 ignore_eos: bool = False) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": sampling.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:  # an extension field: ours, vLLM's and SGLang's servers take it
        body["ignore_eos"] = True
    if not sampling.greedy:
        body.update(top_p=sampling.top_p, seed=prompt_seed(sampling.seed, text))
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.min_p:  # (vLLM's extension field, as ours)
            body["min_p"] = sampling.min_p
    if model:
        body["model"] = model
    return body


def stream_one(client, url: str, body: dict) -> tuple[int, float, float | None, dict | None]:
    """One streamed request -> (tokens, seconds, ttft, usage or None)."""
    chunks, usage, ttft = 0, None, None
    t0 = time.perf_counter()
    with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            r.read()
            raise EndpointError(f"{url} answered {r.status_code}: {r.text[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                msg = json.loads(line[6:])
            except json.JSONDecodeError:
                raise EndpointError(f"{url} sent a stream line that is not JSON: {line[:80]!r}") from None
            if msg.get("error"):
                raise EndpointError(f"{url} reported an error: {msg['error']}")
            if msg.get("usage"):
                usage = msg["usage"]
            for choice in msg.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    tokens = (usage or {}).get("completion_tokens") or chunks
    return tokens, seconds, ttft, usage


def summarise(method: str, category: str, timings: list[Timing]) -> dict:
    n = sum(t.new_tokens for t in timings)
    secs = sum(t.seconds for t in timings)
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    decode = sum(t.seconds - t.ttft for t in timings if t.ttft is not None)
    forwards = sum_known(timings, "target_forwards")
    latency = sorted(t.seconds for t in timings)
    return dict(method=method, category=category, tokens_per_s=ratio(n, secs), speedup=None,
                decode_tokens_per_s=ratio(n - len(ttfts), decode), decode_speedup=None,
                ttft_s=ratio(sum(ttfts), len(ttfts)),
                latency_p50_s=_quantile(latency, 0.5), latency_p90_s=_quantile(latency, 0.9),
                mean_accepted_tokens=ratio(sum_known(timings, "step_tokens"), forwards),
                acceptance_rate=ratio(sum_known(timings, "accepted"), sum_known(timings, "drafted")),
                exact_match_rate=None, prompts=len(timings), new_tokens=n, seconds=secs, target_forwards=forwards)


def _quantile(ordered: list[float], q: float) -> float | None:
    """The q-quantile of ascending values (the nearest rank), None for none."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def run_endpoint(args) -> int:
    sampling = sampling_from_args(args)
    prompts = prompts_from_args(args)
    check_output_path(args.json_out, "--json")
    if args.concurrency < 1:
        raise ParameterError(f"--concurrency must be >= 1, got {args.concurrency}")
    base = args.endpoint.rstrip("/")
    url = base + "/chat/completions"
    method = args.endpoint_name or f"endpoint {base}"
    console = Console(stderr=True)
    try:
        with httpx.Client(timeout=args.endpoint_timeout, limits=httpx.Limits(max_connections=args.concurrency + 4)) \
                as client, Progress(console=console) as progress:
            task = progress.add_task(method, total=len(prompts))

            def timed(p) -> Timing:
                body = request_body(args.endpoint_model, p.text, args.max_new_tokens, sampling, args.ignore_eos)
                tokens, secs, ttft, usage = stream_one(client, url, body)
                spec = (usage or {}).get("speculation") or {}
                progress.advance(task)
                return Timing(p.question_id, p.category, tokens, secs, ttft, spec.get("step_tokens"),
                              spec.get("target_forwards"), spec.get("draft_tokens"), spec.get("accepted_tokens"))

            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                timings: list[Timing] = list(pool.map(timed, prompts))  # in prompt order
            wall = time.perf_counter() - t0
    except httpx.HTTPError as e:
        raise EndpointError(f"cannot talk to {url} ({type(e).__name__}: {e}); is the server running?") from None
    rows = [summarise(method, c, [t for t in timings if t.category == c]) for c in categories_in_order(prompts)]
    overall = summarise(method, "overall", timings)
    overall.update(wall_s=wall, throughput_tokens_per_s=ratio(overall["new_tokens"], wall))
    rows.append(overall)
    report = dict(config=dict(endpoint=base, model=args.endpoint_model, max_new_tokens=args.max_new_tokens,
                              ignore_eos=args.ignore_eos, concurrency=args.concurrency,
                              sampling=sampling_report(sampling)),
                  results=rows, prompts=[t.__dict__ for t in timings])
    if args.json_out is not None:
        write_text(Path(args.json_out), json.dumps(report, indent=1) + "\n")
    o = rows[-1]
    where = report_location(args.json_out)
    ttft = o["ttft_s"] if o["ttft_s"] is None else round(o["ttft_s"], 2)
    if args.concurrency > 1:
        console.print(f"{method}: {o['new_tokens']} tokens in {wall:.1f} s with {args.concurrency} requests in "
                      f"flight, {o['throughput_tokens_per_s']:.2f} tok/s; a request {o['tokens_per_s']:.2f} tok/s, "
                      f"latency p50 {o['latency_p50_s']:.2f} s, p90 {o['latency_p90_s']:.2f} s, time to first "
                      f"token {ttft} s; {where}")
    else:
        console.print(f"{method}: {o['new_tokens']} tokens in {o['seconds']:.1f} s, {o['tokens_per_s']:.2f} tok/s, "
                      f"time to first token {ttft} s; {where}")
    return 0
