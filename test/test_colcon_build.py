"""`colcon build` of this package in a workspace works with the ROS 2 wheels of the venv (no ROS install):
messages generated, Python packages, executables, launch and config installed, and the installed tree imports."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from checked_run import run_checked

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 900


@pytest.mark.skipif(shutil.which("colcon", path=str(Path(sys.executable).parent)) is None,
                    reason="colcon is not installed next to this Python (run tools/bootstrap.sh)")
def test_colcon_build_installs_a_working_package(tmp_path):
    # a workspace with this package's working tree in src/ (as a user clones it; the venv stays outside)
    source = tmp_path / "src" / "flashrt_ros"
    files = run_checked(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT).stdout.split("\0")
    for name in filter(None, files):
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    venv = Path(sys.prefix)
    env = dict(os.environ, AMENT_PREFIX_PATH=str(venv), CMAKE_PREFIX_PATH=str(venv))
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    run_checked(["colcon", "--log-base", str(tmp_path / "log"), "build", "--base-paths", str(tmp_path / "src"),
                 "--build-base", str(tmp_path / "build"), "--install-base", str(tmp_path / "install"),
                 "--cmake-args", f"-DPython3_EXECUTABLE={sys.executable}", "-DBUILD_TESTING=OFF"], cwd=tmp_path, env=env, timeout=BUILD_TIMEOUT_S)
    install = tmp_path / "install" / "flashrt_ros"
    for executable in ("policy_node", "bag_player", "bag_recorder", "bag_evaluator", "bag_regression", "demo"):
        assert os.access(install / "lib" / "flashrt_ros" / executable, os.X_OK), executable
    assert (install / "share" / "flashrt_ros" / "launch" / "policy_node.launch.py").is_file()
    assert sorted(p.name for p in (install / "share" / "flashrt_ros" / "config").glob("*.yaml"))
    site = next(install.glob("lib/python3*/site-packages"))
    probe = ("import flashrt_ros, flashrt_ros.msg, flashrt_ros.policy_node, flashrt_core, flashrt_kernels; "
             "from flashrt_ros.msg import ActionChunk; m = ActionChunk(); m.horizon = 3; "
             "print(flashrt_ros.policy_node.__file__)")
    out = run_checked([sys.executable, "-c", probe], cwd=tmp_path, env=dict(env, PYTHONPATH=str(site))).stdout
    assert out.strip().startswith(str(site)), out
