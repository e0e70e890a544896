"""kernels/flashrt_kernels/smem_gemm.py's shape rules, checked where the engine relies on them (no GPU needed): every candidate
of kernel_configs.SMEM_CANDIDATES serves the action expert's GEMMs of pi0.5 and pi0 at their row counts up to 64 (horizon 10:
10-11, horizon 50: 50-51), and what the kernel cannot do (more than 64 rows, K slices that are not whole 64-column
boxes, split GeGLU, slices beyond one SM's shared memory) is refused, so the tuning never offers it."""

from __future__ import annotations

import pytest

from flashrt_core.config import get_config
from flashrt_core.engine import tuning
from flashrt_core.engine.kernel_configs import SMEM_CANDIDATES

pytest.importorskip("torch")
from flashrt_kernels.smem_gemm import smem_gemm_supported  # noqa: E402


@pytest.mark.parametrize("name", ["pi05", "pi0"])
def test_every_candidate_serves_the_expert_shapes(name):
    for kind, (n, k) in get_config(name).expert.layer_gemm_shapes().items():
        for cfg in SMEM_CANDIDATES[kind]:
            for rows in (1, 10, 11, 16, 17, 32, 33, 50, 51, 64):
                assert smem_gemm_supported(rows, n, k, kind == "gate_up", cfg.split_k), (name, kind, cfg, rows)


def test_the_ring_kernel_fits_its_x_boxes_beside_the_weight_slice():
    """17-64 rows: x in 32- or 64-row boxes through a ring beside the whole weight slice (64 x K slice) and the
    GeGLU scratch, in SMEM_BUDGET; as many stages as fit, at most MAX_X_STAGES, no more than the slice's boxes."""
    from flashrt_kernels.smem_gemm import MAX_X_STAGES, SMEM_BUDGET, x_ring_stages, x_tile_rows
    assert [x_tile_rows(m) for m in (1, 16, 17, 32, 33, 51, 64)] == [16, 16, 32, 32, 64, 64, 64]
    assert x_ring_stages(51, 1024, False) == MAX_X_STAGES == 8        # 128 KB of weights + 8 x 8 KB boxes
    assert x_ring_stages(51, 1024, True) == 8                         # + 16 KB of GeGLU scratch: 208 KB
    assert x_ring_stages(51, 256, False) == 4                         # the slice has only 4 boxes
    assert x_ring_stages(51, 1600, False) == 2                        # 200 KB of weights: two 8 KB boxes beside
    assert x_ring_stages(51, 1664, False) == 0                        # 208 KB: not two boxes
    for m in (17, 33, 64):
        for k_slice in (64, 256, 512, 1024):
            for geglu in (False, True):
                stages = x_ring_stages(m, k_slice, geglu)
                xr = x_tile_rows(m)
                used = 64 * k_slice * 2 + stages * xr * 64 * 2 + (4 * 64 * xr if geglu else 0)
                assert 1 <= stages <= min(MAX_X_STAGES, k_slice // 64) and used <= SMEM_BUDGET, (m, k_slice, geglu)


def test_what_the_kernel_cannot_do_is_refused():
    assert not smem_gemm_supported(65, 1024, 1024, False, 1)            # more rows than the ring kernel's 64
    assert not smem_gemm_supported(0, 1024, 1024, False, 1)
    assert not smem_gemm_supported(10, 1024, 1000, False, 1)           # K not whole 64-column boxes
    assert not smem_gemm_supported(10, 1024, 4096, False, 3)           # K slices not whole boxes
    assert not smem_gemm_supported(10, 8192, 1024, True, 2)            # GeGLU needs the whole K in one program
    assert not smem_gemm_supported(10, 1000, 1024, False, 1)           # not whole 64-row weight tiles
    assert not smem_gemm_supported(10, 1024, 4096, False, 1)           # 4096-wide slice: 640 KB of shared memory
    assert not smem_gemm_supported(51, 1024, 4096, False, 1)           # ... and at 51 rows: 512 KB of weights


def test_tuning_leaves_out_a_shared_memory_gemm_that_cannot_run_and_raises_for_others():
    """The Gluon GEMM has run only on the H200: a compile or launch error of it drops that candidate from
    the load-time tuning with the reason recorded; the same error from a default candidate still stops the build."""
    from flashrt_core.engine.options import EngineOptions
    from flashrt_core.engine.dispatch import resolve
    from flashrt_core.engine.hardware import CPU
    from flashrt_core.engine.ops import Ops
    from flashrt_core.engine.kernel_configs import SkinnyConfig, SmemConfig

    ops = Ops(resolve(CPU, EngineOptions()))

    def broken():
        raise RuntimeError("PassManager::run failed")
    assert tuning.time_candidate(ops, "gate_up", SmemConfig(1), broken) is None
    assert "PassManager" in ops.decoder_failures["gate_up"]["gluon_smem(s1)"]
    assert tuning.time_candidate(ops, "gate_up", SmemConfig(1), lambda: 4.5) == 4.5
    with pytest.raises(RuntimeError, match="PassManager"):
        tuning.time_candidate(ops, "gate_up", SkinnyConfig(32, 128, 1, 4), broken)


def test_tuning_leaves_out_a_candidate_that_does_not_fit_the_gpu():
    triton_errors = pytest.importorskip("triton.runtime.errors")
    from flashrt_core.engine.options import EngineOptions
    from flashrt_core.engine.dispatch import resolve
    from flashrt_core.engine.hardware import CPU
    from flashrt_core.engine.ops import Ops
    from flashrt_core.engine.kernel_configs import SkinnyConfig

    ops = Ops(resolve(CPU, EngineOptions()))

    def too_big():
        raise triton_errors.OutOfResources(262144, 232448, "shared memory")
    assert tuning.time_candidate(ops, "gate_up", SkinnyConfig(32, 128, 1, 8), too_big) is None
    assert "shared memory" in ops.decoder_failures["gate_up"]["triton(n32,k128,s1,st8,w4)"]


def test_tuning_leaves_out_a_candidate_whose_product_is_wrong(monkeypatch):
    """check_candidate compares a candidate's product (split-K partials summed) with the library GEMM's on the same
    input before the tuning times it: a right one passes, a wrong one is left out with its error recorded, so no
    candidate is picked for its speed alone (e.g. a new TMA split-K configuration not yet run on this GPU)."""
    import types

    import torch

    from flashrt_core.engine.options import EngineOptions

    from flashrt_core.engine.dispatch import resolve
    from flashrt_core.engine.hardware import CPU
    from flashrt_core.engine.tuning import CandidateMismatch
    from flashrt_core.engine.ops import Ops
    from flashrt_core.engine.kernel_configs import SmemConfig
    from flashrt_core.engine.weights import Linear

    ops = Ops(resolve(CPU, EngineOptions()))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 256, generator=g)
    lin = Linear([(torch.randn(128, 256, generator=g) / 16, None)])
    monkeypatch.setattr(Ops, "smem_fits", lambda self, x, lin, kind, c: True)
    def right(x, w, geglu=False, split_k=1, pdl=False):
        return ops.k.skinny_gemm_reference(x, w, geglu, split_k)
    ops.k = types.SimpleNamespace(**{n: getattr(ops.k, n) for n in ops.k.__all__})     # this Ops' own kernels
    ops.k.smem_gemm = right
    tuning.check_candidate(ops, "o", SmemConfig(4), x, lin)                      # four partials, summed: the product
    ops.k.smem_gemm = lambda x, w, geglu=False, split_k=1, pdl=False: right(x, w, geglu, split_k)[:1]
    with pytest.raises(CandidateMismatch, match="relative L2 error"):  # one of the four partials only
        tuning.check_candidate(ops, "o", SmemConfig(4), x, lin)
    assert tuning.time_candidate(ops, "o", SmemConfig(4), lambda: tuning.check_candidate(ops, "o", SmemConfig(4), x, lin)) is None
    assert "relative L2 error" in ops.decoder_failures["o"]["gluon_smem(s4)"]


def test_qkv_and_gate_up_have_no_split_k_candidate(monkeypatch):
    """QKV feeds RoPE or the attention and gate/up the GeGLU epilogue, neither of which sums split-K partials: their
    shared-memory candidates are whole-K only, at the rows of either RoPE placement; O and down offer split-K."""
    import torch

    from flashrt_core.engine.options import EngineOptions

    from flashrt_core.engine.dispatch import resolve
    from flashrt_core.engine.hardware import CPU
    from flashrt_core.engine.ops import Ops
    from flashrt_core.engine.kernel_configs import SmemConfig
    from flashrt_core.engine.weights import Linear

    ops = Ops(resolve(CPU, EngineOptions()))
    monkeypatch.setattr(Ops, "smem_fits", lambda self, x, lin, kind, c: True)
    lin = Linear([(torch.zeros(2560, 1024), None)])
    for rope_in_attention in (True, False):
        ops.rope_in_attention = rope_in_attention
        for rows in (10, 51):
            smem = [c for c in tuning.decoder_candidates(ops, "qkv", torch.zeros(rows, 1024), lin, 256)
                    if isinstance(c, SmemConfig)]
            assert smem == [SmemConfig(1)], (rope_in_attention, rows, smem)
    gate_up = Linear([(torch.zeros(8192, 1024), None)])
    assert [c for c in tuning.decoder_candidates(ops, "gate_up", torch.zeros(10, 1024), gate_up, 256)
            if isinstance(c, SmemConfig)] == [SmemConfig(1)]
    o = Linear([(torch.zeros(1024, 2048), None)])
    assert {c.split_k for c in tuning.decoder_candidates(ops, "o", torch.zeros(10, 2048), o, 256)
            if isinstance(c, SmemConfig)} == {2, 4, 8}


def test_the_ring_kernel_is_the_default_with_switches_off_and_follows_the_smem_gemm_switch():
    """17-64-row shared-memory GEMM candidates (horizon 50) by default (-0.25 ms pi0.5, -0.49 ms pi0 at horizon 50
    on the H200), off with FLASHRT_SMEM_GEMM_ROWS=0 (over the options it is applied to), and
    never with the shared-memory GEMMs off."""
    from flashrt_core.engine.options import EngineOptions
    from flashrt_core.engine.dispatch import Op, resolve
    from flashrt_core.engine.hardware import detect_hardware
    from flashrt_core.engine.ops import Ops

    sm90 = detect_hardware("sm90")
    asked = EngineOptions()
    assert asked.smem_gemm_rows
    ops = Ops(resolve(sm90, asked))
    assert ops.smem_gemm_rows == (ops.dispatch[Op.SMEM_GEMM] == "tma")
    for base in (None, EngineOptions(smem_gemm_rows=True)):        # the variable overrides the options
        rows_off = EngineOptions.from_env(base, env={"FLASHRT_SMEM_GEMM_ROWS": "0"})
        assert not rows_off.smem_gemm_rows and rows_off.smem_gemm, base
        assert not Ops(resolve(sm90, rows_off)).smem_gemm_rows
    rows_on = EngineOptions.from_env(EngineOptions(smem_gemm_rows=False), env={"FLASHRT_SMEM_GEMM_ROWS": "1"})
    assert Ops(resolve(sm90, rows_on)).smem_gemm_rows == ops.smem_gemm_rows
    off = EngineOptions.from_env(asked, env={"FLASHRT_SMEM_GEMM": "0"})
    assert off.smem_gemm_rows and not Ops(resolve(sm90, off)).smem_gemm_rows


def test_plain_pick_serves_an_untuned_gemm_of_the_same_k():
    """Ops.plain_pick: the tuned GEMM of a kind where it is plain (no split-K, no RoPE epilogue), else the kind's
    first Triton candidate; pi0's time MLP output GEMM runs on QKV's pick this way (forward.denoise)."""
    from flashrt_core.engine.options import EngineOptions
    from flashrt_core.engine.dispatch import resolve
    from flashrt_core.engine.hardware import CPU
    from flashrt_core.engine.ops import Ops
    from flashrt_core.engine.kernel_configs import RopeGemmConfig, SkinnyConfig, SmemConfig

    ops = Ops(resolve(CPU, EngineOptions()))
    for impl, want in ((SmemConfig(1), SmemConfig(1)), (SkinnyConfig(32, 128, 1, 4), SkinnyConfig(32, 128, 1, 4)),
                       (SmemConfig(2), "triton"), (RopeGemmConfig(32, 128, 3), "triton"), ("library", "triton")):
        ops.decoder_impl["qkv"] = impl
        assert ops.plain_pick("qkv") == want, impl
