"""Cost of one target forward over k new tokens: the economics of verification.

Speculative decoding pays when checking k guesses costs little more than decoding one token.
This measures exactly that on the current machine: the median time of a forward over k new
tokens on top of a KV cache of ``context`` tokens. Several models (one model in several weight
formats) and all block sizes are timed round robin, so a slow phase of a shared machine hits them
alike and their ratios hold.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

DEFAULT_BLOCKS = (1, 2, 4, 8, 16, 32)


@contextmanager
def watched_forwards(model, watch: Callable) -> Iterator[None]:
    """Inside, ``model.forward(*args, **kwargs)`` returns ``watch(forward, *args, **kwargs)``, where
    ``forward`` runs the model's own (scripts timing or counting the target's forwards). Set on
    the class for this model alone: an attribute set on the instance would be copied into the
    views made from it (LlamaModel.with_layers: self-draft's copy would run the target's whole
    forward over the target's cache)."""
    cls = type(model)
    own = cls.forward

    def forward(self, *args, **kwargs):
        if self is not model:
            return own(self, *args, **kwargs)
        return watch(lambda *a, **kw: own(self, *a, **kw), *args, **kwargs)

    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = own


def prefilled(models: dict[str, object], blocks, context: int) -> dict[int, torch.Tensor]:
    """Every model's cache filled with the same ``context`` random tokens; the same random new
    tokens for each block size k: {k: ids [k]}."""
    gen = torch.Generator().manual_seed(0)
    vocab = min(min(m.vocab_size for m in models.values()), 32000)
    prefix = torch.randint(0, vocab, (context,), generator=gen)
    for m in models.values():
        m.reset()
        m.forward(prefix, last_only=True)
    return {k: torch.randint(0, vocab, (k,), generator=gen) for k in blocks}


def forward_costs(models: dict[str, object], blocks=DEFAULT_BLOCKS, context: int = 300, repeats: int = 5,
                  warmup: int = 2) -> dict[str, dict[str, list]]:
    """{label: {"tokens": [k...], "seconds": [median forward time...]}} for CausalLMs by label,
    every model fed the same random tokens."""
    ids = prefilled(models, blocks, context)
    times: dict[tuple[str, int], list[float]] = {(label, k): [] for label in models for k in blocks}
    for r in range(warmup + repeats):  # round robin over blocks too: a phase of the machine hits every ratio alike
        for k in blocks:
            for label, m in models.items():
                m.rollback(context)
                t0 = time.perf_counter()
                m.forward(ids[k])
                if r >= warmup:
                    times[label, k].append(time.perf_counter() - t0)
    out = {label: {"tokens": list(blocks), "seconds": [statistics.median(times[label, k]) for k in blocks]}
           for label in models}
    for m in models.values():
        m.rollback(context)
    return out


REST = "output head + rest"  # forward_steps: a forward's time outside the native layers


def forward_steps(models: dict[str, object], blocks=DEFAULT_BLOCKS, context: int = 300, repeats: int = 5,
                  warmup: int = 2) -> dict[str, dict[str, list]]:
    """Where a forward goes: {label: {"tokens": [k...], "seconds": [median whole forward...],
    "steps": {step: [median seconds in it...]}}} for models whose layers run natively (step_seconds
    not None): each kind of the native decoder's steps summed over its layers, and REST, the
    forward less those (embedding, final norm, output head, Python). Timed as forward_costs does
    (round robin over blocks and models); each entry is the median over the repeats on its own."""
    ids = prefilled(models, blocks, context)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(label, k): [] for label in models for k in blocks}
    for r in range(warmup + repeats):
        for k in blocks:
            for label, m in models.items():
                m.rollback(context)
                m.clear_step_seconds()
                t0 = time.perf_counter()
                m.forward(ids[k])
                total = time.perf_counter() - t0
                steps = m.step_seconds()
                if r >= warmup:
                    runs[label, k].append({**steps, REST: total - sum(steps.values()), "forward": total})
    out = {}
    for label in models:
        names = list(runs[label, blocks[0]][0])
        med = {n: [statistics.median(run[n] for run in runs[label, k]) for k in blocks] for n in names}
        out[label] = {"tokens": list(blocks), "seconds": med.pop("forward"), "steps": med}
    for m in models.values():
        m.rollback(context)
    return out


def forward_cost(model, blocks=DEFAULT_BLOCKS, context: int = 300, repeats: int = 5,
                 warmup: int = 2) -> dict[str, list]:
    """{"tokens": [k...], "seconds": [median forward time...]} for one CausalLM ``model``."""
    return forward_costs({"model": model}, blocks, context, repeats, warmup)["model"]


class OnKernelPath:
    """A GGUF-kernel model that runs every forward on one ISA path of the kernels (``calibrate
    --paths``): several of these share one model's weights and KV cache, so forward_costs times the
    paths round robin on the same forward, and same_logits compares their outputs."""

    def __init__(self, model, ops, path: str):
        self.model, self.ops, self.path = model, ops, path

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def reset(self) -> None:
        self.model.reset()

    def rollback(self, length: int) -> None:
        self.model.rollback(length)

    def forward(self, ids: torch.Tensor, **kw):
        self.ops.set_kernel_path(self.path)
        return self.model.forward(ids, **kw)

    def step_seconds(self) -> dict[str, float] | None:
        return self.model.step_seconds()

    def clear_step_seconds(self) -> None:
        self.model.clear_step_seconds()


def same_logits(models: dict[str, object], context: int, tokens: int) -> dict[str, float]:
    """{label: max |logit - the first label's|} over one forward of ``tokens`` new random tokens on
    a cache of ``context`` (0.0 = bit for bit, what the kernel paths promise); ``models`` share one
    cache (OnKernelPath), prefilled to at least ``context``."""
    gen = torch.Generator().manual_seed(1)
    first = next(iter(models.values()))
    ids = torch.randint(0, min(first.vocab_size, 32000), (tokens,), generator=gen)
    logits = {}
    for label, m in models.items():
        m.rollback(context)
        logits[label] = m.forward(ids).logits.float()
    m.rollback(context)
    ref = next(iter(logits.values()))
    return {label: 0.0 if torch.equal(x, ref) else float((x - ref).abs().max()) for label, x in logits.items()}
