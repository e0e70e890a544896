"""tools/benchmark_cublaslt_algorithms.py: what it can be checked for without a GPU (the GPU numbers come from the
device): the engine's shapes and epilogues it times, the cuBLASLt structures and operand layouts it passes through
ctypes, where it looks for the library, its summary arithmetic, and its refusal without CUDA."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))

import benchmark_cublaslt_algorithms as bench  # noqa: E402


def test_engine_shapes_are_the_padded_vision_mlp_and_the_prefix_at_its_bucket():
    shapes = {(s.tower, s.name): s for s in bench.engine_shapes("pi05", views=2, text_slots=48)}
    assert sorted(shapes) == sorted([("vision", "qkv"), ("vision", "o"), ("vision", "fc1_pad4352"),
                                     ("vision", "fc2_pad4352"), ("prefix", "qkv"), ("prefix", "o"),
                                     ("prefix", "gate_up"), ("prefix", "down")])
    fc1, fc2 = shapes["vision", "fc1_pad4352"], shapes["vision", "fc2_pad4352"]
    assert (fc1.rows, fc1.n, fc1.k, fc1.epilogue) == (512, 4352, 1152, "gelu")
    assert (fc2.n, fc2.k) == (1152, 4352)
    assert (shapes["prefix", "down"].rows, shapes["prefix", "down"].k) == (560, 16384)
    unpadded = {(s.tower, s.name) for s in bench.engine_shapes("pi05", 2, 48, vision_mlp_pad=0)}
    assert ("vision", "fc1") in unpadded and ("vision", "fc1_pad4352") not in unpadded


def test_epilogues_follow_torchs_calls():
    shapes = {(s.tower, s.name): s for s in bench.engine_shapes("pi05", 2, 48)}
    assert bench.epilogue_for(shapes["vision", "fc1_pad4352"]) == bench.EPILOGUE_GELU_BIAS == 36
    assert bench.epilogue_for(shapes["vision", "qkv"]) == bench.EPILOGUE_BIAS
    assert bench.epilogue_for(shapes["vision", "fc2_pad4352"]) == bench.EPILOGUE_BIAS
    assert {bench.epilogue_for(s) for s in shapes.values() if s.tower == "prefix"} == {bench.EPILOGUE_DEFAULT}


def test_heuristic_result_has_cublaslts_layout():
    assert ctypes.sizeof(bench.MatmulAlgo) == 64
    assert ctypes.sizeof(bench.HeuristicResult) == 96
    assert bench.HeuristicResult.workspace_size.offset == 64 and bench.HeuristicResult.state.offset == 72


def test_operand_layouts_compute_x_times_w_transposed():
    """The column-major reading of row-major x (rows, k), w (n, k), y (rows, n), checked by doing the GEMM the
    way cuBLASLt reads it: D (n, rows) = op_T(A) @ B with A = w seen as (k, n), B = x seen as (k, rows)."""
    rows, n, k = 5, 7, 3
    (ar, ac, lda), (br, bc, ldb), (dr, dc, ldd) = bench.operand_layouts(rows, n, k)
    x, w = torch.randn(rows, k), torch.randn(n, k)
    a = w.flatten().reshape(ac, lda)[:, :ar].t()         # column-major (ar, ac) with leading dimension lda
    b = x.flatten().reshape(bc, ldb)[:, :br].t()
    d = a.t() @ b                                          # TRANSA = T, TRANSB = N: (n, rows)
    assert (dr, dc, ldd) == (n, rows, n)
    y = d.t().contiguous()                                 # D column-major (n, rows) is y row-major (rows, n)
    torch.testing.assert_close(y, x @ w.t())


def test_library_search_names_what_it_tried(tmp_path):
    fake = tmp_path / "libcublasLt.so.13"
    fake.write_text("not a library")
    with pytest.raises(RuntimeError, match="no loadable cuBLASLt.*libcublasLt.so.13"):
        bench.load_cublaslt([str(fake)])
    with pytest.raises(RuntimeError, match="nvidia wheels"):
        bench.load_cublaslt([])
    assert all("libcublasLt.so" in p for p in bench.library_candidates())


def test_summary_counts_each_gemm_per_predict():
    result = {"env": {"device": "GPU", "torch": "2.11", "cublaslt": 130000, "time_utc": "2026-12-05T00:00:00"},
              "rows": [{"tower": "vision", "gemm": "fc2_pad4352", "rows": 512, "n": 1152, "k": 4352, "epilogue": 4,
                        "torch_us": 13.0, "first_us": 13.1, "best_index": 3, "best_us": 11.0, "saved_us": 2.0,
                        "algorithms": [{"index": 0, "us": 13.1, "workspace_bytes": 0, "waves": 0.6},
                                       {"index": 3, "us": 11.0, "workspace_bytes": 4 << 20, "waves": 1.1}]},
                       {"tower": "prefix", "gemm": "down", "rows": 560, "n": 2048, "k": 16384, "epilogue": 1,
                        "torch_us": 55.0, "first_us": 55.5, "best_index": 0, "best_us": 56.0, "saved_us": -1.0,
                        "algorithms": [{"index": 0, "us": 56.0, "workspace_bytes": 0, "waves": 0.9},
                                       {"index": 1, "cosine": 0.5, "workspace_bytes": 0, "waves": 0.9}]}]}
    text = bench.table(result)
    assert "| vision | fc2_pad4352 | 512 x 1152 x 4352 | 2 (2) | 13.00 | 13.10 | #3 | 11.00 | 2.00 | 0.054 |" in text
    assert "| prefix | down | 560 x 2048 x 16384 | 2 (1) | 55.00 | 55.50 | #0 | 56.00 | -1.00 | 0.000 |" in text
    assert "together: 0.054 ms per predict" in text
    assert bench.calls_per_predict("prefix", "qkv") == 18 and bench.calls_per_predict("prefix", "o") == 17
    assert "#1: left out: cosine 0.50000" in bench.details(result)
    assert "#3: 11.00 us (workspace 4096 KiB, waves 1.10)" in bench.details(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_without_cuda(capsys):
    assert bench.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_every_cublaslt_function_called_is_typed():
    """ctypes passes untyped Python ints as 32-bit ints: each cuBLASLt function the tool calls has its signature."""
    import re
    import types
    called = set(re.findall(r"lib\.(cublasLt\w+)", Path(bench.__file__).read_text()))
    assert called and called <= set(bench.SIGNATURES), sorted(called - set(bench.SIGNATURES))
    fake = types.SimpleNamespace(**{name: types.SimpleNamespace() for name in bench.SIGNATURES})
    bench.bind(fake)
    assert fake.cublasLtMatmul.argtypes[14] is ctypes.c_size_t and len(fake.cublasLtMatmul.argtypes) == 16
    assert fake.cublasLtMatrixLayoutCreate.argtypes[2:] == [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
    assert fake.cublasLtGetVersion.restype is ctypes.c_size_t
