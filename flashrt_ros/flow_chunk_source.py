"""A chunk source that is a real flow-matching sampler, so that real-time chunking can condition it.

The closed loop's scripted source (closed_loop_sim.scripted_chunk) computes a chunk; a policy samples one. This
source samples: each chunk is drawn by Euler integration (flashrt_core.flow, 10 steps by default) of the exact
velocity field of a Gaussian mixture over chunks, from fresh noise, and with an RTC mode through the core's own
sampler (flashrt_core.rtc.rtc_euler_integrate) conditioned on the executor's pending actions, as the policy node
does (flashrt_ros.rtc_sharing.PolicyRtc: delay rows from the measured latency, the pending actions aligned to the
new chunk's rows).

The mixture: K modes with equal weight, mode k's mean ``mu_k`` = the scripted chunk for the observation (no
per-chunk offset) plus ``offset_k`` on every row, isotropic std ``sigma``. The offsets are fixed (evenly spread
over +-``flow_mode_spread`` chunk_noise units on every action dimension): fresh noise picks a mode per chunk, so
consecutive chunks disagree by whole mode spacings, the multi-modality RTC is meant to remove.

Model space: robot units divided by ``chunk_noise`` (the flow's unit-variance noise is one chunk_noise), so the
modes, a few units apart on each of H x A entries, are distinguishable from the noise.

Time convention (flow.py): t = 1 noise, t = 0 data, x_t = t * noise + (1 - t) * x1. Given mode k,
x_t ~ N((1 - t) mu_k, s_t^2 I) with s_t^2 = (1 - t)^2 sigma^2 + t^2, and (Gaussian conditioning)
E[x1 | x_t, k] = mu_k + (1 - t) sigma^2 / s_t^2 (x_t - (1 - t) mu_k), E[noise | x_t, k] = t / s_t^2 (x_t - (1 - t)
mu_k). The velocity dx_t/dt = noise - x1, so v(x_t, t) = sum_k p(k | x_t) (E[noise | x_t, k] - E[x1 | x_t, k]) with
p(k | x_t) the softmax over k of -|x_t - (1 - t) mu_k|^2 / (2 s_t^2) (the normalizers are equal across k).
"""

from __future__ import annotations

import numpy as np
import torch

from flashrt_core.flow import euler_integrate
from flashrt_core.rtc import rtc_euler_integrate
from flashrt_ros.rtc_sharing import PolicyRtc

RTC_MODES = ("guided", "guided_identity", "hard_prefix")   # training_time needs a checkpoint trained for it


def mixture_velocity(x: torch.Tensor, t: torch.Tensor | float, means: torch.Tensor, sigma: float) -> torch.Tensor:
    """The exact flow velocity of an equal-weight Gaussian mixture (module docstring), differentiable in x.

    x: [B, *shape]; t: a float or [B]; means: [K, *shape] -> v: [B, *shape] in x's dtype."""
    batch, dims = x.shape[0], x.dim() - 1
    ones = [1] * (dims + 1)                                            # the mode axis and the sample's axes
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device).reshape(-1, *ones).expand(batch, *ones)
    means = means.to(x.dtype)[None]                                    # [1, K, *shape]
    d = x[:, None] - (1.0 - t) * means                                 # [B, K, *shape]
    s2 = (1.0 - t) ** 2 * sigma ** 2 + t ** 2
    logits = -(d * d).flatten(2).sum(-1) / (2.0 * s2.flatten(1))       # [B, K]
    p = torch.softmax(logits, dim=1).reshape(batch, -1, *([1] * dims))
    per_mode = (t / s2) * d - (means + (1.0 - t) * sigma ** 2 / s2 * d)
    return (p * per_mode).sum(1)


def mode_offsets(modes: int, spread: float, action_dim: int) -> np.ndarray:
    """[modes, action_dim]: evenly spaced over [-spread, spread] on every action dimension (0 for one mode)."""
    if modes < 1:
        raise ValueError(f"the flow source needs at least one mode, got {modes}")
    levels = np.linspace(-spread, spread, modes) if modes > 1 else np.zeros(1)
    return np.repeat(levels[:, None], action_dim, axis=1)


class ScaleNormalizer:
    """The normalizer RtcRequest.plan needs: model space = robot units / unit."""

    def __init__(self, unit: float):
        self.unit = unit

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return np.asarray(actions, dtype=np.float64) / self.unit


class FlowChunkSource:
    """Samples the loop's chunks; with ``rtc_mode`` conditioned on the executor's pending actions.

    ``sample`` takes the mixture's center for an observation (the scripted chunk, robot units, [H, A]); the modes
    are it plus ``offsets``. The noise stream is the seed's alone, one draw per chunk, so a run with RTC and one
    without sample from the same noise."""

    def __init__(self, config, rtc_mode: str | None = None):
        if rtc_mode is not None and rtc_mode not in RTC_MODES:
            raise ValueError(f"rtc mode must be one of {RTC_MODES}, got {rtc_mode!r}")
        if not config.chunk_noise > 0.0 or not config.flow_sigma > 0.0 or config.flow_steps < 1:
            raise ValueError("the flow source needs chunk_noise > 0, flow_sigma > 0 and flow_steps >= 1, got "
                             f"{config.chunk_noise}, {config.flow_sigma}, {config.flow_steps}")
        self.config = config
        self.unit = float(config.chunk_noise)
        self.offsets = mode_offsets(config.flow_modes, config.flow_mode_spread * self.unit, config.action_dim)
        self.rng = np.random.default_rng([config.seed, 1])
        self.rtc = None if rtc_mode is None else PolicyRtc(
            rtc_mode, execution_horizon=config.rtc_execution_horizon,
            max_guidance_weight=config.rtc_max_guidance_weight)

    def sample(self, base: np.ndarray, observation_s: float) -> np.ndarray:
        """One chunk [H, A] (robot units) around ``base`` for the observation stamped ``observation_s``; the
        inference starts at the observation."""
        config = self.config
        horizon, width = base.shape
        means = torch.from_numpy((base[None] + self.offsets[:, None, :]) / self.unit)       # [K, H, A]
        noise = torch.from_numpy(self.rng.standard_normal((1, horizon, width))).float()
        request = None if self.rtc is None else self.rtc.request(observation_s, observation_s, config.chunk_dt,
                                                                 horizon, width)
        with torch.no_grad():
            if request is None:
                x = euler_integrate(lambda z, t: mixture_velocity(z, t, means, config.flow_sigma), noise,
                                    config.flow_steps)
            else:
                plan = request.plan(ScaleNormalizer(self.unit), horizon, width, width)
                x = rtc_euler_integrate(lambda z, t: mixture_velocity(z, t, means, config.flow_sigma), noise,
                                        config.flow_steps, plan)
        return x[0].double().numpy() * self.unit

    def accepted(self, observation_s: float, arrival_s: float, pending: np.ndarray, sequence: int) -> None:
        """The executor accepted the chunk of ``observation_s`` at ``arrival_s`` and will command ``pending``
        ([rows, A], every chunk_dt from ``arrival_s`` on): what the policy node learns (its latency, the pending
        actions). Without RTC there is no one to tell."""
        if self.rtc is None:
            return
        self.rtc.latency.record(arrival_s - observation_s)
        self.rtc.on_pending(arrival_s, self.config.chunk_dt, len(pending), pending.shape[1], pending.ravel(),
                            sequence)


__all__ = ["FlowChunkSource", "RTC_MODES", "ScaleNormalizer", "mixture_velocity", "mode_offsets"]
