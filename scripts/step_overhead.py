"""What a decoding step costs outside the target's forward (drafting, verification, the engine's
bookkeeping), per method, with the engine's vectorised argmax and top-k (sampling.argmax,
sampling.topk_indices) and with torch's, alternating so the machine's phases hit both alike:

    python scripts/step_overhead.py [METHODS] [ROUNDS]      # default: none,recycle,hybrid-head 3

Each round generates 96 tokens of one prompt with every method, once each way; prints the ms a
step spent outside ``target.forward`` (the first round warms drafters up and is left out).
"""
from __future__ import annotations

import statistics
import sys
import time

from specdraft import engine, sampling, verify
from specdraft.bench.forward_cost import watched_forwards
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.drafters import base
from specdraft.pipeline import Speculator

PROMPT = "Explain how a hash table handles collisions, with a short Python example."
WAYS = {
    "vectorised": (sampling.argmax, sampling.topk_indices),
    "torch": (lambda x: x.argmax(-1), lambda x, k: x.topk(k, -1).indices),
}


def use(way: str) -> None:
    argmax, topk = WAYS[way]
    for module in (sampling, verify, engine, base):
        module.argmax = argmax
    engine.topk_indices = topk


def main() -> None:
    methods = (sys.argv[1] if len(sys.argv) > 1 else "none,recycle,hybrid-head").split(",")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    sd = Speculator(load_draft=False, progress=False)
    target = sd.target.model
    spent = {"s": 0.0, "n": 0}

    def timed(forward, *args, **kwargs):
        t = time.perf_counter()
        out = forward(*args, **kwargs)
        spent["s"] += time.perf_counter() - t
        spent["n"] += 1
        return out

    got: dict[tuple[str, str], list[float]] = {}
    with watched_forwards(target, timed):
        for r in range(rounds + 1):
            for method in methods:
                for way in WAYS:
                    use(way)
                    spent.update(s=0.0, n=0)
                    t = time.perf_counter()
                    sd.generate(PROMPT, spec=SpecConfig(method=method), gen=GenerationConfig(max_new_tokens=96))
                    outside = (time.perf_counter() - t - spent["s"]) / spent["n"] * 1e3
                    if r:
                        got.setdefault((method, way), []).append(outside)
    for (method, way), ms in got.items():
        print(f"{method:12s} {way:10s} median {statistics.median(ms):5.2f} ms a step outside forwards "
              f"({', '.join(f'{m:.2f}' for m in ms)})")


if __name__ == "__main__":
    main()
