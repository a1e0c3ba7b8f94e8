"""The drafters' matrices in Q6_K through the GGUF kernels (models.small_linear) against W8A8
two-pass (FBGEMM), three ways:

    python scripts/drafter_linear.py times [ROUNDS]
        one call per shape of the shipped drafters at 1, 2, 4, 8 and 16 rows, the two kinds alternating:
        median ms of each;
    python scripts/drafter_linear.py agreement N
        the shipped MLP head's first guess and first two guesses against the target's greedy text
        for the first N Spec-Bench dev prompts (measurement only): matrices in fp32, W8A8 and Q6_K;
    python scripts/drafter_linear.py bench METHODS -- BENCH-ARGS
        the bench with each named method also run as ``<method>@w8a8`` (its matrices in W8A8),
        interleaved, so both kinds meet the same phases of the machine.
"""
from __future__ import annotations

import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import replace

import torch

from specdraft.models.gguf_weights import GGUFLinear, quantize_q6k
from specdraft.models.quant import W8A8Linear

# (in, out) of the shipped drafters' matrices: the MLP head's w1, w2 and fusion of 3 taps (EAGLE's
# too), EAGLE's qkv and o, Hydra's blocks and MTP's w1, MTP's w2
SHAPES = ((3072, 2048), (2048, 1536), (6144, 1536), (3072, 1280), (768, 1536), (3072, 1536), (1536, 1536))


def w8a8(weight, bias=None):
    return W8A8Linear(weight.detach().float(), None if bias is None else bias.detach().float(), passes=2)


def times(rounds: int) -> None:
    torch.manual_seed(0)
    for i, o in SHAPES:
        w = torch.randn(o, i) * 0.02
        kinds = {"w8a8": w8a8(w, torch.zeros(o)), "q6k": GGUFLinear([quantize_q6k(w)], torch.zeros(o))}
        for rows in (1, 2, 4, 8, 16):
            x = torch.randn(rows, i)
            got = {k: [] for k in kinds}
            for _ in range(rounds):
                for k, lin in kinds.items():
                    t = time.perf_counter()
                    lin(x)
                    got[k].append(time.perf_counter() - t)
            med = {k: statistics.median(v[3:]) * 1e3 for k, v in got.items()}
            print(f"{i:5d} -> {o:5d}, {rows} rows: w8a8 {med['w8a8']:.3f} ms, q6k {med['q6k']:.3f} ms, "
                  f"w8a8 / q6k {med['w8a8'] / med['q6k']:.2f}", flush=True)


def agreement(n: int) -> None:
    from specdraft.bench.prompts import PACKAGED_PROMPTS, load_prompts, select_prompts
    from specdraft.config import GenerationConfig, SpecConfig
    from specdraft.drafters.feature_head import FeatureHeadDrafter
    from specdraft.engine import _features
    from specdraft.heads.model import load_head, shipped_head_dir
    from specdraft.pipeline import Speculator

    sd = Speculator(load_draft=False, progress=False)
    target = sd.target.model
    head = load_head(shipped_head_dir(sd.target.name)).eval()
    prompts = [p.text for p in select_prompts(load_prompts(PACKAGED_PROMPTS), per_category=1)][:n]

    def fp32(lin):
        return lambda x: torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias)

    def variant(make):
        d = FeatureHeadDrafter(target, head)
        if make is not None:
            w1, w2 = make(head.w1), make(head.w2)
            d.step = lambda f, e: head.step(f, e, w1, w2)
            d.fuse = make(head.fuse) if d.fuse is not None else None
        return d

    def to_ids(d, index):  # draft indices -> the target's ids
        return index if d.ids is None else d.ids[index]

    drafters = {"fp32": variant(fp32), "w8a8": variant(lambda m: w8a8(m.weight, m.bias)),
                "q6k": variant(None)}  # None: as the drafter builds itself (models.small_linear)
    counts = {k: [0, 0, 0] for k in drafters}  # first guess right, first two right, positions
    with torch.inference_mode():
        for prompt in prompts:
            res = sd.generate(prompt, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=128))
            ids = list(res.prompt_ids) + list(res.token_ids)
            target.reset()
            out = target.forward(torch.tensor(ids), need_hidden=True, taps=head.cfg.taps)
            rows = list(range(len(res.prompt_ids) - 1, len(ids) - 3))  # the row that chose token r + 1
            feats = _features(out, rows)
            for k, d in drafters.items():
                f1 = d.step(d.fused(feats), d.embed[[ids[r + 1] for r in rows]].float())
                g1 = to_ids(d, d.out(f1).argmax(-1))
                g2 = to_ids(d, d.out(d.step(f1, d.embed[g1].float())).argmax(-1))
                hit1 = g1 == torch.tensor([ids[r + 2] for r in rows])
                hit2 = hit1 & (g2 == torch.tensor([ids[r + 3] for r in rows]))
                counts[k][0] += int(hit1.sum())
                counts[k][1] += int(hit2.sum())
                counts[k][2] += len(rows)
    for k, (one, two, total) in counts.items():
        print(f"{k}: first guess {one / total:.4f}, first two {two / total:.4f} ({total} positions)")


@contextmanager
def w8a8_matrices():
    """Drafters built inside take W8A8 matrices instead of models.small_linear's."""
    from specdraft.drafters import eagle, feature_head, medusa

    saved = feature_head.drafter_linear, feature_head.drafter_linear_of, medusa.drafter_linear_of, eagle.drafter_linear_of
    feature_head.drafter_linear = w8a8
    feature_head.drafter_linear_of = medusa.drafter_linear_of = eagle.drafter_linear_of = \
        lambda m: w8a8(m.weight, m.bias)
    try:
        yield
    finally:
        feature_head.drafter_linear, feature_head.drafter_linear_of, medusa.drafter_linear_of, eagle.drafter_linear_of = saved


def bench(methods: list[str], args: list[str]) -> int:
    from specdraft.cli import main
    from specdraft.drafters import base

    for name in methods:
        entry = base._REGISTRY[name]

        def factory(ctx, _build=entry.factory):
            with w8a8_matrices():
                return _build(ctx)

        base._REGISTRY[f"{name}@w8a8"] = replace(entry, factory=factory)
    return main(["bench", *args])


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("times", "agreement", "bench"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "times":
        times(int(sys.argv[2]) if len(sys.argv) > 2 else 30)
    elif sys.argv[1] == "agreement":
        agreement(int(sys.argv[2]))
    else:
        if len(sys.argv) < 4 or sys.argv[3] != "--":
            raise SystemExit(__doc__)
        sys.exit(bench(sys.argv[2].split(","), sys.argv[4:]))
