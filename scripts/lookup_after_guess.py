"""What lookup finds after a right guess, offline, on answers a bench run recorded:
python scripts/lookup_after_guess.py BENCH.json [--ngram-max 4] [--ngram-min 3] [--depth 8]

For every position i of each `none` answer (the target's greedy text), with the context the
prompt (chat template) plus the answer's first i tokens: how many right tokens prompt lookup
proposes from the context alone (n-grams ngram-max .. ngram-min, as `prompt-lookup` does), and
how many lookup after the context plus the answer's token i proposes for the positions after it
(n-grams down to 2: what drafters.extend adds below a right guess), per category; the last
column counts the latter only where the former found nothing. No model runs: the tokenizer only.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts
from specdraft.drafters.prompt_lookup import find_continuation
from specdraft.models.tokenizer import load_tokenizer


def right(proposal: list[int], answer: list[int], at: int) -> int:
    """How many of proposal's tokens match answer from position at on."""
    n = 0
    while n < len(proposal) and at + n < len(answer) and proposal[n] == answer[at + n]:
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("bench_json")
    p.add_argument("--ngram-max", type=int, default=4)
    p.add_argument("--ngram-min", type=int, default=3)
    p.add_argument("--depth", type=int, default=8, help="tokens a lookup proposes")
    args = p.parse_args()
    run = json.loads(Path(args.bench_json).read_text())
    tok = load_tokenizer(Path(run["config"]["target"]["path"]))  # the target's, as the run had it
    prompts = {q.question_id: q for q in load_prompts(PACKAGED_PROMPTS)}
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # positions, lookup, after a guess, after where lookup 0
    for rec in run["prompts"]:
        if rec["method"] != "none":
            continue
        ids = tok.apply_chat_template([{"role": "user", "content": prompts[rec["question_id"]].text}],
                                      add_generation_prompt=True, tokenize=False)
        ids = tok(ids, add_special_tokens=False)["input_ids"]
        answer = rec["token_ids"]
        row = rows[rec["category"]]
        for i in range(len(answer) - 1):
            context = ids + answer[:i]
            alone = right(find_continuation(context, args.depth, args.ngram_max, args.ngram_min), answer, i)
            after = right(find_continuation(context + [answer[i]], args.depth, args.ngram_max, 2), answer, i + 1)
            row[0] += 1
            row[1] += alone
            row[2] += after
            row[3] += after if alone == 0 else 0
    total = [sum(r[j] for r in rows.values()) for j in range(4)]
    print(f"{'category':16}{'positions':>10}{'lookup':>9}{'after guess':>13}{'where lookup 0':>16}  (right tokens a position)")
    for name, r in [*rows.items(), ("all", total)]:
        print(f"{name:16}{r[0]:>10}{r[1] / r[0]:>9.2f}{r[2] / r[0]:>13.2f}{r[3] / r[0]:>16.2f}")


if __name__ == "__main__":
    main()
