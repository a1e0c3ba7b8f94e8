"""Fitting a FeatureHead to recorded target features (see heads.data).

For a start position t and an unroll of S steps, step s feeds (f, E[x_{t+s+1}]) where f is the
true f_t at s = 0 and the head's own previous prediction after, and is scored against the true
f_{t+s+1} with two losses:

- feature regression (smooth L1): keeps the prediction where the target's head reads it;
- sampled softmax: the target's logit row W f̂ over the target's own top candidates at t+s+1
  plus ``negatives`` random ids shared by the batch, with the target's argmax as the label
  (a full softmax over 32k-152k ids per row would cost ~30x more on a CPU).

Unrolling trains the head on its own predicted features, as it will be used when drafting.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .data import FeatureSet
from .model import FeatureHead, HeadConfig


@dataclass(frozen=True)
class TrainConfig:
    inner: int = 2048
    vocab: int = 32768
    steps_unrolled: int = 3
    epochs: int = 4
    batch: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    negatives: int = 1024
    reg_weight: float = 0.5  # smooth L1 on features vs cross-entropy
    holdout: float = 0.05  # share of documents kept for validation
    seed: int = 0


def _starts(data: FeatureSet, docs: torch.Tensor, S: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Row indices t with t + S inside the same document, over the given documents (each
    listed ``weight[d]`` times)."""
    out = [torch.arange(int(data.starts[d]), max(int(data.starts[d]), int(data.starts[d + 1]) - S))  # short documents: none
           .repeat(1 if weight is None else int(weight[d])) for d in docs.tolist()]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def _unroll(head: FeatureHead, data: FeatureSet, emb: torch.Tensor, w_out: torch.Tensor, rows: torch.Tensor,
            S: int, vocab: int, negatives: torch.Tensor | None, reg_weight: float):
    """Loss and per-step greedy agreement (argmax over the first `vocab` ids) for start rows."""
    f = data.features[rows].float()  # [B, H]
    loss = 0.0
    agree = []
    for s in range(S):
        nxt = rows + s + 1
        f = head(f, emb[data.tokens[nxt]].float())  # [B, H] predicted f_{t+s+1}
        true_f = data.features[nxt].float()
        label = data.top[nxt, 0]  # [B] the target's choice after position t+s+1
        if negatives is not None:
            cand = data.top[nxt]  # [B, TOP], label first
            pos = torch.einsum("bh,bkh->bk", f, w_out[cand.clamp_max(w_out.shape[0] - 1)].float())
            neg = f @ w_out[negatives].float().T  # [B, N]
            # a negative that is the label would compete with itself: mask it
            neg = neg.masked_fill(negatives[None, :] == label[:, None], float("-inf"))
            pos = pos.masked_fill(cand >= vocab, float("-inf"))
            logits = torch.cat([pos, neg], -1)
            valid = label < vocab
            ce = F.cross_entropy(logits[valid], torch.zeros(int(valid.sum()), dtype=torch.long)) if valid.any() else 0.0
            loss = loss + ce + reg_weight * F.smooth_l1_loss(f, true_f)
        else:
            with torch.no_grad():
                guess = (f @ w_out[:vocab].float().T).argmax(-1)
                agree.append((guess == label).float())
    return loss, agree


def train_head(data: FeatureSet, emb: torch.Tensor, w_out: torch.Tensor, cfg: TrainConfig = TrainConfig(),
               target_name: str = "", log=print, seconds: float | None = None,
               doc_weight: torch.Tensor | None = None) -> tuple[FeatureHead, dict]:
    """Train a head. emb [V, H]: the target's embedding; w_out [V, H]: its output head (fp32 or
    bf16); doc_weight [D] (int): how often each document counts per epoch. Returns the head and
    validation figures (greedy agreement per unrolled step, on held-out documents: overall and
    for the documents of the largest weight)."""
    torch.manual_seed(cfg.seed)
    H = data.features.shape[1]
    vocab = min(cfg.vocab, w_out.shape[0])
    head = FeatureHead(HeadConfig(hidden_size=H, inner=cfg.inner, vocab=vocab, target=target_name))
    S = cfg.steps_unrolled
    n_docs = len(data.starts) - 1
    perm = torch.randperm(n_docs)
    n_val = max(1, int(n_docs * cfg.holdout)) if n_docs > 1 else 0
    val_rows = _starts(data, perm[:n_val], S)
    train_rows = _starts(data, perm[n_val:], S, doc_weight)
    w_head = w_out[:vocab].float()  # [V', H]
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = max(1, cfg.epochs * math.ceil(len(train_rows) / cfg.batch))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(i, total) / total)))
    t0 = time.perf_counter()
    step = 0
    for epoch in range(cfg.epochs):
        order = train_rows[torch.randperm(len(train_rows))]
        running = 0.0
        for i in range(0, len(order), cfg.batch):
            negatives = torch.randint(0, vocab, (cfg.negatives,))
            loss, _ = _unroll(head, data, emb, w_head, order[i:i + cfg.batch], S, vocab, negatives, cfg.reg_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            running += float(loss.detach())
            if step % 50 == 0:
                log(f"epoch {epoch} step {step}/{total} loss {running / 50:.3f} {time.perf_counter() - t0:.0f}s")
                running = 0.0
            if seconds is not None and time.perf_counter() - t0 > seconds:
                break
        if seconds is not None and time.perf_counter() - t0 > seconds:
            break
    head.eval()
    report = {"train_positions": len(train_rows), "val_positions": len(val_rows), "steps": step,
              "seconds": round(time.perf_counter() - t0, 1)}
    groups = {"val_agreement": perm[:n_val]}
    if doc_weight is not None:
        top = perm[:n_val][doc_weight[perm[:n_val]] == doc_weight.max()]
        groups["val_agreement_weighted_docs"] = top
    for key, docs in groups.items():
        rows = _starts(data, docs, S)
        if not len(rows):
            continue
        with torch.no_grad():
            sums = torch.zeros(S)
            for i in range(0, len(rows), 1024):
                _, agree = _unroll(head, data, emb, w_head, rows[i:i + 1024], S, vocab, None, 0.0)
                sums += torch.stack([a.sum() for a in agree])
        report[key] = [round(float(x) / len(rows), 4) for x in sums]
    return head, report


def add_train_args(p) -> None:
    p.add_argument("--out", required=True, help="directory to write the head to (head.json + head.safetensors)")
    p.add_argument("--features", default=None,
                   help="recorded features of the text corpus (.pt): reused when the file exists, else recorded and saved there")
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


def _recorded(path, what: str, make):
    """A FeatureSet from ``path`` when it exists, else made (with a progress bar) and saved there."""
    from rich.progress import Progress

    path = Path(path) if path else None
    if path is not None and path.is_file():
        data = FeatureSet.load(path)
        print(f"{what}: {len(data)} positions from {path}")
        return data
    with Progress(transient=True) as bar:
        task = bar.add_task(f"recording {what}", total=None)
        data = make(lambda n: bar.advance(task, n))
    print(f"{what}: {len(data)} positions recorded")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data.save(path)
    return data


def train_from_args(args) -> int:
    """``specdraft train-head``: record the target's features on text and on its own answers
    to generated requests, train a head, save it."""
    from ..drafters.feature_head import output_weight
    from ..errors import ParameterError
    from ..models.packaged import DEFAULT_TARGET
    from ..pipeline import Speculator
    from .corpus import chat_requests, default_corpus
    from .data import concat, encode_corpus, record, record_answers

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
    sets: list[tuple[FeatureSet, int]] = []  # (features, how often each of its documents counts)
    if args.record_minutes > 0 or (args.features and Path(args.features).is_file()):
        sets.append((_recorded(args.features, "text features", lambda progress: record(
            target, encode_corpus(sd.tokenizer, default_corpus()), seconds=args.record_minutes * 60,
            progress=progress)), 1))
    answer_files = [a for a in (args.answers or "").split(",") if a] or [None]
    for seed, path in enumerate(answer_files, start=1):  # each file answers its own set of requests
        if args.answer_weight and (args.answer_minutes > 0 or (path and Path(path).is_file())):
            sets.append((_recorded(path, "answer features", lambda progress, seed=seed: record_answers(
                target, (sd.encode_prompt(r) for r in chat_requests(5000, seed=seed)), eos_ids=sd.target.eos_ids,
                seconds=args.answer_minutes * 60, progress=progress)), args.answer_weight))
    if not sets:
        raise ParameterError("nothing to train on: give --record-minutes or --answer-minutes > 0")
    weight = torch.cat([torch.full((len(fs.starts) - 1,), w) for fs, w in sets])  # [D]
    w_out = output_weight(target, cfg.vocab)  # what the drafter will multiply by
    head, report = train_head(concat([fs for fs, _ in sets]), target.embed, w_out, cfg, target_name=name,
                              doc_weight=weight, seconds=None if args.train_minutes is None else args.train_minutes * 60)
    head.save(args.out)
    (Path(args.out) / "train.json").write_text(json.dumps({"config": cfg.__dict__, **report}, indent=1) + "\n")
    print(json.dumps(report))
    return 0
