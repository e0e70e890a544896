"""Image / CompressedImage messages -> HxWx3 uint8 RGB, with clear errors on bad input."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image

from flashrt_ros.image_conversion import (ImageConversionError, check_image, rgb_to_image_fields, to_rgb)

# JPEG is lossy: mean absolute error allowed on a smooth test image.
JPEG_MEAN_ABS_TOLERANCE = 3.0


def smooth_rgb(height: int = 48, width: int = 64) -> np.ndarray:
    ys, xs = np.mgrid[0:height, 0:width]
    return np.stack([xs * 255 // width, ys * 255 // height, (xs + ys) * 255 // (width + height)],
                    axis=-1).astype(np.uint8)   # (H, W, 3)


def raw_message(pixels: np.ndarray, encoding: str, step: int | None = None, bigendian: int = 0) -> Image:
    height, width = pixels.shape[:2]
    row = pixels.reshape(height, -1).view(np.uint8)
    step = step or row.shape[1]
    padded = np.zeros((height, step), np.uint8)
    padded[:, :row.shape[1]] = row
    return Image(height=height, width=width, encoding=encoding, step=step, is_bigendian=bigendian,
                 data=padded.tobytes())


@pytest.mark.parametrize("encoding, make", [
    ("rgb8", lambda rgb: rgb),
    ("bgr8", lambda rgb: rgb[..., ::-1].copy()),
    ("rgba8", lambda rgb: np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 7, np.uint8)], axis=-1)),
    ("bgra8", lambda rgb: np.concatenate([rgb[..., ::-1], np.full(rgb.shape[:2] + (1,), 7, np.uint8)], axis=-1)),
])
def test_color_encodings_give_the_same_rgb(encoding, make):
    rgb = smooth_rgb()
    out = to_rgb(raw_message(np.ascontiguousarray(make(rgb)), encoding))
    assert out.dtype == np.uint8 and out.shape == rgb.shape
    np.testing.assert_array_equal(out, rgb)


def test_row_padding_is_skipped():
    rgb = smooth_rgb()
    out = to_rgb(raw_message(rgb, "rgb8", step=rgb.shape[1] * 3 + 16))
    np.testing.assert_array_equal(out, rgb)


def test_mono8_and_mono16_become_grey_rgb():
    grey = smooth_rgb()[..., 0]
    out = to_rgb(raw_message(grey[..., None].copy(), "mono8"))
    np.testing.assert_array_equal(out, np.repeat(grey[..., None], 3, axis=-1))
    grey16 = grey.astype(np.uint16) * 256 + 17                 # the high byte carries the value
    for byteorder, flag in (("<", 0), (">", 1)):
        message = raw_message(grey16.astype(np.dtype(np.uint16).newbyteorder(byteorder))[..., None].copy(),
                              "mono16", bigendian=flag)
        np.testing.assert_array_equal(to_rgb(message), np.repeat(grey[..., None], 3, axis=-1))


@pytest.mark.parametrize("fmt", ["jpeg", "png", "rgb8; jpeg compressed bgr8"])
def test_compressed_images_decode_to_rgb(fmt):
    rgb = smooth_rgb()
    extension = ".png" if fmt == "png" else ".jpg"
    ok, encoded = cv2.imencode(extension, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    out = to_rgb(CompressedImage(format=fmt, data=encoded.tobytes()))
    assert out.shape == rgb.shape and out.dtype == np.uint8
    error = np.abs(out.astype(np.int16) - rgb.astype(np.int16)).mean()
    if fmt == "png":
        assert error == 0
    else:
        assert error < JPEG_MEAN_ABS_TOLERANCE


@pytest.mark.parametrize("message, match", [
    (Image(height=2, width=2, encoding="yuv422", step=4, data=bytes(8)), "unsupported image encoding 'yuv422'"),
    (Image(height=0, width=2, encoding="rgb8", step=6, data=b""), "out of range"),
    (Image(height=2, width=2, encoding="rgb8", step=4, data=bytes(8)), "step 4 < width"),
    (Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(11)), "11 bytes, expected step\\*height = 12"),
    (CompressedImage(format="tiff", data=bytes(4)), "unsupported compressed format 'tiff'"),
    (CompressedImage(format="jpeg", data=b""), "no data"),
])
def test_cheap_checks_name_the_problem(message, match):
    with pytest.raises(ImageConversionError, match=match):
        check_image(message)
    with pytest.raises(ValueError, match=match):      # ImageConversionError is a ValueError
        to_rgb(message)


def test_truncated_compressed_images_fail_the_cheap_check_before_any_decoder_sees_them(capfd):
    """A truncated or zero-filled transfer lacks the end marker: rejected without decoding, so libjpeg writes
    nothing to stderr."""
    ok, encoded = cv2.imencode(".jpg", smooth_rgb())
    truncated = CompressedImage(format="jpeg", data=encoded.tobytes()[:40] + bytes(200))
    with pytest.raises(ImageConversionError, match="lacks its start .SOI. or end .EOI. marker"):
        check_image(truncated)
    with pytest.raises(ImageConversionError, match="not jpeg"):
        to_rgb(CompressedImage(format="jpeg", data=b"GIF89a" + bytes(100)))
    ok, png = cv2.imencode(".png", smooth_rgb())
    with pytest.raises(ImageConversionError, match="IEND"):
        check_image(CompressedImage(format="png", data=png.tobytes()[:-20]))
    check_image(CompressedImage(format="png", data=png.tobytes()))
    check_image(CompressedImage(format="jpeg", data=encoded.tobytes() + bytes(8)))    # padding after EOI is fine
    assert capfd.readouterr().err == ""


def test_corrupt_jpeg_with_intact_markers_passes_the_cheap_check_but_fails_decoding(capfd):
    """libjpeg's warning line is taken from stderr and becomes part of the error."""
    ok, encoded = cv2.imencode(".jpg", smooth_rgb())
    data = encoded.tobytes()
    corrupt = CompressedImage(format="jpeg", data=data[:40] + bytes(200) + data[-2:])
    check_image(corrupt)
    with pytest.raises(ImageConversionError, match="cannot decode jpeg data .* Corrupt JPEG data"):
        to_rgb(corrupt)
    assert capfd.readouterr().err == ""


def test_libjpeg_warnings_about_a_frame_it_still_decodes_go_to_the_caller_not_stderr(capfd):
    from flashrt_ros.image_conversion import DECODER_MESSAGE_PREFIXES
    ok, encoded = cv2.imencode(".jpg", smooth_rgb())
    data = encoded.tobytes()
    padded = CompressedImage(format="jpeg", data=data[:len(data) // 2] + bytes(10) + data[len(data) // 2:])
    messages = []
    assert to_rgb(padded, messages).shape == smooth_rgb().shape
    assert len(messages) == 1 and messages[0].startswith(DECODER_MESSAGE_PREFIXES), messages
    to_rgb(padded)                                        # without a list: taken from stderr all the same
    assert capfd.readouterr().err == ""


def test_other_stderr_output_during_a_capture_passes_through(capfd):
    import os

    from flashrt_ros.stderr_capture import capture_stderr
    with capture_stderr(("Corrupt JPEG data",)) as lines:
        os.write(2, b"[INFO] another thread's log line\nCorrupt JPEG data: 3 extraneous bytes\npartial")
    assert lines == ["Corrupt JPEG data: 3 extraneous bytes"]
    assert capfd.readouterr().err == "[INFO] another thread's log line\npartial"


def test_rgb_to_image_fields_round_trips():
    rgb = smooth_rgb()
    for encoding in ("rgb8", "bgr8"):
        np.testing.assert_array_equal(to_rgb(Image(**rgb_to_image_fields(rgb, encoding))), rgb)
    with pytest.raises(ValueError, match="rgb8 and bgr8"):
        rgb_to_image_fields(rgb, "mono8")
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        rgb_to_image_fields(rgb[..., 0])
