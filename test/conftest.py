"""Test-session set-up shared by every test directory.

- DDS is confined to loopback before anything can import rclpy: LOCALHOST discovery, a random domain id for
  this run, ROS_HOME and logs inside test_output/, and a loopback-only Fast DDS profile
  (flashrt_ros.loopback_dds). Child processes started by tests inherit the same environment.
- ``gpu`` marked tests skip cleanly where CUDA is absent (CI has no GPU).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_OUTPUT = REPO_ROOT / "test_output"

# Import roots of the suite: the checkout's packages (flashrt_core, flashrt_ros), its kernels package
# (kernels/flashrt_kernels) and the test helpers, imported by module name (`from node_harness import ...`). None of
# these folders holds a top-level name that an installed package also uses (test_import_roots.py checks it): the
# repository root has no `kernels` or `test` package that could hide the third-party or standard-library one.
IMPORT_ROOTS = [REPO_ROOT, REPO_ROOT / "kernels", REPO_ROOT / "test", REPO_ROOT / "test" / "core",
                REPO_ROOT / "test" / "ros"]
for _root in reversed(IMPORT_ROOTS):
    if str(_root) not in sys.path:
        sys.path.insert(0, str(_root))

from flashrt_ros.loopback_dds import apply_loopback_dds  # noqa: E402  (needs REPO_ROOT on sys.path)

DDS_ENVIRONMENT = apply_loopback_dds(TEST_OUTPUT / f"dds_{os.getpid()}")
# Two cores are shared by the test process and the DDS processes it starts: one math thread each keeps
# them from oversubscribing (2-3x faster under load). Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The embedded demo checkpoint is generated once per test run into the tree, not into ~/.cache.
os.environ.setdefault("FLASHRT_CACHE_DIR", str(TEST_OUTPUT / "flashrt_cache"))


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"DDS: domain {DDS_ENVIRONMENT['ROS_DOMAIN_ID']}, discovery "
        f"{DDS_ENVIRONMENT['ROS_AUTOMATIC_DISCOVERY_RANGE']}, profile {DDS_ENVIRONMENT['FASTDDS_DEFAULT_PROFILES_FILE']}"
    )


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:   # the marker, not the test/gpu directory name
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def dds_environment() -> dict[str, str]:
    """The loopback DDS environment of this test run (also set in os.environ)."""
    return dict(DDS_ENVIRONMENT)
