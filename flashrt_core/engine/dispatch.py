"""The dispatch table: ONE place that picks, per op, the implementation the engine runs.

Every op has a list of candidates in order of preference. A candidate runs only where its predicate holds for the
detected hardware and the switches leave it on; the first such candidate wins. Each choice can be pinned for A/B
tests and bug reports:

    FLASHRT_IMPL_<OP>=<impl>        pin one op (e.g. FLASHRT_IMPL_ATTENTION=math); unknown or unavailable -> error
    FLASHRT_DISABLE_<SWITCH>=1      turn one optimization off (switches: see `Switch`)
    FLASHRT_DISABLE_FAST_PATHS=1    everything off: the eager reference path runs
    FLASHRT_FP8=1                   ask for FP8 E4M3 prefix GEMMs (same as EngineOptions(fp8=True))
    FLASHRT_L2_PREFETCH=1           ask for the decoder's bulk L2 weight prefetch (EngineOptions(l2_prefetch=True))
    FLASHRT_WEIGHT_PREFETCH=1       ask for the decoder GEMMs' own-slice L2 prefetch (weight_prefetch=True)
    FLASHRT_DECODER_KEY_BLOCK=N     keys per split of a denoising step's attention (EngineOptions.decoder_key_block)
    FLASHRT_QKV_ROPE_ROWS=N         rows per program of the qkv_rope kernel (EngineOptions.qkv_rope_rows; 1 = one
                                    row per program, as before session 12)
    FLASHRT_DENOISE_STEP_BLOCK_D=N  the fused denoising-step kernels in two passes of N-wide blocks (256: before
                                    session 12) instead of one pass over the row (EngineOptions.denoise_step_block_d)
    FLASHRT_FP8_DECODER_WEIGHTS=1   ask for FP8 decoder GEMM weights (EngineOptions(fp8_decoder_weights=True)): the
                                    TMA GEMM candidates run in FP8 on wgmma (kernels/flashrt_kernels/smem_gemm_fp8.py), the Triton
                                    ones widen the weights to bf16 (weight-only)
    FLASHRT_DISABLE_SMEM_GEMM_FP8=1  with them, no FP8 TMA GEMM candidates: the tuning weighs the weight-only
                                    Triton GEMMs, the bf16 TMA GEMMs and the library GEMM (the A/B of the FP8 ones;
                                    before session 23 the TMA GEMMs were not offered with FP8 decoder weights)
    FLASHRT_FP8_SCALING=tensor|row  FP8 scale granularity (EngineOptions.fp8_scaling)
    FLASHRT_FP8_SCOPE=all|backbone|backbone_mlp   which wide GEMMs FP8 serves (EngineOptions.fp8_scope)
    FLASHRT_DISABLE_CHAIN_TUNING=1  pick the decoder GEMMs by their time alone, not inside the captured denoiser
    FLASHRT_CHAIN_TUNING_PASSES=N   at most N passes of the chain tuning (EngineOptions.chain_tuning_passes, 2)
    FLASHRT_CHAIN_TUNING_STARTS=N   the chain tuning's first pass run from the N fastest launch policies, the fastest
                                    end kept (EngineOptions.chain_tuning_starts; default 1: one start; opt-in,
                                    measured no faster on the H200 in session 17)
    FLASHRT_DISABLE_PDL_EARLY_TRIGGER=1  no denoiser kernel releases the next one at its start (launch policy "none")
    FLASHRT_DISABLE_FP8_FUSED_QUANT=1  FP8 down GEMM inputs quantized by their own kernel, not by the GeGLU kernel
    FLASHRT_DISABLE_SMEM_GEMM=1     no shared-memory (TMA, Gluon) decoder GEMM candidates in the tuning
    FLASHRT_DISABLE_SMEM_GEMM_ROWS=1  no shared-memory GEMM candidates at 17-64 rows (horizon 50), only up to 16
                                    (EngineOptions.smem_gemm_rows; FLASHRT_SMEM_GEMM_ROWS=0 does the same)
    FLASHRT_DISABLE_PREFIX_ATTENTION_TUNING=1  the prefix attention runs the mqa implementation, unmeasured
    FLASHRT_DISABLE_VISION_ATTENTION_TUNING=1  the vision attention runs on torch's own choice of SDPA backend
    FLASHRT_DISABLE_FUSED_PATCH_EMBED=1  the patch embedding as torch ops with an fp32 patch GEMM, not the patch rows
                                    of kernels/flashrt_kernels/patch_embed.py and the GEMM in the engine dtype (the older
                                    FLASHRT_FUSED_PATCH_EMBED=0 does the same)
    FLASHRT_DISABLE_FUSED_DENOISE_STEP=1  pi0.5's denoising-step ends as separate ops, not kernels/flashrt_kernels/denoise_step.py
                                    (FLASHRT_FUSED_DENOISE_STEP=0 does the same)
    FLASHRT_DISABLE_FUSED_DENOISE_STEP_PI0=1  pi0's step ends as separate ops, not kernels/flashrt_kernels/denoise_step.py
                                    time_mlp_in and step_out (EngineOptions.fused_denoise_step_pi0;
                                    FLASHRT_FUSED_DENOISE_STEP_PI0=0 does the same)
    FLASHRT_DISABLE_OVERLAP_FIRST_STEP=1  the first denoising step after the whole prefix, on one stream, not its
                                    layers beside the prefix's later layers on a second stream
                                    (EngineOptions.overlap_first_step; FLASHRT_OVERLAP_FIRST_STEP=0 does the same)
    FLASHRT_DECODER_ATTENTION_TUNING=1  the chain tuning also times the denoising step's attention in each form of
                                    rows per program (16, 32, 64) and keys per block (16, 32, 64) and keeps the
                                    fastest (EngineOptions.decoder_attention_tuning; opt-in, not yet run on a GPU)
    FLASHRT_TEXT_BUCKETS=16,32,...  the token-buffer lengths with a graph each (EngineOptions.text_buckets)
    FLASHRT_TUNING_CACHE=DIR        keep the load-time tuning's picks in DIR and reuse them at the next load of the
                                    same model, GPU, software and options (engine/tuning_cache.py); unset or "" = off
    FLASHRT_VISION_MLP_PAD=N        the vision MLP's width rounded up to a multiple of N at load (zero rows of fc1, zero
                                    columns of fc2: the same output; EngineOptions.vision_mlp_pad, default 128; 0: off)
    FLASHRT_PREFIX_ATTENTION_WGMMA=0  the prefix attention tuning leaves out kernels/flashrt_kernels/prefix_attention.py (wgmma; on by
                                    default where Gluon and an sm90+ GPU serve it)
    FLASHRT_PREFIX_ATTENTION_SPLIT=1  the prefix attention tuning also times kernels/flashrt_kernels/prefix_attention.py's key-split
                                    forms (2 or 3 programs per 64 query rows, merged after; opt-in)
    FLASHRT_DENOISE_LAYER=1         pi0.5's expert layers each in one persistent launch with grid barriers between its
                                    eight phases (kernels/flashrt_kernels/denoise_layer.py; EngineOptions.denoise_layer, opt-in:
                                    measured slower on the H200); FLASHRT_IMPL_DENOISE_LAYER=phases: a launch per
                                    phase instead, =grid_prefetch: with an L2 prefetch of the later weight tiles
    FLASHRT_FP8_FAST_ACCUM=1        the FP8 GEMMs accumulate in the tensor cores over the whole K loop (less exact for
                                    long K; EngineOptions.fp8_fast_accum, opt-in: no gain measured in the engine)
    FLASHRT_HOST_WAIT=sync|poll|warm  how predict waits for the GPU: the stream's synchronize, an event polled with
                                    the GIL given up between queries, or polled while the host rehearses its own
                                    steps every 0.5 ms (EngineOptions.host_wait; engine/host_wait.py)

The same switches exist as `EngineOptions` fields; environment variables win over the fields.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from .hardware import CPU, Hardware, Vendor

log = logging.getLogger(__name__)


# how predict waits for the GPU (engine/host_wait.py): the stream's synchronize, an event polled, or an event polled
# while the host rehearses its own steps
HOST_WAITS = ("sync", "poll", "warm")

# EngineOptions.chain_tuning_starts: one start per launch policy at most (len(ops.LAUNCH_POLICIES); a test holds
# them equal)
CHAIN_TUNING_MAX_STARTS = 6


class Op(str, enum.Enum):
    EXECUTOR = "executor"            # how predict runs: captured graph, eager engine, or the reference path
    ATTENTION = "attention"          # vision attention (no mask)
    MQA = "mqa"                      # masked one-KV-head attention of the prefix and the denoise steps
    GEMM_PREFIX = "gemm_prefix"      # the wide GEMMs (vision, prefix: hundreds of rows)
    GEMM_DECODER = "gemm_decoder"    # the 10-50-row GEMMs of the action expert
    FP8_FORMAT = "fp8_format"        # E4M3 flavour when FP8 GEMMs run
    NORM = "norm"                    # residual add + RMSNorm (Gemma, folded weight)
    ADA_NORM = "ada_norm"            # gated residual + adaRMSNorm (pi0.5 expert)
    GEGLU = "geglu"                  # gelu_tanh(gate) * up on the merged gate/up output
    QKV_ROPE = "qkv_rope"            # QKV split + RoPE + KV-cache write
    DECODER_QKV = "decoder_qkv"      # where the action expert's RoPE runs: in the attention, the GEMM, or its own
    EULER = "euler"                  # x <- x + dt * (v + b)
    KERNEL_LAUNCH = "kernel_launch"  # how the Triton kernels of one predict follow each other
    L2_PREFETCH = "l2_prefetch"      # the decoder's QKV GEMM prefetches the layer's later weights into L2
    WEIGHT_PREFETCH = "weight_prefetch"  # each decoder GEMM program prefetches its own weight slice into L2 first
    DECODER_WEIGHTS = "decoder_weights"  # the action expert's GEMM weights: bf16, or weight-only FP8 E4M3
    VISION_GELU = "vision_gelu"      # the vision MLP's bias + GELU: in the fc1 GEMM's epilogue or a kernel of its own
    DECODER_TUNING = "decoder_tuning"  # how the decoder GEMMs' launch configurations are picked at load
    FP8_INPUT_QUANT = "fp8_input_quant"  # who quantizes a per-tensor FP8 down GEMM's input: the GeGLU kernel or its own
    SMEM_GEMM = "smem_gemm"          # decoder GEMMs that stage their weights in shared memory before the PDL wait
    PREFIX_ATTENTION = "prefix_attention"  # the backbone's attention: the mqa kernel, or the faster of it and SDPA
    VISION_ATTENTION = "vision_attention"  # the SDPA backend of the vision attention: torch's choice or the fastest
    PATCH_EMBED = "patch_embed"      # uint8 views -> patch rows -> patch GEMM: one kernel + engine-dtype GEMM, or torch
    ADA_NORM_FOLD = "ada_norm_fold"  # pi0.5 expert's adaRMSNorms: in the GEMMs around them, or kernels of their own
    DENOISE_STEP = "denoise_step"    # pi0.5 step ends: input projection + first norm, final norm + output + Euler
    DENOISE_LAYER = "denoise_layer"  # pi0.5 expert layer: one persistent launch, a launch per phase, or separate ops


class Switch(str, enum.Enum):
    """An optimization that can be turned off: FLASHRT_DISABLE_<value>=1, or the EngineOptions field named by the
    value in lower case."""

    CUDA_GRAPH = "CUDA_GRAPH"            # capture predict as one graph
    TRITON = "TRITON"                    # fused Triton kernels
    FUSED_WEIGHTS = "FUSED_WEIGHTS"      # fold norm scales into GEMMs, merge QKV and gate/up
    FLASH_ATTENTION = "FLASH_ATTENTION"  # fused SDPA kernels (else the math attention)
    FP8 = "FP8"                          # FP8 prefix GEMMs (also needs fp8=True / FLASHRT_FP8=1)
    PDL = "PDL"                          # programmatic dependent launch between Triton kernels (sm90+)
    L2_PREFETCH = "L2_PREFETCH"          # bulk L2 prefetch of the expert's weights (sm90+; also needs l2_prefetch)
    ROPE_IN_ATTENTION = "ROPE_IN_ATTENTION"  # the denoiser's attention applies RoPE itself (no qkv_rope launch)
    GEMM_EPILOGUE = "GEMM_EPILOGUE"      # bias + GELU of the vision fc1 in the cuBLASLt/hipBLASLt GEMM epilogue
    WEIGHT_PREFETCH = "WEIGHT_PREFETCH"  # decoder GEMMs prefetch their own weights into L2 before the PDL wait
    FP8_DECODER_WEIGHTS = "FP8_DECODER_WEIGHTS"  # weight-only FP8 for the decoder GEMMs (also needs asking for)
    CHAIN_TUNING = "CHAIN_TUNING"        # decoder GEMM configurations timed inside the captured denoiser
    PDL_EARLY_TRIGGER = "PDL_EARLY_TRIGGER"  # PDL kernels let the next kernel launch at their start (tuned per site)
    FP8_FUSED_QUANT = "FP8_FUSED_QUANT"  # the GeGLU kernel writes the FP8 input of the down GEMM
    SMEM_GEMM = "SMEM_GEMM"              # the TMA / shared-memory decoder GEMM candidates
    PREFIX_ATTENTION_TUNING = "PREFIX_ATTENTION_TUNING"  # the prefix attention picked by its time at load
    VISION_ATTENTION_TUNING = "VISION_ATTENTION_TUNING"  # the vision attention's SDPA backend picked by its time
    FUSED_PATCH_EMBED = "FUSED_PATCH_EMBED"  # kernels/flashrt_kernels/patch_embed.py + the patch GEMM in the engine dtype
    ADA_NORM_FOLD = "ADA_NORM_FOLD"      # the expert's adaRMSNorms folded into the shared-memory GEMMs around them
    FUSED_DENOISE_STEP = "FUSED_DENOISE_STEP"  # kernels/flashrt_kernels/denoise_step.py at both ends of each pi0.5 denoising step
    FUSED_DENOISE_STEP_PI0 = "FUSED_DENOISE_STEP_PI0"  # ... and of each pi0 step (time_mlp_in, step_out)
    SMEM_GEMM_ROWS = "SMEM_GEMM_ROWS"    # the shared-memory decoder GEMM candidates at 17-64 rows (horizon 50)
    DENOISE_LAYER = "DENOISE_LAYER"      # kernels/flashrt_kernels/denoise_layer.py: each pi0.5 expert layer in one launch (opt-in)
    OVERLAP_FIRST_STEP = "OVERLAP_FIRST_STEP"  # the first denoising step beside the prefix, two streams
    DECODER_ATTENTION_TUNING = "DECODER_ATTENTION_TUNING"  # the step attention's row / key blocks timed (opt-in)
    FUSED_MLP = "FUSED_MLP"              # kernels/flashrt_kernels/smem_mlp.py: each expert MLP in one launch (opt-in)
    SMEM_GEMM_FP8 = "SMEM_GEMM_FP8"      # with fp8_decoder_weights: the TMA GEMM candidates in FP8 (smem_gemm_fp8)


# The token-buffer lengths the engine captures a graph for (max_token_len is always added): every 16 tokens up to
# 176. A prompt pays for the padding of its bucket; measured on the H200 (pi0.5, 2 views,
# docs/benchmarks/text_buckets_h200_2026-12-01.md) a replay costs ~0.3 ms more per 64 tokens of buffer (bf16), so
# the old (64, 128) made every prompt of 129-200 tokens, pi0.5's discretized-state prompts among them, pay for 200:
# 0.4 ms more than at 144 or 160. 192 is left out: measured slower than 200 in bf16 and FP8 (12.03 vs 11.54 ms,
# 10.33 vs 10.18 ms). Each bucket costs one capture (0.4-3 s) when it is first used or warmed up.
DEFAULT_TEXT_BUCKETS = tuple(range(16, 177, 16))

# Which wide GEMMs FP8 serves: every vision and backbone GEMM, the backbone only, or only the backbone's MLP
# (gate/up and down: ~85% of the backbone's FLOPs; attention projections and the vision tower stay bf16).
FP8_SCOPES = ("all", "backbone", "backbone_mlp")


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings. Every fast path can be turned off here or by its environment variable."""

    cuda_graph: bool = True
    triton: bool = True
    fused_weights: bool = True
    flash_attention: bool = True
    fp8: bool = False                        # opt-in: FP8 E4M3 for the wide prefix/vision GEMMs
    fp8_scaling: str = "tensor"              # "tensor": static per-tensor scales; "row": per-token/per-channel
    fp8_scope: str = "backbone_mlp"          # FP8 GEMMs: "backbone_mlp" (passes the accuracy gate), "backbone"
                                             # (+ attention projections), "all" (+ the vision tower)
    fp8_fast_accum: bool = False             # opt-in (no gain in the engine, session 14): the FP8 GEMMs accumulate
                                             # in the tensor cores over the whole K loop (_scaled_mm use_fast_accum)
    pdl: bool = True                         # programmatic dependent launch (NVIDIA sm90+)
    l2_prefetch: bool = False                # opt-in (measured slower): bulk L2 prefetch of the expert's weights
    rope_in_attention: bool = True           # denoiser: RoPE inside the attention kernel, read from the QKV output
    gemm_epilogue: bool = True               # vision fc1: bias + GELU (tanh) in the BLAS GEMM's epilogue
    weight_prefetch: bool = False            # opt-in (measured slower): decoder GEMMs prefetch their own weights
    decoder_key_block: int = 0               # keys per split of a denoising step's attention; 0: the kernels' own
    qkv_rope_rows: int = 0                   # rows per qkv_rope program; 0: the kernel's own (8 from 256 rows)
    denoise_step_block_d: int = 0            # the fused step kernels' row blocks; 0: the whole row in one pass
    vision_mlp_pad: int = 128                # the vision MLP width (4304) rounded up to a multiple of this at load
                                             # (zero rows / columns: the same output); 0: as is
    fp8_decoder_weights: bool = False        # opt-in: E4M3 decoder GEMM weights, one scale per row (the Triton
                                             # GEMMs weight-only: measured slower, session 6; with the TMA GEMMs
                                             # in FP8 too, smem_gemm_fp8: a tie, sessions 23-24)
    smem_gemm_fp8: bool = True               # with fp8_decoder_weights: kernels/flashrt_kernels/smem_gemm_fp8.py (E4M3 x rows
                                             # quantized in the kernel, wgmma in FP8) among the decoder candidates
    chain_tuning: bool = True                # decoder GEMM configurations timed where they run (the denoiser)
    chain_tuning_passes: int = 2             # the chain tuning repeats until a pass changes nothing, at most this
    chain_tuning_starts: int = 1             # opt-in (measured no faster, session 17) > 1: its first pass from
                                             # that many launch policies, the fastest end kept (_chain_starts)
    pdl_early_trigger: bool = True           # denoiser kernels that release the next one at their start (tuned)
    fp8_fused_quant: bool = True             # FP8 path: the GeGLU kernel quantizes the down GEMM's input
    smem_gemm: bool = True                   # kernels/flashrt_kernels/smem_gemm.py candidates in the decoder GEMM tuning
    prefix_attention_tuning: bool = True     # the prefix attention: the mqa kernel or SDPA, whichever is faster
    vision_attention_tuning: bool = True     # the vision attention: the fastest SDPA backend at its shape
    fused_patch_embed: bool = True           # kernels/flashrt_kernels/patch_embed.py rows + the patch GEMM in the engine dtype
    ada_norm_fold: bool = False              # opt-in (measured slower): pi0.5's adaRMSNorms in the TMA GEMMs
    fused_denoise_step: bool = True          # kernels/flashrt_kernels/denoise_step.py (pi0.5): the step ends, 2 launches not 7
    fused_denoise_step_pi0: bool = True      # pi0's step ends fused too (time_mlp_in + one few-row GEMM,
                                             # step_out), 3 launches not 12 (session 17: -0.15 ms at horizon 50)
    split_k_qkv: bool = False                # opt-in (measured slower): a split-K QKV candidate the attention sums
    smem_gemm_rows: bool = True              # kernels/flashrt_kernels/smem_gemm.py candidates at 17-64 rows too (horizon-50
                                             # steps), x streamed through a ring (session 17: -0.25 / -0.49 ms)
    prefix_attention_wgmma: bool = True      # kernels/flashrt_kernels/prefix_attention.py (Hopper wgmma) joins the prefix
                                             # attention tuning where it serves the GPU
    prefix_attention_split: bool = False     # opt-in (measured slower, session 15: 24-26 us against 17.6 us for
                                             # wgmma): its key-split forms join the tuning too
    overlap_first_step: bool = True          # the first denoising step's layer i beside the prefix's layers
                                             # after i, two streams (forward.forward_overlapped; session 18:
                                             # -0.22 ms FP8, -0.19 ms bf16 per predict on average over two A/B
                                             # pairs, -0.51 ms at horizon 50); not with denoise_layer's grid form
    decoder_attention_tuning: bool = False   # opt-in (no gain, session 20): the chain tuning also times the
                                             # denoising step's attention forms (rows per program x keys per
                                             # block, Ops.decoder_attention_forms) and keeps the fastest
    denoise_layer: bool = False              # opt-in (measured slower, session 15): kernels/flashrt_kernels/denoise_layer.py, each
                                             # pi0.5 expert layer one persistent launch (8 phases, grid barriers)
    fused_mlp: bool = False                  # opt-in (measured slower, session 22): kernels/flashrt_kernels/smem_mlp.py, each
                                             # expert MLP (gate/up, GeGLU, down) one launch where it serves the rows
    fast_paths: bool = True                  # False: the reference path, whatever else is set
    tuning_cache: str = ""                   # a directory: the load-time tuning's picks kept there and reused
                                             # (engine/tuning_cache.py); "" = measure at every load
    host_wait: str = "sync"                  # how predict waits for the GPU: "sync", "poll" or "warm" (opt-in:
                                             # the host's steps rehearsed during the wait; engine/host_wait.py)
    text_buckets: tuple[int, ...] = DEFAULT_TEXT_BUCKETS  # token-buffer lengths with a graph each (max_token_len
                                                          # is added)
    overrides: Mapping[str, str] = field(default_factory=dict)  # op name -> impl name

    def __post_init__(self) -> None:
        if not isinstance(self.tuning_cache, str):
            raise ValueError(f"tuning_cache must be a directory path as a str ('' = off), got {self.tuning_cache!r}")
        if self.host_wait not in HOST_WAITS:
            raise ValueError(f"host_wait must be one of {HOST_WAITS}, got {self.host_wait!r}")
        if self.fp8_scaling not in ("tensor", "row"):
            raise ValueError(f"fp8_scaling must be 'tensor' or 'row', got {self.fp8_scaling!r}")
        if self.fp8_scope not in FP8_SCOPES:
            raise ValueError(f"fp8_scope must be one of {FP8_SCOPES}, got {self.fp8_scope!r}")
        if self.decoder_key_block not in (0, 16, 32, 64):
            raise ValueError(f"decoder_key_block must be 0 (default), 16, 32 or 64, got {self.decoder_key_block!r}")
        if self.qkv_rope_rows not in (0, 1, 2, 4, 8, 16):
            raise ValueError(f"qkv_rope_rows must be 0 (default), 1, 2, 4, 8 or 16, got {self.qkv_rope_rows!r}")
        if self.denoise_step_block_d not in (0, 64, 128, 256, 512, 1024, 2048):
            raise ValueError(f"denoise_step_block_d must be 0 (default) or a power of two from 64 to 2048, got "
                             f"{self.denoise_step_block_d!r}")
        if not (isinstance(self.vision_mlp_pad, int) and self.vision_mlp_pad >= 0 and self.vision_mlp_pad % 8 == 0):
            raise ValueError(f"vision_mlp_pad must be 0 (off) or a positive multiple of 8, got {self.vision_mlp_pad!r}")
        if not (isinstance(self.chain_tuning_passes, int) and 1 <= self.chain_tuning_passes <= 8):
            raise ValueError(f"chain_tuning_passes must be an int from 1 to 8, got {self.chain_tuning_passes!r}")
        if not (isinstance(self.chain_tuning_starts, int) and 1 <= self.chain_tuning_starts <= CHAIN_TUNING_MAX_STARTS):
            raise ValueError(f"chain_tuning_starts must be an int from 1 to {CHAIN_TUNING_MAX_STARTS} (the launch "
                             f"policies), got {self.chain_tuning_starts!r}")
        if any((not isinstance(b, int)) or b <= 0 for b in self.text_buckets):
            raise ValueError(f"text_buckets must be positive ints, got {self.text_buckets!r}")
        for op, impl in self.overrides.items():
            if op not in {o.value for o in Op}:
                raise ValueError(f"override for unknown op {op!r}; ops: {[o.value for o in Op]}")
            if impl not in {c.name for c in TABLE[Op(op)]}:
                raise ValueError(f"unknown implementation {impl!r} for op {op!r}; "
                                 f"choices: {[c.name for c in TABLE[Op(op)]]}")

    def switch_on(self, switch: Switch) -> bool:
        """Whether an optimization is on: its field (the switch's name in lower case) and fast_paths."""
        return self.fast_paths and getattr(self, switch.value.lower())

    @classmethod
    def from_env(cls, base: "EngineOptions | None" = None, env: Mapping[str, str] | None = None) -> "EngineOptions":
        """`base` with the FLASHRT_* environment variables applied on top."""
        base = base or cls()
        env = os.environ if env is None else env

        def flag(name: str) -> bool | None:
            raw = env.get(name)
            if raw is None or raw == "":
                return None
            if raw not in ("0", "1"):
                raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
            return raw == "1"

        changes: dict = {}
        for sw in Switch:                                  # FLASHRT_DISABLE_<SWITCH> -> the field <switch>
            if flag(f"FLASHRT_DISABLE_{sw.value}"):
                changes[sw.value.lower()] = False
        for name, attr in (("FLASHRT_FP8", "fp8"), ("FLASHRT_L2_PREFETCH", "l2_prefetch"),    # opt-ins; a
                           ("FLASHRT_WEIGHT_PREFETCH", "weight_prefetch"),                   # DISABLE wins
                           ("FLASHRT_FP8_DECODER_WEIGHTS", "fp8_decoder_weights"),
                           ("FLASHRT_FUSED_PATCH_EMBED", "fused_patch_embed"),   # the default now: 0 turns it off
                           ("FLASHRT_ADA_NORM_FOLD", "ada_norm_fold"),
                           ("FLASHRT_FUSED_DENOISE_STEP", "fused_denoise_step"),  # the default: 0 = off
                           ("FLASHRT_FUSED_DENOISE_STEP_PI0", "fused_denoise_step_pi0"),  # the default: 0 = off
                           ("FLASHRT_SPLIT_K_QKV", "split_k_qkv"),
                           ("FLASHRT_SMEM_GEMM_ROWS", "smem_gemm_rows"),  # the default: 0 = off
                           ("FLASHRT_PREFIX_ATTENTION_WGMMA", "prefix_attention_wgmma"),  # the default: 0 = off
                           ("FLASHRT_PREFIX_ATTENTION_SPLIT", "prefix_attention_split"),
                           ("FLASHRT_FP8_FAST_ACCUM", "fp8_fast_accum"),
                           ("FLASHRT_DENOISE_LAYER", "denoise_layer"),
                           ("FLASHRT_OVERLAP_FIRST_STEP", "overlap_first_step"),   # the default: 0 = off
                           ("FLASHRT_DECODER_ATTENTION_TUNING", "decoder_attention_tuning"),
                           ("FLASHRT_FUSED_MLP", "fused_mlp")):
            if flag(name) is not None and attr not in changes:
                changes[attr] = flag(name)
        if env.get("FLASHRT_TUNING_CACHE") is not None:          # a directory; "" turns it off
            changes["tuning_cache"] = env["FLASHRT_TUNING_CACHE"]
        if env.get("FLASHRT_HOST_WAIT"):
            changes["host_wait"] = env["FLASHRT_HOST_WAIT"]
        if env.get("FLASHRT_TEXT_BUCKETS"):
            raw = env["FLASHRT_TEXT_BUCKETS"]
            parts = [p.strip() for p in raw.split(",")]
            if not all(p.isdigit() for p in parts):
                raise ValueError(f"FLASHRT_TEXT_BUCKETS must be comma-separated token counts, got {raw!r}")
            changes["text_buckets"] = tuple(int(p) for p in parts)
        if env.get("FLASHRT_FP8_SCALING"):
            changes["fp8_scaling"] = env["FLASHRT_FP8_SCALING"]
        if env.get("FLASHRT_FP8_SCOPE"):
            changes["fp8_scope"] = env["FLASHRT_FP8_SCOPE"]
        for name, attr, allowed in (("FLASHRT_DECODER_KEY_BLOCK", "decoder_key_block", "16, 32 or 64"),
                                    ("FLASHRT_QKV_ROPE_ROWS", "qkv_rope_rows", "1, 2, 4, 8 or 16"),
                                    ("FLASHRT_DENOISE_STEP_BLOCK_D", "denoise_step_block_d",
                                     "a power of two from 64 to 2048"),
                                    ("FLASHRT_CHAIN_TUNING_PASSES", "chain_tuning_passes", "an int from 1 to 8"),
                                    ("FLASHRT_CHAIN_TUNING_STARTS", "chain_tuning_starts",
                                     f"an int from 1 to {CHAIN_TUNING_MAX_STARTS}"),
                                    ("FLASHRT_VISION_MLP_PAD", "vision_mlp_pad", "0 or a positive multiple of 8")):
            raw = env.get(name)
            if raw:                                       # integer options; the field checks the range
                if not raw.isdigit():
                    raise ValueError(f"{name} must be {allowed}, got {raw!r}")
                changes[attr] = int(raw)
        if flag("FLASHRT_DISABLE_FAST_PATHS"):
            changes["fast_paths"] = False
        overrides = dict(base.overrides)
        for op in Op:
            impl = env.get(f"FLASHRT_IMPL_{op.value.upper()}")
            if impl:
                overrides[op.value] = impl
        changes["overrides"] = overrides
        return replace(base, **changes)


@dataclass(frozen=True)
class Candidate:
    """One implementation of an op: `usable(hw, options)` says whether it can run and is switched on."""

    name: str
    usable: Callable[[Hardware, EngineOptions], bool]
    why: str  # shown in logs / docs: where this implementation applies


def _gpu(hw: Hardware, o: EngineOptions) -> bool:
    return hw.is_gpu and not hw.reference_only and o.fast_paths


def _triton(hw: Hardware, o: EngineOptions) -> bool:
    from .kernel_import import triton_available
    return _gpu(hw, o) and o.switch_on(Switch.TRITON) and triton_available()


def _nvidia_sm90_plus(hw: Hardware) -> bool:
    """Hopper and later: griddepcontrol (PDL) and cp.async.bulk."""
    return hw.vendor is Vendor.NVIDIA and hw.sm is not None and hw.sm >= 90


def _nvidia_hopper(hw: Hardware) -> bool:
    """Hopper (sm90): wgmma, which the Gluon kernels (kernels/flashrt_kernels/smem_gemm.py, kernels/flashrt_kernels/prefix_attention.py) run on;
    Blackwell has tcgen05 instead, so they are not offered there."""
    return hw.vendor is Vendor.NVIDIA and hw.sm is not None and hw.sm // 10 == 9


def _gluon_available() -> bool:
    from .kernel_import import load_kernels, triton_available
    return triton_available() and bool(getattr(load_kernels(), "HAVE_GLUON", False))


def _fp8_capable(hw: Hardware) -> bool:
    if hw.vendor is Vendor.NVIDIA:
        return hw.sm is not None and hw.sm >= 89
    if hw.vendor is Vendor.AMD:
        return hw.gfx_arch in ("gfx942", "gfx950")
    return False


_ALWAYS = lambda hw, o: True  # noqa: E731

TABLE: dict[Op, tuple[Candidate, ...]] = {
    Op.EXECUTOR: (
        Candidate("graph", lambda hw, o: _gpu(hw, o) and o.switch_on(Switch.CUDA_GRAPH),
                  "GPU: whole predict captured as one CUDA/HIP graph"),
        Candidate("eager_engine", _gpu, "GPU with graphs off: same engine ops, launched one by one"),
        Candidate("reference", _ALWAYS, "CPU, hardware='reference' or fast paths off: the fp32/bf16 reference"),
    ),
    Op.ATTENTION: (
        Candidate("sdpa", lambda hw, o: _gpu(hw, o) and o.switch_on(Switch.FLASH_ATTENTION),
                  "torch SDPA fused kernels (flash attention, no mask)"),
        Candidate("math", _ALWAYS, "matmul + fp32 softmax + matmul"),
    ),
    Op.MQA: (
        Candidate("triton", _triton, "kernels/flashrt_kernels/attention.py: flash-style, key mask as a vector, split over keys"),
        Candidate("sdpa", lambda hw, o: _gpu(hw, o) and o.switch_on(Switch.FLASH_ATTENTION),
                  "torch SDPA with a dense additive mask (cuDNN / memory-efficient)"),
        Candidate("math", _ALWAYS, "matmul + fp32 softmax + matmul, dense mask"),
    ),
    Op.GEMM_PREFIX: (
        Candidate("fp8", lambda hw, o: _gpu(hw, o) and o.switch_on(Switch.FP8) and _fp8_capable(hw),
                  "torch._scaled_mm, E4M3 per-tensor static scales (sm89+, gfx942, gfx950)"),
        Candidate("bf16", _ALWAYS, "cuBLAS / hipBLASLt through torch.matmul"),
    ),
    Op.GEMM_DECODER: (
        Candidate("triton", _triton, "kernels/flashrt_kernels/skinny_gemm.py (GeGLU epilogue, split-K into the norms); per GEMM "
                  "shape only where it measures faster than cuBLAS at load"),
        Candidate("bf16", _ALWAYS, "cuBLAS / hipBLASLt: FP8 is slower at 10-50 rows (seed project finding)"),
        Candidate("fp8", lambda hw, o: _gpu(hw, o) and _fp8_capable(hw), "only when pinned, for A/B tests"),
    ),
    Op.FP8_FORMAT: (
        Candidate("e4m3fnuz", lambda hw, o: hw.vendor is Vendor.AMD and hw.gfx_arch == "gfx942",
                  "MI300X: FNUZ E4M3"),
        Candidate("e4m3fn", _ALWAYS, "OCP E4M3 (NVIDIA sm89+, MI350X gfx950)"),
    ),
    Op.NORM: (
        Candidate("triton", _triton, "kernels/flashrt_kernels/residual_norm.py"),
        Candidate("torch", _ALWAYS, "plain torch ops"),
    ),
    Op.ADA_NORM: (
        Candidate("triton", _triton, "kernels/flashrt_kernels/ada_rms_norm.py"),
        Candidate("torch", _ALWAYS, "plain torch ops"),
    ),
    Op.GEGLU: (
        Candidate("triton", _triton, "kernels/flashrt_kernels/geglu.py"),
        Candidate("torch", _ALWAYS, "plain torch ops"),
    ),
    Op.QKV_ROPE: (
        Candidate("triton", _triton, "kernels/flashrt_kernels/qkv_rope.py"),
        Candidate("torch", _ALWAYS, "plain torch ops"),
    ),
    Op.EULER: (
        Candidate("triton", _triton, "kernels/flashrt_kernels/euler.py"),
        Candidate("torch", _ALWAYS, "plain torch ops"),
    ),
    Op.DECODER_QKV: (
        Candidate("rope_in_attention", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.ROPE_IN_ATTENTION),
                  "the QKV GEMM writes raw Q/K/V; kernels/flashrt_kernels/attention.py decoder_attention applies RoPE and the q scale "
                  "to the queries and the suffix keys itself (no qkv_rope launch, no suffix KV-cache write); needs "
                  "mqa=triton, else the engine runs `separate`"),
        Candidate("fused_rope", _triton, "kernels/flashrt_kernels/qkv_gemm_rope.py: RoPE, q scale and KV write in the QKV GEMM's "
                  "epilogue; kept at load only where it measures faster than the GEMM + qkv_rope pair"),
        Candidate("separate", _ALWAYS, "the decoder GEMM, then the qkv_rope op"),
    ),
    Op.KERNEL_LAUNCH: (
        Candidate("pdl_early", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.PDL)
                  and o.switch_on(Switch.PDL_EARLY_TRIGGER) and o.switch_on(Switch.CHAIN_TUNING)
                  and _nvidia_sm90_plus(hw),
                  "programmatic dependent launch where chosen Triton kernels let the next one launch at their start "
                  "(kernels/flashrt_kernels/_triton.py release_dependents), not after their wait, so the kernel ahead can be "
                  "resident and streaming its weights: the chain tuning times the denoiser sites of each "
                  "ops.LAUNCH_POLICIES entry ('none' among them) and keeps the fastest (NVIDIA sm90+)"),
        Candidate("pdl", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.PDL) and _nvidia_sm90_plus(hw),
                  "programmatic dependent launch: a Triton kernel starts while the one before it finishes, "
                  "streams its weights, then waits for its inputs (griddepcontrol, NVIDIA sm90+)"),
        Candidate("stream", _ALWAYS, "plain stream order: each kernel starts when the one before it has ended"),
    ),
    Op.L2_PREFETCH: (
        Candidate("bulk", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.L2_PREFETCH) and _nvidia_sm90_plus(hw),
                  "kernels/flashrt_kernels/l2_prefetch.py: the decoder's Triton QKV GEMM prefetches the rest of the layer's and the "
                  "next layer's QKV weights into L2 (cp.async.bulk.prefetch.L2, NVIDIA sm90+); opt-in: measured "
                  "slower on the H200"),
        Candidate("none", _ALWAYS, "every GEMM reads its weights when it runs"),
    ),
    Op.WEIGHT_PREFETCH: (
        Candidate("own_slice", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.WEIGHT_PREFETCH)
                  and o.switch_on(Switch.PDL) and _nvidia_sm90_plus(hw),
                  "kernels/flashrt_kernels/skinny_gemm.py: every program of a decoder Triton GEMM issues cp.async.bulk.prefetch.L2 "
                  "for its own weight rows before its PDL wait, so they stream into L2 while the kernel ahead "
                  "runs (NVIDIA sm90+, with PDL); opt-in: measured slower on the H200"),
        Candidate("none", _ALWAYS, "each program streams its weights from HBM after the wait"),
    ),
    Op.DECODER_WEIGHTS: (
        Candidate("fp8", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.FP8_DECODER_WEIGHTS) and _fp8_capable(hw),
                  "E4M3 weights (one scale per row, fp8.quantize_expert_weights): half the bytes. The Triton "
                  "decoder GEMMs widen them to bf16 in registers (weight-only; measured slower on the H200, session "
                  "6); the TMA GEMM candidates (kernels/flashrt_kernels/smem_gemm_fp8.py, with smem_gemm_fp8 on, NVIDIA Hopper) "
                  "quantize their x rows to E4M3 (per row, in the kernel) and multiply on wgmma in FP8; opt-in"),
        Candidate("bf16", _ALWAYS, "the prepared bf16 weights"),
    ),
    Op.PATCH_EMBED: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.FUSED_PATCH_EMBED),
                  "each present uint8 view at the model's image size becomes its patch rows in the engine dtype in "
                  "one kernels/flashrt_kernels/patch_embed.py launch (HWC gather, scaling to [-1, 1]; other sizes are resized as "
                  "before, then converted to the rows in one copy); the patch GEMM runs in the "
                  "engine dtype (rows padded to a multiple of 8 columns) and one add puts the position embedding "
                  "and the bias (summed at load) on it; measured on the H200 (run 30): -0.08 ms bf16 per predict, "
                  "the vision phase -0.05 to -0.07 ms"),
        Candidate("reference", _ALWAYS, "torch: permute, float conversion and scaling per view, the patch "
                  "reshape, an fp32 GEMM with its bias, then the position embedding"),
    ),
    Op.ADA_NORM_FOLD: (
        Candidate("gemm_epilogue", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.ADA_NORM_FOLD)
                  and o.switch_on(Switch.SMEM_GEMM) and _nvidia_hopper(hw) and _gluon_available(),
                  "pi0.5's expert: each adaRMSNorm after the split-K O and down GEMMs runs in the GEMMs on either "
                  "side of it (kernels/flashrt_kernels/smem_gemm.py norm_out / norm_in): the last split program of each 64-column "
                  "tile writes the gated residual, x' = h * (1 + scale) and its rows' sums of squares; the QKV / "
                  "gate-up GEMM after it scales its rows by rsqrt(mean(h^2) + eps) and adds shift @ W^T "
                  "(precomputed per step and layer) in its epilogue: two launches fewer per layer. Applies where "
                  "every decoder GEMM kind is a shared-memory GEMM (at most 16 rows; NVIDIA sm90+); the first "
                  "norm of each step and the final norm keep their kernel. Opt-in: on the H200 (session 10, "
                  "tools/benchmark_ada_norm_fold.py) the denoise took 4.77 ms at best with it against 4.24 ms with "
                  "the separate norms, which overlap the next GEMM's weight stream under the early PDL triggers"),
        Candidate("separate", _ALWAYS, "kernels/flashrt_kernels/ada_rms_norm.py (or torch) between the GEMMs"),
    ),
    Op.DENOISE_STEP: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.FUSED_DENOISE_STEP),
                  "pi0.5: kernels/flashrt_kernels/denoise_step.py, one Triton kernel at each end of a denoising step: the action "
                  "input projection with the first adaRMSNorm, and the final adaRMSNorm with the output "
                  "projection and the Euler step (seven launches, two of them cuBLAS GEMMs outside the dependent-"
                  "launch chain, become two PDL kernels; fp32 throughout). The default since session 11: its full-size "
                  "gates pass (bf16, FP8) and on the H200 it saved 0.02-0.04 ms per denoise with the same picks "
                  "(tools/benchmark_denoise_step.py, session 10)"),
        Candidate("separate", _ALWAYS, "cast, input GEMM, copy and norm; norm, output GEMM and the Euler kernel"),
    ),
    Op.DENOISE_LAYER: (
        Candidate("grid", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.DENOISE_LAYER)
                  and hw.vendor is Vendor.NVIDIA,
                  "pi0.5's expert layer as one persistent launch of one program per SM (kernels/flashrt_kernels/denoise_layer.py): "
                  "eight phases (norm, QKV + RoPE, attention splits, their merge, O, norm, gate/up + GeGLU, down) "
                  "with a grid barrier (an atomic counter) between them instead of eight dependent launches; each "
                  "norm's shift passes through the GEMM after it as a bias. Opt-in: on the H200 (session 15) one "
                  "layer takes 27.9 us against 23.9 us for the tuned chain of separate kernels, the denoise 6.47 "
                  "ms against 4.54 ms; untested on ROCm, so offered on NVIDIA only"),
        Candidate("grid_prefetch", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.DENOISE_LAYER)
                  and _nvidia_sm90_plus(hw),
                  "the same, and each program bulk-prefetches into L2 the O, gate/up and down weight tiles it reads "
                  "later and its tile of the next layer's QKV weight (cp.async.bulk.prefetch.L2, sm90+); only when "
                  "pinned (FLASHRT_IMPL_DENOISE_LAYER=grid_prefetch): measured 5.4-7.4 us per layer slower than "
                  "`grid` (session 15)"),
        Candidate("phases", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.DENOISE_LAYER),
                  "the same kernel, one launch per phase (stream order in place of the grid barriers): the "
                  "barriers' A/B and the form Triton's CPU interpreter runs; untested on ROCm GPUs"),
        Candidate("separate", _ALWAYS, "the layer's norms, GEMMs and attention as separate ops (the tuned chain)"),
    ),
    Op.VISION_GELU: (
        Candidate("gemm_epilogue", lambda hw, o: _gpu(hw, o) and o.switch_on(Switch.GEMM_EPILOGUE),
                  "torch._addmm_activation: bias + tanh GELU in the cuBLASLt / hipBLASLt epilogue of the bf16 fc1 "
                  "GEMM (an FP8 fc1 keeps the separate GELU)"),
        Candidate("separate", _ALWAYS, "the fc1 GEMM with its bias, then torch's tanh GELU"),
    ),
    Op.DECODER_TUNING: (
        Candidate("chain", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.CHAIN_TUNING),
                  "after timing each decoder GEMM kind alone, each kind's candidates are timed again inside the "
                  "captured denoiser (norms, attention and the other GEMMs around them, as a predict runs them) "
                  "and the fastest there is kept"),
        Candidate("isolated", _ALWAYS, "each decoder GEMM kind timed alone over the expert's layers"),
    ),
    Op.FP8_INPUT_QUANT: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.FP8_FUSED_QUANT),
                  "a per-tensor FP8 down GEMM's input is quantized by the GeGLU kernel that produces it "
                  "(kernels/flashrt_kernels/geglu.py with an FP8 out): no bf16 activation written and read back, no quantization "
                  "launch; row-wise FP8 keeps its per-token quantization kernel"),
        Candidate("separate", _ALWAYS, "the GeGLU output in bf16, then kernels/flashrt_kernels/fp8_quant.py"),
    ),
    Op.SMEM_GEMM: (
        Candidate("tma", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.SMEM_GEMM) and _nvidia_hopper(hw)
                  and _gluon_available(),
                  "kernels/flashrt_kernels/smem_gemm.py (Triton Gluon): each program's whole weight slice goes to shared memory by "
                  "TMA before the PDL wait, and the product runs on wgmma with the weights as the 64-row side; "
                  "offered to the decoder GEMM tuning beside the Triton and library GEMMs (NVIDIA Hopper: wgmma)"),
        Candidate("none", _ALWAYS, "the decoder GEMM tuning picks among the Triton and library GEMMs"),
    ),
    Op.PREFIX_ATTENTION: (
        Candidate("measured", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.FLASH_ATTENTION)
                  and o.switch_on(Switch.PREFIX_ATTENTION_TUNING),
                  "at load, the prefix attention (bidirectional, one K/V head, key-padding mask) is timed as the mqa "
                  "kernel (heads stacked on the query axis, key splits + merge) and as torch SDPA (enable_gqa, "
                  "boolean key mask, torch's fused backend), graph-captured at the 2-view prefix length; the "
                  "faster runs"),
        Candidate("mqa", _ALWAYS, "the mqa implementation (Op.MQA), as the denoiser's attention"),
    ),
    Op.VISION_ATTENTION: (
        Candidate("measured", lambda hw, o: _gpu(hw, o) and o.switch_on(Switch.FLASH_ATTENTION)
                  and o.switch_on(Switch.VISION_ATTENTION_TUNING),
                  "at load, the vision attention (no mask, the views' heads as the batch) is timed on each of "
                  "torch's fused SDPA backends (flash, memory-efficient, cuDNN) and on torch's own choice, "
                  "graph-captured at the engine's shape and layout, and the fastest runs"),
        Candidate("default", _ALWAYS, "torch's own choice of SDPA backend (or the math attention when SDPA is off)"),
    ),
}


@dataclass(frozen=True)
class Dispatch:
    """The resolved table: op -> implementation name, for one hardware and one set of options."""

    hardware: Hardware
    options: EngineOptions
    choice: Mapping[Op, str]

    def __getitem__(self, op: Op) -> str:
        return self.choice[op]

    def summary(self) -> str:
        return ", ".join(f"{op.value}={impl}" for op, impl in self.choice.items())


def eager_cpu_dispatch(options: EngineOptions | None = None) -> Dispatch:
    """The graph engine's own ops, each in its plain-PyTorch implementation (every op's last candidate; the decoder
    GEMMs in bf16 semantics, the math attention), launched one by one on the CPU: the engine's forward, buffers and
    host path without a GPU (CPU tests, and the host steps of the GPU path timed on a CPU machine)."""
    choice = {op: candidates[-1].name for op, candidates in TABLE.items()}
    choice.update({Op.EXECUTOR: "eager_engine", Op.GEMM_DECODER: "bf16", Op.ATTENTION: "math"})
    return Dispatch(CPU, options or EngineOptions(), choice)


def resolve(hardware: Hardware, options: EngineOptions | None = None) -> Dispatch:
    """Pick one implementation per op. A pinned implementation that cannot run raises ValueError."""
    options = options or EngineOptions()
    choice: dict[Op, str] = {}
    for op, candidates in TABLE.items():
        pinned = options.overrides.get(op.value)
        if pinned is not None:
            cand = next(c for c in candidates if c.name == pinned)
            if not cand.usable(hardware, replace(options, **_pin_relaxed(op))):
                raise ValueError(f"{op.value}={pinned} was requested but cannot run on {hardware.describe()} "
                                 f"with these switches ({cand.why})")
            choice[op] = pinned
            continue
        choice[op] = next(c.name for c in candidates if c.usable(hardware, options))
    dispatch = Dispatch(hardware, options, choice)
    log.info("dispatch on %s: %s", hardware.describe(), dispatch.summary())
    return dispatch


def _pin_relaxed(op: Op) -> dict:
    """Pinning an FP8 GEMM implies asking for FP8; pinning the bulk prefetch implies asking for it."""
    if op in (Op.GEMM_PREFIX, Op.GEMM_DECODER):
        return {"fp8": True}
    return {"l2_prefetch": True} if op is Op.L2_PREFETCH else {}
