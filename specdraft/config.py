"""Frozen configuration dataclasses; every default lives here and only here.

The CLI and the library build these objects; nothing downstream writes into them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ParameterError

MAX_REPETITION_PENALTY = 10.0


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from logits; applied identically to target and draft."""

    temperature: float = 0.0  # 0 = greedy (argmax); > 0 = sample from softmax(logits / T)
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose mass reaches p; 1.0 = off
    min_p: float = 0.0  # keep the tokens at least min_p times as likely as the likeliest; 0 = off
    seed: int | None = None  # seeds the one generator that all random draws go through
    # Penalties on the target's logits before the transforms above (greedy too), each row by the
    # text before it (sampling.apply_penalties): OpenAI's frequency / presence penalties over the
    # generated tokens (logit - frequency * count - presence), and the repetition penalty of CTRL /
    # transformers / vLLM over the prompt's and the generated tokens (a positive logit divided by
    # it, a negative one multiplied); 0, 0 and 1 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs added to the target's logits first
    # (a dict is taken too, kept as pairs in id order); -100 bans a token, 100 all but forces it
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:
            pairs = tuple(sorted((i, float(b)) for i, b in bias))
        except (TypeError, ValueError):
            raise ParameterError(f"logit bias must be (token id, bias) pairs, got {self.logit_bias!r}") from None
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 or not (math.isfinite(b) and -100 <= b <= 100)
               for i, b in pairs) or len({i for i, _ in pairs}) < len(pairs):
            raise ParameterError("logit bias: each token id once, an integer >= 0, with a bias in [-100, 100]")
        object.__setattr__(self, "logit_bias", pairs)
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ParameterError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ParameterError(f"top-k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ParameterError(f"top-p must be in (0, 1], got {self.top_p!r}")
        if not (_number(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise ParameterError(f"min-p must be in [0, 1] (0 = off), got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise ParameterError(f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not (_number(value) and -2.0 <= value <= 2.0):
                raise ParameterError(f"{name.replace('_', '-')} must be a number in [-2, 2] (0 = off), got {value!r}")
        if not (_number(self.repetition_penalty) and 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY):
            raise ParameterError(f"repetition-penalty must be a number in (0, {MAX_REPETITION_PENALTY:g}] (1 = off), "
                                 f"got {self.repetition_penalty!r}")

    @property
    def penalized(self) -> bool:
        """Some penalty or bias changes the target's logits."""
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0
                or bool(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


FORMAT_KINDS = ("json", "json_schema", "regex", "choice", "lark")


@dataclass(frozen=True)
class OutputFormat:
    """What the answer must be, token by token (structured output, held by specdraft.grammar):
    ``json``: any JSON object; ``json_schema``: JSON valid against the schema ``spec`` (JSON text);
    ``regex``: text matching the pattern ``spec`` whole; ``choice``: one of the strings in
    ``spec`` (a JSON list); ``lark``: text of the Lark grammar ``spec`` (llguidance's dialect)."""

    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FORMAT_KINDS:
            raise ParameterError(f"output format must be one of {', '.join(FORMAT_KINDS)}, got {self.kind!r}")
        if not isinstance(self.spec, str) or (self.kind != "json" and not self.spec):
            raise ParameterError(f"a {self.kind} output format needs its {_SPEC_NAMES[self.kind]} (a non-empty string)")

    @classmethod
    def schema(cls, schema: dict | str) -> OutputFormat:
        """JSON valid against ``schema`` (a dict, or its JSON text)."""
        import json

        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def choices(cls, options: list[str]) -> OutputFormat:
        import json

        return cls("choice", json.dumps(list(options)))


_SPEC_NAMES = {"json": "", "json_schema": "schema", "regex": "pattern", "choice": "choices", "lark": "grammar"}


MAX_TOP_LOGPROBS = 20  # the most likely tokens listed beside each generated one, at most (as OpenAI's API)
MAX_CHOICES = 64  # answers a request asks for at most (a server request's prompts x n; generate --n)


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate and when to stop."""

    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings; the text ends before the first one found
    ignore_eos: bool = False  # keep going past EOS (benchmarks of fixed length)
    # None: no log-probabilities; n >= 0: each token's under the target (its raw softmax), and the
    # n most likely tokens' beside it (at most MAX_TOP_LOGPROBS, as OpenAI's API)
    logprobs: int | None = None
    # None: the prompt is not scored; n >= 0: each prompt token after the first gets its
    # log-probability under the target (and the n most likely beside it), from the prefill's rows;
    # with it max_new_tokens may be 0 (score the prompt only)
    prompt_logprobs: int | None = None
    # None: free text; else what the answer must be (OutputFormat), each token chosen among those
    # that keep it so; the answer ends where the format is complete
    output_format: OutputFormat | None = None

    def __post_init__(self) -> None:
        if self.output_format is not None and not isinstance(self.output_format, OutputFormat):
            raise ParameterError(f"output_format must be an OutputFormat, got {type(self.output_format).__name__}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 <= value <= MAX_TOP_LOGPROBS):
                raise ParameterError(f"{name.replace('_', '-')} must be an integer in [0, {MAX_TOP_LOGPROBS}] (the most "
                                     f"likely tokens listed beside each one), got {value!r}")
        if isinstance(self.stop, str):  # one stop string, not its characters
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        least = 0 if self.prompt_logprobs is not None else 1  # 0: the prompt scored, nothing generated
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) \
                or self.max_new_tokens < least:
            raise ParameterError(f"max-new-tokens must be an integer >= {least}, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ParameterError("stop strings must be non-empty strings")


# Per-drafter default draft length (AVX2 CPU, w8a8 1.5B target ~84 ms a token, w8a8-fast 0.5B
# draft ~38 ms). With the cumulative-confidence stop (SpecConfig.min_confidence) a longer cap
# pays: on 8 dev prompts (writing, reasoning, math, coding; 128 tokens) draft-model went from
# 1.16x at k=3 to 1.24x at k=5 (3.48 tokens per target forward). Prompt lookup: k=5 beat 8.
DEFAULT_K = {"draft-model": 5, "prompt-lookup": 5, "hybrid": 5, "head": 5, "hybrid-head": 5}
# hybrid / hybrid-head: the lookup's k; their model part uses draft-model's / head's
# Those lengths hold where nothing else bounds a draft (SpecConfig.cost_rule False). With the cost
# rule (the default) every draft is cut to what pays on this machine's measured forward costs, so
# the cap only bounds how far a long right guess may run: copying prophets on coding edits (Zen 5,
# scripts/edit_prompts.py's 8 prompts, 256 tokens, interleaved): prompt-lookup 2.34x -> 2.52x of
# plain decoding (3.51 -> 4.18 tokens a forward), hybrid-head 2.37x -> 2.58x, fusion 2.51x -> 2.57x;
# on the 13 dev prompts every method within the runs' spread (BENCHMARKS.md, 2026-11-27).
RULED_K = 16


def draft_cap(method: str, cost_rule: bool = True) -> int:
    """Draft tokens per target forward for ``method`` when none are asked for: RULED_K with the
    cost rule, else DEFAULT_K (8 for a method not listed)."""
    return RULED_K if cost_rule else DEFAULT_K.get(method, 8)


# Draft-model prompt window per drafter, measured on the 8 long-prompt dev prompts (rag,
# summarization, qa, extraction x2; 128 tokens; one run each): with a 256-token window hybrid
# went from 0.96x to 1.12x of plain decoding (1.38x after the first token; the draft no longer
# prefills the whole document, and copies still come from all of it). The plain draft model
# lost too much acceptance then (81% -> 40%) for its cheaper prefill to pay. Drafting trees over
# 32,768 ids (Zen 5, 13 dev prompts, interleaved, one run) the draft model ran 1.13x plain
# decoding with the whole prompt, 1.18x with a 256-token window (2.23 / 2.27 tokens a forward).
DEFAULT_DRAFT_WINDOW = {"hybrid": 256, "draft-model": 256}


@dataclass(frozen=True)
class SpecConfig:
    """How drafts are made: which drafter and how many tokens per draft."""

    method: str = "draft-model"  # a drafter registry name, or "none" for plain decoding
    # Draft tokens per target forward (an upper bound; drafters may propose fewer). None = the
    # drafter's own default (draft_cap: RULED_K with the cost rule, DEFAULT_K without).
    k: int | None = None
    ngram_max: int = 4  # prompt-lookup: longest suffix n-gram tried first
    # prompt-lookup: shortest n-gram that may propose. Short matches are mostly wrong, and where a
    # block forward costs ~2 one-token forwards (fp32 on AVX2) a wrong 8-token guess loses time.
    ngram_min: int = 3
    # draft-model, greedy, before the target's forward costs are measured (or with cost_rule
    # False; with costs the cost rule decides, see drafters.draft_model): run another draft
    # forward only while the draft's probability that all
    # its guesses so far are right (the product of their probabilities) is at least this: the
    # next guess pays only if they all pass, and each costs a draft forward (~0.45 of a target
    # forward for the 0.5B draft of the 1.5B target on an AVX2 CPU).
    min_confidence: float = 0.5
    # The draft model sees at most this many prompt tokens (the latest); 0 = all; None = the
    # drafter's default (DEFAULT_DRAFT_WINDOW). Bounds the draft's prefill on long prompts;
    # lossless (only the guesses change).
    draft_window: int | None = None
    # The engine's cost rule (policy.DraftPolicy): send the likeliest guesses that pay for their
    # check by the target's measured forward costs, stop drafting where a further guess would not
    # pay, skip a drafter while its steps do not pay. False: only min_confidence and k bound a draft.
    cost_rule: bool = True
    # head / hybrid-head / eagle / medusa / hydra / mtp: draft EAGLE-2 dynamic token trees (several
    # guesses a position) where the target verifies tree masks, greedy or sampling (deterministic
    # children, verified one-hot); False: one chain of guesses. A tree grows only while the measured
    # cost curve pays for its nodes, so where checks are dear it stays a chain with free siblings.
    # On by default: on the Zen 4 EPYC (bench, 13 prompts, one run each in one phase) trees
    # committed more tokens a forward for every such method (head 1.66 against 1.57, eagle 1.65
    # against 1.56, mtp 1.33 against 1.23) and ran as fast or faster; on the AVX2 EPYC (4 runs each)
    # the two ran within each other's spread (head 1.09-1.11x against 1.06-1.18x). BENCHMARKS.md.
    trees: bool = True
    # the drafters on the target's features (head, eagle, medusa, hydra, mtp, hybrid-head, fusion),
    # with trees, greedy: the likeliest nodes of each draft extended by what followed their branch's
    # last tokens earlier in the text (drafters.extend: lookup after a guess, where lookup from the
    # context alone finds nothing). Measured on the AMX Xeon, 26 dev prompts (scripts/extend_ab.py,
    # BENCHMARKS.md): fusion 2.21 -> 2.28 tokens a forward, 1.49x -> 1.51x `none`; hybrid-head 2.12 ->
    # 2.19, 1.47x -> 1.49x; head 2.01 -> 2.11, 1.41x -> 1.45x; eagle 1.90 -> 2.06, 1.33x -> 1.38x.
    # False: the drafts as their prophets made them.
    extend: bool = True
    # with an output format (GenerationConfig.output_format): the format shapes the guesses: the
    # trained drafters' trees (head, eagle, medusa, hydra, mtp; in hybrid-head and fusion too) and
    # the draft model guess only what it allows after each branch, and where it forces the next
    # tokens they join the check's guesses (a drafting method only: "none" stays plain decoding).
    # False: the drafter's guesses as it makes them (the format still drops the deterministic ones
    # it rules out).
    format_guesses: bool = True
    # head / hybrid-head: the directory of a trained drafting head (head.json + head.safetensors);
    # None = the one shipped for the target, when there is one.
    head: str | None = None
    # eagle: the directory of a trained EAGLE drafter (`specdraft train-drafter --kind eagle`);
    # None = the one shipped for the target, when there is one.
    eagle: str | None = None
    # medusa: the directory of trained Medusa heads (`specdraft train-drafter --kind medusa`);
    # None = the ones shipped for the target, when there are some.
    medusa: str | None = None
    # hydra: the directory of trained Hydra heads (`specdraft train-drafter --kind hydra`).
    hydra: str | None = None
    # mtp: the directory of trained MTP modules (`specdraft train-drafter --kind mtp`).
    mtp: str | None = None
    # self-draft: how many of the target's layers its drafting copy skips (None: 30% of them,
    # drafters.self_draft.SKIP_SHARE); which ones is measured (drafters.self_draft.layer_harm).
    skip_layers: int | None = None
    # retrieval: the directory of a datastore built by `specdraft index build` (its tokenizer must
    # be the target's); None = no datastore, which --method retrieval refuses.
    index: str | None = None

    @property
    def draft_len(self) -> int:
        return self.cap_for(self.method)

    def cap_for(self, method: str) -> int:
        """Draft tokens per target forward for ``method`` (this one, or a composite's part): k when
        asked for, else draft_cap under this config's cost rule."""
        return self.k if self.k is not None else draft_cap(method, self.cost_rule)

    @property
    def window(self) -> int:
        """The draft model's prompt window for this method (0 = the whole prompt)."""
        return self.draft_window if self.draft_window is not None else DEFAULT_DRAFT_WINDOW.get(self.method, 0)

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ParameterError(f"method must be a drafter name or 'none', got {self.method!r}")
        for name in ("ngram_max", "ngram_min"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ParameterError(f"{name.replace('_', '-')} must be an integer, got {value!r}")
        if not isinstance(self.min_confidence, (int, float)) or isinstance(self.min_confidence, bool) \
                or not 0.0 <= self.min_confidence < 1.0:
            raise ParameterError(f"min-confidence must be in [0, 1), got {self.min_confidence!r}")
        if self.skip_layers is not None and (not isinstance(self.skip_layers, int) or isinstance(self.skip_layers, bool)
                                             or self.skip_layers < 1):
            raise ParameterError(f"skip-layers must be an integer >= 1, got {self.skip_layers!r}")
        if self.draft_window is not None and (not isinstance(self.draft_window, int) or isinstance(self.draft_window, bool)
                                              or self.draft_window < 0):
            raise ParameterError(f"draft-window must be an integer >= 0 (0 = whole prompt), got {self.draft_window!r}")
        if self.k is not None and (not isinstance(self.k, int) or isinstance(self.k, bool) or not 1 <= self.k <= 64):
            raise ParameterError(f"k (draft tokens per step) must be an integer in [1, 64], got {self.k!r}")
        if self.index is not None and (not isinstance(self.index, str) or not self.index):
            raise ParameterError(f"index must be the directory of a retrieval index, got {self.index!r}")
        if self.method == "retrieval" and self.index is None:
            raise ParameterError("method retrieval needs a datastore: pass --index INDEX "
                                 "(build one with `specdraft index build PATH... -o INDEX`)")
        if not (1 <= self.ngram_min <= self.ngram_max):
            raise ParameterError(
                f"n-gram sizes must satisfy 1 <= ngram-min <= ngram-max, got {self.ngram_min}, {self.ngram_max}"
            )
