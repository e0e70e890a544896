"""pi0.5's fused denoising-step ends (kernels/flashrt_kernels/denoise_step.py, Op.FUSED_DENOISE_STEP), on the CPU: the references equal
the separate ops they replace (input projection, copy and first adaRMSNorm; final adaRMSNorm, output projection
and Euler step), the launchers name bad arguments, and the switch. The Triton kernels run in
test/gpu/test_kernels.py (GPU, and the CPU interpreter in CI's second pass) and the engine's wiring of them in
test/gpu/test_engine_interpreted.py."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.engine.options import EngineOptions

from flashrt_core.engine.dispatch import Op, resolve
from flashrt_core.engine.hardware import detect_hardware
from flashrt_core.engine.kernel_import import load_kernels

K = load_kernels()


def _vectors(g, n, k):
    return [torch.randn(n, generator=g) * (1 if i else 0.5) + (1 if i == 0 else 0) for i in range(k)]


@pytest.mark.parametrize("rows,width", [(10, 1024), (3, 32)])
def test_step_in_is_projection_then_the_first_norm(rows, width):
    g = torch.Generator().manual_seed(rows)
    x_t = torch.randn(rows, 32, generator=g)
    w_in, b_in = torch.randn(width, 32, generator=g) / 6, torch.randn(width, generator=g)
    scale1p, shift = _vectors(g, width, 2)
    residual, y = K.denoise_step_in_reference(x_t, w_in, b_in, scale1p, shift, 1e-6, torch.float32)
    a = torch.nn.functional.linear(x_t, w_in, b_in)
    want_y, want_h = K.ada_rms_norm_reference(None, a, None, scale1p, shift, 1e-6, out_dtype=torch.float32)
    torch.testing.assert_close(residual, want_h)
    torch.testing.assert_close(y, want_y)


@pytest.mark.parametrize("splits", [0, 1, 4])
def test_step_out_is_the_final_norm_projection_and_euler(splits):
    g = torch.Generator().manual_seed(splits)
    rows, width, horizon, dt = 11, 256, 10, -0.1
    x = torch.randn(*((splits,) if splits else ()), rows, width, generator=g)
    residual = torch.randn(rows, width, generator=g) * 3
    gate, scale1p, shift = _vectors(g, width, 3)
    w_out, b_out = torch.randn(32, width, generator=g) / 16, torch.randn(32, generator=g)
    x_t = torch.randn(horizon, 32, generator=g)
    want = x_t.clone()
    y, _ = K.ada_rms_norm_reference(x, residual, gate, scale1p, shift, 1e-6, out_dtype=torch.float32)
    K.euler_reference(want, y[rows - horizon:] @ w_out.T, b_out, dt)
    got = K.denoise_step_out_reference(x, residual, gate, scale1p, shift, w_out, b_out, x_t, dt, 1e-6)
    assert got is x_t
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_launchers_name_bad_arguments():
    x_t, w = torch.zeros(10, 32), torch.zeros(64, 32)
    v = torch.zeros(64)
    with pytest.raises(ValueError, match="x_t contiguous fp32"):
        K.denoise_step_in(x_t.double(), w, None, v, v, torch.zeros(10, 64), torch.zeros(10, 64))
    with pytest.raises(ValueError, match="shift must be a contiguous"):
        K.denoise_step_in(x_t, w, None, v, torch.zeros(32), torch.zeros(10, 64), torch.zeros(10, 64))
    with pytest.raises(ValueError, match="x must be"):
        K.denoise_step_out(torch.zeros(10, 32), torch.zeros(10, 64), v, v, v, torch.zeros(32, 64), None, x_t, -0.1)
    with pytest.raises(ValueError, match="H <= 10"):
        K.denoise_step_out(torch.zeros(10, 64), torch.zeros(10, 64), v, v, v, torch.zeros(32, 64), None,
                           torch.zeros(11, 32), -0.1)


def test_fused_denoise_step_is_the_default_with_triton_and_has_its_switches(monkeypatch):
    monkeypatch.setattr("flashrt_core.engine.dispatch._triton", lambda hw, o: hw.is_gpu and o.fast_paths)
    sm90 = detect_hardware("sm90")
    assert resolve(sm90)[Op.FUSED_DENOISE_STEP] == "fused"
    assert resolve(sm90, EngineOptions(fused_denoise_step=False))[Op.FUSED_DENOISE_STEP] == "separate"
    # the variable overrides the options it is applied to, both ways; empty counts as unset
    for base, value, expected in ((None, "0", "separate"), (EngineOptions(fused_denoise_step=True), "0", "separate"),
                                  (EngineOptions(fused_denoise_step=False), "1", "fused"), (None, "1", "fused"),
                                  (None, "", "fused"), (EngineOptions(fused_denoise_step=False), "", "separate")):
        options = EngineOptions.from_env(base, env={"FLASHRT_FUSED_DENOISE_STEP": value})
        assert resolve(sm90, options)[Op.FUSED_DENOISE_STEP] == expected, (base, value)
    assert resolve(sm90, EngineOptions(fast_paths=False))[Op.FUSED_DENOISE_STEP] == "separate"
    assert resolve(detect_hardware("cpu"), EngineOptions(fused_denoise_step=True))[Op.FUSED_DENOISE_STEP] == "separate"
