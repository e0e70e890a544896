"""Garbage-collector pauses: timed by GcPauses, reported in /diagnostics, avoided by freezing after configure."""

from __future__ import annotations

import gc
import weakref

import pytest

from flashrt_ros.gc_pauses import GcPauses, freeze_objects, unfreeze_objects
from node_harness import NodeHarness, wait_until

pytestmark = pytest.mark.ros


@pytest.fixture
def unfrozen():
    """Every test leaves the process's collector as it found it."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_full_collections_are_timed_while_installed(unfrozen):
    pauses = GcPauses(window_s=60.0)
    pauses.install()
    try:
        garbage = [[i] for i in range(50_000)]      # something to walk (may trigger a full collection itself)
        gc.collect()
        gc.collect()
        recorded = pauses.full_pauses()
        assert recorded.size >= 2 and (recorded > 0).all() and (recorded < 5.0).all()
        assert pauses.collections[2] == recorded.size and pauses.longest_s[2] == pytest.approx(recorded.max())
        assert pauses.collections[0] >= 1            # the list comprehension's young collections
        del garbage
    finally:
        pauses.uninstall()
    before = pauses.full_pauses().size
    gc.collect()
    assert pauses.full_pauses().size == before       # nothing recorded after uninstall
    pauses.uninstall()                               # twice is harmless


def test_full_pauses_leave_the_window():
    pauses = GcPauses(window_s=0.0)
    pauses.install()
    try:
        gc.collect()
    finally:
        pauses.uninstall()
    assert pauses.collections[2] == 1 and pauses.full_pauses().size == 0


def test_freeze_moves_live_objects_out_of_collection_and_unfreeze_gives_them_back(unfrozen):
    class Node:
        pass

    kept = [Node() for _ in range(20_000)]
    frozen = freeze_objects()
    assert frozen >= len(kept) and gc.get_freeze_count() == frozen
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in kept[:100])          # a full collection no longer walks them
    unfreeze_objects()
    assert gc.get_freeze_count() == 0
    # a frozen cycle is not freed; once unfrozen it is
    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    freeze_objects()
    del a, b
    gc.collect()
    assert ref() is not None
    unfreeze_objects()
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("freeze", [True, False])
def test_node_freezes_after_configure_and_unfreezes_at_cleanup(unfrozen, freeze):
    h = NodeHarness({"warmup_iterations": 1, "freeze_gc_after_configure": freeze})
    try:
        assert h.lifecycle.change("configure")
        assert (gc.get_freeze_count() > 10_000) == freeze      # torch, rclpy and the model: far more than that
        gc.collect()                                              # one full collection the node must see
        assert wait_until(lambda: h.diagnostics and int(h.latest_diagnostics()["gc_full_collections"]) >= 1)
        assert float(h.latest_diagnostics()["gc_full_pause_max_s"]) > 0
        policy = weakref.ref(h.node.policy)
        assert h.lifecycle.change("cleanup")
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert policy() is None                                   # the released model is not kept by the freeze
    finally:
        h.close()
