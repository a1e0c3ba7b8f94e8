"""``specdraft train-drafter`` / ``train-head``: the command-line entry for training drafters.

A top-layer entry point, beside the CLI: it loads the target through
:class:`~specdraft.pipeline.Speculator` and reads its output head the way the drafter will
(:func:`~specdraft.drafters.feature_head.output_weight`), then hands plain tensors to
:func:`~specdraft.heads.train.train_head`. Nothing below the CLI imports this module.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import torch

from ..drafters.feature_head import output_weight
from ..errors import ParameterError
from ..models.base import check_taps
from ..models.registry import DEFAULT_TARGET
from ..pipeline import Speculator
from .corpus import chat_requests, default_corpus
from .data import FeatureSet, concat, encode_corpus, record, record_again, record_answers, with_requests
from .device import PRECISIONS, training_device
from .eagle_train import EagleTrainConfig, TargetShape, train_eagle
from .medusa import KINDS as MEDUSA_KINDS
from .medusa import MedusaTrainConfig, train_medusa
from .model import FeatureHead, load_head, shipped_head_dir
from .requests import mixed_requests, passage_requests, self_requests
from .train import TrainConfig, split_documents, train_head
from .vocab import choice_counts, frequent_ids

# what train-drafter trains: an EAGLE layer, the MLP head, Medusa / Hydra heads, MTP modules
KINDS = ("eagle", "mlp", "medusa", "hydra", "mtp")
RECORD_BATCH = 8  # answers decoded together while recording (models.packed)
MTP_INNER = 1536  # an MTP module's default MLP width: 3 modules ship in ~42 MB (bf16)


def add_train_args(p, *, kind: str | None = None) -> None:
    """The ``train-head`` (kind "mlp") or ``train-drafter`` (``--kind``) options; the model options
    are added by the CLI."""
    if kind is None:
        p.add_argument("--kind", choices=KINDS, default="eagle",
                       help="eagle: one decoder layer over the target's features (method eagle); "
                            "mlp: the MLP head (methods head, hybrid-head, fusion); "
                            "medusa: K heads on the newest feature (method medusa); hydra: the same heads each "
                            "reading the token before its guess too (method hydra); mtp: K sequential MLP modules, "
                            "module k reading module k-1's state and the token after it (method mtp)")
    else:
        p.set_defaults(kind=kind)
    p.add_argument("--out", required=True, help="directory to write the drafter to (head.json + head.safetensors)")
    p.add_argument("--features", default=None,
                   help="recorded features of the text corpus (.pt): reused when the file exists, "
                        "else recorded and saved there")
    p.add_argument("--answers", default=None,
                   help="recorded features of the target's own answers (.pt, or several separated by commas): "
                        "each reused when it exists, else recorded (the Nth file on request set N) and saved there")
    p.add_argument("--taps", default=None,
                   help="mlp: comma-separated target layers (0-based) whose outputs the head's first step "
                        "also reads, EAGLE-3's fused features, e.g. 1,13,24 for a 28-layer target; "
                        "eagle (without --init): EAGLE-3's layer over those layers' outputs, which exports to "
                        "vLLM (speculators' eagle3) and SGLang; features are recorded with them "
                        "(eagle with --init: the head's own)")
    p.add_argument("--init", default=None,
                   help="start from this MLP head (a directory, or 'shipped' for the target's shipped head). "
                        "mlp: its step, fusion of taps, vocabulary and width, each unless --taps, --vocab, "
                        "--draft-vocab or --inner asks otherwise (to go on training it on new features, or to "
                        "add --taps to it); "
                        "eagle: an EAGLE layer of the 'head' form, attention in front of that head's step, which "
                        "starts as the head and keeps its taps, vocabulary and width")
    p.add_argument("--record-minutes", type=float, default=25.0,
                   help="longest time spent teacher-forcing the target over the text corpus")
    p.add_argument("--answer-minutes", type=float, default=22.0,
                   help="time spent letting the target answer generated chat requests (its own words teach best)")
    p.add_argument("--requests", choices=("auto", "templates", "self", "passages"), default="auto",
                   help="what the target answers when answers are recorded: templated chat requests, or requests "
                        "it writes itself from the chat template's user turn (Magpie: more varied, and drafters "
                        "trained on them guess better on requests they never saw; slower to make), or requests "
                        "that carry a passage it wrote (translation into English, summaries, questions over a "
                        "document); auto: for a chat model self with every fourth request a passage one, else templates")
    p.add_argument("--record-batch", type=int, default=RECORD_BATCH,
                   help="requests written and answered together in one cache while recording answers (the "
                        "answers each alone gets, ~2.7x as many a minute at 8 on 2 cores); 1: one at a time")
    p.add_argument("--with-requests", action="store_true",
                   help="eagle: train on each answer's request rows too (recorded once more with them, saved as "
                        "NAME.requests.pt beside each --answers file), so the layer learns to attend to the request "
                        "as it does when drafting; never scored on the request itself")
    p.add_argument("--answer-weight", type=int, default=3, help="how many times the answers count against the corpus")
    p.add_argument("--train-minutes", type=float, default=None,
                   help="stop training after this long (eagle: a checkpoint in --out resumes it on the next run)")
    p.add_argument("--device", default="auto",
                   help="where the drafter trains: auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda or "
                        "cuda:N; recording the target's features runs on the CPU either way (default auto)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="the training steps' matrix products: fp32 (default; repeats the shipped drafters' "
                        "training) or bf16 (torch.autocast; on an AMX Xeon the steps ran 2.4-3.6x faster, a small "
                        "EAGLE run 1.9x, with the same held-out agreement; weights and optimizer stay float32)")
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the data (default: mlp and mtp 4, eagle 2, medusa and hydra 3)")
    p.add_argument("--inner", type=int, default=None, help=f"MLP width (default: 2048; mtp {MTP_INNER} a module)")
    p.add_argument("--vocab", type=int, default=None, help="the drafter guesses among VOCAB token ids (default 32768)")
    p.add_argument("--draft-vocab", choices=("frequent", "first"), default=None,
                   help="which ids: those the target chose most often in the features (FR-Spec, EAGLE-3's draft "
                        "vocabulary; the default) or the first ones (the only choice for eagle without --taps)")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: mlp, mtp, medusa, hydra 1e-3; eagle 6e-4)")
    p.add_argument("--batch", type=int, default=None,
                   help="rows a training step (default: mlp, mtp 256; medusa, hydra 512; eagle about 1024 pairs "
                        "in whole document stretches)")
    p.add_argument("--start", choices=("identity", "random"), default=None,
                   help="eagle: the layer starts as 'the next feature is this one' (identity, the default) or at random")
    p.add_argument("--freeze-step", action="store_true",
                   help="eagle --init: train the attention alone, the MLP head's step kept as it is")
    p.add_argument("--unroll", type=int, default=None,
                   help="drafting steps trained in sequence, each fed the drafter's own prediction (default: 3); "
                        "mtp: the number of modules (default: 3); medusa, hydra: the number of heads (default: 4)")
    p.add_argument("--holdout", type=float, default=None,
                   help="share of the documents kept out of training to measure agreement on (default 0.05)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="AdamW weight decay (default: mlp, mtp 0; eagle 0.05 on its matrices; medusa, hydra theirs)")
    p.add_argument("--feature-noise", type=float, default=None,
                   help="mlp, mtp: Gaussian noise on the real features while training, as a share of each row's RMS "
                        "(default 0; at 0.1 no measured change held out, BENCHMARKS.md)")
    p.add_argument("--soft-labels", type=float, default=None,
                   help="mlp, mtp: share of each label that is the target's distribution over its candidates rather "
                        "than its choice (default 0)")


def _recorded(path, what: str, make, taps: tuple[int, ...] = (), target=None) -> FeatureSet:
    """A FeatureSet from ``path`` when it exists (recorded again with ``taps`` if it lacks them
    and kept its contexts), else made (with a progress bar) and saved there."""
    path = Path(path) if path else None
    if path is not None and path.is_file():
        data = FeatureSet.load(path)
        if not taps or data.taps == taps:
            print(f"{what}: {len(data)} positions from {path}")
            return data
        if data.context is None:
            raise ParameterError(f"{path} was recorded with taps {list(data.taps) or 'none'}, not {list(taps)}, and "
                                 "without its requests, so it cannot be recorded again; give another file to record into")

        def make(progress, old=data):
            return record_again(target, old, taps=taps, progress=progress)

        what = f"{what} again with taps {list(taps)}"
    from rich.progress import Progress  # here: ~150 ms to import, and the CLI imports this module on every start

    with Progress(transient=True) as bar:
        task = bar.add_task(f"recording {what}", total=None)
        data = make(lambda n: bar.advance(task, n))
    print(f"{what}: {len(data)} positions recorded")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data.save(path)
    return data


def _requests_path(path) -> Path | None:
    """Where the with-requests form of the answer set in ``path`` is kept: NAME.requests.pt."""
    return None if path is None else Path(path).with_suffix(".requests.pt")


def _feature_sets(args, sd: Speculator, taps: tuple[int, ...] = ()) -> list[tuple[FeatureSet, int]]:
    """(features, how often each of its documents counts): the text corpus, then one set of the
    target's own answers per ``--answers`` file (each answering its own requests; with
    ``--with-requests``, its requests' rows too, recorded once into NAME.requests.pt)."""
    target = sd.target.model
    sets: list[tuple[FeatureSet, int]] = []
    if args.record_minutes > 0 or (args.features and Path(args.features).is_file()):
        sets.append((_recorded(args.features, "text features", lambda progress: record(
            target, encode_corpus(sd.tokenizer, default_corpus()), seconds=args.record_minutes * 60,
            progress=progress, taps=taps), taps, target), 1))
    answer_files = [a for a in (args.answers or "").split(",") if a] or [None]
    for seed, path in enumerate(answer_files, start=1):
        if args.answer_weight and (args.answer_minutes > 0 or (path and Path(path).is_file())):
            full = _requests_path(path) if args.with_requests else None
            if full is not None and full.is_file():  # the answer set alone need not be loaded
                data = _recorded(full, "answer features with their requests", None, taps, target)
            else:
                data = _recorded(path, "answer features", lambda progress, seed=seed: record_answers(
                    target, (sd.encode_prompt(r) for r in request_set(args.requests, sd, seed, args.record_batch)),
                    eos_ids=sd.target.eos_ids, seconds=args.answer_minutes * 60, progress=progress, taps=taps,
                    batch=args.record_batch), taps, target)
            if args.with_requests and data.request_rows is None:
                if data.context is None:
                    raise ParameterError(f"{path} was recorded without its requests; --with-requests needs them")
                data = _recorded(full, "answer features with their requests",
                                 lambda progress, old=data: with_requests(target, old, progress=progress), taps, target)
            sets.append((data, args.answer_weight))
    if not sets:
        raise ParameterError("nothing to train on: give --record-minutes or --answer-minutes > 0")
    return sets


def request_set(kind: str, sd: Speculator, seed: int, batch: int = 1):
    """Request set ``seed`` of ``kind``: templated ones, or ones the target writes itself ("auto":
    for a chat model, those with every fourth one carrying a passage), ``batch`` at a time (the
    written ones depend on it: the draws are taken batch by batch)."""
    chat = bool(getattr(sd.tokenizer, "chat_template", None))
    if kind in ("self", "passages") or (kind == "auto" and chat):
        if not chat:
            raise ParameterError(f"--requests {kind} needs a chat model (a tokenizer with a chat template): the target "
                                 "writes requests from its template's user turn; give --requests templates")
        write = {"self": self_requests, "passages": passage_requests}.get(kind, mixed_requests)
        return write(sd.target.model, sd.tokenizer, 5000, seed=seed, eos_ids=sd.target.eos_ids, batch=batch)
    return chat_requests(5000, seed=seed)


def training_vocab(data, cfg, vocab_size: int) -> torch.Tensor:
    """[cfg.vocab] the ids the target chose most often in the documents a training run with
    ``cfg`` trains on (heads.vocab.frequent_ids): never counting the held-out ones, so held-out
    agreement and coverage stay held out."""
    _, train_docs = split_documents(len(data.starts) - 1, cfg.holdout, cfg.seed)
    rows = torch.cat([torch.arange(int(data.starts[d]), int(data.starts[d + 1])) for d in train_docs.tolist()])
    return frequent_ids(choice_counts(data.top[rows], vocab_size), cfg.vocab)


def _init_head(where: str, target: str) -> tuple[FeatureHead, dict]:
    """The MLP head to start from (a directory, or 'shipped': the target's shipped head) and where
    it came from (its directory and the record of its own training), for the new head's train.json."""
    directory = shipped_head_dir(target) if where == "shipped" else where
    if directory is None:
        raise ParameterError(f"no head is shipped for {target}; give --init DIR")
    head = load_head(directory)
    record = Path(directory) / "train.json"
    try:
        trained = json.loads(record.read_text())
    except (OSError, ValueError):
        trained = None
    return head, {"from": str(directory), "its_train_json": trained}


def _taps(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ParameterError(f"--taps takes comma-separated layer numbers, got {text!r}") from None


def train_from_args(args) -> int:
    """``specdraft train-head`` / ``train-drafter``: record the target's features on text and on
    its own answers to generated requests, train a drafter of ``args.kind``, save it."""
    for name in ("epochs", "inner", "vocab", "unroll", "batch", "record_batch"):
        value = getattr(args, name)
        if value is not None and value < {"inner": 8, "vocab": 2}.get(name, 1):
            raise ParameterError("epochs, unroll, batch, record-batch >= 1, inner >= 8, vocab >= 2")
    if args.lr is not None and not 0 < args.lr < 1:
        raise ParameterError("lr must be in (0, 1)")
    if args.holdout is not None and not 0 <= args.holdout < 1:
        raise ParameterError("holdout must be in [0, 1)")
    if args.weight_decay is not None and not 0 <= args.weight_decay < 1:
        raise ParameterError("weight-decay must be in [0, 1)")
    if args.feature_noise is not None and not 0 <= args.feature_noise <= 10:
        raise ParameterError("feature-noise must be in [0, 10]")
    if args.soft_labels is not None and not 0 <= args.soft_labels <= 1:
        raise ParameterError("soft-labels must be in [0, 1]")
    if args.answer_weight < 0 or args.record_minutes < 0 or args.answer_minutes < 0 or \
            (args.train_minutes is not None and args.train_minutes <= 0):
        raise ParameterError("minutes and answer-weight >= 0 (train-minutes > 0)")
    device = training_device(args.device)  # before loading the target and recording: a wrong one fails at once
    given = {k: v for k, v in (("epochs", args.epochs), ("inner", args.inner), ("vocab", args.vocab), ("lr", args.lr),
                               ("holdout", args.holdout), ("weight_decay", args.weight_decay),
                               ("feature_noise", args.feature_noise), ("soft_labels", args.soft_labels))
             if v is not None}
    heads_kind = args.kind in MEDUSA_KINDS
    for flag, value in (("--feature-noise", args.feature_noise), ("--soft-labels", args.soft_labels)):
        if value is not None and args.kind not in ("mlp", "mtp"):
            raise ParameterError(f"{flag} applies to --kind mlp and mtp only")
    on_head = args.kind == "eagle" and bool(args.init)  # an EAGLE layer of the "head" form
    eagle3 = args.kind == "eagle" and bool(args.taps) and not on_head  # EAGLE-3's layer
    if args.start is not None:
        if args.kind != "eagle" or on_head or eagle3:
            raise ParameterError("--start applies to --kind eagle without --init or --taps only")
        given["start"] = args.start
    if args.freeze_step:
        if not on_head:
            raise ParameterError("--freeze-step applies to --kind eagle --init only (the head form keeps the step)")
        given["freeze_step"] = True
    if on_head and ({"inner", "vocab"} & set(given) or args.taps or args.draft_vocab):
        raise ParameterError("--kind eagle --init takes its width, taps and vocabulary from the MLP head it starts as")
    if heads_kind and given.pop("inner", None) is not None:
        raise ParameterError(f"--inner does not apply to {args.kind} heads (each is one residual block of the hidden size)")
    if args.unroll:
        given["steps" if args.kind == "eagle" else "num_heads" if heads_kind else "steps_unrolled"] = args.unroll
    if args.kind == "mtp":
        given.setdefault("inner", MTP_INNER)
    taps = _taps(args.taps) if args.taps else ()
    if args.with_requests and args.kind != "eagle":
        raise ParameterError("--with-requests applies to --kind eagle only (the other drafters do not attend to a request)")
    if taps and args.kind not in ("mlp", "eagle"):
        raise ParameterError("--taps applies to --kind mlp and eagle only")
    if taps:
        given["taps"] = taps
    if eagle3:
        given["form"] = "eagle3"
    if args.init and args.kind not in ("mlp", "eagle"):
        raise ParameterError("--init applies to --kind mlp and eagle only")
    frequent = (args.draft_vocab or ("first" if args.kind == "eagle" and not eagle3 else "frequent")) == "frequent"
    if frequent and args.kind == "eagle" and not eagle3:
        raise ParameterError("--draft-vocab frequent does not apply to --kind eagle without --taps (the layer form "
                             "guesses among the first ids; with --init, the head's vocabulary)")
    if args.batch:
        given["rows" if args.kind == "eagle" else "batch"] = args.batch
    cfg = EagleTrainConfig(**given) if args.kind == "eagle" else MedusaTrainConfig(**given) if heads_kind \
        else TrainConfig(**given)
    name = args.target or DEFAULT_TARGET
    opts = {"target_format": args.target_format} if args.target_format else {}
    sd = Speculator(name, dtype=args.dtype, runtime="native", max_length=min(args.max_context, 1024),
                    load_draft=False, **opts)
    target = sd.target.model
    if not hasattr(target, "embed"):
        raise ParameterError("trained drafters need the native runtime (a Llama-family target)")
    if taps:
        try:
            check_taps(taps, target.spec.num_layers)
        except ValueError as e:
            raise ParameterError(f"--taps: {e}") from None
    init, init_record = _init_head(args.init, name) if args.init else (None, None)
    vocab_ids = None
    if on_head:
        taps = init.cfg.taps
        # the attention gets half the target's query heads, in whole groups of its key/value heads:
        # the default target's 12 -> 6 keep the layer, with the MLP head it starts as, under ~50 MB in bf16
        kv = target.spec.num_kv_heads
        heads = max(kv, target.spec.num_heads // 2 // kv * kv)
        given |= {"form": "head", "taps": taps, "inner": init.cfg.inner, "vocab": init.cfg.vocab, "heads": heads}
        cfg = EagleTrainConfig(**given)
        vocab_ids = init.token_ids() if init.cfg.listed_vocab else None
    elif init is not None:  # an MLP head goes on from the one given: what is not asked for otherwise is its own
        given.setdefault("inner", init.cfg.inner)
        if not args.taps:
            taps = init.cfg.taps
            given["taps"] = taps
        if args.vocab is None and args.draft_vocab is None:
            frequent = False
            given["vocab"] = init.cfg.vocab
            vocab_ids = init.token_ids() if init.cfg.listed_vocab else None
        cfg = TrainConfig(**given)
    if init is not None and (init.cfg.hidden_size, init.cfg.inner) != (target.spec.hidden_size, cfg.inner):
        raise ParameterError(f"the head in --init has hidden size {init.cfg.hidden_size} and inner {init.cfg.inner}; "
                             f"give the same --inner (target hidden size {target.spec.hidden_size})")
    sets = _feature_sets(args, sd, taps)
    weight = torch.cat([torch.full((len(fs.starts) - 1,), w) for fs, w in sets])  # [D]
    seconds = None if args.train_minutes is None else args.train_minutes * 60
    data = concat([fs for fs, _ in sets])
    scored = data.answers_only()  # the rows drafters are scored on
    if args.kind != "eagle":  # only the EAGLE layer attends to a request: the others train on answers alone
        data = scored
    if frequent:
        vocab_ids = training_vocab(scored, cfg, len(target.embed))
    w_out = output_weight(target, cfg.vocab if vocab_ids is None else vocab_ids)  # what the drafter will multiply by
    out = Path(args.out)
    if args.kind == "eagle":
        out.mkdir(parents=True, exist_ok=True)
        checkpoint = out / "checkpoint.pt"
        try:
            head, report = train_eagle(data, target.embed, w_out, TargetShape.of(target.spec), cfg, target_name=name,
                                       doc_weight=weight, seconds=seconds, checkpoint=checkpoint, init=target.norm,
                                       vocab_ids=vocab_ids, start_head=init, device=device,
                                       precision=args.precision)
        except ValueError as e:  # features recorded with other taps
            raise ParameterError(str(e)) from None
        if report["finished"]:
            checkpoint.unlink(missing_ok=True)
    elif heads_kind:
        head, report = train_medusa(data, w_out, cfg, target_name=name, doc_weight=weight, seconds=seconds,
                                    kind=args.kind, emb=target.embed, vocab_ids=vocab_ids, device=device,
                                    precision=args.precision)
    else:
        try:
            head, report = train_head(data, target.embed, w_out, cfg, target_name=name, doc_weight=weight,
                                      seconds=seconds, kind=args.kind, init=init, vocab_ids=vocab_ids, device=device,
                                      precision=args.precision)
        except ValueError as e:  # features recorded with other taps, or a head of other sizes to start from
            raise ParameterError(str(e)) from None
    head.save(out)
    made_by = "specdraft " + shlex.join(sys.argv[1:])  # the command that made it, for the record
    extra = {"init": init_record} if init_record else {}
    (out / "train.json").write_text(json.dumps({"command": made_by, "config": cfg.__dict__, **report, **extra}, indent=1)
                                    + "\n")
    print(json.dumps(report))
    return 0


def add_export_args(p) -> None:
    """The ``export`` options."""
    p.add_argument("drafter", nargs="?", default=None,
                   help="directory of a trained drafter of the kind --to writes (default: the one shipped for --target)")
    p.add_argument("--to", choices=("vllm", "sglang", "medusa"), default="vllm",
                   help="vllm: an EAGLE drafter in speculators' layout (eagle3 for an EAGLE-3 drafter, "
                        "eagle for the layer form); sglang: an EAGLE-3 drafter as SGLang's LlamaForCausalLMEagle3 "
                        "loads it; medusa: Medusa heads in the medusa_num_heads layout vLLM loads "
                        "(config.json + model.safetensors each)")
    p.add_argument("--out", required=True, help="directory to write to")
    p.add_argument("--target", default=None, help="the drafter's target (default: the default target)")
    p.add_argument("--verifier", default=None,
                   help="the target as the serving engine names it (default: its Hugging Face id)")


def export_from_args(args) -> int:
    """``specdraft export``: a trained drafter in a serving engine's layout."""
    from ..models.packaged import resolve_model_dir
    from ..models.registry import ALIASES, PACKAGED
    from .export import LAYOUTS, check_layout, export
    from .model import load_head, shipped_head_dir

    name = ALIASES.get(args.target or DEFAULT_TARGET, args.target or DEFAULT_TARGET)
    check_layout(args.to)
    kind = LAYOUTS[args.to][1]
    directory = args.drafter or shipped_head_dir(name, kind)
    if directory is None:
        raise ParameterError(f"no {kind} drafter is shipped for {name!r}; give its directory")
    head = load_head(directory, kind)
    config_path = resolve_model_dir(name, weights=False) / "config.json"
    try:
        verifier_config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise ParameterError(f"cannot read the target's {config_path} ({type(e).__name__})") from None
    if verifier_config.get("hidden_size") != head.cfg.hidden_size:
        raise ParameterError(f"the drafter in {directory} was trained for hidden size {head.cfg.hidden_size}, "
                             f"the target {name!r} has {verifier_config.get('hidden_size')}")
    packaged = PACKAGED.get(name)
    verifier = args.verifier or (packaged.hf_id if packaged is not None and packaged.hf_id else name)
    lm_rows = None
    # guesses read the target's output head: the export carries its rows
    if kind == "medusa" or getattr(head.cfg, "form", None) == "eagle3":
        sd = Speculator(name, dtype="fp32", runtime="native", max_length=64, load_draft=False)
        lm_rows = output_weight(sd.target.model, head.token_ids() if head.cfg.listed_vocab else head.cfg.vocab)
    for path in export(head, args.out, args.to, verifier, verifier_config, lm_rows):
        print(path)
    return 0
