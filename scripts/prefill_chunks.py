"""A 320-token prefill of the 1.5B gguf target: in one block (the layer loop) or in 64 / 32-token chunks
(the fused decoder), then a torch profile of the one-block prefill.

    python scripts/prefill_chunks.py
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specdraft.pipeline import load_model

m = load_model("qwen2.5-coder-1.5b", dtype="fp32", weight_format="gguf", max_length=1024, progress=False).model
torch.manual_seed(0)
ids = torch.randint(0, 20000, (320,))


def pre(chunk):
    m.reset()
    t0 = time.perf_counter()
    if chunk:
        for i in range(0, len(ids), chunk):
            m.forward(ids[i:i+chunk], last_only=True)
    else:
        m.forward(ids, last_only=True)
    return time.perf_counter() - t0


for _rep in range(2):
    for chunk in (0, 64, 32):
        print(f"chunk={chunk}: {pre(chunk):.2f} s", flush=True)

with profile(activities=[ProfilerActivity.CPU]) as prof:
    pre(0)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
