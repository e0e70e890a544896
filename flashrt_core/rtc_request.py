"""What a caller of Policy.predict asks of real-time chunking, and its conversion to model space (rtc.RtcPlan).

RtcRequest.previous_chunk is in the robot's action units, aligned with the chunk being computed: row i is the
action the robot executes at the new chunk's step i (the first row at the new observation's time). Its first
`delay_steps` rows execute while the new chunk is computed (delay_steps = ceil((latency + staleness) / control
period), measured by the caller), so they are kept; the rest are inpainted. It is normalized with the inverse of
the action unnormalization (Normalizer.normalize_actions) and zero-padded to the model's action width, as
training pads actions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flashrt_core.errors import InputError
from flashrt_core.normalization import Normalizer, pad_to
from flashrt_core.rtc import DEFAULT_MAX_GUIDANCE_WEIGHT, MODES, SCHEDULES, SOFT_MASK_MODES, RtcPlan, prefix_weights


@dataclass(frozen=True)
class RtcRequest:
    """mode: "guided" (inference-time RTC, soft mask + guidance through the denoiser's Jacobian: a backward per
    step), "guided_identity" (the same with the Jacobian taken as identity, as lerobot does), "hard_prefix" (the
    prefix replaced each step, cheap) or "training_time" (per-token time, for checkpoints trained with clean
    prefixes). The reference path and the graph engine run every mode.
    previous_chunk: (n, action_dim) robot units, n >= delay_steps; rows past n weigh 0.
    delay_steps: the frozen prefix length d, 0 <= d < horizon.
    execution_horizon: guided modes only: where the soft mask reaches 0 (None: min(n, horizon)); lerobot's default 10.
    max_guidance_weight: guided modes only: the clip beta of the guidance weight (the paper's and lerobot's 10).
    schedule: guided modes only: the soft mask's decay over [d, execution_horizon): exp (the paper's), linear, ones,
    zeros (prefix only)."""

    previous_chunk: object
    delay_steps: int
    mode: str = "guided"
    execution_horizon: int | None = None
    max_guidance_weight: float = DEFAULT_MAX_GUIDANCE_WEIGHT
    schedule: str = "exp"

    def plan(self, normalizer: Normalizer, horizon: int, action_dim: int, max_action_dim: int) -> RtcPlan:
        """Validated model-space plan: target [1, horizon, max_action_dim] fp32, weights [horizon] fp32."""
        if self.mode not in MODES:
            raise InputError(f"rtc mode must be one of {MODES}, got {self.mode!r}")
        if self.schedule not in SCHEDULES:
            raise InputError(f"rtc schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not float(self.max_guidance_weight) > 0:
            raise InputError(f"max_guidance_weight must be positive, got {self.max_guidance_weight}")
        try:
            prev = np.asarray(self.previous_chunk.detach().cpu() if torch.is_tensor(self.previous_chunk)
                              else self.previous_chunk, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"previous_chunk must be a numeric array (n, {action_dim}): {exc}") from exc
        if prev.ndim != 2 or prev.shape[1] != action_dim or prev.shape[0] < 1:
            raise InputError(f"previous_chunk must have shape (n, action_dim={action_dim}), got {prev.shape}")
        if not np.isfinite(prev).all():
            raise InputError("previous_chunk has non-finite values (NaN/inf)")
        delay = self.delay_steps
        if isinstance(delay, bool) or not isinstance(delay, (int, np.integer)) or not 0 <= delay < horizon:
            raise InputError(f"delay_steps must be an int in [0, horizon={horizon}), got {delay!r}")
        rows = min(prev.shape[0], horizon)
        if delay > rows:
            raise InputError(f"delay_steps {delay} exceeds the previous chunk's {prev.shape[0]} rows: the actions "
                             "executed during this inference must all be given")
        end = rows if self.execution_horizon is None else int(self.execution_horizon)
        if end < 0:
            raise InputError(f"execution_horizon must be >= 0, got {self.execution_horizon}")
        target = np.zeros((horizon, max_action_dim), dtype=np.float32)
        target[:rows] = pad_to(normalizer.normalize_actions(prev[:rows]), max_action_dim)
        if self.mode in SOFT_MASK_MODES:
            weights = prefix_weights(int(delay), min(end, rows), horizon, self.schedule)
        else:
            weights = prefix_weights(int(delay), int(delay), horizon, "zeros")
        return RtcPlan(self.mode, torch.from_numpy(target)[None], weights, int(delay),
                       float(self.max_guidance_weight))
