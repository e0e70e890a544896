"""kernels/flashrt_kernels/denoise_layer.py's host-side planning, on the CPU: the grid it launches, the barriers a launch passes,
the tiles it fits to a layer, the shapes it refuses, and how a grid launch's time stamps become its critical path.
The kernel itself is checked against its reference in test/gpu/test_kernels.py (GPU, and Triton's interpreter)."""

from __future__ import annotations

import sys

import pytest
import torch

from flashrt_core.engine.kernel_import import load_kernels

load_kernels()
dl = sys.modules["flashrt_kernels.denoise_layer"]       # the module (the package's `denoise_layer` is its launcher)


def test_grid_programs_follow_the_largest_phase_and_the_sms():
    cfg = dl.LayerConfig.fit(1024, 4096, 256)                     # pi0.5's expert
    assert dl.grid_programs(1024, 8, 256, 4096, 8, cfg, None) == 128       # O, gate/up, down: 128 tiles each
    assert dl.grid_programs(1024, 8, 256, 4096, 8, cfg, 132) == 128        # H200: one per SM
    assert dl.grid_programs(1024, 8, 256, 4096, 8, cfg, 100) == 100        # fewer SMs: fewer programs
    two = dl.LayerConfig(bn_o=32, bn_gu=16, bn_d=32, per_sm=2)
    assert dl.grid_programs(1024, 8, 256, 4096, 16, two, 132) == 256       # two per SM, halved tiles


def test_barriers_per_launch():
    assert dl.barriers_per_launch(dl.LayerConfig()) == len(dl.PHASES) - 1 == 7
    assert dl.barriers_per_launch(dl.LayerConfig(merge_in_attention=True)) == 6


def test_tiles_fit_a_narrow_layer():
    cfg = dl.LayerConfig.fit(32, 64, 16)                          # the tiny test expert
    assert (cfg.bk, cfg.bk_wide, cfg.bn_o, cfg.bn_gu, cfg.bn_d, cfg.ks_d, cfg.rb) == (32, 32, 32, 32, 32, 64, 8)


def test_refuses_shapes_it_cannot_tile():
    S, W, H, dh, F = 3, 64, 2, 32, 128
    scratch = dl.DenoiseLayerScratch.allocate(S, W, H, dh, F, launches=1, dtype=torch.float32, device="cpu")
    weights = dl.LayerWeights(qkv=torch.zeros((H + 2) * dh, W), o=torch.zeros(W, H * dh),
                              gate_up=torch.zeros(2 * F, W), down=torch.zeros(W, F))
    vec = torch.zeros(W)
    tables = dl.LayerTables(None, vec, vec, vec, vec, vec, torch.zeros((H + 2) * dh), torch.zeros(2 * F))
    cache = torch.zeros(30, dh)
    args = (torch.zeros(S, W), None, torch.zeros(S, W), tables, weights, cache, cache, torch.arange(S),
            torch.zeros(40, dh // 2), torch.zeros(40, dh // 2), torch.zeros(20), torch.full((S,), S), scratch, 0, H,
            1.0)
    with pytest.raises(ValueError, match="tiles"):
        dl.denoise_layer(*args, grid_sync=False, cfg=dl.LayerConfig(bk=48))
    with pytest.raises(ValueError, match="residual must be contiguous fp32"):
        dl.denoise_layer(torch.zeros(S, W, dtype=torch.float64), *args[1:], grid_sync=False)
    with pytest.raises(ValueError, match="grid_sync needs a GPU"):
        dl.denoise_layer(*args, grid_sync=True)
    with pytest.raises(ValueError, match="L2 prefetch"):
        dl.denoise_layer(*args, grid_sync=False, prefetch=True)


def test_phase_stamps_become_the_critical_path():
    """Two programs, made-up global-timer stamps (ns): start, then (work done, barrier released) per barrier, end.
    A phase runs from the last release before it to the last arrival after it; a barrier from the last arrival to
    the last release."""
    n = len(dl.PHASES)
    t = torch.zeros(2, 16, dtype=torch.int64)
    for p, offset in ((0, 0), (1, 500)):              # program 1 arrives 0.5 us after program 0 at every barrier
        clock = 1000 + (100 if p else 0)
        t[p, 0] = clock
        for k in range(n - 1):
            t[p, 1 + 2 * k] = 1000 + 3000 * (k + 1) + offset           # work done
            t[p, 2 + 2 * k] = 1000 + 3000 * (k + 1) + 800 + p * 10     # released
        t[p, 15] = 1000 + 3000 * n + offset
    got = dl.phase_stamps_us(t)
    assert list(got)[0] == "norm1" and len(got) == 2 * n - 1
    assert got["norm1"] == pytest.approx(3.5)          # first start 1000 -> last arrival 4500
    assert got["barrier after norm1"] == pytest.approx(0.31)            # 4500 -> 4810
    assert got["qkv"] == pytest.approx((7500 - 4810) / 1e3)
    assert got["down"] == pytest.approx((1000 + 3000 * n + 500 - (1000 + 3000 * (n - 1) + 810)) / 1e3)
    merged = dl.phase_stamps_us(t, merge_in_attention=True)
    assert "merge" not in merged and len(merged) == 2 * n - 3


@pytest.mark.skipif(not load_kernels().HAVE_TRITON, reason="Triton is not installed")
def test_every_grid_form_compiles_one_barrier_arrival_per_phase_boundary():
    """The grid forms compiled for sm90 (tools/kernel_resources.py, no GPU needed): each grid barrier is one
    release add by one thread of each program (`atom.global.gpu.release.add.u32`), so the PTX holds exactly
    barriers_per_launch of them. The interpreter runs a launch per phase and cannot see a barrier that a form's
    branch leaves out (which would let a phase read another's output before it is written)."""
    from tools.kernel_resources import compile_sm90, denoise_layer_configs
    grids = [c for c in denoise_layer_configs() if c.constexprs["GRID_SYNC"]]
    assert len(grids) >= 5
    for cfg in grids:
        ptx = compile_sm90(cfg).asm["ptx"]
        want = dl.barriers_per_launch(dl.LayerConfig(merge_in_attention=cfg.constexprs["MERGE_IN_ATTENTION"]))
        assert ptx.count("atom.global.gpu.release.add.u32") == want, cfg.name
        assert ptx.count("atom.global.gpu.acq_rel.add") == (1 if cfg.constexprs["MERGE_IN_ATTENTION"] else 0), cfg.name
