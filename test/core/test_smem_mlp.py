"""kernels/flashrt_kernels/smem_mlp.py on the CPU: its reference is the chain's two GEMMs (gate/up + GeGLU rounded to bf16, then
down), the shapes it serves, and the scratch it checks. The kernel itself needs a Hopper GPU
(test/gpu/test_kernels.py) and compiles here in test_kernel_resources."""

from __future__ import annotations

import pytest
import torch

from flashrt_kernels import skinny_gemm_reference
from flashrt_kernels.smem_mlp import (MlpScratch, smem_mlp_programs, smem_mlp_reference, smem_mlp_shared_bytes,
                              smem_mlp_supported)
from flashrt_kernels.smem_gemm import SMEM_BUDGET

W, F, H200_SMS = 1024, 4096, 132


def test_reference_is_the_chains_gate_up_geglu_then_down():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 64, generator=g).to(torch.bfloat16)
    w_gate_up = (torch.randn(2 * 96, 64, generator=g) / 8).to(torch.bfloat16)
    w_down = (torch.randn(64, 96, generator=g) / 10).to(torch.bfloat16)
    act = skinny_gemm_reference(x, w_gate_up, geglu=True)               # (10, 96) bf16, as the chain's GeGLU
    assert act.dtype == torch.bfloat16
    torch.testing.assert_close(smem_mlp_reference(x, w_gate_up, w_down), act.float() @ w_down.float().T,
                               rtol=0, atol=0)


def test_the_experts_mlp_fits_one_program_per_sm_and_its_shared_memory():
    assert smem_mlp_programs(F) == 128 and W % smem_mlp_programs(F) == 0
    assert smem_mlp_shared_bytes(W) <= SMEM_BUDGET
    assert all(smem_mlp_supported(m, W, F, H200_SMS) for m in (1, 10, 11, 16))


@pytest.mark.parametrize("m,w,f,sms,why", [
    (17, W, F, H200_SMS, "more rows than the 16-row x tile"),
    (0, W, F, H200_SMS, "no rows"),
    (10, W, F, 114, "more programs than SMs: the grid barrier would never complete"),
    (10, W, F + 16, H200_SMS, "F not a multiple of 32 act columns"),
    (10, W + 32, F, H200_SMS, "W not a multiple of the 64-column boxes"),
    (10, 2048, F, H200_SMS, "one program's gate/up rows and down columns over the shared memory"),
    (10, W, 3072, H200_SMS, "96 programs cannot split the 1024 columns evenly for the sum"),
])
def test_shapes_it_does_not_serve(m, w, f, sms, why):
    assert not smem_mlp_supported(m, w, f, sms), why


def test_scratch_check_names_the_wrong_tensor():
    scratch = MlpScratch.allocate(10, W, F, "cpu")
    scratch.check(10, W, F)
    assert tuple(scratch.part.shape) == (128, 10, W) and scratch.barrier.tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"scratch\.part must be a contiguous \(128, 11, 1024\)"):
        scratch.check(11, W, F)
    bad = MlpScratch(scratch.part, scratch.barrier.to(torch.int64), scratch.errors)
    with pytest.raises(ValueError, match=r"scratch\.barrier"):
        bad.check(10, W, F)


def test_fused_mlp_is_an_opt_in_that_needs_the_tma_gemms():
    """EngineOptions.fused_mlp / FLASHRT_FUSED_MLP=1 turns it on where the TMA GEMMs are (sm90 with Gluon), never
    without them, never with fast_paths off; off by default (measured slower, session 22); FLASHRT_FUSED_MLP=0 or
    FLASHRT_DISABLE_FUSED_MLP=1 turns it off. With it the first denoising step does not overlap the prefix."""
    from flashrt_core.engine.dispatch import EngineOptions, resolve
    from flashrt_core.engine.hardware import detect_hardware
    from flashrt_core.engine.ops import Ops
    from flashrt_kernels import HAVE_GLUON

    sm90 = detect_hardware("sm90")
    assert not Ops(resolve(sm90, EngineOptions())).fused_mlp
    asked = EngineOptions.from_env(env={"FLASHRT_FUSED_MLP": "1"})
    assert asked.fused_mlp
    assert Ops(resolve(sm90, asked)).fused_mlp == HAVE_GLUON
    assert not Ops(resolve(sm90, EngineOptions(fused_mlp=True, smem_gemm=False))).fused_mlp
    assert not Ops(resolve(sm90, EngineOptions(fused_mlp=True, fast_paths=False))).fused_mlp
    assert not EngineOptions.from_env(EngineOptions(fused_mlp=True), env={"FLASHRT_FUSED_MLP": "0"}).fused_mlp
    assert not EngineOptions.from_env(asked, env={"FLASHRT_DISABLE_FUSED_MLP": "1"}).fused_mlp
    # its grid barrier needs every program resident: the first step does not run beside the prefix with it
    assert Ops(resolve(sm90, EngineOptions())).overlap_first_step
    assert Ops(resolve(sm90, asked)).overlap_first_step == (not HAVE_GLUON)


def test_decoder_mlp_runs_the_two_gemms_where_the_fused_kernel_does_not_apply():
    """On CPU tensors (or wherever decoder_mlp_fused_applies says no) decoder_mlp is the two decoder GEMMs,
    gate/up with its GeGLU and down, whatever fused_mlp says."""
    from flashrt_core.engine.dispatch import EngineOptions, resolve
    from flashrt_core.engine.hardware import CPU
    from flashrt_core.engine.ops import Ops
    from flashrt_core.engine.weights import Linear

    g = torch.Generator().manual_seed(1)
    y = torch.randn(10, 64, generator=g)
    gate_up = Linear([(torch.randn(2 * 96, 64, generator=g) / 8, None)])
    down = Linear([(torch.randn(64, 96, generator=g) / 10, None)])
    ops = Ops(resolve(CPU, EngineOptions()))
    ops.fused_mlp = True                                  # asked for, but CPU tensors: the chain
    assert not ops.decoder_mlp_fused_applies(y, gate_up, down)
    want = ops.decoder(ops.decoder(y, gate_up, "gate_up"), down, "down")
    torch.testing.assert_close(ops.decoder_mlp(y, gate_up, down), want, rtol=0, atol=0)
    gate, up = (y @ gate_up.parts[0][0].T).chunk(2, dim=-1)
    torch.testing.assert_close(want, (torch.nn.functional.gelu(gate, approximate="tanh") * up) @ down.parts[0][0].T,
                               rtol=1e-5, atol=1e-5)
