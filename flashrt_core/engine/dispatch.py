"""The dispatch table: ONE place that picks, per op, the implementation the engine runs.

Every op has a list of candidates in order of preference. A candidate runs only where its predicate holds for the
detected hardware and the switches leave it on; the first such candidate wins. Each choice can be pinned for A/B
tests and bug reports:

    FLASHRT_IMPL_<OP>=<impl>        pin one op (e.g. FLASHRT_IMPL_ATTENTION=math); unknown or unavailable -> error
    FLASHRT_DISABLE_<SWITCH>=1      turn one optimization off (switches: see `Switch`)
    FLASHRT_DISABLE_FAST_PATHS=1    everything off: the eager reference path runs
    FLASHRT_FP8=1                   ask for FP8 E4M3 GEMMs on the backbone's MLP (same as EngineOptions(fp8=True))
    FLASHRT_DISABLE_CHAIN_TUNING=1  pick the decoder GEMMs by their time alone, not inside the captured denoiser
    FLASHRT_CHAIN_TUNING_PASSES=N   at most N passes of the chain tuning (EngineOptions.chain_tuning_passes, 2)
    FLASHRT_DISABLE_PDL_EARLY_TRIGGER=1  no denoiser kernel releases the next one at its start (launch policy "none")
    FLASHRT_DISABLE_FP8_FUSED_QUANT=1  FP8 down GEMM inputs quantized by their own kernel, not by the GeGLU kernel
    FLASHRT_DISABLE_SMEM_GEMM=1     no shared-memory (TMA, Gluon) decoder GEMM candidates in the tuning
    FLASHRT_DISABLE_SMEM_GEMM_ROWS=1  no shared-memory GEMM candidates at 17-64 rows (horizon 50), only up to 16
                                    (EngineOptions.smem_gemm_rows; FLASHRT_SMEM_GEMM_ROWS=0 does the same)
    FLASHRT_DISABLE_PREFIX_ATTENTION_TUNING=1  the prefix attention runs the mqa implementation, unmeasured
    FLASHRT_DISABLE_VISION_ATTENTION_TUNING=1  the vision attention runs on torch's own choice of SDPA backend
    FLASHRT_DISABLE_FUSED_PATCH_EMBED=1  the patch embedding as torch ops with an fp32 patch GEMM, not the patch rows
                                    of kernels/flashrt_kernels/patch_embed.py and the GEMM in the engine dtype
                                    (FLASHRT_FUSED_PATCH_EMBED=0 does the same)
    FLASHRT_DISABLE_FUSED_DENOISE_STEP=1  pi0.5's denoising-step ends as separate ops, not
                                    kernels/flashrt_kernels/denoise_step.py (FLASHRT_FUSED_DENOISE_STEP=0 does the same)
    FLASHRT_DISABLE_FUSED_DENOISE_STEP_PI0=1  pi0's step ends as separate ops, not kernels/flashrt_kernels/denoise_step.py
                                    time_mlp_in and step_out (EngineOptions.fused_denoise_step_pi0;
                                    FLASHRT_FUSED_DENOISE_STEP_PI0=0 does the same)
    FLASHRT_DISABLE_OVERLAP_FIRST_STEP=1  the first denoising step after the whole prefix, on one stream, not its
                                    layers beside the prefix's later layers on a second stream
                                    (EngineOptions.overlap_first_step; FLASHRT_OVERLAP_FIRST_STEP=0 does the same)
    FLASHRT_TEXT_BUCKETS=16,32,...  the token-buffer lengths with a graph each (EngineOptions.text_buckets)
    FLASHRT_TUNING_CACHE=DIR        keep the load-time tuning's picks in DIR and reuse them at the next load of the
                                    same model, GPU, software and options (engine/tuning_cache.py); unset or "" = off
    FLASHRT_VISION_MLP_PAD=N        the vision MLP's width rounded up to a multiple of N at load (zero rows of fc1, zero
                                    columns of fc2: the same output; EngineOptions.vision_mlp_pad, default 128; 0: off)
    FLASHRT_PREFIX_ATTENTION_WGMMA=0  the prefix attention tuning leaves out kernels/flashrt_kernels/prefix_attention.py
                                    (wgmma; on by default where Gluon and an sm90+ GPU serve it)
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
    VISION_GELU = "vision_gelu"      # the vision MLP's bias + GELU: in the fc1 GEMM's epilogue or a kernel of its own
    DECODER_TUNING = "decoder_tuning"  # how the decoder GEMMs' launch configurations are picked at load
    FP8_INPUT_QUANT = "fp8_input_quant"  # who quantizes a per-tensor FP8 down GEMM's input: the GeGLU kernel or its own
    SMEM_GEMM = "smem_gemm"          # decoder GEMMs that stage their weights in shared memory before the PDL wait
    PREFIX_ATTENTION = "prefix_attention"  # the backbone's attention: the mqa kernel, or the faster of it and SDPA
    VISION_ATTENTION = "vision_attention"  # the SDPA backend of the vision attention: torch's choice or the fastest
    PATCH_EMBED = "patch_embed"      # uint8 views -> patch rows -> patch GEMM: one kernel + engine-dtype GEMM, or torch
    DENOISE_STEP = "denoise_step"    # pi0.5 step ends: input projection + first norm, final norm + output + Euler


class Switch(str, enum.Enum):
    """An optimization that can be turned off: FLASHRT_DISABLE_<value>=1, or the EngineOptions field named by the
    value in lower case."""

    CUDA_GRAPH = "CUDA_GRAPH"            # capture predict as one graph
    TRITON = "TRITON"                    # fused Triton kernels
    FUSED_WEIGHTS = "FUSED_WEIGHTS"      # fold norm scales into GEMMs, merge QKV and gate/up
    FLASH_ATTENTION = "FLASH_ATTENTION"  # fused SDPA kernels (else the math attention)
    FP8 = "FP8"                          # FP8 GEMMs on the backbone's MLP (also needs fp8=True / FLASHRT_FP8=1)
    PDL = "PDL"                          # programmatic dependent launch between Triton kernels (sm90+)
    ROPE_IN_ATTENTION = "ROPE_IN_ATTENTION"  # the denoiser's attention applies RoPE itself (no qkv_rope launch)
    GEMM_EPILOGUE = "GEMM_EPILOGUE"      # bias + GELU of the vision fc1 in the cuBLASLt/hipBLASLt GEMM epilogue
    CHAIN_TUNING = "CHAIN_TUNING"        # decoder GEMM configurations timed inside the captured denoiser
    PDL_EARLY_TRIGGER = "PDL_EARLY_TRIGGER"  # PDL kernels let the next kernel launch at their start (tuned per site)
    FP8_FUSED_QUANT = "FP8_FUSED_QUANT"  # the GeGLU kernel writes the FP8 input of the down GEMM
    SMEM_GEMM = "SMEM_GEMM"              # the TMA / shared-memory decoder GEMM candidates
    PREFIX_ATTENTION_TUNING = "PREFIX_ATTENTION_TUNING"  # the prefix attention picked by its time at load
    VISION_ATTENTION_TUNING = "VISION_ATTENTION_TUNING"  # the vision attention's SDPA backend picked by its time
    FUSED_PATCH_EMBED = "FUSED_PATCH_EMBED"  # kernels/flashrt_kernels/patch_embed.py + the patch GEMM in the engine dtype
    FUSED_DENOISE_STEP = "FUSED_DENOISE_STEP"  # kernels/flashrt_kernels/denoise_step.py at both ends of each pi0.5 step
    FUSED_DENOISE_STEP_PI0 = "FUSED_DENOISE_STEP_PI0"  # ... and of each pi0 step (time_mlp_in, step_out)
    SMEM_GEMM_ROWS = "SMEM_GEMM_ROWS"    # the shared-memory decoder GEMM candidates at 17-64 rows (horizon 50)
    OVERLAP_FIRST_STEP = "OVERLAP_FIRST_STEP"  # the first denoising step beside the prefix, two streams


# The token-buffer lengths the engine captures a graph for (max_token_len is always added): every 16 tokens up to
# 176. A prompt pays for the padding of its bucket: on the H200 (pi0.5, 2 views,
# docs/benchmarks/text_buckets_h200_2026-12-01.md) a replay costs ~0.3 ms more per 64 tokens of buffer (bf16), so
# coarse buckets make pi0.5's discretized-state prompts (129-200 tokens) pay for 200. 192 is left out: it measures
# slower than 200 in bf16 and FP8 (12.03 vs 11.54 ms, 10.33 vs 10.18 ms). Each bucket costs one capture (0.4-3 s)
# when it is first used or warmed up.
DEFAULT_TEXT_BUCKETS = tuple(range(16, 177, 16))


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings. Every fast path can be turned off here or by its environment variable."""

    cuda_graph: bool = True
    triton: bool = True
    fused_weights: bool = True
    flash_attention: bool = True
    fp8: bool = False                        # opt-in: FP8 E4M3 with static per-tensor scales for the backbone's
                                             # gate/up and down GEMMs (the scope that passes the accuracy gate)
    pdl: bool = True                         # programmatic dependent launch (NVIDIA sm90+)
    rope_in_attention: bool = True           # denoiser: RoPE inside the attention kernel, read from the QKV output
    gemm_epilogue: bool = True               # vision fc1: bias + GELU (tanh) in the BLAS GEMM's epilogue
    vision_mlp_pad: int = 128                # the vision MLP width (4304) rounded up to a multiple of this at load
                                             # (zero rows / columns: the same output); 0: as is
    chain_tuning: bool = True                # decoder GEMM configurations timed where they run (the denoiser)
    chain_tuning_passes: int = 2             # the chain tuning repeats until a pass changes nothing, at most this
    pdl_early_trigger: bool = True           # denoiser kernels that release the next one at their start (tuned)
    fp8_fused_quant: bool = True             # FP8 path: the GeGLU kernel quantizes the down GEMM's input
    smem_gemm: bool = True                   # kernels/flashrt_kernels/smem_gemm.py candidates in the decoder GEMM
                                             # tuning
    prefix_attention_tuning: bool = True     # the prefix attention: the mqa kernel or SDPA, whichever is faster
    vision_attention_tuning: bool = True     # the vision attention: the fastest SDPA backend at its shape
    fused_patch_embed: bool = True           # kernels/flashrt_kernels/patch_embed.py rows + the patch GEMM in the
                                             # engine dtype
    fused_denoise_step: bool = True          # kernels/flashrt_kernels/denoise_step.py (pi0.5): the step ends, 2
                                             # launches not 7
    fused_denoise_step_pi0: bool = True      # pi0's step ends fused too (time_mlp_in + one few-row GEMM,
                                             # step_out), 3 launches not 12
    smem_gemm_rows: bool = True              # kernels/flashrt_kernels/smem_gemm.py candidates at 17-64 rows too
                                             # (horizon-50 steps), x streamed through a ring
    prefix_attention_wgmma: bool = True      # kernels/flashrt_kernels/prefix_attention.py (Hopper wgmma) joins the
                                             # prefix attention tuning where it serves the GPU
    overlap_first_step: bool = True          # the first denoising step's layer i beside the prefix's layers
                                             # after i, two streams (forward.forward_overlapped)
    fast_paths: bool = True                  # False: the reference path, whatever else is set
    tuning_cache: str = ""                   # a directory: the load-time tuning's picks kept there and reused
                                             # (engine/tuning_cache.py); "" = measure at every load
    host_wait: str = "sync"                  # how predict waits for the GPU: "sync", "poll" or "warm" (the host's
                                             # steps rehearsed during the wait; engine/host_wait.py)
    text_buckets: tuple[int, ...] = DEFAULT_TEXT_BUCKETS  # token-buffer lengths with a graph each (max_token_len
                                                          # is added)
    overrides: Mapping[str, str] = field(default_factory=dict)  # op name -> impl name

    def __post_init__(self) -> None:
        if not isinstance(self.tuning_cache, str):
            raise ValueError(f"tuning_cache must be a directory path as a str ('' = off), got {self.tuning_cache!r}")
        if self.host_wait not in HOST_WAITS:
            raise ValueError(f"host_wait must be one of {HOST_WAITS}, got {self.host_wait!r}")
        if not (isinstance(self.vision_mlp_pad, int) and self.vision_mlp_pad >= 0 and self.vision_mlp_pad % 8 == 0):
            raise ValueError(f"vision_mlp_pad must be 0 (off) or a positive multiple of 8, got {self.vision_mlp_pad!r}")
        if not (isinstance(self.chain_tuning_passes, int) and 1 <= self.chain_tuning_passes <= 8):
            raise ValueError(f"chain_tuning_passes must be an int from 1 to 8, got {self.chain_tuning_passes!r}")
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
        for name, attr in (("FLASHRT_FP8", "fp8"),                                       # the opt-in; a DISABLE wins
                           ("FLASHRT_FUSED_PATCH_EMBED", "fused_patch_embed"),           # defaults: 0 turns them off
                           ("FLASHRT_FUSED_DENOISE_STEP", "fused_denoise_step"),
                           ("FLASHRT_FUSED_DENOISE_STEP_PI0", "fused_denoise_step_pi0"),
                           ("FLASHRT_SMEM_GEMM_ROWS", "smem_gemm_rows"),
                           ("FLASHRT_PREFIX_ATTENTION_WGMMA", "prefix_attention_wgmma"),
                           ("FLASHRT_OVERLAP_FIRST_STEP", "overlap_first_step")):
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
        for name, attr, allowed in (("FLASHRT_CHAIN_TUNING_PASSES", "chain_tuning_passes", "an int from 1 to 8"),
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
    Op.PATCH_EMBED: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.FUSED_PATCH_EMBED),
                  "each present uint8 view at the model's image size becomes its patch rows in the engine dtype in "
                  "one kernels/flashrt_kernels/patch_embed.py launch (HWC gather, scaling to [-1, 1]; other sizes are resized as "
                  "before, then converted to the rows in one copy); the patch GEMM runs in the "
                  "engine dtype (rows padded to a multiple of 8 columns) and one add puts the position embedding "
                  "and the bias (summed at load) on it; measured on the H200: -0.08 ms bf16 per predict, the vision "
                  "phase -0.05 to -0.07 ms"),
        Candidate("reference", _ALWAYS, "torch: permute, float conversion and scaling per view, the patch "
                  "reshape, an fp32 GEMM with its bias, then the position embedding"),
    ),
    Op.DENOISE_STEP: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.switch_on(Switch.FUSED_DENOISE_STEP),
                  "pi0.5: kernels/flashrt_kernels/denoise_step.py, one Triton kernel at each end of a denoising step: the action "
                  "input projection with the first adaRMSNorm, and the final adaRMSNorm with the output "
                  "projection and the Euler step (seven launches, two of them cuBLAS GEMMs outside the dependent-"
                  "launch chain, become two PDL kernels; fp32 throughout). Its full-size gates pass (bf16, FP8); on the "
                  "H200 it saves 0.02-0.04 ms per denoise with the same picks (tools/benchmark_denoise_step.py)"),
        Candidate("separate", _ALWAYS, "cast, input GEMM, copy and norm; norm, output GEMM and the Euler kernel"),
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
    """Pinning the FP8 prefix GEMM implies asking for FP8."""
    return {"fp8": True} if op is Op.GEMM_PREFIX else {}
