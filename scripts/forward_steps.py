"""Where a GGUF model's forward goes, step by step: ms a forward in each native decoder step (summed
over the layers), the output head, and the rest, for blocks of new tokens at a context, on each
kernel ISA path asked for (interleaved rounds, medians).

    python scripts/forward_steps.py [--model MODEL|FILE.gguf] [--blocks 1,16] [--context 300]
                                    [--repeats 7] [--paths avx2,avx512-vnni,...]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdraft.bench.kernel_cost import kernel_paths
from specdraft.models.packaged import DEFAULT_TARGET
from specdraft.pipeline import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="packaged name or .gguf (default: the default target)")
    ap.add_argument("--blocks", default="1,16")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--paths", default=None, help="kernel ISA paths (comma-separated, or all); default: the one chosen")
    args = ap.parse_args()
    m = load_model(args.model or DEFAULT_TARGET, weight_format="gguf", max_length=args.context + 64).model
    decoder = m._decoder
    if decoder is None:
        raise SystemExit("this model does not run its layers natively (GGUF weights, fp32) on this machine")
    ops = m._ops
    paths = kernel_paths(args.paths, "--paths")[1] if args.paths else [ops.kernel_path()]
    gen = torch.Generator().manual_seed(0)
    m.reset()
    m.forward(torch.randint(0, 32000, (args.context,), generator=gen), last_only=True)
    names = [*decoder.step_names, "output head + rest", "whole forward"]
    blocks = [int(b) for b in args.blocks.split(",")]
    ids = {k: torch.randint(0, 32000, (k,), generator=gen) for k in blocks}
    times = {(p, k): [] for p in paths for k in blocks}
    for r in range(2 + args.repeats):  # two warm-up rounds, then round robin over blocks and paths
        for k in blocks:
            for p in paths:
                ops.set_kernel_path(p)
                m.rollback(args.context)
                decoder.clear_step_seconds()
                t0 = time.perf_counter()
                m.forward(ids[k])
                total = time.perf_counter() - t0
                steps = decoder.step_seconds()
                if r >= 2:
                    times[p, k].append([*steps, total - sum(steps), total])
    ops.set_kernel_path("auto")
    print(f"{args.model or 'default target'}, context {args.context}, {torch.get_num_threads()} threads: "
          f"ms a forward (medians of {args.repeats})")
    cols = [(p, k) for k in blocks for p in paths]
    print(f"{'step':<20}" + "".join(f"{p + ' x' + str(k):>22}" for p, k in cols))
    for i, name in enumerate(names):
        print(f"{name:<20}" + "".join(f"{statistics.median(t[i] for t in times[c]) * 1000:>22.2f}" for c in cols))


if __name__ == "__main__":
    main()
