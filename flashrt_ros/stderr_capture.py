"""Take the lines a C library writes to the process's stderr during one call, and pass every other line on.

libjpeg (inside OpenCV's imdecode) reports a corrupt JPEG with a warning line written straight to file descriptor 2
("Corrupt JPEG data: 151 extraneous bytes before marker 0xd9"), one per frame, outside any logger. During the call
``capture_stderr(prefixes)`` points descriptor 2 at a scratch file; afterwards it restores it, returns the lines that
start with one of ``prefixes`` and writes everything else (what other threads wrote meanwhile, e.g. ROS log lines)
to the real stderr unchanged, a few milliseconds late. A regular file never blocks a writer, so no thread can wait
on the capture. One capture at a time in the process (a lock); Python's own sys.stderr is flushed first.

    with capture_stderr(("Corrupt JPEG data", "Premature end of JPEG file")) as lines:
        decoded = cv2.imdecode(buffer, cv2.IMREAD_COLOR)
    lines   # -> ["Corrupt JPEG data: premature end of data segment"]
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from typing import Iterator

STDERR_FD = 2
_lock = threading.Lock()
_scratch = None          # one scratch file for the process, emptied before each capture


@contextlib.contextmanager
def capture_stderr(prefixes: tuple[str, ...]) -> Iterator[list[str]]:
    """Yield a list that, after the block, holds the stderr lines of the block starting with one of ``prefixes``."""
    global _scratch
    taken: list[str] = []
    with _lock:
        if _scratch is None:
            _scratch = tempfile.TemporaryFile()
        _scratch.seek(0)
        _scratch.truncate()
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError):      # no usable sys.stderr: only descriptor 2 matters here
            pass
        saved = os.dup(STDERR_FD)
        os.dup2(_scratch.fileno(), STDERR_FD)
        try:
            yield taken
        finally:
            os.dup2(saved, STDERR_FD)
            os.close(saved)
            _scratch.seek(0)
            others = []
            for line in _scratch.read().splitlines(keepends=True):
                text = line.decode(errors="replace")
                if text.startswith(prefixes):
                    taken.append(text.rstrip("\n"))
                else:
                    others.append(line)
            rest = b"".join(others)
            while rest:
                rest = rest[os.write(STDERR_FD, rest):]


__all__ = ["capture_stderr"]
