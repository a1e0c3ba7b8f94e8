"""Large weight buffers and KV caches in 2 MB pages (Linux transparent huge pages).

Why: a one-token forward streams the target's ~1.1 GB of GGUF records. In 4 KB pages that is
~270,000 pages a forward, each a TLB miss and a page walk, and the walks' entries push the rest of
the step's (the drafter's weights, the KV cache, Python) out of the TLB; in 2 MB pages it is ~550.
Measured on the AMX Xeon (`python scripts/huge_pages.py`, BENCHMARKS.md): the default target's
one-token forward 1.18x faster (46.5 -> 39.4 ms), 16 tokens 1.08x. On the AVX2 EPYC (Zen 3, KVM)
the forwards run as fast from 4 KB pages (one token 0.94-1.03x, both kinds in one process, forwards
interleaved): its page walks keep up with a 27 GB/s stream.

Linux gives 2 MB pages to private anonymous memory where transparent huge pages are "always", or
"madvise" and the range is marked MADV_HUGEPAGE (Debian's and Ubuntu's default is "madvise"); a
file mapping (the packed records' np.memmap) gets 4 KB pages. So the records are read into such a
buffer instead of being mapped (a private copy a process, where the mapping shared one; the page
cache copy stays reclaimable). A model's KV caches too: a decode step's attention reads every
cached row from memory, ~25% faster from 2 MB pages (context 1500: 7.7 -> 5.8 ms a forward); they
are then resident from the first token (~224 MB for the default target's 4096 positions, where 4 KB
pages are made as the context grows). ``SPECDRAFT_HUGE_PAGES=0`` keeps 4 KB pages everywhere,
e.g. to measure the difference. Elsewhere (no THP, another OS) every function here falls back
quietly.
"""
from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

HUGE = 2 << 20  # bytes in a huge page (x86-64)
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# the smallest buffer given its own mapping (a draft model's re-quantized matrices are ~0.5-10 MB; a
# mapping's last huge page may hold up to 2 MB of nothing)
MIN_BYTES = HUGE


# New tokens from which a one-shot command (specdraft generate) takes 2 MB pages by default. They
# cost a start time: the kernel assembles ~1.3 GB of them, compacting memory where it is
# fragmented (the README's first command, warm, on the AMX Xeon: 12.1-12.4 s of wall time against
# 9.1-9.5 in 4 KB pages), and pay back ~6 ms a target forward, ~2 ms a token at hybrid-head's ~3.4
# tokens a forward on code. Long-lived processes (serve, bench, calibrate, the Python API) take
# them whatever they decode.
PAYS_FROM_TOKENS = 1000


def thp_mode() -> str:
    """The kernel's transparent huge page setting: "always", "madvise", "never", or "unavailable"."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")  # e.g. "always [madvise] never"
    return text[start + 1:end] if 0 <= start < end else "unavailable"


_unasked_off = [False]  # inside short_run(): huge pages only where SPECDRAFT_HUGE_PAGES=1 asks


@contextmanager
def short_run(short: bool = True) -> Iterator[None]:
    """Loads within take 4 KB pages unless ``SPECDRAFT_HUGE_PAGES=1`` asks for 2 MB ones (a short
    one-shot run, see PAYS_FROM_TOKENS); ``short=False``: no change."""
    before = _unasked_off[0]
    _unasked_off[0] = before or short
    try:
        yield
    finally:
        _unasked_off[0] = before


def _refused() -> str | None:
    """Why this process does not want huge pages now, in words, or None: ``SPECDRAFT_HUGE_PAGES=0``,
    or a short_run where SPECDRAFT_HUGE_PAGES does not ask for them."""
    env = os.environ.get("SPECDRAFT_HUGE_PAGES")
    if env == "0":
        return "SPECDRAFT_HUGE_PAGES=0"
    if env is None and _unasked_off[0]:
        return "a short run; SPECDRAFT_HUGE_PAGES=1 asks for 2 MB"
    return None


def enabled() -> bool:
    """Whether buffers here are made in huge pages: THP on (always / madvise), Linux's madvise
    available, and not refused (``SPECDRAFT_HUGE_PAGES=0``, or a short_run not asking for them)."""
    return (_refused() is None and thp_mode() in ("always", "madvise") and hasattr(mmap, "MADV_HUGEPAGE")
            and hasattr(mmap, "MAP_ANONYMOUS"))


def huge_empty(nbytes: int) -> torch.Tensor | None:
    """uint8 [nbytes], uninitialised, starting on a 2 MB boundary of a private anonymous mapping
    marked MADV_HUGEPAGE; None where huge pages are off (``enabled``) or the mapping fails. The
    tensor keeps the mapping alive (torch.frombuffer holds a reference to it)."""
    if nbytes < MIN_BYTES or not enabled():
        return None
    try:
        # one huge page more than needed, so that the buffer can start on a 2 MB boundary
        m = mmap.mmap(-1, -(-nbytes // HUGE) * HUGE + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = torch.frombuffer(m, dtype=torch.uint8)
        skip = -whole.data_ptr() % HUGE
        m.madvise(mmap.MADV_HUGEPAGE, skip, len(m) - skip)
    except (OSError, ValueError):
        return None
    return whole[skip:skip + nbytes]


def read_huge(path: Path, offset: int, nbytes: int, chunk: int = 64 << 20) -> torch.Tensor | None:
    """uint8 [nbytes]: the file's bytes from ``offset``, read into a huge_empty buffer; None where
    huge pages are off. OSError (a file cut short included) propagates."""
    buf = huge_empty(nbytes)
    if buf is None:
        return None
    view = memoryview(buf.numpy())
    with open(path, "rb") as f:
        f.seek(offset)
        done = 0
        while done < nbytes:
            n = f.readinto(view[done:done + min(chunk, nbytes - done)])
            if not n:
                raise OSError(f"{path.name} ends {nbytes - done} bytes early")
            done += n
    return buf


def in_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` (same dtype and shape) in huge pages, or ``t`` itself where huge
    pages are off or ``t`` is small."""
    buf = huge_empty(t.nbytes)
    if buf is None:
        return t
    out = buf.view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


def huge_zeros(shape: tuple[int, ...], dtype: torch.dtype, count: int) -> list[torch.Tensor]:
    """``count`` zero tensors of ``shape`` side by side in one huge-page mapping (an anonymous
    mapping reads as zeros until written; its pages are made on first touch), or ``count``
    torch.zeros where huge pages are off."""
    numel = math.prod(shape)
    buf = huge_empty(count * numel * dtype.itemsize)
    if buf is None:
        return [torch.zeros(shape, dtype=dtype) for _ in range(count)]
    flat = buf.view(dtype)
    return [flat[i * numel:(i + 1) * numel].view(shape) for i in range(count)]


def huge_page_bytes(t: torch.Tensor, smaps: Path = Path("/proc/self/smaps")) -> int:
    """Bytes of the memory mappings holding ``t`` that the kernel backs with huge pages now
    (smaps' AnonHugePages of each mapping the tensor's bytes overlap; 0 where that cannot be
    read). Whole mappings are counted, so a tensor inside a larger mapping may read more."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.nbytes
    total, inside = 0, False
    try:
        with open(smaps) as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start < hi and lo < end
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


def process_huge_bytes(rollup: Path = Path("/proc/self/smaps_rollup")) -> int:
    """Bytes of this process in huge pages now (AnonHugePages), 0 where that cannot be read."""
    try:
        for line in rollup.read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def pages_note() -> str:
    """In words, the pages this process's large weight buffers get (a run's machine line)."""
    refused = _refused()
    if refused:
        return f"4 KB pages ({refused})"
    if not enabled():
        return f"4 KB pages (transparent huge pages: {thp_mode()})"
    return f"2 MB pages (transparent huge pages: {thp_mode()}; {process_huge_bytes() / 2**20:.0f} MiB of the process)"
