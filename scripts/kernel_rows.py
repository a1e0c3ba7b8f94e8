"""One Q4_K matrix (17920 x 1536, larger than the caches) times 1-32 rows: ms, products/s, weight GB/s.

    python scripts/kernel_rows.py
"""
import time

import torch

from specdraft.kernels import gguf_ops
from specdraft.models.gguf_weights import quantize_q4k

ops = gguf_ops()
torch.manual_seed(0)
O, I = 17920, 1536
w = quantize_q4k(torch.randn(O, I) * 0.02)
print("weight MB", w.w.numel() / 1e6)
for T in (1, 2, 3, 4, 8, 32):
    x = torch.randn(T, I)
    xq = ops.quantize_q8k(x)
    for _ in range(3):
        ops.q4k_matmul(*xq, w.w, O)
    ts = []
    for _ in range(15):
        t0 = time.perf_counter()
        ops.q4k_matmul(*xq, w.w, O)
        ts.append(time.perf_counter() - t0)
    t = sorted(ts)[len(ts)//2]
    print(f"T={T}: {t*1000:.2f} ms  {O*I*T/t/1e9:.1f} G/s  {w.w.numel()/t/1e9:.1f} GB/s  per-row {t*1000/T:.2f} ms")
