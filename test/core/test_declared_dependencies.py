"""Every library the package imports is declared where an install gets it (setup.py's requirements and extras,
package.xml for ROS), and the pi family loads and predicts (camera-size frames resized on the host) without any
optional one, Pillow included (a ROS install may lack it); GR00T names what installs transformers or Pillow when
either is missing."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from checked_run import failure_report

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("flashrt_core", "kernels/flashrt_kernels", "flashrt_ros", "launch")
FIRST_PARTY = {"flashrt_core", "flashrt_ros", "flashrt_kernels", "__future__"}

# top-level module -> the requirement of setup.py (install_requires or an extra) that installs it
REQUIREMENT_OF = {
    "numpy": "numpy", "torch": "torch", "safetensors": "safetensors", "sentencepiece": "sentencepiece",
    "yaml": "pyyaml", "cv2": "opencv-python-headless", "tokenizers": "tokenizers",
    "transformers": "transformers", "PIL": "pillow", "huggingface_hub": "huggingface_hub",
    "tensorstore": "tensorstore", "rosbags": "rosbags", "matplotlib": "matplotlib",
    "ml_dtypes": "tensorstore",      # tensorstore's own dependency, imported only beside it (Orbax checkpoints)
    "triton": "torch",               # torch's CUDA wheels install it; the CPU paths never import it
}
# the ROS packages that the sources import, each a depend / exec_depend of package.xml
ROS_MODULES = {"rclpy", "rcl_interfaces", "ament_index_python", "builtin_interfaces", "std_msgs", "sensor_msgs",
               "lifecycle_msgs", "diagnostic_msgs", "trajectory_msgs", "rosgraph_msgs", "launch", "launch_ros"}
# what the pi family must load without: every optional library (GR00T's, the hub's, Orbax's, the bags', plots')
OPTIONAL_MODULES = ("transformers", "PIL", "huggingface_hub", "tensorstore", "ml_dtypes", "rosbags", "matplotlib",
                    "triton")


def third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} over SOURCES, the standard library and first-party left out."""
    found: dict[str, set[str]] = {}
    for root in SOURCES:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def declared_requirements() -> dict[str, set[str]]:
    """{"install_requires" | extra name: requirement names} from setup.py's setup() call."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    keywords = {k.arg: k.value for k in call.keywords}

    def names(specs) -> set[str]:
        return {re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower() for spec in specs}
    out = {"install_requires": names(ast.literal_eval(keywords["install_requires"]))}
    out.update({extra: names(specs) for extra, specs in ast.literal_eval(keywords["extras_require"]).items()})
    return out


def test_every_imported_library_is_declared():
    imports = third_party_imports()
    unknown = {m: sorted(files) for m, files in imports.items() if m not in REQUIREMENT_OF and m not in ROS_MODULES}
    assert not unknown, (f"imported but not in this test's tables (declare it in setup.py or package.xml, then "
                         f"here): {unknown}")
    runtime = {extra: names for extra, names in declared_requirements().items() if extra != "test"}
    declared = set().union(*runtime.values())
    undeclared = {m: REQUIREMENT_OF[m] for m in imports if m in REQUIREMENT_OF and REQUIREMENT_OF[m] not in declared}
    assert not undeclared, f"imported, but no requirement of setup.py (its test extra aside) installs: {undeclared}"
    package_xml = (REPO_ROOT / "package.xml").read_text()
    ros_declared = set(re.findall(r"<(?:depend|exec_depend)>(\w+)</", package_xml))
    missing = sorted(m for m in imports if m in ROS_MODULES and m not in ros_declared)
    assert not missing, f"ROS packages imported but not declared in package.xml: {missing}"


def test_transformers_is_gr00ts_extra_alone():
    """transformers (GR00T's SigLIP2 / Qwen3 modules) is the "groot" extra, not a core requirement; Pillow, which
    the pi family's host resize uses too, is one."""
    declared = declared_requirements()
    assert "transformers" in declared["groot"] and "transformers" not in declared["install_requires"]
    assert "pillow" in declared["install_requires"]


def run_blocked(code: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    """`code` in a fresh Python where the `blocked` modules cannot be imported (None in sys.modules), as on a
    machine where `pip install .` installed the core requirements alone."""
    prologue = f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-c", prologue + code], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_pi_checkpoint_loads_and_predicts_without_the_optional_libraries(tmp_path):
    from flashrt_core.fixtures import write_random_checkpoint
    ckpt = write_random_checkpoint(tmp_path / "pi05", "pi05_tiny")
    code = ("import numpy as np\n"
            "from flashrt_core import load_model\n"
            f"p = load_model({str(ckpt)!r}, device='cpu')\n"
            "rng = np.random.default_rng(0)\n"
            "views = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in p.config.view_names]\n"
            "print('actions', p.predict(views, 'pick up the cube', state=np.zeros(p.state_dim)).shape)\n")
    done = run_blocked(code, OPTIONAL_MODULES)
    assert done.returncode == 0, failure_report(done)
    assert "actions (" in done.stdout


@pytest.mark.parametrize("missing", ["transformers", "PIL"])
def test_gr00t_without_its_extra_names_it(tmp_path, missing):
    from flashrt_core.groot_fixtures import write_random_groot_checkpoint
    ckpt = write_random_groot_checkpoint(tmp_path / "groot")
    code = ("from flashrt_core import load_model\n"
            "from flashrt_core.errors import CheckpointError\n"
            "try:\n"
            f"    load_model({str(ckpt)!r}, device='cpu', embodiment='new_embodiment')\n"
            "except CheckpointError as exc:\n"
            "    print('refused:', exc)\n")
    done = run_blocked(code, (missing,))
    assert done.returncode == 0, failure_report(done)
    assert "refused: loading a GR00T N1.6 checkpoint needs" in done.stdout, failure_report(done)
    needs = {"transformers": "transformers (`pip install 'flashrt-ros[groot]'`)", "PIL": "Pillow (`pip install pillow`"}
    assert f"needs {needs[missing]}" in done.stdout and f"cannot import {missing!r}" in done.stdout
