"""Self-speculation: the target with some of its layers skipped drafts for the target (Draft &
Verify, SWIFT). No second model: the draft shares the target's weights, tokenizer, embedding and
output head and the KV cache of the context (models.llama.LlamaModel.with_layers).

Which layers: measured once per model (and kept in the cache). Over CALIBRATION (encoded with
the target's tokenizer), each layer is left out alone and the target's greedy choice at every
position compared with the full model's (teacher-forced); the layers whose absence changes the
fewest choices are skipped. The copy then drafts as a draft model does (drafters.draft_model:
chains cut by the cost rule and by whether its steps pay at all; sampling exact).
"""
from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path

import torch

from ..cache import cache_root, console
from ..errors import ParameterError
from ..models.convert import MARKER
from .base import DrafterContext, register
from .draft_model import DraftModel

# layers skipped by default. Measured on the default target (28 layers, CALIBRATION): skipping
# 4 / 8 / 14 kept 76% / 61% / 34% of its greedy choices (BENCHMARKS.md)
SKIP_SHARE = 0.3
# What the layer choice is measured on: prose, a chat answer and code, as the target is asked for
CALIBRATION = """Speculative decoding makes a large language model answer faster without changing
what it writes. A cheap model guesses the next few tokens, and the large model checks all of the
guesses in one pass; every guess it agrees with is a token won for free.

User: How do I read a CSV file in Python and sum one of its columns?
Assistant: You can use the csv module from the standard library. Open the file, create a reader,
skip the header row, and add up the values of the column you need:

```python
import csv

def column_sum(path, column):
    total = 0.0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            total += float(row[column])
    return total
```

If the file is large, this reads it one row at a time, so memory use stays small. For more
complex work, such as grouping or joining tables, the pandas library is a good choice.
"""

# target -> each layer's harm (layer_harm), measured once per process and kept on disk
_HARM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.inference_mode()
def greedy_choices(model, ids: torch.Tensor) -> torch.Tensor:
    """``model``'s greedy choice [T] at every position of ``ids`` (teacher-forced), its cache left empty."""
    model.reset()
    got = model.forward(ids).logits.argmax(-1)
    model.reset()
    return got


def agreement(model, ids: torch.Tensor, want: torch.Tensor) -> float:
    """Share of positions where ``model``'s greedy choice over ``ids`` is ``want``'s."""
    return float((greedy_choices(model, ids) == want).float().mean())


def layer_harm(target, ids: torch.Tensor, want: torch.Tensor | None = None) -> list[float]:
    """Per layer, the share of greedy choices over ``ids`` that change when it alone is skipped
    (one forward over ids per layer: ~1.5 min for the default target on 2 cores); ``want``: the
    full model's choices, when already known."""
    n = len(target.layers)
    want = greedy_choices(target, ids) if want is None else want
    return [1.0 - agreement(target.with_layers([j for j in range(n) if j != i]), ids, want) for i in range(n)]


def kept_layers(harm: list[float], skip: int) -> list[int]:
    """The layers left when the ``skip`` least harmful are skipped, ascending."""
    n = len(harm)
    check_skip(n, skip)
    skipped = set(sorted(range(n), key=lambda i: (harm[i], i))[:skip])
    return [i for i in range(n) if i not in skipped]


def check_skip(n: int, skip: int) -> None:
    """A one-line ParameterError unless 0 < skip < n layers."""
    if not 0 < skip < n:
        raise ParameterError(f"skip-layers must be between 1 and {n - 1} for this target ({n} layers), got {skip}")


def choose_layers(target, ids: torch.Tensor, skip: int) -> tuple[list[int], float]:
    """(the layers to keep, the kept copy's agreement with the target over ``ids``)."""
    want = greedy_choices(target, ids)
    keep = kept_layers(layer_harm(target, ids, want), skip)
    return keep, agreement(target.with_layers(keep), ids, want)


def _stored_harm(target, target_dir: Path | None) -> list[float]:
    """layer_harm over CALIBRATION, read from the cache when measured before for these weight
    files and weight format, else measured and stored there (best effort; not without a model
    directory to name it by)."""
    if target in _HARM:
        return _HARM[target]
    ids = calibration_ids(target_dir)[:target.max_length]  # a short-context model: what fits
    path = _harm_path(target, target_dir) if target_dir is not None else None
    harm = None
    if path is not None and path.is_file():
        try:
            harm = json.loads(path.read_text())["harm"]
        except (OSError, ValueError, KeyError, TypeError):
            harm = None  # unreadable: measured again below
    if not isinstance(harm, list) or len(harm) != len(target.layers):
        with console().status("self-draft: measuring which layers to skip (once per model)"):
            harm = layer_harm(target, ids)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"model": str(target_dir), "harm": harm}) + "\n")
                tmp.replace(path)
            except OSError:
                pass  # a read-only cache: measured again next time
    _HARM[target] = harm
    return harm


def _harm_path(target, target_dir: Path) -> Path:
    """Where the measurement of these weights is kept: named by the model directory, its weight
    files' sizes and times, the weight format and CALIBRATION."""
    d = Path(target_dir).resolve()
    # with the conversion's marker: a copy without weights (the gguf format's) is told apart by its GGUF's
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in [*d.glob("*.safetensors"), *d.glob(MARKER)])
    key = json.dumps([str(d), files, getattr(target, "weight_format", ""), CALIBRATION])
    return cache_root() / "self-draft" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def calibration_ids(target_dir: Path | None) -> torch.Tensor:
    """CALIBRATION in the target's tokens [T] (its tokenizer.json)."""
    from tokenizers import Tokenizer

    path = Path(target_dir or "") / "tokenizer.json"
    try:
        ids = Tokenizer.from_file(str(path)).encode(CALIBRATION).ids
    except Exception as e:  # missing or unreadable: a user-facing one-liner
        raise ParameterError(f"self-draft measures which layers to skip with the target's tokenizer, "
                             f"but {path} cannot be read ({type(e).__name__})") from None
    return torch.tensor(ids, dtype=torch.int64)


class SelfDraft(DraftModel):
    """The draft model's loop on a copy of the target that reads the target's own KV cache.

    The engine keeps the committed context minus its newest token in the target's cache. The
    copy attends to those rows (the full model's keys and values, for its kept layers) and
    writes its own rows past them: the newest token, then its guesses, rows the target's
    verification overwrites. So it never catches up on a prompt, whatever its length."""

    name = "self-draft"

    def __init__(self, target, keep: list[int], *, min_confidence: float = 0.0):
        super().__init__(target.with_layers(keep, share_cache=True), min_confidence=min_confidence)
        self.target = target

    def _sync(self, context: list[int]) -> torch.Tensor:
        self.model.length = self.target.length  # == len(context) - 1, the engine's cache invariant
        logits = self._forward(context[-1:])
        self.seq = list(context)
        return logits


@register("self-draft")
def _build(ctx: DrafterContext) -> SelfDraft:
    target = ctx.target
    if not hasattr(target, "with_layers"):
        raise ParameterError("self-draft runs the target's own layers: it needs the native runtime (--runtime native)")
    skip = ctx.spec.skip_layers if ctx.spec.skip_layers is not None else max(1, int(len(target.layers) * SKIP_SHARE))
    check_skip(len(target.layers), skip)  # before a measurement of minutes
    keep = kept_layers(_stored_harm(target, ctx.target_dir), skip)
    return SelfDraft(target, keep, min_confidence=ctx.spec.min_confidence)
