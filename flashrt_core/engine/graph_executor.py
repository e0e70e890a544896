"""The graph-replay executor: static buffers per input signature, the whole predict captured once, replayed.

Per call on the host: the observation is written into a pinned staging blob, ONE host-to-device copy moves it,
ONE graph replay runs preprocessing, vision, prefix and the unrolled denoising, ONE device-to-host copy brings
the actions back. Nothing is allocated and nothing syncs inside the replay.

A graph is captured per signature: which views are present, their image sizes, and the text bucket (the smallest
of `EngineOptions.text_buckets` that holds the prompt; padding tokens are masked), so a new instruction reuses a
graph and never forces a recapture. A call with real-time chunking's hard prefix (rtc_blend) has a graph of its own
per signature, which serves every delay and previous chunk. All graphs share one memory pool (they never run at the
same time).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from flashrt_core.config import ModelConfig
from flashrt_core.errors import InputError
from flashrt_core.model import PiModel
from flashrt_core.rtc import RtcPlan

from . import rtc_blend
from .dispatch import Dispatch, Op, Switch
from .forward import Workspace, denoise, forward, pi0_fused_step_ends, prefix, vision
from .host_wait import HostWait
from .kernel_import import load_kernels
from .ops import LAUNCH_POLICIES, PREFIX_ATTENTION_IMPLS, VISION_ATTENTION_BACKENDS, Ops
from .tuning_cache import TUNING_CACHE_FORMAT, TuningCache, code_fingerprint, pick_by_name
from .weights import EngineWeights, prepare_weights

log = logging.getLogger(__name__)

_ALIGN = 256  # bytes between fields of the staging blob
# rounds of the chain tuning's interleaved timing (interleaved_replay_ms), 3 replays of one denoise each
CHAIN_TUNING_ROUNDS = 7
TUNING_PROMPT_TOKENS = 48           # the load-time tunings time the text bucket that holds a prompt this long


class StagingBlob:
    """Typed fields over one pinned host buffer and one device buffer of the same layout: one copy moves all."""

    def __init__(self, fields: list[tuple[str, tuple[int, ...], torch.dtype]], device: torch.device):
        offsets, size = {}, 0
        for name, shape, dtype in fields:
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            offsets[name] = (size, nbytes, shape, dtype)
            size += -(-nbytes // _ALIGN) * _ALIGN
        self.host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self.device = torch.empty(size, dtype=torch.uint8, device=device)
        self.host_views = {n: self._view(self.host, *o) for n, o in offsets.items()}
        self.device_views = {n: self._view(self.device, *o) for n, o in offsets.items()}

    @staticmethod
    def _view(buf, offset, nbytes, shape, dtype):
        return buf[offset:offset + nbytes].view(dtype).view(shape)

    def upload(self) -> None:
        self.device.copy_(self.host, non_blocking=True)


@dataclass
class _Entry:
    ws: Workspace
    staging: StagingBlob | None
    out_host: torch.Tensor          # pinned (horizon, A)
    graph: torch.cuda.CUDAGraph | None


class EngineExecutor:
    """sample_actions (the executor contract of flashrt_core.executor) and the fast host path predict_observation."""

    uses_model = False           # reads the PiModel once, at load, into its own prepared weights

    def __init__(self, model: PiModel, config: ModelConfig, device: torch.device, dispatch: Dispatch,
                 dtype: torch.dtype = torch.bfloat16, action_affine: tuple[np.ndarray, np.ndarray] | None = None,
                 weights: EngineWeights | None = None):
        """action_affine: (scale, offset) of the action unnormalization (Normalizer.action_affine), applied
        inside the graph for predict_observation(unnormalize=True); None = identity. weights: prepared weights
        to share with another executor of the same model (e.g. another horizon); None = prepare them here."""
        device = torch.device(device)
        if dispatch[Op.EXECUTOR] == "graph" and device.type != "cuda":
            raise ValueError(f"graph replay needs a CUDA/ROCm device, got {device}")
        if config.paligemma.num_kv_heads != 1 or config.expert.num_kv_heads != 1:
            raise ValueError("the engine implements multi-query attention with one KV head (pi0 / pi0.5); got "
                             f"{config.paligemma.num_kv_heads} / {config.expert.num_kv_heads} KV heads")
        self.config = config
        self.device = device
        self.dtype = dtype
        self.dispatch = dispatch
        self.use_graph = dispatch[Op.EXECUTOR] == "graph"
        opts = dispatch.options
        self.name = "engine-" + ("graph" if self.use_graph else "eager") + (
            "-fp8" if dispatch[Op.GEMM_PREFIX] == "fp8" else "-bf16")
        self.ops = Ops(dispatch)
        fold = dispatch.options.switch_on(Switch.FUSED_WEIGHTS)
        mlp_pad = dispatch.options.vision_mlp_pad if dispatch.options.fast_paths else 0
        if weights is not None and (weights.dtype != dtype or weights.folded != fold
                                    or weights.vision_mlp_pad != mlp_pad):
            raise ValueError(f"shared weights are {weights.dtype} folded={weights.folded} vision_mlp_pad="
                             f"{weights.vision_mlp_pad}, this executor needs {dtype} folded={fold} "
                             f"vision_mlp_pad={mlp_pad}")
        self.weights = weights if weights is not None else prepare_weights(model, dtype, fold=fold,
                                                                            vision_mlp_pad=mlp_pad)
        buckets = {b for b in dispatch.options.text_buckets if b < config.max_token_len} | {config.max_token_len}
        buckets = sorted(buckets)
        self.text_buckets = tuple(buckets)
        # the load-time tunings run at the bucket of a typical prompt, whatever the smallest bucket is
        self.tuning_text_bucket = self._bucket(min(TUNING_PROMPT_TOKENS, config.max_token_len) - 1)
        self.suffix_len = config.action_horizon + (0 if self.weights.tables is not None else 1)
        max_pos = len(config.view_names) * config.vision.num_patches + config.max_token_len + self.suffix_len
        cos, sin = load_kernels().rope_tables(max_pos, config.paligemma.head_dim, config.paligemma.rope_max_wavelength,
                                              device)
        self._rope = (cos, sin)
        self._suffix_visible = self._suffix_visibility()
        self.decoder_chain_timings: dict[str, dict[str, float]] = {}   # set by _tune_decoder_in_chain
        self.decoder_chain_passes = 0
        self._affine = None if action_affine is None else tuple(
            torch.as_tensor(np.asarray(a, dtype=np.float32), device=device) for a in action_affine)
        if self._affine is not None and any(a.shape != (config.max_action_dim,) for a in self._affine):
            raise ValueError(f"action_affine must be (scale, offset) of {config.max_action_dim} values each, got "
                             f"shapes {[tuple(a.shape) for a in self._affine]}")
        if pi0_fused_step_ends(self.weights, self.ops):
            self.weights.pi0_step_tables()              # pi0's folded time MLP tables, made before any capture
        self.tuning_source = "none"     # "measured", "cache" (options.tuning_cache) or "none" (nothing to tune)
        self.tuned_decoder_kinds: tuple[str, ...] = ()                 # the decoder GEMM kinds with a pick
        self.tuning_cache_path: Path | None = None
        if device.type == "cuda":
            self._tune_at_load(dtype)
        self._entries: dict[tuple, _Entry] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graph else None
        self.capture_seconds: dict[tuple, float] = {}
        self._host_wait = HostWait(dispatch.options.host_wait, self.device)
        self.fp8_calibrated = False
        log.info("engine ready: %s, text buckets %s, dispatch %s", self.name, self.text_buckets, dispatch.summary())

    # ---------------------------------------------------------------------------------------------- set-up
    def _tunings(self) -> tuple[bool, bool, bool]:
        """Which load-time tunings this engine runs: the decoder GEMMs (unless pinned), the prefix attention, the
        vision attention."""
        d = self.dispatch
        decoder = d[Op.GEMM_DECODER] == "triton" and d.options.overrides.get(Op.GEMM_DECODER.value) != "triton"
        return decoder, d[Op.PREFIX_ATTENTION] == "measured", d[Op.VISION_ATTENTION] == "measured"

    def _tune_at_load(self, dtype: torch.dtype) -> None:
        """The load-time tunings: the decoder GEMMs alone (ops.tune_decoder), then in the captured denoiser
        (_tune_decoder_in_chain), the prefix attention and the vision attention's SDPA backend. Where
        options.tuning_cache names a directory that holds this engine's key (tuning_key), its picks are checked
        and used instead (no measuring); else the measured picks are stored there."""
        decoder, prefix_att, vision_att = self._tunings()
        if not (decoder or prefix_att or vision_att):
            return
        cache = TuningCache(self.dispatch.options.tuning_cache) if self.dispatch.options.tuning_cache else None
        key = self.tuning_key(dtype) if cache is not None else None
        if cache is not None:
            picks = cache.load(key)
            if picks is not None and self._use_tuning_picks(picks, decoder, prefix_att, vision_att):
                self.tuning_source, self.tuning_cache_path = "cache", cache.path(key)
                log.info("load-time tuning from the cache %s: %s", self.tuning_cache_path, self.tuning_picks())
                return
        config, device, ops = self.config, self.device, self.ops
        if decoder:
            timings = ops.tune_decoder(self.suffix_len, self.weights.expert, config.expert.num_heads,
                                       config.expert.head_dim)
            self.tuned_decoder_kinds = tuple(timings)
            log.info("decoder GEMMs: %s (us: %s)", {k: str(v) for k, v in ops.decoder_impl.items()}, timings)
            if self.dispatch[Op.DECODER_TUNING] == "chain" and self.use_graph:
                self.decoder_chain_timings = self._tune_decoder_in_chain()
                log.info("decoder GEMMs in the denoiser: %s, launch policy %s, after %d passes (ms per denoise, "
                         "last pass: %s)", {k: str(v) for k, v in ops.decoder_impl.items()}, ops.launch_policy,
                         self.decoder_chain_passes, self.decoder_chain_timings)
        if prefix_att:
            P = self._tuning_prefix_len()
            g = config.paligemma
            times = ops.tune_prefix_attention(P, g.num_heads, g.head_dim, dtype, device, g.depth - 1)
            log.info("prefix attention: %s (us per layer at %d keys: %s)", ops.prefix_attention_impl, P, times)
        if vision_att:
            vc = config.vision
            times = ops.tune_vision_attention(min(2, len(config.view_names)), vc.num_patches, vc.num_heads,
                                              vc.head_dim, dtype, device, vc.depth)
            log.info("vision attention: SDPA backend %s (us per layer: %s)", ops.vision_attention_backend, times)
        self.tuning_source = "measured"
        if cache is not None:
            self.tuning_cache_path = cache.store(key, self.tuning_picks(), {
                "decoder_us": ops.decoder_timings, "decoder_chain_ms": self.decoder_chain_timings,
                "prefix_attention_us": ops.prefix_attention_timings,
                "vision_attention_us": ops.vision_attention_timings})
            if self.tuning_cache_path is not None:
                log.info("load-time tuning stored in %s", self.tuning_cache_path)

    def _tuning_prefix_len(self) -> int:
        """The prefix length of the load-time tunings' workspace: two views (or the model's one) and the text
        bucket of a 48-token prompt."""
        return min(2, len(self.config.view_names)) * self.config.vision.num_patches + self.tuning_text_bucket

    def tuning_key(self, dtype: torch.dtype) -> dict:
        """What the load-time tuning's picks depend on (tuning_cache.py): code, GPU, software versions, model
        configuration, dtype, the tuning's rows and workspace, the options (but the cache directory) and the
        dispatch table."""
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            gpu = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                   "sms": props.multi_processor_count}
        else:                                   # nothing is tuned on the CPU; the key is still defined there
            gpu = {"name": self.device.type}
        try:
            import triton
            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        options = {k: v for k, v in dataclasses.asdict(self.dispatch.options).items()
                   if k not in ("tuning_cache", "host_wait")}           # neither changes what the tuning picks
        return {"format": TUNING_CACHE_FORMAT, "code": code_fingerprint(), "gpu": gpu, "torch": torch.__version__,
                "cuda": torch.version.cuda, "hip": torch.version.hip, "triton": triton_version,
                "model": dataclasses.asdict(self.config), "dtype": str(dtype),
                "rows": self.suffix_len, "text_bucket": self.tuning_text_bucket,
                "views": min(2, len(self.config.view_names)),
                "options": options, "dispatch": self.dispatch.summary()}

    def tuning_picks(self) -> dict:
        """The load-time tunings' picks by name, as the tuning cache stores them."""
        decoder, prefix_att, vision_att = self._tunings()
        ops = self.ops
        picks: dict = {"launch_policy": ops.launch_policy}
        if decoder:
            picks["decoder"] = {kind: str(ops.decoder_impl[kind]) for kind in self.tuned_decoder_kinds}
        if prefix_att:
            picks["prefix_attention"] = ops.prefix_attention_impl
        if vision_att:
            picks["vision_attention"] = ops.vision_attention_backend
        return picks

    def _use_tuning_picks(self, picks: dict, decoder: bool, prefix_att: bool, vision_att: bool) -> bool:
        """Set the picks of a tuning cache entry: each name must be one of this engine's own candidates, and each
        decoder GEMM pick's product is checked against the library GEMM's on random rows (ops.check_candidate).
        Where anything fails, nothing is changed, the reason is logged and False returned (the caller measures)."""
        ops = self.ops
        saved = (dict(ops.decoder_impl), ops.launch_policy, ops.early_sites, ops.prefix_attention_impl,
                 ops.vision_attention_backend)
        try:
            if decoder:
                names = picks.get("decoder")
                if not isinstance(names, dict) or not names:
                    raise ValueError("the entry has no decoder GEMM picks")
                g = torch.Generator(device=self.device).manual_seed(0)
                for kind, name in names.items():
                    lin = getattr(self.weights.expert[0], kind, None) if kind in ops.decoder_impl else None
                    if lin is None:
                        raise ValueError(f"decoder GEMM kind {kind!r} is not tuned in this engine")
                    w = lin.parts[0][0]
                    x = torch.randn(self.suffix_len, w.shape[1], device=w.device, dtype=w.dtype, generator=g)
                    impl = pick_by_name(ops.decoder_candidates(kind, x, lin, self.config.expert.head_dim), name,
                                        f"the {kind} GEMM")
                    ops.check_candidate(kind, impl, x, lin)
                    ops.decoder_impl[kind] = impl
                self.tuned_decoder_kinds = tuple(names)
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
            self.tuned_decoder_kinds = ()
            log.warning("tuning cache entry not used, measuring instead: %s", err)
            return False

    @torch.inference_mode()
    def _tune_decoder_in_chain(self, rounds: int = CHAIN_TUNING_ROUNDS, reps: int = 3
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
        With kernel_launch=pdl_early (pdl_early_trigger, the default), the launch policy (ops.LAUNCH_POLICIES:
        which kernels release the next one at their start) is timed the same way first, under key "launch_policy".
        The picks depend on each other (an engine whose first pass begins from other isolated picks can keep GEMMs
        that another's pass replaces), so the pass repeats, up to options.chain_tuning_passes times, until one
        changes nothing (self.decoder_chain_passes: how many ran).
        Returns {kind: {candidate: ms per denoise}} of the last pass."""
        cfg, ops = self.config, self.ops
        views = tuple(range(min(2, len(cfg.view_names))))
        ws = self._make_entry(views, None, self.tuning_text_bucket).ws
        P = ws.k_cache.shape[2] - self.suffix_len
        key_bias = torch.zeros(P, device=self.device)
        n_valid = torch.full((1,), P, device=self.device, dtype=torch.int64)
        ws.noise.normal_()

        def capture() -> torch.cuda.CUDAGraph:
            return self.capture_denoise(ws, key_bias, n_valid)

        def timed(graphs: dict) -> dict:
            return interleaved_replay_ms(graphs, rounds, reps)

        timings: dict[str, dict[str, float]] = {}

        def picks() -> tuple:
            return ops.launch_policy, tuple(sorted((k, str(v)) for k, v in ops.decoder_impl.items()))

        self.decoder_chain_passes = 0
        for _ in range(self.dispatch.options.chain_tuning_passes):
            before = picks()
            self.decoder_chain_passes += 1
            if self.dispatch[Op.KERNEL_LAUNCH] == "pdl_early":
                timings["launch_policy"] = self._pick_launch_policy(capture, timed)
            for kind in ("down", "o", "gate_up", "qkv"):
                times = self._pick_decoder_gemm_in_chain(kind, capture, timed)
                if times:
                    timings[kind] = times
            if picks() == before:
                break
        return timings

    def capture_denoise(self, ws: Workspace, key_bias: torch.Tensor, n_valid: torch.Tensor) -> torch.cuda.CUDAGraph:
        """The denoise alone (every step and layer) on `ws` with the current ops settings, captured as a CUDA graph
        and replayed once: one eager run on the side stream first (compiles, builds descriptors, warms the library
        handles). What the chain tuning times, and tools/denoise_timing.py's A/B benchmarks."""
        stream = side_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            denoise(ws, self.weights, self.ops, key_bias, n_valid)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            denoise(ws, self.weights, self.ops, key_bias, n_valid)
        graph.replay()
        return graph

    def _pick_launch_policy(self, capture, timed) -> dict[str, float]:
        """One pass of the chain tuning over the launch policies: each captured, all timed in turn, the fastest
        kept."""
        return keep_fastest_in_chain(LAUNCH_POLICIES, self.ops.set_launch_policy, lambda _: capture(), timed)

    def _pick_decoder_gemm_in_chain(self, kind: str, capture, timed) -> dict[str, float]:
        """One pass of the chain tuning over one decoder GEMM kind's candidates (those the isolated tuning did not
        leave out): each captured, all timed in turn, the fastest kept; {} where the kind has nothing to choose
        between. A candidate that fails to capture is left out as ops.time_candidate says."""
        ops = self.ops
        lin = getattr(self.weights.expert[0], kind)
        if kind not in ops.decoder_timings or lin is None:      # not tuned alone: pinned or library-only
            return {}
        x = torch.empty(self.suffix_len, lin.parts[0][0].shape[1], device=self.device, dtype=self.dtype)
        candidates = ops.decoder_candidates(kind, x, lin, self.config.expert.head_dim)
        if len(candidates) < 2:
            return {}
        def apply(impl) -> None:
            ops.decoder_impl[kind] = impl
        failed = ops.decoder_failures.get(kind, {})
        times = keep_fastest_in_chain([impl for impl in candidates if str(impl) not in failed], apply,
                                      lambda impl: ops.time_candidate(kind, impl, capture), timed,
                                      fallback=ops.decoder_impl[kind])
        return {str(k): v for k, v in times.items()}

    def _suffix_visibility(self) -> torch.Tensor:
        """Suffix keys each suffix token sees (openpi ar flags; blocks are contiguous, so a count suffices):
        pi0.5 [a0..] = [1, 0..] -> all S; pi0 [state, a0, a1..] = [1, 1, 0..] -> state 1, actions S."""
        ar = torch.zeros(self.suffix_len, dtype=torch.bool)                             # (S,)
        ar[: self.suffix_len - self.config.action_horizon + 1] = True
        blocks = torch.cumsum(ar.long(), 0)
        allowed = blocks[None, :] <= blocks[:, None]                                     # (S query, S key)
        visible = allowed.sum(1)
        assert bool((allowed == (torch.arange(self.suffix_len)[None] < visible[:, None])).all())
        return visible.to(torch.int32).to(self.device)

    def _bucket(self, last_valid: int) -> int:
        for b in self.text_buckets:
            if b >= last_valid + 1:
                return b
        raise InputError(f"prompt needs {last_valid + 1} token slots, more than max_token_len "
                         f"{self.config.max_token_len}")

    def _make_entry(self, views: tuple[int, ...], image_shapes: tuple | None, text_len: int,
                    rtc: bool = False) -> _Entry:
        """rtc: the workspace also holds real-time chunking's hard-prefix buffers (rtc_blend)."""
        cfg, dev = self.config, self.device
        n = cfg.vision.num_patches
        size = cfg.vision.image_size
        fields = [("tokens", (text_len,), torch.int64), ("token_mask", (text_len,), torch.bool),
                  ("state", (cfg.max_action_dim,), torch.float32),
                  ("noise", (cfg.action_horizon, cfg.max_action_dim), torch.float32)]
        if image_shapes is not None:
            fields += [(f"image{i}", (h, w, 3), torch.uint8) for i, (h, w) in enumerate(image_shapes)]
        else:
            fields += [("pixels", (len(views), 3, size, size), torch.float32)]
        if rtc:
            fields += rtc_blend.staging_fields(cfg.action_horizon, cfg.max_action_dim)
        staging = StagingBlob(fields, dev)
        dv = staging.device_views
        P = len(views) * n + text_len
        S = self.suffix_len
        g = cfg.paligemma
        cache_shape = (g.depth, 1, P + S, g.head_dim)
        ws = Workspace(
            views=views,
            images=None if image_shapes is None else [dv[f"image{i}"] for i in range(len(views))],
            pixels=None if image_shapes is not None else dv["pixels"],
            tokens=dv["tokens"], token_mask=dv["token_mask"], state=dv["state"], noise=dv["noise"],
            actions=torch.empty(cfg.action_horizon, cfg.max_action_dim, device=dev),
            robot_actions=torch.empty(cfg.action_horizon, cfg.max_action_dim, device=dev),
            action_affine=self._affine,
            k_cache=torch.zeros(cache_shape, device=dev, dtype=self.dtype),
            v_cache=torch.zeros(cache_shape, device=dev, dtype=self.dtype),
            rope_cos=self._rope[0], rope_sin=self._rope[1], suffix_visible=self._suffix_visible)
        if rtc:
            ws.extras["rtc"] = rtc_blend.make_buffers(dv, len(self.weights.dts))
        out_host = torch.empty(cfg.action_horizon, cfg.max_action_dim, pin_memory=dev.type == "cuda")
        return _Entry(ws, staging, out_host, None)

    @torch.inference_mode()
    def _capture(self, key: tuple, entry: _Entry) -> None:
        """Warm up (compiles kernels, creates handles) then capture forward() into one graph."""
        start = time.perf_counter()
        stream = side_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                forward(entry.ws, self.weights, self.ops)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            forward(entry.ws, self.weights, self.ops)
        torch.cuda.synchronize(self.device)
        entry.graph = graph
        self.capture_seconds[key] = time.perf_counter() - start
        log.info("captured graph %s in %.2f s", key, self.capture_seconds[key])

    def _entry(self, key: tuple, views, image_shapes, text_len) -> _Entry:
        if key not in self._entries:
            self._entries[key] = self._make_entry(views, image_shapes, text_len, rtc=key[-1] == "rtc")
        return self._entries[key]

    @torch.inference_mode()
    def _calibrate_fp8(self, entry: _Entry) -> None:
        """Run the bf16 forward once on this (real) observation, record GEMM input amax, quantize the wide GEMMs."""
        from .fp8 import quantize_wide
        self.ops.calibration = {}
        try:
            forward(entry.ws, self.weights, self.ops)
        finally:
            amax, self.ops.calibration = self.ops.calibration, None
        quantize_wide(self.weights, amax, self.dispatch[Op.FP8_FORMAT])
        self.fp8_calibrated = True

    def _run(self, key: tuple, entry: _Entry) -> None:
        if self.dispatch[Op.GEMM_PREFIX] == "fp8" and not self.fp8_calibrated:
            self._calibrate_fp8(entry)
        if self.use_graph:
            if entry.graph is None:
                self._capture(key, entry)   # the capture's own warm-up already ran forward() on these inputs
            entry.graph.replay()
        else:
            with torch.inference_mode():
                forward(entry.ws, self.weights, self.ops)

    @property
    def host_wait_mode(self) -> str:
        """How predict waits for the GPU (EngineOptions.host_wait: "sync", "poll" or "warm")."""
        return self._host_wait.mode

    def set_host_rehearsal(self, rehearsal) -> None:
        """What the "warm" wait runs during the wait for the GPU (None: nothing); other modes ignore it."""
        self._host_wait.rehearsal = rehearsal

    @property
    def action_affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(scale, offset) float32 (A,) that predict_observation(unnormalize=True) applies inside the graph, or
        None when none was given at construction."""
        return None if self._affine is None else tuple(a.cpu().numpy() for a in self._affine)

    # ---------------------------------------------------------------------------------------------- host path
    def _stage_text(self, sv: dict, tokens: np.ndarray, token_mask: np.ndarray, text_len: int) -> None:
        sv["tokens"].numpy()[:] = tokens[:text_len]
        sv["token_mask"].numpy()[:] = token_mask[:text_len]

    def predict_observation(self, images: list[np.ndarray | None], tokens: np.ndarray, token_mask: np.ndarray,
                            state: np.ndarray | None, noise: np.ndarray, unnormalize: bool = False,
                            rtc: RtcPlan | None = None) -> np.ndarray:
        """uint8 HxWx3 images per view (None = missing), tokens/mask (L,), normalized padded state (A,) or None,
        noise (horizon, A) -> actions (horizon, A) float32, normalized or (unnormalize=True, with the
        action_affine given at construction) in robot units. Preprocessing runs on the GPU.
        rtc: real-time chunking's hard prefix (rtc_blend), in a graph of its own; None: the plain forward."""
        if unnormalize and self._affine is None:
            raise ValueError("unnormalize=True needs action_affine at construction")
        if rtc is not None:
            rtc_blend.check_mode(rtc)
        present = tuple(i for i, img in enumerate(images) if img is not None)
        if not present:
            raise InputError("no images given: at least one view is required")
        valid_idx = np.flatnonzero(token_mask)
        text_len = self._bucket(int(valid_idx[-1]) if valid_idx.size else 0)
        shapes = tuple(images[i].shape[:2] for i in present)
        key = ("uint8", present, shapes, text_len) + (() if rtc is None else ("rtc",))
        entry = self._entry(key, present, shapes, text_len)
        sv = entry.staging.host_views
        for j, i in enumerate(present):
            sv[f"image{j}"].numpy()[:] = images[i]
        self._stage_text(sv, tokens, token_mask, text_len)
        sv["state"].numpy()[:] = 0.0 if state is None else state
        sv["noise"].numpy()[:] = noise
        if rtc is not None:
            rtc_blend.stage(sv, rtc)
        entry.staging.upload()
        self._run(key, entry)
        entry.out_host.copy_(entry.ws.robot_actions if unnormalize else entry.ws.actions, non_blocking=True)
        self._host_wait()
        return entry.out_host.numpy().copy()

    # ---------------------------------------------------------------------------------------------- executor contract
    def sample_actions(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                       token_masks: torch.Tensor, state: torch.Tensor | None, noise: torch.Tensor) -> torch.Tensor:
        """Same contract as ReferenceExecutor.sample_actions (batch 1): preprocessed tensors -> (1, horizon, A)."""
        return self._sample_actions(pixels, image_masks, tokens, token_masks, state, noise, None)

    def sample_actions_rtc(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                           token_masks: torch.Tensor, state: torch.Tensor | None, noise: torch.Tensor,
                           rtc: RtcPlan) -> torch.Tensor:
        """ReferenceExecutor.sample_actions_rtc's contract, for the modes the engine runs (rtc_blend)."""
        rtc_blend.check_mode(rtc)
        return self._sample_actions(pixels, image_masks, tokens, token_masks, state, noise, rtc)

    def _sample_actions(self, pixels, image_masks, tokens, token_masks, state, noise, rtc) -> torch.Tensor:
        if pixels.shape[0] != 1:
            raise InputError(f"the engine runs batch 1, got a batch of {pixels.shape[0]}")
        masks = image_masks[0].cpu().numpy()
        present = tuple(int(i) for i in np.flatnonzero(masks))
        if not present:
            raise InputError("no images given: at least one view is required")
        tmask = token_masks[0].cpu().numpy()
        valid_idx = np.flatnonzero(tmask)
        text_len = self._bucket(int(valid_idx[-1]) if valid_idx.size else 0)
        key = ("pixels", present, None, text_len) + (() if rtc is None else ("rtc",))
        entry = self._entry(key, present, None, text_len)
        ws = entry.ws
        ws.pixels.copy_(pixels[0, list(present)])
        ws.tokens.copy_(tokens[0, :text_len])
        ws.token_mask.copy_(token_masks[0, :text_len])
        if state is not None:
            ws.state.copy_(state[0])
        else:
            ws.state.zero_()
        ws.noise.copy_(noise[0])
        if rtc is not None:
            ws.extras["rtc"].target.copy_(rtc.target[0])
            ws.extras["rtc"].rows.copy_(rtc.prefix_rows()[:, None])
        self._run(key, entry)
        return ws.actions.clone()[None]

    @torch.inference_mode()
    def phase_times(self, key: tuple, reps: int = 20) -> dict[str, float]:
        """Median GPU ms of vision / prefix / denoise for a captured signature, each captured as its own graph
        (no launch gaps from Python, unlike an eager run), replayed `reps` times with CUDA events."""
        entry = self._entries[key]
        ws, w, ops = entry.ws, self.weights, self.ops
        pool = torch.cuda.graph_pool_handle()
        graphs, held = {}, {}
        steps = (("vision", lambda: {"tokens": vision(ws, w, ops)}),
                 ("prefix", lambda: dict(zip(("bias", "n_valid"), prefix(ws, w, ops, held["tokens"])))),
                 ("denoise", lambda: denoise(ws, w, ops, held["bias"], held["n_valid"]) or {}))
        for name, fn in steps:
            held.update(fn())                         # eager warm-up, and the inputs of the next phase
            graphs[name] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[name], pool=pool):
                held.update(fn())
        return {name: float(np.median(graph_replay_ms(graph, reps))) for name, graph in graphs.items()}

    def close(self) -> None:
        self._entries.clear()
        self.weights = None


def keep_fastest_in_chain(candidates, apply, capture, timed, fallback=None) -> dict:
    """One choice of the chain tuning: each candidate applied (apply(c)) and the denoiser captured with it
    (capture(c): a graph, or None where the candidate is left out), all graphs timed in turn (timed: {c: ms}), and
    the fastest applied, or `fallback` where none could be captured. Returns {candidate: ms}."""
    graphs = {}
    for cand in candidates:
        apply(cand)
        graph = capture(cand)
        if graph is not None:
            graphs[cand] = graph
    times = timed(graphs) if graphs else {}
    del graphs
    apply(min(times, key=times.get) if times else fallback)
    return times


def interleaved_replay_ms(graphs: dict, rounds: int, reps: int) -> dict:
    """{key: ms} for captured graphs timed in turn: `rounds` rounds, each replaying every graph `reps` times
    (graph_replay_ms), the order rotated by one each round; a graph's time is the median of its rounds' medians.
    Timed in turn, graphs see the same clock and memory drift, which a graph timed after another does not."""
    keys = list(graphs)
    per_round: dict = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            per_round[k].append(float(np.median(graph_replay_ms(graphs[k], reps))))
    return {k: float(np.median(v)) for k, v in per_round.items()}


def graph_replay_ms(graph: torch.cuda.CUDAGraph, reps: int) -> list[float]:
    """GPU time of `reps` single replays of a captured graph (CUDA events around each), in ms."""
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one stream per device that warm-ups before a capture and load-time timings run on. cuBLAS keeps a
    workspace per (handle, stream) for the life of the process, so a new stream per capture would grow the memory
    that a closed engine cannot give back."""
    return _side_stream(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _side_stream(index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(torch.device("cuda", index))
