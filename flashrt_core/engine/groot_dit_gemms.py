"""GR00T N1.6's DiT GEMMs on the Triton few-row GEMM (EngineOptions.groot_few_row_gemms), bf16 or weight-only FP8
(precision="fp8", EngineOptions.fp8 on the graph executor).

The DiT's GEMMs run on B * (1 + horizon) rows (17 for one observation: the state token and 16 action tokens), 4
Euler steps x 32 blocks per predict, so they are bound by reading their weights. The Triton few-row GEMM
(kernels/flashrt_kernels/skinny_gemm.py, through Ops.few_row_linear) streams each weight tile once and applies the
layer's bias and, for the MLP's first GEMM, the tanh GELU in its epilogue; the output projection and MLP down may
return split-K partials (below). With FP8 each of them gets a weight-only FP8 copy (fp8.weight_only_fp8: one E4M3
scale per output channel, from the weights alone, so nothing is calibrated): half the bytes to stream, converted to
bf16 in registers and scaled in the epilogue; activations stay bf16.

    quantized (FP8 weights)   every block's Q/K/V (merged) or Q (cross-attention), output projection, MLP up (with
                              the GELU) and down
    split-K allowed           the output projection and the MLP's down GEMM: the norm after them (Ops.norm) sums
                              the fp32 partials, so the weights stream from more programs without a reduction kernel
    bf16 (as without FP8)     proj_out_2 (its rounding reaches the velocity undiluted by the residual stream: on
                              the CPU at the released sizes it is ~10 % of the FP8 chunk's cosine loss, for ~0.2 % of
                              the DiT's weight bytes), the cross-attention K / V of the backbone features (hundreds
                              of rows, once per predict), the embodiment encoders and decoder (one weight slice per
                              embodiment), the step tables (computed once), and the vision and language model
                              (hundreds of rows: weight-only FP8 is a few-row GEMM, and the pi family's activation
                              FP8 needs a calibration)

Launch configurations: per GEMM shape, kind and weight dtype, the fastest of the few-row GEMM's candidates
(kernel_configs.SKINNY_CANDIDATES) and, for bf16 weights where the dispatch runs it (EngineOptions.smem_gemm on
Hopper), the shared-memory Gluon GEMM's (flashrt_kernels/smem_gemm.py: the weight slice in shared memory before the
PDL wait, split-K for the GEMMs a norm sums) at one observation's rows, timed at build on the GPU (the first that fits
elsewhere, where Ops.few_row_linear runs the kernel's plain-PyTorch reference). A split-K GEMM is timed with the
LayerNorm that sums its partials after it (EngineOptions.groot_tune_with_norm): alone, the GEMM gains from every
further K-slice, but each slice is one more fp32 partial of the output for the norm to read, and the pair is
fastest at fewer slices (on the H200 4 for both, against 6 and 16 timed alone). More rows than one launch serves
(64: batches of 4 or more observations) run in row blocks (Ops.few_row_linear).
"""

from __future__ import annotations

import logging

import torch

from .fp8 import weight_only_fp8
from .groot_fused_dit import FusedDit
from .kernel_configs import SKINNY_CANDIDATES, SkinnyConfig, SmemConfig
from .ops import Ops
from .timing import graph_time_us
from .tuning import time_candidate
from .weights import Linear

log = logging.getLogger(__name__)

PLAIN, GELU, PARTIALS = "plain", "gelu", "partials"     # the GEMM's epilogue / who consumes its output
MAX_ROWS = 64                                            # one launch of the few-row GEMM (Ops.few_row_linear)
# each candidate's time: the median of TIMED_REPLAYS replays of a graph of TIMED_PASSES passes over every block's
# GEMM of the shape, each on its own weights, as a predict streams them (32 blocks' weights are several times the
# H200's 50 MB L2: the weights come from memory, as in the DiT, not from the L2 as in calls on one weight)
TIMED_PASSES, TIMED_REPLAYS = 2, 5


def dit_gemms(fused: FusedDit) -> list[tuple[Linear, str]]:
    """The fused DiT's GEMMs that read FP8 weights, each with its kind: PLAIN (Q/K/V), GELU (the MLP's first, the
    GELU in the epilogue), PARTIALS (output projection and MLP down, summed by the norm after them)."""
    out: list[tuple[Linear, str]] = []
    for block in fused.blocks:
        out += [(block.qkv, PLAIN), (block.out, PARTIALS), (block.ff1, GELU), (block.ff2, PARTIALS)]
    return out


def candidates(kind: str, rows: int, k: int) -> list[SkinnyConfig]:
    """The few-row GEMM's launch configurations (every kind's in kernel_configs, once each) that take `rows` rows
    (at most MAX_ROWS per launch) and divide K; split-K only where a norm sums the partials (PARTIALS). Empty for
    a K that none divides (pick_config then takes one_shot)."""
    out: list[SkinnyConfig] = []
    for cands in SKINNY_CANDIDATES.values():
        for cfg in cands:
            if (cfg not in out and (cfg.split_k == 1 or kind == PARTIALS) and min(rows, MAX_ROWS) <= cfg.max_rows
                    and k % (cfg.split_k * cfg.block_k) == 0):
                out.append(cfg)
    return out


SMEM_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24)   # split-K counts of the shared-memory GEMM's candidates (PARTIALS)


def smem_candidates(ops: Ops, kind: str, rows: int, w: torch.Tensor) -> list[SmemConfig]:
    """The shared-memory Gluon GEMM's configurations (flashrt_kernels/smem_gemm.py: each program's 64-row weight
    slice in shared memory before its PDL wait) for a bf16 weight where the dispatch runs it (Op.SMEM_GEMM "tma",
    Hopper with Gluon; above 16 rows, one observation's 17 among them, Op.SMEM_GEMM_ROWS too): split-K only for
    PARTIALS, each where the slice fits beside a ring of x boxes."""
    rows = min(rows, MAX_ROWS)                          # one launch's rows
    if not (ops.smem_gemm and (rows <= ops.k.SMEM_GEMM_X_ROWS or ops.smem_gemm_rows) and w.is_cuda
            and w.dtype == torch.bfloat16):
        return []
    n, k = w.shape
    return [SmemConfig(split) for split in (SMEM_SPLITS if kind == PARTIALS else (1,))
            if ops.k.smem_gemm_supported(rows, n, k, False, split)]


def one_shot(k: int) -> SkinnyConfig:
    """The configuration for a K no candidate divides (the narrow test presets): one program step over all of K."""
    return SkinnyConfig(16, k, 1, 1)


def pick_config(ops: Ops, lins: list[Linear], kind: str, rows: int, dtype: torch.dtype, with_norm: bool = True
                ) -> tuple[SkinnyConfig | SmemConfig, dict]:
    """The launch configuration of the few-row GEMMs `lins` (one shape, kind and weight dtype: the DiT blocks'; on
    the weights Ops.few_row_linear reads, lin.w8 where set): the fastest candidate (the Triton few-row GEMM's and,
    for bf16 weights on Hopper, the shared-memory GEMM's) timed on `rows` random rows over all of `lins` in turn on
    the GPU (one that needs more shared memory or registers than the GPU has is left out: tuning.time_candidate),
    the first candidate elsewhere (one_shot where none fits). with_norm: a PARTIALS GEMM is timed with the
    LayerNorm that sums its partials after it (Ops.norm), as the DiT runs them: more K-slices stream the weights
    from more programs but give the norm more partials to read. -> (config, {config name: us per GEMM})."""
    lin = lins[0]
    w = lin.w8[0] if lin.w8 is not None else lin.parts[0][0]
    fits = (candidates(kind, rows, w.shape[1]) or [one_shot(w.shape[1])]) + smem_candidates(ops, kind, rows, w)
    if not w.is_cuda:
        return fits[0], {}
    x = torch.randn(rows, w.shape[1], device=w.device, dtype=dtype)
    site = f"groot_dit_{kind}"
    if kind == PARTIALS and with_norm:           # the LayerNorm that sums the partials, as in the DiT
        residual = torch.randn(rows, w.shape[0], device=w.device, dtype=torch.float32)
        normed = torch.empty(rows, w.shape[0], device=w.device, dtype=dtype)
        consume = lambda y: ops.norm(y, residual, normed, None, None, 1e-6, layer_norm=True)  # noqa: E731
    else:
        consume = lambda y: y  # noqa: E731

    def every_block(cfg):
        for each in lins:
            consume(ops.few_row_linear(x, each, cfg, gelu=kind == GELU))

    timed = {cfg: time_candidate(ops, site, cfg, lambda cfg=cfg: graph_time_us(
        lambda: every_block(cfg), reps=TIMED_PASSES, replays=TIMED_REPLAYS) / len(lins)) for cfg in fits}
    times = {cfg: us for cfg, us in timed.items() if us is not None}      # None: out of this GPU's resources
    if not times:
        raise RuntimeError(f"no few-row GEMM configuration runs the {kind} GEMM {tuple(w.shape)} ({w.dtype}) on "
                           f"this GPU: {ops.decoder_failures.get(site)}")
    best = min(times, key=times.get)
    return best, {str(cfg): round(us, 2) for cfg, us in times.items()}


@torch.no_grad()
def tune_few_row_gemms(fused: FusedDit, rows: int, with_norm: bool = True) -> int:
    """Give every GEMM of dit_gemms its few-row launch configuration (fused.few_row, by id(Linear)), picked once per
    (shape, kind, weight dtype) for `rows` rows, timed over all the GEMMs of that key (with_norm: the split-K ones
    with the norm after them, pick_config). Returns how many GEMMs run on the few-row GEMM."""
    groups: dict[tuple, list[Linear]] = {}
    for lin, kind in dit_gemms(fused):
        w = lin.w8[0] if lin.w8 is not None else lin.parts[0][0]
        groups.setdefault((tuple(w.shape), kind, w.dtype), []).append(lin)
    for (shape, kind, wdtype), lins in groups.items():
        pick, times = pick_config(fused.ops, lins, kind, rows, fused.dtype, with_norm)
        if times:
            log.info("GR00T DiT GEMM %s %s %s at %d rows (%d GEMMs): %s -> %s", kind, shape, wdtype, rows, len(lins),
                     times, pick)
        for lin in lins:
            fused.few_row[id(lin)] = pick
    return len(fused.few_row)


@torch.no_grad()
def quantize_fused_dit(fused: FusedDit, fp8_dtype: torch.dtype, rows: int, with_norm: bool = True) -> int:
    """Give every GEMM of dit_gemms its weight-only FP8 copy (lin.w8; the bf16 weights and the bias stay: the bias
    is added in the GEMM's epilogue) and its few-row launch configuration (tune_few_row_gemms). Returns how many
    GEMMs read FP8 weights."""
    for lin, _ in dit_gemms(fused):
        (w, _), = lin.parts
        lin.w8 = weight_only_fp8(Linear([(w, None)]), fp8_dtype).w8        # the bias stays in lin.parts
    count = tune_few_row_gemms(fused, rows, with_norm)
    log.info("GR00T DiT: weight-only FP8 (%s, a scale per output channel) on %d GEMMs", fp8_dtype, count)
    return count
