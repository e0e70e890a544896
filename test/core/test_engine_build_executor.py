"""flashrt_core.engine.build_executor, the one place an executor is built (load_model calls it): the reference
executor for hardware="reference" and on the CPU, a clear error for GPU hardware asked on the CPU. The graph engine
it builds on a GPU is test/gpu/test_engine_gpu.py's."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine import EngineOptions, build_executor
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import write_random_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp("pi05_tiny"), "pi05_tiny", seed=7)
    return load_model_weights(ckpt, get_config("pi05_tiny"), "cpu", torch.float32)


def test_reference_and_cpu_give_the_reference_executor(tiny):
    cpu = torch.device("cpu")
    for hardware, options in (("reference", None), ("auto", None), ("auto", EngineOptions(fp8=True))):
        assert type(build_executor(tiny, tiny.config, cpu, hardware, options)) is ReferenceExecutor


def test_gpu_hardware_on_the_cpu_is_refused_by_name(tiny):
    with pytest.raises(ValueError, match="hardware='sm90' needs a CUDA device, got cpu"):
        build_executor(tiny, tiny.config, "cpu", "sm90")
