"""keep_large_buffers_on_heap: frame-sized buffers stop faulting in fresh pages; the node applies and reports it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from checked_run import run_checked

from flashrt_ros.heap_reuse import APPLIED, heap_reuse_state
from node_harness import NodeHarness, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]

# Three 640x480 rgb8-sized buffers alive at once, 200 times, on the main thread and on a second thread (its own
# malloc arena), as an image's C message, bytes object and array are; prints the minor page faults of each.
FAULT_PROBE = """
import resource, sys, threading
from flashrt_ros.heap_reuse import keep_large_buffers_on_heap
if sys.argv[1] == "on":
    print(keep_large_buffers_on_heap())
else:
    print("off")
def frames(out):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        buffers = [bytearray(921600) for _ in range(3)]
        del buffers
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
faults = []
frames(faults)
thread = threading.Thread(target=frames, args=(faults,))
thread.start()
thread.join()
print(*faults)
"""


def run_probe(mode: str, **env: str) -> tuple[str, list[int]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = run_checked([sys.executable, "-c", FAULT_PROBE, mode], cwd=REPO_ROOT, env={**clean, **env},
                      timeout=120).stdout.split("\n")
    return out[0], [int(v) for v in out[1].split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt and ru_minflt: Linux only")
def test_frame_sized_buffers_stop_faulting_in_pages():
    state, faults_on = run_probe("on")
    _, faults_off = run_probe("off")
    assert state == APPLIED
    # 200 x 3 x 225 pages: glibc's defaults fault most of them in again every round, on both threads
    assert min(faults_off) > 20_000, faults_off
    assert max(faults_on) < min(faults_off) / 10, (faults_on, faults_off)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt: Linux only")
def test_the_users_malloc_variables_win():
    state, faults = run_probe("on", MALLOC_TRIM_THRESHOLD_="131072")
    assert state == "left to the environment (MALLOC_TRIM_THRESHOLD_)"
    assert min(faults) > 20_000          # nothing changed: still glibc's trimming


@pytest.mark.ros
@pytest.mark.parametrize("keep", [True, False])
def test_node_applies_it_at_configure_and_reports_it(keep):
    earlier = heap_reuse_state()
    h = NodeHarness({"warmup_iterations": 0, "keep_large_buffers_on_heap": keep})
    try:
        assert h.lifecycle.change("configure")
        if keep:
            expected = heap_reuse_state()
            assert expected is not None and expected.startswith((APPLIED, "left to the environment"))
        else:                            # one-way per process: an earlier test's node may have applied it
            assert heap_reuse_state() == earlier
            expected = "off" if earlier is None else f"{earlier} (applied earlier in this process)"
        assert wait_until(lambda: h.diagnostics and h.latest_diagnostics().get("heap_reuse") == expected)
    finally:
        h.close()
