"""Retrieval drafting (REST: "a search engine as the prophet"): a token tree of what followed
the context's suffix in a datastore of text (``specdraft index build``), the branches scored by
how often each continuation was seen there.

No model runs. The longest suffix n-gram of the context (NGRAM_MIN <= n <= the datastore's
depth, 16) is found in the datastore by narrowing one suffix-array range a token at a time
(retrieval.datastore); the continuations after up to MATCHES of its matches, spread evenly over
all of them, are merged into a trie that drafters.trie ranks by calibrated chance and sizes by
the measured forward costs, as suffix drafting does with the context's own repeats. The n-gram
range is this drafter's own, not --ngram-max / --ngram-min (those of the context lookups): a
large datastore makes long matches common and short ones informative.

Example, k = 2: a datastore of ``a b c`` and ``a b d``, context ``x a b`` -> ``a b`` matches
twice: a tree of two children of the root, ``c`` and ``d``, each 1/2 likely.
"""
from __future__ import annotations

from ..retrieval.datastore import Datastore
from .base import DrafterContext, register
from .trie import TrieProphet

NGRAM_MIN = 2  # shortest suffix n-gram matched (a datastore of millions of tokens holds most 1-grams everywhere)
NGRAM_MAX = 16  # longest, bounded by the datastore's depth
MATCHES = 32  # continuations merged into the tree, spread evenly over a range of matches


class RetrievalTree(TrieProphet):
    name = "retrieval"

    def __init__(self, store: Datastore, trees: bool = True, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX,
                 matches: int = MATCHES):
        super().__init__(trees)
        self.store = store
        self.ngram_min, self.ngram_max, self.matches = ngram_min, ngram_max, matches

    def continuations(self, context: list[int], depth: int) -> list[list[int]]:
        return self.store.continuations(context, depth, self.matches, self.ngram_min, self.ngram_max)


@register("retrieval")
def _build(ctx: DrafterContext) -> RetrievalTree:
    store = Datastore.open(ctx.spec.index)  # SpecConfig refuses method retrieval without an index
    store.check_tokenizer(ctx.target_dir / "tokenizer.json" if ctx.target_dir else None,
                          ctx.target_dir.name if ctx.target_dir else "the target")
    return RetrievalTree(store, trees=getattr(ctx.target, "supports_tree", False))
