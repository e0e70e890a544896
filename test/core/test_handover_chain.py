"""kernels/flashrt_kernels/handover_chain.py on the CPU: the values its kernel writes are exact in fp32 and differ
from one step to the next at every element, the CUDA C++ source builds with nvcc and exports its C functions (where
nvcc is installed), and bad sizes get a clear error. The kernel itself runs in
test/gpu/test_kernels.py::test_handover_chain_every_step_reads_the_step_before."""

from __future__ import annotations

import ctypes
import importlib

import pytest
import torch

from flashrt_core.engine.kernel_import import load_kernels

K = load_kernels()
HC = importlib.import_module(K.__name__ + ".handover_chain")
BUILD = importlib.import_module(K.__name__ + ".cuda_build")


def test_each_step_writes_other_exact_values():
    """A stale read is caught only where the step before wrote something else: value(s, i) != value(s - 1, i) at
    every element, and every value is an integer below 2^16, exact in fp32."""
    i = torch.arange(10 * 2048)
    for step in (1, 2, 719, 1999):
        now, before = HC.value(step, i), HC.value(step - 1, i)
        assert bool((now != before).all())
        assert bool((now == now.round()).all()) and float(now.max()) < 2 ** 16


@pytest.mark.parametrize("elems, steps, cluster", [(6, 10, 1), (-4, 10, 1), (8, 0, 1), (8, 10, 4), (16, 10, 3)])
def test_bad_sizes_are_named(elems, steps, cluster):
    with pytest.raises(ValueError, match="elems must be|steps must be|cluster must be"):
        K.HandoverChain(elems, steps, cluster=cluster)


@pytest.mark.skipif(not K.cuda_build_available(), reason="no nvcc on this machine")
def test_the_kernel_builds_and_exports_its_launcher():
    lib = ctypes.CDLL(str(BUILD.build_library(HC.LIBRARY)))
    assert lib.handover_chain_threads() == 256
    assert lib.handover_chain_max_stage_elems() == 20 * 1024            # 80 KB: the four-GEMM down GEMM's A
    assert lib.handover_chain_slices() == HC.SLICES == 8                # one slice per warp
    for name in ("handover_chain_launch", "handover_chain_max_ctas", "handover_chain_error_string"):
        assert hasattr(lib, name)
    if not torch.cuda.is_available():
        assert lib.handover_chain_max_ctas(1) == -1                     # no device: says so, does not crash
        assert lib.handover_chain_max_ctas(4) == -1
        with pytest.raises(RuntimeError, match="no CUDA device"):
            K.HandoverChain(40, 10)


@pytest.mark.parametrize("form", [{"cluster": 2}, {"readers": 8}, {"wait_inputs": False}, {"elems": 10 * 1024 + 4},
                                  {"elems": 0}, {"slices": 4}])
def test_the_sliced_hand_over_names_what_it_cannot_run(form):
    """Before any build or launch: slices of 8 without clusters, every CTA reading, the waits on, whole slices."""
    args = {"elems": 10 * 1024, "slices": HC.SLICES, **form}
    with pytest.raises(ValueError, match="sliced hand-over runs without clusters|slices must be 1 or 8"):
        K.HandoverChain(args.pop("elems"), 10, **args)


def test_slice_writers_counts_each_share_in_every_slice_it_touches():
    """132 shares of 10 x 1024 values over 8 slices of 1280: each slice gains the CTAs whose share touches it, the
    shares that straddle two slices counted in both; one CTA per slice when the CTAs are the slices."""
    writers = HC.slice_writers(10 * 1024, 132)
    shares = [(10 * 1024 * c // 132, 10 * 1024 * (c + 1) // 132) for c in range(132)]
    straddling = sum(1 for b, e in shares if b // 1280 != (e - 1) // 1280)
    assert writers == [17] * 8 and sum(writers) == 132 + straddling and straddling == 4
    assert HC.slice_writers(64, 8) == [1] * 8 and HC.slice_writers(64, 16) == [2] * 8
