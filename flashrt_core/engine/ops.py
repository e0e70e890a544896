"""The engine's ops, each bound once to the implementation the dispatch table picked.

Every op has the same contract whichever implementation runs (the Triton kernel or its plain-PyTorch reference
from flashrt_kernels), so the forward in forward.py never branches on hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .dispatch import Dispatch, Op
from .kernel_configs import (LAUNCH_POLICIES, ROPE_IN_ATTENTION_MAX_ROWS, SKINNY_CANDIDATES, SKINNY_DEFAULT,
                             WGMMA_PREFIX_ATTENTION, RopeGemmConfig, SkinnyConfig, SmemConfig)
from .kernel_import import load_kernels
from .weights import Linear

# Additive mask value for keys a query may not see: finite, so a row never becomes NaN.
MASKED = -1e30


@dataclass
class KeyMask:
    """Which keys each query row may see, built once per predict and shared by every layer and step.

    Keys j < prefix_len: allowed where bias[j] == 0 (bias is 0 / -inf). Keys j >= prefix_len (suffix): allowed
    where j - prefix_len < visible[row // heads]. `dense()` materializes it for the SDPA / math implementations.
    """

    bias: torch.Tensor                   # (P,) fp32
    prefix_len: int
    visible: torch.Tensor | None         # (S,) int32 suffix keys visible to each suffix token, None: prefix only
    heads: int
    _dense: dict = field(default_factory=dict)

    def key_valid(self) -> torch.Tensor:
        """(P,) bool: the prefix keys every query may see (the key-padding mask of the prefix attention)."""
        if "valid" not in self._dense:
            self._dense["valid"] = self.bias[:self.prefix_len] == 0
        return self._dense["valid"]

    def dense(self, rows: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
        """(rows, keys) additive mask, finite (MASKED) so no row can become NaN."""
        if (rows, keys) not in self._dense:
            m = torch.empty(rows, keys, device=self.bias.device, dtype=torch.float32)
            m[:, :self.prefix_len] = torch.where(self.bias[None, :self.prefix_len] == 0, 0.0, MASKED)
            if keys > self.prefix_len:
                j = torch.arange(keys - self.prefix_len, device=m.device)
                vis = self.visible.repeat_interleave(self.heads)[:, None]             # (rows, 1)
                m[:, self.prefix_len:] = torch.where(j[None] < vis, 0.0, MASKED)
            self._dense[(rows, keys)] = m.to(dtype)
        return self._dense[(rows, keys)]


class Ops:
    """The engine's ops bound to the dispatch table's choices, and the load-time tuning's picks they launch
    (engine/tuning.py and engine/load_tuning.py set those)."""

    def __init__(self, dispatch: Dispatch):
        self.dispatch = dispatch
        self.k = load_kernels()
        triton = lambda op: dispatch[op] == "triton"  # noqa: E731
        self._norm_triton = triton(Op.NORM)
        self._ada_triton = triton(Op.ADA_NORM)
        self._geglu_triton = triton(Op.GEGLU)
        self._rope_triton = triton(Op.QKV_ROPE)
        self._euler_triton = triton(Op.EULER)
        self._sdpa = dispatch[Op.ATTENTION] == "sdpa"
        self._mqa = dispatch[Op.MQA]
        self._qkv_fused = dispatch[Op.DECODER_QKV] == "fused_rope"
        # the choices forward.py and the tuning read, each named as its op
        self._fp8_fused_quant = dispatch[Op.FP8_FUSED_QUANT] == "fused"
        self.gemm_epilogue = dispatch[Op.GEMM_EPILOGUE] == "gemm_epilogue"
        self.smem_gemm = dispatch[Op.SMEM_GEMM] == "tma"
        self.smem_gemm_rows = dispatch[Op.SMEM_GEMM_ROWS] == "tma"
        self.prefix_attention_wgmma = dispatch[Op.PREFIX_ATTENTION_WGMMA] == "wgmma"
        self.rope_in_attention = dispatch[Op.DECODER_QKV] == "rope_in_attention"
        self.fused_patch_embed = dispatch[Op.FUSED_PATCH_EMBED] == "fused"
        self.fused_denoise_step = dispatch[Op.FUSED_DENOISE_STEP] == "fused"
        self.fused_denoise_step_pi0 = dispatch[Op.FUSED_DENOISE_STEP_PI0] == "fused"
        self.overlap_first_step = dispatch[Op.OVERLAP_FIRST_STEP] == "two_streams"
        # every Triton launch passes a launch mode: False (stream order), 1 (PDL) or EARLY_TRIGGER (PDL, the kernel
        # releases the next one at its start) where its site is in early_sites (launch_mode)
        self.pdl = 1 if dispatch[Op.KERNEL_LAUNCH] in ("pdl", "pdl_early") else False
        self.launch_policy = "all" if dispatch[Op.KERNEL_LAUNCH] == "pdl_early" else "none"   # chain tuning may change
        self.early_sites = LAUNCH_POLICIES[self.launch_policy]
        # the load-time tuning's picks and timings: the prefix attention ("mqa": Op.MQA's implementation), the
        # vision attention's SDPA backend, and per decoder GEMM kind "triton" | "library" | a launch configuration
        self.prefix_attention_impl = "mqa"
        self.prefix_attention_timings: dict[str, float] = {}
        self.vision_attention_backend = "default"
        self.vision_attention_timings: dict[str, float] = {}
        triton_decoder = dispatch[Op.GEMM_DECODER] == "triton"
        self.decoder_impl: dict[str, str | SkinnyConfig | SmemConfig | RopeGemmConfig] = {
            kind: "triton" if triton_decoder else "library" for kind in SKINNY_CANDIDATES}
        self.decoder_timings: dict[str, dict[str, float]] = {}
        self.decoder_failures: dict[str, dict[str, str]] = {}    # left out of the tuning (tuning.time_candidate)
        self.calibration: dict[int, float] | None = None   # set by the FP8 calibration run

    # ---------------------------------------------------------------------------------------------- norms
    def launch_mode(self, site: str) -> bool | int:
        """The PDL mode of a kernel launched at `site` (one of LAUNCH_SITES)."""
        return self.k.EARLY_TRIGGER if self.pdl and site in self.early_sites else self.pdl

    def norm(self, x: torch.Tensor | None, residual: torch.Tensor, out: torch.Tensor,
             weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-6,
             layer_norm: bool = False, site: str = "other") -> torch.Tensor:
        """residual += x (in place); out = norm(residual) [* weight + bias].  All (M, D)."""
        if self._norm_triton:
            return self.k.residual_norm(x, residual, out, weight, bias, eps, layer_norm, pdl=self.launch_mode(site))
        y, h = self.k.residual_norm_reference(x, residual, weight, bias, eps, layer_norm, out_dtype=out.dtype)
        residual.copy_(h)
        return out.copy_(y)

    def ada_norm(self, x: torch.Tensor | None, residual: torch.Tensor, gate: torch.Tensor | None,
                 scale1p: torch.Tensor, shift: torch.Tensor, out: torch.Tensor, eps: float = 1e-6,
                 site: str = "other", row_variant: torch.Tensor | None = None) -> torch.Tensor:
        """residual += x * gate (in place); out = rms(residual) * scale1p + shift. The vectors are (D,), or with
        row_variant (M,) int32 (V, D), each row reading its variant's (training-time RTC)."""
        if self._ada_triton:
            return self.k.ada_rms_norm(x, residual, gate, scale1p, shift, out, eps, pdl=self.launch_mode(site),
                                       row_variant=row_variant)
        y, h = self.k.ada_rms_norm_reference(x, residual, gate, scale1p, shift, eps, out_dtype=out.dtype,
                                             row_variant=row_variant)
        residual.copy_(h)
        return out.copy_(y)

    def denoise_step_in(self, x_t: torch.Tensor, lin: Linear, scale1p: torch.Tensor, shift: torch.Tensor,
                        residual: torch.Tensor, out: torch.Tensor, eps: float) -> torch.Tensor:
        """pi0.5's step start: residual = x_t @ W_in^T + b_in (fp32), out = adaRMSNorm(residual) (the first layer's
        norm 1), in one kernel (kernels/flashrt_kernels/denoise_step.py)."""
        (w, b), = lin.parts
        return self.k.denoise_step_in(x_t, w, b, scale1p, shift, residual, out, eps, pdl=self.launch_mode("norm1"))

    def denoise_step_out(self, x: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor, scale1p: torch.Tensor,
                         shift: torch.Tensor, out_w: torch.Tensor, out_b: torch.Tensor, x_t: torch.Tensor,
                         dt: float, eps: float) -> torch.Tensor:
        """pi0.5's step end: the final adaRMSNorm of residual + x * gate, the output projection and the Euler step
        on x_t, in one kernel (kernels/flashrt_kernels/denoise_step.py)."""
        return self.k.denoise_step_out(x, residual, gate, scale1p, shift, out_w, out_b, x_t, dt, eps,
                                       pdl=self.launch_mode("other"))

    def set_launch_policy(self, policy: str) -> None:
        """The denoiser's launch policy by name (LAUNCH_POLICIES) and the sites it releases early, kept together."""
        self.launch_policy, self.early_sites = policy, LAUNCH_POLICIES[policy]

    def plain_pick(self, kind: str) -> str | SkinnyConfig | SmemConfig:
        """The tuned GEMM of `kind` where it is a plain one (a Triton or shared-memory GEMM without split-K, no RoPE
        epilogue), else "triton" (the kind's first Triton candidate): for an untuned GEMM of the same K, e.g. pi0's
        time MLP output (K = the expert's width, as QKV's)."""
        impl = self.decoder_impl.get(kind)
        return impl if isinstance(impl, (SkinnyConfig, SmemConfig)) and impl.split_k == 1 else "triton"

    def time_mlp_in(self, x_t: torch.Tensor, w_fold: torch.Tensor, c: torch.Tensor, state_token: torch.Tensor,
                    b_out: torch.Tensor, residual: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """pi0's step start (fused_denoise_step_pi0): the residual's constant rows (state token, the time MLP's
        output bias) and the MLP's hidden rows h in one kernel (flashrt_kernels/denoise_step.py time_mlp_in).
        Returns h."""
        return self.k.time_mlp_in(x_t, w_fold, c, state_token, b_out, residual, h, pdl=self.launch_mode("other"))

    # ---------------------------------------------------------------------------------------------- MLP pieces
    def geglu(self, gu: torch.Tensor) -> torch.Tensor:
        """gu (M, 2F) -> gelu_tanh(gate) * up (M, F)."""
        if self._geglu_triton:
            return self._triton_geglu(gu, gu.dtype)
        return self.k.geglu_reference(gu)

    def swiglu(self, gu: torch.Tensor) -> torch.Tensor:
        """gu (M, 2F) -> silu(gate) * up (M, F): Qwen3's MLP (GR00T's language model), on GeGLU's kernel."""
        if self._geglu_triton:
            out = torch.empty(gu.shape[0], gu.shape[1] // 2, device=gu.device, dtype=gu.dtype)
            return self.k.swiglu(gu, out, pdl=self.launch_mode("other"))
        return self.k.swiglu_reference(gu)

    def _triton_geglu(self, gu: torch.Tensor, dtype: torch.dtype, inv_scale: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """flashrt_kernels/geglu.py into a new (M, F) tensor of dtype (FP8 with inv_scale: quantized on the way out)."""
        out = torch.empty(gu.shape[0], gu.shape[1] // 2, device=gu.device, dtype=dtype)
        return self.k.geglu(gu, out, pdl=self.launch_mode("other"), inv_scale=inv_scale)

    def mlp_down(self, gu: torch.Tensor, lin: Linear) -> torch.Tensor:
        """down(gelu_tanh(gate) * up) of a merged gate/up output gu (M, 2F). When the down GEMM is FP8 with a static
        per-tensor input scale and fp8_fused_quant is on, the GeGLU kernel writes its FP8 input directly (no bf16
        activation, no separate quantization pass)."""
        if self._fp8_fused_quant and self._geglu_triton and self.calibration is None and lin.fp8 is not None:
            return lin.fp8.matmul_quantized(self._triton_geglu(gu, lin.fp8.dtype, lin.fp8.x_inv))
        return self.linear(self.geglu(gu), lin)

    def linear(self, x: torch.Tensor, lin: Linear) -> torch.Tensor:
        """x (M, K) -> (M, N): one GEMM per block of W (one when merged); FP8 when the layer was quantized."""
        if self.calibration is not None:        # FP8 calibration run: record the input's absolute maximum
            self.calibration[id(lin)] = max(self.calibration.get(id(lin), 0.0), float(x.abs().max()))
        if lin.fp8 is not None:
            return lin.fp8(x)
        outs = [F.linear(x, w, b) for w, b in lin.parts]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def patch_rows(self, img: torch.Tensor, patch: int, out: torch.Tensor) -> torch.Tensor:
        """One present uint8 view (S, S, 3) -> its patch rows in out (kernels/flashrt_kernels/patch_embed.py)."""
        return self.k.patch_rows(img, patch, out)

    def linear_gelu(self, x: torch.Tensor, lin: Linear) -> torch.Tensor:
        """gelu_tanh(x @ W^T + b): the vision MLP's fc1. With gemm_epilogue and one bf16 block with a
        bias on the GPU, bias and GELU run in the GEMM's epilogue (cuBLASLt / hipBLASLt use the tanh form on the
        GPU; the GPU test checks it against torch's tanh GELU)."""
        if self.gemm_epilogue and self.calibration is None and lin.fp8 is None and len(lin.parts) == 1 \
                and lin.parts[0][1] is not None and x.is_cuda:
            w, b = lin.parts[0]
            return torch._addmm_activation(b, x, w.t(), use_gelu=True)
        return F.gelu(self.linear(x, lin), approximate="tanh")

    def few_rows_gemm_fits(self, x: torch.Tensor, lin: Linear, k_step: int) -> bool:
        """The Triton few-row GEMMs' conditions: one bias-free weight block, <= 64 rows on the GPU (or on the CPU
        under Triton's interpreter, for tests), K a multiple of what one program step covers."""
        (w, b), = lin.parts if len(lin.parts) == 1 else ((None, True),)
        return (w is not None and b is None and lin.fp8 is None and x.shape[0] <= 64
                and (x.is_cuda or self.k.INTERPRETED) and x.shape[1] % k_step == 0)

    def skinny_fits(self, x: torch.Tensor, lin: Linear, cfg: SkinnyConfig) -> bool:
        return x.shape[0] <= cfg.max_rows and self.few_rows_gemm_fits(x, lin, cfg.split_k * cfg.block_k)

    def smem_fits(self, x: torch.Tensor, lin: Linear, kind: str, cfg: SmemConfig) -> bool:
        """kernels/flashrt_kernels/smem_gemm.py's conditions: bf16 weights, a contiguous bf16 x on the GPU."""
        if not (self.smem_gemm and x.is_cuda and x.dtype == torch.bfloat16
                and x.is_contiguous() and self.few_rows_gemm_fits(x, lin, 1)):
            return False
        if x.shape[0] > self.k.SMEM_GEMM_X_ROWS and not self.smem_gemm_rows:
            return False                    # 17-64 rows: _smem_gemm_rows_kernel, unless smem_gemm_rows is off
        w = lin.parts[0][0]
        return w.dtype == torch.bfloat16 and self.k.smem_gemm_supported(x.shape[0], w.shape[0], w.shape[1],
                                                                        kind == "gate_up", cfg.split_k)

    def decoder_mlp(self, y: torch.Tensor, gate_up: Linear, down: Linear) -> torch.Tensor:
        """The expert's MLP on y: down(GeGLU(gate_up(y))), two decoder GEMMs; the down result may be the split-K
        partials the next norm sums."""
        return self.decoder(self.decoder(y, gate_up, "gate_up"), down, "down")

    def decoder(self, x: torch.Tensor, lin: Linear, kind: str, impl: str | SkinnyConfig | None = None
                ) -> torch.Tensor:
        """Decoder GEMM (few rows). kind "gate_up" returns the GeGLU activation (M, F); "o"/"down" may return
        split-K partials (S, M, N) fp32 that the next norm sums; "qkv" returns (M, N).
        impl: "library" (cuBLAS/hipBLASLt), a SkinnyConfig (Triton), a SmemConfig (Gluon), None = the tuned choice
        for this kind. A layer with weight-only FP8 weights (lin.w8) runs the Triton GEMM on them: impl's
        SkinnyConfig, else the kind's default one."""
        impl = impl or self.decoder_impl[kind]
        if lin.w8 is not None:      # weight-only FP8: the Triton few-row GEMM reads the FP8 weights
            cfg = impl if isinstance(impl, SkinnyConfig) and self.skinny_fits(x, lin, impl) else SKINNY_DEFAULT[kind]
            return self.skinny_fp8(x, lin, cfg, geglu=kind == "gate_up", site=kind)
        if impl == "triton":
            impl = SKINNY_DEFAULT[kind]
        if isinstance(impl, SmemConfig) and self.smem_fits(x, lin, kind, impl):
            return self.k.smem_gemm(x, lin.parts[0][0], geglu=kind == "gate_up", split_k=impl.split_k,
                                    pdl=self.launch_mode(kind))
        if isinstance(impl, SkinnyConfig) and self.skinny_fits(x, lin, impl):
            return self.k.skinny_gemm(x, lin.parts[0][0], geglu=kind == "gate_up", split_k=impl.split_k,
                                      block_n=impl.block_n, block_k=impl.block_k, num_stages=impl.stages,
                                      num_warps=impl.warps, pdl=self.launch_mode(kind))
        y = self.linear(x, lin)
        return self.geglu(y) if kind == "gate_up" else y

    def skinny_fp8(self, x: torch.Tensor, lin: Linear, cfg: SkinnyConfig, geglu: bool = False,
                   site: str = "other") -> torch.Tensor:
        """x @ W^T through flashrt_kernels/skinny_gemm.py on the layer's weight-only FP8 weights (lin.w8)."""
        w, scale = lin.w8
        return self.k.skinny_gemm(x, w, geglu=geglu, split_k=cfg.split_k, block_n=cfg.block_n, block_k=cfg.block_k,
                                  num_stages=cfg.stages, num_warps=cfg.warps, pdl=self.launch_mode(site), scale=scale)

    def few_row_linear(self, x: torch.Tensor, lin: Linear, cfg: SkinnyConfig | SmemConfig,
                       gelu: bool = False) -> torch.Tensor:
        """x @ W^T + b (gelu: the tanh GELU of it) on the Triton few-row GEMM (a SkinnyConfig) or, for bf16 weights,
        the shared-memory Gluon GEMM (a SmemConfig: flashrt_kernels/smem_gemm.py, the weight slice in shared memory
        before the PDL wait): the layer's weight-only FP8 weights (lin.w8) where it has them, else its one weight
        block; b is the layer's own bias, lin.parts[0][1]. Bias and GELU in the kernel's epilogue on the GPU, the
        plain-PyTorch reference elsewhere (Triton's interpreter loads no FP8 tensors). cfg.split_k > 1 returns the
        fp32 partials (S, M, N) for a norm to sum. More rows than one launch takes (64, or cfg.max_rows) run in row
        blocks of that many, each streaming the weights again, without split-K."""
        (weight, bias), = lin.parts
        w, scale = lin.w8 if lin.w8 is not None else (weight, None)
        if not x.is_cuda:
            return self.k.skinny_gemm_reference(x, w, split_k=cfg.split_k, scale=scale, bias=bias, gelu=gelu)
        launch = dict(pdl=self.launch_mode("other"), bias=bias, gelu=gelu)
        if isinstance(cfg, SmemConfig):
            gemm, rows = self.k.smem_gemm, self.k.SMEM_GEMM_MAX_ROWS
        else:
            gemm, rows = self.k.skinny_gemm, min(64, cfg.max_rows)
            launch.update(block_n=cfg.block_n, block_k=cfg.block_k, num_stages=cfg.stages, num_warps=cfg.warps,
                          scale=scale)
        if x.shape[0] <= rows:
            return gemm(x, w, split_k=cfg.split_k, **launch)
        out = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)
        for start in range(0, x.shape[0], rows):
            gemm(x[start:start + rows], w, out=out[start:start + rows], **launch)
        return out

    def decoder_qkv_rope(self, x: torch.Tensor, lin: Linear, pos, cos, sin, q_out, k_cache, v_cache, offset: int,
                         heads: int, kv_heads: int, q_scale: float,
                         impl: str | SkinnyConfig | RopeGemmConfig | None = None) -> None:
        """Decoder QKV projection, RoPE, q scale and KV-cache write (contract of qkv_rope on x @ W^T): one kernel
        with a RopeGemmConfig (decoder_qkv=fused_rope), else the decoder GEMM then qkv_rope."""
        impl = impl or self.decoder_impl["qkv"]
        if isinstance(impl, RopeGemmConfig):
            (w, _), = lin.parts
            self.k.qkv_gemm_rope(x, w, pos, cos, sin, q_out, k_cache, v_cache, offset, heads, kv_heads, q_scale,
                                 block_p=impl.block_p, block_k=impl.block_k, num_stages=impl.stages,
                                 num_warps=impl.warps, pdl=self.launch_mode("qkv"))
            return
        qkv = self.decoder(x, lin, "qkv", impl)
        self.qkv_rope(qkv, pos, cos, sin, q_out, k_cache, v_cache, offset, heads, kv_heads, q_scale, site="qkv")

    def rope_in_attention_for(self, rows: int) -> bool:
        return self.rope_in_attention and rows <= ROPE_IN_ATTENTION_MAX_ROWS

    def decoder_attention(self, x: torch.Tensor, lin: Linear, pos, cos, sin, q_out, k_cache, v_cache,
                          mask: KeyMask, heads: int, q_scale: float) -> torch.Tensor:
        """One denoising step's attention block up to the O projection: x (S, W) -> (S * heads, Dh).
        With rope_in_attention and S <= ROPE_IN_ATTENTION_MAX_ROWS: the QKV GEMM, then the attention kernel applies
        RoPE and the q scale and reads the suffix K/V from the GEMM's output (q_out and the cache's suffix rows stay
        untouched). Else decoder_qkv_rope (q_out and the suffix rows written), then mqa.
        k_cache/v_cache: (1, P + S, Dh)."""
        S, dh = x.shape[0], q_out.shape[-1]
        if self.rope_in_attention_for(S):
            qkv = self.decoder(x, lin, "qkv")
            out = torch.empty(S * heads, dh, device=x.device, dtype=q_out.dtype)
            return self.k.decoder_attention(qkv, k_cache[0], v_cache[0], pos, cos, sin, mask.bias, mask.prefix_len,
                                            mask.visible, heads, q_scale, out, pdl=self.launch_mode("attention"))
        self.decoder_qkv_rope(x, lin, pos, cos, sin, q_out, k_cache, v_cache, mask.prefix_len, heads, 1, q_scale)
        return self.mqa(q_out.view(S * heads, dh), k_cache[0], v_cache[0], mask, 1.0, site="attention")

    def rope_gemm_fits(self, x: torch.Tensor, lin: Linear, cfg: RopeGemmConfig, head_dim: int) -> bool:
        return (self._qkv_fused and self.few_rows_gemm_fits(x, lin, cfg.block_k)
                and (head_dim // 2) % cfg.block_p == 0)

    def qkv_rope(self, qkv, pos, cos, sin, q_out, k_cache, v_cache, offset: int, heads: int, kv_heads: int,
                 q_scale: float, site: str = "other", head_norm: torch.Tensor | None = None,
                 norm_eps: float = 1e-6) -> None:
        """flashrt_kernels/qkv_rope.py: the QKV GEMM's output split into rotated, scaled queries and rotated keys /
        values in the caches; head_norm (2, Dh) fp32: each query / key head RMS-normalized first (Qwen3). The
        kernel takes power-of-two head dims; another (the tiny test presets') runs the plain-PyTorch reference."""
        dh = q_out.shape[-1]
        if self._rope_triton and dh & (dh - 1) == 0:
            self.k.qkv_rope(qkv, pos, cos, sin, q_out, k_cache, v_cache, offset, heads, kv_heads, q_scale,
                            pdl=self.launch_mode(site), head_norm=head_norm, norm_eps=norm_eps)
        else:
            self.k.qkv_rope_reference(qkv, pos, cos, sin, q_out, k_cache, v_cache, offset, heads, kv_heads, q_scale,
                                      head_norm=head_norm, norm_eps=norm_eps)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  backend: str | None = None) -> torch.Tensor:
        """Unmasked attention (vision). q, k, v: (B, H, N, Dh) -> (B * N, H * Dh): token-major rows, the O GEMM's
        input. The rows are a view of the attention's output where the backend writes it token-major and a copy
        where it writes it head-major, so the tuning, which times this call, times that copy with the backend.
        backend: one of VISION_ATTENTION_BACKENDS (None: the pick of tuning.tune_vision_attention). A backend with
        no kernel for the inputs raises RuntimeError (the tuning then leaves it out)."""
        b, h, n, dh = q.shape
        if self._sdpa:
            backend = backend or self.vision_attention_backend
            if backend == "default":
                out = F.scaled_dot_product_attention(q, k, v, scale=scale)
            else:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                          "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
                with sdpa_kernel([chosen]):
                    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        else:
            logits = (q.float() @ k.float().transpose(-1, -2)) * scale        # (B, H, N, N) fp32
            out = torch.softmax(logits, dim=-1).to(v.dtype) @ v
        return out.transpose(1, 2).reshape(b * n, h * dh)

    def causal_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
        """Causal grouped-query attention (GR00T's language model): q (B, H, L, Dh) (scale applied), k / v
        (B, G, L, Dh) with H a multiple of G -> (B, H, L, Dh), on torch SDPA with the K/V heads shared in place
        (enable_gqa). mask None: causal alone (the flash kernel on a GPU); else the (B, 1, L, L) additive mask
        (causal and the prompt's padding, in q's dtype; the memory-efficient kernel on a GPU: an additive mask made
        once per predict runs faster there than a boolean one or K/V expanded to H heads)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=1.0,
                                              enable_gqa=True)

    def mqa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: KeyMask, scale: float,
            site: str = "other", splits: int | None = None) -> torch.Tensor:
        """One-KV-head attention, heads stacked on the query axis. q: (Mq, Dh), k/v: (L, Dh) -> (Mq, Dh).
        splits: key splits of the Triton kernel (None: its plan); the other implementations ignore it."""
        if self._mqa == "triton":
            out = torch.empty_like(q)
            return self.k.attention(q, k, v, mask.bias, mask.prefix_len, mask.visible, mask.heads, scale, out,
                                    splits=splits, pdl=self.launch_mode(site))
        dense = mask.dense(q.shape[0], k.shape[0], q.dtype)                 # (Mq, L)
        if self._mqa == "sdpa":
            return F.scaled_dot_product_attention(q[None, None], k[None, None], v[None, None],
                                                  attn_mask=dense[None, None], scale=scale)[0, 0]
        logits = (q.float() @ k.float().T) * scale + dense.float()          # (Mq, L) fp32
        return torch.softmax(logits, dim=-1).to(v.dtype) @ v

    def head_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       scale: float) -> torch.Tensor:
        """Multi-head attention of a few query rows (GR00T's DiT): q (B, H, T, Dh), k / v (B, H, L, Dh) strided views,
        mask (B, L) additive or None -> (B * T, H * Dh), the O projection's input (flashrt_kernels/head_attention.py
        where the Triton attention kernels run, its plain-PyTorch reference elsewhere)."""
        if self._mqa == "triton" and (q.is_cuda or self.k.INTERPRETED):
            return self.k.head_attention(q, k, v, mask, scale, pdl=self.launch_mode("attention"))
        return self.k.head_attention_reference(q, k, v, mask, scale)

    def prefix_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: KeyMask,
                         impl: str | None = None) -> torch.Tensor:
        """The prefix's bidirectional one-KV-head attention: q (P, H, Dh) (RoPE and scale applied), k / v (P, Dh),
        keys masked by mask.key_valid() -> (P, H * Dh), the O projection's input.
        impl "mqa": ops.mqa with the heads stacked on the query axis (flashrt_kernels/attention.py with mqa=triton; the
        plan splits the keys in two at the prefix's 4,608-9,216 query rows and merges); "mqa_split1" / "mqa_split4":
        the same kernel with one key split (no merge) or four;
        "sdpa_gqa" / "sdpa_expand" / "sdpa_repeat": torch's scaled_dot_product_attention over (1, H, P, Dh) with a
        boolean key mask, the one K/V head shared by enable_gqa, by a stride-0 view, or by a copy per head: which
        of torch's fused backends accepts which form differs, so the tuning times all three;
        "wgmma" / "wgmma_overlap": flashrt_kernels/prefix_attention.py (Gluon, sm90), the heads stacked on the query
        axis;
        with _overlap the next key block's q @ k^T runs on the tensor cores during this block's softmax.
        None: the pick of tuning.tune_prefix_attention."""
        P, H, Dh = q.shape
        impl = impl or self.prefix_attention_impl
        form = WGMMA_PREFIX_ATTENTION.get(impl)
        if form is not None:
            return self.k.prefix_attention(q.reshape(P * H, Dh), k, v, mask.bias[:P], pdl=self.launch_mode("other"),
                                           **form).view(P, H * Dh)
        if impl.startswith("sdpa"):
            kk, vv = k[None, None], v[None, None]                                          # (1, 1, P, Dh)
            if impl != "sdpa_gqa":
                kk, vv = kk.expand(1, H, P, Dh), vv.expand(1, H, P, Dh)
                if impl == "sdpa_repeat":
                    kk, vv = kk.contiguous(), vv.contiguous()
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv,
                                                 attn_mask=mask.key_valid()[None, None, None, :], scale=1.0,
                                                 enable_gqa=impl == "sdpa_gqa")                   # (1, H, P, Dh)
            return out[0].transpose(0, 1).reshape(P, H * Dh)
        splits = {"mqa": None, "mqa_split1": 1, "mqa_split4": 4}[impl]
        return self.mqa(q.view(P * H, Dh), k, v, mask, 1.0, splits=splits).view(P, H * Dh)

    def euler(self, x: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dt: float) -> None:
        """x <- x + dt * (v + bias), in place."""
        if self._euler_triton:
            self.k.euler(x, v, bias, dt, pdl=self.launch_mode("other"))
        else:
            self.k.euler_reference(x, v, bias, dt)
