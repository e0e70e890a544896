"""The two ends of a pi0.5 denoising step, each one kernel (the action expert's layers run in between), and the
start of a pi0 step up to its time MLP's output GEMM (time_mlp_in; pi0's end is step_out with an identity gate and
modulation).

    step_in:  residual <- x_t @ W_in^T + b_in                       (the action input projection, fp32)
              y        <- rms(residual) * scale1p + shift            (the first layer's adaRMSNorm)
    step_out: h        =  residual + x * gate                        (x: the last down GEMM, or its split-K partials)
              y        =  rms(h) * scale1p + shift                   (the final adaRMSNorm)
              x_t      <- x_t + dt * (y @ W_out^T + b_out)            (the output projection and the Euler step)

x_t (horizon, A) fp32 is the flow state, A = 32 action dims; W_in (D, A) and W_out (A, D) are the projections'
weights (D = the expert's width); the modulation vectors are the step's rows of the load-time tables. Each program
owns one row. A row up to ONE_PASS_MAX_D wide stays in registers for one pass, the constant operands (weights,
modulation, gate) read before the PDL wait; a wider one is summed in a first pass over 256-wide blocks and
recomputed in the second (the projections are 32 products per element, cheaper than keeping the row), so no row
leaves the registers before it is final. What they replace per step: the cast of x_t, the input GEMM (cuBLAS,
no PDL), the copy into the residual and the first norm kernel; the final norm kernel, the output GEMM (cuBLAS, no
PDL) and the Euler kernel: seven launches, two of them library kernels the dependent-launch chain cannot overlap,
become two PDL kernels. The sums are fp32
throughout, where the separate path rounds x_t, the input projection, y and the velocity to the engine dtype.

pi0's step starts with its action-time MLP: suffix rows [state token; time_out(silu(W_ta (W_in x_t + b_in) + W_t
emb(t) + b_t)) + b_out]. With W_ta W_in and W_ta b_in + W_t emb(t_s) + b_t folded at load (w_fold, c: one table
row per step), time_mlp_in writes the residual's constant parts (the state token's row, b_out) and the MLP's
hidden rows h in one kernel; the engine's decoder GEMM multiplies h by W_out, and the first layer's norm adds that
to the residual. In place of the cast, two library GEMMs, the bias add, the SiLU, the cast back, the output GEMM and
two copies (nine launches) come one kernel and one few-row GEMM, both dependent launches.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs

BLOCK_D = 256       # row elements per inner step: a (256, 32) weight tile is 64 registers per thread at 4 warps
# One pass over the whole row: the (1024, 32) bf16 weight tile is 64 registers per thread at 8 warps and is read,
# with the modulation, before the PDL wait. Two passes over 256-wide blocks with each block's weight tile loaded
# after the wait (a launcher's block_d=256) take 9.2 us (step_in) and 6.4 us (step_out) per step on the H200,
# 158 us of critical path per predict, against 57 us in one pass.
ONE_PASS_MAX_D = 2048
ONE_PASS_WARPS = 8


def _rms(h: torch.Tensor, eps: float) -> torch.Tensor:
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def denoise_step_in_reference(x_t: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor | None,
                              scale1p: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6,
                              out_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch, fp32. Returns (residual (H, D) fp32, y (H, D) out_dtype)."""
    h = x_t.float() @ w_in.float().T
    if b_in is not None:
        h = h + b_in.float()
    return h, (_rms(h, eps) * scale1p.float() + shift.float()).to(out_dtype)


def denoise_step_out_reference(x: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor, scale1p: torch.Tensor,
                               shift: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor | None,
                               x_t: torch.Tensor, dt: float, eps: float = 1e-6) -> torch.Tensor:
    """Plain PyTorch, fp32, in place on x_t (horizon, A); the last `horizon` rows of the step are the actions'.
    x: (M, D) or split-K partials (S, M, D). Returns x_t."""
    if x.dim() == 3:
        x = x.float().sum(0)
    h = residual.float() + x.float() * gate.float()
    y = _rms(h, eps) * scale1p.float() + shift.float()
    v = y[y.shape[0] - x_t.shape[0]:] @ w_out.float().T
    if b_out is not None:
        v = v + b_out.float()
    return x_t.add_(dt * v)


def time_mlp_in_reference(x_t: torch.Tensor, w_fold: torch.Tensor, c: torch.Tensor, state_token: torch.Tensor,
                          b_out: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch, fp32: pi0's step start up to its time MLP's output GEMM. x_t (H, A); w_fold (D, A) = W_ta @
    W_in and c (D,) = W_ta @ b_in + the step's time bias (EngineWeights.pi0_step_tables). Returns (residual (H + 1,
    D) fp32: the state token's row, then b_out in every action row; h (H + 1, D) out_dtype: zeros, then
    silu(x_t @ w_fold^T + c)), so that residual + h @ W_out^T is the step's suffix."""
    H, D = x_t.shape[0], w_fold.shape[0]
    p = x_t.float() @ w_fold.float().T + c.float()
    h = torch.zeros(H + 1, D, dtype=torch.float32, device=x_t.device)
    h[1:] = torch.nn.functional.silu(p)
    residual = torch.cat([state_token.float()[None], b_out.float()[None].expand(H, D)])
    return residual, h.to(out_dtype)


@triton.jit
def _projected_block(x, w_ptr, b_ptr, rd, ra, A, D: tl.constexpr, HAS_B: tl.constexpr):
    """Columns rd of x @ W^T (+ b): x (BLOCK_A,) fp32 in registers, W (D, A)."""
    d_ok = rd < D
    w = tl.load(w_ptr + rd[:, None] * A + ra[None, :], mask=d_ok[:, None] & (ra < A)[None, :], other=0.0)
    h = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if HAS_B:
        h += tl.load(b_ptr + rd, mask=d_ok, other=0.0).to(tl.float32)
    return h


@triton.jit
def _gated_block(x_ptr, res_ptr, g_ptr, m, rd, D: tl.constexpr, stride_x, split_stride, stride_res,
                 X_SPLITS: tl.constexpr):
    """Columns rd of row m of residual + x * gate, x summed over its split-K partials."""
    d_ok = rd < D
    x = tl.zeros(rd.shape, tl.float32)
    for sp in tl.static_range(X_SPLITS):
        x += tl.load(x_ptr + sp * split_stride + m * stride_x + rd, mask=d_ok, other=0.0).to(tl.float32)
    return tl.load(res_ptr + m * stride_res + rd, mask=d_ok, other=0.0) + x * tl.load(g_ptr + rd, mask=d_ok,
                                                                                       other=0.0)


@triton.jit
def _step_in_kernel(x_ptr, w_ptr, b_ptr, s_ptr, t_ptr, res_ptr, y_ptr, A, eps, stride_res, stride_y,
                    D: tl.constexpr, HAS_B: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
                    PDL: tl.constexpr):
    release_dependents(PDL)
    row = tl.program_id(0)
    ra = tl.arange(0, BLOCK_A)
    a_ok = ra < A
    if BLOCK_D >= D:
        # one pass: the whole row in registers. The weights and the modulation are constants, so they are read
        # before the wait for the kernel ahead; after it only x_t's row (32 values) is.
        rd = tl.arange(0, BLOCK_D)
        d_ok = rd < D
        w = tl.load(w_ptr + rd[:, None] * A + ra[None, :], mask=d_ok[:, None] & a_ok[None, :], other=0.0)
        s = tl.load(s_ptr + rd, mask=d_ok, other=0.0)
        t = tl.load(t_ptr + rd, mask=d_ok, other=0.0)
        if HAS_B:
            b = tl.load(b_ptr + rd, mask=d_ok, other=0.0).to(tl.float32)
        wait_for_inputs(PDL)
        x = tl.load(x_ptr + row * A + ra, mask=a_ok, other=0.0).to(tl.float32)
        h = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if HAS_B:
            h += b
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / D + eps)
        tl.store(res_ptr + row * stride_res + rd, h, mask=d_ok)
        tl.store(y_ptr + row * stride_y + rd, (h * rstd * s + t).to(y_ptr.dtype.element_ty), mask=d_ok)
    else:
        wait_for_inputs(PDL)
        x = tl.load(x_ptr + row * A + ra, mask=a_ok, other=0.0).to(tl.float32)
        sq = tl.zeros([BLOCK_D], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            h = _projected_block(x, w_ptr, b_ptr, rd, ra, A, D, HAS_B)
            sq += h * h
        rstd = tl.rsqrt(tl.sum(sq, axis=0) / D + eps)
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            d_ok = rd < D
            h = _projected_block(x, w_ptr, b_ptr, rd, ra, A, D, HAS_B)
            tl.store(res_ptr + row * stride_res + rd, h, mask=d_ok)
            s = tl.load(s_ptr + rd, mask=d_ok, other=0.0)
            t = tl.load(t_ptr + rd, mask=d_ok, other=0.0)
            tl.store(y_ptr + row * stride_y + rd, (h * rstd * s + t).to(y_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _time_mlp_in_kernel(x_ptr, w_ptr, c_ptr, st_ptr, bo_ptr, res_ptr, h_ptr, A, stride_res, stride_h,
                        D: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    row = tl.program_id(0)                  # suffix row: 0 is the state token's, 1.. the actions'
    ra = tl.arange(0, BLOCK_A)
    a_ok = ra < A
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    # the folded weights, the step's bias and the output GEMM's bias are load-time tables: read before the wait
    w = tl.load(w_ptr + rd[:, None] * A + ra[None, :], mask=d_ok[:, None] & a_ok[None, :], other=0.0)
    c = tl.load(c_ptr + rd, mask=d_ok, other=0.0)
    bo = tl.load(bo_ptr + rd, mask=d_ok, other=0.0)
    wait_for_inputs(PDL)                    # x_t (the last step's Euler) and the state token come from kernels ahead
    if row == 0:
        tl.store(res_ptr + rd, tl.load(st_ptr + rd, mask=d_ok, other=0.0), mask=d_ok)
        tl.store(h_ptr + rd, tl.zeros([BLOCK_D], tl.float32).to(h_ptr.dtype.element_ty), mask=d_ok)
    else:
        x = tl.load(x_ptr + (row - 1) * A + ra, mask=a_ok, other=0.0).to(tl.float32)
        p = tl.sum(w.to(tl.float32) * x[None, :], axis=1) + c
        tl.store(res_ptr + row * stride_res + rd, bo, mask=d_ok)
        tl.store(h_ptr + row * stride_h + rd, (p / (1.0 + tl.exp(-p))).to(h_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _step_out_kernel(x_ptr, res_ptr, g_ptr, s_ptr, t_ptr, w_ptr, b_ptr, xt_ptr, A, row0, eps, dt,
                     stride_x, split_stride, stride_res, D: tl.constexpr, X_SPLITS: tl.constexpr,
                     HAS_B: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    row = tl.program_id(0)                  # action row; its suffix row is row0 + row
    m = row0 + row
    ra = tl.arange(0, BLOCK_A)
    a_ok = ra < A
    acc = tl.zeros([BLOCK_A], tl.float32)
    if BLOCK_D >= D:
        # one pass, the constants (gate, modulation, W_out) read before the wait for the kernel ahead
        rd = tl.arange(0, BLOCK_D)
        d_ok = rd < D
        g = tl.load(g_ptr + rd, mask=d_ok, other=0.0)
        s = tl.load(s_ptr + rd, mask=d_ok, other=0.0)
        t = tl.load(t_ptr + rd, mask=d_ok, other=0.0)
        w = tl.load(w_ptr + ra[:, None] * D + rd[None, :], mask=a_ok[:, None] & d_ok[None, :], other=0.0)
        wait_for_inputs(PDL)
        x = tl.zeros([BLOCK_D], tl.float32)
        for sp in tl.static_range(X_SPLITS):
            x += tl.load(x_ptr + sp * split_stride + m * stride_x + rd, mask=d_ok, other=0.0).to(tl.float32)
        h = tl.load(res_ptr + m * stride_res + rd, mask=d_ok, other=0.0) + x * g
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / D + eps)
        acc += tl.sum(w.to(tl.float32) * (h * rstd * s + t)[None, :], axis=1)
    else:
        wait_for_inputs(PDL)
        sq = tl.zeros([BLOCK_D], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            h = _gated_block(x_ptr, res_ptr, g_ptr, m, rd, D, stride_x, split_stride, stride_res, X_SPLITS)
            sq += h * h
        rstd = tl.rsqrt(tl.sum(sq, axis=0) / D + eps)
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            d_ok = rd < D
            h = _gated_block(x_ptr, res_ptr, g_ptr, m, rd, D, stride_x, split_stride, stride_res, X_SPLITS)
            y = h * rstd * tl.load(s_ptr + rd, mask=d_ok, other=0.0) + tl.load(t_ptr + rd, mask=d_ok, other=0.0)
            w = tl.load(w_ptr + ra[:, None] * D + rd[None, :], mask=a_ok[:, None] & d_ok[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * y[None, :], axis=1)
    if HAS_B:
        acc += tl.load(b_ptr + ra, mask=a_ok, other=0.0).to(tl.float32)
    xt = tl.load(xt_ptr + row * A + ra, mask=a_ok, other=0.0)
    tl.store(xt_ptr + row * A + ra, xt + dt * acc, mask=a_ok)


def step_block(D: int, block_d: int | None = None) -> tuple[int, int]:
    """(BLOCK_D, num_warps) of the step kernels for rows of width D. block_d None: the whole row in one pass
    (up to ONE_PASS_MAX_D, 8 warps), its constants read before the PDL wait; else blocks of block_d elements
    (a power of two), two passes over the row, 4 warps (BLOCK_D = 256: 9.2 / 6.4 us per step on the H200)."""
    if block_d is None:
        if D <= ONE_PASS_MAX_D:
            return triton.next_power_of_2(D), ONE_PASS_WARPS
        block_d = BLOCK_D
    if block_d <= 0 or block_d & (block_d - 1):
        raise ValueError(f"denoise step: block_d must be a power of two, got {block_d!r}")
    return block_d, (ONE_PASS_WARPS if block_d >= D else 4)


def _check_vector(name: str, v: torch.Tensor | None, n: int) -> None:
    if v is not None and (v.shape != (n,) or not v.is_contiguous()):
        raise ValueError(f"denoise step: {name} must be a contiguous ({n},) vector, got {tuple(v.shape)}")


def denoise_step_in(x_t: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor | None, scale1p: torch.Tensor,
                    shift: torch.Tensor, residual: torch.Tensor, y: torch.Tensor, eps: float = 1e-6,
                    pdl: bool | int = False, block_d: int | None = None) -> torch.Tensor:
    """Triton launcher; denoise_step_in_reference's results into residual (H, D) fp32 and y (H, D). Returns y.
    block_d: see step_block (None: one pass)."""
    H, A = x_t.shape
    D = w_in.shape[0]
    if x_t.dtype != torch.float32 or not x_t.is_contiguous() or w_in.shape != (D, A) or not w_in.is_contiguous():
        raise ValueError(f"denoise_step_in: x_t contiguous fp32 (H, A) and W_in contiguous (D, A); got "
                         f"{tuple(x_t.shape)} {x_t.dtype}, {tuple(w_in.shape)}")
    if residual.shape != (H, D) or residual.dtype != torch.float32 or y.shape != (H, D) \
            or residual.stride(1) != 1 or y.stride(1) != 1:
        raise ValueError(f"denoise_step_in: residual fp32 and y must be ({H}, {D}) with unit column stride; got "
                         f"{tuple(residual.shape)} {residual.dtype}, {tuple(y.shape)}")
    for name, v in (("b_in", b_in), ("scale1p", scale1p), ("shift", shift)):
        _check_vector(name, v, D)
    block, warps = step_block(D, block_d)
    _step_in_kernel[(H,)](x_t, w_in, b_in if b_in is not None else scale1p, scale1p, shift, residual, y, A,
                          eps, residual.stride(0), y.stride(0), D=D, HAS_B=b_in is not None,
                          BLOCK_A=triton.next_power_of_2(A), BLOCK_D=block, PDL=pdl, num_warps=warps,
                          **launch_options(pdl))
    return y


def denoise_step_out(x: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor, scale1p: torch.Tensor,
                     shift: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor | None, x_t: torch.Tensor,
                     dt: float, eps: float = 1e-6, pdl: bool | int = False, block_d: int | None = None
                     ) -> torch.Tensor:
    """Triton launcher; denoise_step_out_reference in place on x_t (residual is left as it was). Returns x_t.
    block_d: see step_block (None: one pass)."""
    M, D = residual.shape
    H, A = x_t.shape
    splits, split_stride = (x.shape[0], x.stride(0)) if x.dim() == 3 else (1, 0)
    x2 = x[0] if x.dim() == 3 else x
    if x2.shape != (M, D) or x2.stride(1) != 1 or residual.stride(1) != 1:
        raise ValueError(f"denoise_step_out: x must be ({M}, {D}) or (S, {M}, {D}) with unit column stride, got "
                         f"{tuple(x.shape)}")
    if x_t.dtype != torch.float32 or not x_t.is_contiguous() or H > M or w_out.shape != (A, D) \
            or not w_out.is_contiguous():
        raise ValueError(f"denoise_step_out: x_t contiguous fp32 (H <= {M}, A) and W_out contiguous (A, {D}); got "
                         f"{tuple(x_t.shape)} {x_t.dtype}, {tuple(w_out.shape)}")
    for name, v in (("gate", gate), ("scale1p", scale1p), ("shift", shift)):
        _check_vector(name, v, D)
    _check_vector("b_out", b_out, A)
    block, warps = step_block(D, block_d)
    _step_out_kernel[(H,)](x, residual, gate, scale1p, shift, w_out, b_out if b_out is not None else gate, x_t,
                           A, M - H, eps, float(dt), x2.stride(0), split_stride, residual.stride(0),
                           D=D, X_SPLITS=splits, HAS_B=b_out is not None, BLOCK_A=triton.next_power_of_2(A),
                           BLOCK_D=block, PDL=pdl, num_warps=warps, **launch_options(pdl))
    return x_t


def time_mlp_in(x_t: torch.Tensor, w_fold: torch.Tensor, c: torch.Tensor, state_token: torch.Tensor,
                b_out: torch.Tensor, residual: torch.Tensor, h: torch.Tensor, pdl: bool | int = False) -> torch.Tensor:
    """Triton launcher; time_mlp_in_reference's results into residual (H + 1, D) fp32 and h (H + 1, D), one
    program per suffix row, the row in registers (D <= ONE_PASS_MAX_D). Returns h."""
    H, A = x_t.shape
    D = w_fold.shape[0]
    if D > ONE_PASS_MAX_D:
        raise ValueError(f"time_mlp_in: rows of at most {ONE_PASS_MAX_D}, got {D}")
    if x_t.dtype != torch.float32 or not x_t.is_contiguous() or w_fold.shape != (D, A) \
            or not w_fold.is_contiguous():
        raise ValueError(f"time_mlp_in: x_t contiguous fp32 (H, A) and w_fold contiguous (D, A); got "
                         f"{tuple(x_t.shape)} {x_t.dtype}, {tuple(w_fold.shape)}")
    if residual.shape != (H + 1, D) or residual.dtype != torch.float32 or h.shape != (H + 1, D) \
            or residual.stride(1) != 1 or h.stride(1) != 1:
        raise ValueError(f"time_mlp_in: residual fp32 and h must be ({H + 1}, {D}) with unit column stride; got "
                         f"{tuple(residual.shape)} {residual.dtype}, {tuple(h.shape)}")
    for name, v in (("c", c), ("state_token", state_token), ("b_out", b_out)):
        _check_vector(name, v, D)
    _time_mlp_in_kernel[(H + 1,)](x_t, w_fold, c, state_token, b_out, residual, h, A, residual.stride(0),
                                  h.stride(0), D=D, BLOCK_A=triton.next_power_of_2(A),
                                  BLOCK_D=triton.next_power_of_2(D), PDL=pdl, num_warps=ONE_PASS_WARPS,
                                  **launch_options(pdl))
    return h
