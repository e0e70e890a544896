"""The inference engine: hardware detection, one dispatch table, prepared weights, CUDA-graph replay.

`build_executor(model, config, device, hardware, options)` returns an object with the executor contract of
flashrt_core.executor (sample_actions / close): the graph engine where the dispatch table picks it (a CUDA or
ROCm GPU with fast paths on), otherwise the eager reference executor. See docs/engine.md and, for every option,
docs/engine_options.md.
"""

from __future__ import annotations

import torch

from flashrt_core.config import ModelConfig, ModelType
from flashrt_core.executor import ReferenceExecutor

from .dispatch import Dispatch, Op, eager_cpu_dispatch, resolve
from .graph_executor import EngineExecutor
from .hardware import Hardware, detect_hardware
from .options import DEFAULT_TEXT_BUCKETS, EngineOptions

__all__ = ["DEFAULT_TEXT_BUCKETS", "Dispatch", "EngineExecutor", "EngineOptions", "Hardware", "Op", "build_executor",
           "detect_hardware", "eager_cpu_dispatch", "resolve", "resolve_dispatch"]


def resolve_dispatch(device: torch.device | str, hardware: str | Hardware = "auto",
                     options: EngineOptions | None = None) -> Dispatch | None:
    """The dispatch table for this device and hardware setting, or None where the eager reference executor serves:
    hardware="reference", a CPU device with hardware="auto" (another hardware on a CPU is refused), or a table that
    picks the reference (fast paths off). options None reads the defaults with the environment on top
    (EngineOptions.from_env). Every model family's executor choice goes through here."""
    device = torch.device(device)
    if hardware == "reference":
        return None
    if device.type != "cuda":
        if hardware != "auto":
            raise ValueError(f"hardware={hardware!r} needs a CUDA device, got {device}")
        return None
    options = EngineOptions.from_env() if options is None else options
    dispatch = resolve(detect_hardware(hardware, device), options)
    return None if dispatch[Op.EXECUTOR] == "reference" else dispatch


def build_executor(model, config: ModelConfig, device: torch.device | str, hardware: str | Hardware = "auto",
                   options: EngineOptions | None = None, action_affine=None):
    """The executor for this device, hardware setting and options: the reference executor where resolve_dispatch
    says so, else the graph engine (or its ops launched eagerly) that the dispatch table picks.
    action_affine: (scale, offset) of the action unnormalization (Normalizer.action_affine), which the graph engine
    applies inside its graph (predict_observation(unnormalize=True)); the reference executor ignores it."""
    if config.model_type == ModelType.PI0_FAST:
        raise ValueError("pi0-FAST decodes tokens: its executors are pi0_fast_policy.fast_executor's (the reference "
                         "one, or engine/fast_decode.py's FastGraphExecutor), not build_executor's")
    device = torch.device(device)
    dispatch = resolve_dispatch(device, hardware, options)
    if dispatch is None:
        return ReferenceExecutor(model, config, device)
    return EngineExecutor(model, config, device, dispatch, action_affine=action_affine)
