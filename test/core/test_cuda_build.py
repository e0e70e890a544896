"""kernels/flashrt_kernels/cuda_build.py's cache key: a library is named by its source, the headers the sources
share (cuda/*.cuh), nvcc's version, the flags and the macros, so editing a shared header builds every source anew
instead of loading a library built from the old header. nvcc is replaced by a stand-in: no build runs here."""

from __future__ import annotations

import importlib

from flashrt_core.engine.kernel_import import load_kernels

BUILD = importlib.import_module(load_kernels().__name__ + ".cuda_build")


def test_the_library_name_follows_the_source_and_its_shared_headers(monkeypatch, tmp_path):
    monkeypatch.setattr(BUILD, "SOURCE_DIR", tmp_path)
    monkeypatch.setattr(BUILD, "find_nvcc", lambda: "/stand-in/nvcc")
    monkeypatch.setattr(BUILD, "_nvcc_version", lambda nvcc: "release 13.0")
    (tmp_path / "chain.cu").write_text('#include "shared.cuh"\n')
    (tmp_path / "shared.cuh").write_text("// v1\n")
    (tmp_path / "notes.txt").write_text("not a header\n")
    first = BUILD.library_path("chain")
    assert first == BUILD.library_path("chain")                          # stable
    assert BUILD.library_path("chain", ("SWITCH",)) != first             # a macro set is another library
    (tmp_path / "notes.txt").write_text("edited\n")
    assert BUILD.library_path("chain") == first                          # only sources and headers count
    (tmp_path / "shared.cuh").write_text("// v2\n")
    edited = BUILD.library_path("chain")
    assert edited != first and edited.name.startswith("chain-")
    (tmp_path / "chain.cu").write_text('#include "shared.cuh"\n// edited\n')
    assert BUILD.library_path("chain") not in (first, edited)
