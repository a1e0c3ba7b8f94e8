"""Large weight buffers and KV caches in 2 MB pages (Linux transparent huge pages).

Why: a one-token forward streams the target's ~1.1 GB of GGUF records. In 4 KB pages that is
~270,000 pages a forward, each a TLB miss and a page walk, and the walks' entries push the rest of
the step's (the drafter's weights, the KV cache, Python) out of the TLB; in 2 MB pages it is ~550.
Measured on the AMX Xeon (`python scripts/huge_pages.py`, BENCHMARKS.md): the default target's
one-token forward 1.18x faster (46.5 -> 39.4 ms), 16 tokens 1.08x. On the AVX2 EPYC (Zen 3, KVM)
the forwards run as fast from 4 KB pages (one token 0.94-1.03x, both kinds in one process, forwards
interleaved): its page walks keep up with a 27 GB/s stream.

Linux gives 2 MB pages to private anonymous memory where transparent huge pages are "always", or
"madvise" and the range is marked MADV_HUGEPAGE (Debian's and Ubuntu's default is "madvise"). A
file's map gets them where the page cache holds the file in 2 MB folios (filesystems with large
folios, e.g. ext4 on Linux 6.x; a MADV_HUGEPAGE map reads pages not cached yet into such folios):
then the records are mapped, in 2 MB pages, shared between processes, at a map's start
(``mapped_huge``). Elsewhere they are read into an anonymous buffer (a private copy a process, the
page cache copy staying reclaimable), on a thread of its own during a start (``start_read``). A
model's KV caches too: a decode step's attention reads every
cached row from memory, ~25% faster from 2 MB pages (context 1500: 7.7 -> 5.8 ms a forward); they
are then resident from the first token (~224 MB for the default target's 4096 positions, where 4 KB
pages are made as the context grows). They cost a start and pay back a little every forward, both
by CPU: ``specdraft calibrate --pages`` measures both and files the payback for this CPU
(``measured_payback``); a one-shot command takes them from that many new tokens
(``one_shot_pages``), and where they save nothing no process does (``_refused``).
``SPECDRAFT_HUGE_PAGES=0`` keeps 4 KB pages everywhere, ``=1`` takes 2 MB ones everywhere.
Elsewhere (no THP, another OS) every function here falls back quietly.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..cache import cache_root
from ..cpu import cpu_key

HUGE = 2 << 20  # bytes in a huge page (x86-64)
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# the smallest buffer given its own mapping (a draft model's re-quantized matrices are ~0.5-10 MB; a
# mapping's last huge page may hold up to 2 MB of nothing)
MIN_BYTES = HUGE


# New tokens from which a one-shot command (specdraft generate) takes 2 MB pages where their payback
# was not measured on this CPU (``specdraft calibrate --pages`` measures it: ``measured_payback``).
# They cost a start (the kernel assembles ~1.3 GB of them, compacting memory where it is
# fragmented) and pay back a little every forward, both by CPU: the AMX Xeon ~3 s against ~6 ms a
# forward (~500 forwards), the Zen 5 EPYC ~1-2.7 s against ~0.6-1.5 ms (~2,000-4,500), the AVX2
# EPYC (Zen 3) ~3.5 s against nothing (never).
PRIOR_TOKENS = 1000
PAYBACK_FILE = Path("machine") / "pages.json"  # under cache_root(): {cpu_key: a calibrate --pages record}
# A gain a forward under this share of the 4 KB forward's time is taken as none (the paired
# forwards of a CPU where the pages change nothing still differ by ~1-3% in a round).
GAIN_FLOOR = 0.02


def thp_mode() -> str:
    """The kernel's transparent huge page setting: "always", "madvise", "never", or "unavailable"."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")  # e.g. "always [madvise] never"
    return text[start + 1:end] if 0 <= start < end else "unavailable"


_short = [None]  # inside short_run(): why this run takes 4 KB pages unless SPECDRAFT_HUGE_PAGES=1 asks, in words
_forced: list[str | None] = [None]  # inside forced(): "4K" or "2M", whatever else says (calibrate --pages)


def payback_forwards(start_4k: float, start_2m: float, forward_4k: float, forward_2m: float) -> int | None:
    """Target forwards after which 2 MB pages have paid their start: the extra start in seconds
    (load and first forward, 2 MB minus 4 KB) over the seconds they save a forward; None where they
    save under GAIN_FLOOR of a forward (never), 0 where they start no slower. E.g. 1.35 s against
    0.47 s to start and 16.3 against 15.6 ms a forward: 0.88 / 0.0007 -> 1,258 forwards."""
    gain = forward_4k - forward_2m
    if gain < GAIN_FLOOR * forward_4k:
        return None
    return math.ceil(max(0.0, start_2m - start_4k) / gain)


@functools.cache
def _this_cpu() -> str:
    return cpu_key()  # read once: enabled() asks for every buffer


def payback_path() -> Path:
    return cache_root() / PAYBACK_FILE


_memo: dict[tuple[str, int], dict] = {}  # (file, its mtime) -> its records: enabled() asks every buffer


def _records(path: Path) -> dict:
    """The payback file's records by CPU, {} where there is none or it cannot be read."""
    try:
        stamp = (str(path), path.stat().st_mtime_ns)
    except OSError:
        return {}
    if stamp not in _memo:
        try:
            got = json.loads(path.read_text())
        except (OSError, ValueError):
            got = {}
        _memo.clear()
        _memo[stamp] = got if isinstance(got, dict) else {}
    return _memo[stamp]


def measured_payback() -> dict | None:
    """This CPU's ``specdraft calibrate --pages`` record under the kernel's present THP setting,
    or None where none was made: {"forwards": int or None (never), "date", "model",
    "start_seconds", "forward_seconds", ...}."""
    record = _records(payback_path()).get(_this_cpu())
    if not isinstance(record, dict) or record.get("thp") != thp_mode() or "forwards" not in record:
        return None
    forwards = record["forwards"]
    return record if forwards is None or (isinstance(forwards, int) and forwards >= 0) else None


def save_payback(record: dict) -> Path:
    """File ``record`` (with "forwards" and "thp") under this CPU in the payback file, keeping
    other CPUs' records; written whole to a temporary file and renamed, so a reader never sees half."""
    path = payback_path()
    records = dict(_records(path))
    records[_this_cpu()] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    tmp.replace(path)
    return path


def one_shot_pages(new_tokens: int) -> str | None:
    """Why a one-shot run of up to ``new_tokens`` new tokens should take 4 KB pages (short_run's
    reason), or None: it reaches this CPU's measured payback (counted in forwards: a run of n new
    tokens makes at most n), or PRIOR_TOKENS where none was measured. Where the pages were measured
    to save nothing, the default refuses them anyway (``_refused``)."""
    record = measured_payback()
    if record is None:
        if new_tokens < PRIOR_TOKENS:
            return (f"a short run: under {PRIOR_TOKENS} new tokens, their payback not measured on this CPU "
                    "(specdraft calibrate --pages)")
        return None
    forwards = record["forwards"]
    if forwards is not None and new_tokens < forwards:
        return f"a short run: 2 MB pages pay back after ~{forwards} forwards on this CPU (calibrate --pages)"
    return None


@contextmanager
def short_run(reason: str | None = "a short run") -> Iterator[None]:
    """Loads within take 4 KB pages, for ``reason`` (words; None: no change), unless
    ``SPECDRAFT_HUGE_PAGES=1`` asks for 2 MB ones."""
    before = _short[0]
    _short[0] = before or reason
    try:
        yield
    finally:
        _short[0] = before


@contextmanager
def forced(kind: str) -> Iterator[None]:
    """Loads within take ``kind`` pages ("4K" or "2M", the latter where the kernel gives them),
    whatever SPECDRAFT_HUGE_PAGES, a short run or a measurement says: calibrate --pages."""
    if kind not in ("4K", "2M"):
        raise ValueError(f"page kind {kind!r}: 4K or 2M")
    before = _forced[0]
    _forced[0] = kind
    try:
        yield
    finally:
        _forced[0] = before


def _refused() -> str | None:
    """Why this process does not want huge pages now, in words, or None: forced("4K"),
    ``SPECDRAFT_HUGE_PAGES=0``, a short_run where SPECDRAFT_HUGE_PAGES does not ask for them, or a
    measurement (calibrate --pages) that they save nothing on this CPU."""
    if none_at_all():
        return "forced" if _forced[0] else "SPECDRAFT_HUGE_PAGES=0"
    if _forced[0] or os.environ.get("SPECDRAFT_HUGE_PAGES") is not None:
        return None
    if _short[0]:
        return _short[0] + "; SPECDRAFT_HUGE_PAGES=1 asks for 2 MB"
    record = measured_payback()
    if record is not None and record["forwards"] is None:
        return f"no faster on this CPU: specdraft calibrate --pages, {record.get('date', 'undated')}"
    return None


def none_at_all() -> bool:
    """Whether no memory here may come in huge pages, not even the page cache's 2 MB folios mapped
    whole: forced("4K") (calibrate --pages' 4 KB side) or ``SPECDRAFT_HUGE_PAGES=0``."""
    return _forced[0] == "4K" or (not _forced[0] and os.environ.get("SPECDRAFT_HUGE_PAGES") == "0")


def enabled() -> bool:
    """Whether buffers here are made in huge pages: THP on (always / madvise), Linux's madvise
    available, and not refused (``SPECDRAFT_HUGE_PAGES=0``, or a short_run not asking for them)."""
    return (_refused() is None and thp_mode() in ("always", "madvise") and hasattr(mmap, "MADV_HUGEPAGE")
            and hasattr(mmap, "MAP_ANONYMOUS"))


def huge_empty(nbytes: int) -> torch.Tensor | None:
    """uint8 [nbytes], uninitialised, starting on a 2 MB boundary of a private anonymous mapping
    marked MADV_HUGEPAGE; None where huge pages are off (``enabled``) or the mapping fails. The
    tensor keeps the mapping alive (torch.frombuffer holds a reference to it)."""
    return _anonymous(nbytes) if nbytes >= MIN_BYTES and enabled() else None


def _anonymous(nbytes: int) -> torch.Tensor | None:
    """huge_empty's buffer, huge pages known to be on."""
    try:
        # one huge page more than needed, so that the buffer can start on a 2 MB boundary
        m = mmap.mmap(-1, -(-nbytes // HUGE) * HUGE + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = torch.frombuffer(m, dtype=torch.uint8)
        skip = -whole.data_ptr() % HUGE
        m.madvise(mmap.MADV_HUGEPAGE, skip, len(m) - skip)
    except (OSError, ValueError):
        return None
    return whole[skip:skip + nbytes]


def map_file(path: Path, offset: int, nbytes: int, huge: bool | None = None) -> torch.Tensor:
    """uint8 [nbytes]: the file's bytes from ``offset`` as a private copy-on-write map of the whole
    file (torch wants writable memory; nothing writes, so the page cache's pages are shared between
    processes). ``huge``: True marks the map MADV_HUGEPAGE (the kernel maps the page cache's 2 MB
    folios whole, and reads pages not cached yet into such folios), False MADV_NOHUGEPAGE (4 KB
    mappings only), None leaves the kernel's default (it maps 2 MB folios whole where it has them).
    OSError where the file cannot be mapped; the file must hold offset + nbytes bytes."""
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if offset + nbytes > len(m):
        raise OSError(f"{Path(path).name} ends {offset + nbytes - len(m)} bytes early")
    advice = {True: "MADV_HUGEPAGE", False: "MADV_NOHUGEPAGE"}.get(huge)
    if advice and hasattr(mmap, advice):
        with contextlib.suppress(OSError):  # a kernel without THP: its 4 KB mappings are all there is
            m.madvise(getattr(mmap, advice))
    return torch.frombuffer(m, dtype=torch.uint8)[offset:offset + nbytes]


def uncache(path: Path) -> None:
    """Writes the file's pages out and drops them from the page cache (best effort), so that its
    first map by mapped_huge reads it back in 2 MB folios: a file just written sits in the page
    cache in whatever folios the writes made."""
    with contextlib.suppress(OSError, AttributeError), open(path, "rb") as f:
        os.fsync(f.fileno())  # dirty pages are not dropped
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


# The share of a file range that must come mapped in 2 MB folios for mapped_huge to keep the map
# (its first and last huge pages may be partly outside the range, a few folios may be small)
MAPPED_SHARE = 0.9


def mapped_huge(path: Path, offset: int, nbytes: int) -> torch.Tensor | None:
    """uint8 [nbytes]: the file's bytes from ``offset`` mapped in 2 MB pages without a copy, where
    the kernel holds (or now reads) the file in 2 MB page-cache folios and maps them whole (a
    filesystem with large folios; Linux 6.x ext4 does); else None (a copy must make them,
    read_huge). Measured on a Zen 1 EPYC (KVM, ext4, Linux 6.18), the default target's 1.1 GB:
    after its cached pages are dropped and read back through a MADV_HUGEPAGE map, every later map
    of the file, in any process, comes 2 MB-mapped (smaps FilePmdMapped 1.13 GB) and touching it
    all costs 0.08 s, where a copy into anonymous 2 MB pages costs 1.4-2.1 s a process."""
    return _mapped(path, offset, nbytes) if nbytes >= MIN_BYTES and enabled() else None


def _huge_map(path: Path, offset: int, nbytes: int) -> tuple[torch.Tensor, bool]:
    """The file's MADV_HUGEPAGE map (map_file), each of its whole huge pages touched once (the
    kernel maps the cached folio there, or reads one in), and whether it came in 2 MB pages."""
    t = map_file(path, offset, nbytes, huge=True)
    skip = -t.data_ptr() % HUGE
    int(t[skip::HUGE].sum())
    whole = (nbytes - skip) // HUGE * HUGE
    return t, whole > 0 and huge_page_bytes(t) >= MAPPED_SHARE * whole


@functools.cache
def _folios_here(directory: str) -> bool:
    """Whether the page cache holds files of this directory in 2 MB folios that maps take whole:
    a 4 MB probe written, dropped from the cache and mapped back (a few milliseconds, once a
    process and directory). Only there may mapped_huge drop a file's small folios to read it
    back: elsewhere that would read it from the disk for nothing."""
    probe = Path(directory) / f".folio-probe-{os.getpid()}"
    try:
        probe.write_bytes(bytes(2 * HUGE))
        uncache(probe)
        return _huge_map(probe, 0, 2 * HUGE)[1]
    except (OSError, ValueError):
        return False
    finally:
        probe.unlink(missing_ok=True)


def _mapped(path: Path, offset: int, nbytes: int) -> torch.Tensor | None:
    """mapped_huge's map, huge pages known to be on. Where the file sits in the page cache in
    small folios (read before through a map without MADV_HUGEPAGE, or by read()) but the kernel
    can hold it in 2 MB ones, its cached pages are dropped (those no other process maps) and read
    back: once, for every later start. Where that still gives small folios (memory too fragmented
    for 2 MB ones, another process mapping the pages), a marker beside the file says so, and no
    later start drops them again (each would read the file from the disk for nothing) until the
    file changes."""
    path = Path(path)
    marker = path.with_name(path.name + ".small-folios")
    try:
        t, huge = _huge_map(path, offset, nbytes)
        if huge or not _folios_here(str(path.parent)) or _newer(marker, path):
            return t if huge else None
        del t  # unmapped: its pages can leave the cache
        uncache(path)
        t, huge = _huge_map(path, offset, nbytes)
        if not huge:
            marker.touch()
    except (OSError, ValueError):
        return None
    return t if huge else None


def _newer(a: Path, b: Path) -> bool:
    """Whether file a exists and was changed after file b."""
    try:
        return a.stat().st_mtime_ns >= b.stat().st_mtime_ns
    except OSError:
        return False


def _read_into(buf: torch.Tensor, path: Path, offset: int, chunk: int) -> None:
    """The file's bytes from ``offset`` into ``buf`` (uint8, its whole length). OSError (a file cut
    short included) propagates."""
    view, nbytes = memoryview(buf.numpy()), buf.numel()
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        done = 0
        while done < nbytes:
            n = f.readinto(view[done:done + min(chunk, nbytes - done)])
            if not n:
                raise OSError(f"{path.name} ends {nbytes - done} bytes early")
            done += n


def _in_huge_pages(path: Path, offset: int, nbytes: int, chunk: int) -> torch.Tensor | None:
    """read_huge's bytes, huge pages known to be on: the file's map where it comes in 2 MB
    folios, else a copy into an anonymous buffer; None where that buffer cannot be mapped."""
    mapped = _mapped(path, offset, nbytes)
    if mapped is not None:
        return mapped
    buf = _anonymous(nbytes)
    if buf is not None:
        _read_into(buf, path, offset, chunk)
    return buf


class _Read(threading.Thread):
    """read_huge's work on a thread of its own (start_read)."""

    def __init__(self, path: Path, offset: int, nbytes: int, chunk: int):
        super().__init__(name="specdraft-read-huge", daemon=True)
        self.path, self.offset, self.nbytes, self.chunk = path, offset, nbytes, chunk
        self.buf: torch.Tensor | None = None
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.buf = _in_huge_pages(self.path, self.offset, self.nbytes, self.chunk)
        except OSError as e:
            self.error = e


# (file, offset, bytes) -> its read under way (start_read), until read_huge takes it or drop_reads
_reads: dict[tuple[str, int, int], _Read] = {}
# a forked child has no reading thread, only the buffer as it stood: it must never take one
os.register_at_fork(after_in_child=_reads.clear)
# Bytes a read call asks for: the read's thread takes the interpreter lock between calls, and a
# start's other work (the tokenizer's parse) holds it for long stretches
READ_CHUNK = 256 << 20


def start_read(path: Path, offset: int, nbytes: int) -> bool:
    """Starts read_huge's work for the file's bytes from ``offset`` (the file's 2 MB-mapped map, or
    a copy into a huge buffer) on a thread of its own, for read_huge to take (same file, offset and
    length); whether it started (not where huge pages are off). Why: where a copy is needed, a
    start's largest wait in 2 MB pages is that read (the kernel makes and
    zeroes ~550 of them; on a VM the host faults each in: 1.4-2.1 s for the default target on a Zen 1
    EPYC), and its system calls release the interpreter lock, so the config and tokenizer load
    meanwhile. It shares the machine with them (the tokenizer's parse beside it 0.5 -> 0.8 s), so it
    hides part of its time: load + first forward 2.84 -> 2.67 s (Zen 1, 8 alternated processes)."""
    key = (str(path), offset, nbytes)
    if key in _reads:
        return True
    if nbytes < MIN_BYTES or not enabled():
        return False
    _reads[key] = read = _Read(Path(path), offset, nbytes, READ_CHUNK)
    read.start()
    return True


def drop_reads() -> None:
    """Forgets the reads that start_read began and no read_huge took, without waiting for them:
    each buffer is freed when its thread ends (a read cannot be stopped half way)."""
    _reads.clear()


def read_huge(path: Path, offset: int, nbytes: int, chunk: int = 64 << 20) -> torch.Tensor | None:
    """uint8 [nbytes]: the file's bytes from ``offset`` in 2 MB pages: the file's own map where the
    kernel gives it in 2 MB folios (mapped_huge), else read into a huge_empty buffer (or taken from
    what start_read began for the same bytes); None where huge pages are off. OSError (a file cut
    short included) propagates."""
    read = _reads.pop((str(path), offset, nbytes), None)
    if read is not None:
        read.join()
        if read.error is not None:
            raise read.error
        return read.buf
    return _in_huge_pages(Path(path), offset, nbytes, chunk) if nbytes >= MIN_BYTES and enabled() else None


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


# smaps' fields of memory the kernel maps in 2 MB pages: anonymous ones, the page cache's folios
HUGE_FIELDS = ("AnonHugePages:", "FilePmdMapped:")


def huge_page_bytes(t: torch.Tensor, smaps: Path = Path("/proc/self/smaps")) -> int:
    """Bytes of the memory mappings holding ``t`` that the kernel backs with huge pages now
    (smaps' AnonHugePages and FilePmdMapped of each mapping the tensor's bytes overlap; 0 where
    that cannot be read). Whole mappings are counted, so a tensor inside a larger mapping may read
    more."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.nbytes
    total, inside = 0, False
    try:
        with open(smaps) as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start < hi and lo < end
                elif inside and head in HUGE_FIELDS:
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


def process_huge_bytes(rollup: Path = Path("/proc/self/smaps_rollup")) -> int:
    """Bytes of this process in huge pages now (AnonHugePages + FilePmdMapped), 0 where that cannot
    be read."""
    try:
        return sum(int(line.split()[1]) * 1024 for line in rollup.read_text().splitlines()
                   if line.split(maxsplit=1)[:1] and line.split(maxsplit=1)[0] in HUGE_FIELDS)
    except (OSError, ValueError, IndexError):
        return 0


def pages_note() -> str:
    """In words, the pages this process's large weight buffers get (a run's machine line)."""
    refused = _refused()
    if refused:
        return f"4 KB pages ({refused})"
    if not enabled():
        return f"4 KB pages (transparent huge pages: {thp_mode()})"
    return f"2 MB pages (transparent huge pages: {thp_mode()}; {process_huge_bytes() / 2**20:.0f} MiB of the process)"
