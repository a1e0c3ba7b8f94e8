"""The GGUF kernels of this checkout against those of another commit, in one process, round robin:

    python scripts/kernel_ab.py [--base REV|DIR] [--blocks 1,2,4,8,16] [--rounds 7] [--threads N] [--model]
                                [--context 300] [--attention] [--shapes Q4_K:2048x8192,...]

Builds the kernel sources of REV (default HEAD, i.e. the last commit against the working tree;
or a directory holding another version's kernel sources)
under another module name, checks that both give the same bits on every product of the default
target's shapes (or --shapes KIND:OUTxIN,...), then times every product over those shapes (~1 GB
of random records for the default target's) for each
block of rows, the two builds alternating, so a slow phase of the machine hits both alike.
--model [MODEL] also times whole forwards of the default target (or MODEL) at context --context (300) with each build's
native decoder over the same weights and caches (blocks of up to 64 rows, models.llama.ROW_EXACT_MAX: a
longer block runs the Python layer loop, whose products take this checkout's kernels in both columns).
--attention also times block_attention alone over 28 layers' caches of the default target's attention
(12 query heads over 2 KV heads of 128 dims) at context --context, each block of new rows causal, after
checking that both builds give the same bits (causal, and a tree mask over the new rows).
Prints medians in ms and base / this ratios.
--threads 1 measures one core alone (on shared VMs the second vCPU's speed comes and goes).
Both builds read this checkout's record layout: a base before 1915b89 (Q6_K records of 1696
bytes, no per-row offset) cannot be compared this way; time each checkout with
scripts/kernel_paths.py instead, alternately.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdraft.bench.kernel_cost import product, random_records
from specdraft.kernels import HERE, build_source_dir, gguf_ops
from specdraft.kernels.plan import DEFAULT_TARGET_SHAPES, describe


def build_base(rev: str):
    """The kernels of commit rev (or of a directory of kernel sources, e.g. copied where there is
    no git history), compiled once into the cache under their own module name."""
    if Path(rev).is_dir():
        return build_source_dir(Path(rev), "gguf_base")
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=HERE, capture_output=True, text=True,
                          check=True).stdout.strip()
    rel = HERE.relative_to(root).as_posix()
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{rel}"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    with tempfile.TemporaryDirectory(prefix="kernels-base-") as tmp:  # the sources are needed only to build
        for n in names:  # REV's own sources: the set may differ from this checkout's
            if n.endswith((".cpp", ".h")):
                (Path(tmp) / n).write_bytes(subprocess.run(["git", "show", f"{rev}:{rel}/{n}"], cwd=root,
                                                           capture_output=True, check=True).stdout)
        return build_source_dir(Path(tmp), "gguf_base")


def attention_timer(builds, blocks, context: int, gen: torch.Generator, layers: int = 28):
    """A function (ops, rows) -> None running block_attention over `layers` caches (one a layer, as
    a forward reads them) of the default target's attention at this context; exits unless both
    builds give the same bits, causal and under a tree mask."""
    nh, nkv, hd = 12, 2, 128
    L = {k: context + k for k in blocks}
    caches = [(torch.randn(nkv, context + max(blocks), hd, generator=gen),
               torch.randn(nkv, context + max(blocks), hd, generator=gen)) for _ in range(layers)]
    qs = {k: torch.randn(nh, k, hd, generator=gen) for k in blocks}
    for k in blocks:
        tree = torch.ones(k, L[k], dtype=torch.bool)
        tree[:, context:] = torch.eye(k, dtype=torch.bool) | (torch.rand(k, k, generator=gen) < 0.3).tril()
        for mask in (None, tree):
            kc, vc = caches[0]
            base, this = (builds[b].block_attention(qs[k], kc, vc, L[k], mask) for b in ("base", "this"))
            if not torch.equal(base, this):
                sys.exit(f"different bits: attention, {k} rows{' under a tree mask' if mask is not None else ''}")
    print(f"same bits in attention ({nh} heads over {nkv}, hd {hd}, context {context}, causal and tree)")

    def run(ops, k):
        for kc, vc in caches:
            ops.block_attention(qs[k], kc, vc, L[k], None)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--blocks", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--model", nargs="?", const="qwen2.5-coder-1.5b", default=None, metavar="MODEL",
                    help="also whole forwards of a model (default: the default target; or a GGUF file)")
    ap.add_argument("--context", type=int, default=300, help="tokens in the cache before the block (--model, --attention)")
    ap.add_argument("--attention", action="store_true", help="also time attention alone (the default target's heads)")
    ap.add_argument("--shapes", help="products to time instead of the default target's: KIND:OUTxIN, comma-separated")
    args = ap.parse_args()
    shapes = DEFAULT_TARGET_SHAPES
    if args.shapes:
        shapes = [(k, *(int(n) for n in oi.split("x"))) for k, oi in (s.split(":") for s in args.shapes.split(","))]
    if args.threads:
        torch.set_num_threads(args.threads)
    blocks = [int(b) for b in args.blocks.split(",")]
    builds = {"base": build_base(args.base), "this": gguf_ops()}
    # both builds take the same fixed VNNI forms (a form is a kernel of its own): the built-in masks,
    # not timed per product (a build that times them would take another form than its base)
    for ops in builds.values():
        if hasattr(ops, "set_vnni_forms_timed"):
            ops.set_vnni_forms_timed(False)
    if hasattr(builds["base"], "set_vnni_forms") and hasattr(builds["this"], "vnni_forms"):
        builds["base"].set_vnni_forms(builds["this"].vnni_forms())
        print(f"VNNI forms (both builds): {describe(builds['this'].vnni_forms())}")
    print(f"kernel path: {builds['this'].kernel_path()}; base {args.base}; {torch.get_num_threads()} threads")
    gen = torch.Generator().manual_seed(0)
    weights = [random_records(k, o, i, gen) for k, o, i in shapes]
    xq = {k: {i: builds["this"].quantize_q8k(torch.randn(k, i, generator=gen)) for i in {s[2] for s in shapes}}
          for k in blocks}
    for k in blocks:
        for w in (weights[:12] + weights[-1:] if shapes is DEFAULT_TARGET_SHAPES else weights):
            base, this = (product(builds[b], w, xq[k][w.in_features]) for b in ("base", "this"))
            if not torch.equal(base, this):
                sys.exit(f"different bits: {w.kind} {w.out_features}x{w.in_features}, {k} rows")
    print("same bits on every product checked")
    timed = {"kernels": lambda ops, k: [product(ops, w, xq[k][w.in_features]) for w in weights]}
    if args.model:
        from specdraft.pipeline import load_model

        ctx = args.context
        m = load_model(args.model, dtype="auto", weight_format="auto", max_length=ctx + max(blocks) + 1).model
        m.reset()
        m.forward(torch.randint(0, 32000, (ctx,), generator=gen), last_only=True)
        decoders = {}
        for name, ops in builds.items():
            m._ops = ops
            decoders[name] = m._build_decoder()
        ids = {k: torch.randint(0, 32000, (k,), generator=gen) for k in blocks}
        builds["this"].set_vnni_forms_timed(False)  # loading the model set the forms timed

        def forward(ops, k):
            m._decoder = decoders["base" if ops is builds["base"] else "this"]
            m.rollback(ctx)
            m.forward(ids[k])
        timed["forward"] = forward
    if args.attention:
        timed["attention"] = attention_timer(builds, blocks, args.context, gen)
    times = {(what, b, k): [] for what in timed for b in builds for k in blocks}
    for r in range(args.rounds + 1):  # round 0 warms up
        for k in blocks:
            for what, f in timed.items():
                for b in (("base", "this") if r % 2 else ("this", "base")):
                    t0 = time.perf_counter()
                    f(builds[b], k)
                    if r:
                        times[what, b, k].append(time.perf_counter() - t0)
    for what in timed:
        print(f"{what} (ms, median of {args.rounds})")
        for k in blocks:
            base, this = (statistics.median(times[what, b, k]) * 1e3 for b in ("base", "this"))
            print(f"  {k:3d} rows: base {base:7.1f}  this {this:7.1f}  base/this {base / this:.2f}")


if __name__ == "__main__":
    main()
