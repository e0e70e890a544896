"""The vision attention's SDPA backends (ops.Ops.attention, backend=...) compute plain softmax attention over the
strided q / k / v views that forward.vision takes from the QKV GEMM's output, as the token-major rows the O GEMM
reads. On the CPU torch has the default and the flash backend (fp32); test/gpu/test_engine_gpu.py checks every
backend at the real shape on the GPU."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.engine import tuning
from flashrt_core.engine.options import EngineOptions

from flashrt_core.engine.dispatch import Op, resolve
from flashrt_core.engine.hardware import CPU, detect_hardware
from flashrt_core.engine.kernel_configs import VISION_ATTENTION_BACKENDS
from flashrt_core.engine.ops import Ops


def _strided_qkv(views=2, tokens=24, heads=3, dh=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(views, tokens, 3, heads, dh, generator=g)
    return [qkv[:, :, i].transpose(1, 2) for i in range(3)]                        # (V, H, N, dh), strided


def _softmax_attention(q, k, v, scale):
    """(B, H, N, Dh) -> (B * N, H * Dh) token-major rows, as Ops.attention returns them."""
    b, h, n, dh = q.shape
    out = torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) * scale, dim=-1) @ v
    return out.transpose(1, 2).reshape(b * n, h * dh)


@pytest.mark.parametrize("backend", ["default", "flash"])
def test_sdpa_backends_compute_softmax_attention_on_strided_views(backend):
    ops = Ops(resolve(detect_hardware("sm90"), EngineOptions()))           # SDPA on: the GPU's dispatch
    assert ops.vision_attention_backend == "default" and backend in VISION_ATTENTION_BACKENDS
    q, k, v = _strided_qkv()
    assert not q.is_contiguous()
    got = ops.attention(q, k, v, 0.35, backend)
    torch.testing.assert_close(got, _softmax_attention(q, k, v, 0.35), atol=1e-5, rtol=1e-5)


def test_the_tuned_backend_is_the_one_attention_runs():
    ops = Ops(resolve(detect_hardware("sm90"), EngineOptions()))
    q, k, v = _strided_qkv(seed=1)
    ops.vision_attention_backend = "efficient"          # no CPU kernel: running it proves the choice is used
    with pytest.raises(RuntimeError):
        ops.attention(q, k, v, 0.35)
    ops.vision_attention_backend = "flash"
    torch.testing.assert_close(ops.attention(q, k, v, 0.35), _softmax_attention(q, k, v, 0.35), atol=1e-5,
                               rtol=1e-5)


def test_the_cpu_reference_ignores_the_backend():
    ops = Ops(resolve(CPU, EngineOptions()))
    assert resolve(CPU, EngineOptions())[Op.VISION_ATTENTION_TUNING] == "default"
    q, k, v = _strided_qkv(seed=2)
    torch.testing.assert_close(ops.attention(q, k, v, 0.35, "cudnn"), _softmax_attention(q, k, v, 0.35),
                               atol=1e-5, rtol=1e-5)


def test_every_candidate_is_a_torch_sdpa_backend_that_attention_runs():
    """The tuning's candidates are torch's own choice and its fused SDPA backends, nothing hand-written (the
    Triton vision attention was removed after it measured slower on the H200). Ops.attention dispatches each: it
    computes the softmax attention, or, for a backend with no CPU kernel, raises torch's RuntimeError (which the
    tuning treats as "not a candidate here"), never a lookup error for an unknown name."""
    ops = Ops(resolve(detect_hardware("sm90"), EngineOptions()))
    q, k, v = _strided_qkv(seed=3)
    ran = []
    for backend in VISION_ATTENTION_BACKENDS:
        try:
            got = ops.attention(q, k, v, 0.35, backend)
        except RuntimeError:
            continue
        torch.testing.assert_close(got, _softmax_attention(q, k, v, 0.35), atol=1e-5, rtol=1e-5)
        ran.append(backend)
    assert {"default", "flash"} <= set(ran)


def test_the_tuning_leaves_out_a_backend_whose_output_is_wrong(monkeypatch):
    """tune_vision_attention checks each backend's output against the fp32 softmax attention before timing it: a
    backend that computes something else is never kept, however fast. The graph timer (CUDA only) is replaced by a
    counter that makes every later backend look faster; the backends themselves are torch's CPU SDPA."""
    ops = Ops(resolve(detect_hardware("sm90"), EngineOptions()))
    real_attention = ops.attention

    def attention(q, k, v, scale, backend=None):
        out = real_attention(q, k, v, scale, backend)
        return out + 0.5 if backend == "flash" else out          # "flash" is wrong by 0.5 everywhere
    timed = []

    def graph_time_us(fn, reps):
        fn()
        timed.append(len(timed))
        return 100.0 - len(timed)
    monkeypatch.setattr(ops, "attention", attention)
    monkeypatch.setattr(tuning, "graph_time_us", graph_time_us)
    times = tuning.tune_vision_attention(ops, 2, 24, 3, 8, torch.float32, torch.device("cpu"), layers=2)
    assert set(times) == {"default"}           # flash rejected; efficient and cudnn have no CPU kernel
    assert ops.vision_attention_backend == "default" and len(timed) == 1


def test_the_tuning_times_the_rows_the_o_gemm_reads(monkeypatch):
    """What tune_vision_attention times is the call forward.vision makes: the attention with its output moved to
    the (views * tokens, heads * head_dim) rows the O GEMM reads, so a backend that writes head-major pays for
    its copy in the timing too."""
    ops = Ops(resolve(detect_hardware("sm90"), EngineOptions()))
    shapes = []

    def graph_time_us(fn, reps):
        shapes.append({tuple(out.shape) for out in fn()})
        return 10.0
    monkeypatch.setattr(tuning, "graph_time_us", graph_time_us)
    tuning.tune_vision_attention(ops, 2, 24, 3, 8, torch.float32, torch.device("cpu"), layers=2)
    assert shapes and all(s == {(2 * 24, 3 * 8)} for s in shapes), shapes
