"""An FP8 policy on the CPU: the graph engine's executor, eager, with the plain-PyTorch ops and the FP8 GEMMs of
the backbone's MLP (torch._scaled_mm runs on the CPU; the input quantization takes its torch form there). The
product refuses precision='fp8' on the CPU (no FP8 tensor cores); this builds the same executor by its dispatch
table, so the calibration flow (refusal, warm-up, calibration, gate, scale cache) runs in CPU tests."""

from __future__ import annotations

import torch

from flashrt_core.api import Policy
from flashrt_core.engine.dispatch import Dispatch, EngineOptions, Op, eager_cpu_dispatch
from flashrt_core.engine.graph_executor import EngineExecutor

TEXT_BUCKETS = (150, 180)      # above the demo's pi0.5 state bins: every bucket is reachable


def cpu_dispatch(fp8: bool, text_buckets=TEXT_BUCKETS) -> Dispatch:
    base = eager_cpu_dispatch(EngineOptions(text_buckets=text_buckets))
    return Dispatch(base.hardware, base.options, {**base.choice, Op.GEMM_PREFIX: "fp8" if fp8 else "bf16"})


def cpu_engine_policy(base: Policy, fp8: bool = True, dtype: torch.dtype = torch.float32,
                      checkpoint_dir=None) -> Policy:
    """A Policy over base's model, tokenizer and normalization, run by a CPU engine executor of its own."""
    executor = EngineExecutor(base.model, base.config, torch.device("cpu"), cpu_dispatch(fp8), dtype=dtype)
    policy = Policy(base.model, base.config, executor, base.tokenizer, base.normalizer, base.device, base.model_id)
    policy.checkpoint_dir = checkpoint_dir
    return policy
