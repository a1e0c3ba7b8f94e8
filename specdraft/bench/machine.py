"""Facts about the machine a benchmark ran on: CPU model and flags, GGUF kernel path, threads, memory."""
from __future__ import annotations

import platform
import resource
import sys

import torch

from ..cpu import CPU_FLAGS, cpu_info, cpu_numbers
from ..kernels import KernelUnavailable, gguf_ops
from ..kernels.plan import PATHS_WITH_FORMS, forms_note
from ..models.hugepages import pages_note


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


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
    numbers = cpu_numbers(cpu)
    return (f"machine: {cpu['model']} ({numbers + '; ' if numbers else ''}{cpu['logical_cpus']} logical CPUs; flags: "
            f"{', '.join(cpu['vector_flags']) or 'none of ' + ', '.join(CPU_FLAGS)}); "
            f"GGUF kernel path: {info['gguf_kernel_path'] or 'none'}"
            f"{' (' + info['gguf_kernel_forms'] + ')' if info.get('gguf_kernel_forms') else ''}; "
            f"{'weights in ' + info['weight_pages'] + '; ' if info.get('weight_pages') else ''}torch {info['torch']}, "
            f"{info['torch_threads']} threads")
