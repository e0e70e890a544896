"""Every Triton kernel against its plain-PyTorch reference, at the real pi0 / pi0.5 shapes, on random inputs.

Runs on a CUDA GPU. Without one, it can also run on the CPU through Triton's interpreter
(TRITON_INTERPRET=1 with Triton installed; slow, so rows are subsampled); otherwise every test skips.
Outputs are poisoned with NaN before each launch so an unwritten element fails the comparison.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from flashrt_core.config import GEMMA_300M
from flashrt_core.engine.kernel_import import load_kernels

K = load_kernels()

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and K.HAVE_TRITON and not torch.cuda.is_available()
if not INTERPRET:
    pytestmark = pytest.mark.gpu
DEVICE = "cpu" if INTERPRET else "cuda"

# bf16 outputs: one rounding of a value computed in fp32 by both sides; rel error of bf16 is 2^-8.
BF16_ATOL, BF16_RTOL = 2e-2, 1.6e-2
FP32_ATOL, FP32_RTOL = 1e-5, 1e-5
FP8_BOUNDARY_FRACTION = 1e-3  # values allowed to round to the neighbouring FP8 step (approximate division)
FP8_REL_L2 = 4e-2  # E4M3 round-to-nearest: ~2.7e-2 relative L2 error on normal data (torch's own cast)

# Real shapes: prefix rows (2 views x 256 patches + 48 tokens), vision rows (2 x 256), decoder rows (pi0.5 10,
# pi0 51); odd row counts catch masking bugs.
PREFIX_ROWS = 560 if not INTERPRET else 7
VISION_ROWS = 512 if not INTERPRET else 5
DECODER_ROWS = (10, 51) if not INTERPRET else (3,)
# the action expert's four GEMMs (pi0 and pi0.5): (kind, N, K), as the engine merges them
EXPERT_GEMMS = [(kind, n, k) for kind, (n, k) in GEMMA_300M.layer_gemm_shapes().items()]


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> None:
    assert not torch.isnan(got).any(), "kernel left NaN-poisoned elements unwritten"
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)


def _poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan")) if t.dtype.is_floating_point and t.element_size() > 1 else t


@pytest.mark.parametrize("rows,width,layer_norm,has_x,has_w", [
    (PREFIX_ROWS, 2048, False, True, False),      # Gemma 2B boundary, folded weight
    (PREFIX_ROWS, 2048, False, False, False),     # first norm of the stack
    (PREFIX_ROWS, 2048, False, True, True),       # unfolded weight
    (VISION_ROWS, 1152, True, True, True),        # SigLIP LayerNorm with affine
    (DECODER_ROWS[-1], 1024, False, True, False),
])
def test_residual_norm(rows, width, layer_norm, has_x, has_w):
    g = torch.Generator(device=DEVICE).manual_seed(rows + width)
    x = torch.randn(rows, width, device=DEVICE, generator=g).to(torch.bfloat16) if has_x else None
    residual = torch.randn(rows, width, device=DEVICE, generator=g) * 3
    w = torch.randn(width, device=DEVICE, generator=g) if has_w else None
    b = torch.randn(width, device=DEVICE, generator=g) if (has_w and layer_norm) else None
    want, want_res = K.residual_norm_reference(x, residual, w, b, 1e-6, layer_norm)
    out = _poison(torch.empty(rows, width, device=DEVICE, dtype=torch.bfloat16))
    res = residual.clone()
    K.residual_norm(x, res, out, w, b, 1e-6, layer_norm)
    _close(out, want, BF16_ATOL, BF16_RTOL)
    _close(res, want_res, FP32_ATOL, FP32_RTOL)


@pytest.mark.skipif(INTERPRET, reason="Triton's interpreter casts to FP8 without round-to-nearest")
def test_residual_norm_fp8_out():
    g = torch.Generator(device=DEVICE).manual_seed(7)
    x = torch.randn(PREFIX_ROWS, 2048, device=DEVICE, generator=g).to(torch.bfloat16)
    residual = torch.randn(PREFIX_ROWS, 2048, device=DEVICE, generator=g)
    inv_scale = torch.tensor([448.0 / 6.0], device=DEVICE)
    want, _ = K.residual_norm_reference(x, residual, inv_scale=inv_scale, out_dtype=torch.float32)  # unrounded
    out = torch.empty(PREFIX_ROWS, 2048, device=DEVICE, dtype=torch.float8_e4m3fn)
    K.residual_norm(x, residual.clone(), out, inv_scale=inv_scale)
    err = (out.float() - want.float()).norm() / want.float().norm()
    assert err < FP8_REL_L2, f"fp8 output rel L2 error {err:.3e}"


@pytest.mark.parametrize("rows", DECODER_ROWS)
@pytest.mark.parametrize("has_x", [True, False])
def test_ada_rms_norm(rows, has_x):
    g = torch.Generator(device=DEVICE).manual_seed(rows)
    width = 1024
    x = torch.randn(rows, width, device=DEVICE, generator=g).to(torch.bfloat16) if has_x else None
    residual = torch.randn(rows, width, device=DEVICE, generator=g) * 2
    gate, scale1p, shift = (torch.randn(width, device=DEVICE, generator=g) for _ in range(3))
    want, want_res = K.ada_rms_norm_reference(x, residual, gate, scale1p, shift)
    out = _poison(torch.empty(rows, width, device=DEVICE, dtype=torch.bfloat16))
    res = residual.clone()
    K.ada_rms_norm(x, res, gate if has_x else None, scale1p, shift, out)
    _close(out, want, BF16_ATOL, BF16_RTOL)
    _close(res, want_res, FP32_ATOL, FP32_RTOL)


@pytest.mark.parametrize("rows", (10, 50) if not INTERPRET else (3,))     # pi0.5's horizons
@pytest.mark.parametrize("splits", [0, 1, 4])                          # 0: no x (a stack's first norm)
def test_ada_rms_norm_row_variants(rows, splits):
    """Training-time RTC's per-row modulation: each row reads its variant's (scale1p, shift, gate), the vectors from
    two tables of other variant strides laid out as the engine's (EngineWeights.training_time_tables: a layer's
    (2, 3, 2, D) for the gate, the final norm's (2, 2, D) for scale1p and shift); x as one (M, D) tile or split-K
    partials. The reference's contract (a row's vectors by indexing) is the broadcast reference row by row."""
    g = torch.Generator(device=DEVICE).manual_seed(rows + splits)
    width = 1024 if not INTERPRET else 320
    x = None
    if splits == 1:
        x = torch.randn(rows, width, device=DEVICE, generator=g).to(torch.bfloat16)
    elif splits > 1:
        x = torch.randn(splits, rows, width, device=DEVICE, generator=g)
    residual = torch.randn(rows, width, device=DEVICE, generator=g) * 2
    layer = torch.randn(2, 3, 2, width, device=DEVICE, generator=g)
    final = torch.randn(2, 2, width, device=DEVICE, generator=g)
    final[0] += 1.0
    gate, scale1p, shift = layer[1, 2], final[0], final[1]                # (2, D) each, strides 2D, D, D
    variant = (torch.arange(rows, device=DEVICE) < rows // 2 + 1).to(torch.int32)   # the frozen prefix: 1
    want, want_res = K.ada_rms_norm_reference(x, residual, gate, scale1p, shift, row_variant=variant)
    for r in range(rows):
        v = int(variant[r])
        xr = None if x is None else x[..., r:r + 1, :]
        y, h = K.ada_rms_norm_reference(xr, residual[r:r + 1], gate[v], scale1p[v], shift[v])
        # one row against the batch: the same math, a reduction of another shape (one bf16 step on the GPU)
        torch.testing.assert_close(want[r:r + 1].float(), y.float(), atol=2.0 ** -7, rtol=2.0 ** -7)
        torch.testing.assert_close(want_res[r:r + 1], h, atol=1e-6, rtol=1e-6)
    for pdl in (False, True) if not INTERPRET else (True,):
        out = _poison(torch.empty(rows, width, device=DEVICE, dtype=torch.bfloat16))
        res = residual.clone()
        K.ada_rms_norm(x, res, gate if x is not None else None, scale1p, shift, out, pdl=pdl, row_variant=variant)
        _close(out, want, BF16_ATOL, BF16_RTOL)
        _close(res, want_res, FP32_ATOL, FP32_RTOL)
    with pytest.raises(ValueError, match="row_variant"):
        K.ada_rms_norm(x, residual.clone(), gate if x is not None else None, scale1p, shift, out,
                       row_variant=variant.long())


@pytest.mark.parametrize("rows,mlp", [(PREFIX_ROWS, 16384), (DECODER_ROWS[0], 4096), (DECODER_ROWS[-1], 4096)])
def test_geglu(rows, mlp):
    g = torch.Generator(device=DEVICE).manual_seed(mlp + rows)
    gu = (torch.randn(rows, 2 * mlp, device=DEVICE, generator=g) * 2).to(torch.bfloat16)
    out = _poison(torch.empty(rows, mlp, device=DEVICE, dtype=torch.bfloat16))
    K.geglu(gu, out)
    _close(out, K.geglu_reference(gu), BF16_ATOL, BF16_RTOL)


def test_geglu_with_fp8_out_quantizes_the_product():
    """The prefix's GeGLU writing the per-tensor FP8 input of the down GEMM (fp8_fused_quant), at the real shape
    (fewer rows under the interpreter): the reference quantizes the fp32 product with the same static scale. The
    interpreter casts to FP8 without round-to-nearest (values land up to a few steps away), so there the check is
    the relative error, which a missing scale or clamp would blow up."""
    g = torch.Generator(device=DEVICE).manual_seed(21)
    rows = 16 if INTERPRET else PREFIX_ROWS
    gu = (torch.randn(rows, 2 * 16384, device=DEVICE, generator=g) * 2).to(torch.bfloat16)
    dtype = torch.float8_e4m3fn
    amax = float(K.geglu_reference(gu).float().abs().max())
    inv = torch.tensor([torch.finfo(dtype).max / (amax * 1.25)], device=DEVICE)     # the calibrated form
    out = torch.empty(rows, 16384, device=DEVICE, dtype=dtype)
    with pytest.raises(ValueError, match="inv_scale"):
        K.geglu(gu, out)                                                     # an FP8 out needs its scale
    K.geglu(gu, out, inv_scale=inv)
    want = K.geglu_reference(gu, inv, dtype)
    assert want.float().abs().max() > 100      # the scale puts the values across E4M3's range, not all near 0
    err = (out.float() - want.float()).norm() / want.float().norm()
    assert err < (0.1 if INTERPRET else FP8_REL_L2), f"rel L2 error {err:.3e}"
    if INTERPRET:
        return
    differ = out.float() != want.float()        # fp32 sigmoid/exp differ in the last bits: a few land one step away
    assert differ.float().mean() < FP8_BOUNDARY_FRACTION, f"{int(differ.sum())} values differ"
    step = (want.float()[differ].abs() * 2.0 ** -3).clamp(min=2.0 ** -9)
    assert ((out.float() - want.float())[differ].abs() <= step * 1.0001).all(), "a value moved more than one step"


@pytest.mark.parametrize("rows,offset,rows_per_program", [
    (PREFIX_ROWS, 0, None), (DECODER_ROWS[0], PREFIX_ROWS, None), (DECODER_ROWS[-1], 48, None),
    (PREFIX_ROWS, 0, 1),                    # one row per program, pinned
    (DECODER_ROWS[-1], 48, 8),              # 8-row programs over a row count they do not divide
])
def test_qkv_rope(rows, offset, rows_per_program):
    """By default a program takes 8 of the prefix's rows and one of the decoder's; every choice writes the
    reference's q and cache rows and leaves the rest of the cache alone."""
    assert K.qkv_rope_rows_per_program(560) == 8 and K.qkv_rope_rows_per_program(208) == 8
    assert K.qkv_rope_rows_per_program(51) == 1
    heads, kv_heads, head_dim = 8, 1, 256
    g = torch.Generator(device=DEVICE).manual_seed(rows + offset)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, device=DEVICE, generator=g).to(torch.bfloat16)
    pos = torch.randperm(900, device=DEVICE, generator=g)[:rows].to(torch.int32)  # any positions, not arange
    cos, sin = K.rope_tables(1024, head_dim, device=DEVICE)
    length = offset + rows + 5
    outs = []
    for fn in (K.qkv_rope_reference, K.qkv_rope):
        q = _poison(torch.empty(rows, heads, head_dim, device=DEVICE, dtype=torch.bfloat16))
        kc = _poison(torch.empty(kv_heads, length, head_dim, device=DEVICE, dtype=torch.bfloat16))
        vc = _poison(torch.empty(kv_heads, length, head_dim, device=DEVICE, dtype=torch.bfloat16))
        kwargs = {} if fn is K.qkv_rope_reference else {"rows_per_program": rows_per_program}
        fn(qkv, pos, cos, sin, q, kc, vc, offset, heads, kv_heads, q_scale=head_dim ** -0.5, **kwargs)
        outs.append((q, kc[:, offset:offset + rows], vc[:, offset:offset + rows]))
    for got, want in zip(outs[1], outs[0]):
        _close(got, want, BF16_ATOL, BF16_RTOL)
    # the rows before `offset` and after the last were not touched
    assert torch.isnan(kc[:, :offset].float()).all() and torch.isnan(kc[:, offset + rows:].float()).all()
    assert torch.isnan(vc[:, offset + rows:].float()).all()


# GR00T N1.6's language model (Qwen3-1.7B): 16 query heads, 8 key/value heads of 128, MLP 6144; prompt rows of two
# 252 x 252 views (162 image tokens) and a short instruction, padded to a multiple of 16
QWEN3_ROWS = 208 if not INTERPRET else 5


@pytest.mark.parametrize("rows_per_program", [None, 8])
def test_qkv_rope_with_head_norm_writes_the_layout_the_attention_reads(rows_per_program):
    """Qwen3's q_norm / k_norm before the rotation (head_norm), at its real shapes, with q / k / v written into
    [rows, heads, Dh] memory through strided views (the GR00T language model's layout): the reference's values,
    and every element written."""
    heads, kv_heads, head_dim, rows = 16, 8, 128, QWEN3_ROWS
    g = torch.Generator(device=DEVICE).manual_seed(17)
    qkv = (torch.randn(rows, (heads + 2 * kv_heads) * head_dim, device=DEVICE, generator=g) * 3).to(torch.bfloat16)
    head_norm = (torch.rand(2, head_dim, device=DEVICE, generator=g) + 0.5).contiguous()
    pos = torch.arange(rows, device=DEVICE, dtype=torch.int32)
    cos, sin = K.rope_tables(rows, head_dim, 1_000_000.0, device=DEVICE)
    outs = []
    for fn in (K.qkv_rope_reference, K.qkv_rope):
        q = _poison(torch.empty(rows, heads, head_dim, device=DEVICE, dtype=torch.bfloat16))
        k = _poison(torch.empty(rows, kv_heads, head_dim, device=DEVICE, dtype=torch.bfloat16))
        v = _poison(torch.empty(rows, kv_heads, head_dim, device=DEVICE, dtype=torch.bfloat16))
        kwargs = {} if fn is K.qkv_rope_reference else {"rows_per_program": rows_per_program}
        fn(qkv, pos, cos, sin, q, k.transpose(0, 1), v.transpose(0, 1), 0, heads, kv_heads, head_dim ** -0.5,
           head_norm=head_norm, norm_eps=1e-6, **kwargs)
        outs.append((q, k, v))
    for got, want in zip(outs[1], outs[0]):
        _close(got, want, BF16_ATOL, BF16_RTOL)
    # the normalization ran: each rotated query head has RMS |w| / sqrt(Dh), whatever the input's scale (x 3)
    q_rms = (outs[1][0].float() / head_dim ** -0.5).pow(2).mean(-1).sqrt()
    want_rms = head_norm[0].pow(2).mean().sqrt()
    assert (q_rms / want_rms - 1).abs().max() < 0.5
    with pytest.raises(ValueError, match="head_norm"):
        K.qkv_rope(qkv, pos, cos, sin, q, k.transpose(0, 1), v.transpose(0, 1), 0, heads, kv_heads,
                   head_norm=head_norm.to(torch.bfloat16))


@pytest.mark.parametrize("rows", [QWEN3_ROWS, DECODER_ROWS[0]])
def test_swiglu(rows):
    g = torch.Generator(device=DEVICE).manual_seed(rows + 5)
    gu = (torch.randn(rows, 2 * 6144, device=DEVICE, generator=g) * 2).to(torch.bfloat16)
    out = _poison(torch.empty(rows, 6144, device=DEVICE, dtype=torch.bfloat16))
    K.swiglu(gu, out)
    _close(out, K.swiglu_reference(gu), BF16_ATOL, BF16_RTOL)
    gate, up = gu.float().chunk(2, dim=-1)
    _close(out, torch.nn.functional.silu(gate) * up, BF16_ATOL, BF16_RTOL)


def test_qkv_rope_matches_model_rope():
    """The cos/sin tables + kernel equal the model's own rope() (gemma.py) on random q/k."""
    from flashrt_core.model.gemma import rope
    heads, head_dim, rows = 8, 256, DECODER_ROWS[-1]
    g = torch.Generator(device=DEVICE).manual_seed(3)
    qkv = torch.randn(rows, (heads + 2) * head_dim, device=DEVICE, generator=g)
    pos = torch.arange(100, 100 + rows, device=DEVICE)
    cos, sin = K.rope_tables(512, head_dim, device=DEVICE)
    q = torch.empty(rows, heads, head_dim, device=DEVICE)
    kc = torch.empty(1, rows, head_dim, device=DEVICE)
    vc = torch.empty_like(kc)
    K.qkv_rope(qkv, pos, cos, sin, q, kc, vc, 0, heads, 1)
    want_q = rope(qkv[:, :heads * head_dim].view(1, rows, heads, head_dim), pos[None], 10_000.0)[0]
    _close(q, want_q, 1e-4, 1e-4)


@pytest.mark.parametrize("rows", DECODER_ROWS)
def test_euler(rows):
    g = torch.Generator(device=DEVICE).manual_seed(rows)
    x = torch.randn(rows, 32, device=DEVICE, generator=g)
    v = torch.randn(rows, 32, device=DEVICE, generator=g).to(torch.bfloat16)
    b = torch.randn(32, device=DEVICE, generator=g)
    want = K.euler_reference(x.clone(), v, b, -0.1)
    got = K.euler(x.clone(), v, b, -0.1)
    _close(got, want, FP32_ATOL, FP32_RTOL)


EXPERT_WIDTH = 1024 if not INTERPRET else 320      # pi0.5's expert; the interpreter: two 256-wide blocks, one partial


@pytest.mark.parametrize("bias,block_d", [(True, None), (False, None), (True, 256)])
def test_denoise_step_in(bias, block_d):
    """kernels/flashrt_kernels/denoise_step.py's step start at pi0.5's shape (10 rows, 32 action dims, the expert's width), bf16
    projection weights and output, every launch mode, against denoise_step_in_reference; outputs NaN-poisoned.
    block_d None: the row in one pass (the default); 256: two passes over 256-wide blocks."""
    rows = 10 if not INTERPRET else 3
    g = torch.Generator(device=DEVICE).manual_seed(rows + bias)
    x_t = torch.randn(rows, 32, device=DEVICE, generator=g)
    w_in = (torch.randn(EXPERT_WIDTH, 32, device=DEVICE, generator=g) / 6).to(torch.bfloat16)
    b_in = torch.randn(EXPERT_WIDTH, device=DEVICE, generator=g).to(torch.bfloat16) if bias else None
    scale1p = 1 + torch.randn(EXPERT_WIDTH, device=DEVICE, generator=g) / 2
    shift = torch.randn(EXPERT_WIDTH, device=DEVICE, generator=g)
    want_res, want_y = K.denoise_step_in_reference(x_t, w_in, b_in, scale1p, shift, 1e-6, torch.bfloat16)
    for pdl in (False, True, K.EARLY_TRIGGER) if not INTERPRET else (True,):
        residual = _poison(torch.empty(rows, EXPERT_WIDTH, device=DEVICE))
        y = _poison(torch.empty(rows, EXPERT_WIDTH, device=DEVICE, dtype=torch.bfloat16))
        K.denoise_step_in(x_t, w_in, b_in, scale1p, shift, residual, y, 1e-6, pdl=pdl, block_d=block_d)
        _close(residual, want_res, 1e-4, 1e-4)
        _close(y, want_y, BF16_ATOL, BF16_RTOL)


@pytest.mark.parametrize("horizon", [10, 50])
def test_time_mlp_in(horizon):
    """kernels/flashrt_kernels/denoise_step.py's pi0 step start at pi0's shape (horizon + 1 suffix rows: the state token's, then
    the actions'; 32 action dims, the expert's width), bf16 folded weights and hidden rows, every launch mode,
    against time_mlp_in_reference: the residual's rows are the state token and the output bias, the hidden rows
    zeros and then the SiLU of the folded projection; outputs NaN-poisoned."""
    rows = horizon if not INTERPRET else 3
    g = torch.Generator(device=DEVICE).manual_seed(horizon)
    x_t = torch.randn(rows, 32, device=DEVICE, generator=g)
    w_fold = (torch.randn(EXPERT_WIDTH, 32, device=DEVICE, generator=g) / 4).to(torch.bfloat16)
    c, state_token, b_out = (torch.randn(EXPERT_WIDTH, device=DEVICE, generator=g) for _ in range(3))
    want_res, want_h = K.time_mlp_in_reference(x_t, w_fold, c, state_token, b_out, torch.bfloat16)
    assert torch.equal(want_h[0], torch.zeros_like(want_h[0])) and want_h[1:].abs().max() > 0
    for pdl in (False, True, K.EARLY_TRIGGER) if not INTERPRET else (True,):
        residual = _poison(torch.empty(rows + 1, EXPERT_WIDTH, device=DEVICE))
        h = _poison(torch.empty(rows + 1, EXPERT_WIDTH, device=DEVICE, dtype=torch.bfloat16))
        K.time_mlp_in(x_t, w_fold, c, state_token, b_out, residual, h, pdl=pdl)
        assert torch.equal(residual, want_res)                      # copies of fp32 vectors: exact
        _close(h, want_h, BF16_ATOL, BF16_RTOL)


@pytest.mark.parametrize("splits,block_d", [(0, None), (1, None), (4, None), (4, 256)])
def test_denoise_step_out(splits, block_d):
    """kernels/flashrt_kernels/denoise_step.py's step end at pi0.5's shape: the last down GEMM's output as one bf16 matrix (0) or
    fp32 split-K partials (1, 4), the final norm, the bf16 output projection and the Euler step on x_t in place,
    every launch mode, against denoise_step_out_reference; the residual is left untouched. block_d as in
    test_denoise_step_in."""
    rows = 10 if not INTERPRET else 3
    g = torch.Generator(device=DEVICE).manual_seed(17 + splits)
    x = torch.randn(*((splits,) if splits else ()), rows, EXPERT_WIDTH, device=DEVICE, generator=g)
    x = x if splits else x.to(torch.bfloat16)
    residual = torch.randn(rows, EXPERT_WIDTH, device=DEVICE, generator=g) * 3
    gate, shift = (torch.randn(EXPERT_WIDTH, device=DEVICE, generator=g) for _ in range(2))
    scale1p = 1 + torch.randn(EXPERT_WIDTH, device=DEVICE, generator=g) / 2
    w_out = (torch.randn(32, EXPERT_WIDTH, device=DEVICE, generator=g) / 32).to(torch.bfloat16)
    b_out = torch.randn(32, device=DEVICE, generator=g)
    x_t = torch.randn(rows, 32, device=DEVICE, generator=g)
    want = K.denoise_step_out_reference(x, residual, gate, scale1p, shift, w_out, b_out, x_t.clone(), -0.1, 1e-6)
    before = residual.clone()
    for pdl in (False, True, K.EARLY_TRIGGER) if not INTERPRET else (True,):
        got = K.denoise_step_out(x, residual, gate, scale1p, shift, w_out, b_out, x_t.clone(), -0.1, 1e-6,
                                 pdl=pdl, block_d=block_d)
        _close(got, want, 1e-4, 1e-4)
        assert torch.equal(residual, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_patch_rows(dtype):
    """kernels/flashrt_kernels/patch_embed.py at the SigLIP shape (224 x 224 uint8, 14-pixel patches: 256 rows of 588; the
    interpreter: 28 x 28, 4 rows), every row written, against the PyTorch gather: exact (the same formula in fp32,
    then one round-to-nearest to bf16); the rows padded to 592 columns as the engine's GEMM reads them, the padding
    zeros. Random pixels over the whole uint8 range, so channel or pixel order mistakes show."""
    size, patch = (224, 14) if not INTERPRET else (28, 14)
    g = torch.Generator(device=DEVICE).manual_seed(size)
    img = torch.randint(0, 256, (size, size, 3), device=DEVICE, generator=g, dtype=torch.int64).to(torch.uint8)
    width = 3 * patch * patch
    out = _poison(torch.empty((size // patch) ** 2, width + 4, device=DEVICE, dtype=dtype))     # padded to 592
    got = K.patch_rows(img, patch, out)
    want = K.patch_rows_reference(img, patch, dtype)
    # Triton's interpreter rounds fp32 -> bf16 by its own rule (numpy has no bf16): one bf16 step of [-1, 1] there
    _close(got[:, :width], want, 2.0 ** -7 if INTERPRET and dtype == torch.bfloat16 else 0.0, 0.0)
    assert torch.equal(got[:, width:], torch.zeros_like(got[:, width:]))          # the padding columns: zeros
    # the reference itself: row 1 is the patch right of the top-left one; column 1 its pixel (0, 1), red channel
    assert want[1, 1].item() == pytest.approx(float(img[0, patch + 1, 0]) / 255.0 * 2.0 - 1.0, abs=1e-2)
    with pytest.raises(ValueError, match="patch_rows"):
        K.patch_rows(img[:, :-1], patch, out)
    with pytest.raises(ValueError, match="patch_rows"):
        K.patch_rows(img, patch, out[:, :width - 1])


ATTN_BF16_ATOL = 2e-2  # bf16 probabilities in the P @ V product (as every flash kernel)
# Triton's interpreter computes bf16 tl.dot wrongly (numpy has no bf16): check the logic in fp32 there.
ATTN_DTYPE = torch.float32 if INTERPRET else torch.bfloat16


@pytest.mark.parametrize("log2_domain", [False, True])
def test_merge_splits_of_a_key_split_attention_is_the_attention(log2_domain):
    """merge_splits (the second launch of every key-split attention) against the softmax attention over all keys,
    from partials built by definition on random inputs: per split the unnormalized p @ v, the row maximum and the
    row sum, one split's keys all masked for some rows (max -inf, sum 0). log2_domain: the partials as
    kernels/flashrt_kernels/prefix_attention.py makes them (scores scaled by log2(e), exp2, the maximum stored divided by log2(e))."""
    rows, keys, dh, splits = (96, 200, 256, 3) if not INTERPRET else (8, 24, 16, 3)
    g = torch.Generator(device=DEVICE).manual_seed(rows + keys)
    q = torch.randn(rows, dh, device=DEVICE, generator=g) * dh ** -0.5
    k = torch.randn(keys, dh, device=DEVICE, generator=g)
    v = torch.randn(keys, dh, device=DEVICE, generator=g)
    bias = torch.where(torch.rand(keys, device=DEVICE, generator=g) > 0.3, 0.0, float("-inf"))
    bias[0] = 0.0
    s = q @ k.T + bias                                                              # (rows, keys)
    share = -(-keys // splits)
    s[: rows // 2, share:2 * share] = float("-inf")                                # split 1: nothing for these rows
    want = torch.softmax(s, dim=-1) @ v
    log2e = 1.4426950408889634
    acc = torch.empty(splits, rows, dh, device=DEVICE)
    ml = torch.empty(splits, rows, 2, device=DEVICE)
    for i in range(splits):
        part = s[:, i * share:(i + 1) * share] * (log2e if log2_domain else 1.0)
        m = part.max(dim=1).values
        safe = torch.where(m == float("-inf"), 0.0, m)[:, None]
        p = torch.exp2(part - safe) if log2_domain else torch.exp(part - safe)
        acc[i] = p @ v[i * share:(i + 1) * share]
        ml[i, :, 0] = m / log2e if log2_domain else m
        ml[i, :, 1] = p.sum(dim=1)
    assert (ml[1, : rows // 2, 0] == float("-inf")).all() and (ml[1, : rows // 2, 1] == 0).all()
    torch.testing.assert_close(K.merge_splits_reference(acc, ml), want, atol=1e-5, rtol=1e-5)
    out = _poison(torch.empty(rows, dh, device=DEVICE))
    assert K.merge_splits(acc, ml, out) is out
    _close(out, want, 1e-5, 1e-5)
    for pdl in (True, K.EARLY_TRIGGER):
        assert torch.equal(K.merge_splits(acc, ml, torch.empty_like(out), pdl=pdl), out)
    with pytest.raises(ValueError, match="merge_splits: acc"):
        K.merge_splits(acc, ml[:, :-1], out)


def _prefix_key_bias(prefix: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefix's valid keys with holes anywhere, not only a tail (about one in five masked; the first key always
    valid), and the additive key bias the attention kernels read: (valid, bias)."""
    valid = torch.rand(prefix, device=DEVICE, generator=g) > 0.2
    valid[0] = True
    return valid, torch.where(valid, 0.0, float("-inf"))


def _suffix_visible(tokens: int, pi0: bool) -> torch.Tensor:
    """Suffix keys each suffix row sees: all of them (pi0.5), or for pi0 the state token (row 0) only itself."""
    visible = torch.full((tokens,), tokens, device=DEVICE, dtype=torch.int32)
    if pi0:
        visible[0] = 1
    return visible


def _prefilled_caches(prefix: int, tokens: int, dh: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V caches of prefix + tokens rows: random prefix rows, the suffix rows NaN (a kernel that should not write
    them is caught writing them, one that should read them from elsewhere is caught reading them)."""
    k_cache = _poison(torch.empty(prefix + tokens, dh, device=DEVICE, dtype=ATTN_DTYPE))
    v_cache = _poison(torch.empty_like(k_cache))
    k_cache[:prefix] = torch.randn(prefix, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    v_cache[:prefix] = torch.randn(prefix, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    return k_cache, v_cache


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9
                    or not K.HAVE_GLUON, reason="kernels/flashrt_kernels/prefix_attention.py needs Gluon on a Hopper (sm90) GPU")
@pytest.mark.parametrize("tokens,holes", [
    (576, False),     # 2 views + 64 text slots, the last 16 padded: the engine's prefix
    (561, True),      # keys masked anywhere; rows past the last 64-row block; the last key block partly past P
    (832, False),     # 3 views + 64 text slots
    (320, True),      # 1 view
])
def test_prefix_attention_wgmma(tokens, holes):
    """kernels/flashrt_kernels/prefix_attention.py, every form (the next block's scores during the softmax or after it; 32-key
    blocks; 2 or 3 programs per row block over their shares of the keys, merged by the combine kernel) against
    attention_reference at the backbone's shapes (8 heads stacked on the query axis, one K/V head, head dim 256, q
    scaled), random inputs; every row of the output written, each launch mode bitwise the same."""
    heads, dh = 8, 256
    g = torch.Generator(device=DEVICE).manual_seed(tokens)
    q = (torch.randn(tokens * heads, dh, device=DEVICE, generator=g) * dh ** -0.5).to(torch.bfloat16)
    k = torch.randn(tokens, dh, device=DEVICE, generator=g).to(torch.bfloat16)
    v = torch.randn(tokens, dh, device=DEVICE, generator=g).to(torch.bfloat16)
    if holes:
        _, bias = _prefix_key_bias(tokens, g)
    else:                                                                   # a padded tail of 16 text slots
        bias = torch.where(torch.arange(tokens, device=DEVICE) < tokens - 16, 0.0, float("-inf"))
    want = K.attention_reference(q, k, v, bias, tokens, None, heads, 1.0)
    forms = ({}, {"overlap": True}, {"block_n": 32}, {"splits": 2, "block_n": 32}, {"splits": 3, "block_n": 32},
             {"splits": 2, "block_n": 64})
    for form in forms:
        assert K.prefix_attention_supported(q.shape[0], tokens, dh, q.device, form.get("splits", 1),
                                            form.get("block_n", 64)), form
        out = _poison(torch.empty_like(q))
        assert K.prefix_attention(q, k, v, bias, out, **form) is out
        _close(out, want, ATTN_BF16_ATOL, BF16_RTOL)
        for pdl in (False, True, K.EARLY_TRIGGER):       # no state between launches; PDL changes no bit
            assert torch.equal(K.prefix_attention(q, k, v, bias, pdl=pdl, **form), out), (form, pdl)


@pytest.mark.parametrize("tokens,prefix,suffix_visible,splits", [
    (PREFIX_ROWS, PREFIX_ROWS, None, None),              # prefix: bidirectional over valid prefix keys
    (PREFIX_ROWS, PREFIX_ROWS, None, 1),                 # the prefix attention's other candidates
    (PREFIX_ROWS, PREFIX_ROWS, None, 4),
    (DECODER_ROWS[0], PREFIX_ROWS, "all", None),         # pi0.5 denoise step: prefix + all suffix keys
    (DECODER_ROWS[-1], PREFIX_ROWS, "pi0", None),        # pi0: the state token sees only itself in the suffix
    (DECODER_ROWS[0], 150, "all", 3),                    # several splits merged by the combine kernel
    (DECODER_ROWS[0], PREFIX_ROWS, "all", 1),            # one split: the direct-output path
])
def test_attention(tokens, prefix, suffix_visible, splits):
    heads, dh = 8, 256
    g = torch.Generator(device=DEVICE).manual_seed(tokens + prefix)
    L = prefix + (tokens if suffix_visible else 0)
    q = torch.randn(tokens * heads, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    k = torch.randn(L, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    v = torch.randn(L, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    _, bias = _prefix_key_bias(prefix, g)
    visible = _suffix_visible(tokens, suffix_visible == "pi0") if suffix_visible else None
    want = K.attention_reference(q, k, v, bias, prefix, visible, heads, dh ** -0.5)
    # pdl=True with suffix keys and one 64-key block per split: prefix-only blocks are read before the PDL wait
    for pdl in (False, True) if not INTERPRET else (False,):
        out = _poison(torch.empty_like(q))
        K.attention(q, k, v, bias, prefix, visible, heads, dh ** -0.5, out, splits=splits, pdl=pdl)
        _close(out, want, ATTN_BF16_ATOL, BF16_RTOL)


@pytest.mark.parametrize("tokens,prefix,suffix_visible,splits", [
    (DECODER_ROWS[0], PREFIX_ROWS + 16, "all", None),    # pi0.5 step: 576 prefix keys, one 64-key block per split
    (DECODER_ROWS[-1], PREFIX_ROWS, "pi0", None),        # pi0 (51 rows): several blocks per split
    (DECODER_ROWS[0], 150, "all", 3),                    # the suffix keys inside a block of prefix keys
    (DECODER_ROWS[0], 100, "all", 2),                    # one prefix split + the suffix split
])
def test_decoder_attention(tokens, prefix, suffix_visible, splits):
    """RoPE of the queries and suffix keys inside the attention, suffix K/V read from the QKV rows, against
    qkv_rope + attention (the reference is that composition). Positions continue after a prefix with holes."""
    heads, dh = 8, 256
    g = torch.Generator(device=DEVICE).manual_seed(7 * tokens + prefix)
    qkv = torch.randn(tokens, (heads + 2) * dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    k_cache, v_cache = _prefilled_caches(prefix, tokens, dh, g)
    valid, bias = _prefix_key_bias(prefix, g)
    pos = int(valid.sum()) + torch.arange(tokens, device=DEVICE)
    cos, sin = K.rope_tables(prefix + tokens, dh, 10000.0, torch.device(DEVICE))
    visible = _suffix_visible(tokens, suffix_visible == "pi0")
    want = K.decoder_attention_reference(qkv, k_cache, v_cache, pos, cos, sin, bias, prefix, visible, heads,
                                         dh ** -0.5)
    assert not torch.isnan(want).any()
    for pdl in (False, True):                 # interpreter: the PDL wait is a no-op, the early K/V path still runs
        out = _poison(torch.empty(tokens * heads, dh, device=DEVICE, dtype=ATTN_DTYPE))
        K.decoder_attention(qkv, k_cache, v_cache, pos, cos, sin, bias, prefix, visible, heads, dh ** -0.5, out,
                            splits=splits, pdl=pdl)
        _close(out, want, ATTN_BF16_ATOL, BF16_RTOL)
    assert torch.isnan(k_cache[prefix:]).all(), "decoder_attention wrote the cache's suffix rows"


@pytest.mark.parametrize("tokens,from_qkv", [(DECODER_ROWS[0], True), (DECODER_ROWS[-1], False)])
def test_step_attention_in_every_row_and_key_block(tokens, from_qkv):
    """Every launch form the split attention kernels take for a denoising step (rows per program in ROW_BLOCKS x
    keys per block in KEY_BLOCKS), both launch modes, against the reference: pi0.5's 10-row step through
    decoder_attention (RoPE inside), pi0's 51-row step through attention over the caches."""
    heads, dh, prefix = 8, 256, PREFIX_ROWS + 16
    g = torch.Generator(device=DEVICE).manual_seed(tokens)
    L = prefix + tokens
    k = torch.randn(L, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    v = torch.randn(L, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
    valid, bias = _prefix_key_bias(prefix, g)
    visible = _suffix_visible(tokens, pi0=True)
    if from_qkv:
        qkv = torch.randn(tokens, (heads + 2) * dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
        pos = int(valid.sum()) + torch.arange(tokens, device=DEVICE)
        cos, sin = K.rope_tables(L, dh, 10000.0, torch.device(DEVICE))
        want = K.decoder_attention_reference(qkv, k, v, pos, cos, sin, bias, prefix, visible, heads, dh ** -0.5)
    else:
        q = torch.randn(tokens * heads, dh, device=DEVICE, generator=g).to(ATTN_DTYPE)
        want = K.attention_reference(q, k, v, bias, prefix, visible, heads, dh ** -0.5)
    for block_m in K.ATTENTION_ROW_BLOCKS:
        for key_block in K.ATTENTION_KEY_BLOCKS:
            for pdl in (False, True) if not INTERPRET else (True,):
                out = _poison(torch.empty(tokens * heads, dh, device=DEVICE, dtype=ATTN_DTYPE))
                if from_qkv:
                    K.decoder_attention(qkv, k, v, pos, cos, sin, bias, prefix, visible, heads, dh ** -0.5, out,
                                        pdl=pdl, key_block=key_block, block_m=block_m)
                else:
                    K.attention(q, k, v, bias, prefix, visible, heads, dh ** -0.5, out, pdl=pdl,
                                key_block=key_block, block_m=block_m)
                _close(out, want, ATTN_BF16_ATOL, BF16_RTOL)
    with pytest.raises(ValueError, match="block_m"):
        K.attention(k[:8], k, v, bias, prefix, visible[:1], heads, 1.0, torch.empty_like(k[:8]), block_m=48)


@pytest.mark.skipif(INTERPRET, reason="a BLAS epilogue, not a Triton kernel: GPU only")
def test_vision_fc1_gelu_epilogue_is_the_tanh_gelu():
    """Ops.linear_gelu's GEMM epilogue (torch._addmm_activation on the GPU) at the SigLIP fc1 shape (2 views x 256
    tokens, 1152 -> 4304) equals torch's tanh GELU (SigLIP's) of the GEMM, to bf16 rounding."""
    from flashrt_core.engine.dispatch import Op, resolve
    from flashrt_core.engine.hardware import detect_hardware
    from flashrt_core.engine.ops import Ops
    from flashrt_core.engine.weights import Linear
    g = torch.Generator(device=DEVICE).manual_seed(11)
    x = torch.randn(VISION_ROWS, 1152, device=DEVICE, generator=g).bfloat16()
    lin = Linear([((torch.randn(4304, 1152, device=DEVICE, generator=g) * 1152 ** -0.5).bfloat16(),
                   torch.randn(4304, device=DEVICE, generator=g).bfloat16())])
    ops = Ops(resolve(detect_hardware("auto", torch.device(DEVICE))))
    assert ops.dispatch[Op.GEMM_EPILOGUE] == "gemm_epilogue"
    got = ops.linear_gelu(x, lin)
    pre = torch.nn.functional.linear(x, *lin.parts[0]).float()
    tanh_gelu = torch.nn.functional.gelu(pre, approximate="tanh")
    _close(got, tanh_gelu, BF16_ATOL, BF16_RTOL)


SKINNY_DTYPE = torch.float32 if INTERPRET else torch.bfloat16   # interpreter: no bf16 tl.dot
SKINNY_REL_L2 = 1e-2  # bf16 output rounding + fp32 accumulation order


@pytest.mark.parametrize("rows", DECODER_ROWS)
@pytest.mark.parametrize("n,k,geglu,split", [
    (2560, 1024, False, 1),      # expert QKV
    (1024, 2048, False, 2),      # expert o_proj, split-K partials
    (8192, 1024, True, 1),       # expert merged gate/up with the GeGLU epilogue
    (1024, 4096, False, 4),      # expert down_proj, split-K partials
])
def test_skinny_gemm(rows, n, k, geglu, split):
    if INTERPRET:
        n, k = n // 16, k // 4
    g = torch.Generator(device=DEVICE).manual_seed(n + k + rows)
    x = torch.randn(rows, k, device=DEVICE, generator=g).to(SKINNY_DTYPE)
    w = (torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5).to(SKINNY_DTYPE)
    want = K.skinny_gemm_reference(x, w, geglu, split).float()
    got = K.skinny_gemm(x, w, geglu, split, block_k=64 if INTERPRET else 256).float()
    assert got.shape == want.shape and not torch.isnan(got).any()
    err = (got - want).norm() / want.norm()
    assert err < SKINNY_REL_L2, f"rel L2 error {err:.2e}"


@pytest.mark.parametrize("splits", [2, 4, 8, 16])     # the TMA candidates: O split-K 2-8, down 4-16
def test_norms_sum_split_k_partials(splits):
    rows, width = DECODER_ROWS[-1], 1024
    g = torch.Generator(device=DEVICE).manual_seed(splits)
    parts = torch.randn(splits, rows, width, device=DEVICE, generator=g)
    residual = torch.randn(rows, width, device=DEVICE, generator=g)
    gate, scale1p, shift = (torch.randn(width, device=DEVICE, generator=g) for _ in range(3))
    want, want_res = K.ada_rms_norm_reference(parts.sum(0), residual, gate, scale1p, shift)
    out, res = _poison(torch.empty(rows, width, device=DEVICE, dtype=torch.bfloat16)), residual.clone()
    K.ada_rms_norm(parts, res, gate, scale1p, shift, out)
    _close(out, want, BF16_ATOL, BF16_RTOL)
    _close(res, want_res, 1e-4, 1e-5)
    want, want_res = K.residual_norm_reference(parts.sum(0), residual)
    out, res = _poison(torch.empty(rows, width, device=DEVICE, dtype=torch.bfloat16)), residual.clone()
    K.residual_norm(parts, res, out)
    _close(out, want, BF16_ATOL, BF16_RTOL)
    _close(res, want_res, 1e-4, 1e-5)


@pytest.mark.skipif(INTERPRET, reason="Triton's interpreter casts to FP8 without round-to-nearest")
@pytest.mark.parametrize("dtype_name", ["float8_e4m3fn", "float8_e4m3fnuz"])
def test_fp8_quant(dtype_name):
    if dtype_name.endswith("fnuz") and torch.version.hip is None:
        pytest.skip("FNUZ E4M3 is the MI300X (gfx942) format; not run on NVIDIA")
    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device=DEVICE).manual_seed(11)
    x = (torch.randn(PREFIX_ROWS, 16384, device=DEVICE, generator=g) * 3).to(torch.bfloat16)
    x[0, :4] = torch.tensor([1e4, -1e4, 0.5, -0.5])                       # saturates, not NaN
    inv = torch.tensor([torch.finfo(dtype).max / 12.0], device=DEVICE)
    got = K.fp8_quant(x, inv, dtype)
    want = K.fp8_quant_reference(x, inv, dtype)
    assert got.dtype == dtype and not torch.isnan(got.float()).any()
    assert torch.equal(got.float(), want.float())


@pytest.mark.skipif(INTERPRET, reason="real shapes only (the interpreter test above covers the logic)")
@pytest.mark.parametrize("kind,n,k", EXPERT_GEMMS)
def test_skinny_gemm_every_engine_config(kind, n, k):
    """Every launch configuration the engine may pick at load (kernel_configs.SKINNY_CANDIDATES), at the expert's shapes."""
    from flashrt_core.engine.kernel_configs import SKINNY_CANDIDATES
    g = torch.Generator(device=DEVICE).manual_seed(n + k)
    for rows in DECODER_ROWS:
        x = torch.randn(rows, k, device=DEVICE, generator=g).to(torch.bfloat16)
        w = (torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5).to(torch.bfloat16)
        for cfg in (c for c in SKINNY_CANDIDATES[kind] if rows <= c.max_rows):
            want = K.skinny_gemm_reference(x, w, kind == "gate_up", cfg.split_k).float()
            for pdl in (False, True):
                got = K.skinny_gemm(x, w, kind == "gate_up", cfg.split_k, cfg.block_n, cfg.block_k, cfg.stages,
                                    cfg.warps, pdl=pdl).float()
                err = (got - want).norm() / want.norm()
                assert got.shape == want.shape and err < SKINNY_REL_L2, \
                    f"{cfg} pdl={pdl} rows {rows}: rel L2 error {err:.2e}"


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9
                    or not K.HAVE_GLUON, reason="kernels/flashrt_kernels/smem_gemm.py needs Gluon on a Hopper (sm90) GPU")
@pytest.mark.parametrize("kind,n,k", EXPERT_GEMMS)
def test_smem_gemm_every_engine_config(kind, n, k):
    """Every kernels/flashrt_kernels/smem_gemm.py configuration the engine may pick (kernel_configs.SMEM_CANDIDATES), at the expert's shapes,
    on 1-16 rows (TMA zero-fills the rest of the 16-row tile), in every launch mode."""
    _check_smem_gemm_configs(kind, n, k, sorted({1, *[r for r in DECODER_ROWS if r <= 16], 16}))


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9
                    or not K.HAVE_GLUON, reason="kernels/flashrt_kernels/smem_gemm.py needs Gluon on a Hopper (sm90) GPU")
@pytest.mark.parametrize("kind,n,k", EXPERT_GEMMS)
def test_smem_gemm_rows_kernel_every_engine_config(kind, n, k):
    """The same on 17-64 rows (_smem_gemm_rows_kernel, EngineOptions.smem_gemm_rows: 32- and 64-row x boxes
    through a ring of TMA stages; horizon 50's 50-51 rows among them), every box count of the ring's refills."""
    _check_smem_gemm_configs(kind, n, k, [17, 32, 33, *[r for r in DECODER_ROWS if r > 16], 64])


def _check_smem_gemm_configs(kind: str, n: int, k: int, row_counts) -> None:
    from flashrt_core.engine.kernel_configs import SMEM_CANDIDATES
    g = torch.Generator(device=DEVICE).manual_seed(n + 3 * k)
    w = (torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5).to(torch.bfloat16)
    for rows in sorted(set(row_counts)):
        x = torch.randn(rows, k, device=DEVICE, generator=g).to(torch.bfloat16)
        for cfg in SMEM_CANDIDATES[kind]:
            assert K.smem_gemm_supported(rows, n, k, kind == "gate_up", cfg.split_k), cfg
            want = K.skinny_gemm_reference(x, w, kind == "gate_up", cfg.split_k).float()
            for pdl in (False, True, K.EARLY_TRIGGER):
                got = K.smem_gemm(x, w, kind == "gate_up", cfg.split_k, pdl=pdl).float()
                err = (got - want).norm() / want.norm()
                assert got.shape == want.shape and err < SKINNY_REL_L2, \
                    f"{cfg} pdl={pdl} rows {rows}: rel L2 error {err:.2e}"


@pytest.mark.skipif(INTERPRET, reason="real shapes only")
@pytest.mark.parametrize("rows", DECODER_ROWS)
def test_qkv_gemm_rope_every_engine_config(rows):
    """The decoder QKV GEMM with the RoPE / KV-write epilogue against the fp32 product + qkv_rope reference, pi0.5
    expert shapes (8 q heads, 1 KV head, Dh 256, K 1024), suffix rows written after 590 cached prefix rows."""
    from flashrt_core.engine.kernel_configs import ROPE_GEMM_CANDIDATES
    heads, dh, width, offset = 8, 256, 1024, 590
    g = torch.Generator(device=DEVICE).manual_seed(rows)
    x = torch.randn(rows, width, device=DEVICE, generator=g).to(torch.bfloat16)
    w = (torch.randn((heads + 2) * dh, width, device=DEVICE, generator=g) * width ** -0.5).to(torch.bfloat16)
    cos, sin = K.rope_tables(offset + rows, dh, 10000.0, DEVICE)
    pos = torch.arange(offset, offset + rows, device=DEVICE)
    cache = torch.randn(2, 1, offset + rows, dh, device=DEVICE, generator=g).to(torch.bfloat16)
    want_q = torch.empty(rows, heads, dh, device=DEVICE, dtype=torch.bfloat16)
    want_cache = cache.clone()
    K.qkv_gemm_rope_reference(x, w, pos, cos, sin, want_q, want_cache[0], want_cache[1], offset, heads, 1, dh ** -0.5)
    for cfg in ROPE_GEMM_CANDIDATES:
        for pdl in (False, True):
            q, got_cache = _poison(torch.empty_like(want_q)), cache.clone()
            got_cache[:, :, offset:] = float("nan")
            K.qkv_gemm_rope(x, w, pos, cos, sin, q, got_cache[0], got_cache[1], offset, heads, 1, dh ** -0.5,
                            block_p=cfg.block_p, block_k=cfg.block_k, num_stages=cfg.stages, num_warps=cfg.warps,
                            pdl=pdl)
            _close(q, want_q, BF16_ATOL, BF16_RTOL)
            _close(got_cache, want_cache, BF16_ATOL, BF16_RTOL)     # prefix rows untouched, suffix rows written


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs an sm90+ GPU")
@pytest.mark.parametrize("launch", ["pdl", "pdl_early_trigger"])
@pytest.mark.parametrize("rope", ["qkv_rope", "gemm_epilogue", "in_attention"])
def test_dependent_launch_chain_in_a_cuda_graph_matches_stream_order(rope, launch):
    """One pi0.5 expert layer (norm -> QKV -> RoPE/KV write -> attention -> o -> norm -> gate/up -> down -> norm)
    of PDL-launched kernels captured in a CUDA graph and replayed on fresh inputs: every result equals the same
    kernels launched in plain stream order (a kernel reading its input before the kernel ahead finished writing
    it would differ). Real expert shapes, 10 rows, 600 cached keys. pdl_early_trigger: every kernel lets the next
    one launch at its start, so several kernels of the layer are resident at once."""
    mode = K.EARLY_TRIGGER if launch == "pdl_early_trigger" else True
    from flashrt_core.engine.kernel_configs import SKINNY_DEFAULT
    g = torch.Generator(device=DEVICE).manual_seed(5)
    rows, width, heads, dh, prefix, mlp = 10, 1024, 8, 256, 590, 4096
    bf = torch.bfloat16

    def rnd(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, device=DEVICE, generator=g) * scale).to(dtype)
    w_qkv, w_o = rnd((heads + 2) * dh, width, scale=width ** -0.5, dtype=bf), rnd(width, heads * dh, scale=0.02, dtype=bf)
    w_gu, w_down = rnd(2 * mlp, width, scale=width ** -0.5, dtype=bf), rnd(width, mlp, scale=0.02, dtype=bf)
    vec = [rnd(width) for _ in range(6)]
    cos, sin = K.rope_tables(prefix + rows, dh, 10000.0, torch.device(DEVICE))
    pos = torch.arange(prefix, prefix + rows, device=DEVICE)
    bias = torch.zeros(prefix, device=DEVICE)
    visible = torch.full((rows,), rows, device=DEVICE, dtype=torch.int32)
    # the configurations the engine runs before tuning (split-K partials for o and down)
    cfg = {kind: SKINNY_DEFAULT[kind] for kind in ("qkv", "o", "gate_up", "down")}
    for kind, k in (("qkv", width), ("o", heads * dh), ("gate_up", width), ("down", mlp)):
        assert k % (cfg[kind].block_k * cfg[kind].split_k) == 0, (kind, cfg[kind])

    def state():
        return {"residual": rnd(rows, width), "partials": rnd(4, rows, width, scale=0.1),
                "k": rnd(1, prefix + rows, dh, dtype=bf), "v": rnd(1, prefix + rows, dh, dtype=bf),
                "y": torch.empty(rows, width, device=DEVICE, dtype=bf),
                "q": torch.empty(rows, heads, dh, device=DEVICE, dtype=bf),
                "attn": torch.empty(rows * heads, dh, device=DEVICE, dtype=bf)}

    def layer(st, pdl):
        def gemm(x, w, kind):
            c = cfg[kind]
            return K.skinny_gemm(x, w, kind == "gate_up", c.split_k, c.block_n, c.block_k, c.stages, c.warps, pdl=pdl)
        K.ada_rms_norm(st["partials"], st["residual"], vec[0], vec[1], vec[2], st["y"], pdl=pdl)
        if rope == "in_attention":
            K.decoder_attention(gemm(st["y"], w_qkv, "qkv"), st["k"][0], st["v"][0], pos, cos, sin, bias, prefix,
                                visible, heads, dh ** -0.5, st["attn"], pdl=pdl)
        else:
            if rope == "gemm_epilogue":
                K.qkv_gemm_rope(st["y"], w_qkv, pos, cos, sin, st["q"], st["k"], st["v"], prefix, heads, 1,
                                dh ** -0.5, pdl=pdl)
            else:
                K.qkv_rope(gemm(st["y"], w_qkv, "qkv"), pos, cos, sin, st["q"], st["k"], st["v"], prefix, heads, 1,
                           dh ** -0.5, pdl=pdl)
            K.attention(st["q"].view(rows * heads, dh), st["k"][0], st["v"][0], bias, prefix, visible, heads, 1.0,
                        st["attn"], pdl=pdl)
        K.ada_rms_norm(gemm(st["attn"].view(rows, heads * dh), w_o, "o"), st["residual"], vec[3], vec[4], vec[5],
                       st["y"], pdl=pdl)
        st["partials"].copy_(gemm(gemm(st["y"], w_gu, "gate_up"), w_down, "down"))

    graph_state = state()
    layer(graph_state, pdl=mode)                      # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            layer(graph_state, pdl=mode)
    for _ in range(3):
        fresh = state()
        for name, t in fresh.items():
            graph_state[name].copy_(t)
        graph.replay()
        for _ in range(3):
            layer(fresh, pdl=False)
        torch.cuda.synchronize()
        for name in ("residual", "partials", "k", "v", "y", "attn"):
            assert torch.equal(graph_state[name], fresh[name]), f"{name} differs between PDL graph and stream order"


CHAIN_REL_L2 = 1e-2   # bf16 rounding after each of the 18 layers, the same products in fp32 on both sides


@pytest.mark.parametrize("resident", [False, True], ids=["streamed", "resident"])
@pytest.mark.parametrize("wait, pdl", [("launch", False), ("launch", True), ("launch", K.EARLY_TRIGGER),
                                       ("counter", False)])
def test_layer_chain(wait, pdl, resident):
    """kernels/flashrt_kernels/layer_chain.py at the expert's width (1024), 10 rows, 18 layers (one denoising step):
    per-layer launches with and without PDL, and the persistent kernel whose layers wait on counters; each with a
    weight per layer, and resident (W_0 for every layer, the other layers' weights random and never read)."""
    if INTERPRET and wait in K.LAYER_CHAIN_PERSISTENT_WAITS:
        pytest.skip("the interpreter runs programs one by one: a program waiting on another's output never ends")
    layers, rows, width = (18, 10, 1024) if not INTERPRET else (3, 3, 64)
    g = torch.Generator(device=DEVICE).manual_seed(layers + K.LAYER_CHAIN_WAITS.index(wait))
    x = torch.randn(rows, width, device=DEVICE, generator=g).to(SKINNY_DTYPE)
    w = (torch.randn(layers, width, width, device=DEVICE, generator=g) * width ** -0.5).to(SKINNY_DTYPE)
    want = K.layer_chain_reference(x, K.resident_weights(w) if resident else w).float()
    chain = K.LayerChain(w, rows, wait, pdl, resident=resident)
    chain.bf16[1:].fill_(float("nan"))
    chain.x.copy_(x)
    for _ in range(2):                      # a second run starts from the first one's buffers
        got = chain.run().float()
        assert not torch.isnan(got).any()
        err = (got - want).norm() / want.norm()
        assert err < CHAIN_REL_L2, f"rel L2 error {err:.2e}; {_first_wrong_layer(chain, w, resident, CHAIN_REL_L2)}"
    if wait == "counter":           # every tile of every layer signalled exactly once
        assert chain.counters.tolist() == [width // chain.block_n] * layers


def _first_wrong_layer(chain, w: torch.Tensor, resident: bool, bound: float) -> str:
    """Where a chain went wrong: the first layer whose output, recomputed from the chain's own input to it, is off
    by more than `bound`, with the rows and column tiles that are off."""
    outs = chain.bf16
    for layer in range(w.shape[0]):
        weight = w[0] if resident else w[layer]
        want = K.layer_chain_reference(outs[layer], weight[None]).float()
        diff = (outs[layer + 1].float() - want).abs()
        if float(diff.norm() / want.norm()) > bound:
            n = chain.block_n
            by_tile = (diff.view(diff.shape[0], -1, n).norm(dim=(0, 2))
                       / want.view(want.shape[0], -1, n).norm(dim=(0, 2)))
            tiles = torch.nonzero(by_tile > bound).flatten().tolist()
            rows = torch.nonzero(diff.norm(dim=1) / want.norm(dim=1) > bound).flatten().tolist()
            return f"layer {layer} is the first wrong one: rows {rows}, column tiles {tiles[:16]} of {len(tiles)}"
    return "every layer matches its own input: the error accumulates over the chain"


def _skip_without_cuda_build() -> None:
    """The CUDA C++ kernels (kernels/flashrt_kernels/cuda/) run on a GPU only, built by nvcc."""
    if INTERPRET:
        pytest.skip("a CUDA C++ kernel: no interpreter runs it")
    if not K.cuda_build_available():
        pytest.skip("no nvcc to build the CUDA C++ kernel")


# The streamed chain against its fp32 reference: the GEMMs' sums run in another order and q / gu round to bf16 in
# both, so a rounding flip there carries on; 18 layers of the expert stay well under 1e-2.
STREAMED_CHAIN_REL_L2 = 1e-2


@pytest.mark.parametrize("pair_mlp", [True, False], ids=["paired-mlp", "four-gemms"])
@pytest.mark.parametrize("rows", [1, 10, 16])
@pytest.mark.parametrize("layers, ctas", [(1, None), (18, None), (18, 37)], ids=["1-layer", "18-layers", "37-ctas"])
def test_streamed_gemm_chain(layers, ctas, rows, pair_mlp):
    """kernels/flashrt_kernels/cuda/streamed_gemm_chain.cu (CUDA C++, built by nvcc) at the expert's four GEMM shapes
    against streamed_gemm_chain_reference, with the MLP as one paired step and as two GEMMs: one layer (odd: the
    paired chain's result comes back from the residual copy), one denoising step (18 layers, 2 layers' weights
    cycled), and on 37 CTAs (several units of o and down per CTA, summed as a group chunk by chunk; several groups
    of QKV and gate/up units, an odd last group in the paired MLP); the activations and the residual copy poisoned
    with NaN first, twice in a row, every CTA counted once per step."""
    _check_streamed_gemm_chain(layers, ctas, rows, pair_mlp)


# the A window's forms: alone with both MLP forms (the unpaired down GEMM reloads its window), and shared in
# clusters of 2 and 4 (paired only), also with the cluster sum of the down products; 36 CTAs: several groups per
# CTA (an odd last one), a multiple of both cluster sizes
@pytest.mark.parametrize("form", [{"pair_mlp": True}, {"pair_mlp": False}, {"pair_mlp": True, "cluster": 2},
                                  {"pair_mlp": True, "cluster": 4},
                                  {"pair_mlp": True, "cluster": 2, "down_cluster_sum": True},
                                  {"pair_mlp": True, "cluster": 4, "down_cluster_sum": True}],
                         ids=["paired-mlp", "four-gemms", "paired-cluster-2", "paired-cluster-4", "down-sum-2",
                              "down-sum-4"])
@pytest.mark.parametrize("rows", [1, 10, 16])
@pytest.mark.parametrize("layers, ctas", [(1, None), (18, None), (18, 36)], ids=["1-layer", "18-layers", "36-ctas"])
def test_streamed_gemm_chain_a_window(layers, ctas, rows, form):
    """The same chain with each GEMM's A copied into shared memory by the bulk copy engine (a_window), alone and
    with the copies shared in clusters, against the same reference, by the same checks."""
    _check_streamed_gemm_chain(layers, ctas, rows, form["pair_mlp"], a_window=True, cluster=form.get("cluster", 1),
                               down_cluster_sum=form.get("down_cluster_sum", False))


# on 120 CTAs the paired MLP's 1024 units give 8 or 9 per CTA: one group or two, and the cluster sum's CTAs
# exchange as many groups as the partner with the most (a group without units exchanges zeros)
@pytest.mark.parametrize("cluster", [2, 4])
def test_streamed_gemm_chain_down_cluster_sum_on_unequal_groups(cluster):
    """The cluster sum where the CTAs of a cluster own different numbers of units, by the same checks."""
    _check_streamed_gemm_chain(18, 120, 10, True, a_window=True, cluster=cluster, down_cluster_sum=True)


def _check_streamed_gemm_chain(layers, ctas, rows, pair_mlp, **form):
    _skip_without_cuda_build()
    shapes = GEMMA_300M.layer_gemm_shapes()
    g = torch.Generator(device="cuda").manual_seed(layers * 100 + rows)
    weights = K.random_streamed_layer_weights(2, GEMMA_300M.width, shapes["qkv"][0], shapes["o"][1],
                                              shapes["down"][1], "cuda", g)
    h0 = torch.randn(rows, GEMMA_300M.width, device="cuda", generator=g)
    want = K.streamed_gemm_chain_reference(h0, weights, layers)
    chain = K.StreamedGemmChain(weights, layers, rows, ctas=ctas, pair_mlp=pair_mlp, **form)
    assert chain.gemms == (3 if pair_mlp else 4) * layers
    for _ in range(2):
        chain.q.fill_(float("nan"))
        chain.act.fill_(float("nan"))
        if pair_mlp:
            chain.h_pair.fill_(float("nan"))
        chain.h.copy_(h0)
        chain.run()
        torch.cuda.synchronize()
        assert not torch.isnan(chain.h).any()
        err = float((chain.h - want).norm() / want.norm())
        assert err < STREAMED_CHAIN_REL_L2, \
            f"rel L2 error {err:.2e}; {_first_wrong_streamed_layer(weights, h0, rows, ctas, pair_mlp, **form)}"
        assert chain.counter.item() == chain.gemms * chain.ctas


# the measurement forms, each with A in registers and through the window ("a_copy" is a form of the window only)
STREAMED_LEAVE_OUT = {"all": (), "no-copy": ("copy",), "no-compute": ("compute",), "no-products": ("products",),
                      "neither": ("compute", "copy"), "stream-only": ("consumers",), "no-atomics": ("atomics",),
                      "no-a-copy": ("a_copy",)}
STREAMED_MEASUREMENT_FORMS = [(name, a_window) for name in STREAMED_LEAVE_OUT for a_window in (False, True)
                              if a_window or name != "no-a-copy"]


@pytest.mark.parametrize("form, a_window", STREAMED_MEASUREMENT_FORMS,
                         ids=[f"{name}-{'a-window' if w else 'registers'}" for name, w in STREAMED_MEASUREMENT_FORMS])
@pytest.mark.parametrize("wait_inputs", [True, False], ids=["waits", "no-waits"])
def test_streamed_gemm_chain_measurement_forms_run_to_the_end(form, a_window, wait_inputs):
    """Every form tools/benchmark_streamed_gemm_chain.py times (its results wrong but for the whole kernel with its
    waits), with the paired MLP and with four GEMMs per layer, ends with every CTA counted once per step: a form
    that hung would stop the benchmark's device call."""
    _skip_without_cuda_build()
    leave_out = STREAMED_LEAVE_OUT[form]
    shapes = GEMMA_300M.layer_gemm_shapes()
    g = torch.Generator(device="cuda").manual_seed(7)
    weights = K.random_streamed_layer_weights(2, GEMMA_300M.width, shapes["qkv"][0], shapes["o"][1],
                                              shapes["down"][1], "cuda", g)
    for pair_mlp in (True, False):
        chain = K.StreamedGemmChain(weights, 18, 10, wait_inputs=wait_inputs, leave_out=leave_out, pair_mlp=pair_mlp,
                                    a_window=a_window)
        chain.h.copy_(torch.randn(10, GEMMA_300M.width, device="cuda", generator=g))
        chain.run()
        torch.cuda.synchronize()
        assert chain.counter.item() == chain.gemms * chain.ctas, pair_mlp


@pytest.mark.parametrize("form", [{}, {"a_window": True}, {"a_window": True, "cluster": 2},
                                  {"a_window": True, "cluster": 2, "down_cluster_sum": True}],
                         ids=["registers", "a-window", "a-window-cluster-2", "down-sum-2"])
def test_streamed_gemm_chain_trace_records_every_step_in_order(form):
    """The trace build (tools/benchmark_streamed_gemm_chain.py --trace) computes the same chain and records, in each
    CTA, steps 30 .. 93 of 36 layers: every step's events in order where the CTA reached them, the A, products and
    sums of every step where it owns a unit (all of QKV's and the MLP's at 132 CTAs or fewer), the global timer and
    the SM clock advancing together (0.2 to 2 ns per clock)."""
    _skip_without_cuda_build()
    SGC = importlib.import_module(K.__name__ + ".streamed_gemm_chain")
    from tools.benchmark_streamed_gemm_chain import trace_phases
    shapes = GEMMA_300M.layer_gemm_shapes()
    g = torch.Generator(device="cuda").manual_seed(11)
    weights = K.random_streamed_layer_weights(2, GEMMA_300M.width, shapes["qkv"][0], shapes["o"][1],
                                              shapes["down"][1], "cuda", g)
    h0 = torch.randn(10, GEMMA_300M.width, device="cuda", generator=g)
    want = K.streamed_gemm_chain_reference(h0, weights, 36)
    chain = K.StreamedGemmChain(weights, 36, 10, trace=True, **form)
    chain.trace_steps(30)
    chain.h.copy_(h0)
    chain.run()
    trace = chain.read_trace()
    assert float((chain.h - want).norm() / want.norm()) < STREAMED_CHAIN_REL_L2
    assert trace.shape == (min(chain.ctas, SGC.TRACE_CTAS), SGC.TRACE_GEMMS, SGC.TRACE_EVENTS, 2)
    clocks = trace[..., :7, 0]
    assert (clocks[:, :, [0, 1, 6]] > 0).all()                          # every CTA starts, waits and releases
    for step in range(SGC.TRACE_GEMMS):
        if (30 + step) % 3 != 1:                                         # QKV and the MLP: every CTA owns units
            assert (clocks[:, step] > 0).all(), step
    ordered = torch.where(clocks > 0, clocks, torch.iinfo(torch.int64).max)
    for e in range(1, 7):                                                # each reached event after the ones before
        before = torch.where(clocks[..., :e] > 0, clocks[..., :e], 0).amax(dim=-1)
        assert ((ordered[..., e] >= before) | (clocks[..., e] == 0)).all(), e
    assert (clocks[:, 1:, 0] >= clocks[:, :-1, 6]).all()                 # a step starts after the one before ends
    down = trace[..., 7, 0]                                              # the MLP steps' last down product only,
    mlp = torch.tensor([(30 + step) % 3 == 2 for step in range(SGC.TRACE_GEMMS)])  # between its gate/up products
    assert (down[:, ~mlp] == 0).all() and (down[:, mlp] >= clocks[:, mlp, 4]).all()  # and its sums
    assert (down[:, mlp] <= clocks[:, mlp, 5]).all()
    assert 0.2 < trace_phases(trace, 30)["ns_per_clock"] < 2.0


def _streamed_gemm_errors(chain, w, h_in) -> str:
    """The relative error of each GEMM of the chain's last layer against the reference from the kernel's own input
    to that GEMM (q from h_in; the GeGLU activation from h_in plus o of the kernel's q; h from the kernel's act;
    with the paired MLP, which keeps the activation on chip: h from h_in plus o of the kernel's q)."""
    SGC = importlib.import_module(K.__name__ + ".streamed_gemm_chain")
    attn, mlp = w.o.shape[1], w.down.shape[1]
    q = (SGC.rms_norm(h_in).bfloat16().float() @ w.qkv.float().T).bfloat16()
    h_o = h_in + chain.q[:, :attn].float() @ w.o.float().T
    gu = (SGC.rms_norm(h_o).bfloat16().float() @ w.gate_up.float().T).bfloat16()
    act = (torch.nn.functional.gelu(gu[:, :mlp].float(), approximate="tanh") * gu[:, mlp:].float()).bfloat16()
    if chain.pair_mlp:
        errors = {"qkv": (chain.q, q), "o, gate/up and down": (chain.h, h_o + act.float() @ w.down.float().T)}
    else:
        h = h_o + chain.act.float() @ w.down.float().T
        errors = {"qkv": (chain.q, q), "o and gate/up": (chain.act, act), "down": (chain.h, h)}
    return ", ".join(f"{name} {float((got.float() - want.float()).norm() / want.float().norm()):.1e}"
                     for name, (got, want) in errors.items())


def _first_wrong_streamed_layer(weights, h0, rows, ctas, pair_mlp, layers=18, **form) -> str:
    """Where a streamed chain went wrong: each layer n recomputed by the reference from the kernel's own output of
    n - 1 layers; the first layer off by more than a tenth of STREAMED_CHAIN_REL_L2, with its rows and GEMMs."""
    h = h0.clone()
    for n in range(1, layers + 1):
        chain = K.StreamedGemmChain(weights, n, rows, ctas=ctas, pair_mlp=pair_mlp, **form)
        chain.h.copy_(h0)
        chain.run()
        w = weights[(n - 1) % len(weights)]
        want = K.streamed_gemm_chain_reference(h, [w], 1)
        local = float((chain.h - want).norm() / want.norm())
        if local > STREAMED_CHAIN_REL_L2 / 10:
            rows_off = torch.nonzero((chain.h - want).norm(dim=1) / want.norm(dim=1) > 1e-3).flatten().tolist()
            return (f"layer {n - 1} is off by {local:.1e} from its own input (rows {rows_off}); its GEMMs, each from "
                    f"the kernel's own input to it: {_streamed_gemm_errors(chain, w, h)}")
        h = chain.h.clone()
    return "every layer matches its own input to 1e-3: the error accumulates over the chain"


@pytest.mark.parametrize("elems, ctas, cluster, readers",
                         [(10 * 1024, None, 1, None), (10 * 2048, None, 1, None), (10 * 1024, 37, 1, None),
                          (0, None, 1, None), (10 * 1024, None, 2, None), (10 * 1024, None, 4, None),
                          (10 * 2048, None, 4, None), (64 * 1024, None, 1, 8)],
                         ids=["40KB", "80KB", "37-ctas", "no-payload", "40KB-cluster-2", "40KB-cluster-4",
                              "80KB-cluster-4", "256KB-8-readers"])
def test_handover_chain_every_step_reads_the_step_before(elems, ctas, cluster, readers):
    """kernels/flashrt_kernels/cuda/handover_chain.cu, the streamed chain's dependency mechanism alone: 2000
    dependent steps in one launch, each CTA reading the whole output of the step before (10 rows of the expert's
    width and of twice it, as the chain reads h and q; on every SM and on 37 CTAs; the counter alone; in clusters
    of 2 and 4 whose CTAs share the reads through distributed shared memory; 256 KB read by 8 CTAs alone): no
    value read is stale or half-written, every CTA is counted once per step, the last step's output is whole;
    twice from the same buffers."""
    _skip_without_cuda_build()
    steps = 2000
    chain = K.HandoverChain(elems, steps, ctas=ctas, cluster=cluster, readers=readers)
    want = K.handover_chain_value(steps - 1, torch.arange(elems, device="cuda"))
    for _ in range(2):
        chain.run()
        torch.cuda.synchronize()
        assert chain.mismatches.item() == 0, f"{chain.mismatches.item()} stale values read over {steps} steps"
        assert chain.counter.item() == steps * chain.ctas
        assert torch.equal(chain.output(), want)


@pytest.mark.parametrize("elems, ctas", [(10 * 1024, None), (20 * 1024, None), (10 * 1024, 37)],
                         ids=["40kb", "80kb", "40kb-37-ctas"])
def test_handover_chain_sliced_every_warp_reads_its_slice_of_the_step_before(elems, ctas):
    """The sliced hand-over: 2000 dependent steps, each warp waiting on its slice's counter alone and reading that
    slice: no value read is stale, each slice's counter holds the steps times its writers, the last output is whole;
    twice from the same buffers."""
    _skip_without_cuda_build()
    steps = 2000
    hc = importlib.import_module(K.__name__ + ".handover_chain")
    chain = K.HandoverChain(elems, steps, ctas=ctas, slices=hc.SLICES)
    want = K.handover_chain_value(steps - 1, torch.arange(elems, device="cuda"))
    for _ in range(2):
        chain.run()
        torch.cuda.synchronize()
        assert chain.mismatches.item() == 0, f"{chain.mismatches.item()} stale values read over {steps} steps"
        assert chain.counter.tolist() == [steps * w for w in hc.slice_writers(elems, chain.ctas)]
        assert torch.equal(chain.output(), want)


def test_handover_chain_without_waits_runs_to_the_end():
    """The measurement form without waits (its reads race the writes, so mismatches are not checked) ends with
    every CTA counted once per step and the last output whole (each CTA writes its own share)."""
    _skip_without_cuda_build()
    chain = K.HandoverChain(10 * 1024, 720, wait_inputs=False)
    chain.run()
    torch.cuda.synchronize()
    assert chain.counter.item() == 720 * chain.ctas
    assert torch.equal(chain.output(), K.handover_chain_value(719, torch.arange(10 * 1024, device="cuda")))


@pytest.mark.parametrize("mode", ["atomic", "stored"])
def test_partial_sums(mode):
    """kernels/flashrt_kernels/partial_sums.py: 128 programs (the interpreter: 8) fold their partials of 10 x 1024
    (3 x 64) fp32 into one activation per layer, 18 layers (3); every sum is exact (the partials are multiples of
    1/128), twice in a row from the same buffers, and with atomics every layer's counter holds the programs."""
    programs, layers, rows, width = (128, 18, 10, 1024) if not INTERPRET else (8, 3, 3, 64)
    sums = K.PartialSums(programs, layers, rows, width, mode, DEVICE)
    sums.out.fill_(float("nan"))
    want = K.partial_sums_reference(programs, layers, rows, width, DEVICE)
    for _ in range(2):
        got = sums.run()
        assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} sums differ"
    if mode == "atomic":
        assert sums.counters.tolist() == [programs] * layers
    with pytest.raises(ValueError, match="is not one of"):
        K.PartialSums(programs, layers, rows, width, "shared", DEVICE)


# pi0-FAST's decoding steps: one row through the backbone's GEMMs (kind, N, K) and the LM head's shape
FAST_DECODE_GEMMS = [("qkv", 2560, 2048, False, 1), ("o", 2048, 2048, False, 4), ("gate_up", 32768, 2048, True, 1),
                     ("down", 2048, 16384, False, 8), ("lm_head", 257152, 2048, False, 1)]


@pytest.mark.parametrize("kind, n, k, geglu, split", FAST_DECODE_GEMMS, ids=[g[0] for g in FAST_DECODE_GEMMS])
def test_skinny_gemm_fp8_weights(kind, n, k, geglu, split):
    """Weight-only FP8 (E4M3, a scale per output channel) at one row, the shapes of pi0-FAST's decoding: the kernel
    against the reference on the same quantized weights."""
    if INTERPRET:
        pytest.skip("the interpreter loads no FP8 tensors")
    g = torch.Generator(device=DEVICE).manual_seed(n + k)
    x = torch.randn(1, k, device=DEVICE, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5
    scale = (w.abs().amax(dim=1) / 448.0).float()
    wq = (w / scale[:, None]).to(torch.float8_e4m3fn)
    want = K.skinny_gemm_reference(x, wq, geglu, split, scale=scale).float()
    got = K.skinny_gemm(x, wq, geglu, split, block_n=32, block_k=128, num_stages=4, scale=scale).float()
    assert got.shape == want.shape and not torch.isnan(got).any()
    err = (got - want).norm() / want.norm()
    assert err < SKINNY_REL_L2, f"rel L2 error {err:.2e}"
    exact = K.skinny_gemm_reference(x, w.to(torch.bfloat16), geglu, split).float()
    assert (want - exact).norm() / exact.norm() < 0.05       # E4M3 per channel: a few percent off the bf16 weights


# GR00T N1.6's DiT GEMMs at one observation (17 rows: the state token and the 16 action tokens): (name, N, K,
# bias, GELU, split-K) as engine/groot_dit_gemms.py launches them (qkv merged, out and ff2 into the residual norms)
GROOT_DIT_GEMMS = [("qkv", 4608, 1536, False, 1), ("out", 1536, 1536, False, 2), ("ff1", 6144, 1536, True, 1),
                   ("ff2", 1536, 6144, False, 4)]


@pytest.mark.parametrize("name, n, k, gelu, split", GROOT_DIT_GEMMS, ids=[g[0] for g in GROOT_DIT_GEMMS])
def test_skinny_gemm_bias_and_gelu_epilogues(name, n, k, gelu, split):
    """The bias (partial 0 alone with split-K) and the tanh-GELU epilogues against the reference; bf16 weights on the
    GPU, fp32 under the interpreter (small shapes)."""
    rows = 17 if not INTERPRET else 5
    if INTERPRET:
        n, k = n // 32, k // 16
    g = torch.Generator(device=DEVICE).manual_seed(n + k + split)
    x = torch.randn(rows, k, device=DEVICE, generator=g).to(SKINNY_DTYPE)
    w = (torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5).to(SKINNY_DTYPE)
    bias = torch.randn(n, device=DEVICE, generator=g).to(SKINNY_DTYPE)
    want = K.skinny_gemm_reference(x, w, split_k=split, bias=bias, gelu=gelu).float()
    got = K.skinny_gemm(x, w, split_k=split, block_k=(16 if INTERPRET else 128), bias=bias, gelu=gelu).float()
    assert got.shape == want.shape and not torch.isnan(got).any()
    err = (got - want).norm() / want.norm()
    assert err < SKINNY_REL_L2, f"rel L2 error {err:.2e}"
    plain = K.skinny_gemm_reference(x, w, split_k=split).float()
    if split > 1:       # the partials sum to the biased product
        torch.testing.assert_close(got.sum(0), plain.sum(0) + bias.float(), rtol=2e-2, atol=2e-2)
    else:
        assert (want - plain).norm() / plain.norm() > 0.1        # the epilogue changed the result
    with pytest.raises(ValueError, match="GELU epilogue needs the whole product"):
        K.skinny_gemm(x, w, split_k=2, block_k=(16 if INTERPRET else 128), gelu=True)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9
                    or not K.HAVE_GLUON, reason="kernels/flashrt_kernels/smem_gemm.py needs Gluon on a Hopper (sm90) GPU")
@pytest.mark.parametrize("name, n, k, gelu, split", GROOT_DIT_GEMMS, ids=[g[0] for g in GROOT_DIT_GEMMS])
def test_smem_gemm_bias_and_gelu_epilogues(name, n, k, gelu, split):
    """The shared-memory GEMM's bias (partial 0 alone with split-K) and tanh-GELU epilogues at GR00T's DiT shapes
    (17 rows: the ring kernel; 34 rows: two observations), every split-K the DiT's tuning may pick, both PDL
    modes, against the reference."""
    from flashrt_core.engine.dispatch import resolve
    from flashrt_core.engine.groot_dit_gemms import PARTIALS, PLAIN, smem_candidates
    from flashrt_core.engine.hardware import detect_hardware
    from flashrt_core.engine.ops import Ops
    ops = Ops(resolve(detect_hardware("auto", torch.device("cuda"))))
    g = torch.Generator(device=DEVICE).manual_seed(n + k + 7)
    w = (torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5).to(torch.bfloat16)
    bias = torch.randn(n, device=DEVICE, generator=g).to(torch.bfloat16)
    configs = smem_candidates(ops, PARTIALS if split > 1 else PLAIN, 17, w)
    assert configs and all(c.split_k == 1 for c in configs) == (split == 1)
    for rows in (17, 34):
        x = torch.randn(rows, k, device=DEVICE, generator=g).to(torch.bfloat16)
        for cfg in configs:
            want = K.skinny_gemm_reference(x, w, split_k=cfg.split_k, bias=bias, gelu=gelu).float()
            for pdl in (False, K.EARLY_TRIGGER):
                got = K.smem_gemm(x, w, split_k=cfg.split_k, pdl=pdl, bias=bias, gelu=gelu).float()
                err = (got - want).norm() / want.norm()
                assert got.shape == want.shape and err < SKINNY_REL_L2, f"{cfg} rows {rows}: rel L2 {err:.2e}"
    with pytest.raises(ValueError, match="GELU epilogue"):
        K.smem_gemm(x, w, split_k=2, bias=bias, gelu=True)


@pytest.mark.parametrize("name, n, k, gelu, split", GROOT_DIT_GEMMS, ids=[g[0] for g in GROOT_DIT_GEMMS])
def test_skinny_gemm_fp8_weights_with_bias_and_gelu(name, n, k, gelu, split):
    """Weight-only FP8 with the bias and GELU epilogues at GR00T's DiT shapes (17 rows) against the reference on the
    same quantized weights."""
    if INTERPRET:
        pytest.skip("the interpreter loads no FP8 tensors")
    g = torch.Generator(device=DEVICE).manual_seed(n + k)
    x = torch.randn(17, k, device=DEVICE, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5
    bias = torch.randn(n, device=DEVICE, generator=g).to(torch.bfloat16)
    scale = (w.abs().amax(dim=1) / 448.0).float()
    wq = (w / scale[:, None]).to(torch.float8_e4m3fn)
    want = K.skinny_gemm_reference(x, wq, split_k=split, scale=scale, bias=bias, gelu=gelu).float()
    got = K.skinny_gemm(x, wq, split_k=split, block_n=16, block_k=128, num_stages=4, scale=scale, bias=bias,
                        gelu=gelu).float()
    assert got.shape == want.shape and not torch.isnan(got).any()
    err = (got - want).norm() / want.norm()
    assert err < SKINNY_REL_L2, f"rel L2 error {err:.2e}"


# GR00T N1.6's DiT attention: 32 heads of 48, 17 query rows per observation (the state token and 16 actions);
# self-attention reads Q/K/V from the merged GEMM's (B * 17, 3 * 1536) output, cross-attention K / V from the
# backbone features' projections (L tokens), with a key mask that hides the other modality and the padding.
# Up to 256 keys run in one key step (head_attention.key_block); 300 keys take two.
HEAD_SHAPES = [(1, 32, 17, 17, 48, False), (2, 32, 17, 213, 48, True), (1, 32, 17, 75, 48, True),
               (1, 32, 17, 300, 48, True), (1, 2, 17, 17, 8, True)] if not INTERPRET else [
    (1, 3, 17, 17, 48, False), (2, 2, 5, 70, 8, True), (1, 2, 5, 300, 8, True)]


@pytest.mark.parametrize("batch,heads,rows,keys,dh,masked", HEAD_SHAPES)   # dh 8: the tiny test preset's
@pytest.mark.parametrize("dtype", [torch.float32] if INTERPRET else [torch.bfloat16, torch.float32])  # no bf16 dot
def test_head_attention(batch, heads, rows, keys, dh, masked, dtype):
    g = torch.Generator(device=DEVICE).manual_seed(keys)
    inner = heads * dh
    proj = torch.randn(batch * rows, 3 * inner, device=DEVICE, generator=g).to(dtype)
    split = lambda x, n: x.view(batch, n, heads, dh).transpose(1, 2)     # noqa: E731  (B, H, n, Dh) strided view
    q = split(proj[:, :inner], rows)
    if keys == rows:
        k, v = split(proj[:, inner:2 * inner], rows), split(proj[:, 2 * inner:], rows)
    else:
        context = torch.randn(batch * keys, 2 * inner, device=DEVICE, generator=g).to(dtype)
        k, v = split(context[:, :inner], keys), split(context[:, inner:], keys)
    mask = None
    if masked:                     # a padded, aligned buffer as the DiT makes it; every key of batch 1 hidden
        buf = torch.zeros(batch, keys + 11, device=DEVICE, dtype=dtype)
        mask = buf[:, :keys]
        mask[:, keys // 3:keys // 2] = float("-inf")
        if batch > 1:
            mask[1] = float("-inf")
    out = _poison(torch.empty(batch * rows, inner, device=DEVICE, dtype=dtype))
    got = K.head_attention(q, k, v, mask, dh ** -0.5, out=out)
    want = K.head_attention_reference(q, k, v, mask, dh ** -0.5)
    atol, rtol = (BF16_ATOL, BF16_RTOL) if dtype == torch.bfloat16 else (FP32_ATOL, FP32_RTOL)
    _close(got, want, atol, rtol)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=None if mask is None else mask.float()[:, None, None, :])
    sdpa = sdpa.transpose(1, 2).reshape(batch * rows, inner).nan_to_num(0.0).to(dtype)
    _close(want, sdpa, atol, rtol)                         # the reference is SDPA's softmax attention
    if masked and batch > 1:
        assert (got[rows:2 * rows] == 0).all()             # every key hidden: zeros, not NaN
