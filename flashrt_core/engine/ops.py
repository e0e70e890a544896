"""The engine's ops, each bound once to the implementation the dispatch table picked.

Every op has the same contract whichever implementation runs (the Triton kernel or its plain-PyTorch reference
from flashrt_kernels), so the forward in forward.py never branches on hardware.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .dispatch import Dispatch, Op
from .kernel_import import load_kernels
from .weights import Linear

log = logging.getLogger(__name__)

try:
    from triton.runtime.errors import OutOfResources
    OUT_OF_RESOURCES: tuple[type[BaseException], ...] = (OutOfResources,)
except ImportError:                     # no Triton: no Triton candidate is ever timed
    OUT_OF_RESOURCES = ()

# Additive mask value for keys a query may not see: finite, so a row never becomes NaN.
MASKED = -1e30

# rope_in_attention serves denoising steps of at most this many suffix rows: its suffix split applies RoPE to all
# of them in one program. Measured on the H200 (tools/benchmark_attention.py, QKV GEMM + RoPE + attention per
# layer): 10 rows 11.33 us vs 12.88 us for qkv_rope + attention; 50 rows (horizon 50) 21.65 us vs 18.69 us.
ROPE_IN_ATTENTION_MAX_ROWS = 16


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch configuration of kernels/flashrt_kernels/skinny_gemm.py (split_k > 1 only where the consumer sums partials).
    block_k == K / split_k makes one-shot programs: the whole weight slice is loaded before the wait for x."""

    block_n: int
    block_k: int
    split_k: int
    stages: int
    warps: int = 4
    max_rows: int = 64          # rows it serves: deep stages of wide tiles overflow shared memory with 64-row tiles

    def __str__(self) -> str:
        return f"triton(n{self.block_n},k{self.block_k},s{self.split_k},st{self.stages},w{self.warps})"


# The SDPA backends the vision attention may run on (Ops.attention), timed at load by tune_vision_attention;
# "default" leaves the choice to torch (on the H200, torch 2.11: cuDNN's flash kernel). Measured at load on the H200
# (us per layer at 2 views): torch's choice 8.98-9.63, cuDNN 9.11-9.61, memory-efficient 11.3-11.5, flash
# 13.5-13.7; the pick flips between cuDNN and torch's choice.
VISION_ATTENTION_BACKENDS = ("default", "flash", "efficient", "cudnn")
VISION_ATTENTION_CHECK_ATOL = 3e-2   # tune_vision_attention's check of each backend: bf16 output of |v| ~ 1 values

# The prefix attention's implementations (Ops.prefix_attention), timed at load by tune_prefix_attention. Measured
# on the H200 at 576 keys (us per layer): mqa 36.8, mqa_split1 25.3 (picked), mqa_split4 29.5, SDPA
# 45.0-53.1; also measured and dropped: one split with 32-row query blocks (144 programs, 2 per SM) 29.7 us, two
# splits of 32 rows 35.0, one split of 16 rows 28.4.
# kernels/flashrt_kernels/prefix_attention.py's forms, by name: the launcher's arguments. "wgmma" measured 17.7 us on the
# H200 against 25.4 for mqa_split1, "wgmma_overlap" 20.1 (prefix_attention_wgmma).
WGMMA_PREFIX_ATTENTION = {"wgmma": {}, "wgmma_overlap": {"overlap": True}}
PREFIX_ATTENTION_IMPLS = ("mqa", "mqa_split1", "mqa_split4", "sdpa_gqa", "sdpa_expand", "sdpa_repeat",
                          *WGMMA_PREFIX_ATTENTION)
# tune_prefix_attention's check of each implementation against the fp32 softmax attention before it is timed: bf16
# outputs of |v| ~ 1 values, as VISION_ATTENTION_CHECK_ATOL
PREFIX_ATTENTION_CHECK_ATOL = 3e-2


@dataclass(frozen=True)
class SmemConfig:
    """Launch configuration of kernels/flashrt_kernels/smem_gemm.py (the weight slice in shared memory before the PDL
    wait)."""

    split_k: int

    def __str__(self) -> str:
        return f"gluon_smem(s{self.split_k})"


# kernels/flashrt_kernels/smem_gemm.py candidates per kind (smem_gemm=tma, the default on sm90 with Gluon): 64 weight
# rows per program (32 + 32 with GeGLU); split-K only where the consumer sums partials (the norms after O and down).
# Each gives 40-128 programs at the expert's shapes. Split-K 8 for O and 16 for down give 128 / 256 programs, as
# many as gate/up's 128, which alone among the four streams its weights at ~4.2 TB/s on the H200 (O with 32
# programs: 1.5 TB/s); the norm after them sums more partials, so the tuning decides.
SMEM_CANDIDATES = {"qkv": [SmemConfig(1)], "gate_up": [SmemConfig(1)],
                   "o": [SmemConfig(2), SmemConfig(4), SmemConfig(8)],
                   "down": [SmemConfig(4), SmemConfig(8), SmemConfig(16)]}

# tune_decoder checks each candidate's product against the library GEMM on the same input before timing it
# (relative L2 error): bf16 rounding and summation order.
DECODER_CHECK_REL_L2 = 2e-2


class CandidateMismatch(RuntimeError):
    """A decoder GEMM candidate whose product disagrees with the library GEMM's (Ops.check_candidate)."""


# Candidates measured at load for each decoder GEMM kind (qkv feeds RoPE and gate_up has the GeGLU epilogue:
# no split-K there; o and down feed the residual norms, which sum split-K partials). The expert's K is 1024
# (qkv, gate_up), 2048 (o) and 4096 (down): the one-shot candidates split K into 1024-wide slices. Measured on the
# H200 and dropped: one-shot with 8 warps (qkv 8.4 us vs 3.9; gate_up 56 us, its two 16x1024 slices spill).
# The K loops stage their weight tiles through shared memory (cp.async), `stages` deep: the deeper candidates of
# qkv and gate_up (up to 140 KB of a program's 128-256 KB slice in flight, no spills: tools/kernel_resources.py)
# are there for the chain tuning to weigh against the ~6 us the gate/up GEMM takes in the denoiser.
# Two of them need 256 KB of shared memory with the 64-row x tiles of 17-64 rows (h50), so they serve 16 rows at most.
SKINNY_CANDIDATES = {
    "qkv": [SkinnyConfig(16, 256, 1, 4), SkinnyConfig(16, 128, 1, 6), SkinnyConfig(32, 128, 1, 4),
            SkinnyConfig(16, 1024, 1, 1, 4), SkinnyConfig(32, 128, 1, 6), SkinnyConfig(16, 128, 1, 8)],
    "gate_up": [SkinnyConfig(16, 256, 1, 4), SkinnyConfig(16, 128, 1, 6), SkinnyConfig(32, 128, 1, 4),
                SkinnyConfig(32, 128, 1, 6), SkinnyConfig(32, 128, 1, 8, max_rows=16),
                SkinnyConfig(32, 256, 1, 4, max_rows=16), SkinnyConfig(16, 128, 1, 8)],
    "o": [SkinnyConfig(16, 256, 2, 4), SkinnyConfig(16, 128, 4, 4), SkinnyConfig(32, 128, 4, 4),
          SkinnyConfig(16, 1024, 2, 1, 4), SkinnyConfig(16, 512, 4, 1, 4)],
    "down": [SkinnyConfig(16, 256, 4, 4), SkinnyConfig(16, 128, 8, 4), SkinnyConfig(32, 128, 8, 4),
             SkinnyConfig(16, 1024, 4, 1, 4), SkinnyConfig(16, 512, 8, 1, 4)],
}
SKINNY_DEFAULT = {kind: cands[0] for kind, cands in SKINNY_CANDIDATES.items()}


# Where the denoiser launches its Triton kernels, one site per kernel of an expert layer (a site's kernel is the one
# that releases the next), and "other" for every other Triton kernel of the predict. A launch policy is the set of
# sites whose kernels let the next kernel launch at their start (EARLY_TRIGGER) instead of after their PDL wait.
# Measured on the H200 (all sites early): the one-shot GEMMs after the first norm and after the attention gain 1-2 us
# each, the gate/up GEMM and the attention lose as much to the weight streams of the kernels ahead. With
# pdl_early_trigger (the default) the chain tuning times these policies in the denoiser and keeps the fastest:
# "all" with the shared-memory GEMMs of kernels/flashrt_kernels/smem_gemm.py (5.22 -> 4.86 ms per denoise).
LAUNCH_SITES = ("norm1", "qkv", "attention", "o", "norm2", "gate_up", "down", "other")
LAUNCH_POLICIES = {
    "none": frozenset(),
    "all": frozenset(LAUNCH_SITES),
    "before_one_shot": frozenset({"norm1", "attention"}),     # QKV and O launch at the start of the kernel ahead
    "attention_block": frozenset({"norm1", "qkv", "attention"}),
    "norms": frozenset({"norm1", "norm2"}),
    "mlp_block": frozenset({"norm2", "gate_up"}),
}


@dataclass(frozen=True)
class RopeGemmConfig:
    """Launch configuration of kernels/flashrt_kernels/qkv_gemm_rope.py (the decoder QKV GEMM with the RoPE epilogue)."""

    block_p: int
    block_k: int
    stages: int
    warps: int = 4

    def __str__(self) -> str:
        return f"triton_rope(p{self.block_p},k{self.block_k},st{self.stages},w{self.warps})"


# Measured at load against the SKINNY_CANDIDATES["qkv"] GEMMs followed by the qkv_rope kernel.
ROPE_GEMM_CANDIDATES = [RopeGemmConfig(16, 128, 4), RopeGemmConfig(16, 128, 6), RopeGemmConfig(16, 256, 3),
                        RopeGemmConfig(32, 128, 4)]


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
    def __init__(self, dispatch: Dispatch):
        self.dispatch = dispatch
        k = load_kernels()
        self.k = k
        triton = lambda op: dispatch[op] == "triton"  # noqa: E731
        self._norm_triton = triton(Op.NORM)
        self._ada_triton = triton(Op.ADA_NORM)
        self._geglu_triton = triton(Op.GEGLU)
        self._rope_triton = triton(Op.QKV_ROPE)
        self._euler_triton = triton(Op.EULER)
        self._fp8_fused_quant = dispatch[Op.FP8_INPUT_QUANT] == "fused"
        self.smem_gemm = dispatch[Op.SMEM_GEMM] == "tma"          # kernels/flashrt_kernels/smem_gemm.py joins the GEMM candidates
        # ... at 17-64 rows too (kernels/flashrt_kernels/smem_gemm.py _smem_gemm_rows_kernel; EngineOptions.smem_gemm_rows)
        self.smem_gemm_rows = self.smem_gemm and dispatch.options.smem_gemm_rows
        # the prefix's attention: "mqa" (the Op.MQA implementation) until tune_prefix_attention measures otherwise
        self.prefix_attention_impl = "mqa"
        # kernels/flashrt_kernels/prefix_attention.py (wgmma) among the tuning's prefix attention candidates (on by default:
        # 17.7 us against 25.4 for the mqa kernel on the H200; EngineOptions.prefix_attention_wgmma)
        self.prefix_attention_wgmma = dispatch.options.prefix_attention_wgmma and dispatch.options.fast_paths
        self.prefix_attention_timings: dict[str, float] = {}
        self.vision_attention_backend = "default"                   # tune_vision_attention may change it
        self.vision_attention_timings: dict[str, float] = {}
        # every Triton launch below passes a launch mode: False (stream order), 1 (PDL) or EARLY_TRIGGER (PDL, the
        # kernel releases the next one at its start) where its site is in early_sites (launch_mode)
        self.pdl = 1 if dispatch[Op.KERNEL_LAUNCH] in ("pdl", "pdl_early") else False
        self.launch_policy = "all" if dispatch[Op.KERNEL_LAUNCH] == "pdl_early" else "none"   # chain tuning may change
        self.early_sites = LAUNCH_POLICIES[self.launch_policy]
        self._qkv_fused = dispatch[Op.DECODER_QKV] == "fused_rope"
        self._sdpa = dispatch[Op.ATTENTION] == "sdpa"
        self._mqa = dispatch[Op.MQA]
        # the denoiser's attention applies RoPE itself: only the Triton attention can
        self.rope_in_attention = dispatch[Op.DECODER_QKV] == "rope_in_attention" and self._mqa == "triton"
        self._gelu_epilogue = dispatch[Op.VISION_GELU] == "gemm_epilogue"
        self.fused_patch_embed = dispatch[Op.PATCH_EMBED] == "fused"     # forward.vision: patch_rows + GEMM
        self.fused_denoise_step = dispatch[Op.DENOISE_STEP] == "fused"   # forward.denoise: denoise_step_in / _out
        # ... and pi0's (time_mlp_in, a few-row GEMM, denoise_step_out; EngineOptions.fused_denoise_step_pi0)
        self.fused_denoise_step_pi0 = self.fused_denoise_step and dispatch.options.fused_denoise_step_pi0
        # forward.forward_overlapped: the first denoising step beside the prefix (about -0.2 ms per predict on the
        # H200 at horizon 10, -0.5 ms at 50)
        self.overlap_first_step = dispatch.options.overlap_first_step and dispatch.options.fast_paths
        triton_decoder = dispatch[Op.GEMM_DECODER] == "triton"
        # decoder GEMM kind -> "triton" | "library"; tune_decoder() keeps Triton only where it measures faster
        self.decoder_impl: dict[str, str | SkinnyConfig | SmemConfig | RopeGemmConfig] = {
            kind: "triton" if triton_decoder else "library" for kind in SKINNY_CANDIDATES}
        self.decoder_timings: dict[str, dict[str, float]] = {}
        self.decoder_failures: dict[str, dict[str, str]] = {}    # candidates left out of the tuning (time_candidate)
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
                 site: str = "other") -> torch.Tensor:
        """residual += x * gate (in place); out = rms(residual) * scale1p + shift."""
        if self._ada_triton:
            return self.k.ada_rms_norm(x, residual, gate, scale1p, shift, out, eps, pdl=self.launch_mode(site))
        y, h = self.k.ada_rms_norm_reference(x, residual, gate, scale1p, shift, eps, out_dtype=out.dtype)
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
        output bias) and the MLP's hidden rows h in one kernel (kernels/flashrt_kernels/denoise_step.py time_mlp_in). Returns h."""
        return self.k.time_mlp_in(x_t, w_fold, c, state_token, b_out, residual, h, pdl=self.launch_mode("other"))

    # ---------------------------------------------------------------------------------------------- MLP pieces
    def geglu(self, gu: torch.Tensor) -> torch.Tensor:
        """gu (M, 2F) -> gelu_tanh(gate) * up (M, F)."""
        if self._geglu_triton:
            return self._triton_geglu(gu, gu.dtype)
        return self.k.geglu_reference(gu)

    def _triton_geglu(self, gu: torch.Tensor, dtype: torch.dtype, inv_scale: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """kernels/flashrt_kernels/geglu.py into a new (M, F) tensor of dtype (FP8 with inv_scale: quantized on the way out)."""
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
        """gelu_tanh(x @ W^T + b): the vision MLP's fc1. With vision_gelu=gemm_epilogue and one bf16 block with a
        bias on the GPU, bias and GELU run in the GEMM's epilogue (cuBLASLt / hipBLASLt use the tanh form on the
        GPU; the GPU test checks it against torch's tanh GELU)."""
        if self._gelu_epilogue and self.calibration is None and lin.fp8 is None and len(lin.parts) == 1 \
                and lin.parts[0][1] is not None and x.is_cuda:
            w, b = lin.parts[0]
            return torch._addmm_activation(b, x, w.t(), use_gelu=True)
        return F.gelu(self.linear(x, lin), approximate="tanh")

    def _few_rows_gemm_ok(self, x: torch.Tensor, lin: Linear, k_step: int) -> bool:
        """The Triton few-row GEMMs' conditions: one bias-free weight block, <= 64 rows on the GPU (or on the CPU
        under Triton's interpreter, for tests), K a multiple of what one program step covers."""
        (w, b), = lin.parts if len(lin.parts) == 1 else ((None, True),)
        return (w is not None and b is None and lin.fp8 is None and x.shape[0] <= 64
                and (x.is_cuda or self.k.INTERPRETED) and x.shape[1] % k_step == 0)

    def _skinny_ok(self, x: torch.Tensor, lin: Linear, cfg: SkinnyConfig) -> bool:
        return x.shape[0] <= cfg.max_rows and self._few_rows_gemm_ok(x, lin, cfg.split_k * cfg.block_k)

    def _smem_ok(self, x: torch.Tensor, lin: Linear, kind: str, cfg: SmemConfig) -> bool:
        """kernels/flashrt_kernels/smem_gemm.py's conditions: bf16 weights, a contiguous bf16 x on the GPU."""
        if not (self.smem_gemm and x.is_cuda and x.dtype == torch.bfloat16
                and x.is_contiguous() and self._few_rows_gemm_ok(x, lin, 1)):
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
        for this kind."""
        impl = impl or self.decoder_impl[kind]
        if impl == "triton":
            impl = SKINNY_DEFAULT[kind]
        if isinstance(impl, SmemConfig) and self._smem_ok(x, lin, kind, impl):
            return self.k.smem_gemm(x, lin.parts[0][0], geglu=kind == "gate_up", split_k=impl.split_k,
                                    pdl=self.launch_mode(kind))
        if isinstance(impl, SkinnyConfig) and self._skinny_ok(x, lin, impl):
            return self.k.skinny_gemm(x, lin.parts[0][0], geglu=kind == "gate_up", split_k=impl.split_k,
                                      block_n=impl.block_n, block_k=impl.block_k, num_stages=impl.stages,
                                      num_warps=impl.warps, pdl=self.launch_mode(kind))
        y = self.linear(x, lin)
        return self.geglu(y) if kind == "gate_up" else y

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

    def _rope_in_attention_for(self, rows: int) -> bool:
        return self.rope_in_attention and rows <= ROPE_IN_ATTENTION_MAX_ROWS

    def decoder_attention(self, x: torch.Tensor, lin: Linear, pos, cos, sin, q_out, k_cache, v_cache,
                          mask: KeyMask, heads: int, q_scale: float) -> torch.Tensor:
        """One denoising step's attention block up to the O projection: x (S, W) -> (S * heads, Dh).
        With rope_in_attention and S <= ROPE_IN_ATTENTION_MAX_ROWS: the QKV GEMM, then the attention kernel applies
        RoPE and the q scale and reads the suffix K/V from the GEMM's output (q_out and the cache's suffix rows stay
        untouched). Else decoder_qkv_rope (q_out and the suffix rows written), then mqa.
        k_cache/v_cache: (1, P + S, Dh)."""
        S, dh = x.shape[0], q_out.shape[-1]
        if self._rope_in_attention_for(S):
            qkv = self.decoder(x, lin, "qkv")
            out = torch.empty(S * heads, dh, device=x.device, dtype=q_out.dtype)
            return self.k.decoder_attention(qkv, k_cache[0], v_cache[0], pos, cos, sin, mask.bias, mask.prefix_len,
                                            mask.visible, heads, q_scale, out, pdl=self.launch_mode("attention"))
        self.decoder_qkv_rope(x, lin, pos, cos, sin, q_out, k_cache, v_cache, mask.prefix_len, heads, 1, q_scale)
        return self.mqa(q_out.view(S * heads, dh), k_cache[0], v_cache[0], mask, 1.0, site="attention")

    def _rope_gemm_ok(self, x: torch.Tensor, lin: Linear, cfg: RopeGemmConfig, head_dim: int) -> bool:
        return (self._qkv_fused and self._few_rows_gemm_ok(x, lin, cfg.block_k)
                and (head_dim // 2) % cfg.block_p == 0)

    @staticmethod
    def graph_time_us(fn, reps: int, replays: int = 1) -> float:
        """GPU time of one call of fn, from `reps` calls captured in a CUDA graph (no launch overhead); the median
        over `replays` replays of that graph."""
        from .graph_executor import graph_replay_ms, side_stream
        stream = side_stream(torch.device("cuda", torch.cuda.current_device()))
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        times = sorted(graph_replay_ms(graph, replays))
        return times[len(times) // 2] * 1e3 / reps

    def decoder_candidates(self, kind: str, x: torch.Tensor, lin: Linear, head_dim: int) -> list:
        """The implementations the load-time tuning times for one decoder GEMM kind at x's shape: the library
        GEMM, every Triton configuration that fits, and for qkv the RoPE-epilogue GEMMs where they may run."""
        candidates = ["library"] + [c for c in SKINNY_CANDIDATES[kind] if self._skinny_ok(x, lin, c)]
        candidates += [c for c in SMEM_CANDIDATES[kind] if self._smem_ok(x, lin, kind, c)]
        if kind == "qkv":
            candidates += [c for c in ROPE_GEMM_CANDIDATES if self._rope_gemm_ok(x, lin, c, head_dim)]
        return candidates

    def time_candidate(self, kind: str, impl, measure) -> float | None:
        """measure() for one tuning candidate. A candidate that needs more shared memory or registers than this
        GPU has (Triton's OutOfResources), one whose product disagrees with the library GEMM's
        (CandidateMismatch, check_candidate), and a shared-memory GEMM (SmemConfig: Gluon, run only on the H200
        so far) that fails to compile or launch, is left out and recorded in decoder_failures (under `kind`); any
        other failure is raised."""
        try:
            return measure()
        except Exception as err:  # noqa: BLE001  only the kinds of failure below are a candidate's to have
            if not (isinstance(err, (CandidateMismatch, *OUT_OF_RESOURCES)) or isinstance(impl, SmemConfig)):
                raise
            log.warning("GEMM candidate %s for %s cannot run on this GPU, left out: %s", impl, kind, err)
            self.decoder_failures.setdefault(kind, {})[str(impl)] = repr(err)
            return None

    def check_candidate(self, kind: str, impl, x: torch.Tensor, lin: Linear,
                        want: torch.Tensor | None = None) -> None:
        """Raise CandidateMismatch when a Triton or shared-memory GEMM candidate's product on x (its split-K
        partials summed) is off the library GEMM's by more than DECODER_CHECK_REL_L2 (relative L2), so that no
        candidate is picked for its speed alone. The RoPE-epilogue GEMMs
        (RopeGemmConfig) write Q / K / V where the attention reads them and are not checked here.
        want: the library product on x in fp32, when the caller has it (the tuning computes it once per kind)."""
        if impl == "library" or isinstance(impl, RopeGemmConfig):
            return
        if want is None:
            want = self.decoder(x, lin, kind, "library").float()
        got = self.decoder(x, lin, kind, impl)
        got = got.float().sum(0) if got.dim() == 3 else got.float()
        bound = DECODER_CHECK_REL_L2
        if got.shape != want.shape:
            raise CandidateMismatch(f"{kind} {impl}: product {tuple(got.shape)}, library {tuple(want.shape)}")
        err = float((got - want).norm() / want.norm().clamp_min(1e-30))
        if not err <= bound:
            raise CandidateMismatch(f"{kind} {impl}: relative L2 error {err:.3g} against the library GEMM "
                                    f"(bound {bound})")

    def tune_decoder(self, rows: int, layers, heads: int, head_dim: int, reps: int = 4
                     ) -> dict[str, dict[str, float]]:
        """For each decoder GEMM kind, time the library GEMM and every Triton candidate at `rows` rows
        (graph-captured, GPU time only) and keep the fastest (issue 4: fused kernels only where measured faster).
        Each timed pass runs the GEMM over every layer of `layers` in turn, `reps` times, as the denoiser does:
        the weights stream from memory rather than from a warm L2. The library time of gate_up includes its
        separate GeGLU kernel; every qkv time includes RoPE and the KV write (separate kernel or epilogue), except
        where rope_in_attention serves `rows`: there the attention does that and qkv is the GEMM alone. Before its
        timing each candidate's product is checked against the library GEMM's (check_candidate); one that disagrees
        is left out, with the reason in decoder_failures.
        Returns {kind: {candidate: us per call}}."""
        dev = layers[0].qkv.parts[0][0].device
        g = torch.Generator(device=dev).manual_seed(0)
        half = head_dim // 2
        rope = (torch.arange(rows, device=dev), torch.rand(rows, half, device=dev, generator=g),
                torch.rand(rows, half, device=dev, generator=g),
                torch.empty(rows, heads, head_dim, device=dev, dtype=layers[0].qkv.parts[0][0].dtype))
        cache = torch.zeros(2, 1, rows, head_dim, device=dev, dtype=rope[3].dtype)
        for kind in ("qkv", "o", "gate_up", "down"):
            lins = [getattr(layer, kind) for layer in layers]
            if self.decoder_impl[kind] == "library" or lins[0] is None:
                continue
            w = lins[0].parts[0][0]
            x = torch.randn(rows, w.shape[1], device=w.device, dtype=w.dtype, generator=g)

            def run_all(impl):
                for lin in lins:
                    if kind == "qkv" and not self._rope_in_attention_for(rows):
                        self.decoder_qkv_rope(x, lin, *rope[:3], rope[3], cache[0], cache[1], 0, heads, 1, 1.0,
                                              impl=impl)
                    else:
                        self.decoder(x, lin, kind, impl)
            want = self.decoder(x, lins[0], kind, "library").float()      # what every candidate is checked against

            def checked_time(impl):
                self.check_candidate(kind, impl, x, lins[0], want)
                return self.graph_time_us(lambda: run_all(impl), reps)
            times = {}
            for impl in self.decoder_candidates(kind, x, lins[0], head_dim):
                us = self.time_candidate(kind, impl, lambda: checked_time(impl))
                if us is not None:
                    times[impl] = us / len(lins)
            self.decoder_impl[kind] = min(times, key=times.get)
            self.decoder_timings[kind] = {str(k): v for k, v in times.items()}
        return self.decoder_timings

    # ---------------------------------------------------------------------------------------------- attention
    def qkv_rope(self, qkv, pos, cos, sin, q_out, k_cache, v_cache, offset: int, heads: int, kv_heads: int,
                 q_scale: float, site: str = "other") -> None:
        if self._rope_triton:
            self.k.qkv_rope(qkv, pos, cos, sin, q_out, k_cache, v_cache, offset, heads, kv_heads, q_scale,
                            pdl=self.launch_mode(site))
        else:
            self.k.qkv_rope_reference(qkv, pos, cos, sin, q_out, k_cache, v_cache, offset, heads, kv_heads, q_scale)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  backend: str | None = None) -> torch.Tensor:
        """Unmasked attention (vision). q, k, v: (B, H, N, Dh) -> (B, H, N, Dh). backend: one of
        VISION_ATTENTION_BACKENDS (None: the choice of tune_vision_attention). A backend with no kernel for the
        inputs raises RuntimeError (the tuning then leaves it out)."""
        if self._sdpa:
            backend = backend or self.vision_attention_backend
            if backend == "default":
                return F.scaled_dot_product_attention(q, k, v, scale=scale)
            from torch.nn.attention import SDPBackend, sdpa_kernel
            chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                      "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
            with sdpa_kernel([chosen]):
                return F.scaled_dot_product_attention(q, k, v, scale=scale)
        logits = (q.float() @ k.float().transpose(-1, -2)) * scale        # (B, H, N, N) fp32
        return torch.softmax(logits, dim=-1).to(v.dtype) @ v

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

    def prefix_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: KeyMask,
                         impl: str | None = None) -> torch.Tensor:
        """The prefix's bidirectional one-KV-head attention: q (P, H, Dh) (RoPE and scale applied), k / v (P, Dh),
        keys masked by mask.key_valid() -> (P, H * Dh), the O projection's input.
        impl "mqa": ops.mqa with the heads stacked on the query axis (kernels/flashrt_kernels/attention.py with mqa=triton; the
        plan splits the keys in two at the prefix's 4,608-9,216 query rows and merges); "mqa_split1" / "mqa_split4":
        the same kernel with one key split (no merge) or four;
        "sdpa_gqa" / "sdpa_expand" / "sdpa_repeat": torch's scaled_dot_product_attention over (1, H, P, Dh) with a
        boolean key mask, the one K/V head shared by enable_gqa, by a stride-0 view, or by a copy per head: which
        of torch's fused backends accepts which form differs, so the tuning times all three;
        "wgmma" / "wgmma_overlap": kernels/flashrt_kernels/prefix_attention.py (Gluon, sm90), the heads stacked on the query axis;
        with _overlap the next key block's q @ k^T runs on the tensor cores during this block's softmax.
        None: the choice of tune_prefix_attention."""
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

    def prefix_attention_candidates(self, P: int, heads: int, head_dim: int, device: torch.device) -> list[str]:
        """The implementations tune_prefix_attention times: all but the wgmma kernel's forms, which join where they
        are switched on (prefix_attention_wgmma) and the kernel serves this shape and device."""
        def served(form: dict) -> bool:
            return self.k.prefix_attention_supported(P * heads, P, head_dim, device, form.get("splits", 1),
                                                     form.get("block_n", self.k.PREFIX_ATTENTION_BLOCK_N))

        out = []
        for impl in PREFIX_ATTENTION_IMPLS:
            if impl in WGMMA_PREFIX_ATTENTION:
                if not (self.prefix_attention_wgmma and served(WGMMA_PREFIX_ATTENTION[impl])):
                    continue
            out.append(impl)
        return out

    def tune_prefix_attention(self, P: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                              layers: int, reps: int = 3) -> dict[str, float]:
        """Time the prefix attention's implementations (prefix_attention_candidates) at P keys (graph-captured,
        `layers` calls per pass, as the backbone runs them) on random inputs with the last eighth of the keys
        masked, and keep the faster. Each is first checked against the fp32 softmax attention on the same inputs
        (PREFIX_ATTENTION_CHECK_ATOL); one that disagrees is left out and logged, never timed or run. An
        implementation that cannot run here (e.g. no fused SDPA backend for these shapes) is left out.
        Returns {impl: us per call}."""
        g = torch.Generator(device=device).manual_seed(0)
        q = (torch.randn(P, heads, head_dim, device=device, generator=g) * head_dim ** -0.5).to(dtype)
        k = torch.randn(P, head_dim, device=device, dtype=dtype, generator=g)
        v = torch.randn(P, head_dim, device=device, dtype=dtype, generator=g)
        bias = torch.zeros(P, device=device)
        bias[P - P // 8:] = float("-inf")
        mask = KeyMask(bias, P, None, heads)
        want = self.k.attention_reference(q.float().reshape(P * heads, head_dim), k.float(), v.float(), bias, P,
                                          None, heads, 1.0).reshape(P, heads * head_dim)    # fp32, heads stacked
        candidates = self.prefix_attention_candidates(P, heads, head_dim, device)
        times = self._checked_times(f"prefix attention (P={P})", candidates,
                                    lambda impl: self.prefix_attention(q, k, v, mask, impl), want,
                                    PREFIX_ATTENTION_CHECK_ATOL, layers, reps)
        self.prefix_attention_impl = min(times, key=times.get)
        self.prefix_attention_timings = times
        return times

    def _checked_times(self, what: str, candidates, run: Callable[[str], torch.Tensor], want: torch.Tensor,
                       atol: float, layers: int, reps: int) -> dict[str, float]:
        """For each candidate: run(candidate) checked against `want` (the fp32 softmax attention, within atol), then
        timed as `layers` calls graph-captured, us per call. One that disagrees is logged and left out, never timed;
        one that cannot run here (a RuntimeError: no kernel for this shape, dtype or layout) is left out."""
        times = {}
        for cand in candidates:
            try:
                err = float((run(cand).float() - want).abs().max())
                if not err <= atol:
                    log.warning("%s %s is off by %.3g against the softmax attention, left out", what, cand, err)
                    continue
                times[cand] = self.graph_time_us(lambda: [run(cand) for _ in range(layers)], reps) / layers
            except RuntimeError as err:
                log.info("%s %s cannot run: %s", what, cand, err)
        return times

    def tune_vision_attention(self, views: int, tokens: int, heads: int, head_dim: int, dtype: torch.dtype,
                              device: torch.device, layers: int, reps: int = 3) -> dict[str, float]:
        """Time the vision attention on each SDPA backend (graph-captured, `layers` calls per pass, as the vision
        tower runs them) on random q / k / v laid out as forward.vision takes them from the QKV GEMM's output
        (strided views of one (views, tokens, 3, heads, head_dim) tensor), and keep the fastest. A backend with
        no kernel for this shape, dtype or layout is left out. Each backend's output is first checked against the
        fp32 softmax attention on the same q / k / v (VISION_ATTENTION_CHECK_ATOL); one that disagrees is left out
        and logged, never timed or run.
        Returns {backend: us per call}."""
        g = torch.Generator(device=device).manual_seed(0)
        qkv = torch.randn(views, tokens, 3, heads, head_dim, device=device, dtype=dtype, generator=g)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))                       # (V, H, N, Dh)
        scale = head_dim ** -0.5
        want = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, dim=-1) @ v.float()   # fp32
        times = self._checked_times("vision attention backend", VISION_ATTENTION_BACKENDS,
                                    lambda backend: self.attention(q, k, v, scale, backend), want,
                                    VISION_ATTENTION_CHECK_ATOL, layers, reps)
        self.vision_attention_backend = min(times, key=times.get)
        self.vision_attention_timings = times
        return times

    # ---------------------------------------------------------------------------------------------- flow
    def euler(self, x: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dt: float) -> None:
        """x <- x + dt * (v + bias), in place."""
        if self._euler_triton:
            self.k.euler(x, v, bias, dt, pdl=self.launch_mode("other"))
        else:
            self.k.euler_reference(x, v, bias, dt)
