"""Structured output: an answer held to a JSON schema, a regular expression, a list of choices or
a Lark grammar (config.OutputFormat), token by token, by llguidance (the grammar engine vLLM,
SGLang and llama.cpp use; its masks take ~0.03 ms for Qwen2.5's 151,936 ids).

Each row the target scores gets the mask of the tokens the format allows after that row's text
(a check's row: the committed text, then the guesses of its branch), and the verifier judges the
masked logits: the answer is the one constrained plain decoding gives (greedy: bit for bit;
sampled: the target's distribution over the allowed tokens; log-probabilities stay the raw
softmax's). The format is a prophet too: guesses it rules out are dropped before the check (no
row is spent on them), the drafters that can guess only what it allows after each branch
(Drafter.use_format: the trained drafters' trees, the draft model), and where it forces the next
tokens (a schema's keys and punctuation, llguidance's fast-forward tokens) they join the check's
guesses, verified like any other (a forced text may still be split into tokens another way, so
they are guesses, not commits).

A sampled proposal (a draft model's chain drawn from its q) is never pruned: the verifier's
residual max(0, p - q) needs the draws as drawn (cutting a chain at a ruled-out draw would sample
that position from p instead, which biases the output); its ruled-out guesses are rejected there
(p = 0). Deterministic guesses (probs None, verified one-hot) can go: one the format rules out is
rejected with certainty and leaves the residual as it was.
"""
from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Callable

import numpy as np
import torch

from .config import OutputFormat
from .drafters.base import Draft
from .drafters.trees import branch_of, keep_nodes, merge_drafts, row_branches
from .errors import ParameterError
from .policy import Sent

# an LLTokenizer per (tokenizer, vocabulary size, end ids): building one reads the whole vocabulary
# (~0.9 s for Qwen2.5's), so a process builds it once per tokenizer
_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _one_line(message: str) -> str:
    lines = [s.strip() for s in str(message).splitlines() if s.strip()]
    return " ".join(lines[:3])[:300]


def grammar_of(fmt: OutputFormat) -> str:
    """llguidance's grammar for ``fmt`` (ParameterError where its spec is not what its kind needs)."""
    try:
        return _grammar_of(fmt)
    except ParameterError:
        raise
    except Exception as e:  # what llguidance raises on a schema it cannot take
        raise ParameterError(f"the {fmt.kind} output format does not compile: {_one_line(e)}") from None


def _grammar_of(fmt: OutputFormat) -> str:
    import llguidance

    if fmt.kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"})
    if fmt.kind == "json_schema":
        try:
            schema = json.loads(fmt.spec)
        except ValueError as e:
            raise ParameterError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ParameterError("the JSON schema must be a JSON object")
        return llguidance.LLMatcher.grammar_from_json_schema(schema)
    if fmt.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(fmt.spec)
    if fmt.kind == "choice":
        try:
            options = json.loads(fmt.spec)
        except ValueError:
            options = None
        if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
            raise ParameterError("choices must be a non-empty list of non-empty strings")
        # Lark string literals in JSON quoting (an escaped regex would not do: llguidance reads \< as a word boundary)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options))
    return llguidance.LLMatcher.grammar_from_lark(fmt.spec)


def check(fmt: OutputFormat) -> None:
    """Raise a one-line ParameterError where ``fmt`` does not compile (a bad schema, regex or
    grammar), before any model is asked."""
    import llguidance

    try:
        problem = llguidance.LLMatcher.validate_grammar(grammar_of(fmt))
    except ParameterError:
        raise
    except Exception as e:
        problem = str(e) or type(e).__name__
    if problem and not problem.startswith("WARNING"):
        raise ParameterError(f"the {fmt.kind} output format does not compile: {_one_line(problem)}")


def _lltokenizer(tokenizer, vocab_size: int, eos_ids: set[int]):
    """llguidance's view of ``tokenizer`` (a Hugging Face fast tokenizer, or models.tokenizer's
    stand-in for one) over the target's ``vocab_size`` ids."""
    import llguidance

    key = (vocab_size, tuple(sorted(eos_ids)))
    try:
        held = _TOKENIZERS.get(tokenizer)
    except TypeError:  # not weakly referable: built each time
        held = None
    if held is not None and held[0] == key:
        return held[1]
    backend = getattr(tokenizer, "backend_tokenizer", None)  # (models.tokenizer.Tokenizer's, as transformers')
    if backend is None or not hasattr(backend, "to_str"):
        raise ParameterError("an output format needs a fast (tokenizers-library) tokenizer")
    eos = sorted(eos_ids) or ([tokenizer.eos_token_id] if getattr(tokenizer, "eos_token_id", None) is not None else [])
    try:
        made = llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos or None)
    except Exception as e:  # a tokenizer llguidance cannot read
        raise ParameterError(f"an output format cannot read this tokenizer: {_one_line(e)}") from None
    with contextlib.suppress(TypeError):  # (not weakly referable: built again next time)
        _TOKENIZERS[tokenizer] = (key, made)
    return made


class Constraint:
    """One answer's format: what llguidance's matcher has consumed is the committed answer."""

    def __init__(self, fmt: OutputFormat, tokenizer, vocab_size: int, eos_ids: set[int]):
        import llguidance

        grammar = grammar_of(fmt)
        self.matcher = llguidance.LLMatcher(_lltokenizer(tokenizer, vocab_size, eos_ids), grammar, log_level=0)
        if self.matcher.is_error():
            raise ParameterError(f"the {fmt.kind} output format does not compile: {_one_line(self.matcher.get_error())}")
        self.vocab_size = vocab_size
        self.eos = frozenset(eos_ids)
        # a check's allowed-id words by branch (tokens after the committed answer), kept until the
        # next commit: the drafter's masks and the verifier's are the same rows
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    def _end(self, tokens: list[int]) -> int | None:
        """Where ``tokens`` hold their first end-of-sequence id (the answer ends there), or None."""
        return next((i for i, t in enumerate(tokens) if t in self.eos), None)

    def commit(self, tokens: list[int]) -> None:
        """The answer goes on with ``tokens`` (chosen under this format's masks; what follows an
        end-of-sequence token is never the answer's)."""
        end = self._end(tokens)
        tokens = list(tokens) if end is None else list(tokens[:end + 1])
        self._rows.clear()
        if not self.matcher.consume_tokens(tokens):  # (its masks allow only what it takes: its parser gave up)
            raise ParameterError(f"the output format's parser stopped: {_one_line(self.matcher.get_error())}")

    @property
    def stopped(self) -> bool:
        """The format is complete and allows nothing more (the answer ends here)."""
        return self.matcher.is_stopped()

    def forced(self) -> list[int]:
        """The tokens the format forces next (possibly none)."""
        return self.matcher.compute_ff_tokens()

    def _fill(self, row: np.ndarray, tokens: list[int]) -> None:
        """Write into ``row`` (int32 words, a bit an id) the ids allowed after ``tokens`` beyond the
        committed answer; every bit where the format rules those tokens out (a row never reached).
        A branch's tokens go into a copy of the matcher (0.007 ms), never into the matcher of the
        committed answer: llguidance 1.9's rollback can leave that one's state off (a row-0 mask after
        the next commit that a matcher fed the same tokens afresh does not give: a Qwen2.5 tool
        call, fusion's trees, 2026-12-07), so it sees only what plain decoding's does."""
        if not tokens:
            self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            return
        branch = self.matcher.deep_copy()
        if branch.try_consume_tokens(tokens) == len(tokens):
            branch.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        else:
            row.fill(-1)

    def _row(self, tokens: list[int]) -> np.ndarray:
        """The allowed ids after ``tokens`` as int32 words (every bit after an end-of-sequence id:
        nothing follows an end, so such a row is never reached)."""
        key = tuple(tokens)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = np.empty((self.vocab_size + 31) // 32, dtype=np.int32)
            if self._end(key) is None:
                self._fill(row, list(key))
            else:
                row.fill(-1)
        return row

    def mask_after(self, tokens: list[int]) -> torch.Tensor:
        """[V] bool: the ids the format allows after ``tokens`` beyond the committed answer (all
        where it rules those out): what a drafter may guess there (Drafter.use_format)."""
        row = self._row(tokens)
        return torch.from_numpy(np.unpackbits(row.view(np.uint8), bitorder="little")[:self.vocab_size]).view(torch.bool)

    def masks(self, draft: Draft) -> torch.Tensor:
        """[K+1, V] bool: row 0's allowed ids after the committed answer, row i + 1's after node i's
        branch (chain: the guesses up to i); a row after a guess the format rules out (never
        accepted) allows everything."""
        words = np.stack([self._row(b) for b in row_branches(draft.tokens, draft.parents)])
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :self.vocab_size]
        return torch.from_numpy(bits).view(torch.bool)

    def apply(self, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
        """A copy of a check's logits [K+1, V] with every id its row's format rules out at -inf."""
        return torch.where(self.masks(draft)[:, :logits.shape[1]], logits, float("-inf"))

    def _valid(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the format takes after the committed answer (none after an
        end-of-sequence id)."""
        n = self.matcher.validate_tokens(tokens)
        end = self._end(tokens)
        return n if end is None else min(n, end + 1)

    def prune(self, draft: Draft) -> tuple[Draft, list[int]]:
        """``draft`` without the guesses the format rules out (and their subtrees), and the kept
        nodes' indices in it."""
        if not len(draft):
            return draft, []
        if draft.parents is None:
            keep = list(range(self._valid(list(draft.tokens))))
        else:
            keep, ok = [], [False] * len(draft)
            for j, parent in enumerate(draft.parents):
                if parent >= 0 and not ok[parent]:
                    continue
                branch = [draft.tokens[i] for i in branch_of(j, draft.parents)]
                ok[j] = self._valid(branch) == len(branch)
                if ok[j]:
                    keep.append(j)
        if len(keep) == len(draft):
            return draft, keep
        if draft.parents is None:
            tokens, parents = draft.tokens[:len(keep)], None
        else:
            tokens, parents = keep_nodes(draft.tokens, draft.parents, keep)
        return Draft(tokens, None if draft.probs is None else draft.probs[keep], parents,
                     None if draft.chances is None else [draft.chances[j] for j in keep]), keep

    def fit(self, proposal: Draft, cut: Callable[[Draft], Sent], forced: list[int]) -> Sent:
        """What a check sends under the format: the drafter's ``proposal`` without what the format
        rules out (deterministic guesses only), cut by ``cut`` (the engine policy's), with the
        ``forced`` tokens merged in as a sure chain (shared prefixes merged). Sent.nodes number
        the nodes as the drafter proposed them, -1 for a node only the format proposed."""
        n = len(proposal)
        pruned, kept = self.prune(proposal) if proposal.probs is None else (proposal, list(range(n)))
        sent = cut(pruned)
        nodes = [kept[j] for j in sent.nodes]
        draft = sent.draft
        if not forced or draft.probs is not None:
            return Sent(draft, nodes, n)
        tokens, parents, chance, where = merge_drafts([Draft(forced, chances=[1.0] * len(forced)), draft])
        own = {m: nodes[j] for j, m in enumerate(where[1])}
        chain = parents == list(range(-1, len(tokens) - 1))
        return Sent(Draft(tokens, None, None if chain else parents, chance), [own.get(i, -1) for i in range(len(tokens))], n)
