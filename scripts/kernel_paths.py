"""The GGUF kernels' ISA paths side by side: ms per matrix product for the target's shapes and
T = 1..64 rows, every path timed in the same run, interleaved (a shared machine drifts), medians.

    python scripts/kernel_paths.py [--rounds 7] [--rows 1,2,4,8,16,32,64] [--shapes qkv,o,...] [--threads 1]
"""
import argparse
import time

import torch

from specdraft.bench.kernel_cost import random_records
from specdraft.kernels import gguf_ops
from specdraft.models.gguf_weights import quantize_q4k

# qwen2.5-coder-1.5b's matrices (out x in): kind as in its Q4_K_M GGUF (down and the head: Q6_K)
SHAPES = {"qkv": ("Q4_K", 2048, 1536), "o": ("Q4_K", 1536, 1536), "kv": ("Q4_K", 256, 1536),
          "gate_up": ("Q4_K", 17920, 1536), "down": ("Q6_K", 1536, 8960), "head": ("Q6_K", 151936, 1536)}


def weights(kind, out_f, in_f):
    if kind == "Q4_K":
        return quantize_q4k(torch.randn(out_f, in_f) * 0.02)
    # random Q6_K records (every byte pattern is valid once d is a finite float and the offsets are made)
    return random_records(kind, out_f, in_f, torch.Generator().manual_seed(0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--cold-mb", type=int, default=128, help="weights cycled through per shape (MiB)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default); 1 on a busy machine")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ops = gguf_ops()
    paths = ops.kernel_paths()
    print(f"paths {paths}, threads {torch.get_num_threads()}")
    torch.manual_seed(0)
    for name in args.shapes.split(","):
        kind, out_f, in_f = SHAPES[name]
        # copies enough to overflow the last-level cache (32 MiB here), used in turn: a token's
        # forward reads every matrix from memory, and so does each call timed here
        qt = weights(kind, out_f, in_f)
        copies = [qt.w] + [qt.w.clone() for _ in range(-(-args.cold_mb * 2**20 // qt.w.numel()) - 1)]
        f = ops.q4k_matmul if kind == "Q4_K" else ops.q6k_matmul
        for T in (int(t) for t in args.rows.split(",")):
            xq = ops.quantize_q8k(torch.randn(T, in_f))
            times = {p: [] for p in paths}
            for _ in range(args.rounds):
                for p in paths:
                    ops.set_kernel_path(p)
                    f(*xq, qt.w, out_f)  # warm
                    n, t0 = 0, time.perf_counter()
                    while n == 0 or time.perf_counter() - t0 < 0.03:  # >= 30 ms a sample: a call can be 50 us
                        f(*xq, copies[n % len(copies)], out_f)
                        n += 1
                    times[p].append((time.perf_counter() - t0) / n)
            med = {p: sorted(v)[len(v) // 2] * 1000 for p, v in times.items()}
            cells = "  ".join(f"{p} {ms:8.2f} ms" for p, ms in med.items())
            ratio = med[paths[0]] / med[paths[-1]]
            print(f"{name:8s} {kind} {out_f:6d}x{in_f:<5d} T={T:3d}  {cells}  {paths[0]}/{paths[-1]} {ratio:5.2f}", flush=True)
    ops.set_kernel_path("auto")


if __name__ == "__main__":
    main()
