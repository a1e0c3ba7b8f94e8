"""Two-turn chats with and without prompt prefix reuse (specdraft.prefix), as `specdraft serve` runs them.

The Spec-Bench dev prompts of the 8 two-turn (MT-bench) categories, the first N of each: turn 1,
then turn 2 sent with the whole conversation (turn 1, the answer, turn 2), as a chat client does.

* default: each chat alone, once with reuse and once without, the order alternating;
* ``--interleave``: every chat's turn 1, then every chat's turn 2 (clients taking turns: each
  turn 2 comes after another chat's turn), three ways in turn: reuse with saved copies of earlier
  prefixes (the server's default), reuse of the latest prefix only (``--prefix-cache-mb 0``), none.

Prints turn 2's prefill time (time to its first token) and whole time, and checks that every way
gives the same tokens.

    python scripts/chat_prefix.py [--interleave] [--method hybrid-head] [--per-category 1] [--max-new-tokens 128]
"""
import argparse
import json
import statistics
import time
from importlib.resources import files

import torch

from specdraft.config import GenerationConfig, SpecConfig
from specdraft.pipeline import Speculator
from specdraft.prefix import PrefixCache

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="hybrid-head")
ap.add_argument("--per-category", type=int, default=1)
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--interleave", action="store_true")
args = ap.parse_args()

torch.set_num_threads(2)
sd = Speculator(load_draft=args.method in ("hybrid", "draft-model"))
spec = SpecConfig(method=args.method)
gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
rows = [json.loads(line) for line in files("specdraft.bench").joinpath("data/spec_bench_dev.jsonl").open()]
chats, seen = [], {}
for r in rows:
    if len(r["turns"]) >= 2 and seen.get(r["category"], 0) < args.per_category:
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        chats.append(r)
WAYS = {"saved copies": lambda: PrefixCache(sd.target.model), "latest only": lambda: PrefixCache(sd.target.model, 0),
        "none": lambda: None}


def turn(messages: list[dict]):
    """One turn: (token ids, prefill s, total s, prompt tokens, cached prompt tokens); the answer joins ``messages``."""
    ids = sd.encode_messages(messages)
    t0 = time.perf_counter()
    res = sd.generate(ids, spec=spec, gen=gen)
    total = time.perf_counter() - t0
    messages.append({"role": "assistant", "content": res.text})
    return res.token_ids, res.stats.time_prefill, total, len(ids), res.stats.cached_prompt_tokens


def run(way: str, group: list[dict]) -> list[tuple]:
    """Every chat of ``group`` (turn 1s, then turn 2s); the turn-2 results in chat order."""
    sd.prefix = WAYS[way]()
    sd.target.model.reset()  # nothing kept from before
    talks = [[{"role": "user", "content": c["turns"][0]}] for c in group]
    firsts = [turn(t) for t in talks]
    out = []
    for c, t, first in zip(group, talks, firsts):
        t.append({"role": "user", "content": c["turns"][1]})
        out.append((first[0], *turn(t)))
    return out


turn([{"role": "user", "content": chats[0]["turns"][0]}])  # warm-up
ways = list(WAYS) if args.interleave else ["saved copies", "none"]
got = {w: [] for w in ways}
groups = [chats] if args.interleave else [[c] for c in chats]
for i, group in enumerate(groups):
    for w in (ways if i % 2 == 0 else ways[::-1]):
        got[w] += run(w, group)
ref = got["none"]
print(f"method {args.method}, {'interleaved chats' if args.interleave else 'one chat at a time'}; turn 2 per chat: "
      f"prompt tokens, cached, prefill s and turn s by way ({' / '.join(ways)})")
for i, c in enumerate(chats):
    r = {w: got[w][i] for w in ways}
    print(f"{c['category']:>11}: {r['none'][4]:4d} tokens, cached {' / '.join(str(r[w][5]) for w in ways)}; "
          f"prefill {' / '.join(f'{r[w][2]:.3f}' for w in ways)} s; turn {' / '.join(f'{r[w][3]:.2f}' for w in ways)} s")
for w in ways:
    same = sum(a[0] == b[0] and a[1] == b[1] for a, b in zip(got[w], ref))
    print(f"{w}: mean turn-2 prefill {statistics.mean(x[2] for x in got[w]):.3f} s, turn 2s {sum(x[3] for x in got[w]):.1f} s "
          f"in all; both turns' tokens equal to none's in {same} of {len(chats)} chats")
