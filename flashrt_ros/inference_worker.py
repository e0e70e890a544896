"""The inference thread of the policy node: newest observation in, action chunk out, never a backlog.

ROS callbacks only ``notify()`` the worker (a new complete observation, or a rate tick); they never
wait on the model. The thread wakes, asks ``prepare()`` for a job built from the NEWEST observation
(older ones were already replaced in the observation buffer), runs ``predict(job)`` and hands the result
to ``deliver``. Notifications that arrive while a forward pass runs collapse into one wake-up.

``disable()`` (deactivation) bumps a generation counter under the same lock that ``deliver`` runs under:
once it returns, nothing computed before it is ever delivered, even after a later ``enable()``.

``yield_after_notify``: a notifying callback then gives up the GIL once (``time.sleep(0)``) when the thread is
idle, so the thread starts on the observation at once instead of waiting until the callback's thread next
blocks or the interpreter's switch interval (5 ms) forces a switch. On the 2-core development machine (CPU
inference, 3 Hz camera pairs, so every observation finds the thread idle) the wait of a complete observation for
the thread fell from 1.13 ms to 0.20-0.25 ms median (tools/benchmark_node_overhead.py, 2026-11-29).

``handover_timeout_s`` (> 0; 0 = off): a notifying callback that finds the thread idle then waits, with the GIL
released, until the thread has taken the job and ``prepare()`` has built it, at most this long. The yield above
hands the GIL over only if the woken thread is already scheduled; otherwise the callback's thread returns into the
executor's Python code and keeps the GIL until it blocks again. With the wait, the thread's wake-up and the input
conversion do not compete with the executor for the GIL. The callback never waits on ``predict()`` (the GPU): the
wait ends when ``prepare()`` returns, or at the timeout.

The node's default is ``DEFAULT_HANDOVER_TIMEOUT_S``. On the GPU benchmark machine (H200 host, 16 cores, 2026-12-01,
docs/benchmarks/2026-12-01/node_handover_h200.md) it cut the queue wait p99 from 1.18 to 0.35 ms and the node's own
share p99 from 1.48 to 0.68 ms, medians unchanged; on the 2-core development machine p99 1.0-2.1 -> 0.5-0.8 ms.

``run_on_thread(fn)`` runs other model work (warm-up, graph capture) on the same thread, so every call into
the model, GPU work included, happens on one thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Generic, TypeVar

import numpy as np

Job = TypeVar("Job")

_LOG = logging.getLogger(__name__)

DEFAULT_HANDOVER_TIMEOUT_S = 0.005   # the node's inference_handover_timeout (see the module docstring)


@dataclasses.dataclass(frozen=True)
class InferenceResult(Generic[Job]):
    job: Job
    actions: np.ndarray          # (horizon, action_dim) float32
    inference_time_s: float      # wall time of predict() on the steady clock
    prepare_time_s: float = 0.0  # wall time of prepare() that built the job (input conversion)
    finished_at: float = 0.0     # time.perf_counter() when predict() returned


class InferenceWorker(Generic[Job]):
    """One thread running ``predict`` on the newest job; see the module docstring."""

    def __init__(self, prepare: Callable[[], Job | None], predict: Callable[[Job], np.ndarray],
                 deliver: Callable[[InferenceResult[Job]], None], on_error: Callable[[str, BaseException], None],
                 on_discard: Callable[[InferenceResult[Job]], None] | None = None,
                 name: str = "flashrt_inference", yield_after_notify: bool = True, handover_timeout_s: float = 0.0):
        self._prepare = prepare
        self._predict = predict
        self._deliver = deliver
        self._on_error = on_error
        self._on_discard = on_discard
        self._wake = threading.Condition()
        self._notified = False
        self._stopping = False
        self._enabled = False
        self._generation = 0
        self._deliver_lock = threading.Lock()
        self._busy = False
        self._yield_after_notify = yield_after_notify
        if not handover_timeout_s >= 0.0:
            raise ValueError(f"handover_timeout_s must be >= 0, got {handover_timeout_s!r}")
        self._handover_timeout_s = handover_timeout_s
        self._prepared = threading.Event()     # set when the thread has taken (prepared) what notify() announced
        self.handover_timeouts = 0             # hand-over waits that ended at the timeout
        self._calls: list[tuple[Callable[[], object], threading.Event, dict]] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- control (any thread) -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the thread after its current forward pass; True when it ended within the timeout."""
        self.disable()
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._prepared.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def enable(self) -> None:
        with self._deliver_lock:
            self._enabled = True
        self.notify()

    def disable(self) -> None:
        """Stop delivering; results of forward passes started before this call are discarded."""
        with self._deliver_lock:
            self._enabled = False
            self._generation += 1

    def run_on_thread(self, fn: Callable[[], object], timeout_s: float | None = None) -> object:
        """Run ``fn()`` on the inference thread, wait for it, return its result or raise its exception."""
        if not self._thread.is_alive():
            raise RuntimeError("the inference thread is not running")
        done, box = threading.Event(), {}
        with self._wake:
            self._calls.append((fn, done, box))
            self._wake.notify()
        if not done.wait(timeout_s):
            raise TimeoutError(f"the inference thread did not finish the call within {timeout_s} s")
        if "error" in box:
            raise box["error"]
        return box["result"]

    def notify(self) -> None:
        """Wake the thread (cheap, never blocks on inference; with handover_timeout_s, waits at most that long
        for the idle thread to take and prepare the job)."""
        handover = (self._handover_timeout_s > 0.0 and not self._busy and self._thread.is_alive()
                    and threading.current_thread() is not self._thread)   # never wait on itself
        with self._wake:
            if handover:
                self._prepared.clear()
            self._notified = True
            self._wake.notify()
        if handover:
            if not self._prepared.wait(self._handover_timeout_s):    # releases the GIL while it waits
                self.handover_timeouts += 1
        elif self._yield_after_notify and not self._busy:
            time.sleep(0)         # releases the GIL: the woken thread can take it now

    @property
    def busy(self) -> bool:
        """True while a forward pass runs."""
        return self._busy

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._notified and not self._stopping and not self._calls:
                    self._wake.wait()
                if self._stopping:
                    self._fail_pending_calls()
                    return
                calls, self._calls = self._calls, []
                notified, self._notified = self._notified, False
            for fn, done, box in calls:
                try:
                    box["result"] = fn()
                except BaseException as error:     # handed to the caller of run_on_thread
                    box["error"] = error
                done.set()
            if not notified:
                continue
            with self._deliver_lock:
                enabled, generation = self._enabled, self._generation
            if enabled:
                self._run_once(generation)
            else:
                self._prepared.set()       # nothing to take while disabled: a waiting notify() returns

    def _report(self, what: str, error: BaseException) -> None:
        try:
            self._on_error(what, error)
        except Exception:            # the error callback itself failed: log it, keep the thread alive
            _LOG.exception("error callback failed while reporting %s: %s", what, error)

    def _fail_pending_calls(self) -> None:
        for _, done, box in self._calls:
            box["error"] = RuntimeError("the inference thread stopped")
            done.set()
        self._calls = []

    def _run_once(self, generation: int) -> None:
        prepare_start = time.perf_counter()
        try:
            job = self._prepare()
        except Exception as error:   # a bad input must never kill the thread
            self._report("preparing the observation failed", error)
            return
        finally:
            self._prepared.set()     # the hand-over ends here, before predict()
        if job is None:
            return
        self._busy = True
        try:
            start = time.perf_counter()
            actions = self._predict(job)
            end = time.perf_counter()
            result = InferenceResult(job, actions, end - start, start - prepare_start, end)
        except Exception as error:
            self._report("inference failed", error)
            return
        finally:
            self._busy = False
        with self._deliver_lock:
            if self._enabled and self._generation == generation:
                try:
                    self._deliver(result)
                except Exception as error:
                    self._report("publishing the result failed", error)
                return
        if self._on_discard is not None:
            self._on_discard(result)
        _LOG.debug("discarded a result computed before deactivation")
        # A notification may have arrived while this pass ran; the loop picks it up.


__all__ = ["InferenceResult", "InferenceWorker"]
