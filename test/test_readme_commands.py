"""The README's commands are the ones that work: quick start, CI entry point, and the pip route."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from checked_run import run_checked

REPO_ROOT = Path(__file__).resolve().parents[1]
README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
COMMAND_TIMEOUT_S = 600


def quick_start_commands() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def test_quick_start_has_exactly_the_two_commands():
    assert quick_start_commands() == ["tools/run_demo.sh", "tools/run_tests.sh"]
    for command in quick_start_commands():
        assert os.access(REPO_ROOT / command, os.X_OK), f"{command} is not executable"


def test_ci_runs_the_readme_test_command():
    ci_script = (REPO_ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec tools/run_tests\.sh\b", ci_script, re.M), ci_script


@pytest.mark.ros
def test_readme_demo_command_runs_the_node(tmp_path):
    """`tools/run_demo.sh` bootstraps (a no-op here) and runs the node on the embedded default."""
    env = dict(os.environ)
    result = run_checked(["tools/run_demo.sh", "--duration", "2", "--quiet", "--workdir", str(tmp_path)],
                         cwd=REPO_ROOT, env=env, timeout=COMMAND_TIMEOUT_S)
    match = re.search(r"^(\d+) chunks \(sequence 0\.\.(\d+)\)$", result.stdout, re.M)
    assert match and int(match.group(1)) >= 1, result.stdout
    assert "staleness" in result.stdout and "node state: finalized" in result.stdout


def test_readme_core_snippet_predicts_a_chunk(tmp_path):
    """The "Without ROS" snippet runs as written (against the source tree) and prints the chunk's shape."""
    section = README.split("## Without ROS: the core alone", 1)[1].split("\n## ", 1)[0]
    snippets = [line.strip() for line in section.splitlines() if line.strip().startswith("python -c ")]
    assert len(snippets) == 1, snippets
    code = snippets[0][len("python -c "):].strip('"')
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = run_checked([sys.executable, "-c", code], cwd=tmp_path, env=env, timeout=COMMAND_TIMEOUT_S)
    assert re.fullmatch(r"\(\d+, \d+\)", out.stdout.strip()), out.stdout


def test_pip_route_installs_core_kernels_and_node_code(tmp_path):
    """`pip install .` (here without dependencies, into a folder) gives importable flashrt_core,
    flashrt_kernels (from kernels/flashrt_kernels/) and flashrt_ros, with no ROS on the path, and the flashrt-*
    commands."""
    target = tmp_path / "site"
    run_checked([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                 "--target", str(target), str(REPO_ROOT)], timeout=COMMAND_TIMEOUT_S, cwd=tmp_path)
    for package in ("flashrt_core", "flashrt_kernels", "flashrt_ros"):
        assert (target / package / "__init__.py").is_file(), f"{package} not installed"
    # the CUDA C++ sources and their shared headers travel with the kernels, which build them with nvcc on first use
    for source in ("streamed_gemm_chain.cu", "handover_chain.cu", "chain_handover.cuh"):
        assert (target / "flashrt_kernels" / "cuda" / source).is_file(), source
    probe = ("import flashrt_core, flashrt_kernels, sys; "
             "print(flashrt_core.__file__); print(flashrt_kernels.__file__); "
             "print(any(name.startswith('rclpy') for name in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    out = run_checked([sys.executable, "-c", probe], env=env, cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(target)) and out[1].startswith(str(target)), out
    assert out[2] == "False", "importing flashrt_core pulled in rclpy"
    # the console scripts run the tools, and the demo's parameter file is where flashrt-demo looks for it
    assert (target / "share" / "flashrt_ros" / "config" / "demo_two_cameras.yaml").is_file()
    usage = run_checked([str(target / "bin" / "flashrt-demo-bag"), "--help"], env=env, cwd=tmp_path).stdout
    assert usage.startswith("usage:") and "--joints" in usage, usage
