"""The load-time tuning of one executor: which tunings run (the dispatch table says), the decoder GEMMs timed alone
(engine/tuning.py) and then inside the captured denoiser (the chain tuning), the prefix and vision attentions,
and the tuning cache (engine/tuning_cache.py): its key, the picks it stores, and their reuse."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import torch

from flashrt_core.stopping import raise_if_stopped

from . import tuning
from .dispatch import Op
from .kernel_configs import LAUNCH_POLICIES, PREFIX_ATTENTION_IMPLS, VISION_ATTENTION_BACKENDS
from .timing import interleaved_replay_ms
from .tuning_cache import TUNING_CACHE_FORMAT, TuningCache, code_fingerprint, pick_by_name

if TYPE_CHECKING:                       # the executor imports this module
    from .graph_executor import EngineExecutor

log = logging.getLogger(__name__)

# rounds of the chain tuning's interleaved timing (interleaved_replay_ms), 3 replays of one denoise each
CHAIN_TUNING_ROUNDS = 7


def tunings_to_run(ex: EngineExecutor) -> tuple[bool, bool, bool]:
    """Which load-time tunings this engine runs: the decoder GEMMs (unless pinned), the prefix attention, the
    vision attention."""
    d = ex.dispatch
    decoder = d[Op.GEMM_DECODER] == "triton" and not d.pinned(Op.GEMM_DECODER)
    return decoder, d[Op.PREFIX_ATTENTION_TUNING] == "measured", d[Op.VISION_ATTENTION_TUNING] == "measured"


def tune_at_load(ex: EngineExecutor, dtype: torch.dtype) -> None:
    """The load-time tunings: the decoder GEMMs alone (tuning.tune_decoder), then in the captured denoiser
    (tune_decoder_in_chain), the prefix attention and the vision attention's SDPA backend. Where
    options.tuning_cache names a directory that holds this engine's key (tuning_key), its picks are checked
    and used instead (no measuring); else the measured picks are stored there."""
    decoder, prefix_att, vision_att = tunings_to_run(ex)
    if not (decoder or prefix_att or vision_att):
        return
    cache = TuningCache(ex.dispatch.options.tuning_cache) if ex.dispatch.options.tuning_cache else None
    key = tuning_key(ex, dtype) if cache is not None else None
    if cache is not None:
        picks = cache.load(key)
        if picks is not None and use_tuning_picks(ex, picks, decoder, prefix_att, vision_att):
            ex.tuning_source, ex.tuning_cache_path = "cache", cache.path(key)
            log.info("load-time tuning from the cache %s: %s", ex.tuning_cache_path, tuning_picks(ex))
            return
    config, device, ops = ex.config, ex.device, ex.ops
    if decoder:
        timings = tuning.tune_decoder(ops, ex.suffix_len, ex.weights.expert, config.expert.num_heads,
                                      config.expert.head_dim)
        ex.tuned_decoder_kinds = tuple(timings)
        log.info("decoder GEMMs: %s (us: %s)", {k: str(v) for k, v in ops.decoder_impl.items()}, timings)
        if ex.dispatch[Op.CHAIN_TUNING] == "chain":
            ex.decoder_chain_timings = tune_decoder_in_chain(ex)
            log.info("decoder GEMMs in the denoiser: %s, launch policy %s, after %d passes (ms per denoise, "
                     "last pass: %s)", {k: str(v) for k, v in ops.decoder_impl.items()}, ops.launch_policy,
                     ex.decoder_chain_passes, ex.decoder_chain_timings)
    if prefix_att:
        P = tuning_prefix_len(ex)
        g = config.paligemma
        times = tuning.tune_prefix_attention(ops, P, g.num_heads, g.head_dim, dtype, device, g.depth - 1)
        log.info("prefix attention: %s (us per layer at %d keys: %s)", ops.prefix_attention_impl, P, times)
    if vision_att:
        vc = config.vision
        times = tuning.tune_vision_attention(ops, min(2, len(config.view_names)), vc.num_patches, vc.num_heads,
                                             vc.head_dim, dtype, device, vc.depth)
        log.info("vision attention: SDPA backend %s (us per layer: %s)", ops.vision_attention_backend, times)
    ex.tuning_source = "measured"
    if cache is not None:
        ex.tuning_cache_path = cache.store(key, tuning_picks(ex), {
            "decoder_us": ops.decoder_timings, "decoder_chain_ms": ex.decoder_chain_timings,
            "prefix_attention_us": ops.prefix_attention_timings,
            "vision_attention_us": ops.vision_attention_timings})
        if ex.tuning_cache_path is not None:
            log.info("load-time tuning stored in %s", ex.tuning_cache_path)


def tuning_prefix_len(ex: EngineExecutor) -> int:
    """The prefix length of the load-time tunings' workspace: two views (or the model's one) and the text
    bucket of a 48-token prompt."""
    return min(2, len(ex.config.view_names)) * ex.config.vision.num_patches + ex.tuning_text_bucket


def tuning_key(ex: EngineExecutor, dtype: torch.dtype) -> dict:
    """What the load-time tuning's picks depend on (tuning_cache.py): code, GPU, software versions, model
    configuration, dtype, the tuning's rows and workspace, the options (but the cache directory) and the
    dispatch table."""
    if ex.device.type == "cuda":
        props = torch.cuda.get_device_properties(ex.device)
        gpu = {"name": props.name, "capability": f"{props.major}.{props.minor}",
               "sms": props.multi_processor_count}
    else:                                   # nothing is tuned on the CPU; the key is still defined there
        gpu = {"name": ex.device.type}
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    options = {k: v for k, v in dataclasses.asdict(ex.dispatch.options).items()
               if k != "tuning_cache"}                              # it does not change what the tuning picks
    return {"format": TUNING_CACHE_FORMAT, "code": code_fingerprint(), "gpu": gpu, "torch": torch.__version__,
            "cuda": torch.version.cuda, "hip": torch.version.hip, "triton": triton_version,
            "model": dataclasses.asdict(ex.config), "dtype": str(dtype),
            "rows": ex.suffix_len, "text_bucket": ex.tuning_text_bucket,
            "views": min(2, len(ex.config.view_names)),
            "options": options, "dispatch": ex.dispatch.summary()}


def tuning_picks(ex: EngineExecutor) -> dict:
    """The load-time tunings' picks by name, as the tuning cache stores them."""
    decoder, prefix_att, vision_att = tunings_to_run(ex)
    ops = ex.ops
    picks: dict = {"launch_policy": ops.launch_policy}
    if decoder:
        picks["decoder"] = {kind: str(ops.decoder_impl[kind]) for kind in ex.tuned_decoder_kinds}
    if prefix_att:
        picks["prefix_attention"] = ops.prefix_attention_impl
    if vision_att:
        picks["vision_attention"] = ops.vision_attention_backend
    return picks


def use_tuning_picks(ex: EngineExecutor, picks: dict, decoder: bool, prefix_att: bool, vision_att: bool) -> bool:
    """Set the picks of a tuning cache entry: each name must be one of this engine's own candidates, and each
    decoder GEMM pick's product is checked against the library GEMM's on random rows (tuning.check_candidate).
    Where anything fails, nothing is changed, the reason is logged and False returned (the caller measures)."""
    ops = ex.ops
    saved = (dict(ops.decoder_impl), ops.launch_policy, ops.early_sites, ops.prefix_attention_impl,
             ops.vision_attention_backend)
    try:
        if decoder:
            names = picks.get("decoder")
            if not isinstance(names, dict) or not names:
                raise ValueError("the entry has no decoder GEMM picks")
            g = torch.Generator(device=ex.device).manual_seed(0)
            for kind, name in names.items():
                lin = getattr(ex.weights.expert[0], kind, None) if kind in ops.decoder_impl else None
                if lin is None:
                    raise ValueError(f"decoder GEMM kind {kind!r} is not tuned in this engine")
                w = lin.parts[0][0]
                x = torch.randn(ex.suffix_len, w.shape[1], device=w.device, dtype=w.dtype, generator=g)
                impl = pick_by_name(tuning.decoder_candidates(ops, kind, x, lin, ex.config.expert.head_dim), name,
                                    f"the {kind} GEMM")
                tuning.check_candidate(ops, kind, impl, x, lin)
                ops.decoder_impl[kind] = impl
            ex.tuned_decoder_kinds = tuple(names)
        ops.set_launch_policy(pick_by_name(LAUNCH_POLICIES, picks.get("launch_policy"), "launch policy"))
        if prefix_att:
            ops.prefix_attention_impl = pick_by_name(PREFIX_ATTENTION_IMPLS, picks.get("prefix_attention"),
                                                     "the prefix attention")
        if vision_att:
            ops.vision_attention_backend = pick_by_name(VISION_ATTENTION_BACKENDS,
                                                        picks.get("vision_attention"), "the vision attention")
        return True
    except Exception as err:  # noqa: BLE001  a cache entry that does not fit: measure instead, say why
        (decoder_impl, ops.launch_policy, ops.early_sites, ops.prefix_attention_impl,
         ops.vision_attention_backend) = saved
        ops.decoder_impl.clear()
        ops.decoder_impl.update(decoder_impl)
        ex.tuned_decoder_kinds = ()
        log.warning("tuning cache entry not used, measuring instead: %s", err)
        return False


@torch.inference_mode()
def tune_decoder_in_chain(ex: EngineExecutor, rounds: int = CHAIN_TUNING_ROUNDS, reps: int = 3
                          ) -> dict[str, dict[str, float]]:
    """Time each decoder GEMM kind's candidates where they run: inside the denoiser, captured as a graph.

    Timed alone, a GEMM cannot show what it costs its neighbours: a one-shot configuration streams its
    weights before its PDL wait, overlapping the norm or attention ahead of it, and a wider split-K hands the
    norm after it more partials to sum. So, after tune_decoder's isolated pick, one pass over the kinds
    (down, o, gate_up, qkv) captures the whole denoise (every step and layer, on a workspace of two views and
    the text bucket of a 48-token prompt, zero K/V caches) once per candidate of that kind, the other kinds at their
    current pick, and keeps the candidate with the lowest time.
    The candidates of one kind are all captured first and then replayed in turn, `rounds` rounds of `reps`
    replays each, in a rotating order (interleaved_replay_ms): the same denoise drifts by up to 0.4 ms between
    captures timed one after the other, more than most candidates differ by.
    With kernel_launch=pdl_early (pdl_early_trigger, the default), the launch policy (kernel_configs.LAUNCH_POLICIES:
    which kernels release the next one at their start) is timed the same way first, under key "launch_policy".
    The picks depend on each other (an engine whose first pass begins from other isolated picks can keep GEMMs
    that another's pass replaces), so the pass repeats, up to options.chain_tuning_passes times, until one
    changes nothing (ex.decoder_chain_passes: how many ran).
    Returns {kind: {candidate: ms per denoise}} of the last pass."""
    cfg, ops = ex.config, ex.ops
    views = tuple(range(min(2, len(cfg.view_names))))
    ws = ex.make_entry(views, None, ex.tuning_text_bucket).ws
    P = ws.k_cache.shape[2] - ex.suffix_len
    key_bias = torch.zeros(P, device=ex.device)
    n_valid = torch.full((1,), P, device=ex.device, dtype=torch.int64)
    ws.noise.normal_()

    def capture() -> torch.cuda.CUDAGraph:
        return ex.capture_denoise(ws, key_bias, n_valid)

    def timed(graphs: dict) -> dict:
        return interleaved_replay_ms(graphs, rounds, reps)

    timings: dict[str, dict[str, float]] = {}

    def picks() -> tuple:
        return ops.launch_policy, tuple(sorted((k, str(v)) for k, v in ops.decoder_impl.items()))

    ex.decoder_chain_passes = 0
    for _ in range(ex.dispatch.options.chain_tuning_passes):
        before = picks()
        ex.decoder_chain_passes += 1
        if ex.dispatch[Op.KERNEL_LAUNCH] == "pdl_early":
            timings["launch_policy"] = pick_launch_policy(ex, capture, timed)
        for kind in ("down", "o", "gate_up", "qkv"):
            times = pick_decoder_gemm_in_chain(ex, kind, capture, timed)
            if times:
                timings[kind] = times
        if picks() == before:
            break
    return timings


def pick_launch_policy(ex: EngineExecutor, capture, timed) -> dict[str, float]:
    """One pass of the chain tuning over the launch policies: each captured, all timed in turn, the fastest
    kept."""
    return keep_fastest_in_chain(LAUNCH_POLICIES, ex.ops.set_launch_policy, lambda _: capture(), timed)


def pick_decoder_gemm_in_chain(ex: EngineExecutor, kind: str, capture, timed) -> dict[str, float]:
    """One pass of the chain tuning over one decoder GEMM kind's candidates (those the isolated tuning did not
    leave out): each captured, all timed in turn, the fastest kept; {} where the kind has nothing to choose
    between. A candidate that fails to capture is left out as tuning.time_candidate says."""
    ops = ex.ops
    lin = getattr(ex.weights.expert[0], kind)
    if kind not in ops.decoder_timings or lin is None:      # not tuned alone: pinned or library-only
        return {}
    x = torch.empty(ex.suffix_len, lin.parts[0][0].shape[1], device=ex.device, dtype=ex.dtype)
    candidates = tuning.decoder_candidates(ops, kind, x, lin, ex.config.expert.head_dim)
    if len(candidates) < 2:
        return {}
    def apply(impl) -> None:
        ops.decoder_impl[kind] = impl
    failed = ops.decoder_failures.get(kind, {})
    times = keep_fastest_in_chain([impl for impl in candidates if str(impl) not in failed], apply,
                                  lambda impl: tuning.time_candidate(ops, kind, impl, capture), timed,
                                  fallback=ops.decoder_impl[kind])
    return {str(k): v for k, v in times.items()}


def keep_fastest_in_chain(candidates, apply, capture, timed, fallback=None) -> dict:
    """One choice of the chain tuning: each candidate applied (apply(c)) and the denoiser captured with it
    (capture(c): a graph, or None where the candidate is left out), all graphs timed in turn (timed: {c: ms}), and
    the fastest applied, or `fallback` where none could be captured. Returns {candidate: ms}."""
    graphs = {}
    for cand in candidates:
        raise_if_stopped(f"tuning: capturing the denoiser with {cand}")
        apply(cand)
        graph = capture(cand)
        if graph is not None:
            graphs[cand] = graph
    times = timed(graphs) if graphs else {}
    del graphs
    apply(min(times, key=times.get) if times else fallback)
    return times
