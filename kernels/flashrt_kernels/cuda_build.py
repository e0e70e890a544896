"""The CUDA C++ build path: a source of kernels/flashrt_kernels/cuda/ compiled by nvcc into a shared library, once
per (source, compiler, flags), and loaded with ctypes.

The sources have no PyTorch dependency: each exports plain C functions that take device pointers and a
`cudaStream_t`, so the library builds with nvcc alone and its launches go into PyTorch's current stream (and into a
CUDA graph when that stream is capturing). The library links CUDA's runtime statically; it shares the device's
primary context with PyTorch. Built libraries live in the user's cache folder ($XDG_CACHE_HOME/flashrt/cuda, by
default ~/.cache/flashrt/cuda), named by a hash of the source text, the headers beside it (cuda/*.cuh, which the
sources share), nvcc's version, the flags and the macros, so an edit or another compiler builds anew and nothing
stale is loaded.

nvcc is looked for in $CUDA_HOME/bin, $CUDA_PATH/bin, on PATH and in /usr/local/cuda/bin. Without it,
`cuda_build_available()` is False and `load_library` raises an error that says so.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
# Hopper machine code (the bulk copy engine needs sm_90) plus its PTX, which newer GPUs compile at load.
NVCC_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-gencode=arch=compute_90,code=[sm_90,compute_90]")


def find_nvcc() -> str | None:
    """The nvcc to build with, or None."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def cuda_build_available() -> bool:
    """Whether nvcc is here to build the CUDA C++ kernels."""
    return find_nvcc() is not None


def cache_dir() -> Path:
    """Where built libraries are kept: $XDG_CACHE_HOME/flashrt/cuda (the XDG cache folder, ~/.cache by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashrt" / "cuda"


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout


def library_path(name: str, defines: tuple[str, ...] = ()) -> Path:
    """Where the library built from cuda/<name>.cu by this nvcc with NVCC_FLAGS and the macros `defines`
    (-D<each>) is (or will be) kept."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError(f"building kernels/flashrt_kernels/cuda/{name}.cu needs nvcc (the CUDA toolkit); none "
                           "found in $CUDA_HOME/bin, $CUDA_PATH/bin, on PATH or in /usr/local/cuda/bin")
    source = SOURCE_DIR / f"{name}.cu"
    if not source.is_file():
        raise FileNotFoundError(f"no CUDA source {source}")
    digest = hashlib.sha256()
    headers = [p.read_bytes() for p in sorted(SOURCE_DIR.glob("*.cuh"))]
    for part in (source.read_bytes(), *headers, _nvcc_version(nvcc).encode(),
                 " ".join(NVCC_FLAGS + _flags(defines)).encode()):
        digest.update(part)
        digest.update(b"\0")
    return cache_dir() / f"{name}-{digest.hexdigest()[:16]}.so"


def _flags(defines: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"-D{d}" for d in defines)


def build_library(name: str, defines: tuple[str, ...] = ()) -> Path:
    """cuda/<name>.cu built into library_path(name, defines) unless it is there already; its path. The build writes
    a temporary file in the cache folder and renames it, so concurrent builds never load a half-written library."""
    path = library_path(name, defines)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".so.tmp", dir=path.parent)
    os.close(fd)
    cmd = [find_nvcc(), *NVCC_FLAGS, *_flags(defines), "-o", tmp, str(SOURCE_DIR / f"{name}.cu")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise RuntimeError(f"nvcc failed on kernels/flashrt_kernels/cuda/{name}.cu ({' '.join(cmd)}):\n{done.stderr}")
    os.replace(tmp, path)
    return path


@functools.lru_cache(maxsize=None)
def load_library(name: str, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The ctypes handle of cuda/<name>.cu's library (with the macros `defines`), built first when needed."""
    return ctypes.CDLL(str(build_library(name, defines)))
