"""A closed loop in simulated time: a scripted chunk source, a delay, an executor and a plant.

It measures what the chunk executor is for, without a robot: how well a plant tracks a target when the chunks it
executes come from observations ``delay_s`` old, and how large the jumps at chunk switches are.

- Target: ``y*(t) = amplitude * sin(2 pi f t + phase_j)`` per action dimension ``j``.
- Plant: a position servo, ``x <- x + (u - x) * (1 - exp(-period / servo_tau_s))`` per control period.
- Chunk source (scripted, the stand-in for a policy): back to back, it observes the plant at ``t_obs`` and, after
  ``delay_s`` (with ``jitter`` as a fraction of it, uniform), publishes a chunk stamped ``t_obs`` whose row ``i`` is
  ``y*(t_obs + i dt)`` plus the observed tracking error fed back with a decay, plus a constant offset drawn per
  chunk (``chunk_noise``): the model error that makes consecutive chunks disagree, as real ones do.
- Chunk source (flow, ``source="flow"``): flashrt_ros.flow_chunk_source samples each chunk with a flow-matching
  sampler from a Gaussian mixture around the scripted chunk (modes a few chunk_noise apart): a policy's
  multi-modality, and a sampler that real-time chunking can condition.
- Executors: ``naive`` executes each chunk from its first row at its arrival, as a consumer that ignores the
  stamps does; ``latest`` and ``temporal_fusion`` are flashrt_ros.chunk_schedule reading chunks by their stamps.
  ``rtc_guided``, ``rtc_guided_identity`` and ``rtc_hard_prefix`` (flow source only) are ``latest`` with each chunk
  sampled under that RTC mode, conditioned on the executor's pending actions (ChunkSchedule.preview at every
  accepted chunk) as the policy node does (flashrt_ros.rtc_sharing.PolicyRtc). A missed deadline (nothing covers
  now, once the first chunk has arrived) holds the last command.

Everything is deterministic for a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flashrt_ros.chunk_schedule import ChunkSchedule, Switching, TimedChunk

EXECUTORS = ("naive", "latest", "temporal_fusion")
RTC_EXECUTORS = ("rtc_guided", "rtc_guided_identity", "rtc_hard_prefix")    # flow source only
SOURCES = ("scripted", "flow")


@dataclass(frozen=True)
class LoopConfig:
    delay_s: float = 0.1
    jitter: float = 0.1             # inference time uniform in delay_s * [1 - jitter, 1 + jitter]
    control_rate_hz: float = 100.0
    chunk_dt: float = 0.02
    horizon: int = 50
    action_dim: int = 2
    amplitude: float = 1.0
    frequency_hz: float = 0.5
    servo_tau_s: float = 0.05
    feedback_gain: float = 0.5
    feedback_decay_s: float = 0.2
    chunk_noise: float = 0.02       # scripted: std of the per-chunk offset; flow: model unit (robot / chunk_noise)
    source: str = "scripted"        # "scripted" or "flow" (the sampler that RTC conditions)
    flow_modes: int = 3             # flow: mixture modes, offsets evenly over +-flow_mode_spread on every dimension
    flow_mode_spread: float = 2.0   # flow: the outer modes' offset [chunk_noise units]
    flow_sigma: float = 0.25        # flow: each mode's isotropic std per entry [chunk_noise units]
    flow_steps: int = 10            # flow: Euler steps per chunk
    rtc_execution_horizon: int = 10  # rtc_guided*: row where the soft mask reaches 0 (lerobot's); 0 = all known
    rtc_max_guidance_weight: float = 10.0   # rtc_guided*: the guidance clip beta
    fusion_decay: float = 10.0
    duration_s: float = 10.0
    warmup_s: float = 1.0           # tracking error counted after this
    seed: int = 0


@dataclass(frozen=True)
class LoopResult:
    executor: str
    delay_s: float
    tracking_rms: float             # RMS over time of the norm of plant - target, after the warm-up
    seam_max: float
    seam_mean: float
    switches: int
    deadline_misses: int            # control periods after the first chunk that no chunk covered
    commands: int


def target(config: LoopConfig, t: float) -> np.ndarray:
    phases = np.arange(config.action_dim) * (math.pi / 3.0)
    return config.amplitude * np.sin(2.0 * math.pi * config.frequency_hz * t + phases)


def scripted_chunk(config: LoopConfig, t_obs: float, observed: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The chunk the scripted source computes from the plant observed at ``t_obs``: [horizon, action_dim]."""
    times = t_obs + np.arange(config.horizon) * config.chunk_dt
    planned = np.stack([target(config, t) for t in times])
    error = target(config, t_obs) - observed
    feedback = config.feedback_gain * error[None, :] * np.exp(-(times - t_obs) / config.feedback_decay_s)[:, None]
    return planned + feedback + offset[None, :]


def run_loop(config: LoopConfig, executor: str) -> LoopResult:
    """One closed-loop run of ``duration_s`` with the given executor."""
    if executor not in EXECUTORS + RTC_EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS + RTC_EXECUTORS}, got {executor!r}")
    if config.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {config.source!r}")
    if executor in RTC_EXECUTORS and config.source != "flow":
        raise ValueError(f"{executor} conditions the chunk source: it needs source='flow'")
    flow = None
    if config.source == "flow":
        from flashrt_ros.flow_chunk_source import FlowChunkSource   # here: the scripted loop runs without torch
        flow = FlowChunkSource(config, executor.removeprefix("rtc_") if executor in RTC_EXECUTORS else None)
    rng = np.random.default_rng(config.seed)
    switching = Switching.TEMPORAL_FUSION if executor == "temporal_fusion" else Switching.LATEST
    schedule = ChunkSchedule(switching, config.fusion_decay, interpolate=True)
    period = 1.0 / config.control_rate_hz
    alpha = 1.0 - math.exp(-period / config.servo_tau_s)
    steps = int(round(config.duration_s * config.control_rate_hz))
    plant = target(config, 0.0)
    command = plant.copy()
    in_flight: tuple[float, float, np.ndarray] | None = None     # (arrival time, observation time, actions)
    next_observation = 0.0
    seams, errors, misses, sequence = [], [], 0, 0
    for k in range(1, steps + 1):
        t = k * period
        if in_flight is None and t >= next_observation:            # the source observes, then computes
            delay = config.delay_s * (1.0 + config.jitter * rng.uniform(-1.0, 1.0))
            offset = rng.normal(0.0, config.chunk_noise, config.action_dim)   # drawn for both: same delays
            if flow is None:
                actions = scripted_chunk(config, t, plant, offset)
            else:
                actions = flow.sample(scripted_chunk(config, t, plant, np.zeros(config.action_dim)), t)
            in_flight = (t + delay, t, actions)
        if in_flight is not None and t >= in_flight[0]:             # the chunk arrives
            arrival, t_obs, actions = in_flight
            stamp = arrival if executor == "naive" else t_obs
            schedule.add(TimedChunk(stamp, config.chunk_dt, actions, sequence))
            if flow is not None and flow.rtc is not None:      # the executor publishes its pending actions
                flow.accepted(t_obs, t, schedule.preview(t, config.chunk_dt, config.horizon), sequence)
            sequence += 1
            in_flight, next_observation = None, t
        step = schedule.command(t)
        if step is None:
            misses += sequence > 0          # before the first chunk the plant rests at its start: no deadline yet
        else:
            command = step.action
            if step.switched and step.seam > 0.0:
                seams.append(step.seam)
        plant = plant + (command - plant) * alpha
        if t >= config.warmup_s:
            errors.append(float(np.sum((plant - target(config, t)) ** 2)))
    return LoopResult(executor, config.delay_s, math.sqrt(float(np.mean(errors))),
                      max(seams, default=0.0), float(np.mean(seams)) if seams else 0.0, len(seams), misses, steps)


__all__ = ["EXECUTORS", "RTC_EXECUTORS", "SOURCES", "LoopConfig", "LoopResult", "run_loop", "scripted_chunk", "target"]
