"""Image resize-with-pad (Pillow and the numpy path without it vs openpi's PIL reference, torch vs numpy), view
handling, state validation and discretization."""

from __future__ import annotations

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

from flashrt_core import preprocess
from flashrt_core.errors import InputError
from flashrt_core.preprocess import (
    TORCH_RESIZE_TOLERANCE_LEVELS,
    discretize_state,
    prepare_images,
    resize_with_pad,
    resize_views_torch,
    resize_with_pad_torch,
    resized_shape,
    validate_state,
)

VIEWS = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
LEVEL = 2.0 / 255.0  # one uint8 level in [-1, 1] units
TORCH_MEAN_DIFF_LEVELS = 0.3  # most pixels agree exactly; the rest differ by one level
SHAPES = [(480, 640), (256, 256), (100, 300), (300, 100), (50, 60), (224, 500), (17, 1000), (720, 1280)]


def openpi_client_resize_with_pad(img: np.ndarray, size: int) -> np.ndarray:
    """The reference: openpi_client.image_tools.resize_with_pad (PIL bilinear + paste on a zero image)."""
    pil = Image.fromarray(img)
    if pil.size == (size, size):
        return img
    ratio = max(pil.width / size, pil.height / size)
    resized_w, resized_h = int(pil.width / ratio), int(pil.height / ratio)
    resized = pil.resize((resized_w, resized_h), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (size, size), 0)
    canvas.paste(resized, (int((size - resized_w) / 2), int((size - resized_h) / 2)))
    return np.asarray(canvas)


def test_reference_pillow_is_openpis_generation():
    # Pillow 13 may run the vertical pass first for some shapes; openpi pins Pillow 11.2.1.
    assert int(PIL.__version__.split(".")[0]) < 13, f"parity reference needs Pillow <= 12, got {PIL.__version__}"


@pytest.mark.parametrize("shape", SHAPES)
def test_resize_with_pad_equals_pil_bit_for_bit(shape):
    rng = np.random.default_rng(sum(shape))
    noise = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    gradient = np.stack([xx * 255 // max(shape[1] - 1, 1), yy * 255 // max(shape[0] - 1, 1), (xx + yy) % 256], -1)
    for img in (noise, gradient.astype(np.uint8)):
        out = resize_with_pad(img, 224)
        assert out.dtype == np.uint8 and out.shape == (224, 224, 3)
        np.testing.assert_array_equal(out, openpi_client_resize_with_pad(img, 224))


@pytest.mark.parametrize("shape", SHAPES)
def test_numpy_resize_equals_pil_bit_for_bit(shape):
    """The path without Pillow (or with a Pillow that resamples otherwise) gives Pillow 11's bits."""
    rng = np.random.default_rng(sum(shape) + 1)
    img = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    rh, rw, _, _ = resized_shape(*shape, 224)
    want = np.asarray(Image.fromarray(img).resize((rw, rh), resample=Image.BILINEAR))
    np.testing.assert_array_equal(preprocess._numpy_resize_bilinear(img, rh, rw), want)


def test_pillow_is_used_only_where_it_resizes_as_openpis(monkeypatch):
    preprocess._openpi_pillow.cache_clear()
    assert preprocess._openpi_pillow() is Image                      # the installed 11.2.1
    monkeypatch.setattr(PIL, "__version__", "13.0.0")
    preprocess._openpi_pillow.cache_clear()
    assert preprocess._openpi_pillow() is None
    img = np.random.default_rng(3).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    np.testing.assert_array_equal(resize_with_pad(img, 224), openpi_client_resize_with_pad(img, 224))
    monkeypatch.undo()
    preprocess._openpi_pillow.cache_clear()


def test_non_square_image_keeps_aspect_and_is_centred():
    img = np.full((100, 200, 3), 255, dtype=np.uint8)  # wide: 200x100 -> 224x112, 56 rows of padding each side
    out = resize_with_pad(img, 224)
    assert resized_shape(100, 200, 224) == (112, 224, 56, 0)
    assert (out[56:168] == 255).all()
    assert (out[:56] == 0).all() and (out[168:] == 0).all()
    tall = np.full((225, 101, 3), 200, dtype=np.uint8)  # odd padding: the extra column goes right/bottom
    rh, rw, top, left = resized_shape(225, 101, 224)
    out = resize_with_pad(tall, 224)
    # openpi's int(h / ratio) truncates 225 / (225 / 224) = 223.99.. to 223: one padded row at the bottom.
    assert (rh, top) == (223, 0) and rw == 100 and left == 62
    assert (out[:223, left : left + rw] == 200).all() and (out[223] == 0).all()
    assert (out[:, :left] == 0).all() and (out[:, left + rw :] == 0).all()


def test_square_image_of_target_size_is_untouched():
    img = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    assert resize_with_pad(img, 224) is img


@pytest.mark.parametrize("shape", SHAPES + [(224, 224)])
def test_torch_path_matches_numpy_path(shape):
    rng = np.random.default_rng(1)
    imgs = rng.integers(0, 256, (2, *shape, 3), dtype=np.uint8)  # [V, H, W, 3]
    out = resize_with_pad_torch(torch.from_numpy(imgs), 224)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 224, 224)
    expected, _ = prepare_images(list(imgs), VIEWS[:2], 224)  # [V, 3, 224, 224]
    diff = np.abs(out.numpy() - expected)
    assert diff.max() <= TORCH_RESIZE_TOLERANCE_LEVELS * LEVEL + 1e-6
    assert diff.mean() <= TORCH_MEAN_DIFF_LEVELS * LEVEL
    _, _, top, left = resized_shape(*shape, 224)
    if top:
        assert (out[:, :, :top] == -1.0).all()
    if left:
        assert (out[:, :, :, :left] == -1.0).all()


def test_strided_views_resize_like_contiguous_copies():
    img = np.random.default_rng(4).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    bgr_flipped = img[:, ::-1, ::-1]  # e.g. a BGR -> RGB view of a camera buffer
    np.testing.assert_array_equal(resize_with_pad(bgr_flipped), resize_with_pad(np.ascontiguousarray(bgr_flipped)))


def test_torch_path_rejects_wrong_layout():
    with pytest.raises(InputError, match="uint8 tensor"):
        resize_with_pad_torch(torch.zeros(1, 3, 224, 224, dtype=torch.uint8), 224)
    with pytest.raises(InputError, match="uint8 tensor"):
        resize_with_pad_torch(torch.zeros(1, 224, 224, 3), 224)


def test_prepare_images_maps_to_minus_one_one_and_masks_missing_views():
    img = np.zeros((100, 200, 3), dtype=np.uint8)
    img[:, :100] = 255
    pixels, masks = prepare_images([img], VIEWS, 224)
    assert pixels.dtype == np.float32 and pixels.shape == (3, 3, 224, 224)
    assert masks.tolist() == [True, False, False]
    assert (pixels[1:] == -1.0).all()  # missing views are -1 images
    assert (pixels[0, :, :56] == -1.0).all() and (pixels[0, :, 168:] == -1.0).all()  # padding maps to -1
    assert (pixels[0, :, 56:168, :100] == 1.0).all()  # 255 -> 1
    assert (pixels[0, :, 56:168, 124:] == -1.0).all()  # 0 -> -1


def test_prepare_images_by_name_and_none_views():
    rng = np.random.default_rng(2)
    a, b = (rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(2))
    by_name, masks = prepare_images({"right_wrist_0_rgb": b, "base_0_rgb": a, "left_wrist_0_rgb": None}, VIEWS, 224)
    by_list, list_masks = prepare_images([a, None, b], VIEWS, 224)
    assert masks.tolist() == list_masks.tolist() == [True, False, True]
    np.testing.assert_array_equal(by_name, by_list)


@pytest.mark.parametrize(
    ("images", "message"),
    [
        ([np.zeros((8, 8, 3), np.uint8)] * 4, "got 4 images but the model has 3 views"),
        ({"top_camera": np.zeros((8, 8, 3), np.uint8)}, r"unknown view name\(s\) \['top_camera'\]"),
        ([np.zeros((8, 8, 3), np.float32)], "view 'base_0_rgb': dtype must be uint8"),
        ([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.uint8)], "view 'left_wrist_0_rgb': shape must be HxWx3"),
        ([np.zeros((8, 8, 4), np.uint8)], "shape must be HxWx3"),
        ([np.zeros((0, 8, 3), np.uint8)], "view 'base_0_rgb': image is empty"),
        ([np.zeros((1, 5000, 3), np.uint8)], "image 1x5000 is too elongated"),
        ([[[1, 2, 3]]], "expected a numpy array, got list"),
        ([], "no images given"),
        ({"base_0_rgb": None}, "no images given"),
        (np.zeros((8, 8, 3), np.uint8), "must be a list"),
    ],
)
def test_prepare_images_errors_name_view_and_problem(images, message):
    with pytest.raises(InputError, match=message):
        prepare_images(images, VIEWS, 224)


def test_discretize_state_known_values_and_openpi_formula():
    assert discretize_state(np.array([-1.0, 0.0, 0.99, 1.0, 1.5, -0.999])) == [0, 128, 254, 255, 255, 0]
    assert discretize_state(np.array([-1.2])) == [-1]  # openpi does not clip: below -1 gives -1
    state = np.random.default_rng(3).uniform(-1.1, 1.1, 64).astype(np.float32)
    openpi = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    assert discretize_state(state) == openpi.tolist()
    with pytest.raises(InputError, match="non-finite"):
        discretize_state(np.array([0.0, np.nan]))


def test_validate_state():
    out = validate_state([1, 2.5, -3], 3)
    assert out.dtype == np.float32 and out.tolist() == [1.0, 2.5, -3.0]
    with pytest.raises(InputError, match="state has 2 values, the model expects 3"):
        validate_state(np.zeros(2), 3)
    with pytest.raises(InputError, match=r"non-finite values \(NaN/inf\) at indices \[1, 2\]"):
        validate_state([0.0, np.nan, np.inf], 3)
    with pytest.raises(InputError, match="must be 1-D"):
        validate_state(np.zeros((1, 3)), 3)
    with pytest.raises(InputError, match="must be numeric"):
        validate_state(["a", "b", "c"], 3)
    with pytest.raises(InputError, match="must be numeric"):
        validate_state(np.array([True, False, True]), 3)


@pytest.mark.gpu
def test_cuda_path_matches_numpy_and_replays_in_a_cuda_graph():
    rng = np.random.default_rng(8)
    first, second = (rng.integers(0, 256, (2, 480, 640, 3), dtype=np.uint8) for _ in range(2))
    static_in = torch.from_numpy(first).cuda()  # [V, H, W, 3] uint8
    eager = resize_with_pad_torch(static_in, 224)
    expected, _ = prepare_images(list(first), VIEWS[:2], 224)
    assert np.abs(eager.cpu().numpy() - expected).max() <= TORCH_RESIZE_TOLERANCE_LEVELS * LEVEL + 1e-6

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        resize_with_pad_torch(static_in, 224)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = resize_with_pad_torch(static_in, 224)
    static_in.copy_(torch.from_numpy(second))
    graph.replay()
    torch.testing.assert_close(static_out, resize_with_pad_torch(static_in, 224), rtol=0, atol=0)
    expected_second, _ = prepare_images(list(second), VIEWS[:2], 224)
    assert np.abs(static_out.cpu().numpy() - expected_second).max() <= TORCH_RESIZE_TOLERANCE_LEVELS * LEVEL + 1e-6


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU on this machine"))])
def test_views_of_one_shape_resize_in_one_batch_with_the_same_result(device):
    """resize_views_torch equals resize_with_pad_torch view by view, in view order, whether the views share a
    shape (one batch), differ (one batch per shape) or are at the model's size already (no resize)."""
    rng = np.random.default_rng(7)
    frame = lambda h, w: torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).to(device)  # noqa: E731
    for shapes in ([(48, 64), (48, 64)], [(48, 64), (30, 20), (48, 64)], [(224, 224)], [(224, 224), (48, 64)],
                   [(480, 640), (480, 640)]):
        views = [frame(h, w) for h, w in shapes]
        want = torch.cat([resize_with_pad_torch(v[None], 224) for v in views])
        got = resize_views_torch(views, 224)
        assert got.shape == (len(views), 3, 224, 224)
        assert torch.equal(got, want), shapes
    first, second = frame(48, 64), frame(48, 64)
    swapped = resize_views_torch([second, first], 224)                 # the order is the views', not the shapes'
    assert torch.equal(swapped[0], resize_with_pad_torch(second[None], 224)[0])
