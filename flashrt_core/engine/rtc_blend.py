"""Real-time chunking in the graph engine: the hard-prefix form (flashrt_core/rtc.py) as one masked blend per
denoise step from static buffers, so it is captured inside the forward's graph at the cost of num_steps + 1
elementwise ops on a (horizon, A) tile.

A workspace made for RTC (its graph signature carries "rtc") holds the previous chunk, normalized and padded
(rtc_target), and the frozen rows (rtc_rows, True on the first `delay` rows); both are staged per call, so one
graph serves every delay and previous chunk. Workspaces without RTC run the forward unchanged (no blend op).

Only "hard_prefix" runs here. "guided" needs a vector-Jacobian product through the denoiser and the engine's
kernels have no backward; "training_time" needs a per-token time, and the engine's pi0.5 adaRMS modulation is
precomputed per step for one time. Both run on the reference path (load_model(..., hardware="reference")).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrt_core.errors import InputError
from flashrt_core.flow import time_schedule
from flashrt_core.rtc import RtcPlan, prefix_anchor

ENGINE_MODES = ("hard_prefix",)


@dataclass
class RtcBuffers:
    """Static device buffers of an RTC workspace (Workspace.extras["rtc"])."""

    target: torch.Tensor        # (horizon, A) fp32: the previous chunk in model space, zero-padded
    rows: torch.Tensor          # (horizon, 1) bool: the frozen prefix
    times: list[float]          # the flow time of each denoise step (flow.time_schedule)


def check_mode(plan: RtcPlan) -> None:
    """Raise a clear error for an RTC mode the engine does not run."""
    if plan.mode not in ENGINE_MODES:
        raise InputError(f"the graph engine runs RTC mode(s) {ENGINE_MODES}, not {plan.mode!r}: "
                         f"{plan.mode!r} needs the reference path (load_model(..., hardware='reference'))")


def staging_fields(horizon: int, width: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The extra StagingBlob fields of an RTC workspace."""
    return [("rtc_target", (horizon, width), torch.float32), ("rtc_rows", (horizon, 1), torch.bool)]


def make_buffers(device_views: dict, num_steps: int) -> RtcBuffers:
    return RtcBuffers(device_views["rtc_target"], device_views["rtc_rows"], time_schedule(num_steps))


def stage(host_views: dict, plan: RtcPlan) -> None:
    """Write one call's previous chunk and frozen rows into the pinned staging views."""
    host_views["rtc_target"].numpy()[:] = plan.target[0].cpu().numpy()
    host_views["rtc_rows"].numpy()[:] = plan.prefix_rows().cpu().numpy()[:, None]


def blend_step(x_t: torch.Tensor, noise: torch.Tensor, buffers: RtcBuffers, step: int) -> None:
    """Before denoise step `step`: the frozen rows of x_t become the previous chunk noised to that step's time."""
    anchor = prefix_anchor(buffers.target, noise, buffers.times[step])
    x_t.copy_(torch.where(buffers.rows, anchor, x_t))


def blend_final(x_t: torch.Tensor, buffers: RtcBuffers) -> None:
    """After the last step: the frozen rows of x_t become the previous chunk itself."""
    x_t.copy_(torch.where(buffers.rows, buffers.target, x_t))
