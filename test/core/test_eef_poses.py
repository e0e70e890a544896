"""flashrt_core/eef_poses.py: end-effector poses in GR00T's xyz+rot6d and xyz+rotvec formats and its relative
chunks (T_abs = T_ref T_rel), on rotations whose matrices are known by hand and on random poses."""

import numpy as np
import pytest

from flashrt_core.eef_poses import (EEF_FORMATS, absolute_to_relative, eef_format, matrix_to_rot6d,
                                    matrix_to_rotvec, relative_to_absolute, rot6d_to_matrix, rotvec_to_matrix)

RZ90 = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
RX90 = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])


def _random_rotvecs(rng, n: int) -> np.ndarray:
    axes = rng.standard_normal((n, 3))
    return axes / np.linalg.norm(axes, axis=1, keepdims=True) * rng.uniform(0.0, 3.0, (n, 1))


def test_rotation_vectors_and_matrices_known_by_hand():
    np.testing.assert_allclose(rotvec_to_matrix([0.0, 0.0, np.pi / 2]), RZ90, atol=1e-12)
    np.testing.assert_allclose(rotvec_to_matrix([np.pi / 2, 0.0, 0.0]), RX90, atol=1e-12)
    np.testing.assert_allclose(matrix_to_rotvec(RZ90), [0.0, 0.0, np.pi / 2], atol=1e-12)
    np.testing.assert_allclose(matrix_to_rotvec(np.diag([1.0, -1.0, -1.0])), [np.pi, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(matrix_to_rotvec(np.eye(3)), np.zeros(3), atol=1e-15)


def test_rotation_vectors_round_trip_at_every_angle():
    rng = np.random.default_rng(0)
    v = np.concatenate([_random_rotvecs(rng, 200), 1e-6 * rng.standard_normal((20, 3))])  # near 0: the series
    m = rotvec_to_matrix(v)
    np.testing.assert_allclose(m @ np.swapaxes(m, -1, -2), np.broadcast_to(np.eye(3), m.shape), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(m), 1.0, atol=1e-12)
    np.testing.assert_allclose(matrix_to_rotvec(m), v, atol=1e-10)


def test_rot6d_is_the_first_two_rows_and_reads_back_by_gram_schmidt():
    np.testing.assert_allclose(matrix_to_rot6d(RZ90), [0.0, -1.0, 0.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(rot6d_to_matrix(matrix_to_rot6d(RZ90)), RZ90, atol=1e-15)
    # a model's output is not quite orthonormal: the first row keeps its direction, the second loses its part
    # along the first, the third is their cross product
    m = rot6d_to_matrix([2.0, 0.0, 0.0, 0.3, 0.5, 0.0])
    np.testing.assert_allclose(m, np.eye(3), atol=1e-15)


def test_relative_poses_are_in_the_reference_frame():
    """The reference (t = [1, 2, 3], rotated 90 degrees about z): 1 along its x is +1 along the world's y, and a
    relative rotation about its x composes on the right (R_ref R_rel)."""
    for fmt, rot in (("xyz+rot6d", matrix_to_rot6d), ("xyz+rotvec", matrix_to_rotvec)):
        reference = np.concatenate([[1.0, 2.0, 3.0], rot(RZ90)])
        relative = np.stack([np.concatenate([[1.0, 0.0, 0.0], rot(np.eye(3))]),
                             np.concatenate([[0.0, 0.0, 0.0], rot(RX90)])])
        absolute = relative_to_absolute(relative, reference, fmt)
        np.testing.assert_allclose(absolute[0], reference + np.concatenate([[0.0, 1.0, 0.0], 0 * reference[3:]]),
                                   atol=1e-12)
        np.testing.assert_allclose(absolute[1, :3], [1.0, 2.0, 3.0], atol=1e-12)
        np.testing.assert_allclose(absolute[1, 3:], rot(RZ90 @ RX90), atol=1e-12)
        assert not np.allclose(rot(RZ90 @ RX90), rot(RX90 @ RZ90))            # the order matters


@pytest.mark.parametrize("fmt", sorted(EEF_FORMATS))
def test_relative_and_absolute_chunks_are_inverse(fmt):
    rng = np.random.default_rng(1)
    rot = matrix_to_rot6d if fmt == "xyz+rot6d" else matrix_to_rotvec
    poses = np.concatenate([rng.uniform(-1, 1, (16, 3)), rot(rotvec_to_matrix(_random_rotvecs(rng, 16)))], axis=1)
    reference = np.concatenate([rng.uniform(-1, 1, 3), rot(rotvec_to_matrix(_random_rotvecs(rng, 1)))[0]])
    relative = absolute_to_relative(poses, reference, fmt)
    np.testing.assert_allclose(relative_to_absolute(relative, reference, fmt), poses, atol=1e-10)
    np.testing.assert_allclose(relative_to_absolute(np.tile(absolute_to_relative(reference[None], reference, fmt),
                                                            (3, 1)), reference, fmt),
                               np.tile(reference, (3, 1)), atol=1e-12)           # the identity pose: the reference


def test_formats_by_value_or_enum_name_and_bad_shapes():
    assert eef_format("xyz+rot6d") == eef_format("XYZ_ROT6D") == "xyz+rot6d"
    assert eef_format("XYZ_ROTVEC") == "xyz+rotvec" and eef_format("DEFAULT") is None and eef_format(None) is None
    with pytest.raises(ValueError, match=r"xyz\+rot6d poses are \(steps, 9\)"):
        relative_to_absolute(np.zeros((4, 6)), np.zeros(9), "xyz+rot6d")
    with pytest.raises(ValueError, match="is not one of"):
        relative_to_absolute(np.zeros((4, 6)), np.zeros(6), "xyz+quat")
