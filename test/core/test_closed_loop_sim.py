"""flashrt_ros.closed_loop_sim and flow_chunk_source: the simulated loop shows what reading chunks by their stamps
is for, and, with a sampled chunk source, what real-time chunking is for."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from flashrt_core.flow import euler_integrate
from flashrt_core.rtc import rtc_euler_integrate
from flashrt_core.rtc_request import RtcRequest
from flashrt_ros.closed_loop_sim import EXECUTORS, RTC_EXECUTORS, LoopConfig, run_loop, scripted_chunk, target
from flashrt_ros.flow_chunk_source import FlowChunkSource, ScaleNormalizer, mixture_velocity

SHORT = LoopConfig(duration_s=4.0)


def test_without_delay_naive_and_latest_execute_the_same_chunks():
    config = dataclasses.replace(SHORT, delay_s=0.0, jitter=0.0)
    naive, latest = run_loop(config, "naive"), run_loop(config, "latest")
    assert naive.tracking_rms == latest.tracking_rms and naive.seam_max == latest.seam_max


@pytest.mark.parametrize("delay_s", [0.1, 0.3])
def test_reading_chunks_by_stamp_keeps_tracking_under_delay(delay_s):
    """Naive execution replays each chunk late by the delay; by stamp, the plant tracks as without delay."""
    config = dataclasses.replace(SHORT, delay_s=delay_s)
    naive, latest = run_loop(config, "naive"), run_loop(config, "latest")
    undelayed = run_loop(dataclasses.replace(SHORT, delay_s=0.0), "latest")
    assert latest.tracking_rms < 0.5 * naive.tracking_rms
    assert latest.tracking_rms < 2.0 * undelayed.tracking_rms
    assert latest.deadline_misses == 0       # a 1 s chunk outlasts a 0.3 s delay


def test_fusion_makes_smaller_seams_than_latest():
    config = dataclasses.replace(SHORT, delay_s=0.05)
    latest, fused = run_loop(config, "latest"), run_loop(config, "temporal_fusion")
    assert fused.switches == latest.switches > 0
    assert fused.seam_mean < 0.7 * latest.seam_mean


def test_a_chunk_shorter_than_the_delay_misses_deadlines():
    config = dataclasses.replace(SHORT, delay_s=0.3, jitter=0.0, horizon=5)     # 5 rows = 80 ms < 300 ms
    assert run_loop(config, "latest").deadline_misses > 0


def test_the_scripted_chunk_is_the_target_plus_feedback_plus_offset():
    config = SHORT
    observed = target(config, 1.0) - 0.1
    offset = np.array([0.01, -0.02])
    chunk = scripted_chunk(config, 1.0, observed, offset)
    assert chunk.shape == (config.horizon, config.action_dim)
    np.testing.assert_allclose(chunk[0], target(config, 1.0) + config.feedback_gain * 0.1 + offset, atol=1e-12)
    far = config.horizon - 1
    np.testing.assert_allclose(chunk[far], target(config, 1.0 + far * config.chunk_dt) + offset, atol=1e-3)


def test_runs_repeat_for_a_seed_and_bad_executors_are_refused():
    assert run_loop(SHORT, "temporal_fusion") == run_loop(SHORT, "temporal_fusion")
    assert set(EXECUTORS) == {"naive", "latest", "temporal_fusion"}
    assert set(RTC_EXECUTORS) == {"rtc_guided", "rtc_guided_identity", "rtc_hard_prefix"}
    with pytest.raises(ValueError, match="executor must be one of"):
        run_loop(SHORT, "rtc")


# The flow source: a flow-matching sampler of a Gaussian mixture, which real-time chunking conditions.

FLOW = LoopConfig(source="flow", duration_s=3.0)


def test_the_velocity_of_one_gaussian_is_the_closed_form():
    """K = 1: x_t ~ N((1 - t) mu, s^2 I), s^2 = (1 - t)^2 sigma^2 + t^2, so E[noise - x1 | x_t] =
    t / s^2 d - mu - (1 - t) sigma^2 / s^2 d with d = x_t - (1 - t) mu."""
    generator = torch.Generator().manual_seed(0)
    mu = torch.randn(1, 5, 2, generator=generator, dtype=torch.float64)
    x = torch.randn(4, 5, 2, generator=generator, dtype=torch.float64)
    sigma = 0.4
    for t in (0.95, 0.5, 0.1):
        s2 = (1 - t) ** 2 * sigma ** 2 + t ** 2
        expected = (t - (1 - t) * sigma ** 2) / s2 * (x - (1 - t) * mu) - mu
        torch.testing.assert_close(mixture_velocity(x, t, mu, sigma), expected, rtol=1e-12, atol=1e-12)


def test_the_mixture_velocity_is_the_posterior_mean_of_noise_minus_data():
    """K = 3 in 2-D against importance-weighted Monte Carlo: samples (x1, noise) of the joint, weighted by the
    density of x_t given x1, average noise - x1 with noise = (x_t - (1 - t) x1) / t."""
    generator = torch.Generator().manual_seed(1)
    means = torch.tensor([[-2.0, 0.0], [0.0, 1.5], [2.0, -1.0]], dtype=torch.float64)
    sigma = 0.5
    n = 400_000
    x1 = means[torch.randint(0, 3, (n,), generator=generator)] + sigma * torch.randn(n, 2, generator=generator,
                                                                                       dtype=torch.float64)
    for t, point in ((0.8, [0.5, 0.3]), (0.5, [-0.4, 0.2]), (0.3, [0.9, 0.1])):
        x_t = torch.tensor(point, dtype=torch.float64)
        log_w = -((x_t - (1 - t) * x1) ** 2).sum(1) / (2 * t * t)
        w = torch.softmax(log_w, 0)[:, None]
        monte_carlo = (w * ((x_t - (1 - t) * x1) / t - x1)).sum(0)
        exact = mixture_velocity(x_t[None], t, means, sigma)[0]
        torch.testing.assert_close(exact, monte_carlo, atol=0.05, rtol=0.0)
        assert not torch.allclose(exact, mixture_velocity(x_t[None], t, means[:1], sigma)[0], atol=0.2)


def test_euler_samples_land_on_the_modes_with_their_weights():
    means = torch.tensor([[-3.0, 0.0], [0.0, 3.0], [3.0, 0.0]], dtype=torch.float64)
    noise = torch.randn(3000, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    samples = euler_integrate(lambda x, t: mixture_velocity(x, t, means, 0.3), noise, 100).double()
    distance = torch.cdist(samples, means)
    nearest = distance.argmin(1)
    assert distance.min(1).values.max() < 1.6                 # every sample within ~5 sigma of a mode
    frequencies = torch.bincount(nearest, minlength=3) / len(samples)
    torch.testing.assert_close(frequencies, torch.full((3,), 1 / 3, dtype=frequencies.dtype), atol=0.04, rtol=0)


def test_guided_rtc_keeps_the_frozen_rows_of_the_previous_chunk_from_another_mode():
    config = FLOW
    source = FlowChunkSource(config)
    base = scripted_chunk(config, 1.0, target(config, 1.0), np.zeros(config.action_dim))
    previous = base + source.offsets[0]                        # the previous chunk: the lowest mode's mean
    means = torch.from_numpy((base[None] + source.offsets[:, None, :]) / source.unit)
    delay, unit = 5, source.unit
    plan = RtcRequest(previous, delay, "guided", execution_horizon=10).plan(ScaleNormalizer(unit), config.horizon,
                                                                             config.action_dim, config.action_dim)
    velocity = lambda x, t: mixture_velocity(x, t, means, config.flow_sigma)     # noqa: E731
    far = 0
    for seed in range(6):
        noise = torch.randn(1, config.horizon, config.action_dim, generator=torch.Generator().manual_seed(seed))
        guided = rtc_euler_integrate(velocity, noise, 10, plan)[0].double().numpy() * unit
        plain = euler_integrate(velocity, noise, 10)[0].double().numpy() * unit
        assert np.abs(guided[:delay] - previous[:delay]).max() < 0.5 * config.chunk_noise
        far += np.abs(plain[:delay] - previous[:delay]).max() > 2.0 * config.chunk_noise
    assert far >= 2                                            # without RTC, other modes come up


def test_guided_rtc_shrinks_the_seams_of_latest_at_100_ms():
    config = dataclasses.replace(FLOW, delay_s=0.1)
    latest, guided = run_loop(config, "latest"), run_loop(config, "rtc_guided")
    assert guided.switches == latest.switches > 10
    assert guided.seam_mean < 0.3 * latest.seam_mean, (guided, latest)
    assert guided.deadline_misses == latest.deadline_misses == 0


def test_flow_runs_share_the_noise_and_repeat_for_a_seed():
    config = dataclasses.replace(FLOW, delay_s=0.0, duration_s=1.5)
    # without delay no row is frozen: the hard prefix conditions nothing, and the same noise gives the same run
    assert run_loop(config, "rtc_hard_prefix") == dataclasses.replace(run_loop(config, "latest"),
                                                                       executor="rtc_hard_prefix")
    assert run_loop(FLOW, "rtc_guided_identity") == run_loop(FLOW, "rtc_guided_identity")
    with pytest.raises(ValueError, match="needs source='flow'"):
        run_loop(SHORT, "rtc_guided")
