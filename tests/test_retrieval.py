"""Retrieval drafting: the bounded-depth suffix sort and the datastore's longest-match lookup
against brute force, the index on disk (round trip, corrupt files, another tokenizer refused),
building from files, and the drafter's trees and chains exact under greedy on tiny targets with
the speculative path taken (a datastore that holds the text lets drafts pass)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _tiny import ALPHABET, FakeTokenizer, save_char_tokenizer, tree_target
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters import DrafterContext, build_drafter
from specdraft.drafters.retrieval import RetrievalTree
from specdraft.engine import Engine
from specdraft.errors import IndexFileError, ParameterError, TokenizerMismatchError
from specdraft.retrieval.build import BENCH_DATA, BuildConfig, build_index, find_files
from specdraft.retrieval.datastore import (
    DEPTH,
    SEPARATOR,
    Datastore,
    TokenizerId,
    order_of,
    stream_of,
    write_datastore,
)
from specdraft.retrieval.suffix_array import sort_suffixes

NO_TOKENIZER = TokenizerId(vocab_size=8, sha256="0" * 64)


def brute_sort(seq: list[int], depth: int) -> list[int]:
    return sorted(range(len(seq)), key=lambda i: (seq[i:i + depth], i))  # shorter prefix first, as the end sorts lowest


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 4), max_size=60), st.integers(1, 20))
def test_sort_suffixes_is_brute_force_sorting(seq, depth):
    assert sort_suffixes(np.array(seq, dtype=np.int32), depth).tolist() == brute_sort(seq, depth)


def test_sort_suffixes_example_and_bad_depth():
    assert sort_suffixes(np.array([2, 1, 2, 1]), 2).tolist() == [3, 1, 0, 2]
    with pytest.raises(ValueError):
        sort_suffixes(np.array([1]), 0)


def store_of(documents: list[list[int]], directory: Path, tokenizer: TokenizerId = NO_TOKENIZER) -> Datastore:
    write_datastore(directory, [np.array(d, dtype=np.int32) for d in documents], tokenizer, "tiny", [])
    return Datastore.open(directory)


def brute_match(tokens: list[int], context: list[int], ngram_min: int, ngram_max: int) -> tuple[int, list[int]]:
    """(n, the positions after the longest suffix n-gram's occurrences that have a token after them)."""
    for n in range(min(ngram_max, len(context)), ngram_min - 1, -1):
        gram = context[-n:]
        hits = [p for p in range(n, len(tokens)) if tokens[p - n:p] == gram and tokens[p] != SEPARATOR]
        if hits:
            return n, hits
    return 0, []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4),
       st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(1, 3), st.integers(0, DEPTH))
def test_longest_match_is_brute_force(documents, context, ngram_min, extra):
    ngram_max = min(ngram_min + extra, DEPTH)
    with tempfile.TemporaryDirectory() as d:
        store = store_of(documents, Path(d))
        n, lo, hi = store.longest_match(context, ngram_min, ngram_max)
        want_n, want = brute_match(store.tokens.tolist(), context, ngram_min, ngram_max)
        assert n == want_n and sorted(store.order[lo:hi].tolist()) == want


def test_continuations_stop_at_the_document_end(tmp_path):
    a, b, c, d, x = 1, 2, 3, 4, 5
    store = store_of([[a, b, c], [a, b, d, a]], tmp_path)
    assert store.tokens.tolist() == [-1, a, b, c, -1, a, b, d, a, -1]
    assert sorted(store.continuations([x, a, b], depth=4, count=8, ngram_min=2, ngram_max=8)) == [[c], [d, a]]
    assert store.continuations([x, c], depth=4, count=8, ngram_min=1, ngram_max=8) == []  # c ends its document
    assert store.continuations([d, b], depth=4, count=8, ngram_min=2, ngram_max=8) == []  # "d b" never occurs


def test_many_matches_are_sampled_evenly(tmp_path):
    # "1 2" is followed by 100 different tokens, in order; 10 picks spread over all of them
    store = store_of([[1, 2, 10 + i] for i in range(100)], tmp_path)
    found = store.continuations([1, 2], depth=3, count=10, ngram_min=2, ngram_max=4)
    values = sorted(f[0] for f in found)
    assert len(found) == 10 and len(set(values)) == 10 and values[0] < 20 and values[-1] >= 100


def test_index_round_trip(tmp_path):
    docs = [np.array([3, 1, 4, 1, 5], dtype=np.int32), np.array([9, 2, 6], dtype=np.int32)]
    ident = TokenizerId(vocab_size=12, sha256="ab" * 32)
    header = write_datastore(tmp_path, docs, ident, "tiny", [{"path": "a", "tokens": 5}, {"path": "b", "tokens": 3}])
    store = Datastore.open(tmp_path)
    assert store.header == header and header["tokens"] == 8 and header["documents"] == 2
    assert store.header["tokenizer"] == {"vocab_size": 12, "sha256": "ab" * 32}
    assert store.tokens.tolist() == stream_of(docs).tolist() == [-1, 3, 1, 4, 1, 5, -1, 9, 2, 6, -1]
    assert store.order.tolist() == order_of(stream_of(docs)).tolist()
    assert isinstance(store.tokens, np.memmap)  # read in place, not loaded
    # every position after a real token that has a token, each once
    assert sorted(store.order.tolist()) == [2, 3, 4, 5, 8, 9]
    assert json.loads((tmp_path / "sources.json").read_text())[1] == {"path": "b", "tokens": 3}


def corrupt(directory: Path, how: str) -> None:
    header = directory / "header.json"
    if how == "no header":
        header.unlink()
    elif how == "not json":
        header.write_text("{ not json")
    elif how == "other format":
        header.write_text(json.dumps({**json.loads(header.read_text()), "format": "something-else"}))
    elif how == "header key missing":
        h = json.loads(header.read_text())
        del h["continuations"]
        header.write_text(json.dumps(h))
    elif how == "truncated tokens":
        data = (directory / "tokens.npy").read_bytes()
        (directory / "tokens.npy").write_bytes(data[:-8])
    elif how == "missing order":
        (directory / "order.npy").unlink()
    elif how == "wrong length":
        np.save(directory / "order.npy", np.zeros(3, dtype=np.int32))


@pytest.mark.parametrize("how", ["no header", "not json", "other format", "header key missing", "truncated tokens",
                                 "missing order", "wrong length"])
def test_a_corrupt_index_is_refused_in_one_line(tmp_path, how):
    store_of([[1, 2, 3, 1, 2, 4]], tmp_path)
    corrupt(tmp_path, how)
    with pytest.raises(IndexFileError) as e:
        Datastore.open(tmp_path)
    assert "\n" not in str(e.value) and "index" in str(e.value)


def test_a_missing_index_is_refused(tmp_path):
    with pytest.raises(IndexFileError, match=r"not a retrieval index.*specdraft index build"):
        Datastore.open(tmp_path / "nowhere")


def test_another_tokenizer_is_refused(tmp_path):
    ours, other = tmp_path / "ours", tmp_path / "other"
    save_char_tokenizer(ours)
    save_char_tokenizer(other, shuffle_seed=3)
    store = store_of([[1, 2, 3]], tmp_path / "index", TokenizerId.of(ours / "tokenizer.json", 96))
    store.check_tokenizer(ours / "tokenizer.json", "ours")  # the one it was built with
    with pytest.raises(TokenizerMismatchError, match=r"another tokenizer.*--target other"):
        store.check_tokenizer(other / "tokenizer.json", "other")
    with pytest.raises(TokenizerMismatchError, match=r"no tokenizer\.json"):
        store.check_tokenizer(None, "bare")


# ------------------------------------------------------------------------------------ building


@pytest.fixture
def corpus(tmp_path):
    """Files of every kind a walk meets, and a character-level tokenizer (token i = ALPHABET[i])."""
    root = tmp_path / "corpus"
    (root / "sub" / ".hidden").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "a.py").write_text("def f(x): return x")
    (root / "sub" / "b.md").write_text("# Title")
    (root / "sub" / ".hidden" / "h.py").write_text("hidden")
    (root / "__pycache__" / "c.py").write_text("cached")
    (root / "d.json").write_text("{}")  # not matched by the default globs
    (root / "e.txt").write_bytes(b"caf\xe9")  # latin-1: not UTF-8
    (root / "f.txt").write_bytes(b"bin\0ary")
    save_char_tokenizer(tmp_path / "tok")
    return root, tmp_path / "tok" / "tokenizer.json"


def chars(text: str) -> list[int]:
    return [ALPHABET.index(ch) for ch in text]


def test_build_reads_the_text_files_of_a_walk(corpus, tmp_path):
    root, tokenizer = corpus
    built = build_index(BuildConfig((str(root),)), tmp_path / "index", tokenizer, "tiny")
    store = Datastore.open(tmp_path / "index")
    assert store.tokens.tolist() == [-1, *chars("def f(x): return x"), -1, *chars("# Title"), -1]
    assert (built.files, built.skipped, built.left_out) == (2, 2, 0)
    from tokenizers import Tokenizer

    assert built.header["tokenizer"]["vocab_size"] == Tokenizer.from_file(str(tokenizer)).get_vocab_size(True)
    sources = json.loads((tmp_path / "index" / "sources.json").read_text())
    assert [Path(s["path"]).name for s in sources] == ["a.py", "b.md"]
    # a file named directly is read whatever its name; --glob picks others from a walk
    assert find_files(BuildConfig((str(root / "d.json"),))) == [(root / "d.json").resolve()]
    assert [p.name for p in find_files(BuildConfig((str(root),), globs=("*.json",)))] == ["d.json"]


def test_build_stops_at_max_tokens(corpus, tmp_path):
    root, tokenizer = corpus
    built = build_index(BuildConfig((str(root),), max_tokens=10), tmp_path / "index", tokenizer, "tiny")
    assert built.header["tokens"] == 10 and built.files == 1 and built.left_out == 1
    assert Datastore.open(tmp_path / "index").tokens.tolist() == [-1, *chars("def f(x): ")[:10], -1]


def test_build_refuses_benchmark_prompts_and_foreign_output_directories(corpus, tmp_path):
    root, tokenizer = corpus
    with pytest.raises(ParameterError, match="benchmark prompts"):
        find_files(BuildConfig((str(BENCH_DATA),)))
    with pytest.raises(ParameterError, match="not a retrieval index"):
        build_index(BuildConfig((str(root),)), root, tokenizer, "tiny")  # -o the corpus itself
    with pytest.raises(ParameterError, match="does not exist"):
        find_files(BuildConfig((str(tmp_path / "missing"),)))
    with pytest.raises(ParameterError, match="max-tokens"):
        BuildConfig((str(root),), max_tokens=0)
    # the package's own tree, walked, leaves its benchmark data out
    assert not any(p.is_relative_to(BENCH_DATA) for p in find_files(BuildConfig((str(BENCH_DATA.parent),), ("*",))))


def test_rebuilding_in_place_replaces_the_index(corpus, tmp_path):
    root, tokenizer = corpus
    build_index(BuildConfig((str(root),)), tmp_path / "index", tokenizer, "tiny")
    build_index(BuildConfig((str(root / "a.py"),)), tmp_path / "index", tokenizer, "tiny")
    assert Datastore.open(tmp_path / "index").header["documents"] == 1


# ----------------------------------------------------------------------------- the drafter

# repetitive, with branching continuations after "5 17" (as in test_suffix_tree)
PROMPT = [5, 17, 33, 2, 5, 17, 40, 8, 41, 5, 17, 33, 3, 5, 17, 60, 9, 5, 17, 33, 2, 5, 17]


@pytest.fixture(scope="module", params=["dense", "q4k"])
def target(request, tmp_path_factory):
    model = tree_target(request.param, tmp_path_factory.mktemp("retrieval") / "target")
    save_char_tokenizer(model.source_dir)  # the tokenizer.json an index is checked against
    return model


def generate(target, drafter, n=40):
    spec = SpecConfig(method="retrieval" if drafter else "none", k=6, cost_rule=False, index="unused")
    engine = Engine(target, FakeTokenizer(), drafter, spec)
    engine.generate(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=n))
    return list(engine.token_ids), engine.stats


def index_for(target, directory: Path, documents: list[list[int]]) -> str:
    ident = TokenizerId.of(target.source_dir / "tokenizer.json", 96)
    write_datastore(directory, [np.array(d, dtype=np.int32) for d in documents], ident, "tiny", [])
    return str(directory)


def test_greedy_retrieval_trees_equal_plain_decoding(target, tmp_path):
    plain, _ = generate(target, None)
    # the datastore holds the text, and a variant of it that branches every 5th token
    variant = [t if i % 5 else (t + 1) % 96 for i, t in enumerate(plain)]
    index = index_for(target, tmp_path / "index", [PROMPT + plain, PROMPT + variant])
    spec = SpecConfig(method="retrieval", k=6, cost_rule=False, index=index)
    drafter = build_drafter("retrieval", DrafterContext(spec=spec, target=target, draft_model=None,
                                                        target_dir=target.source_dir))
    ids, stats = generate(target, drafter)
    assert ids == plain
    assert drafter.trees and stats.drafts > 0 and stats.accepted_tokens > 0, stats.summary()
    assert stats.target_forwards < len(plain)  # drafts passed: fewer forwards than tokens


def test_greedy_retrieval_chains_and_wrong_guesses_stay_exact(target, tmp_path):
    plain, _ = generate(target, None)
    chain = RetrievalTree(Datastore.open(index_for(target, tmp_path / "text", [PROMPT + plain])), trees=False)
    ids, stats = generate(target, chain)
    assert ids == plain and stats.accepted_tokens > 0, stats.summary()
    # a datastore of other text: its guesses fail, the output does not change
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 96, 200).tolist() for _ in range(5)] + [PROMPT + [(t + 7) % 96 for t in plain]]
    wrong = RetrievalTree(Datastore.open(index_for(target, tmp_path / "noise", noise)))
    ids, stats = generate(target, wrong)
    assert ids == plain and stats.draft_tokens > stats.accepted_tokens, stats.summary()


def test_the_factory_refuses_another_tokenizer(target, tmp_path):
    other = tmp_path / "other"
    save_char_tokenizer(other, shuffle_seed=3)
    write_datastore(tmp_path / "index", [np.array([1, 2, 3], dtype=np.int32)],
                    TokenizerId.of(other / "tokenizer.json", 96), "other", [])
    spec = SpecConfig(method="retrieval", index=str(tmp_path / "index"))
    with pytest.raises(TokenizerMismatchError):
        build_drafter("retrieval", DrafterContext(spec=spec, target=target, draft_model=None,
                                                  target_dir=target.source_dir))


def test_method_retrieval_needs_an_index():
    with pytest.raises(ParameterError, match="--index"):
        SpecConfig(method="retrieval")
    with pytest.raises(ParameterError, match="index"):
        SpecConfig(method="retrieval", index="")
