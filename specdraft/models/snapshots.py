"""What transformers made of a model directory's config and tokenizer files, kept in the cache
so that later starts need not import transformers (~0.8 s) nor let it parse the files again.

A snapshot is one JSON document under ``$SPECDRAFT_CACHE/snapshots/KIND-KEY.json``. KEY is a
digest of the bytes of every file it was made from, of the installed transformers and
tokenizers versions and of FORMAT, so an edited file, another transformers or another layout
makes a new key and the old document is never read again. A snapshot that is missing, corrupt
or unwritable costs only the slow way: it never changes a result.
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
    h = hashlib.sha256(f"{FORMAT} {_version('transformers')} {_version('tokenizers')}".encode())
    for name in names:
        try:
            data = (Path(directory) / name).read_bytes()
        except OSError:
            h.update(f"\0{name} absent".encode())
            continue
        h.update(f"\0{name} {len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:32]


def _path(kind: str, digest: str) -> Path:
    return cache_root() / "snapshots" / f"{kind}-{digest}.json"


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
    path = _path(kind, digest)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, **payload}, f, ensure_ascii=False)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
