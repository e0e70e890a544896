"""GR00T N1.6's fused DiT (engine/groot_fused_dit.py) with its Triton norm kernel, on the CPU through Triton's
interpreter: the AdaLN / norm3 / output-modulation norms (LayerNorm with and without weight and bias, the residual
add from the previous GEMM or none before the first block, PDL launch mode) wired as on the GPU give the reference
executor's chunk (tiny preset, fp32), alone and with the engine's vision tower and language model. Runs only under TRITON_INTERPRET=1 with Triton installed and no GPU
(tools/run_tests.sh's second pass); on a GPU test/core/test_groot_graph_gpu.py covers the same path for real."""

from __future__ import annotations

import os

import pytest
import torch

from flashrt_core.engine.kernel_import import load_kernels

INTERPRET = (os.environ.get("TRITON_INTERPRET") == "1" and load_kernels().HAVE_TRITON
             and not torch.cuda.is_available())
pytestmark = pytest.mark.skipif(not INTERPRET, reason="runs the Triton kernels under TRITON_INTERPRET=1 on a CPU")


@pytest.mark.parametrize("engine_backbone", [False, True])
def test_fused_dit_with_the_triton_norm_equals_the_reference(monkeypatch, engine_backbone):
    """engine_backbone: the vision tower and the language model on the engine's ops too (their norms on the same
    kernel: 2 per layer, the post-LayerNorm and the projector's per view size; 2 per layer and the final norm)."""
    from test_groot_graph import TINY, inputs

    from flashrt_core.engine import Dispatch, Op, eager_cpu_dispatch
    from flashrt_core.engine.groot_graph import GrootGraphExecutor
    from flashrt_core.groot_fixtures import random_groot_model
    from flashrt_core.groot_policy import GrootReferenceExecutor

    plain = eager_cpu_dispatch()
    dispatch = Dispatch(plain.hardware, plain.options, {**plain.choice, Op.NORM: "triton", Op.KERNEL_LAUNCH: "pdl"})
    model = random_groot_model(TINY, seed=5)
    fused = GrootGraphExecutor(model, "cpu", capture=False, dispatch=dispatch, engine_vision=engine_backbone,
                               engine_language=engine_backbone)
    assert fused.fused_dit
    kernels, launches = load_kernels(), []
    real = kernels.residual_norm

    def counted(*args, **kwargs):                    # the real launcher, each launch's PDL mode recorded
        launches.append(kwargs.get("pdl"))
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "residual_norm", counted)
    args = inputs(model, [(56, 84), (56, 56)], 5, seed=1, pad=2)
    want = GrootReferenceExecutor(model, torch.device("cpu")).sample_actions(*args)
    torch.testing.assert_close(fused.sample_actions(*args), want, rtol=5e-5, atol=5e-5)
    cfg = model.cfg
    norms = cfg.num_inference_timesteps * (2 * cfg.dit.num_layers + 1)
    if engine_backbone:                              # two view sizes: two vision batches
        norms += 2 * (2 * cfg.vision.depth + 2) + 2 * cfg.llm.num_layers + 1
    assert launches == [1] * norms                   # every norm in Triton
