"""One source file of this checkout against another commit's, in fresh `specdraft generate`
processes, alternating (what a one-shot command line run sees: every process starts with empty
timing tables and cold caches, which a long bench never shows):

    python scripts/fresh_generate_ab.py FILE [--base REV] [--rounds 6] [--max-new-tokens 128]
                                       [--method M] [PROMPT ...]

Before each generation FILE holds REV's version (base) or this checkout's (this); a kernel source
makes the process load that version's build (built once into the cache, by hash of the sources).
Rounds alternate which arm goes first. Prints each generation's tokens/s, ms a target forward
and forwards, then per prompt the medians and the summed wall time of each arm, and whether the
two arms' texts were the same. FILE is restored to this checkout's version at the end, whatever
happens.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with tests.",
    "Write a short persuasive essay on why cities should plant more trees.",
    "Explain how a hash table handles collisions, with an example in C.",
]


def generate(prompt: str, args) -> dict:
    cmd = ["specdraft", "generate", "--json", "--max-new-tokens", str(args.max_new_tokens), prompt]
    if args.method:
        cmd[2:2] = ["--method", args.method]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    # --json: the text, then the statistics as the last line
    text, _, stats = out.rstrip("\n").rpartition("\n")
    return {**json.loads(stats), "text": text}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("prompts", nargs="*", default=PROMPTS)
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--method")
    args = ap.parse_args()
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    rel = args.file.resolve().relative_to(root).as_posix()
    versions = {"base": subprocess.run(["git", "show", f"{args.base}:{rel}"], cwd=root, capture_output=True,
                                       check=True).stdout,
                "this": (root / rel).read_bytes()}
    runs: dict[tuple[str, int], list[dict]] = {(arm, i): [] for arm in versions for i in range(len(args.prompts))}
    try:
        for r in range(args.rounds):
            for arm in (("base", "this") if r % 2 == 0 else ("this", "base")):
                (root / rel).write_bytes(versions[arm])
                for i, prompt in enumerate(args.prompts):
                    d = generate(prompt, args)
                    runs[arm, i].append(d)
                    print(f"round {r + 1} {arm:4s} prompt {i + 1}: {d['tokens_per_s']:6.2f} tok/s, "
                          f"{1e3 * d['time_verify'] / d['target_forwards']:5.1f} ms a forward, "
                          f"{d['target_forwards']} forwards, {d['time_total']:.3f} s", flush=True)
    finally:
        (root / rel).write_bytes(versions["this"])
    for i in range(len(args.prompts)):
        med = {arm: statistics.median(d["tokens_per_s"] for d in runs[arm, i]) for arm in versions}
        same = {d["text"] for arm in versions for d in runs[arm, i]}
        print(f"prompt {i + 1}: median tok/s base {med['base']:.2f}, this {med['this']:.2f} "
              f"({med['this'] / med['base']:.3f}x); texts {'all the same' if len(same) == 1 else 'DIFFER'}")
    total = {arm: sum(d["time_total"] for i in range(len(args.prompts)) for d in runs[arm, i]) for arm in versions}
    print(f"generation time summed: base {total['base']:.2f} s, this {total['this']:.2f} s "
          f"({total['base'] / total['this']:.3f}x)")


if __name__ == "__main__":
    main()
