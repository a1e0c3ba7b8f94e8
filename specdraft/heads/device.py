"""Where a drafter trains: the CPU, or a CUDA GPU when the machine has one.

Training moves only the drafter, its optimizer and each batch to the device: a FeatureSet
(hundreds of MB to GBs of fp16 features) stays in host memory, each batch is gathered there and
copied over, and the trained drafter comes back to the CPU, where it drafts. On the CPU the
steps are the ones they always were (the same draws, the same order), so a CPU run repeats the
shipped drafters' training; a GPU run takes the same steps in another float rounding.
Recording features stays on the CPU: it runs the target through the native runtime.
"""
from __future__ import annotations

import torch

from ..errors import ParameterError

CHOICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")


def training_device(name: str = "auto") -> torch.device:
    """"auto": the first CUDA GPU when torch sees one, else the CPU; "cpu"; "cuda" or "cuda:N".
    ParameterError for another name or a GPU this machine does not have."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ParameterError(f"--device {name}: give one of {', '.join(CHOICES)} (or cuda:N)") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ParameterError(f"--device {name}: drafters train on the CPU or a CUDA GPU; give cpu, cuda or auto")
    if not torch.cuda.is_available():
        raise ParameterError(f"--device {name}: torch sees no CUDA GPU on this machine; give --device cpu (or auto)")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ParameterError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return device


def products_in(device: torch.device, precision: str = "fp32"):
    """The context a training step's loss is computed in: "fp32", its products in float32 as they
    always were (a CPU run repeats the shipped drafters' training); "bf16", in bfloat16 under
    torch.autocast (weights, gradients, optimizer and the loss's softmax stay float32). On an AMX
    Xeon bfloat16 products run ~6x float32's, an EAGLE layer's steps ~2.9x and a whole small run
    1.9x, with the same held-out agreement (BENCHMARKS.md, 2026-11-28). ParameterError for another name."""
    if precision not in PRECISIONS:
        raise ParameterError(f"--precision {precision}: give one of {', '.join(PRECISIONS)}")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def to_device(device: torch.device, *tensors: torch.Tensor | None) -> tuple:
    """``tensors`` on ``device`` (None stays None; on the CPU, the tensors themselves)."""
    if device.type == "cpu":
        return tensors
    return tuple(None if t is None else t.to(device) for t in tensors)
