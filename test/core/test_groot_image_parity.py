"""GR00T image preprocessing against the reference: the eval transform's two shortest-edge scalings as OpenCV
INTER_AREA (what albumentations' SmallestMaxSize runs; albumentations itself is not needed), the fractional
centre crop, then the reference's own Eagle fetch_image (smart_resize + PIL bicubic): the same image, level for
level, on smooth and on noisy frames. Runs where
FLASHRT_GROOT_SOURCE names the checkout and OpenCV imports; skips with the reason elsewhere."""

import numpy as np
import pytest
from PIL import Image

import groot_reference
from flashrt_core.groot_inputs import process_image
from flashrt_core.model.groot.config import get_groot_config

FETCH, REASON = groot_reference.eagle_fetch_image()
try:
    import cv2  # noqa: F401
except ImportError:
    FETCH, REASON = None, "OpenCV (opencv-python-headless) is not installed (or name a folder with FLASHRT_GROOT_DEPS)"
pytestmark = pytest.mark.skipif(FETCH is None, reason=str(REASON))


def smallest_max_size(img, edge):
    import cv2
    h, w = img.shape[:2]
    scale = edge / min(h, w)
    if scale == 1.0:
        return img
    return cv2.resize(img, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)


def reference_image(img, edge=256, fraction=0.95):
    x = smallest_max_size(img, edge)
    h, w = x.shape[:2]
    ch, cw = max(1, int(h * fraction)), max(1, int(w * fraction))
    top, left = (h - ch) // 2, (w - cw) // 2
    x = smallest_max_size(np.ascontiguousarray(x[top:top + ch, left:left + cw]), edge)
    return np.asarray(FETCH({"image": Image.fromarray(x)}))


@pytest.mark.parametrize("hw", [(224, 224), (480, 640), (720, 1280), (200, 150)])
def test_processed_image_matches_the_reference(hw):
    rng = np.random.default_rng(hw[0])
    smooth = rng.integers(0, 256, (hw[0] // 8 + 1, hw[1] // 8 + 1, 3)).astype(np.uint8)
    frames = (np.asarray(Image.fromarray(smooth).resize((hw[1], hw[0]), Image.Resampling.BILINEAR)),
              rng.integers(0, 256, (*hw, 3), dtype=np.uint8))
    for img in frames:
        mine = process_image(img, get_groot_config("groot_n1.6"), 256, 0.95)
        theirs = reference_image(img)
        assert mine.shape == theirs.shape
        # the same OpenCV INTER_AREA resizes and the same PIL bicubic resize: the same image to the level
        np.testing.assert_array_equal(mine, theirs)
