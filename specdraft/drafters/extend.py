"""Lookup after a guess: the likeliest nodes of a fused tree extended by what followed their
branch's last tokens earlier in the text.

Prompt lookup fires only where the context's own suffix n-gram occurred before; at the start of
a copied phrase it does not (the suffix is still the previous phrase's end, or too common to
copy from). Once the head has guessed the phrase's first token, the n-gram ending in that guess
often has occurred: ``... the cache | Least`` -> ``Recently Used`` where the prompt said so. So
the fused tree's likeliest nodes each get the continuation that lookup finds after context +
their branch (n-grams down to 2 tokens, the guess and the one before it), rated by the node's
chance times how often extensions' tokens at that depth after a match of that n passed
(costs.CopyRates, learnt online): the engine's policy sends those that pay for their check, as
for every other node. The n matters: below a right guess, the first token copied after a 2-gram
match was right 47% of the time, after a 4-gram 72% (same answers as below).

Measured offline on the target's greedy answers to 26 dev prompts (`python
scripts/lookup_after_guess.py benchmarks/dev-2-spr-38530ec.json`): where lookup from the context
alone finds nothing, lookup after the right next token finds 0.30 right tokens a position
(summarization 0.70, RAG 0.59, math 0.41, coding 0.28, roleplay 0.09).

Greedy only (a sampled draft is left as it is): at temperature 0.7 a
copied token passes with the target's probability of it, and the extensions' nodes displaced
better ones; `python scripts/extend_ab.py --temperature 0.7 --seed 1` (13 dev prompts, AMX
Xeon): fusion 1.44x -> 1.39x `none`, hybrid-head 1.43x -> 1.37x with them.

Example: context ``a b c d`` then ``x`` ... ``a b``: the head guesses ``c`` (chance 0.8); lookup
after ``... a b c`` finds ``d``: the tree gains ``c -> d`` at 0.8 times the extensions' rate.
"""
from __future__ import annotations

from ..config import SamplingConfig
from ..costs import CopyRates
from .base import Draft
from .trees import branch_of

NODES = 8  # the likeliest nodes extended a step
MIN_CHANCE = 0.05  # nodes less likely than this are not extended
NGRAM_MIN = 2  # the guess and the token before it


class NgramIndex:
    """Where each n-gram (n = ngram_min .. ngram_max) of a growing token sequence last ended: a
    lookup in O(1) instead of a scan of the context (a fused tree asks for up to NODES a step).

    >>> ix = NgramIndex(2, 3); ix.update([5, 6, 7, 5, 6])
    >>> ix.after([9, 5, 6]), ix.after([6, 7, 5]), ix.after([1, 2])
    ((2, 2), (4, 3), None)
    """

    def __init__(self, ngram_min: int, ngram_max: int):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest occurrence
        self.seen: list[int] = []  # the sequence indexed so far

    def update(self, seq: list[int]) -> None:
        """Index seq's tokens not indexed yet (seq extends the last one; otherwise start over).
        An n-gram ending at seq's last token is indexed only once a token follows it."""
        n0 = len(self.seen)
        if seq[:n0] != self.seen:  # a few microseconds a step: list comparison in C
            self.ends, self.seen, n0 = {}, [], 0
        self.seen = list(seq)
        for end in range(max(n0, 1), len(seq)):  # n-grams ending at end - 1, followed by seq[end]
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.ends[tuple(seq[end - n:end])] = end

    def after(self, tail: list[int]) -> tuple[int, int] | None:
        """(where the continuation of tail's longest indexed suffix n-gram starts in the sequence, n)."""
        for n in range(min(self.ngram_max, len(tail)), self.ngram_min - 1, -1):
            end = self.ends.get(tuple(tail[len(tail) - n:]))
            if end is not None:
                return end, n
        return None


class LookupExtension:
    """Extends a draft's likeliest nodes by lookup (see the module's text); learns how often its
    tokens pass, by depth below the node they extend."""

    def __init__(self, ngram_max: int = 4, nodes: int = NODES, min_chance: float = MIN_CHANCE):
        self.ngram_max = ngram_max
        self.nodes = nodes
        self.min_chance = min_chance
        self.rates = {n: CopyRates() for n in range(NGRAM_MIN, ngram_max + 1)}  # by the n of the match
        self.index = NgramIndex(NGRAM_MIN, ngram_max)
        # per node of the draft extended last: (n of its match, its depth below the node it
        # extends), or None: not an extension's
        self.depths: list[tuple[int, int] | None] = []

    def begin(self) -> None:
        """A new sequence: its context is indexed afresh."""
        self.index = NgramIndex(NGRAM_MIN, self.ngram_max)

    def extend(self, context: list[int], draft: Draft, k: int, sampling: SamplingConfig) -> Draft:
        """The draft (a chain or tree with chances) with continuations of its likeliest nodes
        added as a tree of at most k levels; its own nodes keep their numbers, the new ones come
        after them. A sampled draft as it is (see the module's text)."""
        self.depths = [None] * len(draft)
        if not sampling.greedy or not len(draft) or draft.chances is None or draft.probs is not None:
            return draft  # sampled; nothing to rate them by; or q rows to keep aligned
        parents = draft.parents if draft.parents is not None else list(range(-1, len(draft) - 1))
        tokens, chance = list(draft.tokens), list(draft.chances)
        children = {(parents[j], t): j for j, t in enumerate(tokens)}  # (parent, token) -> node
        if len(children) < len(tokens):
            return draft  # siblings share a token: not a trie, so no node could be merged into
        self.index.update(context)
        parents = list(parents)
        best = sorted(range(len(draft)), key=lambda j: -draft.chances[j])[:self.nodes]
        for node in best:
            if draft.chances[node] < self.min_chance:
                break
            branch = branch_of(node, parents)
            room = k - len(branch)
            found = self.index.after(context[-self.ngram_max:] + [tokens[j] for j in branch]) if room > 0 else None
            if found is None:
                continue
            start, n = found
            at = node
            for depth, (tok, rate) in enumerate(zip(context[start:start + room], self.rates[n].chances(room))):
                nxt = children.get((at, tok))
                if nxt is None:  # a new node; one already there keeps its number and the better rating
                    nxt = children[at, tok] = len(tokens)
                    tokens.append(tok)
                    parents.append(at)
                    chance.append(0.0)
                    self.depths.append((n, depth))
                chance[nxt] = max(chance[nxt], draft.chances[node] * rate)
                at = nxt
        if len(tokens) == len(draft) and chance == draft.chances:
            return draft
        return Draft(tokens, parents=parents, chances=chance)

    def learn(self, judged: list[tuple[int, bool]]) -> list[tuple[int, bool]]:
        """The verifier's judged nodes (node, passed) of the draft extended last: the new nodes'
        outcomes by their match's n and their depth below the node they extend. Returns the
        verdicts on the draft's own nodes, for the drafter that made it."""
        own = []
        for j, passed in judged:
            if j < len(self.depths) and self.depths[j] is not None:
                n, depth = self.depths[j]
                self.rates[n].record(depth, passed)
            else:
                own.append((j, passed))
        return own


def lookup_extension(spec, trees: bool) -> LookupExtension | None:
    """The extension a tree drafter built for ``spec`` (config.SpecConfig) runs: on by default
    (``extend``), for drafters that propose trees."""
    return LookupExtension(spec.ngram_max) if spec.extend and trees else None
