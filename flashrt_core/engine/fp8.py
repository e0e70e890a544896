"""FP8 E4M3 for the backbone's MLP GEMMs (gate/up and down: ~85% of the backbone's FLOPs).

Measured on the H200 with full-size random weights (docs/engine.md, "Tried and rejected"), this scope
passes the 0.998 accuracy gate at cosine 0.9995; wider scopes do not (docs/engine.md, "Tried and rejected").

Per-tensor static scales:
    W_q = W / s_w,  s_w = amax(W) / fmax                    (weights, once at load)
    x_q = clamp(x / s_x),  s_x = amax(x on a real observation) * CALIB_MARGIN / fmax     (activations, calibrated)
    y   = (x_q @ W_q^T) * s_x * s_w + b                     (torch._scaled_mm, bf16 out)
cuBLASLt's FP8 GEMM on Hopper moves the tensor cores' partial sums into fp32 registers every few K steps (exact
accumulation; the down GEMM has K = 16384).

The 10-51-row decoder GEMMs stay bf16: they are bound by reading the weights. fmax: 448 for OCP e4m3fn (NVIDIA
sm89+, gfx950), 240 for e4m3fnuz (gfx942). The activation scales come from real observations
(engine/fp8_calibration.py): the bf16 engine runs eagerly on each, recording each GEMM input's amax. Until then the
layers hold placeholder scales (`calibrated` False) so that graphs can be captured; setting the scales writes the
scale tensors in place, which captured graphs read at replay.
"""

from __future__ import annotations

import logging

import torch

from .kernel_import import load_kernels
from .weights import EngineWeights, Linear

log = logging.getLogger(__name__)

CALIB_MARGIN = 1.25   # head-room over the calibration amax for other observations (values beyond saturate)
FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}


@torch.no_grad()
def weight_only_fp8(lin: Linear, dtype: torch.dtype) -> Linear:
    """Weight-only FP8 for one-row GEMMs (pi0-FAST's decoding steps, bound by reading the weights): lin.w8 =
    (W / s, s) with s = amax(W[n]) / fmax per output channel, so no activation is quantized and nothing needs
    calibrating. The bf16 weights stay (the prefill's many-row GEMMs read them). One block, no bias. Returns lin."""
    (w, b), = lin.parts
    if b is not None:
        raise ValueError("weight_only_fp8: the layer has a bias; only bias-free one-block layers are served")
    scale = torch.empty(w.shape[0], device=w.device, dtype=torch.float32)
    q = torch.empty(w.shape, device=w.device, dtype=dtype)
    for start in range(0, w.shape[0], 16384):                      # row blocks: the LM head is 257,152 rows
        rows = w[start:start + 16384].float()
        s = rows.abs().amax(dim=1).clamp_min(1e-12) / FP8_MAX[dtype]
        scale[start:start + 16384] = s
        q[start:start + 16384] = (rows / s[:, None]).to(dtype)
    lin.w8 = (q, scale)
    return lin


class Fp8Linear:
    """y = x @ W^T + b through torch._scaled_mm with static per-tensor scales; x is quantized by
    kernels/flashrt_kernels/fp8_quant.py, or by the kernel that produces it (matmul_quantized)."""

    def __init__(self, lin: Linear, x_amax: float | None, dtype: torch.dtype):
        """x_amax: the calibrated amax of the layer's input; None = a placeholder scale (calibrated False) that
        set_input_amax replaces."""
        (w, b), = lin.parts
        fmax = torch.finfo(dtype).max
        w32 = w.float()
        w_scale = w32.abs().max().clamp(min=1e-12) / fmax
        self.w_scale = w_scale.reshape(()).float()
        self.w_q = (w32 / w_scale).clamp(-fmax, fmax).to(dtype)
        with torch.inference_mode():         # inference tensors wherever this runs: set_input_amax updates them
            self.x_scale = torch.ones((), device=w.device, dtype=torch.float32)
            self.x_inv = torch.ones(1, device=w.device, dtype=torch.float32)
        self.x_amax: float | None = None
        self.bias = None if b is None else b.to(torch.bfloat16)
        self.dtype = dtype
        kernels = load_kernels()
        # the Triton kernel on a GPU (or under Triton's interpreter); the same math in torch ops on the CPU
        self._quant = kernels.fp8_quant if w.device.type != "cpu" or kernels.INTERPRETED \
            else kernels.fp8_quant_reference
        if x_amax is not None:
            self.set_input_amax(x_amax)

    @property
    def calibrated(self) -> bool:
        return self.x_amax is not None

    def set_input_amax(self, x_amax: float) -> None:
        """The input's static scale from its calibrated amax, written into the scale tensors in place: graphs
        captured before (with a placeholder or older scale) read the new one at their next replay."""
        if not (x_amax >= 0.0 and x_amax < float("inf")):
            raise ValueError(f"FP8 calibration amax must be finite and >= 0, got {x_amax!r}")
        x_scale = max(float(x_amax), 1e-6) * CALIB_MARGIN / torch.finfo(self.dtype).max
        with torch.inference_mode():
            self.x_scale.fill_(x_scale)
            self.x_inv.fill_(1.0 / x_scale)
        self.x_amax = float(x_amax)

    def matmul_quantized(self, xq: torch.Tensor) -> torch.Tensor:
        """y for an x already quantized with this layer's static scale: xq = clamp(x * x_inv) in self.dtype
        (ops.mlp_down: the GeGLU kernel writes it, fp8_fused_quant)."""
        if xq.dtype != self.dtype:
            raise ValueError(f"matmul_quantized takes a {self.dtype} input, got {xq.dtype}")
        return torch._scaled_mm(xq, self.w_q.t(), scale_a=self.x_scale, scale_b=self.w_scale, bias=self.bias,
                                out_dtype=torch.bfloat16, use_fast_accum=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul_quantized(self._quant(x.contiguous(), self.x_inv, self.dtype))   # (M, K) fp8 input


def wide_linears(w: EngineWeights) -> list[Linear]:
    """The GEMMs that FP8 serves: the backbone's gate/up and down."""
    out: list[Linear] = []
    for layer in w.backbone:
        out += [lin for lin in (layer.gate_up, layer.down) if lin is not None]
    return out


def quantize_wide(w: EngineWeights, amax: dict[int, float] | None, fmt: str) -> int:
    """Attach Fp8Linear to every GEMM of wide_linears, with the input amax calibrated for it (amax: id(Linear) ->
    amax), or placeholder scales where amax is None. Returns how many. Weights shared with an executor that
    quantized them already keep its Fp8Linear."""
    dtype = FP8_DTYPES[fmt]
    count = 0
    for lin in wide_linears(w):
        if lin.fp8 is not None:          # weights shared with an executor that quantized them already
            count += 1
            continue
        if amax is not None and id(lin) not in amax:
            raise ValueError("FP8 calibration did not see every wide GEMM; run it on a full observation")
        if len(lin.parts) != 1:
            raise ValueError("FP8 needs merged weights (fused_weights on)")
        lin.fp8 = Fp8Linear(lin, None if amax is None else amax[id(lin)], dtype)
        count += 1
    log.info("FP8 %s (per-tensor static scales%s) on %d backbone MLP GEMMs (activation margin %.2f)", fmt,
             "" if amax is not None else ", placeholders until calibrated", count, CALIB_MARGIN)
    return count
