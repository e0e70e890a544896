"""The dispatch table: the one place that picks, per op, the implementation the engine runs.

Every op has candidates in order of preference; a candidate runs where its predicate holds for the hardware and
the options (engine/options.py), and the first such candidate wins. `EngineOptions.impl` (FLASHRT_IMPL_<OP>=<impl>)
pins one op for A/B tests and bug reports; a pinned implementation that cannot run raises ValueError. An op that
one option alone gates carries that option's name (Op.FUSED_DENOISE_STEP <- EngineOptions.fused_denoise_step <-
FLASHRT_FUSED_DENOISE_STEP). Nothing else in the engine chooses a kernel: ops.py, forward.py and the executor
read the resolved `Dispatch`.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Callable, Mapping

from . import kernel_import
from .hardware import CPU, Hardware, Vendor
from .options import EngineOptions

log = logging.getLogger(__name__)


class Op(str, enum.Enum):
    EXECUTOR = "executor"            # how predict runs: captured graph, eager engine, or the reference path
    ATTENTION = "attention"          # vision attention (no mask)
    MQA = "mqa"                      # masked one-KV-head attention of the prefix and the denoise steps
    GEMM_PREFIX = "gemm_prefix"      # the wide GEMMs (vision, prefix: hundreds of rows): FP8 or bf16
    GEMM_DECODER = "gemm_decoder"    # the 10-50-row GEMMs of the action expert
    FP8_FORMAT = "fp8_format"        # E4M3 flavour when FP8 GEMMs run
    NORM = "norm"                    # residual add + RMSNorm (Gemma, folded weight)
    ADA_NORM = "ada_norm"            # gated residual + adaRMSNorm (pi0.5 expert)
    GEGLU = "geglu"                  # gelu_tanh(gate) * up on the merged gate/up output
    QKV_ROPE = "qkv_rope"            # QKV split + RoPE + KV-cache write
    DECODER_QKV = "decoder_qkv"      # where the action expert's RoPE runs: in the attention, the GEMM, or its own
    EULER = "euler"                  # x <- x + dt * (v + b)
    KERNEL_LAUNCH = "kernel_launch"  # how the Triton kernels of one predict follow each other
    GEMM_EPILOGUE = "gemm_epilogue"  # the vision MLP's bias + GELU: in the fc1 GEMM's epilogue or separate
    CHAIN_TUNING = "chain_tuning"    # how the decoder GEMMs' launch configurations are picked at load
    FP8_FUSED_QUANT = "fp8_fused_quant"  # who quantizes a per-tensor FP8 down GEMM's input: GeGLU or its own kernel
    SMEM_GEMM = "smem_gemm"          # decoder GEMMs that stage their weights in shared memory before the PDL wait
    SMEM_GEMM_ROWS = "smem_gemm_rows"  # ... offered at 17-64 rows too
    PREFIX_ATTENTION_TUNING = "prefix_attention_tuning"  # the backbone's attention: mqa, or the fastest measured
    PREFIX_ATTENTION_WGMMA = "prefix_attention_wgmma"    # the wgmma kernel among the prefix attention candidates
    VISION_ATTENTION_TUNING = "vision_attention_tuning"  # the vision attention's SDPA backend: torch's or the fastest
    FUSED_PATCH_EMBED = "fused_patch_embed"  # uint8 views -> patch rows -> patch GEMM: one kernel, or torch ops
    FUSED_DENOISE_STEP = "fused_denoise_step"  # pi0.5 step ends: input projection + norm, norm + output + Euler
    FUSED_DENOISE_STEP_PI0 = "fused_denoise_step_pi0"  # pi0 step ends: time MLP in, norm + output + Euler
    OVERLAP_FIRST_STEP = "overlap_first_step"  # the first denoising step beside the prefix, or after it


@dataclass(frozen=True)
class Candidate:
    """One implementation of an op: `usable(hw, options)` says whether it can run and is switched on."""

    name: str
    usable: Callable[[Hardware, EngineOptions], bool]
    why: str  # shown in logs / docs: where this implementation applies


def _gpu(hw: Hardware, o: EngineOptions) -> bool:
    return hw.is_gpu and not hw.reference_only and o.fast_paths


def _triton(hw: Hardware, o: EngineOptions) -> bool:
    return _gpu(hw, o) and o.triton and kernel_import.triton_available()


def _nvidia_sm90_plus(hw: Hardware) -> bool:
    """Hopper and later: griddepcontrol (PDL) and cp.async.bulk."""
    return hw.vendor is Vendor.NVIDIA and hw.sm is not None and hw.sm >= 90


def _nvidia_hopper(hw: Hardware) -> bool:
    """Hopper (sm90): wgmma, which the Gluon kernels (kernels/flashrt_kernels/smem_gemm.py, prefix_attention.py)
    run on; Blackwell has tcgen05 instead, so they are not offered there."""
    return hw.vendor is Vendor.NVIDIA and hw.sm is not None and hw.sm // 10 == 9


def _gluon_available() -> bool:
    return kernel_import.triton_available() and bool(getattr(kernel_import.load_kernels(), "HAVE_GLUON", False))


def _smem_gemm(hw: Hardware, o: EngineOptions) -> bool:
    return _triton(hw, o) and o.smem_gemm and _nvidia_hopper(hw) and _gluon_available()


def _fp8_capable(hw: Hardware) -> bool:
    if hw.vendor is Vendor.NVIDIA:
        return hw.sm is not None and hw.sm >= 89
    if hw.vendor is Vendor.AMD:
        return hw.gfx_arch in ("gfx942", "gfx950")
    return False


_ALWAYS = lambda hw, o: True  # noqa: E731

TABLE: dict[Op, tuple[Candidate, ...]] = {
    Op.EXECUTOR: (
        Candidate("graph", lambda hw, o: _gpu(hw, o) and o.cuda_graph,
                  "GPU: whole predict captured as one CUDA/HIP graph"),
        Candidate("eager_engine", _gpu, "GPU with graphs off: same engine ops, launched one by one"),
        Candidate("reference", _ALWAYS, "CPU, hardware='reference' or fast paths off: the fp32/bf16 reference"),
    ),
    Op.ATTENTION: (
        Candidate("sdpa", lambda hw, o: _gpu(hw, o) and o.flash_attention,
                  "torch SDPA fused kernels (flash attention, no mask)"),
        Candidate("math", _ALWAYS, "matmul + fp32 softmax + matmul"),
    ),
    Op.MQA: (
        Candidate("triton", _triton, "flashrt_kernels/attention.py: flash-style, key mask as a vector, split "
                  "over keys"),
        Candidate("sdpa", lambda hw, o: _gpu(hw, o) and o.flash_attention,
                  "torch SDPA with a dense additive mask (cuDNN / memory-efficient)"),
        Candidate("math", _ALWAYS, "matmul + fp32 softmax + matmul, dense mask"),
    ),
    Op.GEMM_PREFIX: (
        Candidate("fp8", lambda hw, o: _gpu(hw, o) and o.fp8 and _fp8_capable(hw),
                  "torch._scaled_mm, E4M3 per-tensor static scales (sm89+, gfx942, gfx950)"),
        Candidate("bf16", _ALWAYS, "cuBLAS / hipBLASLt through torch.matmul"),
    ),
    Op.GEMM_DECODER: (
        Candidate("triton", _triton, "flashrt_kernels/skinny_gemm.py (GeGLU epilogue, split-K into the norms); per "
                  "GEMM shape only where it measures faster than cuBLAS at load"),
        Candidate("bf16", _ALWAYS, "cuBLAS / hipBLASLt: FP8 is slower at 10-50 rows (bound by reading the weights)"),
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
        Candidate("rope_in_attention", lambda hw, o: _triton(hw, o) and o.rope_in_attention
                  and o.impl.get(Op.MQA.value, "triton") == "triton",
                  "the QKV GEMM writes raw Q/K/V; flashrt_kernels/attention.py decoder_attention applies RoPE and "
                  "the q scale to the queries and the suffix keys itself (no qkv_rope launch, no suffix KV-cache "
                  "write); a pinned mqa other than triton leaves it out"),
        Candidate("fused_rope", _triton, "flashrt_kernels/qkv_gemm_rope.py: RoPE, q scale and KV write in the QKV "
                  "GEMM's epilogue; kept at load only where it measures faster than the GEMM + qkv_rope pair"),
        Candidate("separate", _ALWAYS, "the decoder GEMM, then the qkv_rope op"),
    ),
    Op.KERNEL_LAUNCH: (
        Candidate("pdl_early", lambda hw, o: _triton(hw, o) and o.pdl
                  and o.pdl_early_trigger and o.chain_tuning
                  and _nvidia_sm90_plus(hw),
                  "programmatic dependent launch where chosen Triton kernels let the next one launch at their start "
                  "(flashrt_kernels/_triton.py release_dependents), not after their wait, so the kernel ahead can be "
                  "resident and streaming its weights: the chain tuning times the denoiser sites of each "
                  "kernel_configs.LAUNCH_POLICIES entry ('none' among them) and keeps the fastest (NVIDIA sm90+)"),
        Candidate("pdl", lambda hw, o: _triton(hw, o) and o.pdl and _nvidia_sm90_plus(hw),
                  "programmatic dependent launch: a Triton kernel starts while the one before it finishes, "
                  "streams its weights, then waits for its inputs (griddepcontrol, NVIDIA sm90+)"),
        Candidate("stream", _ALWAYS, "plain stream order: each kernel starts when the one before it has ended"),
    ),
    Op.FUSED_PATCH_EMBED: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.fused_patch_embed,
                  "each present uint8 view at the model's image size becomes its patch rows in the engine dtype in "
                  "one flashrt_kernels/patch_embed.py launch (HWC gather, scaling to [-1, 1]; other sizes are "
                  "resized first, then converted to the rows in one copy); the patch GEMM runs in the "
                  "engine dtype (rows padded to a multiple of 8 columns) and one add puts the position embedding "
                  "and the bias (summed at load) on it (on the H200: -0.08 ms bf16 per predict)"),
        Candidate("reference", _ALWAYS, "torch: permute, float conversion and scaling per view, the patch "
                  "reshape, an fp32 GEMM with its bias, then the position embedding"),
    ),
    Op.FUSED_DENOISE_STEP: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.fused_denoise_step,
                  "pi0.5: flashrt_kernels/denoise_step.py, one Triton kernel at each end of a denoising step: the "
                  "action input projection with the first adaRMSNorm, and the final adaRMSNorm with the output "
                  "projection and the Euler step (seven launches, two of them cuBLAS GEMMs outside the dependent-"
                  "launch chain, become two PDL kernels; fp32 throughout). Its full-size gates pass (bf16, FP8); on "
                  "the H200 it saves 0.02-0.04 ms per denoise with the same picks (tools/benchmark_denoise_step.py)"),
        Candidate("separate", _ALWAYS, "cast, input GEMM, copy and norm; norm, output GEMM and the Euler kernel"),
    ),
    Op.GEMM_EPILOGUE: (
        Candidate("gemm_epilogue", lambda hw, o: _gpu(hw, o) and o.gemm_epilogue,
                  "torch._addmm_activation: bias + tanh GELU in the cuBLASLt / hipBLASLt epilogue of the bf16 fc1 "
                  "GEMM (an FP8 fc1 keeps the separate GELU)"),
        Candidate("separate", _ALWAYS, "the fc1 GEMM with its bias, then torch's tanh GELU"),
    ),
    Op.CHAIN_TUNING: (
        Candidate("chain", lambda hw, o: _triton(hw, o) and o.chain_tuning and o.cuda_graph,
                  "after timing each decoder GEMM kind alone, each kind's candidates are timed again inside the "
                  "captured denoiser (norms, attention and the other GEMMs around them, as a predict runs them) "
                  "and the fastest there is kept (needs cuda_graph: the denoiser is timed as a captured graph)"),
        Candidate("isolated", _ALWAYS, "each decoder GEMM kind timed alone over the expert's layers"),
    ),
    Op.FP8_FUSED_QUANT: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.fp8_fused_quant,
                  "a per-tensor FP8 down GEMM's input is quantized by the GeGLU kernel that produces it "
                  "(flashrt_kernels/geglu.py with an FP8 out): no bf16 activation written and read back, no "
                  "quantization launch; row-wise FP8 keeps its per-token quantization kernel"),
        Candidate("separate", _ALWAYS, "the GeGLU output in bf16, then kernels/flashrt_kernels/fp8_quant.py"),
    ),
    Op.SMEM_GEMM: (
        Candidate("tma", _smem_gemm,
                  "flashrt_kernels/smem_gemm.py (Triton Gluon): each program's whole weight slice goes to shared "
                  "memory by TMA before the PDL wait, and the product runs on wgmma with the weights as the 64-row "
                  "side; offered to the decoder GEMM tuning beside the Triton and library GEMMs (NVIDIA Hopper: "
                  "wgmma)"),
        Candidate("none", _ALWAYS, "the decoder GEMM tuning picks among the Triton and library GEMMs"),
    ),
    Op.PREFIX_ATTENTION_TUNING: (
        Candidate("measured", lambda hw, o: _triton(hw, o) and o.flash_attention
                  and o.prefix_attention_tuning,
                  "at load, the prefix attention (bidirectional, one K/V head, key-padding mask) is timed as the mqa "
                  "kernel (heads stacked on the query axis, key splits + merge) and as torch SDPA (enable_gqa, "
                  "boolean key mask, torch's fused backend), graph-captured at the 2-view prefix length; the "
                  "faster runs"),
        Candidate("mqa", _ALWAYS, "the mqa implementation (Op.MQA), as the denoiser's attention"),
    ),
    Op.VISION_ATTENTION_TUNING: (
        Candidate("measured", lambda hw, o: _gpu(hw, o) and o.flash_attention
                  and o.vision_attention_tuning,
                  "at load, the vision attention (no mask, the views' heads as the batch) is timed on each of "
                  "torch's fused SDPA backends (flash, memory-efficient, cuDNN) and on torch's own choice, "
                  "graph-captured at the engine's shape and layout, and the fastest runs"),
        Candidate("default", _ALWAYS, "torch's own choice of SDPA backend (or the math attention when SDPA is off)"),
    ),
    Op.FUSED_DENOISE_STEP_PI0: (
        Candidate("fused", lambda hw, o: _triton(hw, o) and o.fused_denoise_step and o.fused_denoise_step_pi0,
                  "pi0: kernels/flashrt_kernels/denoise_step.py time_mlp_in, one few-row GEMM and denoise_step_out "
                  "at the ends of each step (3 launches, not 12)"),
        Candidate("separate", _ALWAYS, "pi0's step ends as separate ops: GEMMs, bias, SiLU, copies, norm, Euler"),
    ),
    Op.SMEM_GEMM_ROWS: (
        Candidate("tma", lambda hw, o: _smem_gemm(hw, o) and o.smem_gemm_rows,
                  "the shared-memory GEMM candidates at 17-64 rows too (horizon 50): x through a ring of TMA boxes"),
        Candidate("none", _ALWAYS, "shared-memory GEMM candidates only up to 16 rows"),
    ),
    Op.PREFIX_ATTENTION_WGMMA: (
        Candidate("wgmma", lambda hw, o: o.enabled("prefix_attention_wgmma"),
                  "kernels/flashrt_kernels/prefix_attention.py (Gluon, wgmma) among the prefix attention tuning's "
                  "candidates where the kernel serves the shape and device"),
        Candidate("none", _ALWAYS, "the prefix attention tuning times the mqa kernel's forms and SDPA only"),
    ),
    Op.OVERLAP_FIRST_STEP: (
        Candidate("two_streams", lambda hw, o: o.enabled("overlap_first_step"),
                  "the first denoising step's layer i beside the prefix's later layers on a second stream "
                  "(forward.forward_overlapped; one stream in the same order on the CPU)"),
        Candidate("one_stream", _ALWAYS, "the first denoising step after the whole prefix"),
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

    def pinned(self, op: Op) -> bool:
        """Whether `op` was pinned (EngineOptions.impl): a pinned decoder GEMM is used as it is, not tuned."""
        return op.value in self.options.impl

    def summary(self) -> str:
        return ", ".join(f"{op.value}={impl}" for op, impl in self.choice.items())


def resolve(hardware: Hardware, options: EngineOptions | None = None) -> Dispatch:
    """Pick one implementation per op. A pinned op or implementation that does not exist, or a pinned
    implementation that cannot run, raises ValueError."""
    options = options or EngineOptions()
    for op, impl in options.impl.items():
        if op not in {o.value for o in Op}:
            raise ValueError(f"pinned implementation for unknown op {op!r}; ops: {[o.value for o in Op]}")
        if impl not in {c.name for c in TABLE[Op(op)]}:
            raise ValueError(f"unknown implementation {impl!r} for op {op!r}; "
                             f"choices: {[c.name for c in TABLE[Op(op)]]}")
    choice: dict[Op, str] = {}
    for op, candidates in TABLE.items():
        pinned = options.impl.get(op.value)
        if pinned is not None:
            cand = next(c for c in candidates if c.name == pinned)
            if not cand.usable(hardware, options):
                raise ValueError(f"{op.value}={pinned} was requested but cannot run on {hardware.describe()} "
                                 f"with these options ({cand.why})")
            choice[op] = pinned
            continue
        choice[op] = next(c.name for c in candidates if c.usable(hardware, options))
    dispatch = Dispatch(hardware, options, choice)
    log.info("dispatch on %s: %s", hardware.describe(), dispatch.summary())
    return dispatch


def eager_cpu_dispatch(options: EngineOptions | None = None) -> Dispatch:
    """The graph engine's own ops in their plain-PyTorch implementations (the table resolved for the CPU), launched
    one by one on the CPU: the engine's forward, buffers and host path without a GPU (CPU tests, and the host steps
    of the GPU path timed on a CPU machine)."""
    resolved = resolve(CPU, options)
    return Dispatch(CPU, resolved.options, {**resolved.choice, Op.EXECUTOR: "eager_engine"})
