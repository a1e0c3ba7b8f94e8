"""The draft model's output head over the first 32,768 ids against the Speculator's default (the
shipped head's listed ids, the target's frequent choices, then the lowest others), one method,
interleaved prompt by prompt with plain decoding (the order reversed every other prompt, so the
machine's phases hit each side alike):

    python scripts/draft_vocab_ab.py [--method draft-model] [--per-category 1] [--max-new-tokens 128]

Both draft models are loaded once; each side keeps its own drafters (their pass rates, their step
times) from prompt to prompt, as a process keeps them from request to request. Prints, per side,
the time over `none`'s with and without the prefill, tokens per target forward and the share of
drafted tokens accepted; and whether every side's text equals `none`'s.
"""
from __future__ import annotations

import argparse
from collections import Counter

from specdraft.bench.machine import vector_rates
from specdraft.bench.prompts import load_prompts, prompts_path, select_prompts
from specdraft.config import GenerationConfig, SpecConfig
from specdraft.pipeline import DEFAULT_DRAFT, DEFAULT_DRAFT_FORMAT, DEFAULT_DRAFT_VOCAB, Speculator, load_model

SUMMED = ("time_total", "time_prefill", "target_forwards", "step_tokens", "drafts", "draft_tokens", "accepted_tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="draft-model", choices=("draft-model", "hybrid"))
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    sd = Speculator(progress=False)
    first = load_model(DEFAULT_DRAFT, dtype="auto", max_length=sd.draft.model.max_length, weight_format=DEFAULT_DRAFT_FORMAT,
                       draft=True, head_vocab=DEFAULT_DRAFT_VOCAB, progress=False)
    assert sd.draft.model.vocab_ids is not None and first.model.vocab_ids is None
    spec = SpecConfig(method=args.method)
    sides = {"none": (SpecConfig(method="none"), sd.draft, {}), "first": (spec, first, {}), "frequent": (spec, sd.draft, {})}

    def run(name: str, text: str, gen: GenerationConfig):
        config, draft, drafters = sides[name]
        sd.draft, sd._drafters = draft, drafters  # this side's draft model and the drafters built on it
        return sd.generate(text, spec=config, gen=gen)

    for name in sides:  # warm every side up once
        run(name, "Count from one to fifty in words.", GenerationConfig(max_new_tokens=64))
    chosen = select_prompts(load_prompts(prompts_path(None)), per_category=args.per_category)
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
    sums = {name: Counter() for name in sides}
    same = Counter()
    print(f"{len(chosen)} prompts, {args.method}; phase at start: {vector_rates()}", flush=True)
    for i, p in enumerate(chosen):
        out = {}
        for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
            out[name] = run(name, p.text, gen)
            sums[name].update({f: getattr(out[name].stats, f) for f in SUMMED})
        same.update(n for n in sides if out[n].token_ids == out["none"].token_ids)
        print(p.category, {n: round(c["time_total"], 1) for n, c in sums.items()}, vector_rates(), flush=True)
    base = sums["none"]
    decode = {n: c["time_total"] - c["time_prefill"] for n, c in sums.items()}
    for name, c in sums.items():
        print(f"{name:9s} {base['time_total'] / c['time_total']:.3f}x none  decode {decode['none'] / decode[name]:.3f}x  "
              f"tokens/forward {c['step_tokens'] / c['target_forwards']:.3f}  accepted {c['accepted_tokens']} of "
              f"{c['draft_tokens']} drafted ({c['accepted_tokens'] / max(c['draft_tokens'], 1):.3f})  "
              f"texts equal to none's {same[name]} of {len(chosen)}")


if __name__ == "__main__":
    main()
