"""End-effector poses as GR00T's processor writes them: translation + rotation rows of a chunk, and the relative
chunks of its use_relative_action setting (gr00t/data/state_action: pose.py, action_chunking.py).

Formats (the action_configs "format", by value or enum name):
  xyz+rot6d   (9,)  translation, then the first two ROWS of the rotation matrix R, row-major: [R00 R01 R02 R10 R11
              R12] (Isaac-GR00T N1.6's EndEffectorPose; derivatives that store the first two columns, Zhou et
              al.'s layout, are another format). Reading one back normalizes the first row, removes its part
              from the second and normalizes that (Gram-Schmidt), and takes their cross product as the third
              row, so a model's not quite orthonormal output still gives a rotation.
  xyz+rotvec  (6,)  translation, then the rotation vector (axis * angle, angle in [0, pi]).
A relative chunk is each pose in the reference pose's frame: T_rel = T_ref^-1 T_abs with T = [[R, t], [0, 1]], so
T_abs = T_ref T_rel: R_abs = R_ref R_rel, t_abs = R_ref t_rel + t_ref. The reference is the robot's current
end-effector pose (the state group named by the action config's state_key), in the same format.

The rotation vector conversions follow scipy's Rotation (the reference's): through the unit quaternion, its scalar
part made >= 0, angle = 2 atan2(|v|, w), with scipy's series near angle 0; matrix -> quaternion by the largest of
the trace and the diagonal.
"""

from __future__ import annotations

import numpy as np

# format -> values per pose (3 of translation, then the rotation)
EEF_FORMATS = {"xyz+rot6d": 9, "xyz+rotvec": 6}
_ENUM_NAMES = {"xyz_rot6d": "xyz+rot6d", "xyz_rotvec": "xyz+rotvec"}


def eef_format(name) -> str | None:
    """The EEF_FORMATS key an action config's "format" names (its enum value or name, any case); None if none."""
    key = str(name or "").strip().lower()
    key = _ENUM_NAMES.get(key, key)
    return key if key in EEF_FORMATS else None


def rot6d_to_matrix(rot6d: np.ndarray) -> np.ndarray:
    """(..., 6) first two rows -> (..., 3, 3) rotation matrices (Gram-Schmidt over the rows)."""
    rows = np.asarray(rot6d, dtype=np.float64).reshape(*np.shape(rot6d)[:-1], 2, 3)
    r1 = rows[..., 0, :] / np.linalg.norm(rows[..., 0, :], axis=-1, keepdims=True)
    r2 = rows[..., 1, :] - np.sum(r1 * rows[..., 1, :], axis=-1, keepdims=True) * r1
    r2 = r2 / np.linalg.norm(r2, axis=-1, keepdims=True)
    return np.stack([r1, r2, np.cross(r1, r2)], axis=-2)


def matrix_to_rot6d(matrix: np.ndarray) -> np.ndarray:
    """(..., 3, 3) -> (..., 6): the first two rows, row-major."""
    matrix = np.asarray(matrix, dtype=np.float64)
    return matrix[..., :2, :].reshape(*matrix.shape[:-2], 6)


def _quaternion_to_matrix(q: np.ndarray) -> np.ndarray:
    """(..., 4) unit quaternions (x, y, z, w) -> (..., 3, 3)."""
    x, y, z, w = (q[..., i] for i in range(4))
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], axis=-1),
        np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], axis=-1),
        np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], axis=-1)], axis=-2)


def _matrix_to_quaternion(m: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotation matrices -> (..., 4) unit quaternions (x, y, z, w), from the largest of the trace and
    the diagonal (the numerically safe branch)."""
    flat = m.reshape(-1, 3, 3)
    out = np.empty((flat.shape[0], 4))
    for n, r in enumerate(flat):
        decision = [r[0, 0], r[1, 1], r[2, 2], r[0, 0] + r[1, 1] + r[2, 2]]
        choice = int(np.argmax(decision))
        q = np.empty(4)
        if choice != 3:
            i, j, k = choice, (choice + 1) % 3, (choice + 2) % 3
            q[i] = 1 - decision[3] + 2 * r[i, i]
            q[j] = r[j, i] + r[i, j]
            q[k] = r[k, i] + r[i, k]
            q[3] = r[k, j] - r[j, k]
        else:
            q[:] = [r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1], 1 + decision[3]]
        out[n] = q / np.linalg.norm(q)
    return out.reshape(*m.shape[:-2], 4)


def rotvec_to_matrix(rotvec: np.ndarray) -> np.ndarray:
    """(..., 3) rotation vectors -> (..., 3, 3)."""
    v = np.asarray(rotvec, dtype=np.float64)
    angle = np.linalg.norm(v, axis=-1, keepdims=True)
    small = angle <= 1e-3
    safe = np.where(small, 1.0, angle)
    scale = np.where(small, 0.5 - angle ** 2 / 48 + angle ** 4 / 3840, np.sin(safe / 2) / safe)
    return _quaternion_to_matrix(np.concatenate([scale * v, np.cos(angle / 2)], axis=-1))


def matrix_to_rotvec(matrix: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotation matrices -> (..., 3) rotation vectors, angle in [0, pi]."""
    q = _matrix_to_quaternion(np.asarray(matrix, dtype=np.float64))
    q = np.where(q[..., 3:] < 0, -q, q)
    xyz = q[..., :3]
    angle = 2 * np.arctan2(np.linalg.norm(xyz, axis=-1, keepdims=True), q[..., 3:])
    small = angle <= 1e-3
    safe = np.where(small, 1.0, angle)
    scale = np.where(small, 2 + angle ** 2 / 12 + 7 * angle ** 4 / 2880, safe / np.sin(safe / 2))
    return scale * xyz


def _rotation(values: np.ndarray, fmt: str) -> np.ndarray:
    return rot6d_to_matrix(values[..., 3:]) if fmt == "xyz+rot6d" else rotvec_to_matrix(values[..., 3:])


def _values(translation: np.ndarray, rotation: np.ndarray, fmt: str) -> np.ndarray:
    rot = matrix_to_rot6d(rotation) if fmt == "xyz+rot6d" else matrix_to_rotvec(rotation)
    return np.concatenate([translation, rot], axis=-1)


def _check(poses: np.ndarray, reference: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    if fmt not in EEF_FORMATS:
        raise ValueError(f"end-effector format {fmt!r} is not one of {sorted(EEF_FORMATS)}")
    poses, reference = np.asarray(poses, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    dim = EEF_FORMATS[fmt]
    if poses.ndim != 2 or poses.shape[1] != dim or reference.shape != (dim,):
        raise ValueError(f"{fmt} poses are (steps, {dim}) with a ({dim},) reference pose, got {poses.shape} and "
                         f"{reference.shape}")
    return poses, reference


def relative_to_absolute(relative: np.ndarray, reference: np.ndarray, fmt: str) -> np.ndarray:
    """A relative chunk (steps, D) in the reference pose's frame -> absolute poses (steps, D): T_ref T_rel."""
    relative, reference = _check(relative, reference, fmt)
    r_ref, t_ref = _rotation(reference, fmt), reference[:3]
    rotation = r_ref @ _rotation(relative, fmt)
    translation = relative[:, :3] @ r_ref.T + t_ref
    return _values(translation, rotation, fmt)


def absolute_to_relative(absolute: np.ndarray, reference: np.ndarray, fmt: str) -> np.ndarray:
    """Absolute poses (steps, D) -> the relative chunk in the reference pose's frame: T_ref^-1 T_abs (what the
    reference's processor trains on)."""
    absolute, reference = _check(absolute, reference, fmt)
    r_ref, t_ref = _rotation(reference, fmt), reference[:3]
    rotation = r_ref.T @ _rotation(absolute, fmt)
    translation = (absolute[:, :3] - t_ref) @ r_ref
    return _values(translation, rotation, fmt)
