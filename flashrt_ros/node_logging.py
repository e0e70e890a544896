"""The policy node's log output: throttled per key, bounded in length, Python logging routed into ROS.

Every log line that input can cause goes through ``ThrottledLog``: at most one line per key every
``period_s`` (a bad stream or an instruction flood must not flood the log), and no longer than
``MAX_LOG_CHARS`` (an instruction, an encoding name or a joint list comes from the sender and can be any size).

``PythonLogBridge`` forwards the records of Python's ``logging`` from flashrt_core and flashrt_ros (e.g. the
tokenizer's warning that a prompt is cut to the model's token limit, once per distinct prompt) to the node's ROS
logger, with the same throttling and bound, instead of Python's last-resort handler writing them to stderr
outside the ROS logger. It forwards what those loggers pass on (WARNING and above unless the application
configured logging otherwise) and changes no logger's level.
"""

from __future__ import annotations

import logging
import math
import threading
import time

MAX_LOG_CHARS = 300         # longest log line from input, in characters
MAX_QUOTED_CHARS = 80       # longest quote of input text (an instruction) inside a log line
DEFAULT_PERIOD_S = 2.0      # at most one line per key in this time
BRIDGED_LOGGERS = ("flashrt_core", "flashrt_ros")


def bounded(text: str, limit: int = MAX_LOG_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def quoted(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """repr-style quote of input text, cut to ``limit`` characters."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


class ThrottledLog:
    """Logs through an rclpy logger at most once per ``period_s`` per key, each line bounded."""

    def __init__(self, logger, period_s: float = DEFAULT_PERIOD_S):
        self._logger = logger
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def due(self, key: str) -> bool:
        """True (and the key's clock restarted) when a line for ``key`` may be logged now."""
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -math.inf) < self.period_s:
                return False
            self._last[key] = now
            return True

    # rclpy fixes the severity per call site: one call site per severity
    def info(self, key: str, message: str) -> None:
        if self.due(key):
            self._logger.info(bounded(message))

    def warning(self, key: str, message: str) -> None:
        if self.due(key):
            self._logger.warning(bounded(message))

    def error(self, key: str, message: str) -> None:
        if self.due(key):
            self._logger.error(bounded(message))


class PythonLogBridge(logging.Handler):
    """A logging handler that hands records to a ThrottledLog (key: logger name and message template)."""

    def __init__(self, log: ThrottledLog):
        super().__init__()
        self._log = log
        self._installed: list[logging.Logger] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = f"{record.name}: {record.getMessage()}"
        except Exception:      # a record whose arguments do not format: say so rather than raise in logging
            message = f"{record.name}: {record.msg!r} (unformattable arguments)"
        key = f"python:{record.name}:{record.msg}"
        try:
            if record.levelno >= logging.ERROR:
                self._log.error(key, message)
            elif record.levelno >= logging.WARNING:
                self._log.warning(key, message)
            else:
                self._log.info(key, message)
        except Exception:      # the ROS context is gone (shutdown): nobody to log to
            pass

    def install(self, names: tuple[str, ...] = BRIDGED_LOGGERS) -> None:
        for name in names:
            logger = logging.getLogger(name)
            logger.addHandler(self)
            self._installed.append(logger)

    def uninstall(self) -> None:
        for logger in self._installed:
            logger.removeHandler(self)
        self._installed = []


__all__ = ["BRIDGED_LOGGERS", "DEFAULT_PERIOD_S", "MAX_LOG_CHARS", "MAX_QUOTED_CHARS", "PythonLogBridge",
           "ThrottledLog", "bounded", "quoted"]
