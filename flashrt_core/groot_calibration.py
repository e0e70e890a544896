"""GR00T calibration caches keyed by embodiment.

A low-precision calibration (activation ranges per GEMM input) depends on the embodiment: its projector slices
and its normalized states and actions change the DiT's activations. A cache recorded on one embodiment and
reused for another quietly saturates or wastes range, so every cache carries the key it was recorded under
(model id, embodiment tag and id, precision) and `load_calibration` refuses a cache whose key differs, or that
has no embodiment at all, naming both.

File: JSON {"key": {"model": ..., "embodiment": ..., "embodiment_id": ..., "precision": ...},
            "amax": {tensor or GEMM name: float}}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from flashrt_core.errors import CheckpointError


@dataclass(frozen=True)
class CalibrationKey:
    model: str
    embodiment: str
    embodiment_id: int
    precision: str


def calibration_key(policy, precision: str) -> CalibrationKey:
    """The key of a GrootPolicy's calibration at `precision` (e.g. "fp8")."""
    emb = policy.embodiment
    return CalibrationKey(policy.config.name, emb.tag, int(emb.id), precision)


def save_calibration(path: str | Path, key: CalibrationKey, amax: dict[str, float]) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"key": asdict(key), "amax": {k: float(v) for k, v in amax.items()}}, indent=2))
    return path


def load_calibration(path: str | Path, key: CalibrationKey) -> dict[str, float]:
    """The amax table of the cache at `path`, after checking that it was recorded under `key`."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"calibration cache {path} is unreadable: {exc}") from exc
    held = raw.get("key") or {}
    if not held.get("embodiment"):
        raise CheckpointError(f"calibration cache {path} does not say which embodiment it was recorded on; GR00T's "
                              f"activation ranges depend on it: recalibrate for {key.embodiment!r} (delete the file)")
    diffs = [f"{field} {held.get(field)!r} (wanted {value!r})" for field, value in asdict(key).items()
             if held.get(field) != value]
    if diffs:
        raise CheckpointError(f"calibration cache {path} was recorded for another setup: " + ", ".join(diffs)
                              + f"; recalibrate for embodiment {key.embodiment!r} or point to its own cache")
    return {str(k): float(v) for k, v in (raw.get("amax") or {}).items()}
