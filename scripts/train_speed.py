"""How fast each drafter kind trains on a device, at the default target's shapes:
python scripts/train_speed.py [--device auto|cpu|cuda] [--precision fp32|bf16] [--seconds 30] [--kinds eagle,mlp,hydra,mtp]
    [--json OUT]

Speed alone, on synthetic features (random fp16 rows of the default target's hidden size 1536,
three tapped layers, answers of 160 rows, 16,384-id draft vocabulary), so it runs where the
target cannot be loaded (a GPU host without the model file): each kind trains with its shipped
recipe's settings (specdraft/heads/trained/qwen2.5-coder-1.5b/*/train.json) for --seconds, and the
script prints optimizer steps a second, training rows a second and what one epoch over the
shipped EAGLE layer's answer set (484,014 pairs) or the shipped heads' (~500k positions) would
take at that pace. What the drafters learn is the tests' and train-drafter's business.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from specdraft.heads.data import FeatureSet
from specdraft.heads.device import PRECISIONS, training_device
from specdraft.heads.eagle_train import EagleTrainConfig, TargetShape, train_eagle
from specdraft.heads.medusa import MedusaTrainConfig, train_medusa
from specdraft.heads.train import TrainConfig, train_head

H, TAPS, VOCAB, DOC = 1536, (1, 13, 24), 16384, 160
SHAPE = TargetShape(num_heads=12, num_kv_heads=2, head_dim=128)  # Qwen2.5-Coder-1.5B's attention
SHIPPED_ROWS = {"eagle": 484_014, "mlp": 502_688, "hydra": 502_688, "mtp": 247_019}  # their train.json


def synthetic(positions: int, seed: int = 0) -> tuple[FeatureSet, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    docs = positions // DOC
    n = docs * DOC
    feats = torch.randn(n, H, generator=g).half()
    aux = torch.randn(n, len(TAPS), H, generator=g).half()
    tokens = torch.randint(0, VOCAB, (n,), generator=g)
    top = torch.randint(0, VOCAB, (n, 8), generator=g)
    data = FeatureSet(feats, tokens, top, torch.arange(0, n + 1, DOC), aux, TAPS)
    return data, torch.randn(VOCAB, H, generator=g), torch.randn(VOCAB, H, generator=g)


def run(kind: str, data, emb, w, device, seconds: float, precision: str = "fp32") -> dict:
    quiet = dict(log=lambda *a: None, seconds=seconds, device=device, precision=precision)
    t0 = time.perf_counter()
    if kind == "eagle":  # the shipped layer's recipe: head form, 6 query heads, taps 1, 13, 24
        cfg = EagleTrainConfig(inner=2048, vocab=VOCAB, steps=3, epochs=1, rows=1024, chunk=512, lr=3e-4,
                               form="head", heads=6, taps=TAPS, holdout=0.01)
        _, report = train_eagle(data, emb, w, SHAPE, cfg, **quiet)
        rows = cfg.rows
    elif kind == "hydra":
        cfg = MedusaTrainConfig(num_heads=4, vocab=VOCAB, epochs=1, batch=512, holdout=0.01)
        _, report = train_medusa(data, w, cfg, kind="hydra", emb=emb, **quiet)
        rows = cfg.batch
    else:
        cfg = TrainConfig(inner=2048 if kind == "mlp" else 1536, vocab=VOCAB, epochs=1, batch=256, lr=3e-4,
                          holdout=0.01, taps=TAPS if kind == "mlp" else ())
        _, report = train_head(data, emb, w, cfg, kind=kind, **quiet)
        rows = cfg.batch
    per_step = report["seconds"] / max(1, report["steps"])
    return {"kind": kind, "device": report["device"], "precision": precision, "steps": report["steps"],
            "seconds": report["seconds"],
            "steps_per_s": round(1 / per_step, 2), "rows_per_s": round(rows / per_step),
            "shipped_epoch_s": round(SHIPPED_ROWS[kind] / rows * per_step, 1),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="the steps' products (train-drafter --precision)")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--kinds", default="eagle,mlp,hydra,mtp")
    p.add_argument("--positions", type=int, default=64_000)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = training_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {device} ({name})", flush=True)
    data, emb, w = synthetic(args.positions)
    results = []
    for kind in args.kinds.split(","):
        results.append(run(kind, data, emb, w, device, args.seconds, args.precision))
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "name": name, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
