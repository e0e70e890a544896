"""Helpers shared by the bag tests: an in-process rclpy context with a spinning executor, bag readers."""

from __future__ import annotations

import threading
from pathlib import Path

from rosbags.rosbag2 import Reader

from flashrt_ros.node_executor import DEFAULT_EXECUTOR, make_executor, spin_until_shutdown

SPIN_TIMEOUT_S = 0.05


class RosHarness:
    """An isolated rclpy context whose nodes are spun on a background thread by the executor the node's
    executables use (flashrt_ros.node_executor, single-threaded). A multi-threaded executor's spin loop keeps
    taking the GIL while callbacks run; on a 2-core machine it starved the bag player running beside it (2 s
    late, a loop test missing its passes in 1 run of 5)."""

    def __init__(self) -> None:
        import rclpy

        self._rclpy = rclpy
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.executor = make_executor(DEFAULT_EXECUTOR, context=self.context)
        self._nodes: list = []
        self._thread = threading.Thread(target=self._spin, name="bag-test-executor", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        spin_until_shutdown(self.executor, self.context, SPIN_TIMEOUT_S)

    def node(self, name: str, spin: bool = True, **kwargs):
        """Create a node in this context; ``spin`` adds it to the background executor."""
        node = self._rclpy.create_node(name, context=self.context, **kwargs)
        self._nodes.append(node)
        if spin:
            self.executor.add_node(node)
        return node

    def add(self, node) -> None:
        """Spin a node created elsewhere (e.g. the policy node) and destroy it on close."""
        self._nodes.append(node)
        self.executor.add_node(node)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self._rclpy.shutdown(context=self.context)
        self._thread.join(timeout=5.0)
        for node in self._nodes:
            node.destroy_node()

    def __enter__(self) -> RosHarness:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bag_messages(bag: Path) -> list[tuple[str, int, bytes]]:
    """Every message of a bag as (topic, receive timestamp ns, raw CDR bytes), in timestamp order."""
    with Reader(bag) as reader:
        return [(conn.topic, timestamp, bytes(raw)) for conn, timestamp, raw in reader.messages()]
