"""The graph-replay executor: static buffers per input signature, the whole predict captured once, replayed.

Per call on the host: the observation is written into a pinned staging blob, ONE host-to-device copy moves it,
ONE graph replay runs preprocessing, vision, prefix and the unrolled denoising, ONE device-to-host copy brings
the actions back. Nothing is allocated and nothing syncs inside the replay.

A graph is captured per signature: which views are present, their image sizes, and the text bucket (the smallest
of `EngineOptions.text_buckets` that holds the prompt; padding tokens are masked), so a new instruction reuses a
graph and never forces a recapture. A call with real-time chunking (rtc_blend: hard prefix, or guidance with the
Jacobian as identity) has a graph of its own per signature and mode, which serves every delay and previous chunk. All graphs share one memory pool (they never run at the
same time).
"""

from __future__ import annotations

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
from flashrt_core.stopping import raise_if_stopped

from . import load_tuning, rtc_blend
from .dispatch import Dispatch, Op
from .forward import Workspace, denoise, forward, pi0_fused_step_ends, prefix, vision
from .fp8_calibration import Fp8Calibration
from .kernel_import import load_kernels
from .ops import Ops
from .timing import capture, graph_replay_ms, warm_up, warm_up_and_capture
from .weights import EngineWeights, prepare_weights

log = logging.getLogger(__name__)

_ALIGN = 256  # bytes between fields of the staging blob
TUNING_PROMPT_TOKENS = 48           # the load-time tunings time the text bucket that holds a prompt this long
WARMUP_RUNS = 2                     # forward() runs on the side stream before a capture (compiles, handles)


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


def text_buckets(options_buckets, max_token_len: int) -> tuple[int, ...]:
    """The token-buffer lengths an executor keeps a graph for: the options' buckets below max_token_len, and
    max_token_len itself, ascending."""
    return tuple(sorted({b for b in options_buckets if b < max_token_len} | {max_token_len}))


def bucket_for(buckets: tuple[int, ...], slots: int) -> int:
    """The smallest of `buckets` (ascending, text_buckets) that holds `slots` prompt tokens."""
    for b in buckets:
        if b >= slots:
            return b
    raise InputError(f"prompt needs {slots} token slots, more than max_token_len {buckets[-1]}")


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
        self.name = "engine-" + ("graph" if self.use_graph else "eager") + (
            "-fp8" if dispatch[Op.GEMM_PREFIX] == "fp8" else "-bf16")
        self.ops = Ops(dispatch)
        self.weights = self._weights(model, weights)
        self.text_buckets = text_buckets(dispatch.options.text_buckets, config.max_token_len)
        # the load-time tunings run at the bucket of a typical prompt, whatever the smallest bucket is
        self.tuning_text_bucket = self._bucket(min(TUNING_PROMPT_TOKENS, config.max_token_len) - 1)
        self.suffix_len = config.action_horizon + (0 if self.weights.tables is not None else 1)
        max_pos = len(config.view_names) * config.vision.num_patches + config.max_token_len + self.suffix_len
        cos, sin = load_kernels().rope_tables(max_pos, config.paligemma.head_dim, config.paligemma.rope_max_wavelength,
                                              device)
        self._rope = (cos, sin)
        self._suffix_visible = self._suffix_visibility()
        self.decoder_chain_timings: dict[str, dict[str, float]] = {}   # set by load_tuning.tune_decoder_in_chain
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
            load_tuning.tune_at_load(self, dtype)
        self._entries: dict[tuple, _Entry] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graph else None
        self.capture_seconds: dict[tuple, float] = {}
        self.fp8_calibration = (Fp8Calibration(dispatch[Op.FP8_FORMAT])
                                if dispatch[Op.GEMM_PREFIX] == "fp8" else None)   # engine/fp8_calibration.py
        log.info("engine ready: %s, text buckets %s, dispatch %s", self.name, self.text_buckets, dispatch.summary())

    # ---------------------------------------------------------------------------------------------- set-up
    def _weights(self, model: PiModel, shared: EngineWeights | None) -> EngineWeights:
        """The prepared weights: `shared` where it was prepared the way this executor needs, else from `model`."""
        options = self.dispatch.options
        fold = options.enabled("fused_weights")
        mlp_pad = options.vision_mlp_pad if options.fast_paths else 0
        if shared is None:
            return prepare_weights(model, self.dtype, fold=fold, vision_mlp_pad=mlp_pad)
        if shared.dtype != self.dtype or shared.folded != fold or shared.vision_mlp_pad != mlp_pad:
            raise ValueError(f"shared weights are {shared.dtype} folded={shared.folded} vision_mlp_pad="
                             f"{shared.vision_mlp_pad}, this executor needs {self.dtype} folded={fold} "
                             f"vision_mlp_pad={mlp_pad}")
        return shared

    def tuning_key(self, dtype: torch.dtype) -> dict:
        """What the load-time tuning's picks depend on (load_tuning.tuning_key)."""
        return load_tuning.tuning_key(self, dtype)

    def tuning_picks(self) -> dict:
        """The load-time tunings' picks by name, as the tuning cache stores them (load_tuning.tuning_picks)."""
        return load_tuning.tuning_picks(self)

    @property
    def entries(self) -> dict[tuple, _Entry]:
        """The captured signatures: (input kind, present views, image sizes, text bucket) -> its buffers and
        graph (read-only use: benchmarks and tests)."""
        return self._entries

    def capture_denoise(self, ws: Workspace, key_bias: torch.Tensor, n_valid: torch.Tensor) -> torch.cuda.CUDAGraph:
        """The denoise alone (every step and layer) on `ws` with the current ops settings, captured as a CUDA graph
        and replayed once: one eager run on the side stream first (compiles, builds descriptors, warms the library
        handles). What the chain tuning times, and tools/denoise_timing.py's A/B benchmarks."""
        run = lambda: denoise(ws, self.weights, self.ops, key_bias, n_valid)  # noqa: E731
        warm_up(self.device, run)
        graph, _ = capture(run)
        graph.replay()
        return graph

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
        return bucket_for(self.text_buckets, last_valid + 1)

    def make_entry(self, views: tuple[int, ...], image_shapes: tuple | None, text_len: int,
                   rtc: str | None = None) -> _Entry:
        """rtc: an RTC mode of rtc_blend.ENGINE_MODES: the workspace also holds its buffers (None: no RTC)."""
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
            rtc_blend.prepare_weights(self.weights, rtc)
            fields += rtc_blend.staging_fields(cfg.action_horizon, cfg.max_action_dim, len(self.weights.dts))
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
            ws.extras["rtc"] = rtc_blend.make_buffers(dv, rtc, len(self.weights.dts))
        out_host = torch.empty(cfg.action_horizon, cfg.max_action_dim, pin_memory=dev.type == "cuda")
        return _Entry(ws, staging, out_host, None)

    @torch.inference_mode()
    def _capture(self, key: tuple, entry: _Entry) -> None:
        """Warm up (compiles kernels, creates handles) then capture forward() into one graph."""
        raise_if_stopped(f"capturing graph {key}")
        start = time.perf_counter()
        entry.graph, _ = warm_up_and_capture(self.device, lambda: forward(entry.ws, self.weights, self.ops),
                                             WARMUP_RUNS, self._pool)
        self.capture_seconds[key] = time.perf_counter() - start
        log.info("captured graph %s in %.2f s", key, self.capture_seconds[key])

    def _entry(self, key: tuple, views, image_shapes, text_len) -> _Entry:
        if key not in self._entries:
            rtc = key[-1][1] if isinstance(key[-1], tuple) and key[-1][0] == "rtc" else None
            self._entries[key] = self.make_entry(views, image_shapes, text_len, rtc=rtc)
        return self._entries[key]

    @torch.inference_mode()
    def _calibrate_fp8(self, entry: _Entry) -> bool:
        """An FP8 engine's scales before a run (engine/fp8_calibration.py): True when a calibration (or bf16) forward
        ran eagerly on this entry and its actions are the output; False when the run goes on; Fp8NotCalibrated
        when no scales were set from real observations (outside a warm-up)."""
        return self.fp8_calibration.before_run(self.ops, self.weights,
                                               lambda: forward(entry.ws, self.weights, self.ops))

    @property
    def fp8_calibrated(self) -> bool:
        """An FP8 engine whose activation scales are set (always False for a bf16 engine)."""
        return self.fp8_calibration is not None and self.fp8_calibration.calibrated(self.weights)

    def _run(self, key: tuple, entry: _Entry) -> None:
        if self.fp8_calibration is not None and self._calibrate_fp8(entry):
            return
        if self.use_graph:
            if entry.graph is None:
                self._capture(key, entry)   # the capture's own warm-up already ran forward() on these inputs
            entry.graph.replay()
        else:
            with torch.inference_mode():
                forward(entry.ws, self.weights, self.ops)

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
        rtc: real-time chunking (rtc_blend's modes), in a graph of its own per mode; None: the plain forward."""
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
        key = ("uint8", present, shapes, text_len) + (() if rtc is None else (("rtc", rtc.mode),))
        entry = self._entry(key, present, shapes, text_len)
        sv = entry.staging.host_views
        for j, i in enumerate(present):
            sv[f"image{j}"].numpy()[:] = images[i]
        self._stage_text(sv, tokens, token_mask, text_len)
        sv["state"].numpy()[:] = 0.0 if state is None else state
        sv["noise"].numpy()[:] = noise
        if rtc is not None:
            rtc_blend.stage(sv, rtc, len(self.weights.dts))
        entry.staging.upload()
        self._run(key, entry)
        entry.out_host.copy_(entry.ws.robot_actions if unnormalize else entry.ws.actions, non_blocking=True)
        self.wait_for_gpu()
        return entry.out_host.numpy().copy()

    def wait_for_gpu(self) -> None:
        """predict's wait for the GPU after the copy out: the stream's synchronize (no wait on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

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
        key = ("pixels", present, None, text_len) + (() if rtc is None else (("rtc", rtc.mode),))
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
            rtc_blend.copy_plan(ws.extras["rtc"], rtc, len(self.weights.dts))
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
