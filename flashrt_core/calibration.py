"""Policy.calibrate: an FP8 policy's activation scales from real observations, the scale cache, the accuracy gate.

An observation is what Policy.predict takes: (images, prompt, state) as a tuple, or a dict with those keys (state
may be left out where the model needs none). Calibration runs the engine's bf16 forward on each (eagerly, the wide
GEMMs' input amax recorded, max over all of them) and sets the FP8 scales (flashrt_core/engine/fp8_calibration.py);
graphs captured before (the warm-up's) read the new scales at their next replay. The flow noise does not reach
the calibrated GEMMs (the backbone sees images, prompt and pi0.5's state tokens only), so it is pinned to zeros.

With scale_cache (a directory), the amax are stored under a key of the checkpoint's weight content, the model
configuration and the observations as the engine sees them (images, tokens, token mask, normalized state), and
reused by a later calibration with the same key instead of running the forwards.

With held_out observations, the accuracy gate follows: each is run by the FP8 engine and by the same engine with
the wide GEMMs in bf16 (the same weights, the same pinned noise), and the cosine of the two normalized action
chunks must reach `gate` (flashrt_core/engine/gate.py's GATE_FP8 by default); below it, Fp8GateError.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np

from flashrt_core import preprocess
from flashrt_core.errors import Fp8GateError, InputError
from flashrt_core.stopping import raise_if_stopped

log = logging.getLogger(__name__)

GATE_NOISE_SEED = 0          # the held-out observations' pinned flow noise


@dataclasses.dataclass(frozen=True)
class CalibrationReport:
    observations: int                   # calibration observations
    source: str                         # "measured" (forwards ran) or "cache" (the scale cache's entry)
    scales: dict                        # per-GEMM scale summary (fp8_calibration.scale_summary)
    seconds: float                      # wall time of the calibration (digests and forwards)
    observations_sha256: str
    cache_path: str | None = None       # the scale cache entry read or written
    checkpoint_sha256: str | None = None
    gate_cosines: tuple[float, ...] = ()   # FP8 vs bf16 engine, one per held-out observation
    gate: float | None = None              # the threshold the cosines were held to
    amax: tuple[float, ...] = ()           # each wide GEMM's calibrated input amax (engine/fp8.py wide_linears order)

    @property
    def gate_min(self) -> float | None:
        return min(self.gate_cosines) if self.gate_cosines else None

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["gate_cosines"] = list(self.gate_cosines)
        out["amax"] = list(self.amax)
        out["gate_min"] = self.gate_min
        return out

    def summary(self) -> str:
        s = self.scales
        text = (f"FP8 calibrated on {self.observations} observations ({self.source}, {self.seconds:.2f} s): "
                f"{s['gemms']} GEMMs, input amax {s['amax_min']:.3g} .. {s['amax_max']:.3g} (median "
                f"{s['amax_median']:.3g}), scales {s['scale_min']:.3g} .. {s['scale_max']:.3g}")
        if self.gate_cosines:
            text += f"; gate: cosine vs bf16 min {self.gate_min:.5f} over {len(self.gate_cosines)} (>= {self.gate})"
        return text


def unpack_observation(observation) -> tuple:
    """(images, prompt, state) from a tuple / list of two or three, or a dict with images, prompt, state."""
    if isinstance(observation, Mapping):
        unknown = set(observation) - {"images", "prompt", "state"}
        if unknown or "images" not in observation or "prompt" not in observation:
            raise InputError(f"a calibration observation is a dict with images, prompt and optionally state; got "
                             f"keys {sorted(observation)}")
        return observation["images"], observation["prompt"], observation.get("state")
    if isinstance(observation, (tuple, list)) and len(observation) in (2, 3):
        return tuple(observation) + (None,) * (3 - len(observation))
    raise InputError(f"a calibration observation is (images, prompt[, state]) or a dict; got "
                     f"{type(observation).__name__}")


def calibrate_policy(policy, observations: Sequence, held_out: Sequence = (), scale_cache=None,
                     gate: float | None = None) -> CalibrationReport:
    """Policy.calibrate's work (see the module doc)."""
    from flashrt_core.engine import fp8_calibration as fc
    from flashrt_core.engine.gate import GATE_FP8

    executor = policy.executor
    calibration = getattr(executor, "fp8_calibration", None)
    if calibration is None:
        raise ValueError(f"calibrate is for an FP8 policy (load_model(precision='fp8')); this one runs "
                         f"{getattr(executor, 'name', executor)} at precision {policy.precision}")
    start = time.perf_counter()
    observations = [unpack_observation(o) for o in observations]
    if not observations:
        raise ValueError("calibrate needs at least one real observation")
    zeros = np.zeros((policy.horizon, policy.config.max_action_dim), np.float32)
    seen = [engine_inputs(policy, *obs) for obs in observations]          # validates every one before any forward
    obs_digest = fc.observations_digest(seen)
    cache = key = None
    checkpoint_sha = None
    if scale_cache:
        if policy.checkpoint_dir is None:
            raise ValueError("scale_cache needs a policy loaded from a checkpoint folder (load_model)")
        cache = fc.ScaleCache(scale_cache)
        checkpoint_sha = fc.checkpoint_digest(policy.checkpoint_dir)
        key = fc.scale_key(checkpoint_sha, policy.config, executor.dtype, calibration.fmt, obs_digest)
    amax = cache.load(key, len(fc.wide_linears(executor.weights))) if cache is not None else None
    source = "cache" if amax is not None else "measured"
    if amax is not None:
        calibration.set_scales(executor.weights, amax)
    else:
        amax = fc.calibrate(executor, [lambda o=o: policy._predict(*o, zeros) for o in observations])
    summary = fc.scale_summary(amax, calibration.fmt)
    cosines: tuple[float, ...] = ()
    threshold = None
    if held_out:
        threshold = GATE_FP8 if gate is None else float(gate)
        cosines = tuple(gate_cosines(policy, [unpack_observation(o) for o in held_out]))
    cache_path = cache.path(key) if cache is not None else None
    report = CalibrationReport(len(observations), source, summary, time.perf_counter() - start, obs_digest,
                               None if cache_path is None else str(cache_path), checkpoint_sha, cosines, threshold,
                               tuple(amax))
    if cache is not None and source == "measured":
        written = cache.store(key, amax, report.as_dict())
        report = dataclasses.replace(report, cache_path=None if written is None else str(written))
    log.info(report.summary())
    if cosines and min(cosines) < threshold:
        raise Fp8GateError(f"FP8 accuracy gate failed after calibration: cosine vs the bf16 engine "
                           f"{[round(c, 5) for c in cosines]} on {len(cosines)} held-out observations, below "
                           f"{threshold}; calibrate on observations like the ones the policy will see "
                           "(report: " + report.summary() + ")")
    return report


def engine_inputs(policy, images, prompt: str, state) -> tuple:
    """An observation as the engine receives it (validated): the images per view, the tokens, the token mask and
    the normalized state (or None); what the scale cache's key digests."""
    views = preprocess.validate_images(images, policy.config.view_names)
    tokens, mask, state_padded = policy._encode_prompt_and_state(prompt, state)
    state_norm = None
    if state is not None:
        state_norm = policy.normalizer.normalize_state(preprocess.validate_state(state, policy.config.state_dim))
    return (*views, tokens, mask, state_norm if state_padded is None else state_padded.numpy())


def normalized_actions(policy, images, prompt: str, state, noise: np.ndarray) -> np.ndarray:
    """The executor's normalized actions (horizon, action_dim) for one observation and pinned noise."""
    executor, cfg = policy.executor, policy.config
    if policy.gpu_preprocess:
        views = preprocess.validate_images(images, cfg.view_names)
        tokens, mask, state_padded = policy._encode_prompt_and_state(prompt, state)
        out = executor.predict_observation(views, tokens, mask,
                                           None if state_padded is None else state_padded.numpy(), noise,
                                           unnormalize=False)
        return np.asarray(out)[:, :cfg.action_dim]
    actions = executor.sample_actions(*policy.prepare_inputs(images, prompt, state, noise))
    return actions[0].float().cpu().numpy()[:, :cfg.action_dim]


def gate_cosines(policy, observations: Sequence[tuple]) -> list[float]:
    """Cosine of the FP8 engine's normalized chunk with the bf16 engine's (the same executor with its wide GEMMs
    in bf16), per observation, the flow noise pinned per observation."""
    from flashrt_core.engine.gate import cosine
    calibration = policy.executor.fp8_calibration
    rng = np.random.default_rng(GATE_NOISE_SEED)
    out = []
    for i, (images, prompt, state) in enumerate(observations):
        raise_if_stopped(f"FP8 gate: observation {i + 1} of {len(observations)}")
        noise = rng.standard_normal((policy.horizon, policy.config.max_action_dim)).astype(np.float32)
        fp8 = normalized_actions(policy, images, prompt, state, noise)
        with calibration.bf16_pass():
            bf16 = normalized_actions(policy, images, prompt, state, noise)
        out.append(cosine(fp8, bf16))
    return out


__all__ = ["CalibrationReport", "Fp8GateError", "calibrate_policy", "engine_inputs", "gate_cosines",
           "normalized_actions", "unpack_observation"]
