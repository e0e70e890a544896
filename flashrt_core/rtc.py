"""Real-time chunking (RTC): the math that conditions a new action chunk on the previous one.

While a chunk is computed the robot keeps executing the previous one, so the first `delay` actions of the new
chunk are already decided: they are the previous chunk's. RTC treats the new chunk as inpainting: those actions
are kept, the rest generated to continue them. Three forms (RtcPlan.mode):

  guided         inference-time RTC (Black, Galliker, Levine, arXiv 2506.07339): every Euler step's velocity is
                 corrected by the vector-Jacobian product of the denoiser's clean-action estimate with the
                 soft-masked error to the previous chunk (prefix_weights), scaled by guidance_weight (clipped at
                 beta). Needs autograd through the denoiser.
  guided_identity  the guided form with the Jacobian taken as identity (lerobot's RTCProcessor): the correction
                 is the soft-masked error itself, v - w(t) * W * (target - x0). No backward: a few elementwise
                 ops per step in the graph engine (engine/rtc_blend.py), where "guided" costs a backward through
                 the denoiser per step (engine/rtc_guided.py).
  hard_prefix    the cheap form: before every step the prefix rows of x_t are replaced by the previous chunk
                 noised to that step's time (prefix_anchor), and after the last step by the previous chunk itself.
  training_time  for checkpoints trained with clean action prefixes (arXiv 2512.05964): the prefix rows hold the
                 previous chunk, clean, and their tokens get the per-token time of clean data.

Time convention (flow.py): t = 1 is noise, t = 0 is data, x_t = t * noise + (1 - t) * actions, the velocity
v = dx/dt = noise - actions, the clean estimate x0 = x_t - t * v. The paper's time runs the other way
(tau = 1 - t) and its velocity is -v; the guided velocity below is the paper's, written in this convention
(lerobot's RTCProcessor.denoise_step uses the same one).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashrt_core.flow import time_schedule

MODES = ("guided", "guided_identity", "hard_prefix", "training_time")
SOFT_MASK_MODES = ("guided", "guided_identity")      # the modes that read RtcPlan.weights as a soft mask
SCHEDULES = ("exp", "linear", "ones", "zeros")
DEFAULT_MAX_GUIDANCE_WEIGHT = 10.0  # the paper's beta; lerobot's max_guidance_weight default
CLEAN_TIME = 0.0                    # the flow time of data (t = 0 in this codebase)


@dataclass(frozen=True)
class RtcPlan:
    """An RTC request in model space, ready for a sampler.

    target: [B, H, A] fp32, the previous chunk normalized and zero-padded (rows past its end are zeros and weigh 0)
    weights: [H] fp32, the guided soft mask (prefix_weights); for the other modes 1 on the frozen prefix, else 0
    """

    mode: str
    target: torch.Tensor
    weights: torch.Tensor
    delay: int
    max_guidance_weight: float = DEFAULT_MAX_GUIDANCE_WEIGHT

    def to(self, device: torch.device) -> RtcPlan:
        return dataclasses.replace(self, target=self.target.to(device), weights=self.weights.to(device))

    def prefix_rows(self) -> torch.Tensor:
        """[H] bool: the frozen prefix (the first `delay` rows)."""
        return torch.arange(self.weights.shape[0], device=self.weights.device) < self.delay


def prefix_weights(delay: int, execution_horizon: int, horizon: int, schedule: str = "exp") -> torch.Tensor:
    """[horizon] fp32 soft mask: 1 on the first `delay` rows (frozen), decaying to 0 over [delay, end) with
    end = execution_horizon, 0 from end on.

    exp (the paper's): c_i * (e^c_i - 1) / (e - 1) with c_i = (end - i) / (end - delay + 1); linear: c_i; ones: 1
    up to end; zeros: 1 on the prefix only. end < delay is raised to delay (lerobot's get_prefix_weights)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown RTC schedule {schedule!r}; expected one of {SCHEDULES}")
    if delay < 0 or execution_horizon < 0 or horizon < 1:
        raise ValueError(f"need delay >= 0, execution_horizon >= 0, horizon >= 1; got {delay}, "
                         f"{execution_horizon}, {horizon}")
    end = min(max(execution_horizon, delay), horizon)
    delay = min(delay, horizon)
    weights = torch.zeros(horizon, dtype=torch.float64)
    weights[:delay] = 1.0
    if schedule == "ones":
        weights[:end] = 1.0
    elif schedule in ("exp", "linear") and end > delay:
        i = torch.arange(delay, end, dtype=torch.float64)
        c = (end - i) / (end - delay + 1)
        weights[delay:end] = c * torch.expm1(c) / (math.e - 1) if schedule == "exp" else c
    return weights.float()


def guidance_weight(t: float, beta: float = DEFAULT_MAX_GUIDANCE_WEIGHT) -> float:
    """The paper's min(beta, (1 - tau) / (tau * r_tau^2)) with tau = 1 - t and r_tau^2 = (1 - tau)^2 / (tau^2 +
    (1 - tau)^2): min(beta, (t^2 + (1 - t)^2) / (t * (1 - t))). beta at t = 1 (pure noise), 0 at t = 0."""
    if beta <= 0:
        raise ValueError(f"the maximum guidance weight must be positive, got {beta}")
    if t >= 1.0:
        return float(beta)
    if t <= 0.0:
        return 0.0
    return float(min(beta, (t * t + (1.0 - t) ** 2) / (t * (1.0 - t))))


def guided_velocity(velocity: Callable[[torch.Tensor], torch.Tensor], x_t: torch.Tensor, t: float,
                    target: torch.Tensor, weights: torch.Tensor, beta: float) -> torch.Tensor:
    """The guided velocity v - w(t) * J^T (W * (target - x0)), J = d x0 / d x_t, x0 = x_t - t * v(x_t).

    velocity: x [B, H, A] -> v [B, H, A] (differentiable); x_t, target: [B, H, A]; weights: [H].
    One forward and one backward (vector-Jacobian product) through the denoiser; needs grad mode (callers under
    torch.no_grad, not torch.inference_mode, so that the prefix cache may be saved for the backward)."""
    with torch.enable_grad():
        x = x_t.detach().requires_grad_(True)
        v = velocity(x).to(x.dtype)
        x0 = x - t * v
        err = (target - x0).detach() * weights[None, :, None]
        (correction,) = torch.autograd.grad(x0, x, err)
    return v.detach() - guidance_weight(t, beta) * correction


def identity_guided_velocity(v: torch.Tensor, x_t: torch.Tensor, t: float, target: torch.Tensor,
                             weights: torch.Tensor, beta: float) -> torch.Tensor:
    """guided_velocity with J = I (lerobot's form): v - w(t) * W * (target - (x_t - t * v)). All [B, H, A] but
    weights [H]."""
    err = (target - (x_t - t * v)) * weights[None, :, None]
    return v - guidance_weight(t, beta) * err


def prefix_anchor(target: torch.Tensor, noise: torch.Tensor, t: float) -> torch.Tensor:
    """The previous chunk noised to time t along the flow's path: target + t * (noise - target)."""
    return torch.lerp(target, noise, t)


def rtc_euler_integrate(velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor,
                        num_steps: int, plan: RtcPlan) -> torch.Tensor:
    """flow.euler_integrate conditioned on a previous chunk.

    velocity: (x [B, H, A] fp32, time [B] or [B, H] fp32) -> v [B, H, A]; per-token time only for training_time.
    noise: [B, H, A] -> x at t ~ 0 [B, H, A] fp32; the prefix rows exactly the target for hard_prefix and
    training_time."""
    if plan.mode not in MODES:
        raise ValueError(f"unknown RTC mode {plan.mode!r}; expected one of {MODES}")
    batch, horizon = noise.shape[:2]
    dt = -1.0 / num_steps
    x = noise.float()
    target = plan.target.to(x.device, torch.float32).expand_as(x)
    weights = plan.weights.to(x.device, torch.float32)
    rows = plan.prefix_rows().to(x.device)[None, :, None]                       # [1, H, 1]
    for t in time_schedule(num_steps):
        time = torch.full((batch,), t, dtype=torch.float32, device=x.device)    # [B]
        if plan.mode == "guided":
            v = guided_velocity(lambda z, time=time: velocity(z, time), x, t, target, weights,
                                plan.max_guidance_weight)
        elif plan.mode == "guided_identity":
            v = identity_guided_velocity(velocity(x, time).float(), x, t, target, weights, plan.max_guidance_weight)
        elif plan.mode == "hard_prefix":
            x = torch.where(rows, prefix_anchor(target, noise.float(), t), x)
            v = velocity(x, time)
        else:
            x = torch.where(rows, target, x)
            token_time = torch.where(rows[..., 0], CLEAN_TIME, time[:, None].expand(batch, horizon))   # [B, H]
            v = velocity(x, token_time)
        x = x + dt * v.float()
    if plan.mode not in SOFT_MASK_MODES:
        x = torch.where(rows, target, x)
    return x
