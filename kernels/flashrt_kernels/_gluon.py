"""Triton's Gluon for NVIDIA Hopper (TMA, mbarrier, wgmma), where this Triton has it, and the one PTX helper the
Gluon kernels share (kernels/flashrt_kernels/smem_gemm.py, kernels/flashrt_kernels/prefix_attention.py).

`HAVE_GLUON` says whether the imports below exist; without them the names are None and the kernels that need them
are not offered (their `*_supported` functions say False)."""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except ImportError:      # Triton without Gluon (or none at all)
    HAVE_GLUON = False
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = TensorDescriptor = None

if HAVE_GLUON:
    @gluon.jit
    def griddep(ASM: gl.constexpr):
        """One griddepcontrol instruction of programmatic dependent launch (sm90+), ASM its PTX text:
        "griddepcontrol.wait; // dummy $0" or "griddepcontrol.launch_dependents; // dummy $0"."""
        gl.inline_asm_elementwise(ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
else:
    griddep = None

__all__ = ["HAVE_GLUON", "TensorDescriptor", "fence_async_shared", "gl", "gluon", "griddep", "mbarrier", "tma",
           "warpgroup_mma", "warpgroup_mma_wait"]
