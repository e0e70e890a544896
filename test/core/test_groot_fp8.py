"""GR00T N1.6 in FP8 on the CPU (tiny preset, fp32 activations): the fused DiT's GEMMs read weight-only E4M3 weights
(engine/groot_dit_gemms.py) through the few-row GEMM's plain-PyTorch reference, so the chunk is exactly the reference
model's with those GEMMs' weights rounded to E4M3 (per output channel) and bounded against the unrounded one; the
split-K partials (bias on partial 0) sum to the same chunk in the norms; FP8 is refused where it cannot run; and
the GR00T accuracy gate's arithmetic (engine/groot_gate.py) on hand-made chunks."""

import copy

import numpy as np
import pytest
import torch
from test_groot_graph import TINY, inputs

from flashrt_core import load_model
from flashrt_core.api import resolve_precision
from flashrt_core.engine.groot_dit_gemms import GELU, PARTIALS, PLAIN, candidates, dit_gemms
from flashrt_core.engine.groot_gate import (GATE_MEAN, GATE_WORST, SIGN_THRESHOLD, cosine, gate, gripper_dims,
                                            sign_flips)
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.kernel_configs import SkinnyConfig
from flashrt_core.groot_fixtures import random_groot_model, write_random_groot_checkpoint
from flashrt_core.groot_policy import GrootReferenceExecutor

VIEWS = [(56, 84), (56, 56)]


@pytest.fixture(scope="module")
def model():
    return random_groot_model(TINY, seed=5)


@pytest.fixture(scope="module")
def fp8(model):
    return GrootGraphExecutor(model, "cpu", capture=False, fp8=True)


def _dequantized(lin) -> torch.Tensor:
    q, scale = lin.w8
    return q.float() * scale[:, None]


def _rounded_model(model, executor):
    """A copy of the model whose DiT GEMM weights are the executor's FP8 weights dequantized (Q/K/V split back out
    of the merged copy: the scales are per row, so the split is exact)."""
    rounded = copy.deepcopy(model)
    dit = rounded.action_head.model
    with torch.no_grad():
        for block, fused in zip(dit.transformer_blocks, executor._fused.blocks):
            attn = block.attn1
            w = _dequantized(fused.qkv)
            mods = (attn.to_q,) if block.is_cross else (attn.to_q, attn.to_k, attn.to_v)
            for mod, part in zip(mods, w.split([m.weight.shape[0] for m in mods])):
                mod.weight.copy_(part)
            attn.to_out[0].weight.copy_(_dequantized(fused.out))
            block.ff.net[0].proj.weight.copy_(_dequantized(fused.ff1))
            block.ff.net[2].weight.copy_(_dequantized(fused.ff2))
    return rounded


def test_every_dit_gemm_reads_fp8_weights_and_keeps_its_bias(model, fp8):
    gemms = dit_gemms(fp8._fused)
    assert fp8.fp8 and len(gemms) == 4 * model.cfg.dit.num_layers and len(fp8._fused.few_row) == len(gemms)
    assert [kind for _, kind in gemms[:4]] == [PLAIN, PARTIALS, GELU, PARTIALS]
    for lin, _ in gemms:
        (w, b), = lin.parts
        q, scale = lin.w8
        assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and scale.shape == (w.shape[0],)
        assert b is not None and id(lin) in fp8._fused.few_row          # the bias is added in the GEMM's epilogue
    kept = fp8._fused.blocks[0].out.parts[0][0]                     # the model's own weights stay, unrounded
    assert kept.data_ptr() == model.action_head.model.transformer_blocks[0].attn1.to_out[0].weight.data_ptr()
    assert fp8._fused.proj_out.w8 is None                            # proj_out_2 stays in the model's dtype
    bf16 = GrootGraphExecutor(model, "cpu", capture=False)           # the same few-row GEMMs on the bf16 weights
    assert not bf16.fp8 and all(lin.w8 is None for lin, _ in dit_gemms(bf16._fused))
    assert len(bf16._fused.few_row) == len(gemms)
    assert not GrootGraphExecutor(model, "cpu", capture=False, few_row_gemms=False)._fused.few_row


def test_few_row_gemms_give_the_library_gemms_chunk(model):
    """groot_few_row_gemms: the bf16 (here fp32) DiT GEMMs on the few-row GEMM (bias and GELU in its epilogue,
    split-K partials summed by the norms) give the chunk of the library GEMMs."""
    few_row = GrootGraphExecutor(model, "cpu", capture=False)
    library = GrootGraphExecutor(model, "cpu", capture=False, few_row_gemms=False)
    for lin, kind in dit_gemms(few_row._fused):          # split-K where the norms sum the partials
        if kind == PARTIALS:
            few_row._fused.few_row[id(lin)] = SkinnyConfig(16, 16, 2, 1)
    for seed in (1, 2):
        args = inputs(model, VIEWS, 7, seed=seed)
        torch.testing.assert_close(few_row.sample_actions(*args), library.sample_actions(*args), rtol=1e-5,
                                   atol=1e-5)


def test_fp8_chunk_is_the_rounded_weights_chunk_and_bounded(model, fp8):
    """The FP8 chunk equals the fp32 reference on the E4M3-rounded DiT weights (so FP8 changes the weights and
    nothing else), and against the unrounded reference it stays within the gate's bounds."""
    rounded = GrootReferenceExecutor(_rounded_model(model, fp8), torch.device("cpu"))
    reference = GrootReferenceExecutor(model, torch.device("cpu"))
    got, want = [], []
    for seed in (1, 2, 3):
        args = inputs(model, VIEWS, 9, seed=seed, pad=2)
        chunk = fp8.sample_actions(*args)
        torch.testing.assert_close(chunk, rounded.sample_actions(*args), rtol=2e-5, atol=2e-5)
        got.append(chunk.numpy())
        want.append(reference.sample_actions(*args).numpy())
    result = gate(got, want)
    assert 0.998 < result.worst < 1 - 1e-7, result          # rounded, boundedly (E4M3: 3 mantissa bits)


def test_split_k_partials_sum_to_the_same_chunk(model):
    """Output projection and MLP down as split-K partials (the bias on partial 0) summed by the norms after them."""
    whole = GrootGraphExecutor(model, "cpu", capture=False, fp8=True)
    split = GrootGraphExecutor(model, "cpu", capture=False, fp8=True)
    for lin, kind in dit_gemms(split._fused):
        if kind == PARTIALS:
            split._fused.few_row[id(lin)] = SkinnyConfig(16, 16, 2, 1)
    args = inputs(model, VIEWS, 5, seed=4)
    torch.testing.assert_close(split.sample_actions(*args), whole.sample_actions(*args), rtol=1e-5, atol=1e-5)


def test_launch_candidates_at_the_released_shapes():
    """17 rows (one observation): every candidate divides K; split-K only where a norm sums the partials; a K no
    candidate divides (the tiny preset) gets none (pick_config's one-shot configuration then)."""
    for kind in (PLAIN, GELU, PARTIALS):
        for k in (1536, 6144):
            cands = candidates(kind, 17, k)
            assert cands and all(k % (c.split_k * c.block_k) == 0 and c.max_rows >= 17 for c in cands)
            assert any(c.split_k > 1 for c in cands) == (kind == PARTIALS)
    assert candidates(PLAIN, 17, 32) == []


def test_fp8_refusals(model, tmp_path):
    with pytest.raises(ValueError, match="weight-only FP8 weights in the fused DiT: turn groot_fused_dit"):
        GrootGraphExecutor(model, "cpu", capture=False, fused_dit=False, fp8=True)
    with pytest.raises(ValueError, match="weight-only FP8 weights in the fused DiT"):
        GrootGraphExecutor(model, "cpu", capture=False, step_tables=False, fp8=True)
    with pytest.raises(ValueError, match=r"precision='fp8' cannot run on hardware='reference' \(the eager reference"):
        resolve_precision("fp8", None, None, torch.device("cuda"), "reference")
    ckpt = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=4)
    with pytest.raises(ValueError, match="precision='fp8' cannot run on device cpu"):
        load_model(ckpt, embodiment="new_embodiment", device="cpu", precision="fp8")
    with pytest.raises(ValueError, match="precision='fp8' computes in torch.bfloat16 but dtype='float32'"):
        load_model(ckpt, embodiment="new_embodiment", device="cpu", precision="fp8", dtype="float32")
    policy = load_model(ckpt, embodiment="new_embodiment", device="cpu", precision="bf16")
    assert policy.executor.name == "reference" and not getattr(policy.executor, "fp8", False)


# ------------------------------------------------------------------------------------------------- the gate
def test_gripper_dims_from_the_action_layout():
    assert gripper_dims([("single_arm", 5), ("gripper", 1)]) == (5,)
    assert gripper_dims([("left_gripper", 1), ("arm", 3), ("Right_Gripper", 2)]) == (0, 4, 5)
    assert gripper_dims([("arm", 7), ("base", 2)]) == ()


def test_gate_cosines_worst_and_sign_flips():
    want = np.array([[1.0, 2.0, 0.5], [-1.0, 0.0, -0.5]])
    assert cosine(want, want) == pytest.approx(1.0)
    assert cosine(want, -want) == pytest.approx(-1.0)
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(2 ** -0.5)
    # column 2 is the gripper: +0.5 -> -0.5 flips; a reference value under the threshold does not count
    flipped = want.copy()
    flipped[0, 2] = -0.5
    assert sign_flips(flipped, want, (2,)) == 1 and sign_flips(flipped, want, ()) == 0
    small = np.array([[SIGN_THRESHOLD / 2]])
    assert sign_flips(-small, small, (0,)) == 0
    assert sign_flips(np.zeros((1, 1)), np.full((1, 1), 0.3), (0,)) == 1        # zero is no sign
    tilted = want + np.array([[0.0, 0.0, 0.0], [0.0, 0.1, 0.0]])
    result = gate([want, tilted, flipped], [want, want, want], (2,))
    cosines = [1.0, cosine(tilted, want), cosine(flipped, want)]
    assert result.mean == pytest.approx(np.mean(cosines)) and result.worst == pytest.approx(min(cosines))
    assert result.sign_flips == 1 and result.observations == 3 and not result.passed
    assert gate([want, tilted], [want, want], (2,)).sign_flips == 0
    near = want * (1 + 1e-4)
    ok = gate([near, want], [want, want], (2,))
    assert ok.passed and ok.as_dict()["passed"] and ok.as_dict()["gate_mean"] == GATE_MEAN
    assert "pass" in str(ok) and "FAIL" in str(result)


def test_gate_thresholds_mean_and_worst_apart():
    """A worst observation under GATE_WORST fails even when the mean passes, and the mean alone fails too."""
    want = np.ones((16, 4))
    rng = np.random.default_rng(0)

    def at(target: float) -> np.ndarray:       # a chunk whose cosine with want is `target`
        noise = rng.standard_normal(want.shape)
        noise -= (noise.ravel() @ want.ravel()) / (want.ravel() @ want.ravel()) * want        # orthogonal
        noise *= np.linalg.norm(want) / np.linalg.norm(noise)
        return want + np.tan(np.arccos(target)) * noise

    worst_fails = gate([want] * 9 + [at(GATE_WORST - 1e-3)], [want] * 10)
    assert worst_fails.mean >= GATE_MEAN and worst_fails.worst < GATE_WORST and not worst_fails.passed
    mean_fails = gate([at(GATE_MEAN - 2e-4)] * 3, [want] * 3)
    assert mean_fails.worst >= GATE_WORST and mean_fails.mean < GATE_MEAN and not mean_fails.passed
    with pytest.raises(ValueError, match="pairs engine and reference chunks"):
        gate([want], [want, want])
    with pytest.raises(ValueError, match="differ in shape"):
        gate([want], [want[:8]])
