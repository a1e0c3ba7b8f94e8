"""What transformers made of a model directory's config and tokenizer files, kept in the cache
so that later starts need not import transformers (~0.8 s) nor let it parse the files again.

A snapshot is one JSON document under ``$SPECDRAFT_CACHE/snapshots/KIND-KEY.json`` (or, for
arrays, ``KIND-KEY.npy``). KEY is a digest of the bytes of every file it was made from, of the
installed transformers and tokenizers versions and of FORMAT, so an edited file, another
transformers or another layout makes a new key and the old document is never read again. A
snapshot that is missing, corrupt or unwritable costs only the slow way: it never changes a
result.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from ..cache import cache_root

FORMAT = 1  # bump when what a snapshot holds changes


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def key(directory: Path, names: tuple[str, ...]) -> str:
    """The digest of the files ``names`` of ``directory`` (a missing file counts as absent, not
    as empty) and of the versions that read them."""
    parts: list = [f"{_version('transformers')} {_version('tokenizers')}"]
    for name in names:
        try:
            parts += [name, (Path(directory) / name).read_bytes()]
        except OSError:
            parts.append(f"{name} absent")
    return digest_of(*parts)


def digest_of(*parts) -> str:
    """A KEY from data in hand: strings, or anything with contiguous bytes (a numpy array's are
    hashed where they lie, not copied); each part's length goes in before it."""
    h = hashlib.sha256(str(FORMAT).encode())
    for part in parts:
        data = memoryview(part.encode() if isinstance(part, str) else part).cast("B")
        h.update(f"\0{data.nbytes}\0".encode())
        h.update(data)
    return h.hexdigest()[:32]


def _path(kind: str, digest: str, suffix: str = ".json") -> Path:
    return cache_root() / "snapshots" / f"{kind}-{digest}{suffix}"


def load(kind: str, digest: str) -> dict | None:
    """The snapshot of ``kind`` under ``digest``, or None (none yet, or unreadable)."""
    try:
        data = json.loads(_path(kind, digest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def save(kind: str, digest: str, payload: dict) -> None:
    """Write a snapshot atomically (a reader sees the old state or the whole new one); a cache
    that cannot be written is left alone."""
    _write(_path(kind, digest), lambda f: f.write(json.dumps({"format": FORMAT, **payload}, ensure_ascii=False).encode()))


def load_array(kind: str, digest: str):
    """The numpy array snapshotted under ``digest``, or None. A hit counts as a use (save_array
    keeps the most recently used)."""
    import numpy as np

    path = _path(kind, digest, ".npy")
    try:
        array = np.load(path, allow_pickle=False)
        os.utime(path)
    except (OSError, ValueError, EOFError):
        return None
    return array


def save_array(kind: str, digest: str, array, keep: int) -> None:
    """save() for a numpy array (one .npy file); of the arrays of ``kind``, the ``keep`` most
    recently used stay, older ones are removed (matrices of drafters trained and dropped)."""
    import numpy as np

    path = _path(kind, digest, ".npy")
    _write(path, lambda f: np.save(f, array, allow_pickle=False))
    try:
        kept = sorted(path.parent.glob(f"{kind}-*.npy"), key=lambda f: f.stat().st_mtime, reverse=True)
        for old in kept[keep:]:
            old.unlink()
    except OSError:
        pass


def _write(path: Path, write) -> None:
    """write(binary file) into a temporary file beside ``path``, then renamed onto it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
