"""Fitting a FeatureHead (or MTP modules, heads.mtp) to recorded target features (see heads.data).

For a start position t and an unroll of S steps, step s feeds (f, E[x_{t+s+1}]) where f is the
true f_t at s = 0 and the drafter's own previous prediction after, and is scored against the
true f_{t+s+1} with two losses (the MLP head runs the same step at every s; MTP its module s):

- feature regression (smooth L1): keeps the prediction where the target's head reads it;
- sampled softmax: the target's logit row W f̂ over the target's own top candidates at t+s+1
  plus ``negatives`` random ids shared by the batch, with the target's argmax as the label
  (a full softmax over 32k-152k ids per row would cost ~30x more on a CPU).

Unrolling trains the head on its own predicted features, as it will be used when drafting.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .data import FeatureSet
from .device import products_in, to_device
from .model import FeatureHead, HeadConfig
from .mtp import MTPConfig, MTPModules
from .vocab import as_draft_indices


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
    taps: tuple[int, ...] = ()  # target layers fused into the first step's feature (heads.model)
    # Gaussian noise on the real features a start reads (f_t and the taps), as a share of each row's
    # RMS, while training only (EAGLE's feature noise): a head memorises the few documents one CPU
    # records (the shipped recipe: ~90% agreement on its training answers, ~56% on new ones).
    # Measured at 0.1 (and weight_decay 0.1), fine-tuning on one 28k-position set: no change held
    # out; soft_labels 0.5 kept ~1 point at depths 1-2 (BENCHMARKS.md, 2026-11-25). Both off by default;
    # the shipped head's last two fine-tunes (141k new positions, 3 epochs; those and 127k new, 2
    # epochs) used soft_labels 0.5.
    feature_noise: float = 0.0
    soft_labels: float = 0.0  # share of the label that is the target's distribution, not its argmax (sampled_softmax)


def start_rows(data: FeatureSet, docs: torch.Tensor, S: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Row indices t with t + S inside the same document, over the given documents (each
    listed ``weight[d]`` times)."""
    # a document shorter than S + 1 rows gives no start
    out = [torch.arange(int(data.starts[d]), max(int(data.starts[d]), int(data.starts[d + 1]) - S))
           .repeat(1 if weight is None else int(weight[d])) for d in docs.tolist()]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def split_documents(n_docs: int, holdout: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out, training) document indices: a ``holdout`` share (at least one when there are
    several) drawn from ``seed`` alone, so every kind of drafter trained on the same features
    is judged on the same documents."""
    perm = torch.randperm(n_docs, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(n_docs * holdout)) if n_docs > 1 else 0
    return perm[:n_val], perm[n_val:]


def sampled_softmax(f: torch.Tensor, cand: torch.Tensor, w_out: torch.Tensor, negatives: torch.Tensor,
                    true_f: torch.Tensor | None = None, soft: float = 0.0) -> torch.Tensor:
    """Cross-entropy of predicted features f [N, H] over the target's candidates cand [N, TOP]
    (draft indices, its choice first, which must be in the vocabulary) plus the shared random
    draft indices ``negatives`` [M], scored by the output rows w_out [V', H]; candidates outside
    the vocabulary (-1) and a negative equal to the label (it would compete with itself) are masked.

    With ``soft`` > 0 the label is partly the target's own distribution over the same ids, read
    from its true features true_f [N, H] through the same rows (a distilled label: how likely the
    target found each of its runners-up, not only which one won): the loss is (1 - soft) times the
    cross-entropy with the argmax plus ``soft`` times that with the target's distribution."""

    def logits(x: torch.Tensor) -> torch.Tensor:  # [N, TOP + M], masked ids at -inf
        pos = torch.einsum("nh,nkh->nk", x, w_out[cand.clamp_min(0)].float())
        neg = x @ w_out[negatives].float().T
        return torch.cat([pos, neg], -1).masked_fill(masked, float("-inf"))

    masked = torch.cat([cand < 0, (negatives[None, :] == cand[:, :1])], -1)  # [N, TOP + M]
    z = logits(f)
    hard = F.cross_entropy(z, torch.zeros(len(f), dtype=torch.long, device=f.device))
    if not soft:
        return hard
    with torch.no_grad():
        p = torch.softmax(logits(true_f), -1)  # the target's distribution over the sampled ids
    log_q = torch.log_softmax(z, -1).masked_fill(masked, 0.0)
    return (1 - soft) * hard - soft * (p * log_q).sum(-1).mean()


def noisy(x: torch.Tensor, share: float) -> torch.Tensor:
    """x [..., H] plus Gaussian noise of ``share`` times each row's RMS (x itself when share is 0)."""
    if not share:
        return x
    return x + torch.randn_like(x) * (share * x.pow(2).mean(-1, keepdim=True).sqrt())


def _unroll(head: FeatureHead | MTPModules, data: FeatureSet, emb: torch.Tensor, w_out: torch.Tensor, rows: torch.Tensor,
            S: int, top: torch.Tensor, negatives: torch.Tensor | None, reg_weight: float, noise: float = 0.0,
            soft: float = 0.0):
    """Loss and per-step greedy agreement (argmax over the vocabulary's rows w_out [V', H]) for
    start rows; top [N, TOP]: data.top as draft indices (-1 outside the vocabulary); ``noise``:
    TrainConfig.feature_noise on the start's real features; ``soft``: TrainConfig.soft_labels.
    The head, emb and w_out sit on the training device; data, top, rows and negatives on the
    CPU (each step's rows are gathered there and copied over)."""
    dev = w_out.device
    f, aux, negatives = to_device(dev, data.features[rows], data.aux[rows] if getattr(head.cfg, "taps", ()) else None,
                                  negatives)
    f = noisy(f.float(), noise)  # [B, H]
    if aux is not None:  # EAGLE-3 fused features for the first step
        f = head.entry(f, noisy(aux.float(), noise))
    loss = 0.0
    agree = []
    for s in range(S):
        nxt = rows + s + 1
        tokens, true_f, cand = to_device(dev, data.tokens[nxt], data.features[nxt], top[nxt])
        f = head.at_depth(s)(f, emb[tokens].float())  # [B, H] predicted f_{t+s+1}
        true_f = true_f.float()
        label = cand[:, 0]  # [B] the target's choice after position t+s+1 (its draft index)
        if negatives is not None:
            valid = label >= 0
            ce = sampled_softmax(f[valid], cand[valid], w_out, negatives, true_f[valid] if soft else None, soft) \
                if valid.any() else 0.0
            loss = loss + ce + reg_weight * F.smooth_l1_loss(f, true_f)
        else:
            with torch.no_grad():
                guess = (f @ w_out.float().T).argmax(-1)
                agree.append((guess == label).float())
    return loss, agree


def train_head(data: FeatureSet, emb: torch.Tensor, w_out: torch.Tensor, cfg: TrainConfig = TrainConfig(),
               target_name: str = "", log=print, seconds: float | None = None,
               doc_weight: torch.Tensor | None = None, kind: str = "mlp",
               init: FeatureHead | None = None, vocab_ids: torch.Tensor | None = None,
               device: torch.device | str = "cpu", precision: str = "fp32") -> tuple[FeatureHead | MTPModules, dict]:
    """Train a head (kind "mlp"), or MTP modules (kind "mtp": one per unrolled step). emb [V, H]:
    the target's embedding; w_out [V', H]: its output head's rows for the drafter's vocabulary
    (fp32 or bf16; ``drafters.feature_head.output_weight`` reads them from a loaded target):
    the first ``cfg.vocab`` ids, or ``vocab_ids`` [V'] (heads.vocab); doc_weight [D]
    (int): how often each document counts per epoch. Returns the head and validation figures
    (greedy agreement per unrolled step, on held-out documents: overall and for the documents of
    the largest weight). ``init``: an MLP head of the same sizes to start from (``start_from``: its
    step, and its fusion when the taps are the same). ``precision``: its steps'
    products (heads.device.products_in); ``device``: where it trains (heads.device);
    the head comes back on the CPU."""
    torch.manual_seed(cfg.seed)
    device = torch.device(device)
    H = data.features.shape[1]
    vocab = min(cfg.vocab, w_out.shape[0]) if vocab_ids is None else len(vocab_ids)
    if vocab_ids is not None and w_out.shape[0] != vocab:
        raise ValueError("a listed vocabulary needs one output row per listed id")
    S = cfg.steps_unrolled
    if kind == "mtp":
        head = MTPModules(MTPConfig(hidden_size=H, inner=cfg.inner, depth=S, vocab=vocab, target=target_name,
                                    listed_vocab=vocab_ids is not None))
    else:
        if cfg.taps and (data.aux is None or data.taps != tuple(cfg.taps)):
            raise ValueError(f"features recorded with taps {list(data.taps)}, but the head wants {list(cfg.taps)}")
        head = FeatureHead(HeadConfig(hidden_size=H, inner=cfg.inner, vocab=vocab, target=target_name,
                                      taps=tuple(cfg.taps), listed_vocab=vocab_ids is not None))
    if vocab_ids is not None:
        head.vocab_ids.copy_(vocab_ids)
    if init is not None:
        start_from(head, init)
    n_docs = len(data.starts) - 1
    val_docs, train_docs = split_documents(n_docs, cfg.holdout, cfg.seed)
    val_rows = start_rows(data, val_docs, S)
    train_rows = start_rows(data, train_docs, S, doc_weight)
    top = as_draft_indices(data.top.long(), vocab, vocab_ids)  # [N, TOP]
    head.to(device)
    emb, w_head = to_device(device, emb, w_out[:vocab].float())  # w_head [V', H]
    t0 = time.perf_counter()
    steps = _fit(head, data, emb, w_head, train_rows, cfg, top, log, seconds, precision)
    head.eval()
    report = {"train_positions": len(train_rows), "val_positions": len(val_rows), "steps": steps,
              "seconds": round(time.perf_counter() - t0, 1), "device": str(device),
              "precision": precision}
    groups = {"val_agreement": val_docs}
    if doc_weight is not None:
        groups["val_agreement_weighted_docs"] = val_docs[doc_weight[val_docs] == doc_weight.max()]
    for key, docs in groups.items():
        agreement = _agreement(head, data, emb, w_head, start_rows(data, docs, S), S, top)
        if agreement is not None:
            report[key] = agreement
    return head.cpu(), report


def start_from(head: FeatureHead, init: FeatureHead) -> None:
    """Copy ``init``'s step (gains, w1, w2) into ``head``, and its fusion of taps when both read the
    same taps (else the fusion stays "take the last layer's feature", for a head that learns to
    read new taps on top of the step). The vocabularies may differ (the step predicts a feature,
    which any rows of the output head read); the caller lists the ids. ValueError when the step's
    sizes differ."""
    if not isinstance(head, FeatureHead) or not isinstance(init, FeatureHead):
        raise ValueError("only an MLP head starts from another one")
    a, b = head.cfg, init.cfg
    if (a.hidden_size, a.inner) != (b.hidden_size, b.inner):
        raise ValueError(f"the head to start from has hidden {b.hidden_size}, inner {b.inner}; "
                         f"this one {a.hidden_size}, {a.inner}")
    copied = ("g_f", "g_e", "w1.", "w2.") + (("g_t", "fuse.") if a.taps and a.taps == b.taps else ())
    head.load_state_dict({k: v for k, v in init.state_dict().items() if k.startswith(copied)}, strict=False)


def _fit(head: FeatureHead | MTPModules, data: FeatureSet, emb: torch.Tensor, w_head: torch.Tensor, train_rows: torch.Tensor,
         cfg: TrainConfig, top: torch.Tensor, log, seconds: float | None, precision: str = "fp32") -> int:
    """fit_rows with the head's unrolled loss; returns the number of optimizer steps."""

    def loss_of(rows: torch.Tensor) -> torch.Tensor:
        negatives = torch.randint(0, len(w_head), (cfg.negatives,))
        return _unroll(head, data, emb, w_head, rows, cfg.steps_unrolled, top, negatives, cfg.reg_weight,
                       cfg.feature_noise, cfg.soft_labels)[0]

    return fit_rows(head, train_rows, loss_of, epochs=cfg.epochs, batch=cfg.batch, lr=cfg.lr,
                    weight_decay=cfg.weight_decay, log=log, seconds=seconds, precision=precision)[0]


def warmup_cosine(opt: torch.optim.Optimizer, total: int, warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate rising linearly over ``warmup`` steps, then decaying as a half cosine to
    zero at step ``total``."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(i, total) / total)))


def fit_rows(module: torch.nn.Module, train_rows: torch.Tensor, loss_of, *, epochs: int, batch: int, lr: float,
             weight_decay: float, log, seconds: float | None, precision: str = "fp32") -> tuple[int, int]:
    """AdamW with warm-up and cosine decay over ``epochs`` shuffled passes of ``train_rows`` [N]
    in batches of ``batch``, ``loss_of(rows)`` giving each batch's loss; stops after ``seconds``
    if given. Returns (optimizer steps taken, steps planned)."""
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay)
    total = max(1, epochs * math.ceil(len(train_rows) / batch))
    sched = warmup_cosine(opt, total, 50)
    t0 = time.perf_counter()
    step = 0
    for epoch in range(epochs):
        order = train_rows[torch.randperm(len(train_rows))]
        running = 0.0
        for i in range(0, len(order), batch):
            with products_in(next(module.parameters()).device, precision):
                loss = loss_of(order[i:i + batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            running += loss.detach()  # read back when logged: a GPU runs on meanwhile
            if step % 50 == 0:
                log(f"epoch {epoch} step {step}/{total} loss {float(running) / 50:.3f} {time.perf_counter() - t0:.0f}s")
                running = 0.0
            if seconds is not None and time.perf_counter() - t0 > seconds:
                return step, total
    return step, total


def _agreement(head: FeatureHead | MTPModules, data: FeatureSet, emb: torch.Tensor, w_head: torch.Tensor, rows: torch.Tensor,
               S: int, top: torch.Tensor) -> list[float] | None:
    """Share of start ``rows`` where the head's greedy guess at unrolled step s is the target's
    choice, per step (None without rows); top: data.top as draft indices (_unroll)."""
    if not len(rows):
        return None
    with torch.no_grad():
        sums = torch.zeros(S)
        for i in range(0, len(rows), 1024):
            _, agree = _unroll(head, data, emb, w_head, rows[i:i + 1024], S, top, None, 0.0)
            sums += torch.stack([a.sum() for a in agree]).cpu()
    return [round(float(x) / len(rows), 4) for x in sums]

