"""Flow-matching sampler: a stateless Euler integrator, apart from the model.

Time convention (openpi / lerobot): t = 1 is pure noise, t = 0 is data. The model predicts the velocity
v = dx/dt; integration starts at x = noise, t = 1 and takes `num_steps` Euler steps of dt = -1 / num_steps:
    x <- x + dt * v(x, t);   t <- t + dt
The time values are accumulated in fp32 exactly as the reference implementations do, so a fast path that
precomputes everything derived from t (pi0.5's adaRMSNorm conditioning) sees bit-identical t values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def time_schedule(num_steps: int) -> list[float]:
    """The `num_steps` values of t at which the velocity is evaluated: 1.0, 1.0 + dt, ... (fp32 accumulation)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = np.float32(-1.0 / num_steps)
    t = np.float32(1.0)
    values = []
    for _ in range(num_steps):
        values.append(float(t))
        t = np.float32(t + dt)
    return values


def euler_integrate(velocity: Callable[[torch.Tensor, float], torch.Tensor], noise: torch.Tensor,
                    num_steps: int) -> torch.Tensor:
    """Integrate dx/dt = velocity(x, t) from t = 1 (x = noise) to t = 0.

    velocity: (x [B, H, A] fp32, t) -> v [B, H, A];  noise: [B, H, A] -> x at t ~ 0, [B, H, A] fp32
    """
    dt = -1.0 / num_steps
    x = noise.float()
    for t in time_schedule(num_steps):
        x = x + dt * velocity(x, t).float()
    return x
