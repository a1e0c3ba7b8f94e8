"""Perplexity of a text under the target, per weight format, and under llama.cpp on the same GGUF:
what each way of computing the model costs in quality (`specdraft perplexity`).

The text's tokens are cut into windows of ``context`` tokens (the last one shorter, when it holds
two or more); each window is prefilled from an empty cache and every token after its first is
scored by the row before it (the engine's prompt scoring, ``GenerationConfig.prompt_logprobs``, so
exactly the numbers a speculative run's log-probabilities report). Perplexity is exp(mean
negative log-likelihood) over all scored tokens, with the standard error of that mean. Every
format reads the same token ids, so their perplexities compare token for token: each one's
difference from the first's is a paired mean, with its own (smaller) standard error.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..config import GenerationConfig, SpecConfig
from ..engine import Engine
from ..errors import ParameterError


@dataclass(frozen=True)
class Perplexity:
    label: str  # the weight format (or the peer) that computed it
    tokens: int  # tokens scored
    nll: float  # mean negative log-likelihood, nats a token
    stderr: float  # standard error of that mean
    seconds: float  # wall time of the scoring (prefills and log-softmax)
    nlls: tuple[float, ...] = ()  # each scored token's, in order

    def against(self, base: Perplexity) -> tuple[float, float]:
        """This mean NLL less ``base``'s over the same tokens, and the standard error of that
        paired difference (much smaller than either's own: the tokens' difficulty cancels)."""
        d = torch.tensor(self.nlls, dtype=torch.float64) - torch.tensor(base.nlls, dtype=torch.float64)
        return float(d.mean()), float(d.std() / math.sqrt(len(d))) if len(d) > 1 else 0.0

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)

    def to_dict(self) -> dict:
        return {"label": self.label, "tokens": self.tokens, "nll": self.nll, "stderr": self.stderr,
                "perplexity": self.ppl, "seconds": self.seconds}


def windows(ids: list[int], context: int) -> list[list[int]]:
    """``ids`` cut into windows of ``context`` tokens, a last shorter one kept when it holds two."""
    if context < 2:
        raise ParameterError(f"--context must be at least 2 tokens (one scored), got {context}")
    out = [ids[i:i + context] for i in range(0, len(ids), context)]
    out = [w for w in out if len(w) >= 2]
    if not out:
        raise ParameterError(f"the text holds {len(ids)} token(s): perplexity needs at least 2")
    return out


def ours(model, tokenizer, chunks: list[list[int]]) -> list[float]:
    """Each scored token's negative log-likelihood under ``model`` (a native or transformers
    target), window by window: the engine's prefill with its prompt scored, nothing generated."""
    engine = Engine(model, tokenizer, None, SpecConfig(method="none", cost_rule=False))
    gen = GenerationConfig(max_new_tokens=0, prompt_logprobs=0)
    nll = []
    for chunk in chunks:
        for _ in engine.stream(chunk, gen=gen):
            pass
        nll += [-lp for lp, _ in engine.prompt_scores]
    return nll


def llama_cpp(forward, chunks: list[list[int]]) -> list[float]:
    """The same under llama.cpp (``bench.llama_cpp.LlamaCppForward`` over the GGUF): every row's
    logits of a window's one evaluation, log-softmaxed here as ours are."""
    nll = []
    for chunk in chunks:
        forward.reset()
        forward.forward(torch.tensor(chunk))
        logits = torch.from_numpy(forward.llm.scores[:len(chunk) - 1].copy()).float()  # [n-1, V]
        lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(chunk[1:])[:, None])[:, 0]
        nll += (-lp).tolist()
    return nll


def timed(label: str, score, chunks: list[list[int]]) -> Perplexity:
    """``score(chunks)`` -> NLLs, as a Perplexity with its wall time."""
    t = time.perf_counter()
    nll = score(chunks)
    seconds = time.perf_counter() - t
    x = torch.tensor(nll, dtype=torch.float64)
    stderr = float(x.std() / math.sqrt(len(nll))) if len(nll) > 1 else 0.0
    return Perplexity(label, len(nll), float(x.mean()), stderr, seconds, tuple(nll))
