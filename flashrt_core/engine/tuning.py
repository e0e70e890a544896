"""Load-time measurement of single ops: each candidate checked against a reference on the same input, then timed
graph-captured (engine/timing.py), and the fastest kept in the Ops' state. The decoder GEMMs (per kind: the
library GEMM, the Triton and shared-memory configurations, the RoPE-epilogue GEMMs), the prefix attention's forms
and the vision attention's SDPA backends. engine/load_tuning.py decides which of these run for an executor."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from flashrt_core.stopping import raise_if_stopped

from .kernel_configs import (PREFIX_ATTENTION_IMPLS, ROPE_GEMM_CANDIDATES, SKINNY_CANDIDATES, SMEM_CANDIDATES,
                             VISION_ATTENTION_BACKENDS, WGMMA_PREFIX_ATTENTION, RopeGemmConfig, SmemConfig)
from .ops import KeyMask, Ops
from .timing import graph_time_us
from .weights import Linear

log = logging.getLogger(__name__)

try:
    from triton.runtime.errors import OutOfResources
    OUT_OF_RESOURCES: tuple[type[BaseException], ...] = (OutOfResources,)
except ImportError:                     # no Triton: no Triton candidate is ever timed
    OUT_OF_RESOURCES = ()

# Each decoder GEMM candidate's product is checked against the library GEMM on the same input before it is timed
# (relative L2 error): bf16 rounding and summation order.
DECODER_CHECK_REL_L2 = 2e-2
# Each attention candidate's output is checked against the fp32 softmax attention before it is timed: bf16 outputs
# of |v| ~ 1 values.
VISION_ATTENTION_CHECK_ATOL = 3e-2
PREFIX_ATTENTION_CHECK_ATOL = 3e-2


class CandidateMismatch(RuntimeError):
    """A decoder GEMM candidate whose product disagrees with the library GEMM's (check_candidate)."""


def decoder_candidates(ops: Ops, kind: str, x: torch.Tensor, lin: Linear, head_dim: int) -> list:
    """The implementations the load-time tuning times for one decoder GEMM kind at x's shape: the library
    GEMM, every Triton configuration that fits, and for qkv the RoPE-epilogue GEMMs where they may run; with
    weight-only FP8 weights (lin.w8) the Triton configurations alone (the others read bf16 weights)."""
    if lin.w8 is not None:
        return [c for c in SKINNY_CANDIDATES[kind] if ops.skinny_fits(x, lin, c)]
    candidates = ["library"] + [c for c in SKINNY_CANDIDATES[kind] if ops.skinny_fits(x, lin, c)]
    candidates += [c for c in SMEM_CANDIDATES[kind] if ops.smem_fits(x, lin, kind, c)]
    if kind == "qkv":
        candidates += [c for c in ROPE_GEMM_CANDIDATES if ops.rope_gemm_fits(x, lin, c, head_dim)]
    return candidates


def time_candidate(ops: Ops, kind: str, impl, measure) -> float | None:
    """measure() for one tuning candidate. A candidate that needs more shared memory or registers than this
    GPU has (Triton's OutOfResources), one whose product disagrees with the library GEMM's
    (CandidateMismatch, check_candidate), and a shared-memory GEMM (SmemConfig: Gluon, whose compiler is checked
    on the H200 only) that fails to compile or launch, is left out and recorded in decoder_failures (under `kind`); any
    other failure is raised. A stop (flashrt_core.stopping) is raised before the measurement."""
    raise_if_stopped(f"tuning: timing {kind} candidate {impl}")
    try:
        return measure()
    except Exception as err:  # noqa: BLE001  only the kinds of failure below are a candidate's to have
        if not (isinstance(err, (CandidateMismatch, *OUT_OF_RESOURCES)) or isinstance(impl, SmemConfig)):
            raise
        log.warning("GEMM candidate %s for %s cannot run on this GPU, left out: %s", impl, kind, err)
        ops.decoder_failures.setdefault(kind, {})[str(impl)] = repr(err)
        return None


def product(ops: Ops, x: torch.Tensor, lin: Linear, kind: str, impl) -> torch.Tensor:
    """A decoder GEMM's product on x in fp32, its split-K partials summed (an FP8-weight layer's "library" is its
    default Triton GEMM, which may return partials)."""
    out = ops.decoder(x, lin, kind, impl).float()
    return out.sum(0) if out.dim() == 3 else out


def check_candidate(ops: Ops, kind: str, impl, x: torch.Tensor, lin: Linear,
                    want: torch.Tensor | None = None) -> None:
    """Raise CandidateMismatch when a Triton or shared-memory GEMM candidate's product on x (its split-K
    partials summed) is off the library GEMM's by more than DECODER_CHECK_REL_L2 (relative L2), so that no
    candidate is picked for its speed alone. The RoPE-epilogue GEMMs
    (RopeGemmConfig) write Q / K / V where the attention reads them and are not checked here.
    want: the library product on x in fp32, when the caller has it (the tuning computes it once per kind)."""
    if impl == "library" or isinstance(impl, RopeGemmConfig):
        return
    if want is None:
        want = product(ops, x, lin, kind, "library")
    got = product(ops, x, lin, kind, impl)
    bound = DECODER_CHECK_REL_L2
    if got.shape != want.shape:
        raise CandidateMismatch(f"{kind} {impl}: product {tuple(got.shape)}, library {tuple(want.shape)}")
    err = float((got - want).norm() / want.norm().clamp_min(1e-30))
    if not err <= bound:
        raise CandidateMismatch(f"{kind} {impl}: relative L2 error {err:.3g} against the library GEMM "
                                f"(bound {bound})")


def tune_decoder(ops: Ops, rows: int, layers, heads: int, head_dim: int, reps: int = 4
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
        if ops.decoder_impl[kind] == "library" or lins[0] is None:
            continue
        w = lins[0].parts[0][0]
        x = torch.randn(rows, w.shape[1], device=w.device, dtype=w.dtype, generator=g)

        def run_all(impl):
            for lin in lins:
                if kind == "qkv" and not ops.rope_in_attention_for(rows):
                    ops.decoder_qkv_rope(x, lin, *rope[:3], rope[3], cache[0], cache[1], 0, heads, 1, 1.0,
                                         impl=impl)
                else:
                    ops.decoder(x, lin, kind, impl)
        want = product(ops, x, lins[0], kind, "library")              # what every candidate is checked against

        def checked_time(impl):
            check_candidate(ops, kind, impl, x, lins[0], want)
            return graph_time_us(lambda: run_all(impl), reps)
        times = {}
        for impl in decoder_candidates(ops, kind, x, lins[0], head_dim):
            us = time_candidate(ops, kind, impl, lambda: checked_time(impl))
            if us is not None:
                times[impl] = us / len(lins)
        ops.decoder_impl[kind] = min(times, key=times.get)
        ops.decoder_timings[kind] = {str(k): v for k, v in times.items()}
    return ops.decoder_timings


def prefix_attention_candidates(ops: Ops, P: int, heads: int, head_dim: int, device: torch.device) -> list[str]:
    """The implementations tune_prefix_attention times: all but the wgmma kernel's forms, which join where they
    are switched on (prefix_attention_wgmma) and the kernel serves this shape and device."""
    def served(form: dict) -> bool:
        return ops.k.prefix_attention_supported(P * heads, P, head_dim, device, form.get("splits", 1),
                                                form.get("block_n", ops.k.PREFIX_ATTENTION_BLOCK_N))

    out = []
    for impl in PREFIX_ATTENTION_IMPLS:
        if impl in WGMMA_PREFIX_ATTENTION:
            if not (ops.prefix_attention_wgmma and served(WGMMA_PREFIX_ATTENTION[impl])):
                continue
        out.append(impl)
    return out


def tune_prefix_attention(ops: Ops, P: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
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
    want = ops.k.attention_reference(q.float().reshape(P * heads, head_dim), k.float(), v.float(), bias, P,
                                     None, heads, 1.0).reshape(P, heads * head_dim)    # fp32, heads stacked
    candidates = prefix_attention_candidates(ops, P, heads, head_dim, device)
    times = checked_times(ops, f"prefix attention (P={P})", candidates,
                          lambda impl: ops.prefix_attention(q, k, v, mask, impl), want,
                          PREFIX_ATTENTION_CHECK_ATOL, layers, reps)
    ops.prefix_attention_impl = min(times, key=times.get)
    ops.prefix_attention_timings = times
    return times


def checked_times(ops: Ops, what: str, candidates, run: Callable[[str], torch.Tensor], want: torch.Tensor,
                  atol: float, layers: int, reps: int) -> dict[str, float]:
    """For each candidate: run(candidate) checked against `want` (the fp32 softmax attention, within atol), then
    timed as `layers` calls graph-captured, us per call. One that disagrees is logged and left out, never timed;
    one that cannot run here (a RuntimeError: no kernel for this shape, dtype or layout) is left out."""
    times = {}
    for cand in candidates:
        raise_if_stopped(f"tuning: timing {what} candidate {cand}")
        try:
            err = float((run(cand).float() - want).abs().max())
            if not err <= atol:
                log.warning("%s %s is off by %.3g against the softmax attention, left out", what, cand, err)
                continue
            times[cand] = graph_time_us(lambda: [run(cand) for _ in range(layers)], reps) / layers
        except RuntimeError as err:
            log.info("%s %s cannot run: %s", what, cand, err)
    return times


def tune_vision_attention(ops: Ops, views: int, tokens: int, heads: int, head_dim: int, dtype: torch.dtype,
                          device: torch.device, layers: int, reps: int = 3) -> dict[str, float]:
    """Time the vision attention on each SDPA backend (graph-captured, `layers` calls per pass, as the vision
    tower runs them) on random q / k / v laid out as forward.vision takes them from the QKV GEMM's output
    (strided views of one (views, tokens, 3, heads, head_dim) tensor), each call with its output's move to the
    token-major rows the O GEMM reads (Ops.attention: a copy for a backend that writes head-major), and keep the
    fastest. A backend with
    no kernel for this shape, dtype or layout is left out. Each backend's output is first checked against the
    fp32 softmax attention on the same q / k / v (VISION_ATTENTION_CHECK_ATOL); one that disagrees is left out
    and logged, never timed or run.
    Returns {backend: us per call}."""
    g = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(views, tokens, 3, heads, head_dim, device=device, dtype=dtype, generator=g)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))                       # (V, H, N, Dh)
    scale = head_dim ** -0.5
    want = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, dim=-1) @ v.float()   # fp32
    want = want.transpose(1, 2).reshape(views * tokens, heads * head_dim)           # Ops.attention's rows
    times = checked_times(ops, "vision attention backend", VISION_ATTENTION_BACKENDS,
                          lambda backend: ops.attention(q, k, v, scale, backend), want,
                          VISION_ATTENTION_CHECK_ATOL, layers, reps)
    ops.vision_attention_backend = min(times, key=times.get)
    ops.vision_attention_timings = times
    return times
