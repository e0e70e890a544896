"""The torch.compile variants of the engine benchmark capture the reference path without changing its result.

The benchmark (tools/benchmark_engine.py) times the reference under inductor with mode="max-autotune" on the GPU;
here the same wiring runs with dynamo's "eager" backend on the CPU: the capture of each compiled region (the
whole sample_actions, its three stages, or each layer) must run and return the eager reference's actions; the stage
scope must trace the denoise step once for all Euler steps, and the layer scope each kind of layer once for all
layers of that kind.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from flashrt_core.executor import ReferenceExecutor
from test.core.test_model_pi import inputs, random_model
from tools.benchmark_engine import COMPILED_STAGES, compile_reference

# Same ops in the same order: only dynamo's graph breaks separate the two paths.
COMPILED_VS_EAGER_TOL = 1e-5


# regional compilation: SigLIP layer, backbone qkv and finish, expert qkv and finish
LAYER_REGIONS = 5


@pytest.mark.parametrize("scope", ["layers", "stages", "whole"])
@pytest.mark.parametrize("config", ["pi05_tiny", "pi0_tiny"])
def test_compiled_reference_returns_the_eager_actions(config, scope):
    torch._dynamo.reset()
    model = random_model(config)
    pixels, image_masks, tokens, token_masks, state, x_t, _ = inputs(model)
    state = state if model.config.model_type == "pi0" else None
    expected = ReferenceExecutor(model, model.config, torch.device("cpu")).sample_actions(
        pixels, image_masks, tokens, token_masks, state, x_t)
    ref = ReferenceExecutor(model, model.config, torch.device("cpu"))
    counter = CompileCounter()
    compiled = compile_reference(ref, "max-autotune", scope, backend=counter)
    with torch.no_grad():
        actions = compiled(pixels, image_masks, tokens, token_masks, state, x_t)
        again = compiled(pixels, image_masks, tokens, token_masks, state, x_t)
    torch.testing.assert_close(actions, expected, atol=COMPILED_VS_EAGER_TOL, rtol=COMPILED_VS_EAGER_TOL)
    torch.testing.assert_close(again, actions, atol=0, rtol=0)
    if scope == "stages":
        # one frame per stage (+ graph breaks inside them); never one per Euler step, never recompiled on call 2
        assert len(COMPILED_STAGES) <= counter.frame_count < model.config.num_steps
    elif scope == "layers":
        # one graph per kind of region, shared by every layer of that kind and every Euler step
        cfg = model.config
        assert cfg.vision.depth > 1 and cfg.paligemma.depth > 1 and cfg.expert.depth > 1
        assert counter.frame_count == LAYER_REGIONS
    else:
        assert counter.frame_count >= 1


def test_unknown_scope_is_refused():
    model = random_model("pi05_tiny")
    with pytest.raises(ValueError, match="compile scope"):
        compile_reference(ReferenceExecutor(model, model.config, torch.device("cpu")), "default", "modules")


def test_region_outputs_are_the_callers_own():
    """_owned_outputs clones what a compiled region returns (tensors, also inside tuples), so a CUDA graph replay
    of the same region for the next layer cannot overwrite an output still in use."""
    from tools.benchmark_engine import _owned_outputs
    buf = torch.arange(4.0)
    pair = _owned_outputs(lambda: (buf, (buf, 3)))()
    single = _owned_outputs(lambda: buf)()
    buf.add_(10)                                              # the "next replay" writes the static buffer
    assert torch.equal(single, torch.arange(4.0)) and torch.equal(pair[0], torch.arange(4.0))
    assert torch.equal(pair[1][0], torch.arange(4.0)) and pair[1][1] == 3
