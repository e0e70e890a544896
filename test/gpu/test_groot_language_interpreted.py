"""GR00T N1.6's language model on the engine's ops (engine/groot_language.py) with its Triton kernels, on the CPU
through Triton's interpreter: the RMSNorm with the residual add, q_norm / k_norm with RoPE writing the strided
query / key / value layout the attention reads (qkv_rope with head_norm), and SwiGLU, wired as on the GPU, give
transformers' Qwen3 features (tiny preset with a power-of-two head dim, fp32), for an unpadded prompt and on the real
tokens' rows of a right-padded one (the engine runs it causally with no mask: groot_static.language_features).
Runs only under TRITON_INTERPRET=1 with Triton installed and no GPU (tools/run_tests.sh's second pass); on a GPU
test/core/test_groot_graph_gpu.py covers the same path at Qwen3-1.7B's width."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from flashrt_core.engine.kernel_import import load_kernels

INTERPRET = (os.environ.get("TRITON_INTERPRET") == "1" and load_kernels().HAVE_TRITON
             and not torch.cuda.is_available())
pytestmark = pytest.mark.skipif(not INTERPRET, reason="runs the Triton kernels under TRITON_INTERPRET=1 on a CPU")


@pytest.mark.parametrize("pad", [0, 3])
def test_language_model_with_the_triton_kernels_equals_transformers(monkeypatch, pad):
    from test_groot_graph import TINY, inputs

    from flashrt_core.engine import Dispatch, Op, eager_cpu_dispatch
    from flashrt_core.engine.groot_language import prepare_language
    from flashrt_core.engine.groot_static import GrootSignature, StaticTables, image_tokens, language_features
    from flashrt_core.engine.ops import Ops
    from flashrt_core.groot_fixtures import random_groot_model
    from flashrt_core.model.groot.config import get_groot_config

    base = get_groot_config(TINY)
    model = random_groot_model(base.replace(llm=dataclasses.replace(base.llm, head_dim=16)), seed=5)
    plain = eager_cpu_dispatch()
    dispatch = Dispatch(plain.hardware, plain.options, {**plain.choice, Op.NORM: "triton", Op.QKV_ROPE: "triton",
                                                        Op.GEGLU: "triton", Op.KERNEL_LAUNCH: "pdl"})
    kernels, calls = load_kernels(), {}
    for name in ("residual_norm", "qkv_rope", "swiglu"):
        real = getattr(kernels, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)
    views, ids, mask = inputs(model, [(56, 56)], 7, seed=2, pad=pad)[:3]
    sig = GrootSignature.of(views, ids, mask)
    lang = prepare_language(model, Ops(dispatch))
    with torch.inference_mode():
        vit = image_tokens(model, StaticTables(model, sig, torch.device("cpu")), views, torch.float32)
        want = language_features(model, StaticTables(model, sig, torch.device("cpu")), vit, ids, mask)
        got = language_features(model, StaticTables(model, sig, torch.device("cpu"), language=lang), vit, ids, mask)
    real = mask[0]
    torch.testing.assert_close(got[:, real], want[:, real], rtol=2e-5, atol=2e-5)
    layers = model.cfg.llm.num_layers
    assert calls == {"residual_norm": 2 * layers + 1, "qkv_rope": layers, "swiglu": layers}
