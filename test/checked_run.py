"""Run a command for a test and, when it fails, fail with what it printed.

`subprocess.run(..., check=True, capture_output=True)` fails with only "returned non-zero exit status 1": the
output that says why is captured and dropped. `run_checked` keeps the last lines of both streams in the failure."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

SHOWN_CHARS = 6000


def output_tail(text: str | bytes | None, chars: int = SHOWN_CHARS) -> str:
    """The last `chars` characters of a captured stream (decoded when it is bytes)."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text if len(text) <= chars else "..." + text[-chars:]


def failure_report(result: subprocess.CompletedProcess) -> str:
    """The command, its exit status and the tails of its stdout and stderr."""
    command = result.args if isinstance(result.args, str) else " ".join(map(str, result.args))
    return (f"`{command}` exited with status {result.returncode}\n"
            f"--- stdout ---\n{output_tail(result.stdout)}\n--- stderr ---\n{output_tail(result.stderr)}")


def run_checked(args: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run with text output captured; raises AssertionError carrying that output if the exit status is
    not 0. Keyword arguments go to subprocess.run (cwd, env, timeout...)."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    result = subprocess.run(list(args), **kwargs)
    if result.returncode != 0:
        raise AssertionError(failure_report(result))
    return result
