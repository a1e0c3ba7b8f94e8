"""Draft settings of one method against each other and against plain decoding, interleaved prompt by
prompt (the order reversed every other prompt, so the machine's phases hit every setting alike):

    python scripts/policy_ab.py [--prompts N] [--max-new-tokens 128] SETTING...

A SETTING is NAME=METHOD[:k=K][:trees=0|1][:head=DIR], e.g. ``head=head head-k1=head:k=1:trees=0``
(head=DIR: that MLP head instead of the shipped one); ``none``
is always run. On the first prompt of each of the N first Spec-Bench dev categories it prints the
running seconds per setting and the machine's vector issue rates (the phase), then the prefill's
share of ``none``'s time and per setting: speed over ``none`` with and without the prefill, tokens
per target forward, and where a step goes: ms drafting and checking per target forward, the share
of forwards that checked a draft and the nodes a checked draft had.
`specdraft bench` compares methods; this compares how one method's drafts are sized.
"""
from __future__ import annotations

import argparse
from collections import Counter

from specdraft.bench.machine import vector_rates
from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.pipeline import Speculator

# the SpecStats fields summed over a setting's runs
SUMMED = ("time_total", "time_prefill", "time_draft", "time_verify", "target_forwards", "step_tokens", "drafts",
          "draft_tokens")


def setting(text: str) -> tuple[str, SpecConfig]:
    """NAME=METHOD[:k=K][:trees=0|1][:head=DIR] -> (NAME, its SpecConfig)."""
    name, _, rest = text.partition("=")
    method, *opts = rest.split(":")
    kw = {}
    for opt in opts:
        key, _, value = opt.partition("=")
        if key == "k":
            kw["k"] = int(value)
        elif key == "trees":
            kw["trees"] = value not in ("0", "false", "no")
        elif key == "head":
            kw["head"] = value
        else:
            raise SystemExit(f"unknown option {key!r} in {text!r}: k=K, trees=0|1 or head=DIR")
    return name, SpecConfig(method=method, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="+")
    ap.add_argument("--prompts", type=int, default=13, help="the first prompt of this many categories")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    settings = dict([("none", SpecConfig(method="none")), *(setting(s) for s in args.settings)])
    sd = Speculator(load_draft=any(s.method in ("draft-model", "hybrid") for s in settings.values()), progress=False)
    chosen = select_prompts(load_prompts(prompts_path(None)), per_category=1)[:args.prompts]
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    # per setting, the runs' SpecStats summed field by field (tokens: step_tokens, the forwards'
    # tokens after the prefill, as the bench counts them)
    sums = {name: Counter() for name in settings}
    for spec in settings.values():  # warm every drafter up once
        sd.generate("hello", spec=spec, gen=GenerationConfig(max_new_tokens=8))
    print(f"phase at start: {vector_rates()}")
    for i, p in enumerate(chosen):
        for name in (list(settings) if i % 2 == 0 else list(reversed(settings))):
            s = sd.generate(p.text, spec=settings[name], gen=gen).stats
            sums[name].update({f: getattr(s, f) for f in SUMMED})
        print(p.category, {n: round(c["time_total"], 1) for n, c in sums.items()}, vector_rates(), flush=True)
    base = sums["none"]
    decode = {n: c["time_total"] - c["time_prefill"] for n, c in sums.items()}
    print(f"prefill and first token: {1 - decode['none'] / base['time_total']:.0%} of none's time")
    for name, c in sums.items():
        fw = c["target_forwards"]
        print(f"{name:12s} {base['time_total'] / c['time_total']:.3f}x  decode {decode['none'] / decode[name]:.3f}x  "
              f"tokens/forward {c['step_tokens'] / fw:.2f}  per forward: draft {1e3 * c['time_draft'] / fw:.2f} ms, "
              f"check {1e3 * c['time_verify'] / fw:.2f} ms  drafted {c['drafts'] / fw:.0%} of forwards, "
              f"{c['draft_tokens'] / max(c['drafts'], 1):.2f} nodes a draft")

if __name__ == "__main__":
    main()
