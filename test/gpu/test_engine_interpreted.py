"""The engine forward with its Triton kernels, on the CPU through Triton's interpreter, against the reference.

test/gpu/test_kernels.py checks each kernel alone; this checks how the engine wires them (dispatch -> ops ->
forward): RoPE inside the attention or before it, the suffix keys read from the QKV output, split-K partials
summed by the norms, the GeGLU epilogue, PDL launches (a no-op wait in the interpreter). Tiny pi0.5 / pi0 configurations in fp32 (the interpreter has no bf16 dot), eager engine (no CUDA
graph on the CPU), decoder GEMM configurations that fit the tiny widths.

Runs only under TRITON_INTERPRET=1 with Triton installed and no GPU: `tools/run_tests.sh` does that in its second
pass (and so CI). On a GPU the same wiring is covered by test/gpu/test_engine_gpu.py at full size.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from flashrt_core.engine.kernel_import import load_kernels

INTERPRET = (os.environ.get("TRITON_INTERPRET") == "1" and load_kernels().HAVE_TRITON
             and not torch.cuda.is_available())
pytestmark = pytest.mark.skipif(not INTERPRET, reason="runs the Triton kernels under TRITON_INTERPRET=1 on a CPU")

FP32_ATOL = 5e-5            # fp32 throughout; the kernels sum in another order than the reference


def _triton_dispatch(decoder_qkv: str, tuning_cache: str = "", **picks):
    from flashrt_core.engine import Dispatch, EngineOptions, Op, detect_hardware
    choice = {Op.EXECUTOR: "eager_engine", Op.ATTENTION: "math", Op.MQA: "triton", Op.GEMM_PREFIX: "bf16",
              Op.GEMM_DECODER: "triton", Op.FP8_FORMAT: "e4m3fn", Op.NORM: "triton", Op.ADA_NORM: "triton",
              Op.GEGLU: "triton", Op.QKV_ROPE: "triton", Op.DECODER_QKV: decoder_qkv, Op.EULER: "triton",
              Op.KERNEL_LAUNCH: "pdl", Op.GEMM_EPILOGUE: "separate", Op.CHAIN_TUNING: "isolated",
              Op.FP8_FUSED_QUANT: "fused", Op.SMEM_GEMM: "none", Op.PREFIX_ATTENTION_TUNING: "mqa",
              Op.VISION_ATTENTION_TUNING: "default", Op.FUSED_PATCH_EMBED: "reference",
              Op.FUSED_DENOISE_STEP: "separate", Op.FUSED_DENOISE_STEP_PI0: "separate", Op.SMEM_GEMM_ROWS: "none", Op.PREFIX_ATTENTION_WGMMA: "none",
              Op.OVERLAP_FIRST_STEP: "two_streams"}
    choice.update({Op(op): impl for op, impl in picks.items()})
    assert set(choice) == set(Op), "every op needs a choice here"
    return Dispatch(detect_hardware("sm90"), EngineOptions(text_buckets=(16, 32), tuning_cache=tuning_cache), choice)


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def model(request, tmp_path_factory):
    from flashrt_core.checkpoint import load_model_weights
    from flashrt_core.config import get_config
    from flashrt_core.fixtures import write_random_checkpoint
    ckpt = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(ckpt, request.param, seed=4)
    cfg = get_config(request.param)
    # pi0_tiny's horizon is 50 (51 suffix rows: RoPE before the attention); 10 puts pi0 under rope_in_attention
    # too (11 rows). 3 denoising steps instead of 10 keep the interpreter quick; the steps are alike.
    return load_model_weights(ckpt, cfg.replace(action_horizon=10, num_steps=3), "cpu", torch.float32)


def _engine(model, decoder_qkv: str, tuning_cache: str = "", **picks):
    from flashrt_core.engine.graph_executor import EngineExecutor
    from flashrt_core.engine.kernel_configs import SkinnyConfig
    engine = EngineExecutor(model, model.config, torch.device("cpu"),
                            _triton_dispatch(decoder_qkv, tuning_cache, **picks), dtype=torch.float32)
    e = model.config.expert
    # the tiny expert's K: width 32 (qkv, gate_up), heads x head_dim 64 (o), mlp 64 (down); o and down split-K
    engine.ops.decoder_impl = {"qkv": SkinnyConfig(16, 32, 1, 2), "gate_up": SkinnyConfig(16, 32, 1, 2),
                               "o": SkinnyConfig(16, 32, 2, 2), "down": SkinnyConfig(16, 32, 2, 2)}
    assert (e.width, e.num_heads * e.head_dim, e.mlp_dim) == (32, 64, 64)
    return engine


def _actions_and_reference(engine, model, seed: int, n_text: int = 9, views: tuple = (0, 1)):
    """The engine's actions and the reference executor's on one random observation (test_engine_forward._inputs
    with `seed`), and that observation's inputs."""
    from test_engine_forward import _inputs, _reference
    inputs = _inputs(model.config, np.random.default_rng(seed), n_text, views)
    return engine.predict_observation(*inputs), _reference(model, *inputs).numpy(), inputs


def _record_triton_launches(engine, monkeypatch) -> dict[str, list]:
    """The Triton launchers the forward calls, by name: one entry per launch, its PDL mode (the `pdl` keyword).
    The PyTorch references are not recorded."""
    calls: dict[str, list] = {}
    for name in ("skinny_gemm", "decoder_attention", "attention", "qkv_rope", "ada_rms_norm", "residual_norm",
                 "euler", "geglu", "patch_rows", "denoise_step_in", "denoise_step_out", "time_mlp_in"):
        fn = getattr(engine.ops.k, name)

        def recorded(*args, _fn=fn, _name=name, **kwargs):
            calls.setdefault(_name, []).append(kwargs.get("pdl"))
            return _fn(*args, **kwargs)
        monkeypatch.setattr(engine.ops.k, name, recorded)
    return calls


@pytest.mark.parametrize("decoder_qkv", ["rope_in_attention", "separate"])
def test_engine_with_triton_kernels_matches_the_reference(model, decoder_qkv, monkeypatch):
    engine = _engine(model, decoder_qkv)
    launches = _record_triton_launches(engine, monkeypatch)
    got, want, _ = _actions_and_reference(engine, model, 2)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    calls = {name: len(modes) for name, modes in launches.items()}
    steps, layers = len(engine.weights.dts), model.config.expert.depth
    assert calls.get("skinny_gemm", 0) == 4 * steps * layers                  # every expert GEMM ran in Triton
    if decoder_qkv == "rope_in_attention":
        assert calls.get("decoder_attention", 0) == steps * layers
        assert calls.get("qkv_rope", 0) == model.config.paligemma.depth         # the prefix only
    else:
        assert "decoder_attention" not in calls
        assert calls.get("qkv_rope", 0) == model.config.paligemma.depth + steps * layers


@pytest.mark.parametrize("views", [(0, 1), (1,)])
def test_fused_patch_embedding_matches_the_reference(model, views, monkeypatch):
    """The fused patch embedding (flashrt_kernels/patch_embed.py per present view, the patch GEMM in the engine dtype, the
    position embedding + bias added in one step): the actions are the reference's, one patch_rows launch per
    present view; without it the torch path runs and launches none."""
    engine = _engine(model, "rope_in_attention")
    engine.ops.fused_patch_embed = True
    launches = _record_triton_launches(engine, monkeypatch)
    got, want, inputs = _actions_and_reference(engine, model, 4, views=views)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    assert len(launches.get("patch_rows", [])) == len(views)
    engine.ops.fused_patch_embed = False
    launches.clear()
    engine.predict_observation(*inputs)
    assert "patch_rows" not in launches


def test_fused_patch_embedding_pads_588_wide_patch_rows(tmp_path_factory, monkeypatch):
    """flashrt_kernels/patch_embed.py at SigLIP's patch size (14 px: 588-wide rows, padded to 592 with zeros for the patch
    GEMM), two present 56 x 56 views: the actions are the reference's."""
    from test_engine_forward import tiny_model_with_14px_patches
    model = tiny_model_with_14px_patches(tmp_path_factory.mktemp("pi05_tiny_14px"))
    engine = _engine(model, "rope_in_attention")
    engine.ops.fused_patch_embed = True
    launches = _record_triton_launches(engine, monkeypatch)
    got, want, _ = _actions_and_reference(engine, model, 7)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    assert len(launches.get("patch_rows", [])) == 2
    assert engine.weights.patch_gemm_tables()[0].shape[1] == 592


def test_fused_denoise_step_ends_match_the_reference(model, monkeypatch):
    """pi0.5 with each denoising step's ends fused (flashrt_kernels/denoise_step.py): one denoise_step_in and one
    denoise_step_out launch per step, no Euler kernel and only the later layers' first norms as ada_rms_norm
    launches; the actions are the reference's. pi0 has no such path: the switch changes nothing there."""
    engine = _engine(model, "rope_in_attention")
    engine.ops.fused_denoise_step = True
    launches = _record_triton_launches(engine, monkeypatch)
    got, want, _ = _actions_and_reference(engine, model, 8)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    steps, layers = len(engine.weights.dts), model.config.expert.depth
    if model.config.model_type == "pi05":
        assert len(launches["denoise_step_in"]) == len(launches["denoise_step_out"]) == steps
        assert "euler" not in launches
        assert len(launches["ada_rms_norm"]) == steps * (2 * layers - 1)
    else:
        assert "denoise_step_in" not in launches and len(launches["euler"]) == steps


def test_pi0_fused_step_ends_match_the_reference(model, monkeypatch):
    """pi0 with its step ends fused (fused_denoise_step_pi0, the default): one time_mlp_in and one denoise_step_out
    launch per step (the time MLP's input GEMMs folded into one table at load), no Euler kernel; the actions are
    the reference's. pi0.5's step ends are its own: the switch changes nothing there."""
    from flashrt_core.engine.forward import pi0_fused_step_ends
    engine = _engine(model, "rope_in_attention")
    engine.ops.fused_denoise_step = engine.ops.fused_denoise_step_pi0 = True
    launches = _record_triton_launches(engine, monkeypatch)
    got, want, _ = _actions_and_reference(engine, model, 9)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    steps = len(engine.weights.dts)
    if model.config.model_type == "pi05":
        assert not pi0_fused_step_ends(engine.weights, engine.ops) and "time_mlp_in" not in launches
        assert len(launches["denoise_step_in"]) == steps
    else:
        assert pi0_fused_step_ends(engine.weights, engine.ops)
        assert len(launches["time_mlp_in"]) == len(launches["denoise_step_out"]) == steps
        assert "euler" not in launches and "denoise_step_in" not in launches
        tables = engine.weights.pi0_step_tables()
        assert tables.c.shape == (steps, model.config.expert.width) and torch.equal(tables.zeros,
                                                                                    torch.zeros_like(tables.zeros))


def test_launch_policy_reaches_each_denoiser_kernel(model, monkeypatch):
    """A launch policy (kernel_configs.LAUNCH_POLICIES) sets the PDL mode per kernel site: under "before_one_shot" the expert's
    first norm and its attention release the next kernel at their start (EARLY_TRIGGER), every other kernel after
    its wait (1); the actions are the reference's either way (under the interpreter PDL is a no-op, so this checks
    the modes handed to the launchers and that the kernels take them)."""
    engine = _engine(model, "rope_in_attention")
    engine.ops.set_launch_policy("before_one_shot")
    modes = _record_triton_launches(engine, monkeypatch)
    got, want, _ = _actions_and_reference(engine, model, 5)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    early = engine.ops.k.EARLY_TRIGGER
    steps, layers = len(engine.weights.dts), model.config.expert.depth
    assert modes["decoder_attention"] == [early] * (steps * layers)
    assert set(modes["skinny_gemm"]) == {1} and set(modes["euler"]) == {1}
    norms = modes["ada_rms_norm"] if model.config.model_type == "pi05" else modes["residual_norm"]
    assert norms.count(early) == steps * layers                                 # each layer's first norm


def test_tuning_cache_entry_is_checked_and_used_or_left_aside(model, tmp_path, monkeypatch):
    """The engine's side of the tuning cache with the real Triton GEMMs (the measuring itself needs a GPU): an
    entry under the engine's own key is read by _tune_at_load, each name mapped to one of the engine's candidates
    and product-checked, and the forward then runs those picks and matches the reference; an entry naming a
    candidate the engine does not have is refused and leaves every pick as it was. The full-size candidates do
    not fit the tiny expert's widths, so each kind is offered one Triton configuration that does."""
    from flashrt_core.engine import kernel_configs, load_tuning, tuning
    from flashrt_core.engine.tuning_cache import TuningCache
    for kind, split in (("qkv", 1), ("gate_up", 1), ("o", 2), ("down", 2)):
        monkeypatch.setitem(kernel_configs.SKINNY_CANDIDATES, kind, [kernel_configs.SkinnyConfig(16, 16, split, 2)])
    engine = _engine(model, "rope_in_attention", tuning_cache=str(tmp_path))
    assert engine.tuning_source == "none"                     # a CPU engine measures nothing at load
    kinds = ("qkv", "o", "gate_up", "down")
    x = {kind: torch.zeros(engine.suffix_len, getattr(engine.weights.expert[0], kind).parts[0][0].shape[1])
         for kind in kinds}
    candidates = {kind: tuning.decoder_candidates(engine.ops, kind, x[kind], getattr(engine.weights.expert[0], kind),
                                                  model.config.expert.head_dim) for kind in kinds}
    assert all(str(c[-1]).startswith("triton(") for c in candidates.values()), candidates
    picks = {"launch_policy": "all", "decoder": {kind: str(c[-1]) for kind, c in candidates.items()}}
    key = engine.tuning_key(torch.float32)
    assert key["gpu"] == {"name": "cpu"} and "tuning_cache" not in key["options"]
    TuningCache(tmp_path).store(key, picks)
    before = dict(engine.ops.decoder_impl)
    load_tuning.tune_at_load(engine, torch.float32)
    assert engine.tuning_source == "cache" and engine.tuning_cache_path == TuningCache(tmp_path).path(key)
    assert engine.tuning_picks() == picks and engine.ops.early_sites                  # policy "all": sites set
    assert {k: str(v) for k, v in engine.ops.decoder_impl.items()} != {k: str(v) for k, v in before.items()}
    got, want, _ = _actions_and_reference(engine, model, 5)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    engine.ops.decoder_impl = dict.fromkeys(kinds, "library")
    engine.ops.set_launch_policy("none")
    bad = {**picks, "decoder": {**picks["decoder"], "gate_up": "triton(n999)"}}     # qkv and o would fit
    assert not load_tuning.use_tuning_picks(engine, bad, True, False, False)
    assert engine.ops.decoder_impl == dict.fromkeys(kinds, "library")              # nothing changed
    assert not load_tuning.use_tuning_picks(engine, {**picks, "launch_policy": "sideways"}, True, False, False)
    assert engine.ops.decoder_impl == dict.fromkeys(kinds, "library") and engine.ops.launch_policy == "none"
    assert engine.ops.early_sites == kernel_configs.LAUNCH_POLICIES["none"] and engine.tuned_decoder_kinds == ()


def test_overlapped_first_step_keeps_the_actions_of_the_sequential_forward(model, monkeypatch):
    """overlap_first_step (the default): the first denoising step's layers interleaved with the prefix's (on the
    CPU in one stream), with the Triton kernels and the fused step ends (pi0.5's, or pi0's): the actions are the
    sequential forward's, bit for bit, and the reference's; every decoder attention launch still runs."""
    engine = _engine(model, "rope_in_attention")
    assert engine.ops.overlap_first_step                        # the default
    engine.ops.overlap_first_step = False                       # the sequential forward first
    engine.ops.fused_denoise_step = engine.ops.fused_denoise_step_pi0 = True
    launches = _record_triton_launches(engine, monkeypatch)
    sequential, want, inputs = _actions_and_reference(engine, model, 11)
    engine.ops.overlap_first_step = True
    launches.clear()
    overlapped = engine.predict_observation(*inputs)
    np.testing.assert_array_equal(overlapped, sequential)
    np.testing.assert_allclose(overlapped, want, atol=FP32_ATOL, rtol=0)
    assert len(launches["decoder_attention"]) == len(engine.weights.dts) * model.config.expert.depth


def test_training_time_rtc_with_row_variants_matches_the_reference(model, monkeypatch):
    """Training-time RTC with the Triton kernels and the fused step ends switched on: pi0.5 runs every adaRMS norm
    (each layer's two and the final one) as ada_rms_norm with per-row variants and no fused step end, pi0 the
    unfused time MLP; the actions are the reference sampler's, the frozen rows the previous chunk exactly."""
    from test_engine_rtc import _inputs, _plan, _tensors

    from flashrt_core.executor import ReferenceExecutor
    engine = _engine(model, "rope_in_attention")
    engine.ops.fused_denoise_step = engine.ops.fused_denoise_step_pi0 = True
    launches = _record_triton_launches(engine, monkeypatch)
    variants = []
    ada = engine.ops.k.ada_rms_norm
    monkeypatch.setattr(engine.ops.k, "ada_rms_norm",
                        lambda *a, **kw: variants.append(kw.get("row_variant")) or ada(*a, **kw))
    cfg = model.config
    delay = 4
    inputs = _inputs(cfg, 6)
    plan = _plan(cfg, "training_time", delay, 6)
    got = engine.predict_observation(*inputs, rtc=plan)
    want = ReferenceExecutor(model, cfg, torch.device("cpu")).sample_actions_rtc(*_tensors(*inputs), plan)[0]
    np.testing.assert_allclose(got, want.numpy(), atol=FP32_ATOL, rtol=0)
    np.testing.assert_array_equal(got[:delay], plan.target[0, :delay].numpy())
    steps, layers = len(engine.weights.dts), cfg.expert.depth
    assert not {"denoise_step_in", "denoise_step_out", "time_mlp_in"} & set(launches)
    if cfg.model_type == "pi05":
        assert len(variants) == steps * (2 * layers + 1)
        assert all(v is not None and v.tolist() == [1] * delay + [0] * (cfg.action_horizon - delay) for v in variants)
    else:
        assert not variants
