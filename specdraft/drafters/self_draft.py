"""Self-speculation: the target with some of its layers skipped drafts for the target (Draft &
Verify, SWIFT). No second model: the draft shares the target's weights, tokenizer, embedding and
output head (models.llama.LlamaModel.with_layers), with a KV cache of its own.

Which layers: measured once per target and number skipped. Over CALIBRATION (encoded with the
target's tokenizer), each layer is left out alone and the target's greedy choice at every
position compared with the full model's (teacher-forced); the layers whose absence changes the
fewest choices are skipped. The copy then drafts as a draft model does (drafters.draft_model:
chains cut by the cost rule and by whether its steps pay at all; sampling exact).
"""
from __future__ import annotations

import weakref
from pathlib import Path

import torch

from ..errors import ParameterError
from .base import DrafterContext, register
from .draft_model import DraftModel

SKIP_SHARE = 0.5  # layers skipped by default: half
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

# target -> {layers skipped: (layers kept, the copy's agreement)}: measured once per process
_CHOSEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.inference_mode()
def _agreement(model, ids: torch.Tensor, want: torch.Tensor) -> float:
    """Share of positions where ``model``'s greedy choice over ``ids`` (teacher-forced) is ``want``'s."""
    model.reset()
    got = model.forward(ids).logits.argmax(-1)
    model.reset()
    return float((got == want).float().mean())


def choose_layers(target, ids: torch.Tensor, skip: int) -> tuple[list[int], float]:
    """(the layers to keep, ascending; the kept copy's agreement with the target over ``ids``):
    the ``skip`` layers whose absence alone changes the fewest greedy choices are left out."""
    n = len(target.layers)
    if not 0 < skip < n:
        raise ParameterError(f"skip-layers must be between 1 and {n - 1} for this target ({n} layers), got {skip}")
    target.reset()
    with torch.inference_mode():
        want = target.forward(ids).logits.argmax(-1)  # [T] the full model's choices
    harm = [1.0 - _agreement(target.with_layers([j for j in range(n) if j != i]), ids, want) for i in range(n)]
    skipped = set(sorted(range(n), key=lambda i: (harm[i], i))[:skip])
    keep = [i for i in range(n) if i not in skipped]
    return keep, _agreement(target.with_layers(keep), ids, want)


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
    name = "self-draft"


@register("self-draft")
def _build(ctx: DrafterContext) -> SelfDraft:
    target = ctx.target
    if not hasattr(target, "with_layers"):
        raise ParameterError("self-draft runs the target's own layers: it needs the native runtime (--runtime native)")
    skip = ctx.spec.skip_layers if ctx.spec.skip_layers is not None else int(len(target.layers) * SKIP_SHARE)
    chosen = _CHOSEN.setdefault(target, {})
    if skip not in chosen:
        chosen[skip] = choose_layers(target, calibration_ids(ctx.target_dir), skip)
    keep, _ = chosen[skip]
    return SelfDraft(target.with_layers(keep), min_confidence=ctx.spec.min_confidence, window=ctx.spec.window)
