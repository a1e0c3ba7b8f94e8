"""Which form the AVX-512 VNNI kernels take for a block of rows, measured on this CPU.

The VNNI kernels hold one 8-row group of the weights a ymm or two a zmm (gguf_vnni.cpp). Both
give the same bits; which is faster depends on the core and on how many rows of x each pass over
the weights carries: a core with full-width 512-bit units (Zen 5) wants the zmm form from a few
rows, one that splits a zmm into two 256-bit halves (Zen 4) wants the ymm form's single weight
stream a thread up to ~4 rows. So the choice is measured here, once per CPU, thread count and
kernel build (~3 s): for 1..8 rows a pass and per weight type and row length, each form times
its products within the default target's whole forward (~1 GB of records, streamed from memory
as a model's are), the forms round robin so a slow phase of the machine hits both. The result is kept
under ``<cache>/kernels/`` and set in the kernels at first use; ``SPECDRAFT_VNNI_FORMS=default``
keeps the built-in choice instead, ``=measure`` measures again. A measurement taken while other
work loads the machine (load average above the CPU count + 1) is used but not kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time

import torch

from ..cache import cache_root, console
from . import KernelUnavailable, gguf_ops

ROWS = range(1, 9)  # rows of x a pass over the weights carries (gguf_vnni.cpp: tiles of up to 8)
CLASSES = ("Q4_K short", "Q4_K long", "Q6_K short", "Q6_K long")  # ops.vnni_forms() order

# (kind, out, in) per layer of Qwen2.5-Coder-1.5B in Q4_K_M as the runtime stacks them: q, k (and v
# where it is Q4_K) in one product, gate and up in one; attn_v and ffn_down alternate Q4_K / Q6_K
_EVEN = [("Q4_K", 2048, 1536), ("Q4_K", 1536, 1536), ("Q4_K", 17920, 1536), ("Q4_K", 1536, 8960)]
_ODD = [("Q4_K", 1792, 1536), ("Q6_K", 256, 1536), ("Q4_K", 1536, 1536), ("Q4_K", 17920, 1536), ("Q6_K", 1536, 8960)]
DEFAULT_TARGET_SHAPES = [s for layer in range(28) for s in (_EVEN if layer % 2 == 0 else _ODD)] + [("Q6_K", 151936, 1536)]
REPEATS = 5
PATHS_WITH_FORMS = ("avx512-vnni", "amx-int8")  # amx-int8 runs Q6_K and small blocks on VNNI
RECORD_BYTES = {"Q4_K": 1216, "Q6_K": 1696}  # a super-block of 8 rows in the kernels' layout (gguf_common.h)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "flags"):
                    return value.strip()  # model name first; flags where there is none
    except OSError:
        pass
    return "unknown"


def _plan_file(ops) -> os.PathLike:
    key = hashlib.sha256(f"{_cpu_model()}|{os.cpu_count()}|{torch.get_num_threads()}|{ops.__name__}".encode())
    return cache_root() / "kernels" / f"vnni-forms-{key.hexdigest()[:12]}.json"


def _records(kind: str, out_f: int, in_f: int) -> torch.Tensor:
    """Records of the kernels' layout, every byte 0x11 (small quants, tiny finite scales): the
    kernels' speed does not depend on the values, only on the bytes being real memory."""
    return torch.full((-(-out_f // 8), in_f // 256 * RECORD_BYTES[kind]), 0x11, dtype=torch.uint8)


def measure(repeats: int = REPEATS) -> dict:
    """Every matrix product of the default target's forward (~1 GB of records), over 1..8 rows, in
    each form; each product timed alone and summed per class (what the forms are chosen for), the
    forms round robin. Returns {class: {"ymm": [median s per rows], "zmm": [...]}, "masks": [a mask
    per class]}."""
    ops = gguf_ops()
    saved = ops.vnni_forms()
    products = [(ops.q4k_matmul if kind == "Q4_K" else ops.q6k_matmul, _records(kind, o, i), o, i,
                 CLASSES.index(f"{kind} {'long' if i >= 16 * 256 else 'short'}")) for kind, o, i in DEFAULT_TARGET_SHAPES]
    x = {(n, i): ops.quantize_q8k(torch.randn(n, i)) for n in ROWS for i in {p[3] for p in products}}
    times = {(form, n): [] for form in ("ymm", "zmm") for n in ROWS}  # [per class seconds] per round
    try:
        for _ in range(repeats):
            for n in ROWS:
                for form, mask in (("ymm", 0), ("zmm", 0x1FE)):
                    ops.set_vnni_forms([mask] * len(CLASSES))
                    spent = [0.0] * len(CLASSES)
                    for matmul, w, o, i, c in products:
                        t0 = time.perf_counter()
                        matmul(*x[n, i], w, o)
                        spent[c] += time.perf_counter() - t0
                    times[form, n].append(spent)
    finally:
        ops.set_vnni_forms(saved)
    out: dict = {name: {form: [statistics.median(t[c] for t in times[form, n]) for n in ROWS] for form in ("ymm", "zmm")}
                 for c, name in enumerate(CLASSES)}
    out["masks"] = [sum(1 << n for j, n in enumerate(ROWS) if out[name]["zmm"][j] < out[name]["ymm"][j]) for name in CLASSES]
    return out


_applied: list[str] = []  # what use_measured_forms did in this process, once it has


def use_measured_forms() -> str:
    """Set the VNNI forms this CPU measured (measuring them once, a few seconds, kept in the
    cache) and say which, for the record; once a process. A no-op where the kernels take a path
    without forms (kept for a later call: tests switch paths)."""
    try:
        ops = gguf_ops()
    except KernelUnavailable as e:
        return f"no kernels ({e})"
    if ops.kernel_path() not in PATHS_WITH_FORMS:
        return "not used (kernel path " + ops.kernel_path() + ")"
    if _applied:
        return _applied[0]
    choice = os.environ.get("SPECDRAFT_VNNI_FORMS", "")
    if choice == "default":
        _applied.append(describe(ops.vnni_forms()) + " (built in)")
        return _applied[0]
    path = _plan_file(ops)
    masks = None if choice == "measure" else _kept_masks(path)
    how = "measured on this CPU"
    if masks is None:
        busy = _busy()  # other work now would skew the timings: use them, but do not keep them
        with console().status("measuring the GGUF kernels' forms on this CPU (once, a few seconds)..."):
            result = measure()
        masks = result["masks"]
        try:  # whole or not at all: another process may be reading it
            if busy:
                how = "measured on this CPU while other work loaded it; not kept"
                raise OSError(how)
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_suffix(f".{os.getpid()}.part")
            part.write_text(json.dumps(result, indent=1) + "\n")
            part.replace(path)
        except OSError:
            pass  # a read-only cache: measured again next time
    ops.set_vnni_forms(masks)
    _applied.append(describe(masks) + f" ({how})")
    return _applied[0]


def _busy() -> bool:
    """Whether other work loads the CPUs: the 1-minute load average above one more than the CPU
    count (this process's own threads account for up to the count)."""
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1) + 1
    except OSError:
        return False


def _kept_masks(path) -> list[int] | None:
    """The masks kept in ``path``, or None when there are none or they are not 4 masks of rows 1..8."""
    try:
        masks = json.loads(path.read_text())["masks"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = isinstance(masks, list) and len(masks) == len(CLASSES) and \
        all(isinstance(m, int) and 0 <= m < 512 for m in masks)
    return masks if ok else None


def describe(masks) -> str:
    """The masks in words: the rows a pass that take the zmm form, per class."""

    def rows(mask: int) -> str:
        on = [n for n in ROWS if mask >> n & 1]
        return "-" if not on else f"{on[0]}-{on[-1]}" if on == list(range(on[0], on[-1] + 1)) else ",".join(map(str, on))

    return "zmm form for rows " + ", ".join(f"{rows(m)} ({name})" for name, m in zip(CLASSES, masks)) + ", ymm else"
