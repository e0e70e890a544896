"""Public API: load_model(...) -> Policy; Policy.predict(images, prompt, state, noise, rtc) -> actions.

Policy.predict validates its inputs (InputError naming the problem), preprocesses them (images resized with
padding to [-1, 1], prompt tokenized with the state bins for pi0.5, state normalized for pi0), runs an
executor (the eager ReferenceExecutor, or the graph engine on CUDA), unnormalizes the actions and returns
float32 (horizon, action_dim) in robot units. rtc (a flashrt_core.rtc_request.RtcRequest) conditions the chunk on
the previous one (real-time chunking, flashrt_core/rtc.py).

precision ("fp32", "bf16", "fp16" or "fp8"; resolve_precision is the one place that maps it to the weights'
dtype and the engine's FP8 option) picks what the executor computes in. An FP8 policy refuses predict until
Policy.calibrate(observations) has set its activation scales from real observations (flashrt_core/calibration.py).

The tokenizer is the checkpoint's tokenizer.model (or paligemma_tokenizer.model), else $FLASHRT_TOKENIZER, else
openpi's download cache; `tokenizer=` overrides.

checkpoint=None loads the embedded demo: a random-weight pi05_tiny checkpoint (seed 0) generated once into
$FLASHRT_CACHE_DIR/demo_pi05_tiny (default ~/.cache/flashrt/demo_pi05_tiny) and reused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from flashrt_core import host_threads, hub, normalization, preprocess
from flashrt_core.checkpoint import load_model_weights
from flashrt_core.checkpoint_config import declares_no_stats, fit_robot_dims, resolve_config
from flashrt_core.config import ModelConfig, ModelType, PromptMode
from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.engine import EngineOptions, build_executor
from flashrt_core.engine.options import read_path, read_switch
from flashrt_core.fixtures import CONFIG_FILE, TOKENIZER_FILE, write_random_checkpoint
from flashrt_core.policy_lifetime import PolicyLifetime
from flashrt_core.rtc_request import RtcRequest
from flashrt_core.stopping import raise_if_stopped
from flashrt_core.tokenizer import PromptTokenizer, build_prompt

log = logging.getLogger(__name__)
# GR00T N1.6's model is built on transformers' SigLIP2 and Qwen3 modules, which the pi family does not need:
# setup.py's "groot" extra installs them. Its bicubic resize is Pillow's, a core requirement that a ROS install may
# still lack (package.xml's python3-pil).
GROOT_MODULES = {"transformers": "transformers (`pip install 'flashrt-ros[groot]'`)",
                 "PIL": "Pillow (`pip install pillow`, a core requirement)"}

SUPPLY_TOKENIZER = ("Released checkpoints do not ship it: download the PaliGemma sentencepiece model "
                    "(tokenizer.model of the Hugging Face repository google/paligemma-3b-pt-224, or openpi's "
                    "gs://big_vision/paligemma_tokenizer.model) and pass tokenizer=PATH, set FLASHRT_TOKENIZER, or "
                    "copy it into the folder with `flashrt-convert SRC DST --tokenizer PATH`")
DEMO_CONFIG = "pi05_tiny"
DEMO_SEED = 0
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}
# precision -> (weights dtype, FP8 GEMMs); "auto": the dtype argument and the engine options decide
PRECISIONS = {"auto": (None, None), **{name: (dtype, False) for name, dtype in _DTYPES.items()},
              "fp8": (torch.bfloat16, True)}
FP8_NEEDS = ("FP8 runs in the graph engine on a CUDA GPU with FP8 tensor cores (NVIDIA sm89+, AMD gfx942 / "
             "gfx950)")


def demo_checkpoint_dir() -> Path:
    root = Path(read_path("FLASHRT_CACHE_DIR") or Path.home() / ".cache" / "flashrt")
    return root / f"demo_{DEMO_CONFIG}"


def ensure_demo_checkpoint() -> Path:
    """The demo checkpoint directory, generated on first use (atomically: a temp dir renamed into place)."""
    target = demo_checkpoint_dir()
    if (target / CONFIG_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("generating the demo checkpoint (%s, seed %d) in %s", DEMO_CONFIG, DEMO_SEED, target)
    tmp = Path(tempfile.mkdtemp(prefix=".demo_tmp_", dir=target.parent))
    try:
        write_random_checkpoint(tmp, DEMO_CONFIG, seed=DEMO_SEED)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / CONFIG_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"invalid device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(_DTYPES)} or a torch dtype")


def resolve_precision(precision: str | None, dtype, engine_options, device: torch.device, hardware: str):
    """The one place that maps load_model's precision to (weights dtype, engine options). precision None / "auto"
    leaves dtype and engine_options (and the FLASHRT_* environment) as they are. "fp8" asks the engine for FP8
    GEMMs: refused on the CPU and the reference path, and where engine_options or the environment turn FP8 or the
    fast paths off. "fp32" / "bf16" / "fp16" refuse FP8 asked elsewhere. A dtype that names another dtype than the
    precision is refused. Returns (dtype, engine_options, fp8 asked)."""
    key = "auto" if precision is None else precision
    if key not in PRECISIONS:
        raise ValueError(f"unsupported precision {precision!r}; use one of {sorted(PRECISIONS)}")
    want_dtype, fp8 = PRECISIONS[key]
    if fp8 is None:
        return dtype, engine_options, False
    if dtype is not None and resolve_dtype(dtype, device) != want_dtype:
        raise ValueError(f"precision={precision!r} computes in {want_dtype} but dtype={dtype!r} was given: give one "
                         "of them")
    options = EngineOptions.from_env(engine_options)
    if not fp8:
        if options.fp8 and options.fast_paths:
            raise ValueError(f"precision={precision!r} conflicts with FP8 asked by engine_options.fp8=True or "
                             "FLASHRT_FP8=1: drop one of them")
        return want_dtype, options, False
    if device.type != "cuda" or hardware == "reference":
        where = f"device {device}" if device.type != "cuda" else "hardware='reference' (the eager reference path)"
        raise ValueError(f"precision='fp8' cannot run on {where}: {FP8_NEEDS}. Use precision 'bf16' or 'fp32' there")
    env_off = not EngineOptions.from_env(dataclasses.replace(options, fp8=True)).fp8   # FLASHRT_FP8=0 set
    off = [what for what, on in (("FLASHRT_FP8=0", env_off),
                                 ("fast paths off", not options.fast_paths),
                                 ("gemm_prefix pinned to bf16", options.impl.get("gemm_prefix") == "bf16"))
           if on]
    if off:
        raise ValueError(f"precision='fp8' conflicts with the engine options: {', '.join(off)} turn FP8 off")
    return want_dtype, dataclasses.replace(options, fp8=True), True


def tokenizer_candidates(checkpoint_dir: Path) -> list[Path]:
    """Where the PaliGemma sentencepiece model is looked for, in order (released checkpoints do not ship it)."""
    candidates = [checkpoint_dir / TOKENIZER_FILE, checkpoint_dir / "paligemma_tokenizer.model"]
    if read_path("FLASHRT_TOKENIZER"):
        candidates.append(Path(read_path("FLASHRT_TOKENIZER")))
    candidates.append(Path.home() / ".cache" / "openpi" / "big_vision" / "paligemma_tokenizer.model")  # openpi's
    return candidates


def find_tokenizer(checkpoint_dir: Path) -> Path:
    candidates = tokenizer_candidates(checkpoint_dir)
    for path in candidates:
        if path.is_file():
            return path
    raise CheckpointError("PaliGemma tokenizer model not found; tried " + ", ".join(map(str, candidates))
                          + f". {SUPPLY_TOKENIZER}")


class Policy(PolicyLifetime):
    """A loaded pi0 / pi0.5 policy. Not thread-safe: call predict from one thread at a time."""

    def __init__(self, model, config: ModelConfig, executor, tokenizer: PromptTokenizer,
                 normalizer: normalization.Normalizer, device: torch.device, model_id: str,
                 gpu_preprocess: bool = True, gpu_unnormalize: bool = True):
        """model: the PiModel, or None where the executor does not use it (the graph engine has its own weights;
        load_model drops it then). gpu_preprocess: when the executor offers predict_observation (the graph
        engine), hand it the raw uint8 images so resize-with-pad runs inside its graph; False resizes on the host
        (A/B switch). gpu_unnormalize: with gpu_preprocess, let the graph unnormalize the actions too where the
        executor holds this normalizer's action affine (`action_affine`, given by load_model); False, or another
        affine, unnormalizes on the host (A/B switch)."""
        self.gpu_preprocess = gpu_preprocess and hasattr(executor, "predict_observation")
        self.gpu_unnormalize = (self.gpu_preprocess and gpu_unnormalize
                                and _same_affine(getattr(executor, "action_affine", None),
                                                 normalizer.action_affine(config.max_action_dim)))
        self.model = model
        self.config = config
        self.executor = executor
        self.tokenizer = tokenizer
        self.normalizer = normalizer
        self.device = device
        self.model_id = model_id
        self.checkpoint_dir: Path | None = None       # set by load_model: the scale cache's key reads its weights
        self.fp8 = getattr(executor, "fp8_calibration", None) is not None
        dtype = getattr(executor, "dtype", None)           # the engine's; the reference runs in the model's
        if dtype is None and model is not None:
            dtype = next((p.dtype for p in model.parameters()), None)
        self.precision = "fp8" if self.fp8 else str(dtype).replace("torch.", "")   # what predict computes in
        self.calibration = None                       # the last CalibrationReport (FP8 policies)

    horizon = property(lambda self: self.config.action_horizon)
    action_dim = property(lambda self: self.config.action_dim)
    state_dim = property(lambda self: self.config.state_dim)
    view_names = property(lambda self: list(self.config.view_names))

    @property
    def requires_state(self) -> bool:
        """True when predict needs `state` (pi0's state token, or pi0.5's discrete-state prompt)."""
        cfg = self.config
        return cfg.model_type == ModelType.PI0 or cfg.prompt_mode == PromptMode.DISCRETE_STATE

    @property
    def text_buckets(self) -> tuple[int, ...]:
        """Token-buffer lengths the executor keeps one graph each for (the graph engine runs a prompt in the
        smallest that holds it); () when it has none (the reference path)."""
        return tuple(getattr(self.executor, "text_buckets", None) or ())

    def predict(self, images, prompt: str, state=None, noise=None, rtc: RtcRequest | None = None) -> np.ndarray:
        """Images (list in view order or dict by view name), prompt, optional state and pinned noise
        -> actions float32 (horizon, action_dim) in robot units. An FP8 policy raises Fp8NotCalibrated until
        calibrate() has run.
        rtc: real-time chunking, the chunk conditioned on the previous one (RtcRequest: the previous chunk in robot
        units, the delay in steps, the mode); None predicts without it (the plain sampler, unchanged)."""
        return self._predict(images, prompt, state, noise, rtc=rtc)

    def rtc_plan(self, rtc: RtcRequest):
        """The request in model space (flashrt_core.rtc.RtcPlan): the previous chunk normalized and padded."""
        if not isinstance(rtc, RtcRequest):
            raise InputError(f"rtc must be a flashrt_core.rtc_request.RtcRequest or None, got {type(rtc).__name__}")
        cfg = self.config
        return rtc.plan(self.normalizer, cfg.action_horizon, cfg.action_dim, cfg.max_action_dim)

    @property
    def fp8_calibrated(self) -> bool:
        """An FP8 policy whose activation scales are set (False for other precisions)."""
        return bool(getattr(self.executor, "fp8_calibrated", False))

    def calibrate(self, observations, held_out=(), scale_cache=None, gate: float | None = None):
        """Set an FP8 policy's activation scales from real observations: a list of (images, prompt, state) or
        dicts with those keys, as predict takes them. The engine's bf16 forward runs on each, the amax per GEMM
        input is the max over them; graphs captured before read the new scales (nothing is re-captured).
        held_out: observations for the accuracy gate that follows (FP8 vs bf16 engine, cosine >= gate, default
        engine/gate.py's GATE_FP8; below it Fp8GateError). scale_cache: a directory keeping the scales under a key
        of the checkpoint's weight content, the configuration and these observations (reused when they match).
        Returns a CalibrationReport (observations, per-GEMM scale summary, gate cosines);
        flashrt_core/calibration.py."""
        from flashrt_core.calibration import calibrate_policy
        if self.executor is None:
            raise RuntimeError("Policy.calibrate called after close()")
        self.calibration = calibrate_policy(self, observations, held_out, scale_cache, gate)
        return self.calibration

    def warming_up(self):
        """A context whose predict calls are warm-up passes, their actions discarded: an FP8 policy not calibrated
        yet runs them with placeholder scales, so the engine captures its FP8 graphs before the calibration
        (the node's warm-up). Outside it, an uncalibrated FP8 policy refuses predict."""
        calibration = getattr(self.executor, "fp8_calibration", None)
        return calibration.warm_up() if calibration is not None else contextlib.nullcontext()

    def reachable_text_buckets(self, state=None) -> tuple[int, ...]:
        """The text buckets some instruction can land in: those that hold the shortest prompt
        (`shortest_prompt_tokens`) less one token, in case the one-character instruction "a" takes two; a
        smaller bucket never serves a prompt. At worst one bucket too many is kept."""
        buckets = self.text_buckets
        if not buckets:
            return ()
        shortest = self.shortest_prompt_tokens(state) - 1
        return tuple(b for b in buckets if b >= shortest)

    def shortest_prompt_tokens(self, state=None) -> int:
        """Tokens of the shortest prompt this policy can be given: the one-character instruction "a" inside the
        prompt template. pi0.5's discrete-state prompt also carries the state's bins as numbers, and their count
        of tokens changes with the state ("0" and "128" tokenize differently), so the bins are set to the one
        value that tokenizes shortest (sentencepiece splits at spaces: each bin's tokens count alone), not to
        `state`'s: a later state with shorter numbers must not land in a bucket the warm-up left out."""
        _, mask, _ = self._encode_prompt_and_state("a", state)
        shortest = int(mask.sum())
        cfg = self.config
        if state is not None and cfg.model_type == ModelType.PI05 and cfg.prompt_mode == PromptMode.DISCRETE_STATE:
            dims = len(preprocess.validate_state(state, cfg.state_dim))
            shortest = min(shortest, *(len(self.tokenizer.encode(build_prompt("a", [b] * dims, cfg.prompt_mode)))
                                       for b in range(-1, preprocess.STATE_BINS)))      # openpi's bins: -1..255
        return shortest

    def warm_up_text_buckets(self, images, prompt: str, state=None, rtc: RtcRequest | None = None) -> list[int]:
        """One forward pass per reachable text bucket (`reachable_text_buckets`) with these images, prompt and
        state, the prompt's token mask stretched over the whole bucket, so that the graph engine captures the
        graph of every bucket an instruction can land in now and no later instruction, whatever its length,
        costs a capture. A graph depends on the bucket, not on the token values; the actions are discarded.
        rtc: also a pass with it per bucket (the graph engine's RTC graph of each bucket).
        Returns the buckets run ([] when there are none)."""
        buckets = list(self.reachable_text_buckets(state))
        with self.warming_up():
            for slots in buckets:
                raise_if_stopped(f"warming up text bucket {slots} of {buckets}")
                self._predict(images, prompt, state, None, text_slots=slots)
                if rtc is not None:
                    self._predict(images, prompt, state, None, text_slots=slots, rtc=rtc)
        return buckets

    def _predict(self, images, prompt: str, state, noise, text_slots: int | None = None,
                 rtc: RtcRequest | None = None) -> np.ndarray:
        """predict; text_slots marks the first text_slots token positions valid (warm-up of one text bucket)."""
        if self.executor is None:
            raise RuntimeError("Policy.predict called after close()")
        plan = None if rtc is None else self.rtc_plan(rtc)
        if plan is not None and not hasattr(self.executor, "sample_actions_rtc"):
            raise InputError(f"the {getattr(self.executor, 'name', 'current')} executor has no real-time chunking; "
                             "load the policy with hardware='reference'")
        if self.gpu_preprocess:
            views = preprocess.validate_images(images, self.config.view_names)
            tokens, token_masks, state_padded = self._encode_prompt_and_state(prompt, state, text_slots)
            actions = self.executor.predict_observation(  # [horizon, 32] numpy, in robot units with gpu_unnormalize
                views, tokens, token_masks, None if state_padded is None else state_padded.numpy(),
                self._host_noise(noise),  # stays on the host: the executor stages it into its pinned blob
                unnormalize=self.gpu_unnormalize, **({} if plan is None else {"rtc": plan}))
            if self.gpu_unnormalize:
                return np.ascontiguousarray(actions[:, :self.config.action_dim])   # float32, unnormalized
            return self.postprocess(torch.from_numpy(actions))
        inputs = self._prepare_inputs(images, prompt, state, noise, text_slots)
        if plan is None:
            actions = self.executor.sample_actions(*inputs)  # [1, horizon, 32] normalized
        else:
            actions = self.executor.sample_actions_rtc(*inputs, plan.to(self.device))
        return self.postprocess(actions[0])

    def prepare_inputs(self, images, prompt: str, state=None, noise=None):
        """Validated, preprocessed tensors on the policy's device, batch 1, in sample_actions' argument order."""
        return self._prepare_inputs(images, prompt, state, noise)

    def _prepare_inputs(self, images, prompt: str, state, noise, text_slots: int | None = None):
        cfg = self.config
        pixels, image_masks = preprocess.prepare_images(images, cfg.view_names, cfg.vision.image_size)
        tokens, token_masks, state_padded = self._encode_prompt_and_state(prompt, state, text_slots)
        noise_t = torch.from_numpy(self._host_noise(noise))[None].to(self.device)  # [1, horizon, 32]
        dev = self.device
        return (torch.from_numpy(pixels)[None].to(dev), torch.from_numpy(image_masks)[None].to(dev),
                torch.from_numpy(tokens)[None].to(dev), torch.from_numpy(token_masks)[None].to(dev),
                None if state_padded is None else state_padded[None].to(dev), noise_t)

    def _encode_prompt_and_state(self, prompt: str, state, text_slots: int | None = None):
        """-> (tokens int64 [L], token mask bool [L], normalized state zero-padded to 32 (pi0) or None).
        text_slots: the mask marks exactly the first text_slots positions valid (warm-up of a text bucket)."""
        cfg = self.config
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError(f"prompt must be a non-empty str, got {prompt!r}")
        state_norm = None
        if state is not None:
            state_arr = preprocess.validate_state(state, cfg.state_dim)  # [state_dim]
            state_norm = self.normalizer.normalize_state(state_arr)  # [state_dim] float32
        elif cfg.model_type == ModelType.PI0:
            raise InputError("pi0 needs the robot state (state=None given)")
        bins = None
        if cfg.model_type == ModelType.PI05 and cfg.prompt_mode == PromptMode.DISCRETE_STATE and state_norm is not None:
            bins = preprocess.discretize_state(state_norm)
        tokens, token_masks = self.tokenizer.tokenize_prompt(prompt, cfg.max_token_len, bins,
                                                             cfg.prompt_mode.value, cfg.model_type.value)
        if text_slots is not None:
            token_masks = np.arange(token_masks.shape[0]) < text_slots
        state_padded = None
        if cfg.model_type == ModelType.PI0:
            state_padded = torch.zeros(cfg.max_action_dim)  # [32]
            state_padded[:cfg.state_dim] = torch.from_numpy(state_norm)
        return tokens, token_masks, state_padded

    def _host_noise(self, noise) -> np.ndarray:
        """The flow noise as a host float32 array (horizon, 32) (preprocess.host_noise)."""
        return preprocess.host_noise(noise, (self.config.action_horizon, self.config.max_action_dim))

    def postprocess(self, actions: torch.Tensor) -> np.ndarray:
        """Normalized [horizon, 32] -> robot units float32 (horizon, action_dim)."""
        out = self.normalizer.unnormalize_actions(actions.float().cpu().numpy(), self.config.action_dim)
        return np.ascontiguousarray(out, dtype=np.float32)


def load_model(checkpoint: str | Path | None = None, config: str | ModelConfig | None = None,
               device: str | torch.device = "auto", dtype: str | torch.dtype | None = None,
               hardware: str = "auto", tokenizer: str | Path | PromptTokenizer | None = None,
               require_norm_stats: bool = True, engine_options=None, gpu_preprocess: bool | None = None,
               gpu_unnormalize: bool | None = None, asset_id: str | None = None,
               precision: str | None = None, fast_tokenizer: str | Path | None = None, embodiment: str | None = None,
               statistics: str | Path | None = None) -> Policy:
    """Load a checkpoint directory, or a Hugging Face hub id such as "lerobot/pi05_base" (flashrt_core.hub:
    through huggingface_hub's cache), into a ready Policy; None loads the demo checkpoint.

    The folder may be a flashrt folder (flashrt-convert's output), a lerobot policy folder, openpi's PyTorch
    conversion or an openpi checkpoint (flashrt_core.checkpoint_layout); asset_id picks one of several
    assets/<asset_id>/norm_stats.json.

    The robot's state_dim / action_dim come from the config when it sets them (a ModelConfig, or overrides in
    flashrt_config.json), else from the checkpoint's norm stats. A checkpoint without norm stats is refused
    unless require_norm_stats=False (then states and actions pass through unnormalized).

    precision: "fp32", "bf16", "fp16" or "fp8" (resolve_precision; None / "auto": dtype and engine_options decide).
    An FP8 policy refuses predict until Policy.calibrate(observations) ran on real observations.

    engine_options (flashrt_core.engine.EngineOptions) tunes the graph engine (FP8, switches; None: the defaults
    with the environment on top, docs/engine_options.md); gpu_preprocess
    None reads FLASHRT_GPU_PREPROCESS (default 1): with the graph engine, images are resized inside its graph;
    gpu_unnormalize None reads FLASHRT_GPU_UNNORMALIZE (default 1): with the GPU preprocessing, the actions are
    unnormalized inside the graph too (Policy.__init__).

    pi0-FAST (config "pi0fast", or a folder whose flashrt_config.json names it) returns a
    pi0_fast_policy.FastPolicy (the graph engine's prefill and decode graphs on a GPU, the reference executor
    otherwise; pi0_fast_policy.fast_executor); fast_tokenizer is its FAST tokenizer folder (default:
    pi0_fast_policy.find_fast_tokenizer). precision="fp8" decodes pi0-FAST with weight-only FP8 weights, which
    need no calibration.
    GR00T N1.6 (config "groot_n1.6" / "groot_n1.6_tiny", or a checkpoint whose config.json has model_type
    Gr00tN1d6) loads through flashrt_core.groot_policy: embodiment picks the robot (projectors, joint groups,
    statistics), statistics overrides the checkpoint's statistics.json; on CUDA it runs as one CUDA graph per input
    signature (engine/groot_graph.py; hardware and engine_options pick the executor as for the pi family, and
    hardware="reference" keeps the eager reference executor), on the CPU on the reference executor.
    precision="fp8" gives GR00T's DiT weight-only FP8 weights (engine/groot_dit_gemms.py), which need no calibration.

    A warning says when torch's host threads outnumber the CPUs the process may use (host_threads.py).
    """
    host_threads.warn_if_oversubscribed(log)
    ckpt_dir = None if checkpoint is None else hub.checkpoint_path(checkpoint)   # a hub id: its cached snapshot
    if _model_family(ckpt_dir, config) == "groot":
        load_groot_policy = _groot_loader()
        if ckpt_dir is None:
            raise CheckpointError("GR00T has no embedded demo checkpoint: pass a checkpoint folder (`python -m "
                                  "flashrt_core.groot_fixtures DIR` writes a random one)")
        if not ckpt_dir.is_dir():
            raise CheckpointError(f"checkpoint directory not found: {ckpt_dir}")
        dev = resolve_device(device)
        dtype, engine_options, fp8 = resolve_precision(precision, dtype, engine_options, dev, hardware)
        policy = load_groot_policy(ckpt_dir, config, embodiment, dev, resolve_dtype(dtype, dev),
                                   hardware, tokenizer, statistics, engine_options)
        if fp8 and not getattr(policy.executor, "fp8", False):
            picked = policy.executor.name
            policy.close()
            raise ValueError(f"precision='fp8' but the engine picked {picked} without FP8 on {dev}: {FP8_NEEDS}")
        return policy
    if embodiment is not None or statistics is not None:
        raise ValueError("embodiment= and statistics= apply to GR00T checkpoints only (config 'groot_n1.6')")
    gpu_preprocess = read_switch("FLASHRT_GPU_PREPROCESS") if gpu_preprocess is None else gpu_preprocess
    gpu_unnormalize = read_switch("FLASHRT_GPU_UNNORMALIZE") if gpu_unnormalize is None else gpu_unnormalize
    ckpt_dir = ensure_demo_checkpoint() if ckpt_dir is None else ckpt_dir
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {ckpt_dir}")
    cfg, explicit_dims = resolve_config(config, ckpt_dir)
    stats = normalization.load_norm_stats(ckpt_dir, asset_id)
    if stats is None:
        location = normalization.locate_norm_stats(ckpt_dir, asset_id)           # why there are none
        if require_norm_stats and not declares_no_stats(ckpt_dir):
            raise CheckpointError(f"{ckpt_dir} has no normalization stats ({location.note}). To supply them, "
                                  f"{normalization.SUPPLY_STATS}; or pass require_norm_stats=False to run "
                                  "unnormalized (what lerobot does with an empty normalizer)")
        log.warning("%s has no normalization stats (%s): states and actions are used unnormalized", ckpt_dir,
                    location.note)
    cfg = fit_robot_dims(cfg, stats, explicit_dims, ckpt_dir)
    dev = resolve_device(device)
    dtype, engine_options, fp8 = resolve_precision(precision, dtype, engine_options, dev, hardware)
    torch_dtype = resolve_dtype(dtype, dev)
    if not isinstance(tokenizer, PromptTokenizer):
        tokenizer = PromptTokenizer(tokenizer if tokenizer is not None else find_tokenizer(ckpt_dir))
    if tokenizer.vocab_size > cfg.paligemma.vocab_size:
        raise CheckpointError(f"tokenizer {tokenizer.model_path} has {tokenizer.vocab_size} pieces, more than the "
                              f"model's vocab_size {cfg.paligemma.vocab_size}")
    model = load_model_weights(ckpt_dir, cfg, dev, torch_dtype)
    normalizer = normalization.Normalizer(stats, cfg.norm_mode.value)  # identity when stats is None
    if cfg.model_type == ModelType.PI0_FAST:
        from_hub = checkpoint is not None and ckpt_dir != Path(checkpoint)
        model_id = f"{cfg.name}:{checkpoint if from_hub else ckpt_dir.resolve().name}"
        from flashrt_core import pi0_fast_policy
        policy = pi0_fast_policy.build_fast_policy(model, cfg, dev, hardware, tokenizer, normalizer, model_id,
                                                   ckpt_dir, fast_tokenizer, engine_options)
        log.info("loaded %s on %s (%s, executor %s)", policy.model_id, dev, torch_dtype, policy.executor.name)
        return policy
    executor = build_executor(model, cfg, dev, hardware, engine_options,
                              action_affine=normalizer.action_affine(cfg.max_action_dim))
    if fp8 and getattr(executor, "fp8_calibration", None) is None:
        dispatch = getattr(executor, "dispatch", None)
        picked = getattr(executor, "name", type(executor).__name__)
        if hasattr(executor, "close"):
            executor.close()
        raise ValueError(f"precision='fp8' but the engine picked {picked} on "
                         f"{dispatch.hardware.describe() if dispatch is not None else dev}: {FP8_NEEDS}")
    from_hub = checkpoint is not None and ckpt_dir != Path(checkpoint)
    model_id = f"{cfg.name}:{checkpoint if from_hub else ckpt_dir.resolve().name}"    # hub: its id, not the commit
    log.info("loaded %s on %s (%s, executor %s)", model_id, dev, torch_dtype, getattr(executor, "name", executor))
    # The graph engine keeps its own merged / folded / cast weights and never reads the model again: without
    # this reference the model's tensors that the engine does not share (Q/K/V and gate/up before merging,
    # folded layers) are freed, instead of doubling the weight memory.
    keep = model if getattr(executor, "uses_model", True) else None
    del model
    policy = Policy(keep, cfg, executor, tokenizer, normalizer, dev, model_id, gpu_preprocess, gpu_unnormalize)
    policy.checkpoint_dir = ckpt_dir
    return policy


def _groot_loader():
    """groot_policy.load_groot_policy, or a CheckpointError naming the install extra where GR00T's optional
    dependencies (GROOT_MODULES) are missing."""
    try:
        from flashrt_core.groot_policy import load_groot_policy
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in GROOT_MODULES:
            raise
        raise CheckpointError(f"loading a GR00T N1.6 checkpoint needs {GROOT_MODULES[missing]}: cannot import "
                              f"{exc.name!r}") from exc
    return load_groot_policy


def _model_family(path: Path | None, config) -> str:
    """"groot" for a GR00T config (preset name or GrootConfig) or, with config=None, a GR00T checkpoint folder
    `path` (config.json with model_type Gr00tN1d6); else "pi". A GR00T checkpoint with a pi-family config is a
    CheckpointError that says so (the pi loader would only report what a pi folder lacks)."""
    from flashrt_core.model.groot.config import is_groot_config
    if is_groot_config(config):
        return "groot"
    if path is not None:
        from flashrt_core.groot_checkpoint import is_groot_checkpoint
        if path.is_dir() and is_groot_checkpoint(path):
            if config is not None:
                raise CheckpointError(f"{path} is a GR00T N1.6 checkpoint (config.json model_type Gr00tN1d6), but "
                                      f"config={_config_name(config)!r} is a pi-family model: pass config=None or a "
                                      "GR00T preset ('groot_n1.6'), and embodiment=TAG")
            return "groot"
    return "pi"


def _config_name(config) -> str:
    return config if isinstance(config, str) else getattr(config, "name", type(config).__name__)


def _same_affine(held, wanted) -> bool:
    """Whether an executor's in-graph action affine (float32) is the normalizer's (float64), to float32 precision."""
    if held is None:
        return False
    return all(np.asarray(h).shape == np.asarray(w).shape
               and np.allclose(h, np.asarray(w, dtype=np.float32), rtol=1e-6, atol=0)
               for h, w in zip(held, wanted))
