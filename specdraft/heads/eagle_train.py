"""Fitting an EAGLE layer (heads.eagle) to recorded target features, with training-time test.

A batch holds whole stretches of documents (up to ``chunk`` rows each). Step 0 runs the layer
over every pair (f_p, x_{p+1}) at once with a causal mask, as the drafter's cache sees the real
context. Step j > 0 is the j-th guess drafted from each start p: the input is the layer's own
output of step j-1 with the token x_{p+j+1}, at position p+j, and it attends to

    the real pairs 0..p (step 0's keys, causal)  +  its own chain's keys of steps 1..j

exactly what the drafter attends to when it drafts j tokens past the newest committed one. So
the layer learns from its own predictions (EAGLE-3's training-time test) for ``steps`` steps.

Each step is scored against the target's next feature f_{p+j+1} (smooth L1) and against the
target's choice there with a sampled softmax: the target's top candidates (label first) plus
``negatives`` random ids shared by the batch, read through the target's output head.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ParameterError
from .data import FeatureSet
from .device import products_in, to_device
from .eagle import Eagle3Head, EagleConfig, EagleHead, EagleMLPHead, eagle_module
from .train import sampled_softmax, split_documents, warmup_cosine
from .vocab import as_draft_indices


@dataclass(frozen=True)
class EagleTrainConfig:
    inner: int = 2048  # MLP width of the layer
    vocab: int = 32768
    steps: int = 3  # drafting steps trained (1 = no training-time test)
    epochs: int = 2
    rows: int = 1024  # pairs per batch (about)
    chunk: int = 512  # rows of a document per stretch (longer documents are cut)
    lr: float = 6e-4
    weight_decay: float = 0.05  # on the matrices only (norm gains stay free): the data is small
    negatives: int = 1024
    reg_weight: float = 0.5  # smooth L1 on features vs cross-entropy
    step_decay: float = 0.8  # step j's losses weigh step_decay ** j
    rope_theta: float = 10000.0  # the layer's own RoPE base (positions stay within a few thousand)
    start: str = "identity"  # layer form: "identity" starts as h = f (start_as_identity); "random": fc at random
    holdout: float = 0.05
    seed: int = 0
    form: str = "layer"  # heads.eagle: "layer" (EAGLE-1 layer), "head" (attention in front of an MLP head's
    # step) or "eagle3" (EAGLE-3's layer over the fused raw outputs of the taps)
    heads: int = 0  # the layer's query heads (0: the target's; a multiple of its key/value heads)
    taps: tuple[int, ...] = ()  # forms "head", "eagle3": target layers fused into real rows' features
    # form "head": train the attention alone, the MLP head's step (and fusion) kept as it starts
    freeze_step: bool = False

    def __post_init__(self):
        object.__setattr__(self, "taps", tuple(self.taps))


@dataclass(frozen=True)
class TargetShape:
    """What the layer copies from the target: its attention geometry."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, spec) -> TargetShape:
        """From a native model's spec (models.llama.LlamaSpec)."""
        return cls(spec.num_heads, spec.num_kv_heads, spec.head_dim)


def stretches(data: FeatureSet, docs: torch.Tensor, chunk: int, weight: torch.Tensor | None = None) -> list[tuple]:
    """(first row, rows, position of the first row in its document) for the given documents cut
    into stretches of at most ``chunk`` rows (each listed weight[d] times); stretches shorter
    than 3 rows teach nothing and are left out. A document with request rows (data.request_rows)
    starts at most ``chunk // 2`` of them before its answer (the rest of a long request is cut),
    and a stretch of request rows alone is left out."""
    out = []
    requests = data.request_rows
    for d in docs.tolist():
        s, e = int(data.starts[d]), int(data.starts[d + 1])
        r = 0 if requests is None else int(requests[d])
        for a in range(s + max(0, r - chunk // 2), e, chunk):
            n = min(chunk, e - a)
            if n >= 3 and a + n - 1 > s + r:
                out += [(a, n, a - s)] * (1 if weight is None else int(weight[d]))
    return out


def _first_scored(data: FeatureSet, batch: list[tuple]) -> torch.Tensor:
    """[B]: per stretch, the first row a drafting start is scored from (past its request rows)."""
    if data.request_rows is None:
        return torch.zeros(len(batch), dtype=torch.int64)
    docs = torch.searchsorted(data.starts, torch.tensor([a for a, _, _ in batch]), right=True) - 1
    return (data.request_rows[docs] - torch.tensor([p0 for _, _, p0 in batch])).clamp_min(0)


def batches(items: list[tuple], rows: int, generator: torch.Generator) -> list[list[tuple]]:
    """Stretches grouped by length (little padding), about ``rows`` padded rows a batch, shuffled."""
    items = sorted(items, key=lambda it: it[1])
    out, cur = [], []
    for it in items:
        if cur and (len(cur) + 1) * it[1] > rows:
            out.append(cur)
            cur = []
        cur.append(it)
    if cur:
        out.append(cur)
    return [out[i] for i in torch.randperm(len(out), generator=generator).tolist()]


def _gather(data: FeatureSet, batch: list[tuple], top: torch.Tensor, taps: bool = False,
            device: torch.device = torch.device("cpu")):
    """Padded tensors of a batch on ``device`` (gathered on the CPU, copied over): features
    [B, T, H] fp32, tokens [B, T], top [B, T, K] (rows of ``top``: data.top as draft indices),
    positions [B, T], lengths [B], with ``taps`` the tapped layers' outputs [B, T, k, H] fp32
    (else None), and the first row each stretch's drafting starts are scored from [B]
    (_first_scored: past a request's rows)."""
    T = max(n for _, n, _ in batch)
    idx = torch.stack([torch.arange(a, a + T).clamp_max(a + n - 1) for a, n, _ in batch])  # [B, T]
    pos = torch.stack([torch.arange(p0, p0 + T) for _, _, p0 in batch])
    lengths = torch.tensor([n for _, n, _ in batch])
    feats, tokens, cand, pos, lengths, aux, first = to_device(device, data.features[idx], data.tokens[idx], top[idx],
                                                              pos, lengths, data.aux[idx] if taps else None,
                                                              _first_scored(data, batch))
    return feats.float(), tokens, cand, pos, lengths, None if aux is None else aux.float(), first


def unrolled(head: EagleHead | EagleMLPHead | Eagle3Head, feats, tokens, pos, lengths, emb: torch.Tensor, steps: int,
             aux: torch.Tensor | None = None, first: torch.Tensor | None = None):
    """The layer's predictions for every start p and step j: [(h_j [B, P, H], valid_j [B, P])]
    with P = T - 1 pairs; valid_j: the step's input token and its target exist (and p >= first
    [B], where given: starts inside a request are context only). aux [B, T, k, H]: the tapped
    layers' outputs, fused into the real rows' features (form "head" with taps)."""
    B, T, _ = feats.shape
    P = T - 1
    c = head.cfg
    g = c.num_heads // c.num_kv_heads
    p_idx = torch.arange(P, device=feats.device)
    causal = p_idx[None, :] <= p_idx[:, None]  # [P(query), P(key)]

    def shifted_tokens(j):  # x_{p+j+1} for every p (padding past the end: repeats the last)
        return tokens[:, (p_idx + j + 1).clamp_max(T - 1)]

    def split(q):  # [B, P, nh, hd] -> [B, nkv, g, P, hd]
        return q.view(B, P, c.num_kv_heads, g, c.head_dim).permute(0, 2, 3, 1, 4)

    # step 0: the real pairs (f_p, x_{p+1}) at positions p
    real = head.entry(feats[:, :P], None if aux is None else aux[:, :P])  # [B, P, H] (fused with taps)
    x = head.inputs(real, emb[shifted_tokens(0)].float())  # [B, P, H] (form "head": [B, P, 2H])
    cos, sin = head.rope_tables(pos[:, :P])
    q, k0, v0 = head.project(x, cos, sin)  # [B, P, nh|nkv, hd]
    k0, v0 = k0.transpose(1, 2), v0.transpose(1, 2)  # [B, nkv, P, hd]
    scale = c.head_dim ** -0.5
    out = []
    chain_k, chain_v = [], []  # steps 1..j: [B, nkv, P, hd] each, key of chain p at index p
    h = None
    for j in range(steps):
        if j > 0:
            x = head.inputs(h, emb[shifted_tokens(j)].float())
            cos, sin = head.rope_tables(pos[:, :P] + j)
            q, kj, vj = head.project(x, cos, sin)
            chain_k.append(kj.transpose(1, 2))
            chain_v.append(vj.transpose(1, 2))
        qg = split(q)  # [B, nkv, g, P, hd]
        s_ctx = torch.einsum("bkgpd,bkqd->bkgpq", qg, k0) * scale  # [B, nkv, g, P, P]
        s_ctx = s_ctx.masked_fill(~causal, float("-inf"))
        s_chain = [torch.einsum("bkgpd,bkpd->bkgp", qg, kc)[..., None] * scale for kc in chain_k]  # [.., P, 1]
        w = torch.cat([s_ctx, *s_chain], -1).softmax(-1)
        att = torch.einsum("bkgpq,bkqd->bkgpd", w[..., :P], v0)
        for i, vc in enumerate(chain_v):
            att = att + w[..., P + i, None] * vc[:, :, None]
        att = att.permute(0, 3, 1, 2, 4).reshape(B, P, c.num_heads, c.head_dim)
        h = head.finish(x, att)  # [B, P, H], the next step's input
        valid = p_idx[None, :] <= lengths[:, None] - j - 2
        out.append((head.readout(h), valid if first is None else valid & (p_idx[None, :] >= first[:, None])))
    return out


def _loss(head, batch_tensors, emb, w_out, cfg: EagleTrainConfig, negatives: torch.Tensor):
    feats, tokens, top, pos, lengths, aux, first = batch_tensors
    P = feats.shape[1] - 1
    loss = 0.0
    for j, (h, valid) in enumerate(unrolled(head, feats, tokens, pos, lengths, emb, cfg.steps, aux, first)):
        nxt = (torch.arange(P, device=feats.device) + j + 1).clamp_max(P)  # row p+j+1: the target there
        cand = top[:, nxt]  # [B, P, K] draft indices, the target's choice first
        label_ok = valid & (cand[..., 0] >= 0)
        if not label_ok.any():
            continue
        hv = h[label_ok]  # [N, H]
        ce = sampled_softmax(hv, cand[label_ok], w_out, negatives)
        reg = F.smooth_l1_loss(hv, feats[:, nxt][label_ok])
        loss = loss + cfg.step_decay ** j * (ce + cfg.reg_weight * reg)
    return loss


@torch.no_grad()
def agreement(head: EagleHead | EagleMLPHead | Eagle3Head, data: FeatureSet, items: list[tuple], emb, w_out, steps: int,
              top: torch.Tensor | None = None) -> list[float] | None:
    """Share of (start, step j) where the layer's greedy guess over its vocabulary (the rows
    w_out [V', H]) is the target's choice, given the true tokens before it, per step (None
    without rows); top: data.top as draft indices (default: the first V' ids). The head, emb and
    w_out on one device (the batches go there)."""
    top = as_draft_indices(data.top.long(), len(w_out)) if top is None else top
    hits, counts = torch.zeros(steps), torch.zeros(steps)
    for batch in batches(items, 2048, torch.Generator().manual_seed(0)):
        feats, tokens, cand, pos, lengths, aux, first = _gather(data, batch, top, bool(head.cfg.taps), w_out.device)
        P = feats.shape[1] - 1
        for j, (h, valid) in enumerate(unrolled(head, feats, tokens, pos, lengths, emb, steps, aux, first)):
            label = cand[:, (torch.arange(P, device=feats.device) + j + 1).clamp_max(P), 0]
            guess = (h @ w_out.T).argmax(-1)
            hits[j] += float(((guess == label) & valid).sum())
            counts[j] += float(valid.sum())
    if counts[0] == 0:
        return None
    return [round(float(a / max(b, 1)), 4) for a, b in zip(hits, counts)]


def start_as_identity(head: EagleHead, features: torch.Tensor, noise: float = 0.02) -> None:
    """Start the layer as "the next feature is this one", the MLP head's start: fc = [I | small
    noise] passes f through (attention and MLP start at zero), and g_out = the features' typical
    RMS undoes the output norm's rescaling, so h = rms(f) * c ~= f. The features are the target's
    normed ones, so their RMS varies little between rows. features [N, H]."""
    H = head.cfg.hidden_size
    with torch.no_grad():
        sample = features[torch.randperm(len(features))[:4096]].float()
        head.fc.weight.zero_()
        head.fc.weight[:, :H].copy_(torch.eye(H))
        head.fc.weight[:, H:].normal_(0.0, noise / H ** 0.5)
        head.g_out.fill_(float(sample.pow(2).mean(-1).sqrt().median()))


def train_eagle(data: FeatureSet, emb: torch.Tensor, w_out: torch.Tensor, shape: TargetShape,
                cfg: EagleTrainConfig = EagleTrainConfig(), *, target_name: str = "", log=print,
                seconds: float | None = None, doc_weight: torch.Tensor | None = None,
                checkpoint: str | Path | None = None, init: torch.Tensor | None = None,
                vocab_ids: torch.Tensor | None = None, start_head=None,
                device: torch.device | str = "cpu",
                precision: str = "fp32") -> tuple[EagleHead | EagleMLPHead | Eagle3Head, dict]:
    """Train an EAGLE layer. emb [V, H]: the target's embedding; w_out [V', H] its output head's
    rows for the drafter's vocabulary, the first ``cfg.vocab`` ids or ``vocab_ids`` [V'] (fp32);
    doc_weight [D]: how often each document counts per epoch; ``checkpoint``: a file the run is
    saved to every few minutes and resumed from when it exists; ``init`` [H]: the target's
    final-norm weight, the output gain's start when ``cfg.start`` is "random" (layer form) and
    in the "eagle3" form;
    ``start_head``: the MLP head (heads.model.FeatureHead) a "head" form layer starts as;
    ``device``: where it trains (heads.device; the layer comes back on the CPU); ``precision``: its steps'
    products, fp32 or bf16 (heads.device.products_in). Returns
    the layer and its report (held-out agreement per step: every document, and those of the
    largest weight). ValueError when the features lack the taps asked for, ``start_head`` does
    not fit, or ``cfg.freeze_step`` has no head-form start to keep."""
    torch.manual_seed(cfg.seed)
    H = data.features.shape[1]
    vocab = min(cfg.vocab, w_out.shape[0]) if vocab_ids is None else len(vocab_ids)
    if cfg.taps and (data.aux is None or data.taps != cfg.taps):
        raise ValueError(f"features recorded with taps {list(data.taps)}, but the layer wants {list(cfg.taps)}")
    if cfg.freeze_step and (cfg.form != "head" or start_head is None):
        raise ValueError("freeze_step keeps the step of the MLP head a head form layer starts from: give start_head")
    num_heads = cfg.heads or shape.num_heads
    if num_heads % shape.num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over the target's {shape.num_kv_heads} key/value heads")
    head = eagle_module(EagleConfig(hidden_size=H, num_heads=num_heads, num_kv_heads=shape.num_kv_heads,
                                    head_dim=shape.head_dim, inner=cfg.inner, vocab=vocab, rope_theta=cfg.rope_theta,
                                    target=target_name, form=cfg.form, taps=cfg.taps,
                                    listed_vocab=vocab_ids is not None))
    if vocab_ids is not None:
        head.vocab_ids.copy_(vocab_ids)
    if cfg.form == "head":
        if start_head is not None:
            head.start_from(start_head)
        if cfg.freeze_step:  # what the layer took from the head (its step, its fusion) stays
            kept = set(start_head.state_dict())
            for name, p in head.named_parameters():
                p.requires_grad_(name not in kept)
    elif cfg.form == "eagle3":
        head.start_as_last_tap(init)
    elif cfg.start == "identity":
        start_as_identity(head, data.features)
    elif init is not None:
        head.g_out.data.copy_(init.float())
    device = torch.device(device)
    head.to(device)
    emb, w_out = to_device(device, emb, w_out[:vocab].float().contiguous())
    top = as_draft_indices(data.top.long(), vocab, vocab_ids)  # [N, TOP] draft indices, -1 outside
    n_docs = len(data.starts) - 1
    val_docs, train_docs = split_documents(n_docs, cfg.holdout, cfg.seed)
    train_items = stretches(data, train_docs, cfg.chunk, doc_weight)
    t0 = time.perf_counter()
    steps = _fit(head, data, emb, w_out, top, train_items, cfg, log, seconds, checkpoint, precision)
    head.eval()
    total = cfg.epochs * len(batches(train_items, cfg.rows, torch.Generator()))
    scored = sum(n - 1 for _, n, _ in train_items) - int(_first_scored(data, train_items).sum()) if train_items else 0
    report = {"train_pairs": scored, "steps": steps, "finished": steps >= total,
              "seconds": round(time.perf_counter() - t0, 1), "device": str(device),
              "precision": precision}
    groups = {"val_agreement": val_docs}
    if doc_weight is not None:
        groups["val_agreement_weighted_docs"] = val_docs[doc_weight[val_docs] == doc_weight.max()]
    for key, docs in groups.items():
        got = agreement(head, data, stretches(data, docs, cfg.chunk), emb, w_out, cfg.steps, top)
        if got is not None:
            report[key] = got
    return head.cpu(), report


def _fit(head, data, emb, w_out, top, items, cfg: EagleTrainConfig, log, seconds, checkpoint, precision="fp32") -> int:
    """AdamW, warm-up then cosine decay over ``cfg.epochs`` passes, each step's loss computed with
    products in ``precision`` (heads.device.products_in); saves and resumes ``checkpoint``."""
    trained = [p for p in head.parameters() if p.requires_grad]
    matrices = [p for p in trained if p.dim() == 2]
    others = [p for p in trained if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": cfg.weight_decay},
                             {"params": others, "weight_decay": 0.0}], lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    per_epoch = len(batches(items, cfg.rows, gen))
    total = max(1, cfg.epochs * per_epoch)
    sched = warmup_cosine(opt, total, 30)
    step = 0
    path = Path(checkpoint) if checkpoint else None
    if path is not None and path.is_file():
        state = torch.load(path, weights_only=False, map_location=w_out.device)
        if state["config"] != asdict(cfg):
            raise ParameterError(f"{path} was saved by a run with other settings; remove it or use the same ones")
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
        log(f"resumed from {path} at step {step}/{total}")
    t0 = last_save = time.perf_counter()
    running = 0.0
    for epoch in range(step // per_epoch, cfg.epochs):
        order = batches(items, cfg.rows, torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
        for batch in order[step - epoch * per_epoch:]:
            negatives, = to_device(w_out.device, torch.randint(0, len(w_out), (cfg.negatives,)))  # drawn on the CPU
            with products_in(w_out.device, precision):
                loss = _loss(head, _gather(data, batch, top, bool(cfg.taps), w_out.device), emb, w_out, cfg, negatives)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            opt.step()
            sched.step()
            step += 1
            running += loss.detach()  # read back when logged: a GPU runs on meanwhile
            if step % 20 == 0:
                log(f"epoch {epoch} step {step}/{total} loss {float(running) / 20:.3f} {time.perf_counter() - t0:.0f}s")
                running = 0.0
            stop = seconds is not None and time.perf_counter() - t0 > seconds
            if path is not None and (stop or step == total or time.perf_counter() - last_save > 300):
                torch.save({"config": asdict(cfg), "head": head.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict(), "step": step}, path)
                last_save = time.perf_counter()
            if stop:
                return step
    return step
