"""Command-line options shared by ``specdraft generate``, ``serve``, ``bench`` and ``train-head``.

The model options (which target and draft, their dtype and weight format), the speculation
options (k, n-gram lengths, head, ...) and the sampling options (temperature, top-k, top-p, seed)
are defined once here, with the functions that turn parsed arguments into a :class:`SpecConfig`,
a :class:`SamplingConfig` and Speculator's keyword options. Both ``cli`` and
``bench`` import this module; it imports neither.
"""
from __future__ import annotations

import argparse

from .config import SamplingConfig, SpecConfig
from .errors import ParameterError

DTYPES = ["auto", "bf16", "fp32"]
FORMATS = ["auto", "dense", "int8", "int4", "w8a8", "w8a8-fast", "gguf", "q4k"]  # "auto" + models.quant.WEIGHT_FORMATS

_DEFAULTS_SPEC = SpecConfig()
_DEFAULTS_SAMPLING = SamplingConfig()


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None,
                   help="target model: packaged name, HF model dir or .gguf (default: qwen2.5-coder-1.5b)")
    p.add_argument("--draft", default=None, help="draft model for --method draft-model (default: qwen2.5-coder-0.5b)")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="compute dtype of the models; auto = fp32 on every CPU (the GGUF kernels; exact). bf16 only when "
                        "asked: its matmuls are not batch-invariant on every CPU, so greedy output may differ from plain")
    p.add_argument("--target-format", default=None, choices=FORMATS,
                   help="target weights: auto = gguf (the GGUF file's own Q4_K/Q6_K weights, native kernels) where the "
                        "kernels build and the model has a GGUF file, else w8a8 (int8 weights and activations); "
                        "dense = exact --dtype weights")
    p.add_argument("--draft-format", default=None, choices=FORMATS,
                   help="draft model weights (auto = q4k: its weights quantized to Q4_K on load for the native kernels, "
                        "where they build; else w8a8-fast); a draft's numerics never change the output")
    p.add_argument("--runtime", default="auto", choices=["auto", "native", "hf"],
                   help="native Llama-family runtime or the transformers adapter")
    p.add_argument("--max-context", type=int, default=4096, help="KV cache capacity in tokens")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=int, default=_DEFAULTS_SPEC.k,
                   help="draft tokens per target forward (default: 16 while the cost rule sizes drafts, else the "
                        "drafter's own; config.draft_cap)")
    p.add_argument("--min-confidence", type=float, default=_DEFAULTS_SPEC.min_confidence,
                   help="draft-model, greedy: draft another token only while the product of the draft's "
                        "probabilities for its guesses so far is at least this")
    p.add_argument("--ngram-max", type=int, default=_DEFAULTS_SPEC.ngram_max, help="prompt-lookup: longest n-gram matched")
    p.add_argument("--ngram-min", type=int, default=_DEFAULTS_SPEC.ngram_min, help="prompt-lookup: shortest n-gram matched")
    p.add_argument("--draft-window", type=int, default=_DEFAULTS_SPEC.draft_window,
                   help="draft model: see at most this many (latest) prompt tokens, bounding its prefill; "
                        "0 = all (default: 256, see config.DEFAULT_DRAFT_WINDOW)")
    p.add_argument("--trees", action=argparse.BooleanOptionalAction, default=_DEFAULTS_SPEC.trees,
                   help="draft-model / hybrid / head / hybrid-head / eagle / medusa / hydra / mtp: greedy drafts as token trees "
                        "(EAGLE-2 style), sized by the "
                        "measured cost curve (default); --no-trees: one chain")
    p.add_argument("--extend", action=argparse.BooleanOptionalAction, default=_DEFAULTS_SPEC.extend,
                   help="drafters on the target's features, with trees, greedy: extend the likeliest guesses by what "
                        "followed them earlier in the text (default); --no-extend: the drafts as the prophets made them")
    p.add_argument("--cost-rule", action=argparse.BooleanOptionalAction, default=_DEFAULTS_SPEC.cost_rule,
                   help="send the guesses that pay for their check by the measured forward costs, and stop drafting "
                        "where another guess would not pay (default); --no-cost-rule: only --k and --min-confidence "
                        "bound a draft, so a seeded sampled run repeats token for token (drafts then never follow timings)")
    p.add_argument("--head", default=_DEFAULTS_SPEC.head,
                   help="head / hybrid-head: directory of a trained drafting head (default: the one shipped for the target)")
    p.add_argument("--eagle", default=_DEFAULTS_SPEC.eagle, metavar="DIR",
                   help="eagle: directory of a trained EAGLE drafter (default: the one shipped for the target)")
    p.add_argument("--medusa", default=_DEFAULTS_SPEC.medusa, metavar="DIR",
                   help="medusa: directory of trained Medusa heads (default: the ones shipped for the target)")
    p.add_argument("--hydra", default=_DEFAULTS_SPEC.hydra, metavar="DIR",
                   help="hydra: directory of trained Hydra heads (default: the ones shipped for the target)")
    p.add_argument("--mtp", default=_DEFAULTS_SPEC.mtp, metavar="DIR",
                   help="mtp: directory of trained MTP modules (default: the ones shipped for the target)")
    p.add_argument("--skip-layers", type=int, default=_DEFAULTS_SPEC.skip_layers, metavar="N",
                   help="self-draft: how many of the target's layers its drafting copy skips (default: half; "
                        "which ones is measured at start)")
    p.add_argument("--index", default=_DEFAULTS_SPEC.index, metavar="INDEX",
                   help="retrieval: directory of a datastore built by `specdraft index build` with the target's tokenizer")


def add_sampling_args(p: argparse.ArgumentParser, *, seed_default: int | None = _DEFAULTS_SAMPLING.seed,
                      seed_help: str = "seeds every random draw (default: fresh entropy)") -> None:
    p.add_argument("--temperature", type=float, default=_DEFAULTS_SAMPLING.temperature, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=_DEFAULTS_SAMPLING.top_k, help="keep the k most likely tokens; 0 = off")
    p.add_argument("--top-p", type=float, default=_DEFAULTS_SAMPLING.top_p,
                   help="keep the smallest set of tokens whose mass reaches p; 1 = off")
    p.add_argument("--min-p", type=float, default=_DEFAULTS_SAMPLING.min_p,
                   help="keep the tokens at least this times as likely as the likeliest; 0 = off")
    p.add_argument("--seed", type=int, default=seed_default, help=seed_help)


def add_penalty_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--frequency-penalty", type=float, default=_DEFAULTS_SAMPLING.frequency_penalty,
                   help="subtract this times a token's count in the generated text from its logit (-2..2; 0 = off)")
    p.add_argument("--presence-penalty", type=float, default=_DEFAULTS_SAMPLING.presence_penalty,
                   help="subtract this from the logit of every token the generated text holds (-2..2; 0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=_DEFAULTS_SAMPLING.repetition_penalty,
                   help="divide the positive logits of tokens in the prompt or the generated text by this, multiply "
                        "their negative ones (transformers' / vLLM's; 1 = off)")
    p.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                   help="add BIAS (-100..100) to token ID's logit, OpenAI's logit_bias (repeatable)")


def sampling_from_args(args) -> SamplingConfig:
    """The SamplingConfig that add_sampling_args' (and add_penalty_args') options describe
    (ParameterError when one is invalid)."""
    d = _DEFAULTS_SAMPLING
    bias = {}
    for item in getattr(args, "logit_bias", ()):
        token, _, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise ParameterError(f"--logit-bias takes ID=BIAS (an integer token id, a number), got {item!r}") from None
    return SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          seed=args.seed, logit_bias=bias,
                          frequency_penalty=getattr(args, "frequency_penalty", d.frequency_penalty),
                          presence_penalty=getattr(args, "presence_penalty", d.presence_penalty),
                          repetition_penalty=getattr(args, "repetition_penalty", d.repetition_penalty))


def spec_from_args(method: str, args) -> SpecConfig:
    """The SpecConfig that add_spec_args' options describe (ParameterError when one is invalid)."""
    return SpecConfig(method=method, k=args.k, ngram_max=args.ngram_max, ngram_min=args.ngram_min,
                      min_confidence=args.min_confidence, draft_window=args.draft_window,
                      head=args.head, eagle=args.eagle, medusa=args.medusa, hydra=args.hydra, mtp=args.mtp,
                      skip_layers=args.skip_layers, trees=args.trees, extend=args.extend, index=args.index,
                      cost_rule=args.cost_rule)


def speculator_options(args) -> dict:
    """Options of Speculator that the command line sets only when given."""
    opts = {"draft_format": args.draft_format, "target_format": args.target_format}
    return {k: v for k, v in opts.items() if v}
