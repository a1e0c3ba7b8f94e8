"""The options of ``specdraft bench`` (the model and speculation options come from :mod:`specdraft.options`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..config import GenerationConfig
from ..options import DTYPES, add_sampling_args
from .llama_cpp import METHODS as LLAMA_CPP_METHODS
from .mismatches import DEFAULT_TIE_GAP
from .peers import PEERS


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default=None, type=Path,
                   help="Spec-Bench prompts, JSON lines with question_id, category, turns "
                        "(default: the Spec-Bench dev prompts shipped with specdraft, 240 in 13 categories)")
    p.add_argument("--methods", default="none,draft-model,prompt-lookup",
                   help="comma-separated: none, our drafters (all = every one of them; one that cannot run with "
                        "these options, such as head without a drafting head, is skipped with the reason), "
                        "the transformers peers "
                        f"{', '.join(PEERS)} and {', '.join(LLAMA_CPP_METHODS)} (llama.cpp on the target's GGUF: plain, "
                        "with prompt lookup, with the draft model's GGUF; needs llama-cpp-python) "
                        "(none always runs first: it is the baseline)")
    p.add_argument("--max-new-tokens", type=int, default=GenerationConfig.max_new_tokens)
    p.add_argument("--ignore-eos", action="store_true",
                   help="every method (and peer, and --endpoint) generates exactly --max-new-tokens tokens, past "
                        "end-of-sequence tokens: answers of one length, so tokens/s compare per category also "
                        "when sampled runs draw answers of different lengths (default: stop at EOS)")
    # Greedy by default (Spec-Bench's protocol); with --temperature > 0 our methods sample, the
    # peers are refused and exactness does not apply (see bench.sampled). Seed 0 by default so
    # that two sampled runs of one command draw the same tokens.
    add_sampling_args(p, seed_default=0,
                      seed_help="with --temperature > 0: each prompt's generator is seeded from this and the prompt, "
                                "so a run repeats token for token (default: 0)")
    p.add_argument("--per-category", type=int, default=None, help="first N prompts of each category (file order)")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep (default: all)")
    p.add_argument("--reuse-prefix", action="store_true",
                   help="keep the target's cache from item to item, as `specdraft serve` does: an item that starts "
                        "with what an earlier one of the same method left (a later turn) prefills only the rest "
                        "(each method keeps its own copies, as a server running it alone would); llama.cpp's peers "
                        "keep their caches too, transformers' peers cannot (default: every item prefilled whole)")
    p.add_argument("--turns", type=int, default=1,
                   help="user turns of each prompt to run (Spec-Bench's MT-bench prompts have 2): turn k's prompt is "
                        "the conversation so far with none's answers, timed as its own item '<id>#k' (default: 1)")
    p.add_argument("--json", dest="json_out", default=None, type=Path,
                   help="write the full report here (per prompt, mismatches, machine; saved as the run goes)")
    p.add_argument("--markdown", type=Path, default=None, help="also write Markdown tables here")
    p.add_argument("--chart", type=Path, default=None,
                   help="also draw a PNG: speedup per category per method, tokens per target forward")
    p.add_argument("--order", choices=["interleaved", "by-method"], default="interleaved",
                   help="interleaved: each prompt runs every method in turn (the order rotating from prompt to "
                        "prompt), so a machine that slows down for minutes slows every method alike; by-method: "
                        "all prompts of one method, then the next (loads one peer's models at a time)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="run each method once on a short prompt before timing (first calls set up kernels)")
    p.add_argument("--hf-dtype-plain", choices=DTYPES, default="fp32",
                   help="dtype of hf-generate (plain HF decoding is fastest in fp32 on the CPUs we measured)")
    p.add_argument("--hf-dtype-assisted", choices=DTYPES, default="auto",
                   help="dtype of hf-assisted, target and assistant (auto: bf16 with native bf16, else fp32)")
    p.add_argument("--hf-dtype-prompt-lookup", choices=DTYPES, default="auto",
                   help="dtype of hf-prompt-lookup (it verifies blocks, like hf-assisted)")
    p.add_argument("--endpoint", default=None,
                   help="time an OpenAI-compatible server instead (base URL, e.g. http://127.0.0.1:8000/v1); "
                        "--methods is then ignored")
    p.add_argument("--endpoint-model", default=None, help="the model field sent to --endpoint")
    p.add_argument("--endpoint-name", default=None, help="the method name of --endpoint in the report")
    p.add_argument("--endpoint-timeout", type=float, default=600.0, help="seconds per request to --endpoint")
    p.add_argument("--concurrency", type=int, default=1,
                   help="requests in flight at once to --endpoint (each client sends the next prompt as its previous "
                        "one ends); the report adds the run's throughput and latency percentiles")
    p.add_argument("--tie-gap", type=float, default=DEFAULT_TIE_GAP,
                   help="a mismatch whose top-2 logit gap is below this counts as a rounding tie")
