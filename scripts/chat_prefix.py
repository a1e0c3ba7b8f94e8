"""Two-turn chats with and without prompt prefix reuse (specdraft.prefix), as `specdraft serve` runs them.

The Spec-Bench dev prompts of the 8 two-turn (MT-bench) categories, the first N of each: turn 1,
then turn 2 sent with the whole conversation (turn 1, the answer, turn 2), as a chat client does.
Each conversation runs once with reuse and once without, the order alternating; prints turn 2's
prefill time (time to its first token) and whole time both ways, and checks that both ways give
the same tokens.

    python scripts/chat_prefix.py [--method hybrid-head] [--per-category 1] [--max-new-tokens 128]
"""
import argparse
import json
import statistics
import time

import torch

from specdraft.config import GenerationConfig, SpecConfig
from specdraft.pipeline import Speculator
from specdraft.prefix import PrefixCache

ap = argparse.ArgumentParser()
ap.add_argument("--method", default="hybrid-head")
ap.add_argument("--per-category", type=int, default=1)
ap.add_argument("--max-new-tokens", type=int, default=128)
args = ap.parse_args()

sd = Speculator(load_draft=args.method in ("hybrid", "draft-model"))
kept = PrefixCache(sd.target.model)
spec = SpecConfig(method=args.method)
gen = GenerationConfig(max_new_tokens=args.max_new_tokens)
from importlib.resources import files  # noqa: E402

rows = [json.loads(line) for line in files("specdraft.bench").joinpath("data/spec_bench_dev.jsonl").open()]
chats, seen = [], {}
for r in rows:
    if len(r["turns"]) >= 2 and seen.get(r["category"], 0) < args.per_category:
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        chats.append(r)


def conversation(turns: list[str], reuse: bool):
    """Both turns; per turn (token ids, prefill s, total s, prompt tokens, cached prompt tokens)."""
    sd.prefix = kept if reuse else None
    sd.target.model.reset()  # every conversation starts cold: nothing of the previous one kept
    messages, out = [], []
    for text in turns[:2]:
        messages.append({"role": "user", "content": text})
        ids = sd.encode_messages(messages)
        t0 = time.perf_counter()
        res = sd.generate(ids, spec=spec, gen=gen)
        total = time.perf_counter() - t0
        out.append((res.token_ids, res.stats.time_prefill, total, len(ids), res.stats.cached_prompt_tokens))
        messages.append({"role": "assistant", "content": res.text})
    return out


torch.set_num_threads(2)
conversation(chats[0]["turns"], True)  # warm-up
on_pf, off_pf, on_t, off_t, same = [], [], [], [], 0
print(f"method {args.method}; turn 2 of each chat: prompt tokens, cached, prefill s (reuse / whole), turn s")
for i, chat in enumerate(chats):
    order = (True, False) if i % 2 == 0 else (False, True)
    got = {reuse: conversation(chat["turns"], reuse) for reuse in order}
    on, off = got[True][1], got[False][1]
    same += all(a[0] == b[0] for a, b in zip(got[True], got[False]))
    on_pf.append(on[1])
    off_pf.append(off[1])
    on_t.append(on[2])
    off_t.append(off[2])
    print(f"{chat['category']:>11}: {on[3]:4d} tokens, {on[4]:4d} cached; prefill {on[1]:.3f} / {off[1]:.3f} s; "
          f"turn {on[2]:.2f} / {off[2]:.2f} s")
print(f"mean turn-2 prefill {statistics.mean(on_pf):.3f} s with reuse, {statistics.mean(off_pf):.3f} s whole "
      f"({statistics.mean(off_pf) / statistics.mean(on_pf):.1f}x); turn 2 {sum(on_t):.1f} s / {sum(off_t):.1f} s; "
      f"same tokens both ways in {same} of {len(chats)} chats")
