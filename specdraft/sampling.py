"""Sampling transforms and seeded draws.

The same transform (temperature, then top-k, then top-p, then min-p) turns target logits into p and draft
logits into q, so that speculative sampling compares like with like. Every random draw goes
through one explicit ``torch.Generator``.
"""
from __future__ import annotations

import numpy as np
import torch

from .config import SamplingConfig


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded from ``seed`` (or from fresh entropy when seed is None)."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest logit: [..., V] -> [...] int64, the first one on ties and
    the first NaN if there is one, as ``torch.argmax`` gives them.

    NumPy's argmax is vectorised where torch's CPU argmax is not: over the default target's
    151,936 logits 0.03 ms a row against 0.23-0.5 ms (AVX2 EPYC), which a greedy step pays for
    every row it checks."""
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64) or logits.requires_grad:
        return logits.argmax(-1)
    return torch.from_numpy(np.asarray(np.argmax(logits.numpy(), -1), dtype=np.int64))


def topk_indices(logits: torch.Tensor, k: int, chunk: int = 64) -> torch.Tensor:
    """The indices of each row's k largest logits, largest first: [T, V] -> [T, k] int64, the values
    those of ``torch.topk`` (NaN counts as the largest; which of several equal values is taken
    may differ).

    Each row is cut into chunks of ``chunk``; the k chunks with the largest maxima hold k values at
    least as large as the row's k-th largest (every chunk outside them has a smaller maximum than
    each of theirs, so a value of the top k outside them would make k chunk maxima larger), so a
    topk over their k * chunk values gives the row's. Over the default target's 151,936 logits
    0.17-0.25 ms for 1-4 rows against torch.topk's 0.6-1.1 (AVX2 EPYC): token recycling pays it
    after every check."""
    T, V = logits.shape
    if 4 * k * chunk >= V:
        return logits.topk(k, -1).indices
    x = logits if V % chunk == 0 else torch.nn.functional.pad(logits, (0, -V % chunk), value=float("-inf"))
    best = x.view(T, -1, chunk).amax(-1).topk(k, -1).indices  # [T, k] chunks
    cand = (best[..., None] * chunk + torch.arange(chunk)).view(T, -1)  # [T, k * chunk] their positions
    return cand.gather(1, x.gather(1, cand).topk(k, -1).indices)


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """[N, V] logits -> [N, V] float32 probabilities after temperature, top-k, top-p and min-p.

    Greedy (temperature 0) gives a one-hot at the argmax, so the same verification rule covers
    greedy decoding too.

    >>> probs_from_logits(torch.tensor([[2.0, 1.0, 0.0]]), SamplingConfig(temperature=1.0, top_k=2))
    tensor([[0.7311, 0.2689, 0.0000]])
    """
    logits = logits.float()
    if cfg.greedy:
        return one_hot(argmax(logits), logits.shape[-1])
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]  # [N, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        probs = _nucleus(probs, cfg.top_p)
    if cfg.min_p > 0.0:  # (vLLM's and llama.cpp's min-p: relative to the likeliest, which always stays)
        probs = probs.masked_fill(probs < cfg.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


# Top-p looks at the most likely ids first: sorting a whole 152k vocabulary costs ~18 ms a row on
# a 2-core CPU, about what a forward of the 1.5B target costs, and a nucleus is rarely larger
NUCLEUS_FIRST = 1024


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[N, V] probabilities -> the same kept to their nucleus and renormalised: a token is dropped
    when the mass strictly before it (most likely first) already reaches top_p; the most likely
    always stays. The ids are ranked among the NUCLEUS_FIRST (then 8x as many, ...) most likely
    while every row's nucleus ends inside them (the mass before the last of them reaches top_p),
    which keeps what ranking the whole vocabulary keeps (tied probabilities may rank in another
    order; one at the edge of the nucleus could then swap with its twin)."""
    V = probs.shape[-1]
    k = min(NUCLEUS_FIRST, V)
    while True:
        if k < V:
            sorted_p, order = torch.topk(probs, k, dim=-1)  # sorted, most likely first
        else:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        if k == V or bool((before[..., -1] >= top_p).all()):
            break
        k = min(V, k * 8)
    sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs / probs.sum(-1, keepdim=True)


def one_hot(index: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N] int64 -> [N, V] float32 one-hot rows."""
    out = torch.zeros(*index.shape, vocab, dtype=torch.float32)
    return out.scatter_(-1, index.unsqueeze(-1), 1.0)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row of [N, V] probabilities (each row summing to > 0) -> [N] int64:
    one uniform draw a row, found in the row's cumulative sums (torch.multinomial takes ~10x the
    time of a whole draw this way on a 152k vocabulary).

    >>> sample(torch.tensor([[0.0, 1.0, 0.0]]), make_generator(0))
    tensor([1])
    """
    cdf = probs.double().cumsum(-1)  # [N, V]
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64) * cdf[:, -1:]  # [N, 1] in [0, total)
    # the first id whose cumulative sum passes u: one with p > 0, taken with chance p / total
    got = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    V = probs.shape[-1]
    if bool((got == V).any()):  # u * total rounded up to total: the last id with p > 0 instead
        got = torch.minimum(got, V - 1 - (probs.flip(-1) > 0).int().argmax(-1))
    return got


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator) -> int:
    """Choose one token from [V] logits: argmax when greedy, else a seeded draw from p."""
    if cfg.greedy:
        return int(argmax(logits))
    return int(sample(probs_from_logits(logits[None], cfg), generator)[0])


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
    """Each chosen token's log-probability under its row of the target's logits [N, V] (the raw
    softmax: temperature 1, before top-k / top-p, as vLLM reports them), and the ``top`` most
    likely (id, log-probability) of that row, most likely first: N (logprob, top) pairs.

    Row by row, so a row's numbers are the same bits whatever block it came in (a plain step's one
    row, or a row of a speculative check): with the runtime's block-independent logits, the
    log-probabilities of a speculative run are those of plain decoding."""
    out = []
    for row, tok in zip(logits.float(), tokens):
        lp = torch.log_softmax(row, -1)  # [V]
        best = ()
        if top:
            ids = topk_indices(row[None], top)[0]  # [top], most likely first
            best = tuple(zip(ids.tolist(), lp[ids].tolist()))
        out.append((float(lp[tok]), best))
    return out


def apply_penalties(logits: torch.Tensor, generated: list[int], branches: list[list[int]], prompt: torch.Tensor,
                    cfg: SamplingConfig) -> torch.Tensor:
    """The target's logits [R, V] with ``cfg``'s logit bias and penalties, row r's by the tokens before it: the
    generated tokens, then ``branches[r]`` (the guesses on the row's branch: a chain's first r, a
    tree node's ancestors and itself); ``prompt``: the prompt's distinct ids (int64), which the
    repetition penalty counts too. Returns ``logits`` itself when no penalty is set.

    A token's penalised logit is computed from its total count in one expression, so a row gets
    the same bits whether its tokens were committed before the forward (plain decoding) or sit
    on its branch (a speculative check): the verifier then judges guesses against exactly what
    plain decoding would choose from."""
    if not cfg.penalized:
        return logits
    out = logits.float().clone()
    if cfg.logit_bias:  # every row alike, first
        ids, bias = zip(*cfg.logit_bias)
        out[:, list(ids)] += torch.tensor(bias, dtype=torch.float32)
    base: dict[int, int] = {}
    for t in generated:
        base[t] = base.get(t, 0) + 1
    for r, branch in enumerate(branches):
        counts = dict(base)
        for t in branch:
            counts[t] = counts.get(t, 0) + 1
        row = out[r]
        ids = torch.tensor(list(counts), dtype=torch.int64)
        if cfg.repetition_penalty != 1.0:
            seen = torch.unique(torch.cat([prompt, ids]))
            x = row[seen]
            row[seen] = torch.where(x > 0, x / cfg.repetition_penalty, x * cfg.repetition_penalty)
        if counts and (cfg.frequency_penalty or cfg.presence_penalty):
            n = torch.tensor(list(counts.values()), dtype=torch.float32)
            row[ids] -= cfg.frequency_penalty * n + cfg.presence_penalty
    return out
