"""A GGUF file with a real model's metadata, tensor shapes and quantization types, and random
weights: for timing the target's forward on a machine its weights cannot reach (a lent host
takes 64 MiB of files a call; the default target's GGUF is 1.1 GB, its header 6 MB).

    python scripts/synthetic_gguf.py header REAL.gguf HEADER.bin      # the header alone, here
    python scripts/synthetic_gguf.py fill HEADER.bin OUT.gguf          # the whole file, there

``header`` writes the real file's bytes up to its tensor data, with the full length appended
(8 bytes, little-endian). ``fill`` writes that header into OUT.gguf, extends it to the full
length and fills every tensor's data with random values of its type: Q4_K and Q6_K blocks with
random quants and sub-block scales, and super-block scales small enough to keep activations
finite through every layer; F32 norm weights 1, other F32 tensors (biases) small. Kernel time
depends on shapes and types, not values, so a forward over this file costs what the real one
costs; its text is noise.
"""
from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np

# Block layouts (ggml): Q4_K 144 bytes = d fp16, dmin fp16, 12 bytes of 6-bit scales/mins,
# 128 bytes of 4-bit quants; Q6_K 210 bytes = 128 ql, 64 qh, 16 int8 scales, d fp16 at 208.
BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}
SCALE = np.float16(2e-5)  # 63 * 15 * 2e-5 ~ 0.02: the weights' size in a trained model


def write_header(real: Path, out: Path) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(str(real))
    size = real.stat().st_size
    with open(real, "rb") as src, open(out, "wb") as dst:
        dst.write(src.read(reader.data_offset))
        dst.write(struct.pack("<Q", size))
    print(f"{out}: {reader.data_offset:,} header bytes of {size:,}")


def fill(header: Path, out: Path, seed: int) -> None:
    from gguf import GGUFReader

    blob = header.read_bytes()
    head, (size,) = blob[:-8], struct.unpack("<Q", blob[-8:])
    with open(out, "wb") as f:
        f.write(head)
        f.truncate(size)
    reader = GGUFReader(str(out), "r+")
    rng = np.random.default_rng(seed)
    for t in reader.tensors:
        kind = t.tensor_type.name
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        if kind in BLOCK_BYTES:
            blocks = raw.reshape(-1, BLOCK_BYTES[kind])
            blocks[:] = rng.integers(0, 256, blocks.shape, dtype=np.uint8)
            scales = (blocks[:, :4] if kind == "Q4_K" else blocks[:, 208:210]).view(np.float16)
            scales[:] = SCALE
        elif kind == "F32":
            values = raw.view(np.float32)
            values[:] = 1.0 if t.name.endswith("norm.weight") else rng.normal(0, 0.02, values.shape)
        else:
            sys.exit(f"{t.name}: type {kind} is not filled by this script")
    reader.data.flush()
    print(f"{out}: {len(reader.tensors)} tensors of random weights, {size:,} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    h = sub.add_parser("header", help="the real file's header and length")
    h.add_argument("real", type=Path)
    h.add_argument("out", type=Path)
    f = sub.add_parser("fill", help="a whole file of random weights from a header")
    f.add_argument("header", type=Path)
    f.add_argument("out", type=Path)
    f.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.command == "header":
        write_header(args.real, args.out)
    else:
        fill(args.header, args.out, args.seed)


if __name__ == "__main__":
    main()
