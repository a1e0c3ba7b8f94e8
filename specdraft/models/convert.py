"""Converting a GGUF file into a bfloat16 Hugging Face model directory, once, safely.

The copy is written into a hidden temporary directory, reloaded and compared tensor by tensor
with the source, and published by a rename only after its marker file (:data:`MARKER`, written
last) is in place: a directory without a valid marker is an unfinished conversion and is redone.
Conversion dequantizes to bfloat16 (about 2 bytes per parameter of disk), which every runtime and
weight format can read. The gguf weight format reads its numbers from the GGUF file itself
(:mod:`specdraft.models.gguf_weights`): for it a conversion without weights (``weights=False``:
the config, generation config and tokenizer alone, its marker saying so) is enough, and takes a
fraction of the time and memory.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ModelFileError
from .files import first_line, read_safetensors, safetensors_header, save_safetensors, step, umask
from .join import file_sha256

MARKER = "specdraft-source.json"  # written last: a model dir without it is incomplete
MARKER_FORMAT = 2  # bump to force reconversion of every cached model after a format change
# Older formats still good for models of other types: 1 lacked a Llama file's rope_freq_factors
_STILL_GOOD = {1: ("llama", "mistral")}  # format -> model types it must be redone for
GGUF_MAGIC = b"GGUF"


GGUF_ONLY = "gguf"  # a marker's "weights" where the copy holds none: they are read from the GGUF


def read_marker(model_dir: Path) -> dict | None:
    """The conversion marker of ``model_dir``, or None when the directory is incomplete.

    Complete means: the marker (written last) parses, and the files it vouches for are present.
    """
    model_dir = Path(model_dir)
    try:
        marker = json.loads((model_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict):
        return None
    files = ("config.json",) if marker.get("weights") == GGUF_ONLY else ("config.json", "model.safetensors")
    if not all((model_dir / f).is_file() for f in files):
        return None
    if marker.get("format") != MARKER_FORMAT:
        redo = _STILL_GOOD.get(marker.get("format"))
        try:
            if redo is None or json.loads((model_dir / "config.json").read_text()).get("model_type") in redo:
                return None
        except (OSError, ValueError):
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
        raise ModelFileError(f"cannot read GGUF file {path}: {first_line(e)}; fix: {fix}") from None
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


def _config_dict(model, rope_freq_factors: list[float] | None = None) -> dict:
    """config.json contents for the converted copy.

    ``quantization_config`` must go: left in, transformers would treat the bf16 safetensors as
    packed GGUF weights. ``architectures`` is empty after a GGUF load; filling it in keeps tools
    that dispatch on it (and AutoModelForCausalLM) happy. ``rope_freq_factors`` (see
    rope_freq_factors) is kept for the native runtime's RoPE tables.
    """
    cfg = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "name_or_path"):
        cfg.pop(key, None)
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = "bfloat16"
    if rope_freq_factors is not None:
        cfg["rope_freq_factors"] = rope_freq_factors
    return cfg


def rope_freq_factors(gguf_path: Path) -> list[float] | None:
    """The per-frequency RoPE divisors a GGUF carries as its ``rope_freqs.weight`` tensor ([head_dim
    / 2] float32; llama.cpp's converter writes Llama 3.1+'s "llama3" scaling that way, and llama.cpp
    divides each rotation frequency by its factor), or None. transformers' GGUF loader drops the
    tensor, so without it a converted Llama 3.1 / 3.2 would rotate as an unscaled model does."""
    import gguf
    import numpy as np

    try:
        tensor = next((t for t in gguf.GGUFReader(str(gguf_path)).tensors if t.name == "rope_freqs.weight"), None)
    except Exception:  # an unreadable file fails its load with the reason, elsewhere
        return None
    if tensor is None or tensor.tensor_type.name != "F32":
        return None
    return [float(v) for v in np.asarray(tensor.data, dtype=np.float32).reshape(-1)]


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' own tqdm bars (they would fight our rich display) and info logs.

    The legacy GGUF loader calls ``tqdm`` without consulting transformers' progress-bar switch,
    so its module-level name is swapped for a disabled bar while we run (restored afterwards).
    """
    import functools

    # imported here, like every transformers / torch import below: heavy, and only a conversion needs them
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


@contextmanager
def _one_reader() -> Iterator[None]:
    """One gguf.GGUFReader per file while inside: transformers parses the GGUF's metadata anew for
    the config, the weights and the tokenizer (``load_gguf_checkpoint`` three times), ~12 s each
    for the default target (its 151,936 tokens and merges read as one small array each; Zen 4
    EPYC), and rope_freq_factors a fourth time. The reader only reads its memory map.

    That reader slices its map as a plain array: every element of those arrays is a slice of it,
    and a slice of an ``np.memmap`` (a subclass) costs ~1 us more (its ``__array_finalize__``):
    6.8 s -> 2.2 s a read of the default target (Zen 4 EPYC), the same fields and tensors."""
    import gguf
    import numpy as np

    real = gguf.GGUFReader

    class PlainReader(real):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):  # GGUFReader.__init__ sets it to its np.memmap
            self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    readers: dict[tuple[str, str], object] = {}

    def shared(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainReader(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = real


def _load_gguf(gguf_path: Path, progress: bool, fix: str, weights: bool = True):
    """(model, tokenizer) dequantized from the GGUF by transformers; a one-line error if it cannot.
    ``weights=False``: the model built from the GGUF's config on the meta device (its class, config
    and generation config, no numbers): seconds instead of ~50 for the default target."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src_dir, src_name = str(gguf_path.parent), gguf_path.name
    try:
        with step(f"loading GGUF {src_name}" if weights else f"reading GGUF {src_name}'s config and tokenizer", progress):
            if weights:
                model = AutoModelForCausalLM.from_pretrained(
                    src_dir, gguf_file=src_name, dtype=torch.bfloat16,
                    quantization_config=GgufConfig(dequantize=True),
                )
            else:
                config = AutoConfig.from_pretrained(src_dir, gguf_file=src_name)
                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
            tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=src_name)
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:  # corrupt metadata, truncated tensors, unsupported architecture ...
        raise ModelFileError(f"cannot load GGUF {gguf_path}: {first_line(e)}; fix: {fix}") from None
    model.eval()
    return model, tokenizer


def _save_copy(model, tokenizer, tmp: Path, out_dir: Path, gguf_name: str, progress: bool,
               rope_factors: list[float] | None = None) -> None:
    """Write the safetensors weights (not for a model on the meta device: no numbers), config,
    generation config and tokenizer into ``tmp``."""
    state = _state_dict_for_saving(model) if model.device.type != "meta" else None
    bad = [n for n, t in (state or {}).items() if not t.is_floating_point()]
    if bad:  # packed blocks slipped through: the copy would be garbage
        raise ModelFileError(f"GGUF {gguf_name} was not fully dequantized ({bad[0]} is {state[bad[0]].dtype}); "
                             f"fix: upgrade transformers and gguf")
    try:
        with step("saving safetensors" if state is not None else "saving the config and tokenizer", progress):
            if state is not None:
                save_safetensors(state, tmp / "model.safetensors", {"format": "pt"})  # a full disk: ModelFileError
            (tmp / "config.json").write_text(json.dumps(_config_dict(model, rope_factors), indent=2, sort_keys=True) + "\n")
            model.generation_config.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except OSError as e:
        raise ModelFileError(f"cannot write the converted model to {out_dir.parent}: {first_line(e)}; "
                             f"fix: free disk space or point SPECDRAFT_CACHE elsewhere") from None


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True, sha256: str | None = None,
                 fix: str | None = None, weights: bool = True) -> Path:
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
    marker; it is computed here when not given. ``weights=False``: the config, generation config
    and tokenizer alone (for the gguf weight format, which reads every number from the GGUF), the
    marker's "weights" saying so.
    """
    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    fix = fix or f"re-download or re-create {gguf_path.name}"
    _check_gguf_header(gguf_path, fix)
    if sha256 is None:
        sha256 = file_sha256(gguf_path, progress)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        with _quiet_transformers():
            with _one_reader():  # let go before the copy is written: its map of the file is ~1 GB resident
                model, tokenizer = _load_gguf(gguf_path, progress, fix, weights)
                factors = rope_freq_factors(gguf_path) if model.config.model_type in ("llama", "mistral") else None
            _save_copy(model, tokenizer, tmp, out_dir, gguf_path.name, progress, factors)
            with step("verifying the converted copy", progress):
                _verify_copy(tmp, model, tokenizer)
            del model
        marker = {"format": MARKER_FORMAT, "source": gguf_path.name, "sha256": sha256,
                  "size": gguf_path.stat().st_size, **({} if weights else {"weights": GGUF_ONLY})}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _verify_copy(model_dir: Path, model, tokenizer) -> None:
    """Reread the converted dir as a consumer would and compare it with the source model, one
    tensor at a time (a second whole model beside the first was the conversion's peak memory:
    7.4 GB resident for the default target, against 5.5 GB for the load itself).

    Catches the classic conversion bugs: a dropped or untied ``lm_head``, a config that makes
    transformers expect packed weights, a tokenizer that encodes differently after saving.
    """
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    if getattr(config, "quantization_config", None) is not None:
        raise ModelFileError("converted config still asks for packed GGUF weights; this is a specdraft bug")
    if model.device.type != "meta":
        _verify_tensors(model_dir, model, config)
    text = "def is_prime(n):\n    return n > 1  # ünïcödé <|im_start|>"
    if AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"] != tokenizer(text)["input_ids"]:
        raise ModelFileError("converted tokenizer encodes differently from the GGUF's; this is a specdraft bug")


def _verify_tensors(model_dir: Path, model, config) -> None:
    import torch

    want = _state_dict_for_saving(model)  # what the copy must hold: a tied head under the embeddings' name only
    names = set(safetensors_header(model_dir / "model.safetensors")[1]) - {"__metadata__"}
    if names != set(want):
        raise ModelFileError(f"converted copy has different tensors than the GGUF model "
                             f"({sorted(names ^ set(want))[:3]}); this is a specdraft bug")
    for name, tensor in read_safetensors(model_dir / "model.safetensors"):
        if not torch.equal(tensor, want[name]):
            raise ModelFileError(f"converted tensor {name} differs from the GGUF; this is a specdraft bug")
    if model.config.tie_word_embeddings and not (config.tie_word_embeddings and "lm_head.weight" not in names):
        raise ModelFileError("converted copy lost its tied embeddings; this is a specdraft bug")


def move_into_place(tmp: Path, out_dir: Path) -> None:
    """Atomically publish ``tmp`` as ``out_dir``, replacing an incomplete leftover if any.

    ``mkdtemp``/``mkstemp`` create owner-only entries; the published copy gets the usual
    umask-based modes, like any other file the user creates.
    """
    os.chmod(tmp, 0o777 & ~umask())
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~umask())
    if out_dir.exists():  # incomplete, or converted from another source: we were asked to redo it
        shutil.rmtree(out_dir)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        if is_converted(out_dir):  # another process finished the same conversion first
            shutil.rmtree(tmp, ignore_errors=True)
            return
        raise
