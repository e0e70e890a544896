"""pi0.5's adaRMSNorm folded into the GEMMs around it (kernels/flashrt_kernels/smem_gemm.py norm_out / norm_in, Op.ADA_NORM_FOLD),
on the CPU: the algebra of the two halves against the norm followed by the GEMM, their argument checks, the switch,
and the denoiser's wiring of them (which modulation vector goes to which GEMM) through the plain-PyTorch references.
The Gluon kernels themselves run in test/gpu/test_kernels.py and the engine's accuracy gate in
test/gpu/test_engine_gpu.py."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import EngineOptions, Op, resolve
from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.engine.hardware import detect_hardware
from flashrt_core.engine.kernel_import import load_kernels
from flashrt_core.engine.ops import SMEM_CANDIDATES, Ops
from flashrt_core.fixtures import write_random_checkpoint

K = load_kernels()
# x' = h * (1 + scale) is rounded to bf16 where the separate norm rounds its output: the same order of error
FOLD_VS_NORM_REL = 1e-2


def _norm_then_gemm(x, w, residual, gate, scale1p, shift, eps):
    y, h = K.ada_rms_norm_reference(x, residual, gate, scale1p, shift, eps, out_dtype=torch.float32)
    return y @ w.float().T, h


@pytest.mark.parametrize("rows,width,n", [(10, 1024, 2560), (1, 256, 128), (16, 128, 64)])
def test_norm_out_then_norm_in_is_the_norm_then_the_gemm(rows, width, n):
    g = torch.Generator().manual_seed(rows + width)
    w_prev = torch.randn(width, 2 * width, generator=g) * (2 * width) ** -0.5
    w_next = torch.randn(n, width, generator=g) * width ** -0.5
    x = torch.randn(rows, 2 * width, generator=g)
    residual = torch.randn(rows, width, generator=g) * 3
    gate, shift = torch.randn(width, generator=g), torch.randn(width, generator=g)
    scale1p = 1 + 0.5 * torch.randn(width, generator=g)
    eps = 1e-6
    want, want_h = _norm_then_gemm(x @ w_prev.T, w_next, residual, gate, scale1p, shift, eps)
    h, xs, sq = K.smem_gemm_norm_out_reference(x, w_prev, residual, gate, scale1p)
    assert xs.dtype == torch.bfloat16 and sq.shape == (width // 64, rows)
    torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-4)
    sq16 = torch.zeros(width // 64, 16)
    sq16[:, :rows] = sq
    bias = shift @ w_next.T
    got = K.smem_gemm_norm_in_reference(xs.float(), w_next, sq16, bias, eps)
    assert (got - want).norm() / want.norm() < FOLD_VS_NORM_REL
    if n % 2 == 0:                                   # GeGLU: the scale and bias before the activation
        a, b = want.chunk(2, -1)
        want_geglu = torch.nn.functional.gelu(a, approximate="tanh") * b
        got_geglu = K.smem_gemm_norm_in_reference(xs.float(), w_next, sq16, bias, eps, geglu=True)
        assert (got_geglu - want_geglu).norm() / want_geglu.norm() < FOLD_VS_NORM_REL


def test_fold_arguments_are_checked_by_name():
    norm_out = K.NormOut(residual=torch.zeros(10, 1024), gate=torch.zeros(1024), scale1p=torch.zeros(1024),
                         xs=torch.zeros(10, 1024, dtype=torch.bfloat16), sq=torch.zeros(16, 16),
                         counter=torch.zeros(16, dtype=torch.int32))
    norm_out.check(10, 1024)
    with pytest.raises(ValueError, match="xs must be a contiguous"):
        dataclasses.replace(norm_out, xs=torch.zeros(10, 1024)).check(10, 1024)
    with pytest.raises(ValueError, match="counter must be"):
        dataclasses.replace(norm_out, counter=torch.zeros(8, dtype=torch.int32)).check(10, 1024)
    norm_in = K.NormIn(sq=torch.zeros(16, 16), bias=torch.zeros(2560), eps=1e-6)
    norm_in.check(10, 2560, 1024)
    with pytest.raises(ValueError, match="bias must be"):
        norm_in.check(10, 8192, 1024)
    with pytest.raises(ValueError, match="power of two"):
        K.NormIn(sq=torch.zeros(3, 16), bias=torch.zeros(64), eps=1e-6).check(10, 64, 192)


def _env(**kv):
    return EngineOptions.from_env(env={k: str(v) for k, v in kv.items()})


def test_fold_is_opt_in_with_the_tma_gemms_and_has_its_switches(monkeypatch):
    """Measured slower on the H200 (session 10), so off unless asked; asked for, it needs the TMA GEMMs."""
    monkeypatch.setattr("flashrt_core.engine.dispatch._triton", lambda hw, o: hw.is_gpu and o.fast_paths)
    monkeypatch.setattr("flashrt_core.engine.dispatch._gluon_available", lambda: True)
    sm90 = detect_hardware("sm90")
    assert resolve(sm90)[Op.ADA_NORM_FOLD] == "separate"
    assert resolve(sm90, EngineOptions(ada_norm_fold=True))[Op.ADA_NORM_FOLD] == "gemm_epilogue"
    assert resolve(sm90, _env(FLASHRT_ADA_NORM_FOLD=1))[Op.ADA_NORM_FOLD] == "gemm_epilogue"
    assert resolve(sm90, _env(FLASHRT_ADA_NORM_FOLD=1, FLASHRT_DISABLE_ADA_NORM_FOLD=1))[Op.ADA_NORM_FOLD] \
        == "separate"                                                                    # DISABLE wins
    assert resolve(sm90, _env(FLASHRT_ADA_NORM_FOLD=1, FLASHRT_DISABLE_SMEM_GEMM=1))[Op.ADA_NORM_FOLD] \
        == "separate"                                                                    # its GEMMs
    asked = EngineOptions(ada_norm_fold=True)
    assert resolve(detect_hardware("sm80"), asked)[Op.ADA_NORM_FOLD] == "separate"        # no TMA GEMM
    assert resolve(detect_hardware("cpu"), asked)[Op.ADA_NORM_FOLD] == "separate"


def _smem_gemm_by_reference(x, w, geglu=False, split_k=1, pdl=False, out=None, norm_in=None, norm_out=None):
    """kernels/flashrt_kernels/smem_gemm.py's contract in plain PyTorch, buffers included, for the CPU wiring test."""
    if norm_out is not None:
        h, xs, sq = K.smem_gemm_norm_out_reference(x, w, norm_out.residual, norm_out.gate, norm_out.scale1p)
        norm_out.residual.copy_(h)
        norm_out.xs.copy_(xs)
        norm_out.sq[:, :x.shape[0]].copy_(sq)
        return norm_out.xs
    if norm_in is not None:
        return K.smem_gemm_norm_in_reference(x, w, norm_in.sq, norm_in.bias, norm_in.eps, geglu)
    return K.skinny_gemm_reference(x, w, geglu, split_k)


@pytest.fixture(scope="module")
def wide_expert_model(tmp_path_factory):
    """Tiny pi0.5 whose expert is 128 wide (two 64-column tiles per norm), the narrowest the fold serves."""
    base = get_config("pi05_tiny")
    cfg = base.replace(name="pi05_tiny_wide_expert",
                       expert=dataclasses.replace(base.expert, width=128, mlp_dim=256))
    ckpt = tmp_path_factory.mktemp("pi05_wide_expert")
    write_random_checkpoint(ckpt, cfg, seed=5)
    return load_model_weights(ckpt, cfg, "cpu", torch.float32)


def test_denoiser_wires_the_fold_like_the_separate_norms(wide_expert_model, monkeypatch):
    """The same engine (CPU, fp32) with the fold and without: the fold's GEMMs run as their references, so any
    difference beyond the bf16 rounding of x' is the forward passing a wrong gate, scale, shift or buffer."""
    from test_engine_forward import _dispatch, _inputs
    model = wide_expert_model
    cfg = model.config
    images, tokens, mask, state, noise = _inputs(cfg, np.random.default_rng(2), 7, (0, 1))
    engine = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32)
    want = engine.predict_observation(images, tokens, mask, state, noise)

    folded = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32,
                            weights=engine.weights)
    ops = folded.ops
    ops.k = types.SimpleNamespace(**{n: getattr(K, n) for n in K.__all__})
    ops.k.smem_gemm = _smem_gemm_by_reference
    monkeypatch.setattr(Ops, "_smem_ok", lambda self, x, lin, kind, c: True)
    ops.decoder_impl = {kind: cands[0] for kind, cands in SMEM_CANDIDATES.items()}
    ops.ada_fold = True
    calls = []
    real_decoder = Ops.decoder

    def counting_decoder(self, x, lin, kind, *a, norm_in=None, norm_out=None, **kw):
        calls.append((kind, norm_in is not None, norm_out is not None))
        return real_decoder(self, x, lin, kind, *a, norm_in=norm_in, norm_out=norm_out, **kw)
    monkeypatch.setattr(Ops, "decoder", counting_decoder)
    got = folded.predict_observation(images, tokens, mask, state, noise)
    assert folded._entries and all(e.ws.ada_fold is not None for e in folded._entries.values())
    depth, steps = cfg.expert.depth, cfg.num_steps
    # per step: QKV folded in every layer but the first, O and gate/up in all, down in all but the last
    assert sum(kind == "qkv" and fin for kind, fin, _ in calls) == steps * (depth - 1)
    assert sum(kind == "o" and fout for kind, _, fout in calls) == steps * depth
    assert sum(kind == "gate_up" and fin for kind, fin, _ in calls) == steps * depth
    assert sum(kind == "down" and fout for kind, _, fout in calls) == steps * (depth - 1)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert err < FOLD_VS_NORM_REL and cos > 0.9999, (err, cos)
