"""Guided real-time chunking (rtc.py mode "guided") in the graph engine: every Euler step's velocity corrected by a
vector-Jacobian product through the action expert, captured in the forward's graph with the rest.

Each step runs the engine's own denoise step (forward.denoise_step, driven by forward.guided_denoise) on GradOps,
the plain-PyTorch form of every op it uses, under autograd (guided_step):

    x          = x_t (a leaf that requires grad)
    x_next     = x + dt * v(x)                      one denoise step (the Euler update inside it)
    x0         = x - t * v = x - (t / dt) (x_next - x)
    correction = J^T (W * (target - x0)),  J = d x0 / d x        torch.autograd.grad: the backward through the step
    x_t       <- x_next - dt * w(t) * correction                  dt * w(t): the staged rtc_gain of the step

which is rtc.guided_velocity's update. The engine's fused kernels (Triton norms, few-row GEMMs, attention) have no
backward, so a guided workspace's denoiser runs cuBLAS GEMMs and torch's elementwise ops; the vision and the prefix
keep the fast kernels. torch.cuda.graph captures the backward as it does a forward (after the capture's warm-up
runs). A guided workspace runs its first denoise step after the whole prefix (no overlap: a backward waits for
every layer of its step anyway). GradOps keeps autograd's saved tensors unchanged until the step's backward: the
ops' reference forms write results into reused buffers (the residual stream, q, the K/V cache of all layers), so
GradOps copies the few inputs that a later write would change before the backward reads them.
"""

from __future__ import annotations

import torch

from flashrt_core.errors import InputError

from .ops import KeyMask, Ops
from .weights import EngineWeights


class GradOps(Ops):
    """The engine's ops in their plain-PyTorch forms, whatever the dispatch table picked, for a denoise step under
    autograd (every form has a backward). GEMMs: cuBLAS (F.linear); attention: the math form in fp32."""

    def __init__(self, dispatch):
        super().__init__(dispatch)
        self._norm_triton = self._ada_triton = self._geglu_triton = self._rope_triton = self._euler_triton = False
        self._mqa = "math"
        self._qkv_fused = self._fp8_fused_quant = False
        self.gemm_epilogue = self.smem_gemm = self.smem_gemm_rows = self.rope_in_attention = False
        self.fused_denoise_step = self.fused_denoise_step_pi0 = self.overlap_first_step = False
        self.pdl = False
        self.decoder_impl = {kind: "library" for kind in self.decoder_impl}

    def norm(self, x, residual, out, weight=None, bias=None, eps=1e-6, layer_norm=False, site="other"):
        if x is not None:
            return super().norm(x, residual, out, weight, bias, eps, layer_norm, site)
        return self._first_norm(residual, out, weight, bias, eps, layer_norm)

    def _first_norm(self, residual, out, weight, bias, eps, layer_norm):
        """The first norm of a step reads the residual buffer itself, which the next norm overwrites: a copy."""
        y, _ = self.k.residual_norm_reference(None, residual.clone(), weight, bias, eps, layer_norm,
                                              out_dtype=out.dtype)
        return out.copy_(y)

    def ada_norm(self, x, residual, gate, scale1p, shift, out, eps=1e-6, site="other", row_variant=None):
        if x is not None:
            return super().ada_norm(x, residual, gate, scale1p, shift, out, eps, site, row_variant)
        # the first norm of a step reads the residual buffer itself, which the next norm overwrites: a copy
        y, _ = self.k.ada_rms_norm_reference(None, residual.clone(), None, scale1p, shift, eps, out_dtype=out.dtype,
                                             row_variant=row_variant)
        return out.copy_(y)

    def mqa(self, q, k, v, mask: KeyMask, scale, site="other", splits=None):
        # q is a view of the step's q buffer and k / v views of the cache of all layers (one version counter),
        # both written by the next layer before the backward
        return super().mqa(q.clone(), k.clone(), v.clone(), mask, scale, site, splits)


def check_weights(w: EngineWeights) -> None:
    """Refuse, by name, an engine whose denoiser has FP8 GEMMs (the action expert's, the action projection, pi0's
    time MLP): guided RTC needs their backward."""
    layers = [w.action_in, w.time_in_action, w.time_out] + [
        lin for layer in w.expert for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    if any(lin is not None and (lin.fp8 is not None or lin.w8 is not None) for lin in layers):
        raise InputError("guided RTC in the graph engine needs the action expert's GEMMs in bf16 (FP8 GEMMs have "
                         "no backward): load the policy in bf16, or use RTC mode 'guided_identity'")


def grad_ops(buffers, w: EngineWeights, ops: Ops) -> GradOps:
    """The guided workspace's GradOps (made at its first forward, after check_weights)."""
    if buffers.grad_ops is None:
        check_weights(w)
        buffers.grad_ops = GradOps(ops.dispatch)
    return buffers.grad_ops


def guided_step(run_step, x: torch.Tensor, step: int, dt: float, buffers) -> torch.Tensor:
    """One guided Euler step from x (horizon, A) fp32: run_step(x_next) is the denoise step, x_next <- x_next +
    dt * v in place; returns x_next - dt * w(t) * J^T (W * (target - x0)), detached. Under grad mode, outside
    inference mode."""
    x = x.detach().requires_grad_(True)
    x_next = x.clone()
    run_step(x_next)
    x0 = x - (buffers.times[step] / dt) * (x_next - x)
    err = (buffers.target - x0).detach() * buffers.weights
    (correction,) = torch.autograd.grad(x0, x, err)
    return x_next.detach() - buffers.gain[step] * correction
