"""FP8 E4M3 for the backbone's MLP GEMMs (gate/up and down: ~85% of the backbone's FLOPs).

Measured on the H200 with full-size random weights (docs/benchmarks/engine_h200_2026-11-29_notes.md), this scope
passes the 0.998 accuracy gate at cosine 0.9995; wider scopes do not (docs/engine.md, "Tried and rejected").

Per-tensor static scales:
    W_q = W / s_w,  s_w = amax(W) / fmax                    (weights, once at load)
    x_q = clamp(x / s_x),  s_x = amax(x on a real observation) * CALIB_MARGIN / fmax     (activations, calibrated)
    y   = (x_q @ W_q^T) * s_x * s_w + b                     (torch._scaled_mm, bf16 out)
cuBLASLt's FP8 GEMM on Hopper moves the tensor cores' partial sums into fp32 registers every few K steps (exact
accumulation; the down GEMM has K = 16384).

The 10-51-row decoder GEMMs stay bf16: they are bound by reading the weights. fmax: 448 for OCP e4m3fn (NVIDIA
sm89+, gfx950), 240 for e4m3fnuz (gfx942). Calibration runs the bf16 engine eagerly once on the first
observation, recording each GEMM input's amax.
"""

from __future__ import annotations

import logging

import torch

from .kernel_import import load_kernels
from .weights import EngineWeights, Linear

log = logging.getLogger(__name__)

CALIB_MARGIN = 1.25   # head-room over the calibration amax for other observations (values beyond saturate)
FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


class Fp8Linear:
    """y = x @ W^T + b through torch._scaled_mm with static per-tensor scales; x is quantized by
    kernels/flashrt_kernels/fp8_quant.py, or by the kernel that produces it (matmul_quantized)."""

    def __init__(self, lin: Linear, x_amax: float, dtype: torch.dtype):
        (w, b), = lin.parts
        fmax = torch.finfo(dtype).max
        w32 = w.float()
        w_scale = w32.abs().max().clamp(min=1e-12) / fmax
        self.w_scale = w_scale.reshape(()).float()
        self.w_q = (w32 / w_scale).clamp(-fmax, fmax).to(dtype)
        x_scale = max(x_amax, 1e-6) * CALIB_MARGIN / fmax
        self.x_scale = torch.tensor(x_scale, device=w.device, dtype=torch.float32)
        self.x_inv = torch.tensor([1.0 / x_scale], device=w.device, dtype=torch.float32)
        self.bias = None if b is None else b.to(torch.bfloat16)
        self.dtype = dtype
        self._quant = load_kernels().fp8_quant

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


def quantize_wide(w: EngineWeights, amax: dict[int, float], fmt: str) -> int:
    """Attach Fp8Linear to every GEMM of wide_linears whose input amax was calibrated. Returns how many.
    Weights shared with an executor that quantized them already keep its Fp8Linear."""
    dtype = FP8_DTYPES[fmt]
    count = 0
    for lin in wide_linears(w):
        if lin.fp8 is not None:          # weights shared with an executor that calibrated them already
            count += 1
            continue
        if id(lin) not in amax:
            raise ValueError("FP8 calibration did not see every wide GEMM; run it on a full observation")
        if len(lin.parts) != 1:
            raise ValueError("FP8 needs merged weights (fused_weights on)")
        lin.fp8 = Fp8Linear(lin, amax[id(lin)], dtype)
        count += 1
    log.info("FP8 %s (per-tensor static scales) on %d backbone MLP GEMMs (activation margin %.2f)", fmt, count,
             CALIB_MARGIN)
    return count
