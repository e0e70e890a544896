"""Generate a demo rosbag2 (sqlite3 or MCAP) of a synthetic robot scene, made by script rather than committed.

What the bag holds (topic names are those the policy node subscribes to by default):

- ``/camera/base/image_raw``: sensor_msgs/Image rgb8 640x480 at ~30 Hz, a top-down view of a table with
  moving coloured shapes.
- ``/camera/wrist/image_raw/compressed``: sensor_msgs/CompressedImage jpeg 640x480 at ~30 Hz, a zoomed view
  that follows the gripper; its frames are captured a few ms after the base camera's and jitter independently.
- ``/instruction``: std_msgs/String, published once at the start (transient-local, like a latched topic).
- ``/joint_states``: sensor_msgs/JointState at ~100 Hz, 7 arm joints and a gripper (``joint_count``).

Header stamps are capture times (with jitter); the bag's receive timestamps are capture + transport latency,
as a recorder on the robot would see them. Faults (``--faults``) that a policy node must survive:

- the wrist camera drops out for a while (no frames at all),
- out-of-order delivery: some base-camera frames arrive late, just after the next frame, so their stamp is older
  than the previous frame's (their stamps stay true capture times: none lies in the future),
- a corrupt JPEG frame (a truncated transfer that no decoder can read).

What was generated, including the exact faults, is written as JSON into the bag's ``custom_data`` under
:data:`MANIFEST_KEY`, so tests know the expected counts without re-deriving them.

    python -m flashrt_ros.demo_bag OUT_DIR [--storage mcap] [--faults] [--duration 4] [--joints 8]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml
from rosbags.rosbag2 import StoragePlugin, Writer

from flashrt_ros.bag_common import BagError, bag_qos, bag_typestore

LOGGER = logging.getLogger(__name__)

BASE_CAMERA_TOPIC = "/camera/base/image_raw"
WRIST_CAMERA_TOPIC = "/camera/wrist/image_raw/compressed"
INSTRUCTION_TOPIC = "/instruction"
JOINT_STATE_TOPIC = "/joint_states"
MANIFEST_KEY = "flashrt_ros.demo_bag"
# compressed_image_transport's format string for a JPEG made from an rgb8 image.
JPEG_FORMAT = "rgb8; jpeg compressed bgr8"
CORRUPT_JPEG_BYTES = 300  # a JPEG truncated inside its header: undecodable


@dataclass(frozen=True)
class DemoBagConfig:
    """What to generate. Times are seconds from the bag start unless named otherwise."""

    duration_s: float = 4.0
    width: int = 640
    height: int = 480
    camera_hz: float = 30.0
    joint_state_hz: float = 100.0
    joint_count: int = 8  # 7 arm joints + a gripper; a model's state_dim may need more
    wrist_phase_s: float = 0.007  # wrist camera captures this long after the base camera
    stamp_jitter_s: float = 0.002  # std of the capture-time jitter of each camera frame
    raw_latency_s: tuple[float, float] = (0.002, 0.005)  # uniform transport latency, raw images / joint states
    jpeg_latency_s: tuple[float, float] = (0.006, 0.011)  # wrist: JPEG encoding + transport
    start_time_ns: int = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z: a realistic epoch stamp
    instruction: str = "pick up the red ball and put it in the blue box"
    jpeg_quality: int = 90
    seed: int = 0
    # Faults (used when ``faults`` is True).
    faults: bool = False
    dropout_s: tuple[float, float] = (1.5, 2.1)  # wrist camera publishes nothing in [start, end)
    out_of_order_frames: tuple[int, ...] = (20, 50)  # base frame k arrives after frame k+1
    corrupt_frames: tuple[int, ...] = (40,)  # wrist frame indices replaced by a truncated JPEG

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.width < 16 or self.height < 16:
            raise ValueError(f"image size must be at least 16x16, got {self.width}x{self.height}")
        if self.camera_hz <= 0 or self.joint_state_hz <= 0:
            raise ValueError(f"rates must be > 0, got camera {self.camera_hz}, joints {self.joint_state_hz}")
        if self.joint_count < 1:
            raise ValueError(f"joint_count must be >= 1, got {self.joint_count}")
        if not self.instruction.strip():
            raise ValueError("instruction must be a non-empty string")

    @property
    def joint_names(self) -> tuple[str, ...]:
        return tuple(f"joint_{i}" for i in range(1, self.joint_count)) + ("gripper",)

    @property
    def frames_per_camera(self) -> int:
        return int(math.floor(self.duration_s * self.camera_hz))


PRESETS: dict[str, DemoBagConfig] = {
    "default": DemoBagConfig(),
    "faults": DemoBagConfig(faults=True),
}


@dataclass
class _Message:
    topic: str
    log_time_ns: int
    data: bytes


@dataclass
class Manifest:
    """What a demo bag holds; stored as JSON in the bag's custom_data."""

    config: dict[str, Any]
    counts: dict[str, int] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- scene
def _table_background(width: int, height: int) -> np.ndarray:
    """A wooden-table gradient, (H, W, 3) uint8 RGB."""
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    shade = 0.75 + 0.25 * (0.6 * ys + 0.4 * xs)  # (H, W)
    base = np.array([176, 132, 92], dtype=np.float32)  # wood, RGB
    return np.clip(shade[..., None] * base, 0, 255).astype(np.uint8)


def _scene_objects(t: float) -> dict[str, tuple[float, float]]:
    """Object positions at time t in table coordinates (unit square)."""
    return {
        "ball": (0.5 + 0.3 * math.sin(1.3 * t), 0.5 + 0.25 * math.sin(2.1 * t + 0.5)),
        "box": (0.78, 0.28),
        "triangle": (0.25 + 0.05 * math.cos(0.7 * t), 0.72),
        "gripper": (0.5 + 0.28 * math.sin(1.3 * t - 0.4), 0.5 + 0.22 * math.sin(2.1 * t + 0.1)),
    }


def render_view(t: float, width: int, height: int, center: tuple[float, float], zoom: float,
                background: np.ndarray) -> np.ndarray:
    """Render the table scene at time t through a camera looking at ``center`` with ``zoom``: (H, W, 3) uint8 RGB."""
    img = background.copy()
    scale = min(width, height) * zoom

    def to_px(p: tuple[float, float]) -> tuple[int, int]:
        return (int(round(width / 2 + (p[0] - center[0]) * scale)),
                int(round(height / 2 + (p[1] - center[1]) * scale)))

    objects = _scene_objects(t)
    bx, by = to_px(objects["box"])
    half = int(0.08 * scale)
    cv2.rectangle(img, (bx - half, by - half), (bx + half, by + half), (40, 70, 200), thickness=-1)
    tx, ty = to_px(objects["triangle"])
    angle = 0.9 * t
    pts = np.array([[tx + 0.07 * scale * math.cos(angle + k * 2.094),
                     ty + 0.07 * scale * math.sin(angle + k * 2.094)] for k in range(3)], dtype=np.int32)
    cv2.fillPoly(img, [pts], (40, 170, 60))
    cv2.circle(img, to_px(objects["ball"]), int(0.045 * scale), (210, 30, 30), thickness=-1)
    gx, gy = to_px(objects["gripper"])
    cv2.line(img, (gx - int(0.03 * scale), gy), (gx + int(0.03 * scale), gy), (30, 30, 30), 3)
    return img


# ------------------------------------------------------------------------------------------ messages
def _stamp(store: Any, t_ns: int) -> Any:
    return store.types["builtin_interfaces/msg/Time"](sec=t_ns // 10**9, nanosec=t_ns % 10**9)


def _header(store: Any, t_ns: int, frame_id: str) -> Any:
    return store.types["std_msgs/msg/Header"](stamp=_stamp(store, t_ns), frame_id=frame_id)


def _camera_stamps(cfg: DemoBagConfig, rng: np.random.Generator, phase_s: float) -> np.ndarray:
    """Capture times [s from start] of one camera: nominal period + phase + gaussian jitter, (N,) float64."""
    n = cfg.frames_per_camera
    nominal = np.arange(n) / cfg.camera_hz + phase_s
    jitter = np.clip(rng.normal(0.0, cfg.stamp_jitter_s, n), -0.4 / cfg.camera_hz, 0.4 / cfg.camera_hz)
    return np.maximum(nominal + jitter, 0.0)


def build_messages(cfg: DemoBagConfig) -> tuple[list[_Message], Manifest]:
    """All messages of the demo bag (CDR-serialized, sorted by receive time) and the manifest."""
    store = bag_typestore()
    rng = np.random.default_rng(cfg.seed)
    t0 = cfg.start_time_ns
    msgs: list[_Message] = []
    manifest = Manifest(config=asdict(cfg))
    background = _table_background(cfg.width, cfg.height)
    image_type, compressed_type = store.types["sensor_msgs/msg/Image"], store.types["sensor_msgs/msg/CompressedImage"]

    def log_time(capture_s: float, latency: tuple[float, float]) -> int:
        return t0 + int(round((capture_s + rng.uniform(*latency)) * 1e9))

    # Base camera: raw rgb8 Image.
    base_stamps = _camera_stamps(cfg, rng, phase_s=0.0)
    base_log_ns = [log_time(capture, cfg.raw_latency_s) for capture in base_stamps]
    out_of_order = []      # positions, in arrival order, of the frames whose stamp is older than the previous one's
    if cfg.faults:
        for k in cfg.out_of_order_frames:
            if k + 1 < len(base_stamps):
                base_log_ns[k] = base_log_ns[k + 1] + 1_000     # frame k is delivered late, 1 us after frame k+1
                out_of_order.append(k + 1)
    for k, capture in enumerate(base_stamps):
        rgb = render_view(capture, cfg.width, cfg.height, center=(0.5, 0.5), zoom=1.0, background=background)
        msg = image_type(header=_header(store, t0 + int(round(capture * 1e9)), "base_camera"),
                         height=cfg.height, width=cfg.width, encoding="rgb8", is_bigendian=0,
                         step=cfg.width * 3, data=rgb.reshape(-1))
        msgs.append(_Message(BASE_CAMERA_TOPIC, base_log_ns[k],
                             bytes(store.serialize_cdr(msg, image_type.__msgtype__))))

    # Wrist camera: JPEG CompressedImage, following the gripper, with dropout and corrupt frames.
    wrist_stamps = _camera_stamps(cfg, rng, phase_s=cfg.wrist_phase_s)
    dropped, corrupt = 0, []
    for k, capture in enumerate(wrist_stamps):
        if cfg.faults and cfg.dropout_s[0] <= capture < cfg.dropout_s[1]:
            dropped += 1
            continue
        gripper = _scene_objects(capture)["gripper"]
        rgb = render_view(capture, cfg.width, cfg.height, center=gripper, zoom=2.5, background=background)
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                                [int(cv2.IMWRITE_JPEG_QUALITY), cfg.jpeg_quality])
        if not ok:
            raise RuntimeError(f"JPEG encoding of wrist frame {k} failed")
        payload = jpeg.reshape(-1)
        if cfg.faults and k in cfg.corrupt_frames:
            payload = payload[:CORRUPT_JPEG_BYTES]
            corrupt.append(k)
        msg = compressed_type(header=_header(store, t0 + int(round(capture * 1e9)), "wrist_camera"),
                              format=JPEG_FORMAT, data=payload)
        msgs.append(_Message(WRIST_CAMERA_TOPIC, log_time(capture, cfg.jpeg_latency_s),
                             bytes(store.serialize_cdr(msg, compressed_type.__msgtype__))))

    # Instruction, once at the start.
    string_type = store.types["std_msgs/msg/String"]
    msgs.append(_Message(INSTRUCTION_TOPIC, t0, bytes(store.serialize_cdr(string_type(data=cfg.instruction),
                                                                          string_type.__msgtype__))))

    # Joint states at ~100 Hz: smooth sinusoids.
    joint_type = store.types["sensor_msgs/msg/JointState"]
    n_joints = int(math.floor(cfg.duration_s * cfg.joint_state_hz))
    phases = np.linspace(0.0, math.pi, cfg.joint_count)
    for k in range(n_joints):
        capture = k / cfg.joint_state_hz + rng.normal(0.0, 0.0005)
        capture = max(capture, 0.0)
        position = 0.4 * np.sin(0.8 * capture + phases)  # (joint_count,)
        position[-1] = 0.04 * (1.0 + math.sin(0.5 * capture))  # gripper opening [m]
        velocity = 0.32 * np.cos(0.8 * capture + phases)
        msg = joint_type(header=_header(store, t0 + int(round(capture * 1e9)), "base_link"),
                         name=list(cfg.joint_names), position=position.astype(np.float64),
                         velocity=velocity.astype(np.float64), effort=np.zeros(0, dtype=np.float64))
        msgs.append(_Message(JOINT_STATE_TOPIC, log_time(capture, cfg.raw_latency_s),
                             bytes(store.serialize_cdr(msg, joint_type.__msgtype__))))

    msgs.sort(key=lambda m: m.log_time_ns)
    for m in msgs:
        manifest.counts[m.topic] = manifest.counts.get(m.topic, 0) + 1
    if cfg.faults:
        manifest.faults = {
            "dropout": {"topic": WRIST_CAMERA_TOPIC, "start_s": cfg.dropout_s[0], "end_s": cfg.dropout_s[1],
                        "frames_dropped": dropped},
            "out_of_order_stamps": {"topic": BASE_CAMERA_TOPIC, "frames": out_of_order, "count": len(out_of_order)},
            "corrupt_frames": {"topic": WRIST_CAMERA_TOPIC, "frames": corrupt, "count": len(corrupt)},
        }
    return msgs, manifest


TOPIC_TYPES = {
    BASE_CAMERA_TOPIC: "sensor_msgs/msg/Image",
    WRIST_CAMERA_TOPIC: "sensor_msgs/msg/CompressedImage",
    INSTRUCTION_TOPIC: "std_msgs/msg/String",
    JOINT_STATE_TOPIC: "sensor_msgs/msg/JointState",
}


def write_demo_bag(out_dir: str | Path, cfg: DemoBagConfig = DemoBagConfig(), storage: str = "sqlite3") -> Manifest:
    """Write the demo bag to ``out_dir`` (must not exist) and return its manifest."""
    plugins = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}
    if storage not in plugins:
        raise BagError(f"storage must be one of {sorted(plugins)}, got {storage!r}")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise BagError(f"{out_dir} exists already; the demo bag is written to a new directory")
    msgs, manifest = build_messages(cfg)
    store = bag_typestore()
    # Offered QoS as drivers on a robot offer them: reliable, instruction latched (transient-local, depth 1).
    qos = {topic: [bag_qos(reliable=True, transient_local=topic == INSTRUCTION_TOPIC,
                           depth=1 if topic == INSTRUCTION_TOPIC else 10)] for topic in TOPIC_TYPES}
    with Writer(out_dir, version=Writer.VERSION_LATEST, storage_plugin=plugins[storage]) as writer:
        connections = {topic: writer.add_connection(topic, msgtype, typestore=store, offered_qos_profiles=qos[topic])
                       for topic, msgtype in TOPIC_TYPES.items()}
        writer.set_custom_data(MANIFEST_KEY, json.dumps(asdict(manifest)))
        for m in msgs:
            writer.write(connections[m.topic], m.log_time_ns, m.data)
    LOGGER.info("wrote demo bag %s (%s, %d messages, faults=%s)", out_dir, storage, len(msgs), cfg.faults)
    return manifest


def read_manifest(bag_dir: str | Path) -> Manifest:
    """The manifest a demo bag carries in its custom_data; raises :class:`BagError` if it has none."""
    metadata_file = Path(bag_dir) / "metadata.yaml"
    if not metadata_file.is_file():
        raise BagError(f"{bag_dir} is not a rosbag2 directory (no metadata.yaml)")
    info = yaml.safe_load(metadata_file.read_text()).get("rosbag2_bagfile_information", {})
    custom = info.get("custom_data") or {}
    if MANIFEST_KEY not in custom:
        raise BagError(f"{bag_dir} is not a flashrt_ros demo bag (no {MANIFEST_KEY!r} in custom_data)")
    return Manifest(**json.loads(custom[MANIFEST_KEY]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt_ros.demo_bag", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", help="bag directory to create (must not exist)")
    parser.add_argument("--storage", choices=("sqlite3", "mcap"), default="sqlite3")
    parser.add_argument("--faults", action="store_true",
                        help="inject a wrist-camera dropout, out-of-order base stamps and a corrupt JPEG")
    parser.add_argument("--duration", type=float, default=DemoBagConfig.duration_s, help="seconds of scene")
    parser.add_argument("--joints", type=int, default=DemoBagConfig.joint_count,
                        help="joints in /joint_states (the embedded demo model's state has 32)")
    parser.add_argument("--seed", type=int, default=DemoBagConfig.seed)
    parser.add_argument("--instruction", default=DemoBagConfig.instruction)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = replace(PRESETS["faults" if args.faults else "default"], duration_s=args.duration, seed=args.seed,
                  joint_count=args.joints, instruction=args.instruction)
    manifest = write_demo_bag(args.out_dir, cfg, storage=args.storage)
    print(json.dumps({"bag": str(args.out_dir), "counts": manifest.counts, "faults": manifest.faults}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
