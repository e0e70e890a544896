"""Ahead-of-time compilation of the skinny GEMM for sm90, with and without its L2 prefetch prologue: Triton lowers
the inline PTX and the ptxas bundled with Triton accepts it, on any machine with Triton installed, GPU or not.

This is what can be checked without a GPU: the instruction is emitted, once per thread (one chunk per thread), and
before `griddepcontrol.wait`, so the fetch overlaps the kernel ahead under PDL. Whether it speeds anything up is
measured on the GPU (docs/development.md); that it changes no result is test/gpu's job.
"""

from __future__ import annotations

import pytest

from flashrt_kernels import HAVE_TRITON

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed")

PREFETCH = "cp.async.bulk.prefetch.L2.global"


def _ptx(slots: int, pdl: bool, num_warps: int, own: bool = False, geglu: bool = False) -> str:
    from flashrt_kernels.skinny_gemm import _K_GELU, _skinny_kernel
    from tools.kernel_resources import SKINNY_SIGNATURE, KernelConfig, compile_sm90

    constexprs = {"K_PER_SPLIT": 1024, "GEGLU": geglu, "SPLIT_K": 1, "KGELU": _K_GELU, "BLOCK_M": 16,
                  "BLOCK_N": 32, "BLOCK_K": 128, "PDL": pdl, "PREFETCH_SLOTS": slots, "OWN_PREFETCH": own}
    kernel = compile_sm90(KernelConfig("skinny GEMM", _skinny_kernel, SKINNY_SIGNATURE, constexprs, num_warps, 4))
    assert kernel.asm["cubin"], "ptxas produced no cubin"
    return kernel.asm["ptx"]


@pytest.mark.parametrize("num_warps", [4, 8])
def test_prefetch_prologue_compiles_for_sm90_before_the_dependency_wait(num_warps):
    ptx = _ptx(32 * num_warps, pdl=True, num_warps=num_warps)
    assert ptx.count(PREFETCH) == 1                  # one element, so one instruction, per thread
    assert 0 <= ptx.find(PREFETCH) < ptx.find("griddepcontrol.wait")


def test_no_prefetch_without_slots():
    ptx = _ptx(0, pdl=True, num_warps=4)
    assert PREFETCH not in ptx and "griddepcontrol.wait" in ptx


@pytest.mark.parametrize("geglu", [False, True])
def test_own_slice_prefetch_compiles_before_the_dependency_wait(geglu):
    """own_prefetch: one bulk prefetch per weight row of the program (gate and up rows with GeGLU), all of them
    before griddepcontrol.wait."""
    ptx = _ptx(0, pdl=True, num_warps=4, own=True, geglu=geglu)
    assert ptx.count(PREFETCH) >= 1 + geglu
    last = max(i for i in range(len(ptx)) if ptx.startswith(PREFETCH, i))
    assert last < ptx.find("griddepcontrol.wait")


QKV_ROPE_SIGNATURE = {"qkv_ptr": "*bf16", "pos_ptr": "*i32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                      "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "M": "i32", "cache_offset": "i32",
                      "q_scale": "fp32", "stride_qkv": "i32", "stride_q_m": "i32", "stride_q_h": "i32",
                      "stride_cache_g": "i32", "stride_cache_l": "i32"}


def test_qkv_rope_row_blocks_move_16_bytes_per_access():
    """The prefix's qkv_rope programs (8 rows, 4 warps: kernels/flashrt_kernels/qkv_rope.py) compile for sm90 with 16-byte global
    loads and stores of the bf16 rows (v4.b32: 8 values per thread), where the one-row programs load 8 bytes."""
    import re

    from flashrt_kernels.qkv_rope import QKV_ROPE_BLOCK_ROWS, _qkv_rope_kernel
    from tools.kernel_resources import KernelConfig, compile_sm90

    def ptx(block_m: int, num_warps: int) -> str:
        constexprs = {"H": 8, "G": 1, "HALF": 128, "BLOCK_M": block_m, "PDL": True}
        kernel = compile_sm90(KernelConfig("qkv_rope", _qkv_rope_kernel, QKV_ROPE_SIGNATURE, constexprs, num_warps, 1,
                                           divisible=tuple(n for n in QKV_ROPE_SIGNATURE if n.startswith("stride"))))
        assert kernel.asm["cubin"], "ptxas produced no cubin"
        return kernel.asm["ptx"]

    blocked, single = ptx(QKV_ROPE_BLOCK_ROWS, 4), ptx(1, 1)
    wide_loads = len(re.findall(r"ld\.global[^\n]*\.v4\.b32", blocked))
    wide_stores = len(re.findall(r"st\.global[^\n]*\.v4\.b32", blocked))
    assert wide_loads >= 4 and wide_stores >= 2, (wide_loads, wide_stores)   # x1, x2, cos, sin; two halves out
    assert len(re.findall(r"ld\.global[^\n]*\.v2\.b32", single)) >= 2           # the one-row programs: 8 bytes
