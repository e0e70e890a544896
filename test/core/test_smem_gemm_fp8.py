"""kernels/flashrt_kernels/smem_gemm_fp8.py without a GPU: its PyTorch reference is the arithmetic the engine relies on (E4M3 x rows
scaled per row and K slice onto the format's maximum, E4M3 weights with one scale per row), its shape rules serve
every TMA GEMM candidate of the action expert at horizon 10 and refuse what the kernel cannot do, its launcher names
a wrong input, and the kernel compiles for sm90 as designed (the E4M3 weight slice issued before the PDL wait, the
products on wgmma's E4M3 form, no spills). The GPU test is test/gpu/test_kernels.py
test_smem_gemm_fp8_every_engine_config."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine.fp8 import quantize_rows  # noqa: E402
from flashrt_core.engine.ops import DECODER_CHECK_REL_L2_FP8, SMEM_CANDIDATES  # noqa: E402
from flashrt_kernels.smem_gemm_fp8 import (E4M3_MAX, HAVE_GLUON, smem_gemm_fp8, smem_gemm_fp8_reference,  # noqa: E402
                                   smem_gemm_fp8_supported)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("geglu,split_k", [(False, 1), (False, 4), (True, 1)])
def test_reference_is_close_to_the_bf16_product_and_scales_each_row_apart(geglu, split_k):
    """Within the engine's FP8 candidate bound of the bf16 product; a row multiplied by 2^10 gives its output
    multiplied by 2^10 (its own scale: the other rows' results are unchanged, bit for bit); a zero row gives
    zeros, not NaN."""
    g = torch.Generator().manual_seed(7)
    n, k = (512, 1024) if geglu else (256, 2048)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    w_q, w_scale = quantize_rows(w, torch.float8_e4m3fn)
    x = torch.randn(10, k, generator=g).to(torch.bfloat16)
    x[3] = 0
    y = smem_gemm_fp8_reference(x, w_q, w_scale, geglu, split_k)
    want = x.float() @ w.float().T
    if geglu:
        gate, up = want.chunk(2, dim=-1)
        want = torch.nn.functional.gelu(gate, approximate="tanh") * up
    assert y.shape == want.shape and y.dtype == torch.bfloat16
    assert _rel(y, want) < DECODER_CHECK_REL_L2_FP8, _rel(y, want)   # ~4 % plain, ~6 % GeGLU here
    assert torch.equal(y[3], torch.zeros_like(y[3]))
    x2 = x.clone()
    x2[5] = (x2[5].float() * 1024).to(torch.bfloat16)            # exact in bf16: a power of two
    y2 = smem_gemm_fp8_reference(x2, w_q, w_scale, geglu, split_k)
    others = [i for i in range(10) if i != 5]
    assert torch.equal(y2[others], y[others])
    if not geglu:                                                 # linear in the row: the same E4M3 codes, x 2^10
        assert torch.allclose(y2[5].float(), y[5].float() * 1024, rtol=1e-2, atol=0)


def test_reference_quantizes_onto_the_e4m3_maximum_per_k_slice():
    """Each K slice of a row is scaled by its own maximum: a slice holding one large value does not flush the
    other slice's small values (split 2 keeps them; one scale for the row loses them)."""
    k = 128
    w = torch.eye(k)[:64].to(torch.bfloat16)                      # y[:, j] = x[:, j]
    w_q, w_scale = quantize_rows(w, torch.float8_e4m3fn)
    x = torch.full((1, k), 1e-3)
    x[0, 100] = 1e3                                               # the second 64-column slice's maximum
    x = x.to(torch.bfloat16)
    one = smem_gemm_fp8_reference(x, w_q, w_scale, split_k=1).float()
    two = smem_gemm_fp8_reference(x, w_q, w_scale, split_k=2).float()
    assert torch.count_nonzero(one) == 0                          # 1e-3 * 448 / 1e3 rounds to zero in E4M3
    assert torch.allclose(two, x[:, :64].float(), rtol=0.07, atol=0)
    assert E4M3_MAX == torch.finfo(torch.float8_e4m3fn).max


@pytest.mark.parametrize("name", ["pi05", "pi0"])
def test_every_candidate_serves_the_expert_shapes_at_horizon_10(name):
    for kind, (n, k) in get_config(name).expert.layer_gemm_shapes().items():
        for cfg in SMEM_CANDIDATES[kind]:
            for rows in (1, 10, 11, 16):
                assert smem_gemm_fp8_supported(rows, n, k, kind == "gate_up", cfg.split_k), (name, kind, cfg, rows)
            assert not smem_gemm_fp8_supported(17, n, k, kind == "gate_up", cfg.split_k)   # horizon 50: not served


def test_shape_rules_refuse_what_the_kernel_cannot_do():
    assert not smem_gemm_fp8_supported(0, 1024, 1024, False, 1)
    assert not smem_gemm_fp8_supported(10, 1024, 1000, False, 1)        # K slices of whole 64-column boxes
    assert not smem_gemm_fp8_supported(10, 1024, 1024, False, 32)       # a 32-column slice
    assert not smem_gemm_fp8_supported(10, 1000, 1024, False, 1)        # whole 64-row weight tiles
    assert not smem_gemm_fp8_supported(10, 8192, 1024, True, 2)         # no split-K with GeGLU
    assert not smem_gemm_fp8_supported(10, 1024, 16384, False, 1)       # 1 MB of E4M3: beyond shared memory
    assert smem_gemm_fp8_supported(10, 1024, 1024, False, 1)            # 112 KB of weight and x slices: fits
    assert not smem_gemm_fp8_supported(10, 1024, 2048, False, 1)        # 224 KB: does not


@pytest.mark.skipif(not HAVE_GLUON, reason="Triton has no Gluon here")
def test_launcher_names_a_wrong_input():
    """Checked before any launch, so on the CPU too: bf16 weights where E4M3 are due, row scales of the wrong
    shape, too many rows."""
    x = torch.zeros(10, 1024, dtype=torch.bfloat16)
    w = torch.zeros(1024, 1024, dtype=torch.bfloat16)
    w_q, w_scale = quantize_rows(w, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="float8_e4m3fn W"):
        smem_gemm_fp8(x, w, w_scale)
    with pytest.raises(ValueError, match="w_scale must be a contiguous \\(1024,\\) fp32"):
        smem_gemm_fp8(x, w_q, w_scale[:512])
    with pytest.raises(ValueError, match="M<=16"):
        smem_gemm_fp8(torch.zeros(17, 1024, dtype=torch.bfloat16), w_q, w_scale)


def test_kernel_compiles_for_sm90_as_designed():
    """Every candidate compiles for sm90 with no spill and within one SM's shared memory; its PTX issues the E4M3
    weight slice (one TMA copy per box, two with GeGLU: gate and up rows) before the PDL wait and x's boxes after
    it, quantizes x after the wait and multiplies on wgmma's E4M3 form, two k32 steps per box."""
    pytest.importorskip("triton")
    from tools.kernel_resources import compile_sm90, resources, smem_fp8_configs, tma_copies_around_pdl_wait
    configs = smem_fp8_configs()
    if not configs:
        pytest.skip("Triton has no Gluon here")
    assert {c.name.split()[3] for c in configs} == {"qkv", "gate_up", "o", "down"}
    for cfg in configs:
        compiled = compile_sm90(cfg)
        r = resources(compiled)
        assert r["stack_bytes"] == 0 and r["shared_bytes"] <= 227 * 1024, (cfg.name, r)
        ptx = compiled.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        boxes = cfg.constexprs["K_PER_SPLIT"] // 64
        before, after = tma_copies_around_pdl_wait(ptx)
        assert before == boxes * (2 if cfg.constexprs["GEGLU"] else 1) and after == boxes, (cfg.name, before, after)
        assert ptx.count("wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3") == 2 * boxes, cfg.name
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx[wait:], cfg.name


def test_tuning_weighs_the_fp8_kernel_beside_the_bf16_one_and_runs_each_on_its_weights(monkeypatch):
    """With FP8 decoder GEMM weights and smem_gemm_fp8, each kind's shared-memory candidates are the bf16 ones and
    their FP8 twins (the tuning keeps the faster per kind); an FP8 pick runs kernels/flashrt_kernels/smem_gemm_fp8.py on the E4M3
    copy (checked against the library GEMM like every candidate), a bf16 pick kernels/flashrt_kernels/smem_gemm.py on the bf16
    weights; pi0's untuned time-MLP GEMM, which has no E4M3 copy, gets an FP8 pick's bf16 twin. The fold of the
    adaRMSNorm is not offered with FP8 decoder weights."""
    import types

    from flashrt_core.engine.dispatch import EngineOptions, resolve
    from flashrt_core.engine.hardware import CPU
    from flashrt_core.engine.ops import Ops, SmemConfig
    from flashrt_core.engine.weights import Linear

    ops = Ops(resolve(CPU, EngineOptions()))
    assert not ops.smem_gemm_fp8 and ops.smem_candidates("o") == SMEM_CANDIDATES["o"]     # bf16 weights: no twins
    ops.smem_gemm = ops.decoder_fp8 = ops.smem_gemm_fp8 = True           # what resolve() gives on an H200
    assert [str(c) for c in ops.smem_candidates("o")] == ["gluon_smem(s2)", "gluon_smem(s4)", "gluon_smem(s8)",
                                                          "gluon_smem_fp8(s2)", "gluon_smem_fp8(s4)",
                                                          "gluon_smem_fp8(s8)"]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(10, 256, generator=g).to(torch.bfloat16)
    w = (torch.randn(128, 256, generator=g) / 16).to(torch.bfloat16)
    lin = Linear([(w, None)])
    lin.w_fp8 = quantize_rows(w, torch.float8_e4m3fn)
    calls = []
    ops.k = types.SimpleNamespace(**{n: getattr(ops.k, n) for n in ops.k.__all__})     # this Ops' own kernels

    def fp8_kernel(x, w_q, w_scale, geglu=False, split_k=1, pdl=False):
        calls.append(("fp8", w_q.dtype))
        y = smem_gemm_fp8_reference(x, w_q, w_scale, geglu, split_k)
        return y if split_k == 1 else torch.stack([y.float()] + [torch.zeros_like(y.float())] * (split_k - 1))

    def bf16_kernel(x, w, geglu=False, split_k=1, pdl=False):
        calls.append(("bf16", w.dtype))
        return ops.k.skinny_gemm_reference(x, w, geglu, split_k)
    ops.k.smem_gemm_fp8, ops.k.smem_gemm = fp8_kernel, bf16_kernel
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))    # the GPU-only conditions, on the CPU
    assert ops._smem_ok(x, lin, "o", SmemConfig(4, fp8=True)) and ops._smem_ok(x, lin, "o", SmemConfig(4))
    ops.check_candidate("o", SmemConfig(4, fp8=True), x, lin)            # within the FP8 bound of the library GEMM
    ops.decoder(x, lin, "o", SmemConfig(4))
    assert calls == [("fp8", torch.float8_e4m3fn), ("bf16", torch.bfloat16)]
    no_copy = Linear([(w, None)])
    assert not ops._smem_ok(x, no_copy, "o", SmemConfig(4, fp8=True))   # no E4M3 copy: not a candidate
    ops.decoder_impl["qkv"] = SmemConfig(1, fp8=True)
    assert ops.plain_pick("qkv") == SmemConfig(1)
    ops.ada_fold = True
    ops.decoder_impl.update({k: SmemConfig(c[0].split_k) for k, c in SMEM_CANDIDATES.items()})
    assert not ops.ada_fold_applies(10)
