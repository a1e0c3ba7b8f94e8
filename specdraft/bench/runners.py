"""One runner per method, all with the same call shape: ``runner(prompt ids, max new tokens) -> Outcome``.

Our methods run on one :class:`~specdraft.pipeline.Speculator` (its target, and its draft model
when a method needs one); the transformers peers on models that :class:`PeerSetup` loads lazily;
``llama-cpp`` on the target's GGUF file.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters.suffix import HISTORY as SUFFIX_HISTORY
from ..models.packaged import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    gguf_file,
    resolve_model_dir,
)
from ..options import sampling_from_args, spec_from_args, speculator_options
from ..pipeline import Speculator, check_tokenizers
from ..prefix import PrefixCache, reuses_exactly
from .errors import BenchError
from .llama_cpp import DRAFT as LLAMA_CPP_DRAFT
from .llama_cpp import LOOKUP as LLAMA_CPP_LOOKUP
from .llama_cpp import METHODS as LLAMA_CPP_METHODS
from .llama_cpp import LlamaCppRunner
from .methods import needs_our_draft
from .peers import PEERS, PeerModels, PeerRunner, assistant_key, target_key
from .records import Outcome, Runner
from .sampled import for_prompt

BENCH_PREFIX_BUDGET = 256 << 20  # bytes of saved prefixes a method, with --reuse-prefix


def engine_runner(speculator, spec: SpecConfig, sampling: SamplingConfig, reuse_prefix: bool = False,
                  ignore_eos: bool = False) -> Runner:
    """Our engine for one method; one Engine serves every prompt (stream() resets its state, and
    the suffix drafters' history of earlier requests is emptied before each). Under sampling each
    prompt gets its own seed (see :mod:`specdraft.bench.sampled`); with ``ignore_eos`` every answer
    runs to max_new_tokens, its EOS tokens committed like any other."""
    engine = speculator.engine(spec)
    if reuse_prefix and reuses_exactly(speculator.target.model):  # this method's own record and copies, as a
        # server running it alone would keep (a target whose rows may depend on their block prefills whole)
        engine.prefix = PrefixCache(speculator.target.model, BENCH_PREFIX_BUDGET, eager=True)
    has_drafter = engine.drafter is not None

    def run(ids: list[int], max_new_tokens: int) -> Outcome:
        # every method answers the same prompts: an earlier method's answer in the suffix
        # drafters' history of requests would give this one away, so each run starts without it
        SUFFIX_HISTORY.clear()
        gen = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
        for _ in engine.stream(ids, for_prompt(sampling, ids), gen):
            pass
        s = engine.stats
        drafted, accepted = (s.draft_tokens, s.accepted_tokens) if has_drafter else (None, None)
        return Outcome(list(engine.token_ids), s.target_forwards, s.step_tokens, drafted, accepted, s.time_prefill,
                       s.time_draft, s.time_verify)

    return run


@dataclass
class PeerSetup:
    """What the transformers peers need: paths, EOS ids, dtypes, and the lazily loaded models."""

    target_path: Path
    draft_path: Path | None
    eos_ids: list[int]
    dtypes: dict[str, str]  # peer name -> dtype
    models: PeerModels
    ignore_eos: bool = False

    def keys_for(self, method: str | None) -> set:
        if method not in PEERS:
            return set()
        dtype = self.dtypes[method]
        keys = {target_key(self.target_path, dtype)}
        if PEERS[method].needs_assistant:
            keys.add(assistant_key(self.draft_path, dtype))
        return keys

    def runner(self, method: str) -> Runner:
        dtype = self.dtypes[method]
        model = self.models.get(target_key(self.target_path, dtype))
        assistant = (self.models.get(assistant_key(self.draft_path, dtype))
                     if PEERS[method].needs_assistant else None)
        return PeerRunner(PEERS[method], model, assistant, self.eos_ids, self.ignore_eos)


def timed(runner: Runner, ids: list[int], max_new_tokens: int) -> tuple[Outcome, float]:
    t0 = time.perf_counter()
    outcome = runner(ids, max_new_tokens)
    return outcome, time.perf_counter() - t0


def load_speculator(args, methods: list[str]) -> Speculator:
    """Target (and draft model when a method needs it) with the options `generate` passes too."""
    return Speculator(args.target, args.draft, dtype=args.dtype, runtime=args.runtime, max_length=args.max_context,
                      load_draft=needs_our_draft(methods), **speculator_options(args))


def peer_setup(args, methods: list[str], speculator) -> PeerSetup | None:
    """Paths and dtypes for the peers; the draft path resolves here only when hf-assisted runs."""
    used = [m for m in methods if m in PEERS]
    if not used:
        return None
    draft_path = None
    if any(PEERS[m].needs_assistant for m in used):
        draft_path = speculator.draft.path if speculator.draft is not None else _resolve_draft(args, speculator)
    eos = sorted(speculator.target.eos_ids)
    if not eos:
        raise BenchError(f"target {speculator.target.name!r} declares no EOS token; the peers could not stop")
    # the peers read the weights: the full copy (made where our target runs without one)
    return PeerSetup(resolve_model_dir(speculator.target.name), draft_path, eos,
                     {m: getattr(args, PEERS[m].dtype_option) for m in used}, PeerModels(eos), args.ignore_eos)


def _resolve_draft(args, speculator) -> Path:
    name = args.draft or DEFAULT_DRAFT
    path = resolve_model_dir(name)
    check_tokenizers(speculator.tokenizer, AutoTokenizer.from_pretrained(path), speculator.target.name, name)
    return path


def make_runner(method: str, args, speculator, peers: PeerSetup | None) -> Runner:
    if method in PEERS:
        return peers.runner(method)
    if method in LLAMA_CPP_METHODS:
        drafter = {LLAMA_CPP_LOOKUP: "lookup", LLAMA_CPP_DRAFT: "draft-model"}.get(method)
        draft_gguf = gguf_file(args.draft or DEFAULT_DRAFT) if drafter == "draft-model" else None
        return LlamaCppRunner(gguf_file(args.target or DEFAULT_TARGET), speculator.target.eos_ids,
                              n_ctx=speculator.target.model.max_length, drafter=drafter, draft_gguf=draft_gguf,
                              reuse_prefix=args.reuse_prefix, ignore_eos=args.ignore_eos)
    return engine_runner(speculator, spec_from_args(method, args), sampling_from_args(args), args.reuse_prefix,
                         args.ignore_eos)
