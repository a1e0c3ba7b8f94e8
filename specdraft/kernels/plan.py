"""Which form the AVX-512 VNNI kernels take for a block of 1..8 rows, on this CPU, now.

The VNNI kernels hold one 8-row group of the weights a ymm or two a zmm (gguf_vnni.cpp). Both
give the same bits; which is faster depends on the core, on how many rows of x each pass over the
weights carries, and on the machine's state: on the 2-vCPU Zen 5 EPYC the zmm form wins from 4
rows while memory is fast and loses at 3-4 rows in the VM's slower phases, which last minutes.
So by default the kernels time every product as it runs and take the form whose recent times are
lower, trying the other now and then (gguf_forms.h): the choice follows the phases, per weight
shape and rows. ``SPECDRAFT_VNNI_FORMS=default`` fixes the built-in choice instead (zmm from 3
rows for short rows, from 1 for long ones).
"""
from __future__ import annotations

import os

from . import KernelUnavailable, gguf_ops

ROWS = range(1, 9)  # rows of x a pass over the weights carries (gguf_vnni.cpp: tiles of up to 8)
CLASSES = ("Q4_K short", "Q4_K long", "Q6_K short", "Q6_K long")  # ops.vnni_forms() order

# (kind, out, in) per layer of Qwen2.5-Coder-1.5B in Q4_K_M as the runtime stacks them: q, k (and v
# where it is Q4_K) in one product, gate and up in one; attn_v and ffn_down alternate Q4_K / Q6_K
_EVEN = [("Q4_K", 2048, 1536), ("Q4_K", 1536, 1536), ("Q4_K", 17920, 1536), ("Q4_K", 1536, 8960)]
_ODD = [("Q4_K", 1792, 1536), ("Q6_K", 256, 1536), ("Q4_K", 1536, 1536), ("Q4_K", 17920, 1536), ("Q6_K", 1536, 8960)]
DEFAULT_TARGET_SHAPES = [s for layer in range(28) for s in (_EVEN if layer % 2 == 0 else _ODD)] + [("Q6_K", 151936, 1536)]
PATHS_WITH_FORMS = ("avx512-vnni", "amx-int8")  # amx-int8 runs blocks under AMX_MIN_ROWS on VNNI


_set: list[bool] = []  # whether use_forms has set the forms in this process


def use_forms() -> None:
    """Once a process: timed forms, or the built-in ones where SPECDRAFT_VNNI_FORMS=default."""
    if _set:
        return
    try:
        ops = gguf_ops()
    except KernelUnavailable:
        return
    ops.set_vnni_forms_timed(os.environ.get("SPECDRAFT_VNNI_FORMS", "") != "default")
    _set.append(True)


def forms_note() -> str:
    """How blocks of 1..8 rows took their form in this process, in words: the built-in masks, or
    the timed choice's share of zmm products per rows so far."""
    ops = gguf_ops()
    if not ops.vnni_forms_timed():
        return describe(ops.vnni_forms()) + " (built in)"
    picked = {n: [0.0, 0.0] for n in ROWS}
    for key, ymm, zmm, _, _ in ops.vnni_form_stats():
        rows = int(key) >> 1 & 15  # gguf_forms.h form_key: bit 0 the weight type, bits 1-4 the rows
        picked[rows][0] += ymm
        picked[rows][1] += zmm
    seen = {n: zmm / (ymm + zmm) for n, (ymm, zmm) in picked.items() if ymm + zmm}
    if not seen:
        return "form timed per product and rows (no product of 1-8 rows yet)"
    return "form timed per product and rows; zmm share so far " + ", ".join(
        f"{n} rows {share:.0%}" for n, share in seen.items())


def describe(masks) -> str:
    """The masks in words: the rows a pass that take the zmm form, per class."""

    def rows(mask: int) -> str:
        on = [n for n in ROWS if mask >> n & 1]
        return "-" if not on else f"{on[0]}-{on[-1]}" if on == list(range(on[0], on[-1] + 1)) else ",".join(map(str, on))

    return "zmm form for rows " + ", ".join(f"{rows(m)} ({name})" for name, m in zip(CLASSES, masks)) + ", ymm else"
