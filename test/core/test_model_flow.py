"""Euler integrator (flashrt_core.flow) on analytic velocity fields."""

import numpy as np
import torch

from flashrt_core.flow import euler_integrate, time_schedule

EXACT_TOL = 1e-6


def test_time_schedule_starts_at_noise_and_steps_by_minus_one_over_n():
    ts = time_schedule(10)
    assert len(ts) == 10
    assert ts[0] == 1.0
    np.testing.assert_allclose(np.diff(ts), -0.1, atol=1e-6)
    assert abs(ts[-1] - 0.1) < 1e-6
    # fp32 accumulation, as openpi / lerobot do it (not 1 - k/10 in fp64)
    t = np.float32(1.0)
    for expected in ts:
        assert np.float32(expected) == t
        t = np.float32(t + np.float32(-0.1))


def test_constant_velocity_reaches_data_exactly():
    # Straight flow-matching path x_t = t * noise + (1 - t) * data has v = noise - data for every t.
    gen = torch.Generator().manual_seed(0)
    noise, data = torch.randn(2, 5, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    seen_t = []

    def velocity(x, t):
        seen_t.append(t)
        return noise - data

    out = euler_integrate(velocity, noise, num_steps=10)
    torch.testing.assert_close(out, data, atol=EXACT_TOL, rtol=0)
    assert seen_t == time_schedule(10)


def test_linear_field_matches_closed_form_euler_product():
    # dx/dt = x: each Euler step with dt = -1/n multiplies by (1 - 1/n).
    noise = torch.randn(3, 7)
    out = euler_integrate(lambda x, t: x, noise, num_steps=10)
    torch.testing.assert_close(out, noise * 0.9**10, atol=EXACT_TOL, rtol=1e-5)
    # time-dependent field dx/dt = t: x(0) = x(1) - sum_k t_k * (1/n)
    out = euler_integrate(lambda x, t: torch.full_like(x, t), noise, num_steps=4)
    torch.testing.assert_close(out, noise - (1.0 + 0.75 + 0.5 + 0.25) / 4, atol=EXACT_TOL, rtol=0)
