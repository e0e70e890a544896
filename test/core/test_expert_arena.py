"""The action expert's GEMM weights in one buffer (ExpertArena), the L2 prefetch windows over it, and the switch
that turns the prefetch on. The prefetch kernel itself runs on sm90+ GPUs only (test/gpu); here: the layout it
relies on, the dispatch, and the launcher's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import Dispatch, EngineOptions, Op, resolve
from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.engine.hardware import detect_hardware
from flashrt_core.engine.weights import ARENA_ALIGN, EXPERT_GEMMS, prepare_weights
from flashrt_core.fixtures import write_random_checkpoint
from flashrt_kernels.l2_prefetch import GRANULE, check_window, prefetch_chunk
from flashrt_kernels.skinny_gemm import skinny_gemm


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def model(request, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(ckpt, request.param, seed=5)
    return load_model_weights(ckpt, get_config(request.param), "cpu", torch.float32)


def test_expert_weights_are_views_of_one_buffer_in_reading_order(model):
    packed = prepare_weights(model, torch.bfloat16, fold=True, pack_expert_weights=True)
    arena = packed.expert_arena
    assert arena is not None and arena.buffer.dtype == torch.bfloat16
    unpacked = prepare_weights(model, torch.bfloat16, fold=True)       # the default: not packed
    assert unpacked.expert_arena is None
    previous_end = 0
    for i, layer in enumerate(packed.expert):
        for name in EXPERT_GEMMS:
            weight = getattr(layer, name).parts[0][0]
            start, end = arena.spans[i][name]
            assert weight.untyped_storage().data_ptr() == arena.buffer.untyped_storage().data_ptr()
            assert weight.data_ptr() == arena.buffer.data_ptr() + start * 2 and weight.is_contiguous()
            assert start % ARENA_ALIGN == 0 and start >= previous_end and end - start == weight.numel()
            previous_end = end
            assert torch.equal(weight, getattr(unpacked.expert[i], name).parts[0][0])   # same values


def test_prefetch_window_is_the_rest_of_the_layer_and_the_next_qkv(model):
    arena = prepare_weights(model, torch.bfloat16, fold=True, pack_expert_weights=True).expert_arena
    layers = len(arena.spans)
    for i in range(layers):
        addr, nbytes = arena.prefetch_window(i)
        check_window(addr, nbytes)                                   # 16-byte aligned, as the instruction needs
        assert addr == arena.buffer.data_ptr() + arena.spans[i]["o"][0] * 2
        last = arena.spans[i + 1]["qkv"][1] if i + 1 < layers else arena.spans[i]["down"][1]
        assert addr + nbytes == arena.buffer.data_ptr() + last * 2
        needed = sum(e - s for s, e in (arena.spans[i][n] for n in ("o", "gate_up", "down")))
        if i + 1 < layers:
            needed += arena.spans[i + 1]["qkv"][1] - arena.spans[i + 1]["qkv"][0]
        assert needed * 2 <= nbytes < (needed + 4 * ARENA_ALIGN) * 2   # the weights, plus alignment padding only


def test_unmerged_weights_are_not_packed(model):
    unmerged = prepare_weights(model, torch.float32, fold=False, pack_expert_weights=True)
    assert unmerged.expert_arena is None                             # QKV kept as three blocks


def test_engine_forward_on_packed_weights_matches_the_reference(model):
    """The forward reads the expert through the arena's views exactly as through separate tensors."""
    from test_engine_forward import FP32_ATOL, _dispatch, _inputs, _reference
    packed = prepare_weights(model, torch.float32, fold=True, pack_expert_weights=True,
                             vision_mlp_pad=EngineOptions.vision_mlp_pad)     # as the executor's options pad it
    assert packed.expert_arena is not None
    engine = EngineExecutor(model, model.config, torch.device("cpu"), _dispatch(True), dtype=torch.float32,
                            weights=packed)
    images, tokens, mask, state, noise = _inputs(model.config, np.random.default_rng(11), 9, (0, 1))
    got = engine.predict_observation(images, tokens, mask, state, noise)
    np.testing.assert_allclose(got, _reference(model, images, tokens, mask, state, noise).numpy(), atol=FP32_ATOL,
                               rtol=0)


def test_prefetching_engine_refuses_shared_weights_without_an_arena(model):
    from test_engine_forward import _dispatch
    dispatch = _dispatch(True)
    prefetching = Dispatch(dispatch.hardware, dispatch.options, {**dispatch.choice, Op.L2_PREFETCH: "bulk"})
    plain = prepare_weights(model, torch.float32, fold=True, vision_mlp_pad=EngineOptions.vision_mlp_pad)
    with pytest.raises(ValueError, match="no expert arena"):
        EngineExecutor(model, model.config, torch.device("cpu"), prefetching, dtype=torch.float32, weights=plain)


def test_l2_prefetch_is_opt_in_and_hopper_only(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    sm90 = detect_hardware("sm90")
    assert resolve(sm90, EngineOptions())[Op.L2_PREFETCH] == "none"
    assert resolve(sm90, EngineOptions(l2_prefetch=True))[Op.L2_PREFETCH] == "bulk"
    assert resolve(sm90, EngineOptions.from_env(env={"FLASHRT_L2_PREFETCH": "1"}))[Op.L2_PREFETCH] == "bulk"
    off = EngineOptions.from_env(EngineOptions(l2_prefetch=True), env={"FLASHRT_DISABLE_L2_PREFETCH": "1"})
    assert resolve(sm90, off)[Op.L2_PREFETCH] == "none"
    for other in ("sm89", "gfx942", "cpu"):
        assert resolve(detect_hardware(other), EngineOptions(l2_prefetch=True))[Op.L2_PREFETCH] == "none"
    assert resolve(sm90, EngineOptions(overrides={"l2_prefetch": "bulk"}))[Op.L2_PREFETCH] == "bulk"
    with pytest.raises(ValueError, match="l2_prefetch=bulk"):
        resolve(detect_hardware("sm89"), EngineOptions(overrides={"l2_prefetch": "bulk"}))


def test_prefetch_chunks_cover_the_window_in_16_byte_multiples():
    for nbytes, programs, warps in ((35 * 2**20, 80, 4), (16, 80, 4), (12_345 * 16, 7, 8)):
        chunk = prefetch_chunk(nbytes, programs, warps)
        assert chunk % GRANULE == 0 and chunk > 0
        assert chunk * programs * 32 * warps >= nbytes > (chunk - GRANULE) * programs * 32 * warps - GRANULE


def test_launcher_refuses_a_misaligned_window_before_launching():
    x, w = torch.zeros(10, 256, dtype=torch.bfloat16), torch.zeros(64, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="16-byte aligned"):
        skinny_gemm(x, w, prefetch=(0x1008, 4096))
    with pytest.raises(ValueError, match="16-byte aligned"):
        skinny_gemm(x, w, prefetch=(0x1000, 0))
