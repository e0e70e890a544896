"""Real-time chunking in the graph engine (flashrt_core/rtc.py), from static buffers, captured inside the forward's
graph at the cost of a few elementwise ops on a (horizon, A) tile per denoise step:

  hard_prefix      before each step the frozen rows of x_t become the previous chunk noised to the step's time
                   (blend_step), after the last one the previous chunk itself (blend_final);
  guided_identity  after each step the guidance with the Jacobian taken as identity (guided_correction). The step's
                   Euler update may be fused into its last kernel, so the velocity v is recovered from x_t before
                   and after the step (x_after = x_before + dt * v) and the update corrected in place:
                   x_after -= dt * w(t) * W * (target - (x_before - t * v)), the same as stepping with
                   rtc.identity_guided_velocity;
  training_time    before each step and after the last one the frozen rows of x_t become the previous chunk itself,
                   and the step gives their tokens the time of clean data (rtc.CLEAN_TIME): pi0.5's adaRMS norms read
                   each row's modulation (row_variant; EngineWeights.training_time_tables), pi0's time MLP a per-row
                   time bias; the fused step ends, which take one modulation for all rows, stay off.

A workspace made for RTC (its graph signature carries ("rtc", mode)) holds the previous chunk, normalized and padded
(rtc_target), the frozen rows (rtc_rows, True on the first `delay` rows), the soft mask (rtc_weights) and each
step's dt * w(t) (rtc_gain, from the request's guidance clip); all are staged per call, so one graph per mode
serves every delay and previous chunk. Workspaces without RTC run the forward unchanged (no blend op).

"guided" (a vector-Jacobian product through the denoiser per step) uses the same buffers; its steps run in
engine/rtc_guided.py, driven by forward.guided_denoise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrt_core.errors import InputError
from flashrt_core.flow import time_schedule
from flashrt_core.rtc import RtcPlan, guidance_weight, prefix_anchor

ENGINE_MODES = ("hard_prefix", "guided_identity", "training_time", "guided")


@dataclass
class RtcBuffers:
    """Static device buffers of an RTC workspace (Workspace.extras["rtc"])."""

    mode: str                   # one of ENGINE_MODES
    target: torch.Tensor        # (horizon, A) fp32: the previous chunk in model space, zero-padded
    rows: torch.Tensor          # (horizon, 1) bool: the frozen prefix
    weights: torch.Tensor       # (horizon, 1) fp32: the soft mask (guided_identity)
    gain: torch.Tensor          # (steps,) fp32: dt * w(t) of each step (guided_identity)
    before: torch.Tensor        # (horizon, A) fp32: x_t before the current step (guided_identity)
    times: list[float]          # the flow time of each denoise step (flow.time_schedule)
    grad_ops: object = None     # guided: rtc_guided.GradOps, made at the first forward


def check_mode(plan: RtcPlan) -> None:
    """Raise a clear error for an RTC mode the engine does not run."""
    if plan.mode not in ENGINE_MODES:
        raise InputError(f"the graph engine runs the RTC modes {ENGINE_MODES}, not {plan.mode!r}")


def staging_fields(horizon: int, width: int, steps: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The extra StagingBlob fields of an RTC workspace."""
    return [("rtc_target", (horizon, width), torch.float32), ("rtc_rows", (horizon, 1), torch.bool),
            ("rtc_weights", (horizon, 1), torch.float32), ("rtc_gain", (steps,), torch.float32)]


def make_buffers(device_views: dict, mode: str, num_steps: int) -> RtcBuffers:
    target = device_views["rtc_target"]
    return RtcBuffers(mode, target, device_views["rtc_rows"], device_views["rtc_weights"], device_views["rtc_gain"],
                      torch.zeros_like(target), time_schedule(num_steps))


def training_time(buffers: RtcBuffers | None) -> RtcBuffers | None:
    """The buffers of a training-time RTC workspace, else None."""
    return buffers if buffers is not None and buffers.mode == "training_time" else None


def prepare_weights(weights, mode: str) -> None:
    """What a workspace of `mode` needs of the engine weights, made before its capture: training_time on pi0.5,
    the modulation tables with the clean-time rows (EngineWeights.training_time_tables)."""
    if mode == "training_time" and weights.tables is not None:
        weights.training_time_tables()


def row_variant(buffers: RtcBuffers, rows: int) -> torch.Tensor:
    """(rows,) int32 over the suffix rows: 1 on the frozen prefix (the modulation of clean data), else 0 (the step's
    time); the action rows are the last `horizon`. Once per predict, from the staged rtc_rows."""
    frozen = buffers.rows[:, 0].to(torch.int32)                                      # (horizon,)
    return torch.nn.functional.pad(frozen, (rows - frozen.shape[0], 0)) if rows > frozen.shape[0] else frozen


def step_gains(plan: RtcPlan, num_steps: int) -> torch.Tensor:
    """(steps,) fp32: dt * w(t) of each step, w the guidance weight clipped at the request's beta."""
    dt = -1.0 / num_steps
    return torch.tensor([dt * guidance_weight(t, plan.max_guidance_weight) for t in time_schedule(num_steps)],
                        dtype=torch.float32)


def stage(host_views: dict, plan: RtcPlan, num_steps: int) -> None:
    """Write one call's previous chunk, frozen rows, soft mask and step gains into the pinned staging views."""
    host_views["rtc_target"].numpy()[:] = plan.target[0].cpu().numpy()
    host_views["rtc_rows"].numpy()[:] = plan.prefix_rows().cpu().numpy()[:, None]
    host_views["rtc_weights"].numpy()[:] = plan.weights.cpu().numpy()[:, None]
    host_views["rtc_gain"].numpy()[:] = step_gains(plan, num_steps).numpy()


def copy_plan(buffers: RtcBuffers, plan: RtcPlan, num_steps: int) -> None:
    """stage() for device tensors: one call's plan into the workspace's buffers directly."""
    buffers.target.copy_(plan.target[0])
    buffers.rows.copy_(plan.prefix_rows()[:, None])
    buffers.weights.copy_(plan.weights[:, None])
    buffers.gain.copy_(step_gains(plan, num_steps))


def before_step(x_t: torch.Tensor, noise: torch.Tensor, buffers: RtcBuffers, step: int) -> None:
    """Before denoise step `step`: hard_prefix: the frozen rows of x_t become the previous chunk noised to that
    step's time; training_time: the previous chunk itself (clean; the step gives their tokens clean data's time);
    guided_identity: x_t is kept for the step's correction."""
    if buffers.mode == "hard_prefix":
        anchor = prefix_anchor(buffers.target, noise, buffers.times[step])
        x_t.copy_(torch.where(buffers.rows, anchor, x_t))
    elif buffers.mode == "training_time":
        x_t.copy_(torch.where(buffers.rows, buffers.target, x_t))
    else:
        buffers.before.copy_(x_t)


def after_step(x_t: torch.Tensor, buffers: RtcBuffers, step: int, dt: float) -> None:
    """After denoise step `step` (guided_identity): x_t -= dt * w(t) * W * (target - x0), with the step's velocity
    v = (x_t - before) / dt and x0 = before - t * v."""
    if buffers.mode != "guided_identity":
        return
    t = buffers.times[step]
    x0 = buffers.before - (t / dt) * (x_t - buffers.before)
    x_t.sub_(buffers.gain[step] * buffers.weights * (buffers.target - x0))


def blend_final(x_t: torch.Tensor, buffers: RtcBuffers) -> None:
    """After the last step (hard_prefix, training_time): the frozen rows of x_t become the previous chunk itself."""
    if buffers.mode in ("hard_prefix", "training_time"):
        x_t.copy_(torch.where(buffers.rows, buffers.target, x_t))
