"""A retrieval datastore: a token stream and the order that finds what followed any n-gram.

On disk, a directory (written by :func:`write_datastore`, read memory-mapped by
:meth:`Datastore.open`, milliseconds whatever its size):

* ``tokens.npy``  [N] int32: the documents' token ids, with SEPARATOR (-1) before, between and
  after them, so no match or continuation runs from one document into the next;
* ``order.npy``   [M] int32: every position p that has a real token before it and at it (a
  continuation start), ordered by the DEPTH tokens before p read backwards (tokens[p - 1],
  tokens[p - 2], ...), equal ones latest first: the suffix array of the reversed stream;
* ``buckets.npy`` [V + 1] int64: order[buckets[t]:buckets[t + 1]] are the positions after token t
  (V: the tokenizer's vocabulary size, or the largest id + 1 where an id lies beyond it);
* ``header.json``: format, version, counts, DEPTH, and the tokenizer's identity (vocabulary size
  and sha256 of its tokenizer.json), so an index is never used with another vocabulary;
* ``sources.json``: the files indexed and their token counts (for people; never read here).

Reading the context backwards makes the matches of its n-gram suffixes nested: the positions
whose preceding n + 1 tokens match are a sub-range of those whose preceding n do, so the longest
match is found by narrowing one range, one token further back at a time (a bucket, then one
binary search per token), not by a fresh search per n.

Example: tokens ``| a b c | a b d |`` (| = SEPARATOR), context ``x a b``: after ``b`` come
positions 3 and 7; both have ``a`` before ``b``; neither has ``x`` before that: the longest
match is ``a b`` (n = 2), continued by ``c`` and ``d``.
"""
from __future__ import annotations

import hashlib
import json
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import IndexFileError, TokenizerMismatchError
from .suffix_array import sort_suffixes

FORMAT = "specdraft-datastore"
VERSION = 1
SEPARATOR = -1  # never a token id: matches and continuations stop at it
DEPTH = 16  # the order sorts by this many tokens back: the longest n-gram a lookup may match
FILES = ("tokens.npy", "order.npy", "buckets.npy")
BUILD_HINT = "specdraft index build PATH... -o"
HEADER_KEYS = ("format", "version", "tokens", "documents", "continuations", "ids", "depth", "target", "tokenizer")


@dataclass(frozen=True)
class TokenizerId:
    """What makes two tokenizers the same vocabulary: the tokenizer.json's bytes (and, for the
    error messages, how many tokens it has)."""

    vocab_size: int
    sha256: str

    @classmethod
    def of(cls, tokenizer_json: Path, vocab_size: int) -> TokenizerId:
        return cls(vocab_size, file_sha256(tokenizer_json))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stream_of(documents: list[np.ndarray]) -> np.ndarray:
    """The documents' tokens [N] int32 with SEPARATOR before, between and after them."""
    parts = [np.full(1, SEPARATOR, dtype=np.int32)]
    for doc in documents:
        parts += [np.asarray(doc, dtype=np.int32), parts[0]]
    return np.concatenate(parts)


def order_of(tokens: np.ndarray, depth: int = DEPTH) -> np.ndarray:
    """The continuation starts [M] int32 of ``tokens``, ordered by the ``depth`` tokens before
    them read backwards (see the module docstring)."""
    n = len(tokens)
    backwards = sort_suffixes(tokens[::-1], depth)  # suffix r of the reversed stream = the tokens before n - r
    starts = n - backwards
    starts = starts[starts < n]  # r = 0: nothing follows the stream's end
    keep = (tokens[starts - 1] != SEPARATOR) & (tokens[starts] != SEPARATOR)
    return starts[keep].astype(np.int32)


def write_datastore(directory: Path, documents: list[np.ndarray], tokenizer: TokenizerId, target: str,
                    sources: list[dict]) -> dict:
    """Build and write the datastore of ``documents`` (token id arrays) into ``directory``;
    returns its header. The header is written last: a half-written index has none."""
    tokens = stream_of(documents)
    if len(tokens) >= 2**31:
        raise IndexFileError(f"{len(tokens)} tokens do not fit an index's int32 positions; lower --max-tokens")
    order = order_of(tokens)
    last = tokens[order - 1].astype(np.int64)  # [M] the token before each start: the first sort key
    ids = max(tokenizer.vocab_size, int(tokens.max()) + 1)  # token ids are below this
    buckets = np.zeros(ids + 1, dtype=np.int64)
    np.cumsum(np.bincount(last, minlength=ids), out=buckets[1:])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "header.json").unlink(missing_ok=True)
    for name, array in zip(FILES, (tokens, order, buckets)):
        np.save(directory / name, array)
    header = {"format": FORMAT, "version": VERSION, "tokens": int(len(tokens) - len(documents) - 1),
              "documents": len(documents), "continuations": len(order), "ids": ids, "depth": DEPTH, "target": target,
              "tokenizer": {"vocab_size": tokenizer.vocab_size, "sha256": tokenizer.sha256}}
    (directory / "sources.json").write_text(json.dumps(sources, indent=0) + "\n")
    (directory / "header.json").write_text(json.dumps(header, indent=1) + "\n")
    return header


class Datastore:
    """An opened index: lookups of the context's longest matching suffix and what followed it."""

    def __init__(self, directory: Path, header: dict, tokens: np.ndarray, order: np.ndarray, buckets: np.ndarray):
        self.directory = directory
        self.header = header
        self.depth = int(header["depth"])
        self.tokens = tokens  # [N] int32, memory-mapped
        self.order = order  # [M] int32, memory-mapped
        self.buckets = buckets  # [V + 1] int64
        # the binary searches read one element at a time: memoryviews give Python ints without numpy's scalar overhead
        self._tokens = memoryview(tokens)
        self._order = memoryview(order)

    @classmethod
    def open(cls, path: str | Path) -> Datastore:
        """The index in directory ``path``, memory-mapped; IndexFileError in one line when it is
        missing, not an index, or its files do not agree with each other."""
        directory = Path(path).expanduser()
        rebuild = f"rebuild it: {BUILD_HINT} {path}"
        if not (directory / "header.json").is_file():
            what = "no such directory" if not directory.exists() else "no header.json"
            raise IndexFileError(f"{path} is not a retrieval index ({what}); build one: {BUILD_HINT} {path}")
        try:
            header = json.loads((directory / "header.json").read_text())
            if header.get("format") != FORMAT or header.get("version") != VERSION:
                raise ValueError(f"format {header.get('format')!r} version {header.get('version')!r}")
            missing = sorted(set(HEADER_KEYS) - set(header)) or ([] if "sha256" in header["tokenizer"] else ["sha256"])
            if missing:
                raise ValueError(f"the header lacks {', '.join(missing)}")
            lengths = (header["tokens"] + header["documents"] + 1, header["continuations"], header["ids"] + 1)
            arrays = [np.load(directory / name, mmap_mode="r", allow_pickle=False) for name in FILES]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise IndexFileError(f"{path} is not a readable index ({type(e).__name__}: {str(e)[:100]}); {rebuild}") \
                from None
        tokens, order, buckets = arrays
        expected = zip(arrays, (np.int32, np.int32, np.int64), lengths)
        for name, (array, dtype, length) in zip(FILES, expected):
            if array.dtype != dtype or array.shape != (length,):
                raise IndexFileError(f"{path} is corrupt ({name} holds {array.shape} {array.dtype}, the header says "
                                     f"{length} {np.dtype(dtype)}); {rebuild}")
        if tokens[0] != SEPARATOR or tokens[-1] != SEPARATOR or buckets[0] != 0 or buckets[-1] != len(order):
            raise IndexFileError(f"{path} is corrupt (its token stream or buckets are cut); {rebuild}")
        return cls(directory, header, tokens, order, buckets)

    def check_tokenizer(self, tokenizer_json: Path | None, target: str) -> None:
        """Refuse (TokenizerMismatchError) a target whose tokenizer.json is not the one the index
        was built with: its token ids would mean other strings."""
        if tokenizer_json is None or not Path(tokenizer_json).is_file():
            raise TokenizerMismatchError(f"target {target!r} has no tokenizer.json to check index {self.directory} "
                                         "against; use a target with one")
        built = self.header["tokenizer"]
        if file_sha256(Path(tokenizer_json)) != built["sha256"]:
            raise TokenizerMismatchError(
                f"index {self.directory} was built with another tokenizer ({self.header['target']!r}'s, "
                f"{built['vocab_size']} tokens) than target {target!r}'s; rebuild it with --target {target}")

    def longest_match(self, context: list[int], ngram_min: int, ngram_max: int) -> tuple[int, int, int]:
        """(n, lo, hi): the longest suffix n-gram of ``context`` (ngram_min <= n <= ngram_max,
        at most DEPTH) that the stream holds; order[lo:hi] are the positions that follow it.
        (0, 0, 0) when none does."""
        if not context or not 0 <= context[-1] < len(self.buckets) - 1:
            return 0, 0, 0
        best = (0, 0, 0)
        lo, hi = int(self.buckets[context[-1]]), int(self.buckets[context[-1] + 1])
        n, longest = 1, min(ngram_max, self.depth, len(context))
        while lo < hi:
            if n >= ngram_min:
                best = (n, lo, hi)
            if n == longest:
                break
            n += 1
            # the range agrees on the n - 1 tokens before its positions and is sorted by the n-th;
            # p - n >= 0 there, since the stream starts with a separator
            tok, back = self._tokens, n
            lo = bisect_left(self._order, context[-n], lo, hi, key=lambda p: tok[p - back])
            hi = bisect_right(self._order, context[-n], lo, hi, key=lambda p: tok[p - back])
        return best

    def continuations(self, context: list[int], depth: int, count: int, ngram_min: int,
                      ngram_max: int) -> list[list[int]]:
        """What followed the context's longest matching suffix (up to ``depth`` tokens, within
        its document) at up to ``count`` of its matches, spread evenly over them; [] when none."""
        n, lo, hi = self.longest_match(context, ngram_min, ngram_max)
        if n == 0 or depth <= 0:
            return []
        picks = np.arange(lo, hi) if hi - lo <= count else lo + np.arange(count) * (hi - lo) // count  # [m]
        starts = self.order[picks].astype(np.int64)
        window = self.tokens[np.minimum(starts[:, None] + np.arange(depth), len(self.tokens) - 1)]  # [m, depth]
        out = []
        for row in window.tolist():
            out.append(row[:row.index(SEPARATOR)] if SEPARATOR in row else row)
        return out
