"""The dispatch table: reference on CPU, per-hardware picks, pinned implementations and the options' switches."""

from __future__ import annotations

import pytest

from flashrt_core.engine.dispatch import TABLE, Op, resolve
from flashrt_core.engine.hardware import CPU, Vendor, detect_hardware
from flashrt_core.engine.options import EngineOptions


def _env(**kv):
    return EngineOptions.from_env(env={k: str(v) for k, v in kv.items()})


def test_cpu_picks_the_reference_everywhere():
    d = resolve(CPU, EngineOptions())
    assert d[Op.EXECUTOR] == "reference"
    assert d[Op.ATTENTION] == "math"
    for op in (Op.NORM, Op.ADA_NORM, Op.GEGLU, Op.QKV_ROPE, Op.EULER):
        assert d[op] == "torch"
    assert d[Op.GEMM_PREFIX] == "bf16"


def test_auto_on_this_machine_is_cpu_without_cuda():
    import torch
    hw = detect_hardware("auto", "cpu")
    assert hw.vendor is Vendor.CPU
    if not torch.cuda.is_available():
        assert detect_hardware("auto", "cuda").vendor is Vendor.CPU


@pytest.fixture
def no_triton(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: False)


def test_pinned_hopper_uses_graph_sdpa_and_fp8_only_when_asked(no_triton):
    hw = detect_hardware("sm90")
    assert hw.sm == 90
    plain = resolve(hw, EngineOptions())
    assert plain[Op.EXECUTOR] == "graph" and plain[Op.ATTENTION] == "sdpa"
    assert plain[Op.GEMM_PREFIX] == "bf16"
    fp8 = resolve(hw, EngineOptions(fp8=True))
    assert fp8[Op.GEMM_PREFIX] == "fp8" and fp8[Op.GEMM_DECODER] == "bf16"
    assert fp8[Op.FP8_FORMAT] == "e4m3fn"


def test_fp8_format_per_amd_arch_and_no_fp8_before_ada():
    assert resolve(detect_hardware("gfx942"), EngineOptions(fp8=True))[Op.FP8_FORMAT] == "e4m3fnuz"
    assert resolve(detect_hardware("gfx950"), EngineOptions(fp8=True))[Op.FP8_FORMAT] == "e4m3fn"
    assert resolve(detect_hardware("sm80"), EngineOptions(fp8=True))[Op.GEMM_PREFIX] == "bf16"  # A100: no FP8


def test_reference_hardware_forces_reference_executor():
    d = resolve(detect_hardware("reference", "cpu"), EngineOptions())
    assert d[Op.EXECUTOR] == "reference"


def test_switches_from_environment(no_triton):
    hw = detect_hardware("sm90")
    assert resolve(hw, _env(FLASHRT_CUDA_GRAPH=0))[Op.EXECUTOR] == "eager_engine"
    assert resolve(hw, _env(FLASHRT_FLASH_ATTENTION=0))[Op.ATTENTION] == "math"
    assert resolve(hw, _env(FLASHRT_FP8=1))[Op.GEMM_PREFIX] == "fp8"
    assert resolve(hw, _env(FLASHRT_FP8=0))[Op.GEMM_PREFIX] == "bf16"
    off = resolve(hw, _env(FLASHRT_FAST_PATHS=0, FLASHRT_FP8=1))
    assert off[Op.EXECUTOR] == "reference" and off[Op.ATTENTION] == "math" and off[Op.GEMM_PREFIX] == "bf16"
    assert not _env(FLASHRT_FUSED_WEIGHTS=0).fused_weights


def test_override_pins_an_implementation():
    hw = detect_hardware("sm90")
    assert resolve(hw, _env(FLASHRT_IMPL_ATTENTION="math"))[Op.ATTENTION] == "math"
    assert resolve(hw, _env(FLASHRT_IMPL_GEMM_DECODER="bf16"))[Op.GEMM_DECODER] == "bf16"


def test_override_that_cannot_run_is_an_error():
    with pytest.raises(ValueError, match="executor=graph"):
        resolve(CPU, _env(FLASHRT_IMPL_EXECUTOR="graph"))
    with pytest.raises(ValueError, match="gemm_prefix=fp8"):
        resolve(detect_hardware("sm80"), _env(FLASHRT_IMPL_GEMM_PREFIX="fp8"))


def test_bad_values_name_the_problem():
    with pytest.raises(ValueError, match="unknown implementation 'flash3'"):
        resolve(CPU, _env(FLASHRT_IMPL_ATTENTION="flash3"))
    with pytest.raises(ValueError, match="unknown hardware 'tpu'"):
        detect_hardware("tpu")
    with pytest.raises(ValueError, match="unknown op 'matmul'"):
        resolve(CPU, EngineOptions(impl={"matmul": "bf16"}))


def test_pinning_fp8_needs_the_fp8_option():
    """FP8 is the fp8 option's decision alone: pinning the FP8 prefix GEMM without it cannot run."""
    hw = detect_hardware("sm90")
    with pytest.raises(ValueError, match="gemm_prefix=fp8"):
        resolve(hw, _env(FLASHRT_IMPL_GEMM_PREFIX="fp8"))
    assert resolve(hw, _env(FLASHRT_IMPL_GEMM_PREFIX="fp8", FLASHRT_FP8=1))[Op.GEMM_PREFIX] == "fp8"


def test_every_op_has_a_fallback_that_always_runs():
    for op, candidates in TABLE.items():
        assert any(c.usable(CPU, EngineOptions(fast_paths=False)) for c in candidates), op


def test_triton_ops_fall_back_without_triton(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: False)
    d = resolve(detect_hardware("sm90"), EngineOptions())
    assert d[Op.NORM] == "torch" and d[Op.GEGLU] == "torch"
    assert d[Op.MQA] == "sdpa" and d[Op.GEMM_DECODER] == "bf16"
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    d = resolve(detect_hardware("sm90"), EngineOptions())
    assert d[Op.NORM] == "triton" and d[Op.QKV_ROPE] == "triton"
    assert d[Op.MQA] == "triton" and d[Op.GEMM_DECODER] == "triton"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_TRITON=0))[Op.NORM] == "torch"


def test_programmatic_dependent_launch_only_on_hopper_and_newer_with_triton(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    plain = EngineOptions(pdl_early_trigger=False)
    assert resolve(detect_hardware("sm90"), plain)[Op.KERNEL_LAUNCH] == "pdl"
    assert resolve(detect_hardware("sm120"), plain)[Op.KERNEL_LAUNCH] == "pdl"
    assert resolve(detect_hardware("sm120"), EngineOptions())[Op.KERNEL_LAUNCH] == "pdl_early"
    assert resolve(detect_hardware("sm89"), EngineOptions())[Op.KERNEL_LAUNCH] == "stream"
    assert resolve(detect_hardware("gfx942"), EngineOptions())[Op.KERNEL_LAUNCH] == "stream"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_PDL=0))[Op.KERNEL_LAUNCH] == "stream"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_TRITON=0))[Op.KERNEL_LAUNCH] == "stream"
    with pytest.raises(ValueError, match="kernel_launch=pdl"):
        resolve(detect_hardware("sm89"), _env(FLASHRT_IMPL_KERNEL_LAUNCH="pdl"))


def test_pinned_nvidia_names_give_the_compute_capability():
    assert detect_hardware("sm90").capability == (9, 0)
    assert detect_hardware("sm89").capability == (8, 9)
    assert detect_hardware("sm120").capability == (12, 0)
    assert detect_hardware("sm100").sm == 100


def test_decoder_qkv_fusion_needs_triton_and_can_be_pinned_off(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    assert resolve(detect_hardware("sm90"), EngineOptions())[Op.DECODER_QKV] == "rope_in_attention"
    assert resolve(detect_hardware("gfx942"), EngineOptions())[Op.DECODER_QKV] == "rope_in_attention"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_ROPE_IN_ATTENTION=0))[Op.DECODER_QKV] == "fused_rope"
    assert resolve(detect_hardware("sm90"), EngineOptions(rope_in_attention=False))[Op.DECODER_QKV] == "fused_rope"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_TRITON=0))[Op.DECODER_QKV] == "separate"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_IMPL_DECODER_QKV="separate"))[Op.DECODER_QKV] == "separate"
    assert resolve(CPU, EngineOptions())[Op.DECODER_QKV] == "separate"


def test_vision_gelu_epilogue_on_gpus_only_and_switchable(monkeypatch):
    assert resolve(detect_hardware("sm90"), EngineOptions())[Op.GEMM_EPILOGUE] == "gemm_epilogue"
    assert resolve(detect_hardware("gfx950"), EngineOptions())[Op.GEMM_EPILOGUE] == "gemm_epilogue"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_GEMM_EPILOGUE=0))[Op.GEMM_EPILOGUE] == "separate"
    assert resolve(detect_hardware("sm90"), EngineOptions(gemm_epilogue=False))[Op.GEMM_EPILOGUE] == "separate"
    assert resolve(CPU, EngineOptions())[Op.GEMM_EPILOGUE] == "separate"


def test_chain_tuning_is_on_with_triton_and_has_its_switch(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    for arch in ("sm90", "sm80", "gfx942"):
        assert resolve(detect_hardware(arch), EngineOptions())[Op.CHAIN_TUNING] == "chain"
    assert resolve(detect_hardware("sm90"), EngineOptions(chain_tuning=False))[Op.CHAIN_TUNING] == "isolated"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_CHAIN_TUNING=0))[Op.CHAIN_TUNING] == "isolated"
    assert resolve(detect_hardware("sm90"), EngineOptions(triton=False))[Op.CHAIN_TUNING] == "isolated"
    assert resolve(CPU, EngineOptions())[Op.CHAIN_TUNING] == "isolated"


def test_pdl_early_trigger_is_on_by_default_on_sm90_with_pdl_and_chain_tuning(monkeypatch):
    """The launch policy is picked by the chain tuning, so pdl_early needs it; without it (or PDL, or sm90) the
    plain PDL launch runs, and FLASHRT_PDL_EARLY_TRIGGER=0 turns it off."""
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    assert resolve(detect_hardware("sm90"), EngineOptions())[Op.KERNEL_LAUNCH] == "pdl_early"
    assert resolve(detect_hardware("sm90"), EngineOptions(pdl_early_trigger=False))[Op.KERNEL_LAUNCH] == "pdl"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_PDL_EARLY_TRIGGER=0))[Op.KERNEL_LAUNCH] == "pdl"
    assert resolve(detect_hardware("sm90"), EngineOptions(chain_tuning=False))[Op.KERNEL_LAUNCH] == "pdl"
    assert resolve(detect_hardware("sm89"), EngineOptions())[Op.KERNEL_LAUNCH] == "stream"
    assert resolve(detect_hardware("sm90"), EngineOptions(pdl=False))[Op.KERNEL_LAUNCH] == "stream"
    assert resolve(CPU, EngineOptions())[Op.KERNEL_LAUNCH] == "stream"


def test_ops_pass_the_launch_mode_to_every_kernel(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    from flashrt_core.engine.ops import Ops
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    from flashrt_core.engine.kernel_configs import LAUNCH_SITES
    early = ki.load_kernels().EARLY_TRIGGER
    plain = Ops(resolve(detect_hardware("sm90"), EngineOptions(pdl_early_trigger=False)))
    assert plain.launch_policy == "none" and {plain.launch_mode(s) for s in LAUNCH_SITES} == {1}
    default = Ops(resolve(detect_hardware("sm90"), EngineOptions()))    # "all" until the chain tuning picks one
    assert default.launch_policy == "all" and {default.launch_mode(s) for s in LAUNCH_SITES} == {early}
    assert early == 2
    off = Ops(resolve(detect_hardware("sm90"), EngineOptions(pdl=False)))
    assert {off.launch_mode(s) for s in LAUNCH_SITES} == {False}


def test_smem_gemm_candidates_are_on_by_default_on_sm90_with_gluon(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    if not getattr(ki.load_kernels(), "HAVE_GLUON", False):
        pytest.skip("this Triton has no Gluon: the tma candidate cannot resolve")
    assert resolve(detect_hardware("sm90"), EngineOptions())[Op.SMEM_GEMM] == "tma"
    assert resolve(detect_hardware("sm90"), EngineOptions(smem_gemm=False))[Op.SMEM_GEMM] == "none"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_SMEM_GEMM=0))[Op.SMEM_GEMM] == "none"
    assert resolve(detect_hardware("sm89"), EngineOptions())[Op.SMEM_GEMM] == "none"       # no TMA / wgmma
    assert resolve(detect_hardware("gfx942"), EngineOptions())[Op.SMEM_GEMM] == "none"
    assert resolve(detect_hardware("sm90"), EngineOptions(triton=False))[Op.SMEM_GEMM] == "none"
    assert resolve(CPU, EngineOptions())[Op.SMEM_GEMM] == "none"


def test_fp8_input_quant_is_fused_with_triton_and_has_its_switch(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    assert resolve(detect_hardware("sm90"), EngineOptions(fp8=True))[Op.FP8_FUSED_QUANT] == "fused"
    assert resolve(detect_hardware("gfx942"), EngineOptions(fp8=True))[Op.FP8_FUSED_QUANT] == "fused"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_FP8_FUSED_QUANT=0))[Op.FP8_FUSED_QUANT] == "separate"
    assert resolve(detect_hardware("sm90"), EngineOptions(triton=False))[Op.FP8_FUSED_QUANT] == "separate"
    assert resolve(CPU, EngineOptions(fp8=True))[Op.FP8_FUSED_QUANT] == "separate"


def test_vision_attention_backend_is_measured_on_gpus_and_has_its_switch():
    for arch in ("sm90", "sm80", "gfx942"):
        assert resolve(detect_hardware(arch), EngineOptions())[Op.VISION_ATTENTION_TUNING] == "measured"
    off = _env(FLASHRT_VISION_ATTENTION_TUNING=0)
    assert resolve(detect_hardware("sm90"), off)[Op.VISION_ATTENTION_TUNING] == "default"
    no_sdpa = EngineOptions(flash_attention=False)
    assert resolve(detect_hardware("sm90"), no_sdpa)[Op.VISION_ATTENTION_TUNING] == "default"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_FAST_PATHS=0))[Op.VISION_ATTENTION_TUNING] == "default"
    assert resolve(CPU, EngineOptions())[Op.VISION_ATTENTION_TUNING] == "default"


def test_fused_patch_embedding_is_on_with_triton_and_has_its_switch(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    assert resolve(detect_hardware("sm90"), EngineOptions())[Op.FUSED_PATCH_EMBED] == "fused"
    assert resolve(detect_hardware("gfx942"), EngineOptions())[Op.FUSED_PATCH_EMBED] == "fused"
    assert resolve(detect_hardware("sm90"), EngineOptions(fused_patch_embed=False))[Op.FUSED_PATCH_EMBED] == "reference"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_FUSED_PATCH_EMBED=0))[Op.FUSED_PATCH_EMBED] == "reference"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_FUSED_PATCH_EMBED=1))[Op.FUSED_PATCH_EMBED] == "fused"
    assert resolve(detect_hardware("sm90"), _env(FLASHRT_FAST_PATHS=0))[Op.FUSED_PATCH_EMBED] == "reference"
    assert resolve(detect_hardware("sm90"), EngineOptions(triton=False))[Op.FUSED_PATCH_EMBED] == "reference"
    assert resolve(CPU, EngineOptions())[Op.FUSED_PATCH_EMBED] == "reference"


def test_prefix_attention_is_measured_with_triton_and_has_its_switch(monkeypatch):
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    assert resolve(detect_hardware("sm90"), EngineOptions())[Op.PREFIX_ATTENTION_TUNING] == "measured"
    assert resolve(detect_hardware("gfx942"), EngineOptions())[Op.PREFIX_ATTENTION_TUNING] == "measured"
    off = _env(FLASHRT_PREFIX_ATTENTION_TUNING=0)
    assert resolve(detect_hardware("sm90"), off)[Op.PREFIX_ATTENTION_TUNING] == "mqa"
    assert resolve(detect_hardware("sm90"), EngineOptions(flash_attention=False))[Op.PREFIX_ATTENTION_TUNING] == "mqa"
    assert resolve(CPU, EngineOptions())[Op.PREFIX_ATTENTION_TUNING] == "mqa"


def test_the_wgmma_kernels_are_offered_on_hopper_only(monkeypatch):
    """flashrt_kernels/smem_gemm.py runs on wgmma, which Hopper (sm90) has and Blackwell (sm100, sm120) does not:
    its dispatch offers it on sm90 only, while PDL stays on every sm90+ GPU."""
    import flashrt_core.engine.dispatch as dispatch
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    monkeypatch.setattr(dispatch, "_gluon_available", lambda: True)
    assert resolve(detect_hardware("sm90"), EngineOptions())[Op.SMEM_GEMM] == "tma"
    for blackwell in ("sm100", "sm120"):
        d = resolve(detect_hardware(blackwell), EngineOptions())
        assert d[Op.SMEM_GEMM] == "none", blackwell
        assert d[Op.KERNEL_LAUNCH] == "pdl_early"


def test_the_eager_cpu_dispatch_runs_every_op_in_plain_pytorch():
    """eager_cpu_dispatch: the table resolved for the CPU (each op's plain-PyTorch candidate), launched one by one,
    with the options given; what the CPU tests of the engine's forward and host path run."""
    from flashrt_core.engine.dispatch import eager_cpu_dispatch
    d = eager_cpu_dispatch(EngineOptions(decode_graph_tokens=4))
    assert d.hardware == detect_hardware("cpu") and d.options.decode_graph_tokens == 4
    assert (d[Op.EXECUTOR], d[Op.GEMM_DECODER], d[Op.ATTENTION]) == ("eager_engine", "bf16", "math")
    cpu = resolve(CPU, d.options)
    assert all(d[op] == cpu[op] for op in TABLE if op is not Op.EXECUTOR)
    assert all(d[op] == candidates[-1].name for op, candidates in TABLE.items()
               if op not in (Op.EXECUTOR, Op.PREFIX_ATTENTION_WGMMA, Op.OVERLAP_FIRST_STEP))
    assert d[Op.OVERLAP_FIRST_STEP] == "two_streams"              # one stream in the same order on the CPU
    assert eager_cpu_dispatch(EngineOptions(overlap_first_step=False))[Op.OVERLAP_FIRST_STEP] == "one_stream"
    assert eager_cpu_dispatch().options == EngineOptions()


def test_pi0_fused_step_ends_are_the_default_with_switches_off_and_need_the_fused_step_ends():
    """pi0's fused step ends (kernels/flashrt_kernels/denoise_step.py time_mlp_in + step_out) on by default (-0.15 ms at
    horizon 50 on the H200), off with FLASHRT_FUSED_DENOISE_STEP_PI0=0, and never with the fused step ends off
    (FLASHRT_FUSED_DENOISE_STEP=0)."""
    from flashrt_core.engine.ops import Ops
    sm90 = detect_hardware("sm90")
    asked = EngineOptions()
    ops = Ops(resolve(sm90, asked))
    assert asked.fused_denoise_step_pi0 and ops.fused_denoise_step and ops.fused_denoise_step_pi0
    off_pi0 = EngineOptions.from_env(env={"FLASHRT_FUSED_DENOISE_STEP_PI0": "0"})
    assert not off_pi0.fused_denoise_step_pi0 and off_pi0.fused_denoise_step
    assert resolve(sm90, off_pi0)[Op.FUSED_DENOISE_STEP_PI0] == "separate"
    assert not Ops(resolve(sm90, off_pi0)).fused_denoise_step_pi0
    off = EngineOptions.from_env(asked, env={"FLASHRT_FUSED_DENOISE_STEP": "0"})
    assert not Ops(resolve(sm90, off)).fused_denoise_step_pi0
    assert not Ops(resolve(CPU, asked)).fused_denoise_step_pi0          # no Triton kernels on the CPU path


def test_the_choices_ops_forward_and_the_executor_read_are_table_entries(monkeypatch):
    """The choices Ops, forward and the executor read are resolved in the table: the chain tuning
    needs the CUDA graph it times, RoPE inside the attention needs the Triton mqa (a pinned other mqa leaves it
    out), the 17-64-row shared-memory GEMMs need the shared-memory GEMMs, and the wgmma prefix attention and the
    overlapped first step follow their options."""
    import flashrt_core.engine.dispatch as dispatch
    import flashrt_core.engine.kernel_import as ki
    monkeypatch.setattr(ki, "triton_available", lambda: True)
    monkeypatch.setattr(dispatch, "_gluon_available", lambda: True)
    sm90 = detect_hardware("sm90")
    d = resolve(sm90, EngineOptions())
    assert (d[Op.CHAIN_TUNING], d[Op.SMEM_GEMM_ROWS], d[Op.PREFIX_ATTENTION_WGMMA], d[Op.OVERLAP_FIRST_STEP]) == \
        ("chain", "tma", "wgmma", "two_streams")
    assert resolve(sm90, EngineOptions(cuda_graph=False))[Op.CHAIN_TUNING] == "isolated"
    assert resolve(sm90, EngineOptions(impl={"mqa": "sdpa"}))[Op.DECODER_QKV] == "fused_rope"
    with pytest.raises(ValueError, match="decoder_qkv=rope_in_attention"):
        resolve(sm90, EngineOptions(impl={"mqa": "math", "decoder_qkv": "rope_in_attention"}))
    assert resolve(sm90, EngineOptions(smem_gemm=False))[Op.SMEM_GEMM_ROWS] == "none"
    assert resolve(sm90, EngineOptions(smem_gemm_rows=False))[Op.SMEM_GEMM_ROWS] == "none"
    assert resolve(sm90, EngineOptions(prefix_attention_wgmma=False))[Op.PREFIX_ATTENTION_WGMMA] == "none"
    assert resolve(sm90, EngineOptions(overlap_first_step=False))[Op.OVERLAP_FIRST_STEP] == "one_stream"
    assert resolve(sm90, EngineOptions(fast_paths=False))[Op.OVERLAP_FIRST_STEP] == "one_stream"
