"""Small helpers shared by the model-file modules (join, convert, packaged, gguf_weights): the mode
a published file gets, one-line error text, the progress shown while copying or converting, a
safetensors file written into the cache (a full disk a one-line error), and a safetensors file's
header and tensors read with plain reads or mapped one at a time."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..cache import console
from ..errors import ModelFileError


def umask() -> int:
    """The process umask (reading it means setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: an exception as one line of a user-facing error."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextmanager
def byte_progress(total: int, label: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A rich byte progress bar on stderr; yields ``advance(n)``. A no-op when disabled."""
    if not enabled:
        yield lambda n: None
        return
    # imported here: rich.progress costs ~150 ms to import, and most starts show no bar
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console(), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def step(label: str, enabled: bool) -> Iterator[None]:
    """A rich spinner for a step of unknown length, then a line with its duration."""
    if not enabled:
        yield
        return
    out = console()
    t0 = time.perf_counter()
    with out.status(f"{label} ..."):
        yield
    out.print(f"[green]done[/] {label} ({time.perf_counter() - t0:.1f} s)")


def save_safetensors(tensors: dict, path: Path, metadata: dict[str, str]) -> None:
    """safetensors' save_file into the model cache; a write that fails (a full disk: safetensors
    raises its own error type, not OSError) removes what it left and is a one-line ModelFileError."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except (OSError, SafetensorError) as e:
        Path(path).unlink(missing_ok=True)
        raise ModelFileError(f"cannot write {Path(path).name} in {Path(path).parent}: {first_line(e)}; "
                             f"fix: free disk space or point SPECDRAFT_CACHE elsewhere") from None


def safetensors_header(path: Path) -> tuple[int, dict]:
    """A safetensors file's header: its byte length and the parsed JSON."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n < 1 << 26:
            raise ValueError(f"{path.name}: no safetensors header")
        return n, json.loads(f.read(n))


def read_safetensors(path: Path) -> Iterator[tuple[str, object]]:
    """(name, tensor) of a safetensors file one at a time, read into memory of their own (no map:
    a whole mapped file's pages would stay resident beside what the caller holds)."""
    import torch

    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64,
              "I32": torch.int32, "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool}
    n, header = safetensors_header(path)
    with open(path, "rb") as f:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            f.seek(8 + n + start)
            data = bytearray(f.read(end - start))
            tensor = torch.frombuffer(data, dtype=dtypes[info["dtype"]]) if data else torch.empty(0, dtype=dtypes[info["dtype"]])
            yield name, tensor.reshape(info["shape"])


def map_safetensor(path: Path, name: str):
    """The tensor ``name`` of a safetensors file as a private, copy-on-write map of its own bytes
    (BF16, F16, F32), or None (another dtype, or no such tensor). Its pages are read as they are
    touched and only those stay resident: for a table that is only gathered from (an embedding of
    151936 x 1536, 0.47 GB in bf16, of which a generation touches a few rows) it costs no copy
    at load, where a map of the whole file would keep every page read through it."""
    import numpy as np
    import torch

    kinds = {"BF16": (np.uint16, torch.bfloat16), "F16": (np.float16, None), "F32": (np.float32, None)}
    n, header = safetensors_header(path)
    info = header.get(name)
    if not isinstance(info, dict) or info.get("dtype") not in kinds:
        return None
    (start, end), shape = info["data_offsets"], info["shape"]
    stored, view = kinds[info["dtype"]]
    count = (end - start) // np.dtype(stored).itemsize
    if count == 0 or count != int(np.prod(shape)):
        return None
    array = np.memmap(path, dtype=stored, mode="c", offset=8 + n + start, shape=(count,))
    tensor = torch.from_numpy(array)
    return (tensor.view(view) if view is not None else tensor).reshape(shape)
