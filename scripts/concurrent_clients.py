"""Clients at once against one server: requests decoded together (the server's default) against
each running alone in turn (``--batch-slots 0``), the two servers in one process over one loaded
model, used by turns (the order reversed every other round):

    python scripts/concurrent_clients.py [--clients 4] [--requests 2] [--method hybrid-head] [--rounds 2]

Each client sends its requests one after another (chat completions of distinct dev prompts,
greedy, ``--max-tokens`` new tokens); every client starts at once. Prints, per side, the round's
wall time, completion tokens a second over all clients, and the mean latency of a request;
greedy, both sides must answer the same texts (checked). ``--json F`` writes the rows.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time

import httpx
import uvicorn

from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import SpecConfig
from specdraft.pipeline import Speculator
from specdraft.server.app import ServerConfig, create_app


def _serve(sd, spec: SpecConfig, batch_slots: int) -> tuple[str, uvicorn.Server, threading.Thread]:
    """A live server over ``sd`` on a free port: its base URL, the server and its thread."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(sd, ServerConfig(model_name="m", spec=spec, max_waiting=64, request_timeout=3600,
                                      batch_slots=batch_slots))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def _round(url: str, work: list[list[str]], max_tokens: int) -> tuple[float, list[list[tuple[str, int, float]]]]:
    """Every client's requests (work[c]: its prompts, in order), clients at once: (wall seconds,
    per client per request (text, completion tokens, latency))."""
    out: list[list] = [[] for _ in work]

    def client(c: int) -> None:
        with httpx.Client(timeout=3600) as h:
            for prompt in work[c]:
                t = time.perf_counter()
                r = h.post(url + "/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "temperature": 0}).json()
                out[c].append((r["choices"][0]["message"]["content"], r["usage"]["completion_tokens"],
                               time.perf_counter() - t))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(len(work))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="requests each client sends, one after another")
    ap.add_argument("--method", default="hybrid-head")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sd = Speculator(progress=False, load_draft=False)
    spec = SpecConfig(method=args.method)
    servers = {True: _serve(sd, spec, ServerConfig("m").batch_slots), False: _serve(sd, spec, 0)}
    urls = {k: v[0] for k, v in servers.items()}
    pool = [p.text for p in select_prompts(load_prompts(prompts_path(None)), per_category=2)]
    sides = {True: {"seconds": 0.0, "tokens": 0, "latency": []}, False: {"seconds": 0.0, "tokens": 0, "latency": []}}
    n = args.clients * args.requests
    for r in range(args.rounds):
        work = [[pool[(r * n + c * args.requests + i) % len(pool)] for i in range(args.requests)]
                for c in range(args.clients)]
        texts = {}
        for together in ((True, False) if r % 2 == 0 else (False, True)):
            seconds, out = _round(urls[together], work, args.max_tokens)
            side = sides[together]
            side["seconds"] += seconds
            side["tokens"] += sum(tok for client in out for _, tok, _ in client)
            side["latency"] += [lat for client in out for _, _, lat in client]
            texts[together] = [[text for text, _, _ in client] for client in out]
            print(f"round {r}: {'together' if together else 'alone, in turn'} {seconds:.2f} s", flush=True)
        if texts[True] != texts[False]:
            raise SystemExit(f"round {r}: the answers differ between the two servers")
    for _, server, thread in servers.values():
        server.should_exit = True
        thread.join(timeout=30)
    rows = {("together" if k else "alone"): {"seconds": round(v["seconds"], 2), "tokens": v["tokens"],
                                             "tokens_per_s": round(v["tokens"] / v["seconds"], 2),
                                             "mean_latency_s": round(statistics.mean(v["latency"]), 2)}
            for k, v in sides.items()}
    rows["speedup"] = round(sides[False]["seconds"] / sides[True]["seconds"], 3)
    print(json.dumps(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"clients": args.clients, "requests": args.requests, "method": args.method,
                       "max_tokens": args.max_tokens, "rounds": args.rounds, **rows}, f, indent=1)


if __name__ == "__main__":
    main()
