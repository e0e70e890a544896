"""Normalization statistics: loading (openpi / lerobot), saving, and state / action (un)normalization.

Formulas follow openpi ``transforms.Normalize`` / ``Unnormalize`` (src/openpi/transforms.py):

- z-score (pi0):     n = (x - mean) / (std + 1e-6);            x = n * (std + 1e-6) + mean
- quantile (pi0.5):  n = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1; x = (n + 1) / 2 * (q99 - q01 + 1e-6) + q01

Normalizing slices the statistics to the input's length (openpi). Unnormalizing a 32-wide model output with
shorter statistics leaves the extra dimensions as they are for quantile, and scales them by (1 + 1e-6) for
z-score (openpi pads mean with 0 and std with 1). lerobot's ``NormalizerProcessorStep`` uses no 1e-6 (eps only
when a denominator is exactly 0); the difference is a relative 1e-6 / (q99 - q01), far below bf16 precision.
Arithmetic runs in float64 (openpi's stats come from JSON as float64) and results are float32.

Files:
- openpi: ``norm_stats.json`` = ``{"norm_stats": {"state"|"actions": {"mean", "std", "q01", "q99"}}}`` in the
  checkpoint directory or under ``assets/<asset_id>/`` (openpi copies the training assets there);
- lerobot >= 0.4: ``policy_preprocessor_step_<i>_normalizer_processor.safetensors`` (keys
  ``observation.state.<stat>`` and ``action.<stat>``) and ``policy_postprocessor_step_<i>_unnormalizer_processor
  .safetensors`` (``action.<stat>``). The step index moves between lerobot versions, so the file names are read
  from ``policy_preprocessor.json`` / ``policy_postprocessor.json`` (each normalizer step's ``state_file``); a
  folder without those JSON files is searched by the file name pattern.

A lerobot normalizer step without a ``state_file`` holds no statistics: lerobot applies it as the identity
(``lerobot/pi05_base`` ships such an empty normalizer). ``load_norm_stats`` returns None for it, as for a folder
with no statistics at all, and ``locate_norm_stats`` says which of the two it is, so that ``load_model`` refuses
with that reason and the ways to supply statistics (or ``require_norm_stats=False`` to run as lerobot does).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from flashrt_core.config import NormMode
from flashrt_core.errors import CheckpointError, InputError

logger = logging.getLogger(__name__)

EPS = 1e-6  # openpi's denominator epsilon
OPENPI_FILE = "norm_stats.json"
LEROBOT_PRE_GLOB = "policy_preprocessor_step_*_normalizer_processor.safetensors"
LEROBOT_POST_GLOB = "policy_postprocessor_step_*_unnormalizer_processor.safetensors"
LEROBOT_PRE_FILE = "policy_preprocessor_step_2_normalizer_processor.safetensors"  # pi0.5 pipeline position
LEROBOT_POST_FILE = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
LEROBOT_KEYS = {"state": "observation.state", "actions": "action"}  # our key -> lerobot feature name
STAT_NAMES = ("mean", "std", "q01", "q99")
LEROBOT_PRE_CONFIG = "policy_preprocessor.json"
LEROBOT_POST_CONFIG = "policy_postprocessor.json"
LEROBOT_NORMALIZER_STEPS = ("normalizer_processor", "unnormalizer_processor")  # lerobot's registry names
SUPPLY_STATS = ("put the training data's statistics into the folder as norm_stats.json (openpi's format: "
                '{"norm_stats": {"state": {mean, std, q01, q99}, "actions": {...}}}), or make a ready folder with '
                "`flashrt-convert SRC DST --norm-stats FILE`")


@dataclasses.dataclass(frozen=True)
class FeatureStats:
    """Statistics of one feature (the state or the actions), each a float64 [D] array; quantiles optional."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    def __post_init__(self):
        dim = None
        for name in STAT_NAMES:
            value = getattr(self, name)
            if value is None:
                if name in ("mean", "std"):
                    raise ValueError(f"{name} is required")
                continue
            arr = np.asarray(value, dtype=np.float64)
            if arr.ndim != 1 or arr.size == 0:
                raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} has non-finite values")
            if dim is not None and arr.size != dim:
                raise ValueError(f"{name} has {arr.size} values, mean has {dim}")
            dim = arr.size
            object.__setattr__(self, name, arr)
        if (self.q01 is None) != (self.q99 is None):
            raise ValueError("q01 and q99 must be given together")
        if (self.std < 0).any():
            raise ValueError(f"std has negative values at indices {np.flatnonzero(self.std < 0).tolist()}")
        if self.q01 is not None and (self.q01 > self.q99).any():
            raise ValueError(f"q01 > q99 at indices {np.flatnonzero(self.q01 > self.q99).tolist()}")

    @property
    def dim(self) -> int:
        return self.mean.size

    @property
    def has_quantiles(self) -> bool:
        return self.q01 is not None


@dataclasses.dataclass(frozen=True)
class NormStats:
    """Per-key statistics: ``state`` and ``actions`` (either may be absent)."""

    state: FeatureStats | None = None
    actions: FeatureStats | None = None

    def items(self) -> list[tuple[str, FeatureStats]]:
        return [(key, stats) for key in ("state", "actions") if (stats := getattr(self, key)) is not None]

    def save_openpi(self, path: str | Path) -> Path:
        """Write openpi's ``norm_stats.json``; ``path`` is the file or its directory. Returns the file path."""
        path = Path(path)
        if path.suffix != ".json":
            path = path / OPENPI_FILE
        body = {
            key: {name: None if (v := getattr(stats, name)) is None else v.tolist() for name in STAT_NAMES}
            for key, stats in self.items()
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"norm_stats": body}, indent=2))
        return path

    def save_lerobot(self, directory: str | Path) -> list[Path]:
        """Write lerobot's normalizer (state + actions) and unnormalizer (actions) safetensors into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)

        def flat(keys: tuple[str, ...]) -> dict[str, np.ndarray]:
            out = {}
            for key in keys:
                stats = getattr(self, key)
                for name in STAT_NAMES if stats is not None else ():
                    if (value := getattr(stats, name)) is not None:
                        out[f"{LEROBOT_KEYS[key]}.{name}"] = value.astype(np.float32)
            return out

        written = []
        for filename, keys in ((LEROBOT_PRE_FILE, ("state", "actions")), (LEROBOT_POST_FILE, ("actions",))):
            tensors = flat(keys)
            if tensors:
                save_file(tensors, str(directory / filename))
                written.append(directory / filename)
        return written


def random_norm_stats(state_dim: int, action_dim: int, seed: int = 0) -> NormStats:
    """Plausible random statistics (std > 0, q01 < mean < q99) for tests and the demo checkpoint."""
    rng = np.random.default_rng(seed)

    def feature(dim: int) -> FeatureStats:
        mean = rng.normal(0.0, 0.5, dim)
        std = rng.uniform(0.05, 1.0, dim)
        return FeatureStats(
            mean=mean,
            std=std,
            q01=mean - std * rng.uniform(1.5, 2.5, dim),
            q99=mean + std * rng.uniform(1.5, 2.5, dim),
        )

    return NormStats(state=feature(state_dim), actions=feature(action_dim))


# ---------------------------------------------------------------------------------------------------------------
# Loading


@dataclasses.dataclass(frozen=True)
class StatsLocation:
    """Where a checkpoint keeps its statistics: format ("openpi" | "lerobot" | None), the files, and a note
    (which files, or why there are none)."""

    format: str | None
    files: tuple[Path, ...]
    note: str


def locate_norm_stats(checkpoint_dir: str | Path, asset_id: str | None = None) -> StatsLocation:
    """Find the statistics files: ``norm_stats.json``, then ``assets/**/norm_stats.json`` (``asset_id`` picks one
    of several, e.g. ``"physical-intelligence/libero"``), then lerobot's normalizer safetensors."""
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    if (directory / OPENPI_FILE).is_file():
        return StatsLocation("openpi", (directory / OPENPI_FILE,), f"openpi {OPENPI_FILE}")
    assets = directory / "assets"
    candidates = sorted(assets.rglob(OPENPI_FILE)) if assets.is_dir() else []
    if asset_id is not None:
        candidates = [c for c in candidates if c.parent == assets / asset_id]
        if not candidates:
            raise CheckpointError(f"no {OPENPI_FILE} for asset id {asset_id!r} under {assets}")
    if len(candidates) > 1:
        names = [str(c.parent.relative_to(assets)) for c in candidates]
        raise CheckpointError(f"several {OPENPI_FILE} under {assets}: {names}; choose one with asset_id")
    if candidates:
        return StatsLocation("openpi", (candidates[0],),
                             f"openpi assets/{candidates[0].parent.relative_to(assets)}/{OPENPI_FILE}")
    pre, post, empty = lerobot_stats_files(directory)
    if pre or post:
        files = tuple(pre + post)
        return StatsLocation("lerobot", files, "lerobot normalizer " + ", ".join(p.name for p in files))
    if empty:
        return StatsLocation(None, (), f"its lerobot normalizer steps ({', '.join(empty)}) hold no statistics "
                                       "(lerobot applies them as the identity)")
    return StatsLocation(None, (), f"no {OPENPI_FILE}, assets/*/{OPENPI_FILE} or lerobot normalizer safetensors")


def lerobot_stats_files(directory: Path) -> tuple[list[Path], list[Path], list[str]]:
    """(normalizer files, unnormalizer files, empty normalizer steps) of a lerobot folder: named by the normalizer
    steps of policy_preprocessor.json / policy_postprocessor.json where those name them by registry name, else
    found by the file name pattern."""
    found: list[list[Path]] = []
    empty: list[str] = []
    for config_name, pattern in ((LEROBOT_PRE_CONFIG, LEROBOT_PRE_GLOB), (LEROBOT_POST_CONFIG, LEROBOT_POST_GLOB)):
        config_path = directory / config_name
        steps = _processor_steps(config_path) if config_path.is_file() else []
        if not any(step.get("registry_name") in LEROBOT_NORMALIZER_STEPS for step in steps):
            matches = sorted(directory.glob(pattern))
            if len(matches) > 1:
                raise CheckpointError(f"several files match {pattern} and no normalizer step of {config_name} "
                                      f"names one: {[p.name for p in matches]}")
            found.append(matches)
            continue
        files = []
        for index, step in enumerate(steps):
            if step.get("registry_name") not in LEROBOT_NORMALIZER_STEPS:
                continue
            if not step.get("state_file"):
                empty.append(f"{config_name} step {index} {step['registry_name']}")
                continue
            path = directory / step["state_file"]
            if not path.is_file():
                raise CheckpointError(f"{config_path} step {index} names the statistics file {step['state_file']}, "
                                      f"which is not in {directory}")
            files.append(path)
        found.append(files)
    return found[0], found[1], empty


def _processor_steps(path: Path) -> list[dict]:
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from exc
    steps = record.get("steps") if isinstance(record, dict) else None
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise CheckpointError(f"{path}: expected a lerobot processor pipeline (an object with a list 'steps')")
    return steps


def load_norm_stats(checkpoint_dir: str | Path, asset_id: str | None = None) -> NormStats | None:
    """Statistics of a checkpoint directory (locate_norm_stats), or None when it has none (the normalizer is then
    the identity)."""
    location = locate_norm_stats(checkpoint_dir, asset_id)
    if location.format == "openpi":
        return load_openpi_file(location.files[0])
    if location.format == "lerobot":
        return _load_lerobot(list(location.files))
    logger.info("no normalization statistics in %s (%s): states and actions pass through unchanged",
                checkpoint_dir, location.note)
    return None


def load_openpi_file(path: str | Path) -> NormStats:
    """openpi's norm_stats.json at `path`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("norm_stats"), dict):
        raise CheckpointError(f"{path}: missing object 'norm_stats'")
    body = data["norm_stats"]
    features = {}
    for key in ("state", "actions"):
        if key not in body:
            continue
        entry = body[key]
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path}: norm_stats.{key} must be an object with mean/std/q01/q99")
        features[key] = _feature_stats({n: entry.get(n) for n in STAT_NAMES}, f"{path}: norm_stats.{key}")
    if not features:
        raise CheckpointError(f"{path}: norm_stats has neither 'state' nor 'actions' (keys: {sorted(body)})")
    logger.info("loaded openpi norm stats %s (%s)", path, ", ".join(f"{k} {v.dim}" for k, v in features.items()))
    return NormStats(**features)


def _load_lerobot(files: list[Path]) -> NormStats:
    """Normalizer files first, then the unnormalizer's: its action stats are the ones applied to outputs, so
    they win over the normalizer's copy."""
    tensors: dict[str, tuple[np.ndarray, Path]] = {}
    for path in files:
        try:
            for name, value in load_file(str(path)).items():
                tensors[name] = (value, path)
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file: {exc}") from exc
    features = {}
    for key, feature in LEROBOT_KEYS.items():
        found = {n: tensors.get(f"{feature}.{n}") for n in STAT_NAMES}
        if all(v is None for v in found.values()):
            continue
        source = next(v[1] for v in found.values() if v is not None)
        features[key] = _feature_stats(
            {n: None if v is None else v[0] for n, v in found.items()}, f"{source}: {feature}"
        )
    if not features:
        names = sorted(tensors)
        raise CheckpointError(f"{[str(p) for p in files]}: no 'observation.state.*' or 'action.*' statistics "
                              f"(keys: {names})")
    logger.info("loaded lerobot norm stats (%s)", ", ".join(f"{k} {v.dim}" for k, v in features.items()))
    return NormStats(**features)


def _feature_stats(values: dict, where: str) -> FeatureStats:
    arrays = {}
    for name, value in values.items():
        if value is None:
            continue
        try:
            arrays[name] = np.asarray(value, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}.{name}: not a numeric array: {exc}") from exc
    for name in ("mean", "std"):
        if name not in arrays:
            raise CheckpointError(f"{where}: missing key '{name}'")
    try:
        return FeatureStats(**arrays)
    except ValueError as exc:
        raise CheckpointError(f"{where}: {exc}") from exc


# ---------------------------------------------------------------------------------------------------------------
# Applying


def pad_to(x: np.ndarray, dim: int) -> np.ndarray:
    """Zero-pad the last axis of ``x`` to ``dim`` (openpi ``pad_to_dim``); float32."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] > dim:
        raise InputError(f"cannot pad a last axis of {x.shape[-1]} values down to {dim}")
    pad = [(0, 0)] * (x.ndim - 1) + [(0, dim - x.shape[-1])]
    return np.pad(x, pad)


class Normalizer:
    """Applies one checkpoint's statistics; ``stats=None`` is the identity."""

    def __init__(self, stats: NormStats | None, mode: NormMode | str):
        try:
            self.mode = NormMode(mode)
        except ValueError:
            raise ValueError(f"unknown normalization mode {mode!r}; expected 'quantile' or 'zscore'") from None
        self.stats = stats
        if stats is not None and self.mode is NormMode.QUANTILE:
            for key, feature in stats.items():
                if not feature.has_quantiles:
                    raise CheckpointError(f"quantile normalization needs q01/q99, the '{key}' statistics have none")

    @staticmethod
    def pad_to(x: np.ndarray, dim: int) -> np.ndarray:
        return pad_to(x, dim)

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """Robot state float [D] -> normalized float32 [D] (statistics sliced to D, as openpi)."""
        x = np.asarray(state, dtype=np.float64)
        feature = None if self.stats is None else self.stats.state
        if feature is None:
            return x.astype(np.float32)
        dim = x.shape[-1]
        if dim > feature.dim:
            raise InputError(f"state has {dim} values but the norm stats cover only {feature.dim}")
        if self.mode is NormMode.ZSCORE:
            out = (x - feature.mean[:dim]) / (feature.std[:dim] + EPS)
        else:
            q01, q99 = feature.q01[:dim], feature.q99[:dim]
            out = (x - q01) / (q99 - q01 + EPS) * 2.0 - 1.0
        return out.astype(np.float32)

    def action_affine(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(scale, offset) float64 [dim] with unnormalize(x) = x * scale + offset, for a ``dim``-wide action.

        Dimensions beyond the statistics follow openpi: identity (quantile) or scale 1 + 1e-6 (z-score).
        """
        scale, offset = np.ones(dim), np.zeros(dim)
        feature = None if self.stats is None else self.stats.actions
        if feature is None:
            return scale, offset
        n = min(dim, feature.dim)
        if self.mode is NormMode.ZSCORE:
            scale[:] = 1.0 + EPS  # openpi pads std with 1 and mean with 0
            scale[:n] = feature.std[:n] + EPS
            offset[:n] = feature.mean[:n]
        else:
            scale[:n] = (feature.q99[:n] - feature.q01[:n] + EPS) / 2.0
            offset[:n] = feature.q01[:n] + scale[:n]
        return scale, offset

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Robot-unit actions [..., D] -> model space float32 [..., D]: the inverse of unnormalize_actions
        (x - offset) / scale with action_affine(D), e.g. a previous chunk that conditions the next one (RTC)."""
        x = np.asarray(actions, dtype=np.float64)
        scale, offset = self.action_affine(x.shape[-1])
        return ((x - offset) / scale).astype(np.float32)

    def unnormalize_actions(self, actions: np.ndarray, action_dim: int | None = None) -> np.ndarray:
        """Normalized actions [..., A] -> robot units float32 [..., A], then sliced to ``action_dim`` if given."""
        x = np.asarray(actions, dtype=np.float64)
        feature = None if self.stats is None else self.stats.actions
        if feature is not None:
            n = min(x.shape[-1], feature.dim)
            out = x.copy()
            if self.mode is NormMode.ZSCORE:
                out = x * (1.0 + EPS)
                out[..., :n] = x[..., :n] * (feature.std[:n] + EPS) + feature.mean[:n]
            else:
                q01, q99 = feature.q01[:n], feature.q99[:n]
                out[..., :n] = (x[..., :n] + 1.0) / 2.0 * (q99 - q01 + EPS) + q01
            x = out
        if action_dim is not None:
            if action_dim > x.shape[-1]:
                raise InputError(f"action_dim {action_dim} exceeds the model's action width {x.shape[-1]}")
            x = x[..., :action_dim]
        return x.astype(np.float32)
