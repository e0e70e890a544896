"""InferenceWorker (pure Python): newest job only, notifications collapse, deactivation discards, errors survive."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from flashrt_ros.inference_worker import InferenceWorker
from flashrt_ros.waiting import wait_until

WAIT_S = 10.0


class Recorder:
    """prepare/predict/deliver callbacks around a counter of 'observations' and a gate to hold predict."""

    def __init__(self, predict_s: float = 0.0):
        self.pending = None                 # newest job, like the observation buffer
        self.lock = threading.Lock()
        self.predict_s = predict_s
        self.started = threading.Event()
        self.predicted, self.delivered, self.discarded, self.errors = [], [], [], []
        self.threads = set()

    def put(self, job):
        with self.lock:
            self.pending = job

    def prepare(self):
        with self.lock:
            job, self.pending = self.pending, None
        return job

    def predict(self, job):
        self.threads.add(threading.get_ident())
        self.started.set()
        if job == "boom":
            raise ValueError("bad job")
        time.sleep(self.predict_s)
        self.predicted.append(job)
        return np.zeros((2, 3), np.float32)

    def worker(self, yield_after_notify: bool = True) -> InferenceWorker:
        worker = InferenceWorker(self.prepare, self.predict, lambda r: self.delivered.append(r.job),
                                 lambda what, error: self.errors.append((what, str(error))),
                                 on_discard=lambda r: self.discarded.append(r.job),
                                 yield_after_notify=yield_after_notify)
        worker.start()
        return worker


def wait_for(predicate) -> bool:
    return wait_until(predicate, WAIT_S, period_s=0.005)


@pytest.mark.parametrize("yield_after_notify", [True, False])
def test_while_busy_newer_jobs_replace_older_ones_and_notifications_collapse(yield_after_notify):
    recorder = Recorder(predict_s=0.2)
    worker = recorder.worker(yield_after_notify)
    worker.enable()
    recorder.put(0)
    worker.notify()
    assert recorder.started.wait(WAIT_S)
    for job in range(1, 20):               # 19 jobs and notifications while the first forward pass runs
        recorder.put(job)
        worker.notify()
    assert wait_for(lambda: len(recorder.delivered) == 2)
    time.sleep(0.3)
    assert recorder.delivered == [0, 19]    # the newest one only, once
    assert worker.stop()


def test_disable_discards_a_result_in_flight_and_enable_does_not_resurrect_it():
    recorder = Recorder(predict_s=0.3)
    worker = recorder.worker()
    worker.enable()
    recorder.put("old")
    worker.notify()
    assert recorder.started.wait(WAIT_S) and worker.busy
    worker.disable()
    worker.enable()                         # reactivated before the old pass finished
    assert wait_for(lambda: recorder.discarded == ["old"])
    assert recorder.delivered == []
    recorder.put("new")
    worker.notify()
    assert wait_for(lambda: recorder.delivered == ["new"])
    assert worker.stop()


def test_disabled_worker_does_not_run_and_errors_do_not_kill_the_thread():
    recorder = Recorder()
    worker = recorder.worker()
    recorder.put("ignored")
    worker.notify()
    time.sleep(0.1)
    assert recorder.predicted == [] and recorder.pending == "ignored"      # disabled: nothing taken
    recorder.put(None)                  # as the node's activation clears its buffer before it enables the worker
    worker.enable()
    recorder.put("boom")
    worker.notify()
    assert wait_for(lambda: recorder.errors == [("inference failed", "bad job")])
    recorder.put("fine")
    worker.notify()
    assert wait_for(lambda: recorder.delivered == ["fine"]) and worker.alive
    assert worker.stop() and not worker.alive


def test_run_on_thread_uses_the_inference_thread_and_passes_errors_back():
    recorder = Recorder()
    worker = recorder.worker()
    worker.enable()
    recorder.put("job")
    worker.notify()
    assert wait_for(lambda: recorder.delivered == ["job"])
    assert worker.run_on_thread(threading.get_ident) in recorder.threads
    with pytest.raises(ZeroDivisionError):
        worker.run_on_thread(lambda: 1 / 0)
    assert worker.stop()
    with pytest.raises(RuntimeError, match="not running"):
        worker.run_on_thread(lambda: None)


def test_a_failing_error_callback_does_not_kill_the_thread():
    recorder = Recorder()
    worker = InferenceWorker(recorder.prepare, recorder.predict, lambda r: recorder.delivered.append(r.job),
                             lambda what, error: 1 / 0)
    worker.start()
    worker.enable()
    recorder.put("boom")
    worker.notify()
    time.sleep(0.1)
    recorder.put("fine")
    worker.notify()
    assert wait_for(lambda: recorder.delivered == ["fine"]) and worker.alive
    assert worker.stop()


def test_handover_waits_for_the_idle_thread_to_prepare_but_never_for_predict():
    """With handover_timeout_s the notifying callback returns once the idle thread has taken and prepared the job,
    while predict() (the GPU's part) still runs; a notify while a forward pass runs does not wait at all."""
    recorder = Recorder()
    release = threading.Event()
    worker = InferenceWorker(recorder.prepare, lambda job: (release.wait(WAIT_S), recorder.predict(job))[1],
                             lambda r: recorder.delivered.append(r.job), lambda what, error: None,
                             handover_timeout_s=WAIT_S)
    worker.start()
    worker.enable()
    recorder.put("first")
    worker.notify()                                  # returns when prepare() took "first"
    assert recorder.pending is None and recorder.predicted == [] and worker.handover_timeouts == 0
    assert wait_for(lambda: worker.busy)
    recorder.put("second")
    worker.notify()                                  # busy: no wait, "second" stays pending
    assert recorder.pending == "second"
    release.set()
    assert wait_for(lambda: recorder.delivered == ["first", "second"])
    assert worker.handover_timeouts == 0
    assert worker.stop()


def test_handover_wait_ends_at_its_timeout_and_is_counted():
    """A prepare() that does not return within the timeout: notify() returns anyway and counts it."""
    recorder = Recorder()
    in_prepare, release = threading.Event(), threading.Event()

    def slow_prepare():
        in_prepare.set()
        release.wait(WAIT_S)
        return recorder.prepare()
    worker = InferenceWorker(slow_prepare, recorder.predict, lambda r: recorder.delivered.append(r.job),
                             lambda what, error: None, handover_timeout_s=0.05)
    worker.start()
    recorder.put("job")
    worker.enable()                                  # notifies: prepare() blocks, the hand-over times out
    assert in_prepare.wait(WAIT_S) and worker.handover_timeouts == 1
    release.set()
    assert wait_for(lambda: recorder.delivered == ["job"])
    assert worker.stop()


def test_handover_timeout_must_not_be_negative():
    with pytest.raises(ValueError, match="handover_timeout_s"):
        InferenceWorker(lambda: None, lambda job: job, lambda r: None, lambda what, error: None,
                        handover_timeout_s=-0.001)


def test_a_notify_from_the_inference_thread_itself_does_not_wait_for_it():
    """enable() / notify() called on the worker's own thread (as run_on_thread work could) returns without a
    hand-over wait: the thread cannot prepare while it waits on itself."""
    recorder = Recorder()
    worker = InferenceWorker(recorder.prepare, recorder.predict, lambda r: recorder.delivered.append(r.job),
                             lambda what, error: None, handover_timeout_s=WAIT_S)
    worker.start()
    worker.enable()
    recorder.put("job")
    worker.run_on_thread(worker.notify, timeout_s=WAIT_S / 2)       # a self-wait would last WAIT_S: timeout
    assert wait_for(lambda: recorder.delivered == ["job"])
    assert worker.handover_timeouts == 0
    assert worker.stop()
