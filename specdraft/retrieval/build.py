"""Building a retrieval index from text files: find them, tokenize them with the target's
tokenizer, write the datastore (retrieval.datastore).

Directories are walked for files matching the globs (default DEFAULT_GLOBS), skipping hidden
directories, caches and installed packages (SKIP_DIRS); files named directly are taken whatever
their name. Files that are not UTF-8 text (undecodable, or holding a NUL byte) are skipped.
The benchmark prompts shipped with specdraft (specdraft/bench/data) never go into an index: a
datastore holding them would make every benchmark of retrieval a test on its training set.
"""
from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ParameterError
from .datastore import FILES, TokenizerId, write_datastore

DEFAULT_GLOBS = ("*.py", "*.md", "*.txt", "*.rst")
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules"})  # and every .hidden one
BENCH_DATA = Path(__file__).resolve().parents[1] / "bench" / "data"  # benchmark prompts: never indexed
DEFAULT_MAX_TOKENS = 32_000_000  # 8 bytes a token on disk (the token and its place in the order): 256 MB
BATCH = 64  # files tokenized together (the tokenizers library spreads a batch over the cores)


@dataclass(frozen=True)
class BuildConfig:
    """What ``specdraft index build`` indexes and how much."""

    paths: tuple[str, ...]  # files and directories
    globs: tuple[str, ...] = DEFAULT_GLOBS  # which files of a directory are read
    max_tokens: int = DEFAULT_MAX_TOKENS  # stop once this many tokens are in (the last document cut)

    def __post_init__(self) -> None:
        if not self.paths:
            raise ParameterError("index build needs at least one file or directory to index")
        if not self.globs or any(not g for g in self.globs):
            raise ParameterError(f"--glob needs non-empty patterns, got {','.join(self.globs)!r}")
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens < 2**31 - 2**24:
            raise ParameterError(f"--max-tokens must be an integer in [1, 2^31 - 2^24), got {self.max_tokens!r}")


@dataclass
class Built:
    """What a build did: its header, the files read and skipped, and how long it took."""

    header: dict
    files: int
    skipped: int  # not UTF-8 text, or empty
    left_out: int  # text files not indexed: max_tokens were in before them
    seconds: float


def find_files(config: BuildConfig) -> list[Path]:
    """The files to index, each once, in a stable order (a directory's walk sorted)."""
    out: dict[Path, None] = {}
    for name in config.paths:
        path = Path(name).expanduser()
        if not path.exists():
            raise ParameterError(f"{name} does not exist; pass files or directories to index")
        if _in_bench_data(path):
            raise ParameterError(f"{name} holds specdraft's benchmark prompts, which never go into an index")
        if path.is_file():
            out[path.resolve()] = None
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                             and not _in_bench_data(Path(root) / d))
            for f in sorted(files):
                if any(fnmatch.fnmatch(f, g) for g in config.globs):
                    out[(Path(root) / f).resolve()] = None
    return list(out)


def _in_bench_data(path: Path) -> bool:
    return path.resolve().is_relative_to(BENCH_DATA)


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is not UTF-8 text (or cannot be read)."""
    try:
        data = path.read_bytes()
        return None if b"\0" in data else data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def build_index(config: BuildConfig, out: Path, tokenizer_json: Path, target: str) -> Built:
    """Tokenize the files of ``config`` with ``tokenizer_json`` and write their datastore into ``out``."""
    from tokenizers import Tokenizer

    t0 = time.perf_counter()
    _check_out(out)
    files = find_files(config)
    if not files:
        raise ParameterError(f"no files matching {','.join(config.globs)} under {' '.join(config.paths)}")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    documents: list[np.ndarray] = []
    sources: list[dict] = []
    total = skipped = 0
    done = 0  # files read so far (the rest are left out: max_tokens were reached)
    while done < len(files) and total < config.max_tokens:
        batch = files[done:done + BATCH]
        done += len(batch)
        texts = [(path, read_text(path)) for path in batch]
        readable = [(path, text) for path, text in texts if text]
        skipped += len(texts) - len(readable)
        encoded = tokenizer.encode_batch([text for _, text in readable], add_special_tokens=False)
        for (path, _), enc in zip(readable, encoded):
            ids = np.asarray(enc.ids, dtype=np.int32)[:config.max_tokens - total]
            if len(ids) == 0:
                continue
            documents.append(ids)
            sources.append({"path": str(path), "tokens": len(ids)})
            total += len(ids)
    if not documents:
        raise ParameterError(f"none of the {len(files)} files found is UTF-8 text; nothing to index")
    ident = TokenizerId.of(tokenizer_json, tokenizer.get_vocab_size(with_added_tokens=True))
    header = write_datastore(out, documents, ident, target, sources)
    return Built(header, len(documents), skipped, len(files) - skipped - len(documents), time.perf_counter() - t0)


def _check_out(out: Path) -> None:
    """``out`` must be new, empty, or an index (rebuilt in place): never a directory of other files."""
    own = {*FILES, "header.json", "sources.json"}
    if out.exists() and (not out.is_dir() or any(p.name not in own for p in out.iterdir())):
        raise ParameterError(f"{out} exists and is not a retrieval index; pass a new or empty directory to -o")
