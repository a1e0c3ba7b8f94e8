"""Weight buffers in 2 MB pages (models.hugepages): aligned and marked for huge pages where the
kernel gives them, the same bytes as the file or tensor they copy, and a quiet fallback (None, or
the tensor itself) where huge pages are off."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specdraft.models import hugepages
from specdraft.models.hugepages import (
    HUGE,
    MIN_BYTES,
    huge_empty,
    huge_page_bytes,
    huge_zeros,
    in_huge_pages,
    map_file,
    pages_note,
    process_huge_bytes,
    read_huge,
    short_run,
    start_read,
    thp_mode,
)

needs_thp = pytest.mark.skipif(thp_mode() not in ("always", "madvise") or os.environ.get("SPECDRAFT_HUGE_PAGES") == "0",
                               reason=f"transparent huge pages are off here ({thp_mode()}) or SPECDRAFT_HUGE_PAGES=0")


@pytest.fixture(autouse=True)
def _no_measured_payback(tmp_path, monkeypatch):
    """A payback file of its own: one measured on this machine (calibrate --pages) must not decide
    what these tests see."""
    monkeypatch.setattr(hugepages, "payback_path", lambda: tmp_path / "machine" / "pages.json")


def smaps_fields(ptr: int) -> dict[str, str]:
    """/proc/self/smaps' fields of the mapping holding address ``ptr``."""
    fields, inside = {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= ptr < end
        elif inside:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


@needs_thp
def test_a_buffer_starts_on_a_huge_page_in_a_mapping_marked_for_them():
    t = huge_empty(3 * HUGE + 5)
    assert t is not None and t.dtype == torch.uint8 and t.numel() == 3 * HUGE + 5
    assert t.data_ptr() % HUGE == 0
    t.fill_(7)  # writable, every byte
    assert int(t.sum()) == 7 * t.numel()
    fields = smaps_fields(t.data_ptr())
    assert "hg" in fields["VmFlags"].split()  # MADV_HUGEPAGE on the range
    assert fields.get("THPeligible", "1") == "1"


@needs_thp
def test_read_huge_reads_the_file_from_an_offset_and_refuses_a_short_file(tmp_path):
    data = torch.randint(0, 256, (MIN_BYTES + 100_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "records.bin"
    path.write_bytes(data.numpy().tobytes())
    got = read_huge(path, 1234, MIN_BYTES, chunk=1 << 20)  # several chunks
    assert got is not None and got.data_ptr() % HUGE == 0
    assert torch.equal(got, data[1234:1234 + MIN_BYTES])
    with pytest.raises(OSError, match="ends"):
        read_huge(path, 200_000, MIN_BYTES)


@needs_thp
def test_a_read_started_on_its_own_thread_is_taken_by_the_read_of_the_same_bytes(tmp_path, monkeypatch):
    data = torch.randint(0, 256, (MIN_BYTES + 100_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "records.bin"
    path.write_bytes(data.numpy().tobytes())
    assert start_read(path, 1234, MIN_BYTES) and start_read(path, 1234, MIN_BYTES)  # the second: the same read
    assert len(hugepages._reads) == 1
    next(iter(hugepages._reads.values())).join()  # done on its thread
    synchronous = []
    monkeypatch.setattr(hugepages, "_in_huge_pages", lambda *a: synchronous.append(a[1:3]))  # read_huge's own read
    got = read_huge(path, 1234, MIN_BYTES)
    assert synchronous == [] and not hugepages._reads  # taken, not read again
    assert got.data_ptr() % HUGE == 0 or huge_page_bytes(got) > 0  # copied to a huge buffer, or the 2 MB-mapped file
    assert torch.equal(got, data[1234:1234 + MIN_BYTES])
    assert read_huge(path, 0, MIN_BYTES) is None and synchronous == [(0, MIN_BYTES)]  # other bytes: a read of its own


@needs_thp
def test_a_started_read_of_a_short_file_fails_where_it_is_taken_and_drop_forgets_reads(tmp_path):
    path = tmp_path / "records.bin"
    path.write_bytes(bytes(MIN_BYTES))
    assert start_read(path, 1000, MIN_BYTES)
    with pytest.raises(OSError, match="ends 1000 bytes early"):
        read_huge(path, 1000, MIN_BYTES)
    assert start_read(path, 0, MIN_BYTES)
    hugepages.drop_reads()
    assert not hugepages._reads


def _uncached_file(path: Path, data: torch.Tensor) -> None:
    """data written to path and dropped from the page cache (the next read comes from the disk)."""
    path.write_bytes(data.numpy().tobytes())
    hugepages.uncache(path)


def test_a_file_s_map_holds_its_bytes_and_4_kb_mappings_when_refused(tmp_path):
    data = torch.randint(0, 256, (3 * HUGE + 100,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    path = tmp_path / "records.bin"
    _uncached_file(path, data)
    for huge in (True, None, False):
        t = map_file(path, 1234, 2 * HUGE, huge=huge)
        assert t.dtype == torch.uint8 and torch.equal(t, data[1234:1234 + 2 * HUGE])
    assert huge_page_bytes(t) == 0  # MADV_NOHUGEPAGE: no 2 MB mapping even of a 2 MB folio
    with pytest.raises(OSError, match="ends 100 bytes early"):
        map_file(path, HUGE, 2 * HUGE + 200)


@needs_thp
def test_the_page_cache_s_2_mb_folios_are_mapped_without_a_copy(tmp_path, monkeypatch):
    data = torch.randint(0, 256, (5 * HUGE,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "records.bin"
    _uncached_file(path, data)  # read back through a MADV_HUGEPAGE map: into 2 MB folios where the kernel can
    got = hugepages.mapped_huge(path, 0, 5 * HUGE)
    if got is None:
        pytest.skip("this kernel and filesystem map no 2 MB page-cache folios here (mapped_huge copies instead)")
    assert torch.equal(got, data) and huge_page_bytes(got) >= 4 * HUGE

    def no_copy(n):
        raise AssertionError("copied where the file's map was in 2 MB pages")

    monkeypatch.setattr(hugepages, "huge_empty", no_copy)
    again = read_huge(path, HUGE, 3 * HUGE)  # another map of the same folios, in any process
    assert torch.equal(again, data[HUGE:4 * HUGE]) and huge_page_bytes(again) >= 2 * HUGE
    assert start_read(path, 0, 5 * HUGE) and read_huge(path, 0, 5 * HUGE).data_ptr() % HUGE == 0  # taken, no thread


@needs_thp
def test_small_folios_are_dropped_and_read_back_in_2_mb_ones_where_the_kernel_can(tmp_path):
    if not hugepages._folios_here(str(tmp_path)):
        pytest.skip("this kernel and filesystem map no 2 MB page-cache folios here")
    data = torch.randint(0, 256, (5 * HUGE,), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    path = tmp_path / "records.bin"
    _uncached_file(path, data)
    small = map_file(path, 0, 5 * HUGE, huge=False)
    assert torch.equal(small, data)  # read through a 4 KB map: small folios now
    del small
    later = map_file(path, 0, 5 * HUGE)
    assert int(later[::4096].sum()) >= 0 and huge_page_bytes(later) == 0  # a later map, all touched: 4 KB too
    del later
    got = hugepages.mapped_huge(path, 0, 5 * HUGE)  # dropped and read back
    assert got is not None and torch.equal(got, data) and huge_page_bytes(got) >= 4 * HUGE
    assert not list(tmp_path.glob(".folio-probe-*"))  # the probe leaves nothing


def test_a_read_back_that_still_gives_small_folios_is_not_tried_again(tmp_path, monkeypatch):
    data = torch.randint(0, 256, (3 * HUGE,), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    path = tmp_path / "records.bin"
    path.write_bytes(data.numpy().tobytes())
    monkeypatch.setattr(hugepages, "_huge_map", lambda p, o, n: (map_file(p, o, n, huge=False), False))
    monkeypatch.setattr(hugepages, "_folios_here", lambda d: True)
    dropped = []
    monkeypatch.setattr(hugepages, "uncache", lambda p: dropped.append(p))
    assert hugepages._mapped(path, 0, 3 * HUGE) is None and dropped == [path]  # tried once: small folios still
    assert (tmp_path / "records.bin.small-folios").is_file()
    assert hugepages._mapped(path, 0, 3 * HUGE) is None and dropped == [path]  # not again
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # the file changed
    assert hugepages._mapped(path, 0, 3 * HUGE) is None and dropped == [path, path]


def test_where_folios_are_not_2_mb_nothing_is_dropped(tmp_path, monkeypatch):
    data = torch.randint(0, 256, (3 * HUGE,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    path = tmp_path / "records.bin"
    path.write_bytes(data.numpy().tobytes())
    monkeypatch.setattr(hugepages, "_huge_map", lambda p, o, n: (map_file(p, o, n, huge=False), False))
    dropped = []
    monkeypatch.setattr(hugepages, "uncache", lambda p: dropped.append(p))
    hugepages._folios_here.cache_clear()
    try:
        assert hugepages._mapped(path, 0, 3 * HUGE) is None
    finally:
        hugepages._folios_here.cache_clear()
    assert dropped == [tmp_path / f".folio-probe-{os.getpid()}"]  # the probe's own drop, not the file's


@needs_thp
def test_a_forked_child_takes_no_read_its_parent_started(tmp_path):
    path = tmp_path / "records.bin"
    path.write_bytes(bytes(MIN_BYTES))
    assert start_read(path, 0, MIN_BYTES)
    pid = os.fork()
    if pid == 0:  # the child: the parent's read is not its own (no thread fills its buffer)
        os._exit(0 if not hugepages._reads else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert read_huge(path, 0, MIN_BYTES) is not None  # the parent's is still there


def test_no_read_starts_where_huge_pages_are_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_HUGE_PAGES", "0")
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(4 * HUGE))
    assert not start_read(path, 0, 4 * HUGE) and not hugepages._reads


@needs_thp
def test_in_huge_pages_copies_values_dtype_and_shape():
    t = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1))  # 4 MiB
    c = in_huge_pages(t)
    assert c.data_ptr() != t.data_ptr() and c.data_ptr() % HUGE == 0
    assert c.dtype == t.dtype and c.shape == t.shape and c.is_contiguous() and torch.equal(c, t)
    small = t[:4]
    assert in_huge_pages(small) is small  # under MIN_BYTES: kept as it is


def test_huge_zeros_are_zero_distinct_and_shaped():
    caches = huge_zeros((2, 1024, 128), torch.float32, 3)  # 1 MiB each: one mapping of 3 MiB
    assert [c.shape for c in caches] == [(2, 1024, 128)] * 3 and all(c.dtype == torch.float32 for c in caches)
    assert all(c.is_contiguous() and not c.any() for c in caches)
    caches[1][1, 5] = 1.0  # each its own memory
    assert not caches[0].any() and not caches[2].any() and caches[1].sum() == 128
    if hugepages.enabled():
        assert caches[0].data_ptr() % HUGE == 0 and caches[1].data_ptr() == caches[0].data_ptr() + caches[0].nbytes


def test_turned_off_every_function_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_HUGE_PAGES", "0")
    assert not hugepages.enabled()
    assert huge_empty(4 * HUGE) is None
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(4 * HUGE))
    assert read_huge(path, 0, 4 * HUGE) is None
    t = torch.zeros(4 * HUGE, dtype=torch.uint8)
    assert in_huge_pages(t) is t
    zeros = huge_zeros((4, HUGE), torch.uint8, 2)  # torch.zeros each
    assert [z.shape for z in zeros] == [(4, HUGE)] * 2 and not any(z.any() for z in zeros)
    assert pages_note() == "4 KB pages (SPECDRAFT_HUGE_PAGES=0)"


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
                                        ("always madvise [never]\n", "never"), (None, "unavailable")])
def test_the_kernel_setting_is_read_and_never_means_off(tmp_path, monkeypatch, text, mode):
    path = tmp_path / "enabled"
    if text is not None:
        path.write_text(text)
    monkeypatch.setattr(hugepages, "THP_ENABLED", path)
    monkeypatch.delenv("SPECDRAFT_HUGE_PAGES", raising=False)
    assert thp_mode() == mode
    if mode in ("never", "unavailable"):
        assert not hugepages.enabled() and huge_empty(4 * HUGE) is None
        assert pages_note() == f"4 KB pages (transparent huge pages: {mode})"


def test_huge_page_bytes_sums_the_mappings_a_tensor_overlaps(tmp_path):
    t = torch.zeros(1024, dtype=torch.uint8)
    lo, hi = t.data_ptr(), t.data_ptr() + t.nbytes
    smaps = tmp_path / "smaps"
    smaps.write_text(
        f"{lo - 8192:x}-{lo + 512:x} rw-p 00000000 00:00 0\nSize:   8 kB\nAnonHugePages:   2048 kB\n"
        f"{lo + 512:x}-{hi + 4096:x} rw-p 00000000 00:00 0\nAnonHugePages:   4096 kB\nVmFlags: rd wr hg\n"
        f"{hi + 4096:x}-{hi + 8192:x} rw-p 00000000 00:00 0 [heap]\nAnonHugePages:   8192 kB\n")
    assert huge_page_bytes(t, smaps) == (2048 + 4096) * 1024  # not the third mapping: it starts past the tensor
    assert huge_page_bytes(t, tmp_path / "missing") == 0
    rollup = tmp_path / "rollup"
    rollup.write_text("Rss:  100 kB\nAnonHugePages:   6144 kB\n")
    assert process_huge_bytes(rollup) == 6144 * 1024 and process_huge_bytes(tmp_path / "missing") == 0


@needs_thp
def test_a_short_run_takes_4_kb_pages_unless_asked_and_restores(monkeypatch):
    monkeypatch.delenv("SPECDRAFT_HUGE_PAGES", raising=False)
    with short_run():
        assert huge_empty(4 * HUGE) is None and pages_note().startswith("4 KB pages (a short run")
        with short_run(None):  # no change inside
            assert huge_empty(4 * HUGE) is None
        monkeypatch.setenv("SPECDRAFT_HUGE_PAGES", "1")
        assert huge_empty(4 * HUGE) is not None
        monkeypatch.delenv("SPECDRAFT_HUGE_PAGES")
    assert huge_empty(4 * HUGE) is not None  # restored
    with short_run(None):
        assert huge_empty(4 * HUGE) is not None


def test_payback_is_the_extra_start_over_the_gain_a_forward():
    from specdraft.models.hugepages import payback_forwards

    assert payback_forwards(0.47, 1.35, 0.0163, 0.0156) == 1258  # 0.88 s / 0.7 ms
    assert payback_forwards(1.0, 0.9, 0.020, 0.018) == 0  # no slower to start: from the first forward
    assert payback_forwards(0.4, 2.0, 0.020, 0.0199) is None  # 0.5% faster: under GAIN_FLOOR, never
    assert payback_forwards(0.4, 2.0, 0.020, 0.021) is None  # slower


def _record(forwards, **kw):
    return dict(forwards=forwards, thp=thp_mode(), date="2026-12-01", model="m") | kw


def test_a_payback_is_filed_per_cpu_and_read_back_only_where_it_fits():
    from specdraft.models.hugepages import measured_payback, save_payback

    payback_path = hugepages.payback_path

    assert measured_payback() is None  # nothing measured in this cache
    payback_path().parent.mkdir(parents=True)
    payback_path().write_text('{"another CPU": {"forwards": 5, "thp": "madvise"}}')
    assert measured_payback() is None
    save_payback(_record(1200))
    assert measured_payback()["forwards"] == 1200
    records = json.loads(payback_path().read_text())
    assert records["another CPU"] == {"forwards": 5, "thp": "madvise"}  # others' records kept
    save_payback(_record(None))
    assert measured_payback()["forwards"] is None  # never
    save_payback(_record(1200, thp="something else"))
    assert measured_payback() is None  # measured under another THP setting
    save_payback(_record(-3))
    assert measured_payback() is None  # not a count
    payback_path().write_text("{not json")
    assert measured_payback() is None  # a damaged file reads as nothing measured, quietly


@needs_thp
def test_a_one_shot_run_takes_2_mb_pages_from_the_measured_payback(monkeypatch):
    from specdraft.models.hugepages import PRIOR_TOKENS, forced, one_shot_pages, save_payback

    monkeypatch.delenv("SPECDRAFT_HUGE_PAGES", raising=False)
    # unmeasured: the prior
    assert "not measured" in one_shot_pages(PRIOR_TOKENS - 1) and one_shot_pages(PRIOR_TOKENS) is None
    save_payback(_record(3000))
    assert "3000 forwards" in one_shot_pages(2999) and one_shot_pages(3000) is None
    with short_run(one_shot_pages(2999)):
        assert huge_empty(4 * HUGE) is None and "3000 forwards" in pages_note()
    assert huge_empty(4 * HUGE) is not None  # long-lived: they pay back
    save_payback(_record(None))  # they save nothing here: no process takes them unasked
    assert one_shot_pages(10**6) is None
    assert huge_empty(4 * HUGE) is None and "no faster on this CPU" in pages_note()
    with forced("2M"):  # calibrate --pages measures them anyway
        assert huge_empty(4 * HUGE) is not None
    monkeypatch.setenv("SPECDRAFT_HUGE_PAGES", "1")
    assert huge_empty(4 * HUGE) is not None
    with forced("4K"):
        assert huge_empty(4 * HUGE) is None
    with pytest.raises(ValueError), forced("1G"):
        pass
