"""Fused native decoder vs the Python layer loop on one model: bitwise equality and forward time.

    python scripts/fused_vs_loop.py qwen2.5-coder-1.5b gguf     # the target
    python scripts/fused_vs_loop.py qwen2.5-coder-0.5b q4k      # the draft
"""
import sys
import time

import torch

from specdraft.pipeline import load_model

name, fmt = sys.argv[1], sys.argv[2]
m = load_model(name, dtype="fp32", weight_format=fmt, max_length=1024, draft=fmt=="q4k", progress=False).model
print(type(m).__name__, m.weight_format, m._decoder is not None)
torch.manual_seed(0)
ids = torch.randint(0, 20000, (300,))
m.forward(ids)
L = m.length


def run(T, fused, tree=None):
    m.rollback(L)
    m.fused = fused
    out = m.forward(torch.randint(0, 20000, (T,), generator=torch.Generator().manual_seed(T)), tree_mask=tree)
    return out.logits


for T in (1, 2, 4, 8, 33, 64):
    a, b = run(T, True), run(T, False)
    print(T, "bitwise equal:", torch.equal(a, b))
tree = torch.tensor([[1,0,0,0],[1,1,0,0],[1,0,1,0],[1,0,1,1]], dtype=torch.bool)
print("tree equal:", torch.equal(run(4, True, tree), run(4, False, tree)))
for T in (1, 2, 4):
    for _rep in range(2):
        for fused in (True, False):
            ts = []
            for _ in range(6):
                t0 = time.perf_counter()
                run(T, fused)
                ts.append(time.perf_counter() - t0)
            print(f"T={T} fused={fused} median {sorted(ts)[3]*1000:.1f} ms min {min(ts)*1000:.1f}")
