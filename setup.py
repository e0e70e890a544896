"""pip route: `pip install .` gives flashrt_core (the inference core, no ROS needed), flashrt_kernels and the
flashrt_ros node code to users without a ROS install. The ROS messages (flashrt_ros.msg) come from the ament_cmake
build (colcon, or tools/bootstrap.sh for a venv with the ROS 2 wheels); see README.md."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent

core_packages = find_packages(include=["flashrt_core", "flashrt_core.*"])
ros_packages = find_packages(include=["flashrt_ros", "flashrt_ros.*"])
kernel_packages = ["flashrt_kernels"] + [
    "flashrt_kernels." + p for p in find_packages(where="kernels")
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
    package_dir={"flashrt_kernels": "kernels"},
    package_data={"flashrt_core": ["data/*"]},
    # the .msg files travel with the Python package so the bag tools can register the types without a ROS build
    data_files=[("share/flashrt_ros/msg", ["msg/ActionChunk.msg", "msg/PolicyStatus.msg"])],
    install_requires=[
        "numpy>=1.26",
        "safetensors>=0.4",
        "sentencepiece>=0.2",
        "torch>=2.4",
        "pyyaml>=6",
        "opencv-python-headless>=4.9",
    ],
    extras_require={
        "bags": ["rosbags>=0.10,<0.12"],
        "test": ["pytest>=8", "transformers>=4.45"],
    },
    entry_points={
        "console_scripts": [
            "flashrt-policy-node=flashrt_ros.policy_node:main",
            "flashrt-demo=flashrt_ros.demo_main:main",
            "flashrt-bag-player=flashrt_ros.bag_player:main",
            "flashrt-bag-recorder=flashrt_ros.bag_recorder:main",
            "flashrt-bag-evaluator=flashrt_ros.bag_evaluator:main",
            "flashrt-bag-regression=flashrt_ros.bag_regression:main",
            "flashrt-demo-bag=flashrt_ros.demo_bag:main",
            "flashrt-fixture=flashrt_core.fixtures:main",
        ]
    },
)
