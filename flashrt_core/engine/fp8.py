"""FP8 E4M3 for the wide GEMMs (vision tower and prefix backbone), on the scope that EngineOptions.fp8_scope names.

Default scope "backbone_mlp": the backbone's gate/up and down GEMMs (~85% of its FLOPs). Measured on the H200 with
full-size random weights (docs/benchmarks/engine_h200_2026-11-29_notes.md), FP8 on every wide GEMM ("all") misses
the 0.998 accuracy gate (cosine 0.991 per-tensor, 0.994 row-wise), "backbone" passes at 0.9989 and "backbone_mlp"
at 0.9995 (both scalings).

Scaling "tensor" (the issue's per-tensor static scales):
    W_q = W / s_w,  s_w = amax(W) / fmax                    (weights, once at load)
    x_q = clamp(x / s_x),  s_x = amax(x on a real observation) * CALIB_MARGIN / fmax     (activations, calibrated)
    y   = (x_q @ W_q^T) * s_x * s_w + b                     (torch._scaled_mm, bf16 out)
Accumulation: cuBLASLt's FP8 GEMM on Hopper by default moves the tensor cores' partial sums into fp32 registers every
few K steps (its slow, exact accumulation); `fast_accum` (EngineOptions.fp8_fast_accum, opt-in until measured: the
accuracy gate and the bench part's A/B row) lets the tensor cores accumulate the whole K loop themselves
(torch._scaled_mm's use_fast_accum), which is faster and less exact for long K (the down GEMM: K = 16384).
Scaling "row": per-output-channel weight scales s_w[n] and per-token activation scales s_x[m] computed in the
graph by kernels/flashrt_kernels/fp8_quant.py (rowwise torch._scaled_mm): y[m, n] = (x_q @ W_q^T)[m, n] * s_x[m] * s_w[n] + b[n].

The 10-51-row decoder GEMMs keep bf16 activations: they are bound by reading the weights and FP8 activations add
a quantization pass (the seed project measured FP8 slower there). Opt-in `fp8_decoder_weights` stores their
weights in E4M3 with one scale per row (weight-only: `quantize_expert_weights`, kernels/flashrt_kernels/skinny_gemm.py widens the
tiles), halving the bytes they stream. fmax: 448 for OCP e4m3fn (NVIDIA sm89+, gfx950), 240 for e4m3fnuz
(gfx942). Calibration runs the bf16 engine eagerly once on the first observation, recording each GEMM input's amax.
"""

from __future__ import annotations

import logging

import torch

from .dispatch import FP8_SCOPES
from .kernel_import import load_kernels
from .weights import EXPERT_GEMMS, EngineWeights, Linear

log = logging.getLogger(__name__)

CALIB_MARGIN = 1.25   # head-room over the calibration amax for other observations (values beyond saturate)
FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
SCALINGS = ("tensor", "row")


class Fp8Linear:
    """y = x @ W^T + b through torch._scaled_mm with static scales; x is quantized by kernels/flashrt_kernels/fp8_quant.py."""

    def __init__(self, lin: Linear, x_amax: float, dtype: torch.dtype, scaling: str = "tensor",
                 fast_accum: bool = False):
        if scaling not in SCALINGS:
            raise ValueError(f"FP8 scaling must be one of {SCALINGS}, got {scaling!r}")
        (w, b), = lin.parts
        fmax = torch.finfo(dtype).max
        self.rowwise = scaling == "row"
        if self.rowwise:                                                   # (N, K) row-major = (K, N) col-major
            self.w_q, w_scale = quantize_rows(w, dtype)
            self.w_scale = w_scale[None, :].contiguous()                   # (1, N)
        else:
            w32 = w.float()
            w_scale = w32.abs().max().clamp(min=1e-12) / fmax
            self.w_scale = w_scale.reshape(()).float()
            self.w_q = (w32 / w_scale).clamp(-fmax, fmax).to(dtype)
        x_scale = max(x_amax, 1e-6) * CALIB_MARGIN / fmax
        self.x_scale = torch.tensor(x_scale, device=w.device, dtype=torch.float32)
        self.x_inv = torch.tensor([1.0 / x_scale], device=w.device, dtype=torch.float32)
        self.bias = None if b is None else b.to(torch.bfloat16)
        self.dtype = dtype
        self.fast_accum = bool(fast_accum)
        k = load_kernels()
        self._quant, self._quant_rows = k.fp8_quant, k.fp8_quant_rows

    @property
    def static_input(self) -> bool:
        """Per-tensor static activation scale: a producer kernel may quantize x itself (x_inv, dtype) and hand
        the FP8 tensor to matmul_quantized (ops.mlp_down: the GeGLU kernel does, fp8_fused_quant)."""
        return not self.rowwise

    def matmul_quantized(self, xq: torch.Tensor) -> torch.Tensor:
        """y for an x already quantized with this layer's static scale: xq = clamp(x * x_inv) in self.dtype."""
        if self.rowwise or xq.dtype != self.dtype:
            raise ValueError(f"matmul_quantized takes a per-tensor {self.dtype} input, got {xq.dtype} "
                             f"({'row-wise' if self.rowwise else 'per-tensor'} layer)")
        return torch._scaled_mm(xq, self.w_q.t(), scale_a=self.x_scale, scale_b=self.w_scale, bias=self.bias,
                                out_dtype=torch.bfloat16, use_fast_accum=self.fast_accum)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.rowwise:
            xq, x_scale = self._quant_rows(x, self.dtype)                  # (M, K) fp8, (M, 1) fp32
            y = torch._scaled_mm(xq, self.w_q.t(), scale_a=x_scale, scale_b=self.w_scale, out_dtype=torch.bfloat16,
                                 use_fast_accum=self.fast_accum)
            return y if self.bias is None else y.add_(self.bias)
        return self.matmul_quantized(self._quant(x.contiguous(), self.x_inv, self.dtype))   # (M, K) fp8 input


def quantize_rows(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight-only FP8 of a (N, K) weight: (W_q (N, K) in dtype, s (N,) fp32) with W ~= W_q * s[:, None],
    s[n] = amax(|W[n]|) / fmax, computed in fp32."""
    w32 = w.float()
    scale = (w32.abs().amax(dim=1).clamp(min=1e-12) / torch.finfo(dtype).max).contiguous()
    return (w32 / scale[:, None]).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype), scale


def quantize_expert_weights(w: EngineWeights, fmt: str) -> int:
    """Weight-only FP8 (fp8_decoder_weights) of the action expert's four GEMMs per layer: sets Linear.w_fp8 =
    (W_q, s) beside the bf16 weight, which the library GEMM (and the load-time tuning's comparison) still uses.
    Returns how many GEMMs."""
    dtype = FP8_DTYPES[fmt]
    count = 0
    for layer in w.expert:
        for lin in (getattr(layer, name) for name in EXPERT_GEMMS):
            if lin.w_fp8 is not None:          # weights shared with an executor that quantized them already
                count += 1
                continue
            if len(lin.parts) != 1 or lin.parts[0][1] is not None:
                raise ValueError("FP8 decoder weights need merged, bias-free expert GEMMs (fused_weights on)")
            lin.w_fp8 = quantize_rows(lin.parts[0][0], dtype)
            count += 1
    log.info("weight-only FP8 %s on %d decoder GEMMs", fmt, count)
    return count


def wide_linears(w: EngineWeights, scope: str = "backbone_mlp") -> list[Linear]:
    """The GEMMs that FP8 serves (dispatch.FP8_SCOPES): "all" = every vision layer GEMM, the projector and every
    backbone GEMM; "backbone" = the backbone's only; "backbone_mlp" = the backbone's gate/up and down only."""
    if scope not in FP8_SCOPES:
        raise ValueError(f"unknown FP8 scope {scope!r}; scopes: {FP8_SCOPES}")
    out: list[Linear] = []
    if scope == "all":
        for layer in w.vision:
            out += [layer.qkv, layer.out, layer.fc1, layer.fc2]
        out.append(w.projector)
    kinds = ("gate_up", "down") if scope == "backbone_mlp" else ("qkv", "o", "gate_up", "down")
    for layer in w.backbone:
        out += [lin for lin in (getattr(layer, kind) for kind in kinds) if lin is not None]
    return out


def quantize_wide(w: EngineWeights, amax: dict[int, float], fmt: str, scaling: str = "tensor",
                  scope: str = "backbone_mlp", fast_accum: bool = False) -> int:
    """Attach Fp8Linear to every wide GEMM of `scope` whose input amax was calibrated. Returns how many.
    Weights shared with an executor that quantized them already keep its Fp8Linear, which must accumulate as
    asked (`fast_accum`)."""
    dtype = FP8_DTYPES[fmt]
    count = 0
    for lin in wide_linears(w, scope):
        if lin.fp8 is not None:          # weights shared with an executor that calibrated them already
            if lin.fp8.fast_accum != bool(fast_accum):
                raise ValueError(f"shared FP8 weights accumulate with fp8_fast_accum={lin.fp8.fast_accum}, this "
                                 f"executor needs fp8_fast_accum={bool(fast_accum)}: load the weights apart")
            count += 1
            continue
        if id(lin) not in amax:
            raise ValueError("FP8 calibration did not see every wide GEMM; run it on a full observation")
        if len(lin.parts) != 1:
            raise ValueError("FP8 needs merged weights (fused_weights on)")
        lin.fp8 = Fp8Linear(lin, amax[id(lin)], dtype, scaling, fast_accum)
        count += 1
    log.info("FP8 %s (%s scales, scope %s, %s accumulation) on %d wide GEMMs (activation margin %.2f)", fmt, scaling,
             scope, "fast" if fast_accum else "exact", count, CALIB_MARGIN)
    return count
