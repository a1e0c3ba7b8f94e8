"""Peers: transformers' own generation, run on the same prompts as specdraft's methods.

* ``hf-generate``: ``model.generate()`` greedy, the plain decoding most users start from;
* ``hf-assisted``: ``generate(assistant_model=draft)``, transformers' assisted generation with
  the same draft model specdraft's ``draft-model`` uses;
* ``hf-prompt-lookup``: ``generate(prompt_lookup_num_tokens=10)``, transformers' prompt lookup.

Each peer loads ``AutoModelForCausalLM`` from the same converted model directory our runtime
reads, with its own dtype (which dtype is fastest differs per method on a CPU). Models load
lazily and are freed as soon as no upcoming method needs them, to keep peak memory down.

Target forwards are counted with a forward pre-hook on the target module: every call counts,
the prefill included, because transformers' assisted generation folds the prefill into its
first verification and so has no separate prefill forward to leave out.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelFileError
from ..pipeline import DTYPES, resolve_dtype
from .records import Outcome, stop_ids, strip_eos

PROMPT_LOOKUP_TOKENS = 10  # tokens per prompt-lookup draft, transformers' documented example value


@dataclass(frozen=True)
class PeerSpec:
    name: str
    dtype_option: str  # the argparse dest that holds this peer's dtype
    needs_assistant: bool
    generate_kwargs: tuple[tuple[str, object], ...] = ()


PEERS: dict[str, PeerSpec] = {
    p.name: p
    for p in (
        PeerSpec("hf-generate", "hf_dtype_plain", False),
        PeerSpec("hf-assisted", "hf_dtype_assisted", True),
        PeerSpec("hf-prompt-lookup", "hf_dtype_prompt_lookup", False,
                 (("prompt_lookup_num_tokens", PROMPT_LOOKUP_TOKENS),)),
    )
}


def clean_generation_config(eos_ids: list[int]):
    """A generation config with nothing but EOS/padding set.

    A checkpoint's generation_config.json may carry a repetition penalty or sampling defaults;
    transformers fills every unset value from it, so the peer would not decode what our greedy
    engine decodes. Starting from a blank config leaves only transformers' global defaults.
    """
    from transformers import GenerationConfig  # here, not at import: the CLI's start does without its models

    return GenerationConfig(eos_token_id=list(eos_ids), pad_token_id=eos_ids[0])


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' tqdm bars and info logs, which would tear through our progress bar."""
    from transformers.utils import logging as tlog

    was_enabled = tlog.is_progress_bar_enabled()
    verbosity = tlog.get_verbosity()
    tlog.disable_progress_bar()
    tlog.set_verbosity_error()
    try:
        yield
    finally:
        tlog.set_verbosity(verbosity)
        if was_enabled:
            tlog.enable_progress_bar()


ModelKey = tuple[str, str, str]  # (role, path, dtype)


class PeerModels:
    """Transformers models keyed by (role, path, dtype), loaded on first use and freed on request.

    The role keeps target and assistant apart even when they are the same checkpoint: sharing one
    module would make the forward counter count the assistant's calls as target forwards.
    """

    def __init__(self, eos_ids: list[int]):
        self.eos_ids = eos_ids
        self.loaded: dict[ModelKey, object] = {}

    def get(self, key: ModelKey):
        if key not in self.loaded:
            self.loaded[key] = self._load(Path(key[1]), key[2])
        return self.loaded[key]

    def _load(self, path: Path, dtype: str):
        from transformers import AutoModelForCausalLM

        try:
            with quiet_transformers():
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[resolve_dtype(dtype)])
        except Exception as e:  # user-facing: the directory is not a loadable model, whatever transformers raised
            raise ModelFileError(f"transformers cannot load {path} ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        model.eval()
        model.generation_config = clean_generation_config(self.eos_ids)
        return model

    def keep_only(self, keys: set[ModelKey]) -> None:
        """Free every model not in ``keys`` (del + gc: the weights are the bulk of our memory)."""
        for key in [k for k in self.loaded if k not in keys]:
            del self.loaded[key]
        gc.collect()


def target_key(path: Path, dtype: str) -> ModelKey:
    return ("target", str(path), dtype)


def assistant_key(path: Path, dtype: str) -> ModelKey:
    return ("assistant", str(path), dtype)


class ForwardCounter:
    """Counts calls of a module's forward through a pre-hook; detach with ``remove()``."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self._handle = module.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1

    def remove(self) -> None:
        self._handle.remove()


class PeerRunner:
    """Runs one peer method on token ids; the same call shape as the engine runner."""

    def __init__(self, spec: PeerSpec, model, assistant, eos_ids: list[int], ignore_eos: bool = False):
        self.spec = spec
        self.model = model
        self.stop_ids = stop_ids(eos_ids, ignore_eos)
        self.kwargs = dict(do_sample=False, **dict(spec.generate_kwargs))
        if assistant is not None:
            self.kwargs["assistant_model"] = assistant
        if ignore_eos:  # no EOS to stop at (min_new_tokens would mask EOS out and change the greedy tokens)
            self.kwargs["eos_token_id"] = None

    @torch.inference_mode()
    def __call__(self, ids: list[int], max_new_tokens: int) -> Outcome:
        input_ids = torch.tensor([ids], dtype=torch.int64)
        counter = ForwardCounter(self.model)
        try:
            with quiet_transformers():
                out = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                          max_new_tokens=max_new_tokens, **self.kwargs)
        finally:
            counter.remove()
        produced = out[0, len(ids):].tolist()
        tokens = strip_eos(produced, self.stop_ids)
        # Tokens per target forward, counting the prefill forward and the EOS it may have produced,
        # since both are real work here; plain greedy comes out at exactly 1.0.
        return Outcome(tokens, counter.calls, len(produced), None, None)
