"""What log-probabilities and penalties cost a generation: one method with and without them,
interleaved prompt by prompt (the order reversed every other prompt, so the machine's phases hit
both sides alike):

    python scripts/request_options_cost.py [--method hybrid-head] [--logprobs 5] [--per-category 1] [--max-new-tokens 128]
    python scripts/request_options_cost.py --logprobs -1 --penalties 1.0,0.5,1.1   # frequency, presence, repetition
    python scripts/request_options_cost.py --logprobs -1 --prompt-logprobs 1        # the prompt scored: prefill times

Prints each side's decode time (prefill excluded) and the ratio, and the time the engine spends
on the options themselves (``Engine._scores`` for log-probabilities, ``Engine._penalized`` for
penalties, timed where they run: a steadier figure than the ratio, which the machine's phases
move by a few percent). With log-probabilities alone both sides must generate the same tokens
(checked); penalties change the text, and the drafters' guesses (made without them) pass less
often, so with penalties the ratio also holds the extra target forwards.
"""
from __future__ import annotations

import argparse
import time

from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.engine import Engine
from specdraft.pipeline import Speculator

SPENT = {"_scores": [0.0, 0], "_penalized": [0.0, 0]}  # seconds in each, calls that did work


def _timed(name: str, busy) -> None:
    """Engine.<name> timed into SPENT when ``busy(args)`` says it did work."""
    inner = getattr(Engine, name)

    def timed(*args):
        t = time.perf_counter()
        got = inner(*args)
        if busy(args):
            SPENT[name][0] += time.perf_counter() - t
            SPENT[name][1] += 1
        return got

    setattr(Engine, name, staticmethod(timed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="hybrid-head")
    ap.add_argument("--logprobs", type=int, default=5, help="most likely tokens beside each one; -1: none asked")
    ap.add_argument("--penalties", default=None, help="FREQUENCY,PRESENCE,REPETITION (default: none)")
    ap.add_argument("--prompt-logprobs", type=int, default=None, help="score the prompt too, N most likely beside")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    _timed("_scores", lambda a: a[2].logprobs is not None)
    _timed("_penalized", lambda a: a[4].penalized)
    sd = Speculator(progress=False, load_draft=args.method in ("draft-model", "hybrid", "fusion"))
    spec = SpecConfig(method=args.method)
    on_gen = GenerationConfig(max_new_tokens=args.max_new_tokens, logprobs=None if args.logprobs < 0 else args.logprobs,
                              prompt_logprobs=args.prompt_logprobs)
    on_sampling = SamplingConfig()
    if args.penalties:
        f, p, r = (float(x) for x in args.penalties.split(","))
        on_sampling = SamplingConfig(frequency_penalty=f, presence_penalty=p, repetition_penalty=r)
    sides = {"off": (GenerationConfig(max_new_tokens=args.max_new_tokens), SamplingConfig()),
             "on": (on_gen, on_sampling)}
    decode = dict.fromkeys(sides, 0.0)
    prefill = dict.fromkeys(sides, 0.0)
    prompt_tokens = 0
    tokens = dict.fromkeys(sides, 0)
    forwards = dict.fromkeys(sides, 0)
    prompts = select_prompts(load_prompts(prompts_path(None)), per_category=args.per_category)
    for n, prompt in enumerate(prompts):
        ids = sd.encode_prompt(prompt.text)
        prompt_tokens += len(ids)
        got = {}
        for name in (list(sides) if n % 2 == 0 else list(sides)[::-1]):
            gen, sampling = sides[name]
            r = sd.generate(ids, spec=spec, gen=gen, sampling=sampling)
            decode[name] += r.stats.time_total - r.stats.time_prefill
            prefill[name] += r.stats.time_prefill
            tokens[name] += len(r.token_ids)
            forwards[name] += r.stats.target_forwards
            got[name] = r.token_ids
        assert args.penalties or got["on"] == got["off"], f"prompt {n}: the tokens differ"
    for name in sides:
        print(f"{name:4s} {tokens[name]} tokens, {forwards[name]} target forwards, decode {decode[name]:.2f} s "
              f"({tokens[name] / decode[name]:.2f} tok/s)")
    print(f"on / off: {decode['on'] / decode['off']:.3f}x decode time, {len(prompts)} prompts, method {args.method}")
    print(f"prefill: {prompt_tokens} prompt tokens, off {prefill['off']:.2f} s, on {prefill['on']:.2f} s "
          f"({prefill['on'] / prefill['off']:.3f}x)")
    for name, (seconds, calls) in SPENT.items():
        if calls:
            print(f"Engine.{name}: {seconds:.3f} s in {calls} calls ({seconds / calls * 1e3:.3f} ms a call), "
                  f"{seconds / decode['on']:.1%} of the 'on' side's decode time")


if __name__ == "__main__":
    main()
