"""GR00T N1.6 per-embodiment statistics, modality layout and normalization (the reference's processor).

A GR00T checkpoint folder carries, beside the weights (written by Gr00tN1d6Processor.save_pretrained):
  processor_config.json  {"processor_kwargs": {"modality_configs": {tag: {"video"|"state"|"action"|"language":
                         {"modality_keys": [...], "delta_indices": [...], "mean_std_embedding_keys": [...],
                          "sin_cos_embedding_keys": [...], "action_configs": [...]}}}, "use_percentiles": ...,
                         "clip_outliers": ..., "apply_sincos_state_encoding": ..., "use_relative_action": ...}}
  statistics.json        {tag: {"state"|"action": {joint group: {"min","max","mean","std","q01","q99": [...]}}}}
  embodiment_id.json     {tag: projector index} (else the reference's built-in table, EMBODIMENT_IDS)
An embodiment tag picks the projector slice (embodiment id), the joint groups and their statistics.

Normalization per joint group (StateActionProcessor):
  min/max (default)   2 (x - min) / (max - min) - 1, dims with max == min -> 0; states clipped to [-1, 1]
                      when clip_outliers; use_percentiles reads q01 / q99 as min / max
  mean/std            groups in mean_std_embedding_keys: (x - mean) / std, std == 0 passes through
  sin/cos             state groups in sin_cos_embedding_keys with apply_sincos_state_encoding: [sin x, cos x]
Actions are unnormalized with the inverse (min/max clips to [-1, 1] first). With use_relative_action, action
groups whose action_configs entry has rep RELATIVE are relative to the raw state of their reference group
(state_key, else the group's own name): normalized with the "relative_action" statistics (min / max even with
use_percentiles, as the reference reads them; 1-D, or 2-D per chunk step), and after unnormalization
- type NON_EEF: joint offsets, added to the reference state;
- type EEF, format xyz+rot6d or xyz+rotvec: poses in the frame of the reference end-effector pose, composed onto
  it (T_ref T_rel, flashrt_core/eef_poses.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flashrt_core.eef_poses import EEF_FORMATS, eef_format, relative_to_absolute
from flashrt_core.errors import CheckpointError, InputError

PROCESSOR_FILE = "processor_config.json"
STATISTICS_FILE = "statistics.json"
EMBODIMENT_ID_FILE = "embodiment_id.json"
# The reference's EMBODIMENT_TAG_TO_PROJECTOR_INDEX (pretraining and pre-registered post-training tags).
EMBODIMENT_IDS = {"robocasa_panda_omron": 13, "gr1": 20, "behavior_r1_pro": 24, "unitree_g1": 8,
                  "libero_panda": 2, "oxe_google": 0, "oxe_widowx": 1, "oxe_droid": 16, "new_embodiment": 10}
SUPPLY_STATISTICS = (f"GR00T writes {STATISTICS_FILE} (with {PROCESSOR_FILE} and {EMBODIMENT_ID_FILE}) next to the "
                     "weights when it saves a fine-tuned checkpoint; copy it from the fine-tuning output folder "
                     f"into the checkpoint folder, or pass statistics=PATH to load_model")


@dataclass(frozen=True)
class Group:
    """One joint group: name, raw dim, normalization mode ("minmax" | "meanstd" | "sincos") and its parameters."""

    name: str
    dim: int
    mode: str
    lo: np.ndarray          # min (or q01) / mean; [D], or [T, D] per chunk step (relative actions)
    hi: np.ndarray          # max (or q99) / std
    relative_to: str | None = None    # relative action groups: the state group they are relative to
    pose_format: str | None = None    # relative end-effector groups: their EEF_FORMATS key (None: joint offsets)

    @property
    def encoded_dim(self) -> int:
        return 2 * self.dim if self.mode == "sincos" else self.dim


@dataclass(frozen=True)
class Embodiment:
    tag: str
    id: int
    views: tuple[str, ...]
    state: tuple[Group, ...]
    action: tuple[Group, ...]
    action_horizon: int | None
    clip_outliers: bool
    shortest_image_edge: int | None = None      # processor settings (None: the config's defaults)
    crop_fraction: float | None = None
    formalize_language: bool | None = None

    @property
    def state_dim(self) -> int:
        return sum(g.dim for g in self.state)

    @property
    def action_dim(self) -> int:
        return sum(g.dim for g in self.action)

    def normalize_state(self, state, max_state_dim: int) -> np.ndarray:
        """state: {group: values} or a flat array (groups concatenated in order) -> [max_state_dim] float32."""
        parts = []
        for group, raw in zip(self.state, self._split_state(state)):
            x = raw.astype(np.float64)
            if group.mode == "sincos":
                parts.append(np.concatenate([np.sin(x), np.cos(x)]))
            elif group.mode == "meanstd":
                ok = group.hi != 0
                parts.append(np.where(ok, (x - group.lo) / np.where(ok, group.hi, 1.0), x))
            else:
                ok = ~np.isclose(group.hi, group.lo)
                y = np.where(ok, 2 * (x - group.lo) / np.where(ok, group.hi - group.lo, 1.0) - 1, 0.0)
                parts.append(np.clip(y, -1.0, 1.0) if self.clip_outliers else y)
        flat = np.concatenate(parts) if parts else np.zeros(0)
        if flat.shape[0] > max_state_dim:
            raise InputError(f"embodiment {self.tag!r}: encoded state has {flat.shape[0]} values, more than the "
                             f"model's max_state_dim={max_state_dim}")
        out = np.zeros(max_state_dim, dtype=np.float32)
        out[:flat.shape[0]] = flat
        return out

    def unnormalize_actions(self, actions: np.ndarray, state=None) -> np.ndarray:
        """normalized [horizon, max_action_dim] -> robot units [horizon', action_dim] (horizon' = the
        embodiment's action horizon when it has one). state: the raw state predict was given (dict or flat),
        needed when relative action groups are added to it."""
        horizon = actions.shape[0] if self.action_horizon is None else min(self.action_horizon, actions.shape[0])
        raw_state = None
        if any(g.relative_to for g in self.action):
            raw_state = dict(zip((g.name for g in self.state), self._split_state(state)))
        out, start = [], 0
        for group in self.action:
            x = actions[:horizon, start:start + group.dim].astype(np.float64)
            start += group.dim
            lo = group.lo[:horizon] if group.lo.ndim == 2 else group.lo
            hi = group.hi[:horizon] if group.hi.ndim == 2 else group.hi
            if group.mode == "meanstd":
                y = np.where(hi != 0, x * hi + lo, x)
            else:
                y = (np.clip(x, -1.0, 1.0) + 1.0) / 2.0 * (hi - lo) + lo
            if group.pose_format:
                y = relative_to_absolute(y, raw_state[group.relative_to].astype(np.float64), group.pose_format)
            elif group.relative_to:
                y = y + raw_state[group.relative_to]
            out.append(y)
        return np.ascontiguousarray(np.concatenate(out, axis=-1), dtype=np.float32)

    def _split_state(self, state) -> list[np.ndarray]:
        names = [g.name for g in self.state]
        if isinstance(state, dict):
            unknown = sorted(set(state) - set(names))
            missing = [n for n in names if n not in state]
            if unknown or missing:
                raise InputError(f"embodiment {self.tag!r} takes the state groups {names}; "
                                 + (f"missing {missing}" if missing else "")
                                 + ("; " if missing and unknown else "") + (f"unknown {unknown}" if unknown else ""))
            parts = []
            for g in self.state:
                arr = _finite(state[g.name], f"state[{g.name!r}]").reshape(-1)
                if arr.shape[0] != g.dim:
                    raise InputError(f"state[{g.name!r}] has {arr.shape[0]} values; embodiment {self.tag!r}'s "
                                     f"statistics give that group {g.dim}")
                parts.append(arr)
            return parts
        if state is None:
            raise InputError(f"GR00T needs the robot state: embodiment {self.tag!r} takes the groups "
                             f"{[(g.name, g.dim) for g in self.state]}")
        flat = _finite(state, "state").reshape(-1)
        if flat.shape[0] != self.state_dim:
            raise InputError(f"state has {flat.shape[0]} values; embodiment {self.tag!r} takes {self.state_dim} "
                             f"({', '.join(f'{g.name}: {g.dim}' for g in self.state)}): is it another "
                             "embodiment's state?")
        bounds = np.cumsum([0] + [g.dim for g in self.state])
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _finite(values, what: str, error: type[Exception] = InputError) -> np.ndarray:
    """`values` as float64, or `error` where they are not numeric or hold NaN / inf (InputError for a predict's
    state; CheckpointError for statistics, which would normalize every state and action to NaN)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise error(f"{what} must be numeric: {exc}") from exc
    if not np.isfinite(arr).all():
        raise error(f"{what} has non-finite values (NaN/inf)")
    return arr


def _read_json(path: Path, what: str) -> dict:
    """The JSON object of `path`; invalid JSON or another JSON type is a CheckpointError naming the file."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} ({what}) is not valid JSON: {exc}") from exc
    return _object(data, f"{path} ({what})")


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def known_embodiments(checkpoint_dir: Path) -> dict[str, int]:
    """tag -> embodiment id: embodiment_id.json over the built-in table (the reference merges them so)."""
    ids = dict(EMBODIMENT_IDS)
    path = checkpoint_dir / EMBODIMENT_ID_FILE
    if path.is_file():
        for tag, value in _read_json(path, "embodiment ids").items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CheckpointError(f"{path}: embodiment {tag!r} has id {value!r}; ids are non-negative integers")
            ids[str(tag)] = value
    return ids


def load_statistics(checkpoint_dir: str | Path, statistics: str | Path | None = None) -> dict:
    """statistics.json of the checkpoint (or `statistics`, a path to one): {tag: {"state"|"action": ...}}."""
    checkpoint_dir = Path(checkpoint_dir)
    path = Path(statistics) if statistics is not None else checkpoint_dir / STATISTICS_FILE
    if not path.is_file():
        where = f"{path} (given as statistics=)" if statistics is not None else f"{path}"
        raise CheckpointError(f"GR00T checkpoint {checkpoint_dir} has no per-embodiment statistics: {where} is "
                              f"missing. {SUPPLY_STATISTICS}")
    stats = _read_json(path, "statistics")
    if not isinstance(stats, dict) or not stats:
        raise CheckpointError(f"{path} must map embodiment tags to their state / action statistics")
    return stats


def load_embodiment(checkpoint_dir: str | Path, tag: str, max_state_dim: int, max_action_dim: int,
                    statistics: str | Path | None = None, max_num_embodiments: int | None = None) -> Embodiment:
    """The embodiment `tag` of a GR00T checkpoint: id, views, joint groups with their normalization. With
    max_num_embodiments (the model's projector slots), an id beyond them is refused too."""
    checkpoint_dir = Path(checkpoint_dir)
    ids = known_embodiments(checkpoint_dir)
    proc_path = checkpoint_dir / PROCESSOR_FILE
    if not proc_path.is_file():
        raise CheckpointError(f"{proc_path} is missing: GR00T's processor config names each embodiment's views "
                              "and joint groups (it is saved with the checkpoint by the fine-tuning script)")
    kwargs = _object(_read_json(proc_path, "processor config").get("processor_kwargs", {}),
                     f"{proc_path}: processor_kwargs")
    modalities = _object(kwargs.get("modality_configs") or {}, f"{proc_path}: processor_kwargs.modality_configs")
    stats = load_statistics(checkpoint_dir, statistics)
    usable = sorted(t for t in modalities if t in stats)
    if tag not in ids and tag not in modalities:
        raise CheckpointError(f"unknown embodiment {tag!r}; this checkpoint knows {usable} (with statistics), "
                              f"embodiment ids exist for {sorted(ids)}")
    if tag not in modalities:
        raise CheckpointError(f"embodiment {tag!r} has a projector id ({ids[tag]}) but {proc_path.name} has no "
                              f"modality config for it: the checkpoint was fine-tuned for {usable}")
    if tag not in stats:
        src = statistics if statistics is not None else checkpoint_dir / STATISTICS_FILE
        raise CheckpointError(f"{src} has no statistics for embodiment {tag!r} (it has {sorted(stats)}): "
                              f"these are another embodiment's statistics. {SUPPLY_STATISTICS}")
    if tag not in ids:
        raise CheckpointError(f"embodiment {tag!r} has no projector id: add it to {EMBODIMENT_ID_FILE} "
                              f"(known: {sorted(ids)})")
    if max_num_embodiments is not None and ids[tag] >= max_num_embodiments:
        raise CheckpointError(f"embodiment {tag!r} has id {ids[tag]}, beyond the model's "
                              f"max_num_embodiments={max_num_embodiments}")
    try:
        return _embodiment(tag, ids[tag], _object(modalities[tag], f"{proc_path}: modality_configs.{tag}"),
                           _object(stats[tag], f"statistics of embodiment {tag!r}"), kwargs, max_state_dim,
                           max_action_dim, proc_path.name)
    except (AttributeError, TypeError, ValueError) as exc:      # a list or string where an object belongs
        raise CheckpointError(f"{proc_path.name} / {STATISTICS_FILE}: embodiment {tag!r} has an entry of an "
                              f"unexpected type ({exc})") from exc


def _embodiment(tag: str, embodiment_id: int, modality: dict, stats: dict, kwargs: dict, max_state_dim: int,
                max_action_dim: int, proc_name: str) -> Embodiment:
    """load_embodiment's Embodiment from the tag's modality config and statistics."""
    percentiles = bool(kwargs.get("use_percentiles", False))
    sincos = bool(kwargs.get("apply_sincos_state_encoding", False))
    state = _groups(tag, "state", modality, stats, percentiles, sincos)
    action = _groups(tag, "action", modality, stats, percentiles, False)
    if kwargs.get("use_relative_action"):
        action = _relative_groups(tag, modality, stats, action, state)
    horizon = len(modality["action"].get("delta_indices") or []) or None
    short = [g.name for g in action if g.lo.ndim == 2 and horizon is not None and g.lo.shape[0] < horizon]
    if short:
        raise CheckpointError(f"relative action statistics of embodiment {tag!r}, groups {short}, have fewer "
                              f"steps than its action horizon {horizon}")
    emb = Embodiment(tag=tag, id=embodiment_id, views=tuple(modality.get("video", {}).get("modality_keys", [])),
                     state=state, action=action,
                     action_horizon=len(modality["action"].get("delta_indices") or []) or None,
                     clip_outliers=bool(kwargs.get("clip_outliers", True)),
                     shortest_image_edge=kwargs.get("shortest_image_edge"), crop_fraction=kwargs.get("crop_fraction"),
                     formalize_language=kwargs.get("formalize_language"))
    if not emb.views:
        raise CheckpointError(f"{proc_name}: embodiment {tag!r} lists no video modality keys (camera views)")
    encoded = sum(g.encoded_dim for g in state)
    if encoded > max_state_dim or emb.action_dim > max_action_dim:
        raise CheckpointError(f"embodiment {tag!r}: state {encoded} / action {emb.action_dim} values exceed the "
                              f"model's max_state_dim={max_state_dim} / max_action_dim={max_action_dim}")
    return emb


def _groups(tag: str, kind: str, modality: dict, stats: dict, percentiles: bool, sincos: bool) -> tuple[Group, ...]:
    spec = modality.get(kind) or {}
    keys = spec.get("modality_keys") or []
    if not keys:
        raise CheckpointError(f"processor config: embodiment {tag!r} lists no {kind} joint groups")
    have = stats.get(kind) or {}
    missing = [k for k in keys if k not in have]
    if missing:
        raise CheckpointError(f"statistics of embodiment {tag!r} lack the {kind} groups {missing} (they have "
                              f"{sorted(have)}): the statistics file belongs to another embodiment or dataset")
    mean_std = set(spec.get("mean_std_embedding_keys") or [])
    sin_cos = set(spec.get("sin_cos_embedding_keys") or []) if sincos else set()
    groups = []
    for key in keys:
        s = have[key]
        try:
            lo_key, hi_key = ("q01", "q99") if percentiles else ("min", "max")
            if key in sin_cos:
                mode, lo, hi = "sincos", np.asarray(s["min"], float), np.asarray(s["max"], float)
            elif key in mean_std:
                mode, lo, hi = "meanstd", np.asarray(s["mean"], float), np.asarray(s["std"], float)
            else:
                mode, lo, hi = "minmax", np.asarray(s[lo_key], float), np.asarray(s[hi_key], float)
        except KeyError as exc:
            raise CheckpointError(f"statistics of embodiment {tag!r}, {kind} group {key!r} lack {exc}") from None
        if lo.ndim != 1 or lo.shape != hi.shape:
            raise CheckpointError(f"statistics of embodiment {tag!r}, {kind} group {key!r}: bounds of shapes "
                                  f"{lo.shape} / {hi.shape}, expected two equal 1-D lists")
        _finite((lo, hi), f"statistics of embodiment {tag!r}, {kind} group {key!r}", CheckpointError)
        groups.append(Group(key, int(lo.shape[0]), mode, lo, hi))
    return tuple(groups)


def _relative_groups(tag: str, modality: dict, stats: dict, action: tuple[Group, ...],
                     state: tuple[Group, ...]) -> tuple[Group, ...]:
    """The action groups with their relative-action statistics and reference state group where action_configs
    marks them RELATIVE (use_relative_action)."""
    spec = modality["action"]
    configs = spec.get("action_configs") or []
    states = {g.name: g for g in state}
    out = []
    for group, conf in zip(action, list(configs) + [None] * (len(action) - len(configs))):
        if not conf or str(conf.get("rep", "")).lower() != "relative":
            out.append(group)
            continue
        kind = str(conf.get("type", "")).lower()
        pose_format = eef_format(conf.get("format")) if kind == "eef" else None
        if kind not in ("eef", "non_eef"):
            raise CheckpointError(f"embodiment {tag!r}: relative action group {group.name!r} has type "
                                  f"{conf.get('type')!r}; the reference knows NON_EEF (joints) and EEF")
        if kind == "eef" and (pose_format is None or EEF_FORMATS[pose_format] != group.dim):
            raise CheckpointError(f"embodiment {tag!r}: relative end-effector action group {group.name!r} has "
                                  f"format {conf.get('format')!r} and {group.dim} values; the reference composes "
                                  f"{', '.join(f'{k} ({v} values)' for k, v in EEF_FORMATS.items())}")
        ref = conf.get("state_key") or group.name
        if ref not in states or states[ref].dim != group.dim:
            raise CheckpointError(f"embodiment {tag!r}: relative action group {group.name!r} needs the state group "
                                  f"{ref!r} with {group.dim} raw values")
        rel = (stats.get("relative_action") or {}).get(group.name)
        if rel is None:
            raise CheckpointError(f"statistics of embodiment {tag!r} lack relative_action.{group.name} (the "
                                  "processor sets use_relative_action and marks the group RELATIVE)")
        mode = "meanstd" if group.mode == "meanstd" else "minmax"
        lo_key, hi_key = ("mean", "std") if mode == "meanstd" else ("min", "max")   # as the reference: no q01/q99
        try:
            lo, hi = np.asarray(rel[lo_key], float), np.asarray(rel[hi_key], float)
        except KeyError as exc:
            raise CheckpointError(f"relative_action statistics of embodiment {tag!r}, group {group.name!r} lack "
                                  f"{exc}") from None
        if lo.shape != hi.shape or lo.ndim not in (1, 2) or lo.shape[-1] != group.dim:
            raise CheckpointError(f"relative_action statistics of embodiment {tag!r}, group {group.name!r}: shapes "
                                  f"{lo.shape} / {hi.shape}, expected [{group.dim}] or [steps, {group.dim}]")
        _finite((lo, hi), f"relative_action statistics of embodiment {tag!r}, group {group.name!r}",
                CheckpointError)
        out.append(Group(group.name, group.dim, mode, lo, hi, relative_to=ref, pose_format=pose_format))
    return tuple(out)
