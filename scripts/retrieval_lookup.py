"""Time a retrieval index: opening it, checking the target's tokenizer against it, and the
lookups of one drafting step at every position of a text (the longest match alone, the
continuations, and the whole propose: trie, ranking, sizing), medians and 90th percentiles.

    python scripts/retrieval_lookup.py ~/.cache/specdraft/index/stdlib [TEXT_FILE]

The default text is a small CSV reader written for this script (not in any index).
"""
import statistics
import sys
import time
from pathlib import Path

import torch

from specdraft.config import SamplingConfig
from specdraft.drafters.retrieval import MATCHES, NGRAM_MAX, NGRAM_MIN, RetrievalTree
from specdraft.models.packaged import DEFAULT_TARGET, resolve_model_dir
from specdraft.retrieval.datastore import Datastore

TEXT = '''import csv


def read_rows(path, delimiter=","):
    """Return the rows of a CSV file as dictionaries keyed by the header."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        return [dict(row) for row in reader]


if __name__ == "__main__":
    import sys

    for row in read_rows(sys.argv[1]):
        print(row)
'''

index = sys.argv[1]
text = Path(sys.argv[2]).read_text() if len(sys.argv) > 2 else TEXT
target_dir = resolve_model_dir(DEFAULT_TARGET, progress=False)

t0 = time.perf_counter()
store = Datastore.open(index)
t1 = time.perf_counter()
store.check_tokenizer(target_dir / "tokenizer.json", DEFAULT_TARGET)
t2 = time.perf_counter()
print(f"{store.header['tokens']:,} tokens; open {1e3 * (t1 - t0):.2f} ms, tokenizer check {1e3 * (t2 - t1):.1f} ms",
      flush=True)

from tokenizers import Tokenizer  # noqa: E402

ids = Tokenizer.from_file(str(target_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids
drafter = RetrievalTree(store, trees=True)
greedy, gen = SamplingConfig(), torch.Generator()
times = {"longest match": [], "continuations": [], "propose": []}
sizes = []
for _ in range(3):  # the first pass pages the index in
    for name in times:
        times[name].clear()
    for end in range(2, len(ids)):
        ctx = ids[:end]
        a = time.perf_counter()
        n, lo, hi = store.longest_match(ctx, NGRAM_MIN, NGRAM_MAX)
        b = time.perf_counter()
        store.continuations(ctx, 8, MATCHES, NGRAM_MIN, NGRAM_MAX)
        c = time.perf_counter()
        drafter.propose(ctx, 8, greedy, gen)  # no costs: the 8 likeliest nodes (the cost rule only cuts further)
        d = time.perf_counter()
        times["longest match"].append(b - a)
        times["continuations"].append(c - b)
        times["propose"].append(d - c)
        sizes.append((n, hi - lo))
for name, ts in times.items():
    ts = sorted(ts)
    print(f"{name:14s} median {1e6 * statistics.median(ts):7.1f} us, p90 {1e6 * ts[int(0.9 * len(ts))]:7.1f} us, "
          f"max {1e6 * ts[-1]:7.1f} us over {len(ts)} positions")
matched = [s for s in sizes[-(len(ids) - 2):] if s[0]]
print(f"matched at {len(matched)} of {len(ids) - 2} positions; median n {statistics.median(s[0] for s in matched)}, "
      f"median matches {statistics.median(s[1] for s in matched)}")
