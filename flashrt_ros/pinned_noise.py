"""Pinned flow-matching noise: the noise of an inference as a pure function of (seed, observation stamp).

The policy's flow integration starts from N(0, 1) noise of shape (horizon, 32). Drawing it freshly makes every
chunk unrepeatable; pinning it per observation makes a live replay of a bag comparable with the offline
evaluation of the same bag (flashrt_ros.bag_evaluator): the same observation (same stamp, same frames) gives
the same chunk, whichever process computed it and in whatever order.

    noise = observation_noise(seed, stamp_ns, horizon)   # (horizon, NOISE_WIDTH) float32

The node uses it when its ``noise_seed`` parameter is >= 0 (the stamp is the observation stamp, i.e. the oldest
camera stamp, in int nanoseconds); -1 keeps fresh random noise. Pure numpy: no rclpy, no torch.
"""

from __future__ import annotations

import numpy as np

NOISE_WIDTH = 32  # the flow runs in the padded 32-wide action space (docs/architecture.md)
NO_SEED = -1  # parameter value meaning: do not pin, draw fresh noise


def observation_noise(seed: int, stamp_ns: int, horizon: int, width: int = NOISE_WIDTH) -> np.ndarray:
    """Standard-normal noise (horizon, width) float32, determined only by ``seed`` and ``stamp_ns``.

    Uses numpy's PCG64 seeded by SeedSequence([seed, stamp_ns]), which is stable across numpy versions
    and platforms.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"noise seed must be an integer >= 0, got {seed!r}")
    if isinstance(stamp_ns, bool) or not isinstance(stamp_ns, (int, np.integer)) or stamp_ns < 0:
        raise ValueError(f"observation stamp must be integer nanoseconds >= 0, got {stamp_ns!r}")
    if horizon < 1 or width < 1:
        raise ValueError(f"noise shape must be positive, got ({horizon}, {width})")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(stamp_ns)])))
    return rng.standard_normal((horizon, width), dtype=np.float32)  # (horizon, width)
