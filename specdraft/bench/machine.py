"""Facts about the machine a benchmark ran on: CPU model and flags, threads, memory."""
from __future__ import annotations

import os
import platform
import resource
import sys

import torch
import transformers

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")  # decide bf16 vs fp32 speed


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def cpu_info() -> dict:
    """CPU model and which of :data:`CPU_FLAGS` it has (from /proc/cpuinfo on Linux)."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model is None:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass  # not Linux: platform's answer is the best we have
    model = model or platform.processor() or "unknown"
    return dict(model=model, logical_cpus=os.cpu_count(), vector_flags=[f for f in CPU_FLAGS if f in flags])


def machine_info() -> dict:
    return dict(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                platform=platform.platform(), cpu=cpu_info(),
                torch_threads=torch.get_num_threads(), torch_interop_threads=torch.get_num_interop_threads())

