"""tools/benchmark_rtc.py's previous chunk on the CPU (the benchmark itself times CUDA graphs: GPU only): the plain
chunk shifted by the delay, as a robot's pending actions are, with the soft mask of the guided modes and the frozen
rows of the others."""

from __future__ import annotations

import numpy as np
import pytest

from flashrt_core.rtc import prefix_weights
from tools.benchmark_rtc import plan_for


@pytest.mark.parametrize("mode", ["hard_prefix", "guided_identity", "guided", "training_time"])
def test_the_previous_chunk_is_the_plain_chunk_shifted_by_the_delay(mode):
    previous = np.random.default_rng(0).standard_normal((10, 32)).astype(np.float32)
    plan = plan_for(mode, previous, 4)
    target = plan.target[0].numpy()
    np.testing.assert_array_equal(target[:6], previous[4:])
    np.testing.assert_array_equal(target[6:], 0.0)
    assert plan.delay == 4 and plan.mode == mode
    if mode.startswith("guided"):
        np.testing.assert_array_equal(plan.weights.numpy(), prefix_weights(4, 6, 10, "exp").numpy())
        assert 0 < plan.weights[4] < 1 and plan.weights[6] == 0           # decays over the rows the old chunk had
    else:
        np.testing.assert_array_equal(plan.weights.numpy(), (np.arange(10) < 4).astype(np.float32))
