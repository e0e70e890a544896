"""Observation preprocessing: images (resize-with-pad, [-1, 1], view masks) and the robot state.

Image resizing follows openpi, whose inference clients call ``openpi_client.image_tools.resize_with_pad``
(PIL ``Image.resize(..., BILINEAR)`` on uint8, then centred zero padding):

- ``ratio = max(w / size, h / size)``, resized size ``int(h / ratio) x int(w / ratio)``; an image already
  ``size x size`` is passed through untouched;
- PIL's bilinear filter is antialiased: when shrinking, the triangle filter is stretched by the scale factor;
- padding is 0 in uint8, which maps to -1.0 after ``x / 255 * 2 - 1``.

``resize_with_pad`` resizes with Pillow itself where the installed Pillow resamples as openpi's (<= 12; openpi pins
11.2.1): 2.8x faster than numpy for two 480x640 frames (docs/performance.md). Without Pillow, or with one that may
run its passes in another order (13 on), it runs a numpy re-implementation of PIL's two-pass fixed-point algorithm
(horizontal pass, uint8 rounding, vertical pass; 22-bit coefficients), equal to Pillow <= 12 bit for bit.
``resize_with_pad_torch`` runs the same resampling on a GPU with ``F.interpolate(bilinear, antialias=True)`` in
float (one rounding instead of two) and agrees with the numpy path within ``TORCH_RESIZE_TOLERANCE_LEVELS``
uint8 level.
Note: openpi's and lerobot's PyTorch models call ``F.interpolate`` without antialiasing when an image of the
wrong size reaches the model; that only matters for images not resized by the client, and differs from PIL
when shrinking.

State: ``discretize_state`` is openpi's ``np.digitize(state, linspace(-1, 1, 257)[:-1]) - 1`` without clipping
(a normalized value below -1 gives bin -1, as in openpi training data; values >= 1 give 255).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from flashrt_core.errors import InputError

logger = logging.getLogger(__name__)

IMAGE_SIZE = 224
STATE_BINS = 256
TORCH_RESIZE_TOLERANCE_LEVELS = 1  # max |numpy - torch| in uint8 levels (1 level = 2/255 in [-1, 1])
_PRECISION_BITS = 32 - 8 - 2  # PIL's fixed-point precision for 8-bit images
MAX_PILLOW_MAJOR = 12  # the newest Pillow that resizes as openpi's pinned 11.2.1 (horizontal pass first)
_BIN_EDGES = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1]  # [256] left edges, as openpi


def resized_shape(height: int, width: int, size: int) -> tuple[int, int, int, int]:
    """(resized_h, resized_w, pad_top, pad_left) of openpi's resize-with-pad into a ``size x size`` square."""
    ratio = max(width / size, height / size)
    resized_h, resized_w = int(height / ratio), int(width / ratio)
    if resized_h == 0 or resized_w == 0:
        raise InputError(f"image {height}x{width} is too elongated to resize into {size}x{size} (a side would be 0)")
    return resized_h, resized_w, (size - resized_h) // 2, (size - resized_w) // 2


@functools.lru_cache(maxsize=32)
def _pil_bilinear_coeffs(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """PIL ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` for the bilinear filter.

    Returns (index int64 [out, K], coeff int64 [out, K]): output pixel o = sum_k in[index[o, k]] * coeff[o, k],
    in 22-bit fixed point. Taps beyond the image edge have coefficient 0 and a clamped index.
    """
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support = 1.0 * filter_scale  # bilinear (triangle) support is 1 input pixel, stretched when shrinking
    ksize = int(np.ceil(support)) * 2 + 1
    index = np.zeros((out_size, ksize), dtype=np.int64)
    coeff = np.zeros((out_size, ksize), dtype=np.int64)
    for o in range(out_size):
        center = (o + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size)
        taps = np.arange(xmin, xmax)
        w = np.maximum(0.0, 1.0 - np.abs((taps - center + 0.5) * (1.0 / filter_scale)))  # PIL multiplies by 1/scale
        total = w.cumsum()[-1] if len(w) else 0.0  # sequential sum, as PIL's loop (np.sum is pairwise)
        if total != 0.0:
            w = w / total
        fixed = np.where(w < 0, -0.5 + w * (1 << _PRECISION_BITS), 0.5 + w * (1 << _PRECISION_BITS))
        index[o, : len(taps)] = taps
        index[o, len(taps) :] = xmax - 1
        coeff[o, : len(taps)] = fixed.astype(np.int64)  # C cast truncates toward zero, as PIL
    return index, coeff


def _resample_rows(src: np.ndarray, index: np.ndarray, coeff: np.ndarray) -> np.ndarray:
    """int32 [N, M] -> uint8 [out, M]: out[o] = round(sum_k src[index[o, k]] * coeff[o, k]) in 22-bit fixed point.

    Gathers whole rows (contiguous copies), one tap at a time. int32 cannot overflow: coefficients of a row sum
    to ~2^22, so the accumulator stays below 255 * 2^22 + 2^21 < 2^31.
    """
    acc = src[index[:, 0]] * coeff[:, 0, None]  # [out, M]
    acc += 1 << (_PRECISION_BITS - 1)
    for k in range(1, index.shape[1]):
        acc += src[index[:, k]] * coeff[:, k, None]
    np.right_shift(acc, _PRECISION_BITS, out=acc)
    return np.clip(acc, 0, 255).astype(np.uint8)


def _transpose_hw(img: np.ndarray) -> np.ndarray:
    """[A, B, C] -> contiguous [B, A, C] (cv2's blocked transpose is ~40x faster than numpy's copy)."""
    return cv2.transpose(np.ascontiguousarray(img))


@functools.cache
def _openpi_pillow():
    """PIL.Image where the installed Pillow resizes as openpi's Pillow 11.2.1 does (major version <= 12), else None
    (no Pillow: it is not a core requirement; or 13 on, which may run the vertical pass first)."""
    try:
        import PIL
        from PIL import Image
    except ImportError:
        return None
    return Image if int(PIL.__version__.split(".")[0]) <= MAX_PILLOW_MAJOR else None


def _pil_resize_bilinear(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """PIL ``Image.resize((out_w, out_h), BILINEAR)`` of a uint8 [H, W, 3] image: Pillow's own where it resamples
    as openpi's (_openpi_pillow), else _numpy_resize_bilinear (the same bits)."""
    image = _openpi_pillow()
    if image is None:
        return _numpy_resize_bilinear(img, out_h, out_w)
    return np.asarray(image.fromarray(np.ascontiguousarray(img)).resize((out_w, out_h), image.Resampling.BILINEAR))


def _numpy_resize_bilinear(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """PIL ``Image.resize((out_w, out_h), BILINEAR)`` of a uint8 [H, W, 3] image, bit-exact with Pillow <= 12.

    Horizontal pass first, rounded to uint8, then the vertical pass (Pillow 13 may run the vertical pass first
    for some shapes; openpi pins Pillow 11.2.1). Both passes resample rows: the horizontal one on the transpose.
    """
    height, width, channels = img.shape
    out = np.ascontiguousarray(img)
    if out_w != width:
        index, coeff = _pil_bilinear_coeffs(width, out_w)
        src = _transpose_hw(out).reshape(width, height * channels)  # [W, H*C]
        out = _resample_rows(src.astype(np.int32), index, coeff.astype(np.int32))  # [out_w, H*C]
        out = _transpose_hw(out.reshape(out_w, height, channels))  # [H, out_w, C]
    if out_h != height:
        index, coeff = _pil_bilinear_coeffs(height, out_h)
        src = out.reshape(height, -1)  # [H, W'*C]
        out = _resample_rows(src.astype(np.int32), index, coeff.astype(np.int32))  # [out_h, W'*C]
        out = out.reshape(out_h, -1, channels)
    return out


def resize_with_pad(img: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [size, size, 3]: PIL bilinear resize keeping aspect ratio, centred zero padding."""
    _check_image(img, "image")
    height, width = img.shape[:2]
    if (height, width) == (size, size):
        return img
    resized_h, resized_w, top, left = resized_shape(height, width, size)
    out = np.zeros((size, size, img.shape[2]), dtype=np.uint8)  # [size, size, 3], pad value 0 -> -1.0
    out[top : top + resized_h, left : left + resized_w] = _pil_resize_bilinear(img, resized_h, resized_w)
    return out


def resize_with_pad_torch(images: torch.Tensor, size: int = IMAGE_SIZE) -> torch.Tensor:
    """uint8 [V, H, W, 3] tensor (any device) -> float32 [V, 3, size, size] in [-1, 1], padding at -1.

    Antialiased bilinear in float, rounded to the uint8 grid like the numpy path (equal within
    ``TORCH_RESIZE_TOLERANCE_LEVELS``). No host sync: shapes depend only on the input shape.
    """
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise InputError(f"images must be a uint8 tensor [V, H, W, 3], got {images.dtype} {tuple(images.shape)}")
    height, width = images.shape[1:3]
    x = images.permute(0, 3, 1, 2).to(torch.float32)  # [V, 3, H, W]
    if (height, width) != (size, size):
        resized_h, resized_w, top, left = resized_shape(height, width, size)
        x = F.interpolate(x, size=(resized_h, resized_w), mode="bilinear", align_corners=False, antialias=True)
        x = x.round_().clamp_(0.0, 255.0)  # [V, 3, rh, rw] on the uint8 grid
        x = F.pad(x, (left, size - resized_w - left, top, size - resized_h - top), value=0.0)  # [V, 3, size, size]
    return x / 255.0 * 2.0 - 1.0


def resize_views_torch(images: Sequence[torch.Tensor], size: int = IMAGE_SIZE) -> torch.Tensor:
    """uint8 [H, W, 3] tensors, one per view (shapes may differ) -> float32 [V, 3, size, size] in [-1, 1], in view
    order. The views of one shape are resized in one batch (`resize_with_pad_torch`), so two cameras of one size
    cost one set of resize kernels, not two; the result equals one call per view."""
    groups: dict[tuple, list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(tuple(img.shape), []).append(i)

    def batch(idx: list[int]) -> torch.Tensor:
        return images[idx[0]][None] if len(idx) == 1 else torch.stack([images[i] for i in idx])
    if len(groups) == 1:
        return resize_with_pad_torch(batch(list(range(len(images)))), size)
    out: list[torch.Tensor | None] = [None] * len(images)
    for idx in groups.values():
        for i, pixels in zip(idx, resize_with_pad_torch(batch(idx), size)):
            out[i] = pixels
    return torch.stack(out)


def prepare_images(
    images: Sequence[np.ndarray | None] | Mapping[str, np.ndarray | None],
    view_names: Sequence[str],
    size: int = IMAGE_SIZE,
) -> tuple[np.ndarray, np.ndarray]:
    """Images in view order (list) or by view name (dict) -> (pixels float32 [V, 3, size, size], masks bool [V]).

    A view with no image (list shorter than ``view_names``, a name absent from the dict, or ``None``) becomes a
    -1 image with mask False. Raises InputError for extra or unknown views and malformed images.
    """
    by_view = dict(zip(view_names, validate_images(images, view_names), strict=True))
    pixels = np.full((len(view_names), 3, size, size), -1.0, dtype=np.float32)  # [V, 3, size, size]
    masks = np.zeros(len(view_names), dtype=np.bool_)  # [V]
    for v, name in enumerate(view_names):
        img = by_view[name]
        if img is None:
            continue
        square = resize_with_pad(img, size)  # [size, size, 3] uint8
        pixels[v] = square.transpose(2, 0, 1).astype(np.float32) / 255.0 * 2.0 - 1.0  # openpi's uint8 -> [-1, 1]
        masks[v] = True
    return pixels, masks


def validate_images(
    images: Sequence[np.ndarray | None] | Mapping[str, np.ndarray | None], view_names: Sequence[str]
) -> list[np.ndarray | None]:
    """Images (list in view order or dict by view name) -> one validated uint8 HxWx3 array or None per view.

    Raises InputError for extra or unknown views, malformed images, or no image at all. Used by prepare_images
    and by executors that resize on the GPU (so both paths refuse the same inputs with the same messages).
    """
    by_view = _images_by_view(images, view_names)
    if all(img is None for img in by_view.values()):
        raise InputError(f"no images given: at least one of the views {list(view_names)} is required")
    for name, img in by_view.items():
        if img is not None:
            _check_image(img, f"view {name!r}")
    return [by_view[name] for name in view_names]


def _images_by_view(images, view_names: Sequence[str]) -> dict[str, np.ndarray | None]:
    if isinstance(images, Mapping):
        unknown = [k for k in images if k not in view_names]
        if unknown:
            raise InputError(f"unknown view name(s) {unknown}; the model's views are {list(view_names)}")
        return {name: images.get(name) for name in view_names}
    if isinstance(images, np.ndarray) or not isinstance(images, Sequence):
        raise InputError(
            f"images must be a list of HxWx3 uint8 arrays or a dict view name -> array, got {type(images).__name__}"
        )
    if len(images) > len(view_names):
        raise InputError(f"got {len(images)} images but the model has {len(view_names)} views {list(view_names)}")
    padded = list(images) + [None] * (len(view_names) - len(images))
    return dict(zip(view_names, padded, strict=True))


def _check_image(img, what: str) -> None:
    if not isinstance(img, np.ndarray):
        raise InputError(f"{what}: expected a numpy array, got {type(img).__name__}")
    if img.dtype != np.uint8:
        raise InputError(f"{what}: dtype must be uint8 (0..255), got {img.dtype}")
    if img.ndim != 3 or img.shape[2] != 3:
        raise InputError(f"{what}: shape must be HxWx3 (RGB), got {img.shape}")
    if img.shape[0] == 0 or img.shape[1] == 0:
        raise InputError(f"{what}: image is empty, shape {img.shape}")


def host_noise(noise, shape: tuple[int, int]) -> np.ndarray:
    """The flow noise as a host float32 array of `shape` (horizon, max_action_dim): the validated `noise`
    argument, or None -> N(0, 1) from torch's CPU generator (so torch.manual_seed pins it, whatever the device)."""
    if noise is None:
        return torch.randn(1, *shape)[0].numpy()
    try:
        arr = np.asarray(noise.detach().cpu() if torch.is_tensor(noise) else noise, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InputError(f"noise must be a numeric array of shape {shape}: {exc}") from exc
    if arr.shape != tuple(shape):
        raise InputError(f"noise must have shape {tuple(shape)} (horizon, max_action_dim), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError("noise has non-finite values (NaN/inf)")
    return arr


def validate_state(state, state_dim: int) -> np.ndarray:
    """Robot state -> float32 [state_dim]; InputError on non-numeric, wrong shape or non-finite values."""
    try:
        arr = np.asarray(state)
    except (TypeError, ValueError) as exc:
        raise InputError(f"state must be a 1-D numeric array, got {type(state).__name__}: {exc}") from exc
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise InputError(f"state must be numeric, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise InputError(f"state must be 1-D, got shape {arr.shape}")
    if arr.shape[0] != state_dim:
        raise InputError(f"state has {arr.shape[0]} values, the model expects {state_dim}")
    arr = arr.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise InputError(f"state has non-finite values (NaN/inf) at indices {bad.tolist()}")
    return arr


def discretize_state(state_normalized: np.ndarray) -> list[int]:
    """Normalized state [D] -> D bin indices for the pi0.5 prompt (openpi: 0..255, -1 below -1, no clipping)."""
    state = np.asarray(state_normalized, dtype=np.float64)
    if state.ndim != 1:
        raise InputError(f"state must be 1-D to discretize, got shape {state.shape}")
    if not np.all(np.isfinite(state)):
        raise InputError("state has non-finite values (NaN/inf); cannot discretize")
    return (np.digitize(state, bins=_BIN_EDGES) - 1).tolist()      # Python ints
