"""Native kernels, compiled on first use with torch.utils.cpp_extension and cached.

``gguf_ops()`` returns the compiled module, or raises KernelUnavailable with a one-line reason
(no AVX2 CPU, no C++ compiler, build failure). All ops are declared in ops.h:

- quantize_q8k, q4k_matmul, q6k_matmul: gguf_matmul.cpp (AVX2), with paths in gguf_vnni.cpp
  (AVX-512 VNNI), gguf_avxvnni.cpp (AVX-VNNI) and gguf_amx.cpp (AMX-INT8) picked by CPUID:
  kernel_path(), kernel_paths(), set_kernel_path(name), or
  SPECDRAFT_KERNEL_PATH=avx2|avx-vnni|avx512-vnni|amx-int8|auto;
- block_attention: attention.cpp (its inner loops in AVX-512 in attention_avx512.cpp, on the AVX-512 paths);
  rms_quantize, swiglu_quantize, rope_cache: layer_ops.cpp;
- Decoder, every layer in one call: decoder.cpp;
- issue_rates: probe.cpp, how fast this core issues the kernels' vector instructions now (the
  machine's phase, which the bench records).

The build takes ~40 s on 2 cores once per source/torch version (``prebuild_kernels`` starts it
on a thread of its own beside a first run's model conversion); the result lives under
``<cache>/ext/``.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import threading
from contextlib import nullcontext, suppress
from functools import lru_cache
from pathlib import Path

import torch

from ..cache import cache_root, console

HERE = Path(__file__).parent
# bindings.cpp first: the one file with pybind11 and torch's tensor casters (~13 s to compile against ~1-6 s for
# each other file), so the build starts it first and compiles the others beside it
SOURCES = [HERE / n for n in ("bindings.cpp", "gguf_matmul.cpp", "gguf_vnni.cpp", "gguf_avxvnni.cpp", "gguf_amx.cpp",
                              "attention.cpp", "attention_avx512.cpp", "layer_ops.cpp", "decoder.cpp", "probe.cpp")]
HEADERS = [HERE / "ops.h", HERE / "simd.h", HERE / "gguf_common.h", HERE / "gguf_forms.h", HERE / "gguf_vnni_kernels.h",
           HERE / "gguf_zmm.h",
           HERE / "attention_avx512.h", HERE / "torch_lite.h"]
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]


class KernelUnavailable(RuntimeError):
    """The native kernels cannot be used here (the message says why)."""


def cpu_supports_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def build_dir(label: str, code: bytes) -> Path:
    """<cache>/ext/<label>-<key>, the key a hash of the sources, flags and torch version."""
    key = hashlib.sha256(code + " ".join(FLAGS).encode() + torch.__version__.encode()).hexdigest()[:12]
    build = cache_root() / "ext" / f"{label}-{key}"
    build.mkdir(parents=True, exist_ok=True)
    return build


def build_kernels(sources: list[Path], build: Path, module: str):
    """The extension of these sources, compiled into build (once) as module_<key>.

    torch's loader guards a build directory with a lock file that only the process holding it
    removes, and waits for it without end: a build killed half way (Ctrl-C, a timeout) would hang
    every later start, silently. So the loader runs under an OS lock of our own (released by the
    kernel when its holder dies, however it dies), and any torch lock file found while holding it
    was left by a process that is gone."""
    from torch.utils import cpp_extension

    with open(build / "build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # another process building here: wait for it (it may be a minute)
        (build / "lock").unlink(missing_ok=True)
        return cpp_extension.load(name=f"{module}_{build.name.rsplit('-', 1)[1]}", sources=[str(p) for p in sources],
                                  extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], build_directory=str(build),
                                  verbose=False)


def build_source_dir(src: Path, label: str):
    """The extension of the kernel sources (.cpp, .h) in directory src, e.g. another version's or a
    patched copy, compiled once into the cache as module specdraft_<label> (scripts/kernel_ab.py,
    scripts/amx_parts.py)."""
    names = sorted(p.name for p in src.iterdir() if p.suffix in (".cpp", ".h"))
    code = b"".join((src / n).read_bytes() for n in names)
    return build_kernels([src / n for n in names if n.endswith(".cpp")], build_dir(label, code), f"specdraft_{label}")


def gguf_build_dir() -> Path:
    """Where the kernels of these sources (and this torch, these flags) are built and cached."""
    return build_dir("gguf_matmul", b"".join(p.read_bytes() for p in SOURCES + HEADERS))


_prebuild: threading.Thread | None = None  # the build prebuild_kernels started, if any


def prebuild_kernels() -> None:
    """Start building the GGUF kernels on a thread of their own where they are not built yet:
    the build (~67 s of compiler time over both cores, Zen 4 EPYC) then overlaps what a first run
    does before it needs them, the GGUF's conversion above all (~50 s, mostly one core).
    gguf_ops waits for it; a failure there is gguf_ops' to report when it is asked."""
    global _prebuild
    if _prebuild is not None or not cpu_supports_avx2() or any(gguf_build_dir().glob("*.so")):
        return

    def build() -> None:
        with suppress(Exception):  # never a thread's traceback: gguf_ops tries again and raises it where asked
            _gguf_ops()

    _prebuild = threading.Thread(target=build, name="specdraft-kernel-build", daemon=True)
    _prebuild.start()


def gguf_ops():
    """The compiled kernels (built on the first call, or waited for where prebuild_kernels is
    building them); KernelUnavailable with a one-line reason where they cannot be had."""
    if _prebuild is not None and _prebuild is not threading.current_thread():
        _prebuild.join()
    return _gguf_ops()


@lru_cache(maxsize=1)
def _gguf_ops():
    if not cpu_supports_avx2():
        raise KernelUnavailable("the GGUF kernels need an AVX2 CPU")
    try:  # the ninja wheel (a dependency) puts its binary beside the package: make it findable
        import ninja

        if shutil.which("ninja") is None:
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except (ImportError, AttributeError):
        pass
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise KernelUnavailable("the GGUF kernels need a C++ compiler (apt install g++)")
    build = gguf_build_dir()
    # a status line on a terminal only, erased when done: never a line of a log or an error; none
    # from prebuild_kernels' thread, beside the conversion's own (one live display at a time)
    shown = threading.current_thread() is threading.main_thread() and not any(build.glob("*.so"))
    building = console().status("building the GGUF kernels (once, under a minute)...") if shown else nullcontext()
    try:
        with building:
            return build_kernels(SOURCES, build, "specdraft_gguf")
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise KernelUnavailable(f"building the GGUF kernels failed ({first}); see {build}") from None


def kernel_path_note() -> str:
    """The ISA path the GGUF kernels take here and those the CPU has, or why there are none."""
    try:
        ops = gguf_ops()
    except KernelUnavailable as e:
        return f"none ({e})"
    return f"{ops.kernel_path()} (this CPU: {', '.join(ops.kernel_paths())})"
