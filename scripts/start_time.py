"""What a command's start costs: a warm `specdraft generate "hi" --max-new-tokens 1` against
llama.cpp loading the same GGUF and answering one chat token, interleaved round by round (the
machine's phases move both alike), wall time and peak resident memory of each process.

    python scripts/start_time.py [ROUNDS] [--no-llama-cpp]

Run once before to warm the cache (conversion, kernels, packs). Prints one line a run and the
range of each.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

LLAMA_CPP = ("import sys; from llama_cpp import Llama; "
             "m = Llama(model_path=sys.argv[1], n_threads=2, n_ctx=512, verbose=False); "
             "m.create_chat_completion([{'role': 'user', 'content': 'hi'}], max_tokens=1)")


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident GB) of one process running cmd."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed (exit {os.waitstatus_to_exitcode(status)})")
    return wall, usage.ru_maxrss / 1e6  # ru_maxrss: KB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="?", type=int, default=5)
    ap.add_argument("--no-llama-cpp", action="store_true")
    args = ap.parse_args()
    script = Path(sys.executable).parent / "specdraft"  # the console script a user runs
    command = [str(script)] if script.exists() else [sys.executable, "-m", "specdraft.cli"]
    runs = {"specdraft": [*command, "generate", "hi", "--max-new-tokens", "1"]}
    if not args.no_llama_cpp:
        from specdraft.models.packaged import DEFAULT_TARGET, gguf_file

        runs["llama.cpp"] = [sys.executable, "-c", LLAMA_CPP, str(gguf_file(DEFAULT_TARGET, progress=False))]
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, cmd in runs.items():
            wall, gb = timed(cmd)
            seen[name].append((wall, gb))
            print(f"round {r + 1} {name:10s} {wall:5.2f} s  {gb:4.2f} GB", flush=True)
    for name, got in seen.items():
        walls, gbs = sorted(w for w, _ in got), sorted(g for _, g in got)
        print(f"{name:10s} wall {walls[0]:.2f}-{walls[-1]:.2f} s (median {walls[len(walls) // 2]:.2f}), "
              f"peak resident {gbs[0]:.2f}-{gbs[-1]:.2f} GB")


if __name__ == "__main__":
    main()
