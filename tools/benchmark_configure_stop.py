#!/usr/bin/env python3
"""Benchmark: how long the policy node takes to exit when SIGINT or SIGTERM arrives while it configures.

    .venv/bin/python tools/benchmark_configure_stop.py --checkpoint DIR [--device cpu] [--delays 2 6 10]
        [--signal SIGINT] [--tree DIR] [--output docs/benchmarks/<date>/configure_stop_<machine>.md]

A full-size checkpoint takes from seconds to half a minute to load and tune; the node stops its configure between
the load's steps (a tensor read, a tuning candidate, a graph capture: flashrt_core.stopping), so a signal during
it ends the process within about one step. Each row starts the node process (`policy_node` main with autostart,
loopback DDS, the checkpoint, warm-up passes `--warmup-iterations`), waits for its "configuring:" log line, waits
the row's delay, sends the signal and times how long the process takes to exit, with its exit code and whether a
traceback appeared. The first row runs the configure without a signal, from "configuring:" to "configured:", so
the other rows show how much of it a stop waits for; its exit after the signal, from the configured node, is what
an exit costs with nothing to stop. Every file of the checkpoint folder is read once before the first row, so that
every row reads it from the page cache, not the first from the disk. `--tree` runs the node of another checkout
(an A/B against an earlier commit; the same virtual environment). Writes the table as markdown to --output and the
rows as JSON beside it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from flashrt_ros.loopback_dds import loopback_dds_environment  # noqa: E402

NODE_PROCESS = "import sys; from flashrt_ros.policy_node import main; sys.exit(main(sys.argv[1:]))"
CONFIGURING, CONFIGURED = "configuring:", "configured:"
EXIT_TIMEOUT_S = 300.0          # the longest a row waits for the process to exit after the signal


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="", help="the node's checkpoint parameter (default: the embedded "
                                                          "demo)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--delays", type=float, nargs="+", default=[2.0, 6.0],
                        help="seconds after the 'configuring:' line at which the signal is sent, one row each")
    parser.add_argument("--signal", choices=("SIGINT", "SIGTERM"), default="SIGINT")
    parser.add_argument("--warmup-iterations", type=int, default=0)
    parser.add_argument("--tree", type=Path, default=REPO_ROOT, help="the checkout whose node runs")
    parser.add_argument("--output", type=Path, default=None, help="write the markdown table here (JSON beside)")
    return parser.parse_args(argv)


class NodeRun:
    """One node process: its stderr lines (the node logs there) read on a thread, each with its monotonic time."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        env = dict(os.environ, **loopback_dds_environment(workdir), PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(args.tree.resolve()), os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-c", NODE_PROCESS, "--ros-args", "-p", "autostart:=true",
                   "-p", f"device:={args.device}", "-p", f"warmup_iterations:={args.warmup_iterations}",
                   "-p", "state_topic:=joint_states"]
        if args.checkpoint:
            command += ["-p", f"checkpoint:={args.checkpoint}"]
        self.process = subprocess.Popen(command, env=env, cwd=args.tree, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for_line(self, text: str, timeout_s: float) -> float | None:
        """The time of the first line containing `text`, waiting up to timeout_s; None if it never came (or the
        process ended first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((t for t, line in list(self.lines) if text in line), None)
            if found is not None:
                return found
            if self.process.poll() is not None:
                self._reader.join(timeout=5.0)
                return next((t for t, line in self.lines if text in line), None)
            time.sleep(0.01)
        return None

    def last_line_before(self, t: float) -> str:
        before = [line for at, line in self.lines if at <= t]
        return before[-1] if before else ""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=5.0)


def configure_alone(args: argparse.Namespace, workdir: Path) -> dict:
    """The configure without a signal: seconds from 'configuring:' to 'configured:'; then the signal, and the
    seconds to exit from the configured node (what a stop costs with nothing left to stop: the model released,
    the process torn down)."""
    run = NodeRun(args, workdir)
    try:
        start = run.wait_for_line(CONFIGURING, EXIT_TIMEOUT_S)
        done = run.wait_for_line(CONFIGURED, EXIT_TIMEOUT_S) if start is not None else None
        if start is None or done is None:
            raise RuntimeError("the node did not configure:\n" + "\n".join(line for _, line in run.lines[-20:]))
        sent = time.monotonic()
        run.process.send_signal(getattr(signal, args.signal))
        run.process.wait(timeout=EXIT_TIMEOUT_S)
        return {"configure_s": round(done - start, 3), "exit_s": round(time.monotonic() - sent, 3),
                "exit_code": run.process.returncode}
    finally:
        run.close()


def stop_during_configure(args: argparse.Namespace, workdir: Path, delay_s: float) -> dict:
    run = NodeRun(args, workdir)
    try:
        start = run.wait_for_line(CONFIGURING, EXIT_TIMEOUT_S)
        if start is None:
            raise RuntimeError("the node did not start configuring:\n" + "\n".join(line for _, line in run.lines))
        time.sleep(max(0.0, start + delay_s - time.monotonic()))
        sent = time.monotonic()
        run.process.send_signal(getattr(signal, args.signal))
        try:
            run.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        exited = time.monotonic()
        run._reader.join(timeout=5.0)
        text = "\n".join(line for _, line in run.lines)
        return {"delay_s": delay_s, "exit_s": round(exited - sent, 3), "exit_code": run.process.returncode,
                "configured_before_exit": CONFIGURED in text, "traceback": "Traceback" in text,
                "last_line_before_signal": run.last_line_before(sent)[-160:]}
    finally:
        run.close()


def version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def report(args: argparse.Namespace, alone: dict, rows: list[dict]) -> str:
    tree = subprocess.run(["git", "-C", str(args.tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or str(args.tree)
    lines = [f"# Policy node: {args.signal} during the configure ({datetime.date.today().isoformat()})", "",
             f"Command: `python tools/benchmark_configure_stop.py {' '.join(sys.argv[1:])}`; node of tree {tree}; "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
             f"{platform.python_version()}, torch {version('torch')}, rclpy {version('ros-kilted-rclpy')}; checkpoint "
             f"{args.checkpoint or '<embedded demo>'} on {args.device}.", "",
             f"The configure without a signal ('configuring:' to 'configured:'): {alone['configure_s']:.2f} s; the "
             f"configured node exits {alone['exit_s']:.2f} s after the signal (exit code {alone['exit_code']}).", "",
             "| signal after 'configuring:' | exit after the signal | exit code | configured first | traceback |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['delay_s']:.1f} s | {row['exit_s']:.2f} s | {row['exit_code']} | "
                     f"{'yes' if row['configured_before_exit'] else 'no'} | {'yes' if row['traceback'] else 'no'} |")
    return "\n".join(lines) + "\n"


def read_once(folder: Path) -> int:
    """Read every file under folder once (into the page cache); returns the bytes read."""
    total = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.checkpoint and Path(args.checkpoint).is_dir():
        read_once(Path(args.checkpoint))
    with tempfile.TemporaryDirectory(prefix="configure_stop_") as tmp:
        alone = configure_alone(args, Path(tmp))
        rows = [stop_during_configure(args, Path(tmp), delay) for delay in args.delays]
    text = report(args, alone, rows)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        args.output.with_suffix(".json").write_text(json.dumps({"configure_alone": alone, "rows": rows,
                                                                "argv": sys.argv[1:]}, indent=1) + "\n")
    return 0 if all(row["exit_code"] == 0 and not row["traceback"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
