"""Measure forward cost over k new tokens for each dtype: the numbers behind the default dtype.

    python scripts/measure_forward.py --model qwen2.5-coder-1.5b --dtypes bf16,fp32
"""
import argparse
import json

import torch

from specdraft.bench.forward_cost import forward_cost
from specdraft.pipeline import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--formats", default="dense", help="comma-separated weight formats: dense,int8,int4")
    ap.add_argument("--runtime", default="native")
    ap.add_argument("--context", type=int, default=300)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for dtype in args.dtypes.split(","):
        for fmt in args.formats.split(","):
            m = load_model(args.model, dtype=dtype, runtime=args.runtime, max_length=1024, weight_format=fmt)
            cost = forward_cost(m.model, context=args.context)
            row = " ".join(f"{k}:{s * 1000:.0f}ms" for k, s in zip(cost["tokens"], cost["seconds"]))
            print(f"{args.model} {dtype} {fmt} {args.runtime}: {row}", flush=True)
            print(json.dumps({"model": args.model, "dtype": dtype, "weight_format": fmt, **cost}))
            del m


if __name__ == "__main__":
    main()
