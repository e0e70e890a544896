"""sensor_msgs/Image and CompressedImage -> HxWx3 uint8 RGB numpy arrays (no cv_bridge).

Two steps, so the node can reject bad frames cheaply in the subscription callback and decode only
the frames that reach the policy (on the inference thread):

- ``check_image(msg)``: O(1) checks of encoding, sizes and buffer length (raw), or format and framing
  (compressed: a JPEG must start with its SOI marker and end with its EOI marker, a PNG must start with its
  signature and end with its IEND chunk), so truncated or zero-filled data is rejected without decoding.
- ``to_rgb(msg, decoder_messages)``: the conversion (zero-copy view for rgb8 when possible, cv2 for the rest).
  libjpeg and libpng report corrupt data with warning lines written straight to stderr, outside any logger;
  ``to_rgb`` takes them (flashrt_ros.stderr_capture) and hands them to the caller in ``decoder_messages``, so the
  node logs them through ROS, throttled.

Both raise ``ImageConversionError`` (a ValueError) with a message naming the problem.
Duck-typed on the message fields, so rclpy messages and rosbags messages both work.
"""

from __future__ import annotations

import enum

import cv2
import numpy as np

from flashrt_ros.stderr_capture import capture_stderr

# Largest side accepted, to reject garbage sizes before allocating anything.
MAX_IMAGE_SIDE = 16384


class ImageConversionError(ValueError):
    """The message cannot be turned into an RGB image; the message says why."""


class RawEncoding(enum.Enum):
    """Raw encodings supported: name -> (channels, bytes per channel)."""

    RGB8 = ("rgb8", 3, 1)
    BGR8 = ("bgr8", 3, 1)
    RGBA8 = ("rgba8", 4, 1)
    BGRA8 = ("bgra8", 4, 1)
    MONO8 = ("mono8", 1, 1)
    MONO16 = ("mono16", 1, 2)

    def __init__(self, label: str, channels: int, depth: int):
        self.label = label
        self.channels = channels
        self.depth = depth

    @classmethod
    def parse(cls, encoding: str) -> "RawEncoding":
        for member in cls:
            if member.label == encoding.lower():
                return member
        supported = ", ".join(m.label for m in cls)
        raise ImageConversionError(f"unsupported image encoding {encoding!r}; supported: {supported}")


COMPRESSED_FORMATS = ("jpeg", "jpg", "png")
JPEG_SOI, JPEG_EOI = b"\xff\xd8", b"\xff\xd9"
JPEG_EOI_SEARCH = 32        # bytes at the end searched for EOI (some encoders pad after it)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_IEND = b"IEND"
PNG_IEND_SEARCH = 16
# Beginnings of the warning lines libjpeg (jerror.h) and libpng write to stderr while decoding
DECODER_MESSAGE_PREFIXES = ("Corrupt JPEG data", "Premature end of JPEG file", "Invalid SOS parameters",
                            "Inconsistent progression sequence", "Warning: unknown JFIF revision",
                            "Warning: thumbnail image size", "libpng warning", "libpng error")


def is_compressed(msg) -> bool:
    """True for a CompressedImage-like message (has ``format``, no ``encoding``)."""
    return hasattr(msg, "format") and not hasattr(msg, "encoding")


def check_image(msg) -> None:
    """Cheap validity checks without decoding; raises ImageConversionError."""
    if is_compressed(msg):
        kind = _compressed_kind(msg.format)
        if len(msg.data) == 0:
            raise ImageConversionError("compressed image has no data")
        _check_framing(kind, msg.data)
        return
    encoding = RawEncoding.parse(msg.encoding)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if not (0 < height <= MAX_IMAGE_SIDE and 0 < width <= MAX_IMAGE_SIDE):
        raise ImageConversionError(f"image size {width}x{height} out of range (1..{MAX_IMAGE_SIDE})")
    row_bytes = width * encoding.channels * encoding.depth
    if step < row_bytes:
        raise ImageConversionError(f"step {step} < width*channels*depth = {row_bytes} for {encoding.label}")
    if len(msg.data) < step * height:
        raise ImageConversionError(
            f"image data has {len(msg.data)} bytes, expected step*height = {step * height}")


def to_rgb(msg, decoder_messages: list[str] | None = None) -> np.ndarray:
    """Convert an Image or CompressedImage message to an HxWx3 uint8 RGB array. The decoder's warning lines
    (corrupt JPEG data) are appended to ``decoder_messages`` when given, never written to stderr."""
    check_image(msg)
    if is_compressed(msg):
        return _decode_compressed(msg, decoder_messages)
    return _convert_raw(msg)


def _compressed_kind(fmt: str) -> str:
    # image_transport writes e.g. "jpeg", "rgb8; jpeg compressed bgr8", "png"
    lowered = fmt.lower()
    for kind in COMPRESSED_FORMATS:
        if kind in lowered:
            return kind
    raise ImageConversionError(f"unsupported compressed format {fmt!r}; supported: jpeg, png")


def _check_framing(kind: str, data) -> None:
    """The start and end markers of a compressed image (O(1): a few bytes at each end)."""
    size = len(data)
    head, tail = bytes(data[:8]), bytes(data[max(0, size - max(JPEG_EOI_SEARCH, PNG_IEND_SEARCH)):])
    if kind == "png":
        if not head.startswith(PNG_SIGNATURE) or PNG_IEND not in tail[-PNG_IEND_SEARCH:]:
            raise ImageConversionError(f"png data ({size} bytes) lacks its signature or IEND chunk: truncated "
                                       "or not png")
        return
    if not head.startswith(JPEG_SOI) or JPEG_EOI not in tail[-JPEG_EOI_SEARCH:]:
        raise ImageConversionError(f"jpeg data ({size} bytes) lacks its start (SOI) or end (EOI) marker: "
                                   "truncated or not jpeg")


def _decode_compressed(msg, decoder_messages: list[str] | None) -> np.ndarray:
    buffer = np.frombuffer(msg.data, dtype=np.uint8)
    with capture_stderr(DECODER_MESSAGE_PREFIXES) as lines:
        decoded = cv2.imdecode(buffer, cv2.IMREAD_COLOR)   # HxWx3 BGR, None when corrupt
    if decoder_messages is not None:
        decoder_messages.extend(lines)
    if decoded is None or decoded.size == 0:
        reason = f": {lines[-1]}" if lines else ""
        raise ImageConversionError(f"cannot decode {_compressed_kind(msg.format)} data ({buffer.size} bytes){reason}")
    return cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)


def _convert_raw(msg) -> np.ndarray:
    encoding = RawEncoding.parse(msg.encoding)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    dtype = np.dtype(np.uint16) if encoding.depth == 2 else np.dtype(np.uint8)
    if encoding.depth == 2:
        dtype = dtype.newbyteorder(">" if int(msg.is_bigendian) else "<")
    rows = np.frombuffer(msg.data, dtype=np.uint8, count=step * height).reshape(height, step)
    pixels = rows[:, : width * encoding.channels * encoding.depth]
    # pixels: (H, W*C*depth) bytes -> (H, W, C) of dtype
    image = np.ascontiguousarray(pixels).view(dtype).reshape(height, width, encoding.channels)
    if encoding is RawEncoding.RGB8:
        return image
    if encoding is RawEncoding.BGR8:
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    if encoding is RawEncoding.RGBA8:
        return cv2.cvtColor(image, cv2.COLOR_RGBA2RGB)
    if encoding is RawEncoding.BGRA8:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2RGB)
    if encoding is RawEncoding.MONO16:
        image = (image.astype(np.uint32) >> 8).astype(np.uint8)   # keep the 8 most significant bits
    return cv2.cvtColor(image[:, :, 0], cv2.COLOR_GRAY2RGB)


def rgb_to_image_fields(rgb: np.ndarray, encoding: str = "rgb8") -> dict:
    """Fields of a sensor_msgs/Image holding ``rgb`` (HxWx3 uint8) in ``encoding`` (rgb8 or bgr8).

    Used by the demo and the tests to build messages; returns a dict so callers fill their own type.
    """
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected HxWx3 uint8, got {rgb.dtype} {rgb.shape}")
    if encoding == "bgr8":
        rgb = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    elif encoding != "rgb8":
        raise ValueError(f"rgb_to_image_fields supports rgb8 and bgr8, got {encoding!r}")
    height, width = rgb.shape[:2]
    return {"height": height, "width": width, "encoding": encoding, "is_bigendian": 0,
            "step": width * 3, "data": np.ascontiguousarray(rgb).tobytes()}


__all__ = ["ImageConversionError", "RawEncoding", "check_image", "is_compressed", "rgb_to_image_fields",
           "to_rgb", "MAX_IMAGE_SIDE"]
