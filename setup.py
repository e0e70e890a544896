"""pip route: `pip install .` gives flashrt_core (the inference core, no ROS needed), flashrt_kernels and the
flashrt_ros node code to users without a ROS install. The ROS messages (flashrt_ros.msg) come from the ament_cmake
build (colcon, or tools/bootstrap.sh for a venv with the ROS 2 wheels); see README.md."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent


def files_in(folder: str, pattern: str) -> list[str]:
    """The files of a folder of the source tree matching a pattern, as data_files wants them (relative, sorted)."""
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / folder).glob(pattern))


core_packages = find_packages(include=["flashrt_core", "flashrt_core.*"])
ros_packages = find_packages(include=["flashrt_ros", "flashrt_ros.*"])
kernel_packages = ["flashrt_kernels"] + [
    "flashrt_kernels." + p for p in find_packages(where="kernels/flashrt_kernels")
]

setup(
    name="flashrt-ros",
    version="0.1.0",
    description="Real-time VLA policies (pi0.5, pi0) on ROS 2, with an embedded CUDA-graph inference core",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=core_packages + ros_packages + kernel_packages,
    package_dir={"flashrt_kernels": "kernels/flashrt_kernels"},
    package_data={"flashrt_core": ["data/*"], "flashrt_kernels": ["cuda/*.cu", "cuda/*.cuh"]},  # CUDA C++ sources, built by nvcc on first use
    # the .msg files travel with the Python package so the bag tools can register the types without a ROS build;
    # the parameter files and the launch files sit where a ROS install keeps them (share/flashrt_ros)
    data_files=[("share/flashrt_ros/msg", files_in("msg", "*.msg")),
                ("share/flashrt_ros/config", files_in("config", "*.yaml")),
                ("share/flashrt_ros/launch", files_in("launch", "*.launch.py"))],
    # upper bounds: the next major versions are untested (tools/constraints.txt has the versions CI runs)
    install_requires=[
        "numpy>=1.26,<3",
        "safetensors>=0.4,<1",
        "sentencepiece>=0.2,<1",
        "torch>=2.4,<3",
        "pyyaml>=6,<7",
        "opencv-python-headless>=4.9,<6",
        "tokenizers>=0.20,<1",        # pi0-FAST's FAST action tokenizer, GR00T's tokenizer.json
        "pillow>=10,<14",             # openpi's host resize (preprocess.py; 13 on: its numpy twin), GR00T's bicubic
    ],
    extras_require={
        "bags": ["rosbags>=0.10,<0.12"],
        "plots": ["rosbags>=0.10,<0.12", "matplotlib>=3.7,<4"],
        "hub": ["huggingface_hub>=0.34,<3"],
        "orbax": ["tensorstore>=0.1.70,<0.2"],
        "groot": ["transformers>=4.51,<6"],    # GR00T N1.6's SigLIP2 / Qwen3 modules
        "test": ["pytest>=8,<10", "transformers>=4.51,<6"],
    },
    # each through flashrt_ros.console_scripts, which names a missing optional part (ROS 2, the messages, the
    # bag library) and how to get it instead of ending in a traceback
    entry_points={
        "console_scripts": [
            "flashrt-policy-node=flashrt_ros.console_scripts:policy_node",
            "flashrt-action-executor=flashrt_ros.console_scripts:action_executor",
            "flashrt-demo=flashrt_ros.console_scripts:demo",
            "flashrt-bag-player=flashrt_ros.console_scripts:bag_player",
            "flashrt-bag-recorder=flashrt_ros.console_scripts:bag_recorder",
            "flashrt-bag-evaluator=flashrt_ros.console_scripts:bag_evaluator",
            "flashrt-bag-regression=flashrt_ros.console_scripts:bag_regression",
            "flashrt-demo-bag=flashrt_ros.console_scripts:demo_bag",
            "flashrt-chunk-plots=flashrt_ros.console_scripts:chunk_plots",
            "flashrt-fixture=flashrt_ros.console_scripts:fixture",
            "flashrt-inspect=flashrt_ros.console_scripts:inspect",
            "flashrt-convert=flashrt_ros.console_scripts:convert",
        ]
    },
)
