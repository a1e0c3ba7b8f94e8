"""Medusa and Hydra: K heads on the target's newest feature, head i guessing i + 1 tokens ahead.

f_t [H] is the target's final-norm hidden state at position t; its own output head reads the
next token x_{t+1} from it. Medusa head i (1..K) reads x_{t+1+i} from the same f_t, with no
knowledge of the tokens in between:

    r_i = f_t + silu(W_i f_t + b_i)        W_i [H, H], zero at the start (one residual block)
    guess_i = argmax  W_out[:vocab] r_i    the target's own output head, cut to ``vocab`` ids

(Medusa-1 with the output head shared, as the target's is already trained: each head is one
residual block, 2.4M parameters for H = 1536.) All K guesses come from one feature, so a draft
costs K small products whatever its depth, and the heads' top choices form a tree whose
children at depth d are the same for every parent: the drafter ranks nodes by the product of
the heads' confidences (drafters.medusa).

Hydra (kind "hydra") makes the heads sequentially dependent: head i also reads the token just
before its guess, x_{t+i} (for head 1 the newest committed token, which Medusa ignores; deeper,
the token of the draft node it extends), so a node's children depend on the node:

    r_i = f_t + silu(W_i [f_t ; rms(E[x_{t+i}]) * g_e] + b_i)      W_i [H, 2H]

(Hydra reads every earlier draft token; the newest alone keeps a head one product.)

Training (``train_medusa``) reads recorded features (heads.data): row t's f_t is scored for
head i against the target's own choice at row t + i (Hydra: given the true x_{t+i}), with the
sampled softmax of the MLP head's trainer (heads.train). Nothing is unrolled.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .data import FeatureSet
from .device import to_device
from .model import read_drafter, rms, save_drafter
from .train import fit_rows, sampled_softmax, split_documents, start_rows
from .vocab import ListedVocab, as_draft_indices

KIND = "medusa"
KINDS = ("medusa", "hydra")


@dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int  # H: the target's hidden size
    num_heads: int  # K: head i guesses i + 1 tokens past the feature's row
    vocab: int  # guesses come from `vocab` token ids: the first ones, or those listed (heads.vocab)
    target: str = ""  # what it was trained on (informative)
    kind: str = KIND  # "medusa", or "hydra": each head also reads the token before its guess
    eps: float = 1e-6
    listed_vocab: bool = False  # the ids are the buffer vocab_ids [vocab] (frequency-ranked), not 0..vocab-1

    @property
    def reads_token(self) -> bool:
        return self.kind == "hydra"


class MedusaHeads(ListedVocab, torch.nn.Module):
    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        if cfg.kind not in KINDS:
            raise ValueError(f"kind {cfg.kind!r} is not one of {KINDS}")
        self.cfg = cfg
        self.init_vocab()
        H = cfg.hidden_size
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(2 * H if cfg.reads_token else H, H)
                                          for _ in range(cfg.num_heads))
        if cfg.reads_token:
            self.g_e = torch.nn.Parameter(torch.ones(H))
        for b in self.blocks:  # each head starts as the target's own next-token guess
            torch.nn.init.zeros_(b.weight)
            torch.nn.init.zeros_(b.bias)

    def rows(self, f: torch.Tensor, heads: list[int], e: torch.Tensor | None = None, linears=None) -> torch.Tensor:
        """f [R, H] features, heads [R] (0-based), e [R, H] the embeddings of the tokens before
        each row's guess (Hydra only) -> [R, H], each read by the target's output head.
        ``linears``: the blocks as the drafter runs them (int8 copies), default the module's own."""
        linears = linears or self.blocks
        z = self._inputs(f, e)
        out = torch.empty_like(f)
        for i in sorted(set(heads)):
            at = [r for r, h in enumerate(heads) if h == i]
            out[at] = f[at] + F.silu(linears[i](z[at]))
        return out

    def forward(self, f: torch.Tensor, e: torch.Tensor | None = None) -> torch.Tensor:
        """Every head on f [B, H] (Hydra: e [B, K, H], head i's token embedding) -> [B, K, H]."""
        return torch.stack([f + F.silu(block(self._inputs(f, None if e is None else e[:, i])))
                            for i, block in enumerate(self.blocks)], 1)

    def _inputs(self, f: torch.Tensor, e: torch.Tensor | None) -> torch.Tensor:
        """A block's input: f [R, H] (Medusa), or [f ; rms(e) * g_e] [R, 2H] (Hydra)."""
        if not self.cfg.reads_token:
            return f
        return torch.cat([f, rms(e, self.cfg.eps) * self.g_e], -1)

    def save(self, directory: str | Path) -> None:
        save_drafter(self, directory)

    @classmethod
    def load(cls, directory: str | Path) -> MedusaHeads:
        return read_drafter(cls, MedusaConfig, directory, what="Medusa / Hydra drafter",
                            command="train-drafter --kind medusa|hydra")


@dataclass(frozen=True)
class MedusaTrainConfig:
    num_heads: int = 4
    vocab: int = 32768
    epochs: int = 3
    batch: int = 512  # feature rows a step (every head learns from each)
    lr: float = 1e-3
    weight_decay: float = 0.0
    negatives: int = 1024
    head_decay: float = 0.8  # head i's loss weighs head_decay ** i (far heads are right less often)
    holdout: float = 0.05
    seed: int = 0


def _labels(data: FeatureSet, rows: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For rows [B]: the target's candidates at row t + i ([B, K, TOP], its choice first),
    whether row t + i is in t's document ([B, K]), and the token there ([B, K], x_{t+i}: what
    a Hydra head reads), heads i = 1..K."""
    doc_end = data.starts[torch.searchsorted(data.starts, rows, right=True)]  # [B] first row past t's document
    at = (rows[:, None] + torch.arange(1, K + 1)).clamp_max(len(data) - 1)  # [B, K]
    valid = rows[:, None] + torch.arange(1, K + 1) < doc_end[:, None]
    return data.top[at], valid, data.tokens[at]


def _heads_on(heads: MedusaHeads, data: FeatureSet, rows: torch.Tensor, emb: torch.Tensor | None):
    """[B, K, H] every head on rows' features, (candidates as draft indices, -1 outside the heads'
    vocabulary; valid) as _labels gives them, on the heads' device (rows gathered on the CPU;
    emb, if any, on the heads' device)."""
    dev = next(heads.parameters()).device
    cand, valid, tokens, f = to_device(dev, *_labels(data, rows, heads.cfg.num_heads), data.features[rows])
    e = emb[tokens].float() if heads.cfg.reads_token else None  # [B, K, H]
    ids = heads.token_ids() if heads.cfg.listed_vocab else None
    return heads(f.float(), e), as_draft_indices(cand, heads.cfg.vocab, ids), valid


def _loss(heads: MedusaHeads, data: FeatureSet, w_out: torch.Tensor, rows: torch.Tensor, cfg: MedusaTrainConfig,
          negatives: torch.Tensor, emb: torch.Tensor | None) -> torch.Tensor:
    K = heads.cfg.num_heads
    r, cand, valid = _heads_on(heads, data, rows, emb)
    loss = 0.0
    for i in range(K):
        ok = valid[:, i] & (cand[:, i, 0] >= 0)
        if ok.any():
            loss = loss + cfg.head_decay ** i * sampled_softmax(r[ok, i], cand[ok, i], w_out, negatives)
    return loss


@torch.no_grad()
def agreement(heads: MedusaHeads, data: FeatureSet, rows: torch.Tensor, w_out: torch.Tensor,
              emb: torch.Tensor | None = None) -> list[float] | None:
    """Per head, the share of rows (with a label) where its greedy guess is the target's choice
    (Hydra: given the true tokens before it); w_out [V', H]: the rows of the heads' vocabulary."""
    K = heads.cfg.num_heads
    hits, counts = torch.zeros(K), torch.zeros(K)
    for i in range(0, len(rows), 2048):
        r, cand, valid = _heads_on(heads, data, rows[i:i + 2048], emb)
        guess = (r @ w_out.T).argmax(-1)  # [B, K] draft indices
        hits += ((guess == cand[..., 0]) & valid).sum(0).cpu()
        counts += valid.sum(0).cpu()
    if counts[0] == 0:
        return None
    return [round(float(a / max(b, 1)), 4) for a, b in zip(hits, counts)]


def train_medusa(data: FeatureSet, w_out: torch.Tensor, cfg: MedusaTrainConfig = MedusaTrainConfig(), *,
                 target_name: str = "", log=print, seconds: float | None = None,
                 doc_weight: torch.Tensor | None = None, kind: str = KIND,
                 emb: torch.Tensor | None = None, vocab_ids: torch.Tensor | None = None,
                 device: torch.device | str = "cpu", precision: str = "fp32") -> tuple[MedusaHeads, dict]:
    """Train K Medusa (or Hydra) heads. w_out [V', H]: the target's output head's rows for the heads'
    vocabulary (its first rows, or those of ``vocab_ids`` [V'], heads.vocab); emb [V, H]: its
    embedding (Hydra); doc_weight [D]: how often each document counts per epoch; ``device``: where
    they train (heads.device; they come back on the CPU); ``precision``: their steps' products, fp32
    or bf16 (heads.device.products_in). Returns the heads and their report (held-out agreement per
    head: every document, and those of the largest weight)."""
    torch.manual_seed(cfg.seed)
    H, K = data.features.shape[1], cfg.num_heads
    vocab = min(cfg.vocab, w_out.shape[0]) if vocab_ids is None else len(vocab_ids)
    if vocab_ids is not None and w_out.shape[0] != vocab:
        raise ValueError("a listed vocabulary needs one output row per listed id")
    heads = MedusaHeads(MedusaConfig(hidden_size=H, num_heads=K, vocab=vocab, target=target_name, kind=kind,
                                     listed_vocab=vocab_ids is not None))
    if vocab_ids is not None:
        heads.vocab_ids.copy_(vocab_ids)
    if heads.cfg.reads_token and emb is None:
        raise ValueError("Hydra heads learn from the target's embedding: pass emb")
    device = torch.device(device)
    heads.to(device)
    w_out, emb = to_device(device, w_out[:vocab].float().contiguous(), emb)
    n_docs = len(data.starts) - 1
    val_docs, train_docs = split_documents(n_docs, cfg.holdout, cfg.seed)
    train_rows = start_rows(data, train_docs, 1, doc_weight)  # rows with at least head 1's label
    t0 = time.perf_counter()
    step, total = fit_rows(
        heads, train_rows,
        lambda rows: _loss(heads, data, w_out, rows, cfg, *to_device(device, torch.randint(0, vocab, (cfg.negatives,))),
                           emb),
        epochs=cfg.epochs, batch=cfg.batch, lr=cfg.lr, weight_decay=cfg.weight_decay, log=log, seconds=seconds,
        precision=precision)
    heads.eval()
    report = {"train_positions": len(train_rows), "steps": step, "finished": step >= total,
              "seconds": round(time.perf_counter() - t0, 1), "device": str(device),
              "precision": precision}
    groups = {"val_agreement": val_docs}
    if doc_weight is not None:
        groups["val_agreement_weighted_docs"] = val_docs[doc_weight[val_docs] == doc_weight.max()]
    for key, docs in groups.items():
        got = agreement(heads, data, start_rows(data, docs, 1), w_out, emb)
        if got is not None:
            report[key] = got
    return heads.cpu(), report
