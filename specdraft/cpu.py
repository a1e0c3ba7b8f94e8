"""What this CPU is: model name, family / model / stepping and the vector flags that decide which
kernels run and how fast (from /proc/cpuinfo on Linux). The bottom layer: imports nothing of the
package, so the runtime's choices (models.hugepages) and the bench's machine line read one source."""
from __future__ import annotations

import os
import platform

# The CPU flags that decide which kernels run and how fast: AVX2 (the GGUF kernels' baseline),
# AVX-512 with VNNI (their int8 dot-product path), native bf16, and AMX.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
# cpu_info's numbers: (its key, /proc/cpuinfo's field, the word a machine line says)
CPU_NUMBERS = (("family", "cpu family", "family"), ("model_number", "model", "model"), ("stepping", "stepping", "stepping"))


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


def cpu_numbers(cpu: dict) -> str:
    """``cpu_info()``'s numbers in words, e.g. "family 26 model 2 stepping 1" ("" where it has none)."""
    return " ".join(f"{word} {cpu[key]}" for key, _, word in CPU_NUMBERS if key in cpu)


def cpu_words(cpu: dict) -> str:
    """``cpu_info()`` in words, e.g. "AMD EPYC (family 26 model 2 stepping 1)"."""
    numbers = cpu_numbers(cpu)
    return f"{cpu['model']} ({numbers})" if numbers else cpu["model"]


def cpu_key(cpu: dict | None = None) -> str:
    """What a measurement made on this CPU is filed under: model name, numbers, flags and logical
    CPUs (one name covers several generations, and a VM of the same CPU with other flags or
    cores measures otherwise)."""
    cpu = cpu_info() if cpu is None else cpu
    return f"{cpu_words(cpu)}; {cpu['logical_cpus']} logical CPUs; {','.join(cpu['vector_flags']) or 'no listed flags'}"
