"""kernels/flashrt_kernels/streamed_gemm_chain.py on the CPU: the packed weight layout is the one the CUDA kernel
reads (each element where a lane's B fragment load finds it), the CUDA C++ source builds with nvcc and exports its
C functions (where nvcc is installed), and tools/benchmark_streamed_gemm_chain.py's op-by-op chain computes the
reference's formula. The kernel itself runs in test/gpu/test_kernels.py::test_streamed_gemm_chain."""

from __future__ import annotations

import ctypes
import importlib

import pytest
import torch

from flashrt_core.config import GEMMA_300M
from flashrt_core.engine.kernel_import import load_kernels
from tools.benchmark_streamed_gemm_chain import library_chain

K = load_kernels()
SGC = importlib.import_module(K.__name__ + ".streamed_gemm_chain")
BUILD = importlib.import_module(K.__name__ + ".cuda_build")


def kernel_element_index(n: int, k: int, K_total: int) -> int:
    """Where the kernel reads W[n, k] in the packed weight, as its code addresses it: unit n // 8, chunk k // 1024
    (16 KiB each, units then chunks); in a chunk, consumer warp w = (k % 1024) // 128 reads uint4 number
    w * 128 + j * 32 + lane (j: the 32-wide block of its 128, lane = 4 * (n % 8) + (k % 8) // 2); in the uint4,
    .x / .y are the first 16-wide step's b0 / b1 (K offsets 2q, 2q+1 / 2q+8, 2q+9), .z / .w the second step's."""
    unit, chunk, kc = n // 8, k // 1024, k % 1024
    warp, j, s, h, q, p = kc // 128, (kc % 128) // 32, (kc % 32) // 16, (kc % 16) // 8, (kc % 8) // 2, kc % 2
    lane = 4 * (n % 8) + q
    uint4_index = warp * 128 + j * 32 + lane
    chunk_start = (unit * (K_total // 1024) + chunk) * 8 * 1024
    return chunk_start + uint4_index * 8 + s * 4 + h * 2 + p


@pytest.mark.parametrize("n, k", [(16, 1024), (24, 3072)])
def test_pack_weight_puts_every_element_where_the_kernel_reads_it(n, k):
    w = torch.arange(n * k, dtype=torch.float32).reshape(n, k)          # every value distinct
    packed = SGC.pack_weight((w % 251).to(torch.bfloat16))              # exact in bf16
    assert packed.shape == (n * k,)
    index = torch.tensor([[kernel_element_index(i, j, k) for j in range(k)] for i in range(n)])
    assert sorted(index.flatten().tolist()) == list(range(n * k))       # a permutation
    assert torch.equal(packed[index], (w % 251).to(torch.bfloat16))


def test_interleave_gate_up_puts_four_gate_rows_before_their_up_rows():
    mlp, k = 8, 3
    w = torch.arange(2 * mlp * k, dtype=torch.float32).reshape(2 * mlp, k)
    got = SGC.interleave_gate_up(w)
    order = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]      # gate 0-3, up 0-3, gate 4-7, up 4-7
    assert torch.equal(got, w[order])


@pytest.mark.parametrize("shape, dtype", [((12, 1024), torch.bfloat16), ((8, 1000), torch.bfloat16),
                                          ((8, 1024), torch.float32)])
def test_pack_weight_names_what_it_cannot_take(shape, dtype):
    with pytest.raises(ValueError, match="bf16 \\(N, K\\) weight with N a multiple of 8"):
        SGC.pack_weight(torch.zeros(shape, dtype=dtype))


def test_the_benchmark_op_by_op_chain_computes_the_reference_formula():
    g = torch.Generator().manual_seed(3)
    shapes = GEMMA_300M.layer_gemm_shapes()
    weights = K.random_streamed_layer_weights(2, GEMMA_300M.width, shapes["qkv"][0], shapes["o"][1],
                                              shapes["down"][1], "cpu", g)
    h0 = torch.randn(10, GEMMA_300M.width, generator=g)
    want = K.streamed_gemm_chain_reference(h0, weights, 3)
    h = h0.clone()
    library_chain(h, weights, 3)()
    # the op-by-op chain rounds the o and down products to bf16 before adding them; nothing else differs
    assert float((h - want).norm() / want.norm()) < 1e-2
    assert float((h - h0).norm() / h0.norm()) > 0.05                    # the layers did change the residual


@pytest.mark.skipif(not K.cuda_build_available(), reason="no nvcc on this machine")
def test_the_cuda_source_builds_and_exports_its_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = BUILD.build_library(SGC.LIBRARY)
    assert path.parent == tmp_path / "flashrt" / "cuda" and path.is_file()
    assert BUILD.build_library(SGC.LIBRARY) == path                     # built once: the second call finds it
    lib = ctypes.CDLL(str(path))
    smem = lib.streamed_gemm_chain_smem_bytes()
    assert 200 * 1024 < smem <= 227 * 1024                               # the ring fits one H100/H200 SM
    assert lib.streamed_gemm_chain_threads() == 9 * 32
    for name in ("streamed_gemm_chain_launch", "streamed_gemm_chain_max_ctas", "streamed_gemm_chain_error_string"):
        assert hasattr(lib, name)
    if not torch.cuda.is_available():
        assert lib.streamed_gemm_chain_max_ctas() == -1                  # no device: says so, does not crash
    # each measurement switch builds its own library, beside the product one
    switched = {BUILD.build_library(SGC.LIBRARY, (macro,)) for macro in SGC.LEAVE_OUT.values()}
    assert len(switched) == len(SGC.LEAVE_OUT) and path not in switched and all(p.is_file() for p in switched)


def test_the_kernel_library_refuses_an_unknown_switch():
    with pytest.raises(ValueError, match="leave_out takes \\['compute', 'copy', 'products'\\]"):
        SGC.library(("waits",))


def test_without_nvcc_the_build_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(BUILD, "find_nvcc", lambda: None)
    with pytest.raises(RuntimeError, match="needs nvcc"):
        BUILD.build_library(SGC.LIBRARY)
