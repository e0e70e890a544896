"""flashrt_core.view_workers: the views of an observation preprocessed on worker threads give what they give one
after another, in view order; FLASHRT_PARALLEL_VIEWS=0 and a single usable CPU keep everything in the caller's
thread; errors reach the caller; a forked child makes its own pool."""

from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import pytest
import torch

from flashrt_core import groot_inputs, preprocess, view_workers
from flashrt_core.model.groot.config import get_groot_config


def thread_names(items) -> list[str]:
    return view_workers.map_views(lambda _: threading.current_thread().name, items)


def frames(sizes, seed: int = 0) -> list[np.ndarray]:
    return [np.random.default_rng(seed + k).integers(0, 256, (h, w, 3), dtype=np.uint8)
            for k, (h, w) in enumerate(sizes)]


def test_results_come_back_in_order_from_worker_threads(monkeypatch):
    monkeypatch.setenv(view_workers.SWITCH, "1")
    monkeypatch.setattr(view_workers, "usable_cpus", lambda: 4)
    assert view_workers.map_views(lambda x: x * x, list(range(7))) == [x * x for x in range(7)]
    names = thread_names([0, 1, 2])
    assert names[0] == threading.current_thread().name
    assert all(name.startswith(view_workers.THREAD_PREFIX) for name in names[1:])


@pytest.mark.parametrize("why", ["switch off", "one usable CPU", "one view"])
def test_everything_runs_in_the_callers_thread(monkeypatch, why):
    monkeypatch.setenv(view_workers.SWITCH, "0" if why == "switch off" else "1")
    monkeypatch.setattr(view_workers, "usable_cpus", lambda: 1 if why == "one usable CPU" else 4)
    items = [0] if why == "one view" else [0, 1, 2]
    assert thread_names(items) == [threading.current_thread().name] * len(items)


def test_a_malformed_switch_is_named(monkeypatch):
    monkeypatch.setenv(view_workers.SWITCH, "yes")
    with pytest.raises(ValueError, match=view_workers.SWITCH):
        view_workers.map_views(str, [1, 2])


@pytest.mark.parametrize("failing", [0, 2])
def test_an_error_of_any_view_reaches_the_caller(monkeypatch, failing):
    monkeypatch.setenv(view_workers.SWITCH, "1")
    monkeypatch.setattr(view_workers, "usable_cpus", lambda: 4)

    def fn(x):
        if x == failing:
            raise ValueError(f"view {x} is broken")
        return x
    with pytest.raises(ValueError, match=f"view {failing} is broken"):
        view_workers.map_views(fn, [0, 1, 2])


def _squares_in_child(_):
    return view_workers.map_views(lambda x: x * x, [1, 2])


def test_a_forked_child_makes_its_own_pool(monkeypatch):
    """The parent's pool has live threads; a forked child has none of them, and map_views must not wait for them."""
    monkeypatch.setenv(view_workers.SWITCH, "1")
    monkeypatch.setattr(view_workers, "usable_cpus", lambda: 4)
    def slow(x):
        time.sleep(0.05)
        return x + 1
    assert view_workers.map_views(slow, [1, 2, 3, 4]) == [2, 3, 4, 5]     # the parent's pool, threads started
    time.sleep(0.2)          # and idle: a pool copied into the child would hand its work to them and wait
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_squares_in_child, (None,)).get(timeout=30) == [1, 4]


@pytest.mark.parametrize("sizes", [[(224, 224), (224, 224)], [(480, 640), (224, 224), (300, 400)]])
def test_gr00t_views_on_workers_equal_the_views_one_after_another(monkeypatch, sizes):
    cfg = get_groot_config("groot_n1.6")
    names = [f"view{k}" for k in range(len(sizes))]
    images = frames(sizes)
    monkeypatch.setattr(view_workers, "usable_cpus", lambda: 4)
    monkeypatch.setenv(view_workers.SWITCH, "0")
    serial = groot_inputs.prepare_views(images, names, cfg)
    monkeypatch.setenv(view_workers.SWITCH, "1")
    parallel = groot_inputs.prepare_views(images, names, cfg)
    assert [tuple(p.shape) for p in parallel] == [tuple(s.shape) for s in serial]
    assert all(torch.equal(p, s) for p, s in zip(parallel, serial))
    assert float(serial[0].std()) > 0.1          # real frames, not a constant


def test_pi_views_on_workers_equal_the_views_one_after_another(monkeypatch):
    images = {"base": frames([(480, 640)])[0], "wrist": frames([(240, 320)], seed=5)[0]}
    names = ["base", "left", "wrist"]                  # "left" has no image: -1 pixels, mask False
    monkeypatch.setattr(view_workers, "usable_cpus", lambda: 4)
    monkeypatch.setenv(view_workers.SWITCH, "0")
    serial = preprocess.prepare_images(images, names)
    monkeypatch.setenv(view_workers.SWITCH, "1")
    parallel = preprocess.prepare_images(images, names)
    assert np.array_equal(parallel[0], serial[0]) and parallel[1].tolist() == serial[1].tolist() == [True, False, True]
    assert (parallel[0][1] == -1.0).all() and parallel[0][0].std() > 0.1
