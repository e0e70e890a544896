"""The launch configurations and candidate sets of the engine's kernels: what the bindings (ops.py) launch and
what the load-time tuning (tuning.py) chooses among. Times quoted are per call on the H200."""

from __future__ import annotations

from dataclasses import dataclass

# rope_in_attention serves denoising steps of at most this many suffix rows: its suffix split applies RoPE to all
# of them in one program. Measured on the H200 (tools/benchmark_attention.py, QKV GEMM + RoPE + attention per
# layer): 10 rows 11.33 us vs 12.88 us for qkv_rope + attention; 50 rows (horizon 50) 21.65 us vs 18.69 us.
ROPE_IN_ATTENTION_MAX_ROWS = 16


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch configuration of flashrt_kernels/skinny_gemm.py (split_k > 1 only where the consumer sums partials).
    block_k == K / split_k makes one-shot programs: the whole weight slice is loaded before the wait for x."""

    block_n: int
    block_k: int
    split_k: int
    stages: int
    warps: int = 4
    max_rows: int = 64          # rows it serves: deep stages of wide tiles overflow shared memory with 64-row tiles

    def __str__(self) -> str:
        return f"triton(n{self.block_n},k{self.block_k},s{self.split_k},st{self.stages},w{self.warps})"


# The SDPA backends the vision attention may run on (Ops.attention), timed at load by tuning.tune_vision_attention;
# "default" leaves the choice to torch (on the H200, torch 2.11: cuDNN's flash kernel). Measured at load on the H200
# (us per layer at 2 views): torch's choice 8.98-9.63, cuDNN 9.11-9.61, memory-efficient 11.3-11.5, flash
# 13.5-13.7; the pick flips between cuDNN and torch's choice.
VISION_ATTENTION_BACKENDS = ("default", "flash", "efficient", "cudnn")

# The prefix attention's implementations (Ops.prefix_attention), timed at load by tuning.tune_prefix_attention. On
# the H200 at 576 keys (us per layer): mqa 36.8, mqa_split1 25.3, mqa_split4 29.5, SDPA 45.0-53.1. Forms that are
# slower and not offered: one split with 32-row query blocks (144 programs, 2 per SM) 29.7 us, two splits of 32
# rows 35.0, one split of 16 rows 28.4.
# kernels/flashrt_kernels/prefix_attention.py's forms, by name: the launcher's arguments. "wgmma" takes 17.7 us on
# the H200 against 25.4 for mqa_split1, "wgmma_overlap" 20.1 (prefix_attention_wgmma).
WGMMA_PREFIX_ATTENTION = {"wgmma": {}, "wgmma_overlap": {"overlap": True}}
PREFIX_ATTENTION_IMPLS = ("mqa", "mqa_split1", "mqa_split4", "sdpa_gqa", "sdpa_expand", "sdpa_repeat",
                          *WGMMA_PREFIX_ATTENTION)


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

# Candidates measured at load for each decoder GEMM kind (qkv feeds RoPE and gate_up has the GeGLU epilogue:
# no split-K there; o and down feed the residual norms, which sum split-K partials). The expert's K is 1024
# (qkv, gate_up), 2048 (o) and 4096 (down): the one-shot candidates split K into 1024-wide slices. One-shot with 8
# warps is not offered: on the H200 qkv takes 8.4 us against 3.9, gate_up 56 us (its two 16x1024 slices spill).
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
    """Launch configuration of flashrt_kernels/qkv_gemm_rope.py (the decoder QKV GEMM with the RoPE epilogue)."""

    block_p: int
    block_k: int
    stages: int
    warps: int = 4

    def __str__(self) -> str:
        return f"triton_rope(p{self.block_p},k{self.block_k},st{self.stages},w{self.warps})"


# Measured at load against the SKINNY_CANDIDATES["qkv"] GEMMs followed by the qkv_rope kernel.
ROPE_GEMM_CANDIDATES = [RopeGemmConfig(16, 128, 4), RopeGemmConfig(16, 128, 6), RopeGemmConfig(16, 256, 3),
                        RopeGemmConfig(32, 128, 4)]
