"""GR00T N1.6's accuracy gate: the engine's action chunks (bf16 or FP8) against the fp32 eager reference on the same
weights and the same pinned noise, over several observations.

    cosine       per observation, of the flattened normalized chunk as the model outputs it (horizon x
                 max_action_dim): mean >= GATE_MEAN, worst >= GATE_WORST
    sign flips   in the gripper-like action dimensions (gripper_dims: an action group whose name contains "gripper";
                 none without one): an element where |reference| > SIGN_THRESHOLD and the engine's value has the
                 other sign (or is zero). A gripper that opens instead of closing is wrong however close the
                 cosine is, so the gate allows none.

The chunks are normalized actions ([-1, 1] for the embodiment's dimensions), so the threshold is in those units:
below it the reference's sign says little (the gripper's command is near its middle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .gate import cosine  # the pi family's gate's cosine of two flattened chunks

GATE_MEAN = 0.999
GATE_WORST = 0.995
SIGN_THRESHOLD = 0.05
GRIPPER = "gripper"


def gripper_dims(action_groups: Sequence[tuple[str, int]]) -> tuple[int, ...]:
    """The action columns of the groups whose name contains "gripper" (any case), from the embodiment's action
    layout [(group, dim)] in order (GrootPolicy.action_groups)."""
    out, start = [], 0
    for name, dim in action_groups:
        if GRIPPER in name.lower():
            out += range(start, start + dim)
        start += dim
    return tuple(out)


def sign_flips(engine: np.ndarray, reference: np.ndarray, dims: Sequence[int],
               threshold: float = SIGN_THRESHOLD) -> int:
    """Elements of the columns `dims` (the last axis) where |reference| > threshold and the engine's sign differs."""
    if not dims:
        return 0
    got = np.asarray(engine, np.float64)[..., list(dims)]
    want = np.asarray(reference, np.float64)[..., list(dims)]
    return int(np.sum((np.abs(want) > threshold) & (np.sign(got) != np.sign(want))))


@dataclass(frozen=True)
class GateResult:
    mean: float                  # mean cosine over the observations
    worst: float                 # the lowest
    sign_flips: int              # over every observation's gripper-like elements
    gripper_dims: tuple[int, ...]
    observations: int

    @property
    def passed(self) -> bool:
        return self.mean >= GATE_MEAN and self.worst >= GATE_WORST and self.sign_flips == 0

    def as_dict(self) -> dict:
        return {**asdict(self), "gripper_dims": list(self.gripper_dims), "passed": self.passed,
                "gate_mean": GATE_MEAN, "gate_worst": GATE_WORST, "sign_threshold": SIGN_THRESHOLD}

    def __str__(self) -> str:
        return (f"cosine mean {self.mean:.6f} worst {self.worst:.6f}, {self.sign_flips} gripper sign flips "
                f"(dims {list(self.gripper_dims)}) over {self.observations} observations: "
                f"{'pass' if self.passed else 'FAIL'}")


def gate(engine_chunks: Sequence[np.ndarray], reference_chunks: Sequence[np.ndarray],
         grippers: Sequence[int] = ()) -> GateResult:
    """The gate over paired chunks (one per observation, normalized, each (horizon, action dims) or with a leading
    batch axis of 1); grippers: gripper_dims of the embodiment's action layout."""
    if len(engine_chunks) != len(reference_chunks) or not engine_chunks:
        raise ValueError(f"the gate pairs engine and reference chunks: got {len(engine_chunks)} and "
                         f"{len(reference_chunks)}")
    cosines, flips = [], 0
    for got, want in zip(engine_chunks, reference_chunks):
        if np.shape(got) != np.shape(want):
            raise ValueError(f"engine chunk {np.shape(got)} and reference chunk {np.shape(want)} differ in shape")
        cosines.append(cosine(got, want))
        flips += sign_flips(got, want, grippers)
    return GateResult(float(np.mean(cosines)), float(np.min(cosines)), flips, tuple(grippers), len(cosines))
