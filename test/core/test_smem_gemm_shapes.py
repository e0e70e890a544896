"""kernels/smem_gemm.py's shape rules, checked where the engine relies on them (no GPU needed): every candidate
of ops.SMEM_CANDIDATES serves the action expert's GEMMs of pi0.5 and pi0 at their row counts up to 16, and what the
kernel cannot do (more than 16 rows, K slices that are not whole 64-column boxes, split GeGLU, slices beyond one
SM's shared memory) is refused, so the tuning never offers it."""

from __future__ import annotations

import pytest

from flashrt_core.config import get_config
from flashrt_core.engine.ops import SMEM_CANDIDATES

pytest.importorskip("torch")
from kernels.smem_gemm import smem_gemm_supported  # noqa: E402


@pytest.mark.parametrize("name", ["pi05", "pi0"])
def test_every_candidate_serves_the_expert_shapes(name):
    e = get_config(name).expert
    shapes = {"qkv": ((e.num_heads + 2 * e.num_kv_heads) * e.head_dim, e.width),
              "o": (e.width, e.num_heads * e.head_dim),
              "gate_up": (2 * e.mlp_dim, e.width), "down": (e.width, e.mlp_dim)}
    for kind, (n, k) in shapes.items():
        for cfg in SMEM_CANDIDATES[kind]:
            for rows in (1, 10, 11, 16):
                assert smem_gemm_supported(rows, n, k, kind == "gate_up", cfg.split_k), (name, kind, cfg, rows)


def test_what_the_kernel_cannot_do_is_refused():
    assert not smem_gemm_supported(17, 1024, 1024, False, 1)            # more rows than wgmma's N = 16
    assert not smem_gemm_supported(10, 1024, 1000, False, 1)           # K not whole 64-column boxes
    assert not smem_gemm_supported(10, 1024, 4096, False, 3)           # K slices not whole boxes
    assert not smem_gemm_supported(10, 8192, 1024, True, 2)            # GeGLU needs the whole K in one program
    assert not smem_gemm_supported(10, 1000, 1024, False, 1)           # not whole 64-row weight tiles
    assert not smem_gemm_supported(10, 1024, 4096, False, 1)           # 4096-wide slice: 640 KB of shared memory
