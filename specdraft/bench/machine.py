"""Facts about the machine a benchmark ran on: CPU model and flags, GGUF kernel path, threads, memory."""
from __future__ import annotations

import os
import platform
import resource
import sys

import torch

from ..kernels import KernelUnavailable, gguf_ops
from ..kernels.plan import PATHS_WITH_FORMS, forms_note
from ..models.hugepages import pages_note

# The CPU flags that decide which kernels run and how fast: AVX2 (the GGUF kernels' baseline),
# AVX-512 with VNNI (their int8 dot-product path), native bf16, and AMX.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
# cpu_info's numbers: (its key, /proc/cpuinfo's field, the word machine_line says)
CPU_NUMBERS = (("family", "cpu family", "family"), ("model_number", "model", "model"), ("stepping", "stepping", "stepping"))


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def cpu_info() -> dict:
    """CPU model, family / model number / stepping (a name such as "AMD EPYC" covers several
    generations) and which of :data:`CPU_FLAGS` it has (from /proc/cpuinfo on Linux)."""
    first: dict[str, str] = {}  # the first processor's fields
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                first.setdefault(key.strip(), value.strip())
    except OSError:
        pass  # not Linux: platform's answer is the best we have
    flags = set(first.get("flags", "").split())
    numbers = {key: int(first[field]) for key, field, _ in CPU_NUMBERS if first.get(field, "").isdigit()}
    return dict(model=first.get("model name") or platform.processor() or "unknown", **numbers,
                logical_cpus=os.cpu_count(), vector_flags=[f for f in CPU_FLAGS if f in flags])


def gguf_kernel_path() -> str | None:
    """The instruction-set path the GGUF kernels take here (e.g. avx2, avx512-vnni); None when the
    kernels cannot be built on this machine or the build is too old to say."""
    try:
        ops = gguf_ops()
    except KernelUnavailable:
        return None
    return ops.kernel_path() if hasattr(ops, "kernel_path") else None


def gguf_kernel_forms() -> str | None:
    """How the VNNI kernels took blocks of rows in this process so far (kernels.plan), None where
    they do not run."""
    path = gguf_kernel_path()
    return forms_note() if path in PATHS_WITH_FORMS else None


def vector_rates(seconds: float = 0.02) -> dict | None:
    """How fast this core issues ``vpaddw`` and ``vpmaddubsw`` now, in G instructions/s (the
    kernels' probe.cpp, ~``seconds``): the machine's phase. Shared VMs run minutes-long phases in
    which a neighbour takes part of the vector units (AVX2 EPYC: ``vpaddw`` ~9 G/s free, ~4
    shared), and a check of several tokens, bound by them, costs more. None where the kernels are
    unavailable or too old to probe."""
    try:
        ops = gguf_ops()
    except KernelUnavailable:
        return None
    if not hasattr(ops, "issue_rates"):
        return None
    paddw, maddubs = ops.issue_rates(seconds)
    return dict(vpaddw=round(paddw / 1e9, 2), vpmaddubsw=round(maddubs / 1e9, 2))


def rates_line(probes: list[dict]) -> str | None:
    """The run's probes (``vector_rates`` with ``at``) in one line, or None without any."""
    if not probes:
        return None
    parts = []
    for op in ("vpaddw", "vpmaddubsw"):
        values = [p[op] for p in probes]
        parts.append(f"{op} {values[0]:.1f} at the start, {values[-1]:.1f} at the end, "
                     f"{min(values):.1f}-{max(values):.1f} over {len(values)} probes")
    return "Vector units (one core, G instructions/s): " + "; ".join(parts)


def machine_info() -> dict:
    import transformers  # here: the CLI's start does without it

    return dict(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                platform=platform.platform(), cpu=cpu_info(), gguf_kernel_path=gguf_kernel_path(),
                gguf_kernel_forms=gguf_kernel_forms(), weight_pages=pages_note(),
                torch_threads=torch.get_num_threads(), torch_interop_threads=torch.get_num_interop_threads())


def machine_line(info: dict) -> str:
    """``machine_info()`` in one line for the run's header."""
    cpu = info["cpu"]
    numbers = " ".join(f"{word} {cpu[key]}" for key, _, word in CPU_NUMBERS if key in cpu)
    return (f"machine: {cpu['model']} ({numbers + '; ' if numbers else ''}{cpu['logical_cpus']} logical CPUs; flags: "
            f"{', '.join(cpu['vector_flags']) or 'none of ' + ', '.join(CPU_FLAGS)}); "
            f"GGUF kernel path: {info['gguf_kernel_path'] or 'none'}"
            f"{' (' + info['gguf_kernel_forms'] + ')' if info.get('gguf_kernel_forms') else ''}; "
            f"{'weights in ' + info['weight_pages'] + '; ' if info.get('weight_pages') else ''}torch {info['torch']}, "
            f"{info['torch_threads']} threads")
