"""Confine ROS 2 / Fast DDS to this machine: loopback-only discovery and transports.

Tests, CI and the demo must never let Fast DDS discover over multicast on every interface (its default).
Before rclpy starts, :func:`apply_loopback_dds` sets:

- ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``
- ``ROS_DOMAIN_ID``: random in 1..100 (unless already set by the caller), so parallel runs do not cross
- ``ROS_HOME``: a folder inside ``workdir`` (logs stay in the tree, not in ~/.ros)
- ``FASTDDS_DEFAULT_PROFILES_FILE``: a profile with a 32 MB shared-memory transport and a UDPv4 transport
  whitelisted to 127.0.0.1, builtin transports off.

On a robot, users choose their own discovery settings: the node never calls this itself.
This module imports nothing from ROS, so it can run before rclpy is imported.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

SHARED_MEMORY_SEGMENT_BYTES = 32 * 1024 * 1024

FASTDDS_LOOPBACK_PROFILE = """<?xml version="1.0" encoding="UTF-8" ?>
<!-- Written by flashrt_ros.loopback_dds: loopback-only Fast DDS for tests and demos. -->
<dds xmlns="http://www.eprosima.com">
  <profiles>
    <transport_descriptors>
      <transport_descriptor>
        <transport_id>flashrt_shm</transport_id>
        <type>SHM</type>
        <segment_size>{segment_bytes}</segment_size>
      </transport_descriptor>
      <transport_descriptor>
        <transport_id>flashrt_udp_loopback</transport_id>
        <type>UDPv4</type>
        <interfaceWhiteList>
          <address>127.0.0.1</address>
        </interfaceWhiteList>
      </transport_descriptor>
    </transport_descriptors>
    <participant profile_name="flashrt_loopback_participant" is_default_profile="true">
      <rtps>
        <userTransports>
          <transport_id>flashrt_shm</transport_id>
          <transport_id>flashrt_udp_loopback</transport_id>
        </userTransports>
        <useBuiltinTransports>false</useBuiltinTransports>
      </rtps>
    </participant>
  </profiles>
</dds>
"""


def write_loopback_profile(path: Path) -> Path:
    """Write the loopback-only Fast DDS profile XML to ``path`` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FASTDDS_LOOPBACK_PROFILE.format(segment_bytes=SHARED_MEMORY_SEGMENT_BYTES))
    return path


def loopback_dds_environment(workdir: str | os.PathLike, domain_id: int | None = None) -> dict[str, str]:
    """Environment variables that confine DDS to loopback; files are written under ``workdir``.

    ``domain_id`` None keeps an already set ``ROS_DOMAIN_ID`` from the environment, else draws one in 1..100.
    """
    root = Path(workdir).resolve()
    ros_home = root / "ros_home"
    ros_home.mkdir(parents=True, exist_ok=True)
    profile = write_loopback_profile(root / "fastdds_loopback.xml")
    if domain_id is None:
        existing = os.environ.get("ROS_DOMAIN_ID", "")
        domain_id = int(existing) if existing.isdigit() else random.SystemRandom().randint(1, 100)
    if not 0 <= domain_id <= 232:
        raise ValueError(f"ROS_DOMAIN_ID must be in 0..232, got {domain_id}")
    return {
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        "ROS_DOMAIN_ID": str(domain_id),
        "ROS_HOME": str(ros_home),
        "ROS_LOG_DIR": str(ros_home / "log"),
        "FASTDDS_DEFAULT_PROFILES_FILE": str(profile),
        "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp",
    }


def apply_loopback_dds(workdir: str | os.PathLike, domain_id: int | None = None) -> dict[str, str]:
    """Set :func:`loopback_dds_environment` in ``os.environ`` (call before ``rclpy.init``); returns it."""
    env = loopback_dds_environment(workdir, domain_id)
    os.environ.update(env)
    return env
