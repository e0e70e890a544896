"""The critical-path arithmetic of tools/profile_engine_timeline.py: what each kernel adds to a replay's span when
kernels overlap (programmatic dependent launch starts a kernel before the one ahead has finished)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
pytest.importorskip("torch")

from profile_engine_timeline import critical_path, denoise_layer_span  # noqa: E402


def test_increments_sum_to_the_span_and_charge_waiting_to_the_kernel_ahead():
    kernels = [("b", 5.0, 12.0),      # starts early (PDL) while a runs, ends 2 us after a
               ("a", 0.0, 10.0),
               ("c", 6.0, 11.0),      # ends inside the span already covered: adds nothing
               ("d", 15.0, 16.0)]     # after a 3 us gap: the gap is on the critical path
    got = critical_path(kernels)
    assert [k[0] for k in got] == ["a", "b", "c", "d"]            # launch (start) order
    assert [k[1] for k in got] == [10.0, 2.0, 0.0, 4.0]
    assert [k[2] for k in got] == [10.0, 7.0, 5.0, 1.0]           # own durations, waiting included
    assert sum(k[1] for k in got) == 16.0                          # first start to last end


def test_serial_kernels_add_their_durations():
    got = critical_path([("x", 0.0, 2.0), ("y", 2.5, 3.0)])
    assert [k[1] for k in got] == [2.0, 1.0]


def test_one_denoising_layer_runs_from_its_first_norm_to_the_next_layers_with_memsets_counted():
    prefix = ["_residual_norm_kernel", "nvjet_qkv", "_attn_split_kernel", "nvjet_o"]       # one prefix layer
    layer = ["_ada_rms_norm_kernel", "Memset (Device)", "_smem_gemm_kernel", "_attn_split_kernel",
             "_attn_combine_kernel", "_smem_gemm_kernel", "_ada_rms_norm_kernel", "_smem_gemm_kernel",
             "_smem_gemm_kernel"]
    steps, depth = 3, 4
    names = prefix + layer * (steps * depth) + ["_euler_kernel"]
    a, b = denoise_layer_span(names, steps, depth, step=1, layer=2)
    assert names[a:b] == layer                                   # the memset inside, from norm1 to norm1
    assert a == len(prefix) + (1 * depth + 2) * len(layer)
    assert denoise_layer_span(names, steps, depth, step=3, layer=2) is None          # no step 3
    assert denoise_layer_span(names[:len(prefix) + len(layer)], steps, depth) is None   # too few launches
