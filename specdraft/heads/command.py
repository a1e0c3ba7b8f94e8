"""``specdraft train-head``: the command-line entry for training a drafting head.

A top-layer entry point, beside the CLI: it loads the target through
:class:`~specdraft.pipeline.Speculator` and reads its output head the way the drafter will
(:func:`~specdraft.drafters.feature_head.output_weight`), then hands plain tensors to
:func:`~specdraft.heads.train.train_head`. Nothing below the CLI imports this module.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..drafters.feature_head import output_weight
from ..errors import ParameterError
from ..models.registry import DEFAULT_TARGET
from ..pipeline import Speculator
from .corpus import chat_requests, default_corpus
from .data import FeatureSet, concat, encode_corpus, record, record_answers
from .train import TrainConfig, train_head


def add_train_args(p) -> None:
    """The ``train-head`` options (the model options are added by the CLI)."""
    p.add_argument("--out", required=True, help="directory to write the head to (head.json + head.safetensors)")
    p.add_argument("--features", default=None,
                   help="recorded features of the text corpus (.pt): reused when the file exists, "
                        "else recorded and saved there")
    p.add_argument("--answers", default=None,
                   help="recorded features of the target's own answers (.pt, or several separated by commas): "
                        "each reused when it exists, else recorded (the Nth file on request set N) and saved there")
    p.add_argument("--record-minutes", type=float, default=25.0,
                   help="time spent teacher-forcing the target over the text corpus")
    p.add_argument("--answer-minutes", type=float, default=22.0,
                   help="time spent letting the target answer generated chat requests (its own words teach best)")
    p.add_argument("--answer-weight", type=int, default=3, help="how many times the answers count against the corpus")
    p.add_argument("--train-minutes", type=float, default=None, help="stop training after this long")
    d = TrainConfig()
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--inner", type=int, default=d.inner, help="MLP width D")
    p.add_argument("--vocab", type=int, default=d.vocab, help="the head guesses among the first VOCAB token ids")
    p.add_argument("--unroll", type=int, default=d.steps_unrolled, help="head steps trained in sequence")


def _recorded(path, what: str, make) -> FeatureSet:
    """A FeatureSet from ``path`` when it exists, else made (with a progress bar) and saved there."""
    path = Path(path) if path else None
    if path is not None and path.is_file():
        data = FeatureSet.load(path)
        print(f"{what}: {len(data)} positions from {path}")
        return data
    from rich.progress import Progress  # here: ~150 ms to import, and the CLI imports this module on every start

    with Progress(transient=True) as bar:
        task = bar.add_task(f"recording {what}", total=None)
        data = make(lambda n: bar.advance(task, n))
    print(f"{what}: {len(data)} positions recorded")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data.save(path)
    return data


def _feature_sets(args, sd: Speculator) -> list[tuple[FeatureSet, int]]:
    """(features, how often each of its documents counts): the text corpus, then one set of the
    target's own answers per ``--answers`` file (each answering its own requests)."""
    target = sd.target.model
    sets: list[tuple[FeatureSet, int]] = []
    if args.record_minutes > 0 or (args.features and Path(args.features).is_file()):
        sets.append((_recorded(args.features, "text features", lambda progress: record(
            target, encode_corpus(sd.tokenizer, default_corpus()), seconds=args.record_minutes * 60,
            progress=progress)), 1))
    answer_files = [a for a in (args.answers or "").split(",") if a] or [None]
    for seed, path in enumerate(answer_files, start=1):
        if args.answer_weight and (args.answer_minutes > 0 or (path and Path(path).is_file())):
            sets.append((_recorded(path, "answer features", lambda progress, seed=seed: record_answers(
                target, (sd.encode_prompt(r) for r in chat_requests(5000, seed=seed)), eos_ids=sd.target.eos_ids,
                seconds=args.answer_minutes * 60, progress=progress)), args.answer_weight))
    if not sets:
        raise ParameterError("nothing to train on: give --record-minutes or --answer-minutes > 0")
    return sets


def train_from_args(args) -> int:
    """``specdraft train-head``: record the target's features on text and on its own answers
    to generated requests, train a head, save it."""
    if args.epochs < 1 or args.inner < 8 or args.vocab < 2 or args.unroll < 1 or args.answer_weight < 0 \
            or args.record_minutes < 0 or args.answer_minutes < 0:
        raise ParameterError("epochs, unroll >= 1, inner >= 8, vocab >= 2; minutes and answer-weight >= 0")
    cfg = TrainConfig(inner=args.inner, vocab=args.vocab, steps_unrolled=args.unroll, epochs=args.epochs)
    name = args.target or DEFAULT_TARGET
    opts = {"target_format": args.target_format} if args.target_format else {}
    sd = Speculator(name, dtype=args.dtype, runtime="native", max_length=min(args.max_context, 1024),
                    load_draft=False, **opts)
    target = sd.target.model
    if not hasattr(target, "embed"):
        raise ParameterError("drafting heads need the native runtime (a Llama-family target)")
    sets = _feature_sets(args, sd)
    weight = torch.cat([torch.full((len(fs.starts) - 1,), w) for fs, w in sets])  # [D]
    w_out = output_weight(target, cfg.vocab)  # what the drafter will multiply by
    seconds = None if args.train_minutes is None else args.train_minutes * 60
    head, report = train_head(concat([fs for fs, _ in sets]), target.embed, w_out, cfg, target_name=name,
                              doc_weight=weight, seconds=seconds)
    head.save(args.out)
    (Path(args.out) / "train.json").write_text(json.dumps({"config": cfg.__dict__, **report}, indent=1) + "\n")
    print(json.dumps(report))
    return 0
