"""The inference engine: hardware detection, one dispatch table, prepared weights, CUDA-graph replay.

`build_executor(model, config, device, hardware)` returns an object with the executor contract of
flashrt_core.executor (sample_actions / close): the graph engine where the dispatch table picks it (a CUDA or
ROCm GPU with fast paths on), otherwise the eager reference executor. See docs/engine.md.
"""

from __future__ import annotations

import torch

from flashrt_core.config import ModelConfig

from .dispatch import Dispatch, EngineOptions, Op, Switch, resolve
from .hardware import Hardware, detect_hardware

__all__ = ["Dispatch", "EngineOptions", "Hardware", "Op", "Switch", "build_executor", "detect_hardware", "resolve"]


def build_executor(model, config: ModelConfig, device: torch.device | str, hardware: str | Hardware = "auto",
                   options: EngineOptions | None = None, action_affine=None):
    """The executor the dispatch table picks for this device, hardware setting and options (env vars applied).
    action_affine: (scale, offset) of the action unnormalization (Normalizer.action_affine), which the graph
    engine can apply inside its graph (predict_observation(unnormalize=True)); the reference executor ignores it."""
    device = torch.device(device)
    hw = detect_hardware(hardware, device)
    dispatch = resolve(hw, EngineOptions.from_env(options))
    if dispatch[Op.EXECUTOR] == "reference" or device.type != "cuda":
        from flashrt_core.executor import ReferenceExecutor
        return ReferenceExecutor(model, config, device)
    from .graph_executor import EngineExecutor
    return EngineExecutor(model, config, device, dispatch, action_affine=action_affine)
