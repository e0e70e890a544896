"""The torch.compile variants of the engine benchmark capture the reference path without changing its result.

The benchmark (tools/benchmark_engine.py) times the reference under inductor with mode="max-autotune" on the GPU;
here the same wiring runs with dynamo's "eager" backend on the CPU: the capture of each compiled region (the
whole sample_actions, its three stages, or each layer) must run and return the eager reference's actions; the stage
scope must trace the denoise step once for all Euler steps, and the layer scope each kind of layer once for all
layers of that kind.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from flashrt_core.executor import ReferenceExecutor
from test_model_pi import inputs, random_model
from tools.benchmark_engine import COMPILED_STAGES, compile_reference
from checked_run import run_checked

# Same ops in the same order: only dynamo's graph breaks separate the two paths.
COMPILED_VS_EAGER_TOL = 1e-5


# regional compilation: SigLIP layer, backbone qkv and finish, expert qkv and finish
LAYER_REGIONS = 5


@pytest.mark.parametrize("scope", ["layers", "stages", "whole"])
@pytest.mark.parametrize("config", ["pi05_tiny", "pi0_tiny"])
def test_compiled_reference_returns_the_eager_actions(config, scope):
    torch._dynamo.reset()
    model = random_model(config)
    pixels, image_masks, tokens, token_masks, state, x_t, _ = inputs(model)
    state = state if model.config.model_type == "pi0" else None
    expected = ReferenceExecutor(model, model.config, torch.device("cpu")).sample_actions(
        pixels, image_masks, tokens, token_masks, state, x_t)
    ref = ReferenceExecutor(model, model.config, torch.device("cpu"))
    counter = CompileCounter()
    compiled = compile_reference(ref, "max-autotune", scope, backend=counter)
    with torch.no_grad():
        actions = compiled(pixels, image_masks, tokens, token_masks, state, x_t)
        again = compiled(pixels, image_masks, tokens, token_masks, state, x_t)
    torch.testing.assert_close(actions, expected, atol=COMPILED_VS_EAGER_TOL, rtol=COMPILED_VS_EAGER_TOL)
    torch.testing.assert_close(again, actions, atol=0, rtol=0)
    if scope == "stages":
        # one frame per stage (+ graph breaks inside them); never one per Euler step, never recompiled on call 2
        assert len(COMPILED_STAGES) <= counter.frame_count < model.config.num_steps
    elif scope == "layers":
        # one graph per kind of region, shared by every layer of that kind and every Euler step
        cfg = model.config
        assert cfg.vision.depth > 1 and cfg.paligemma.depth > 1 and cfg.expert.depth > 1
        assert counter.frame_count == LAYER_REGIONS
    else:
        assert counter.frame_count >= 1


def test_unknown_scope_is_refused():
    model = random_model("pi05_tiny")
    with pytest.raises(ValueError, match="compile scope"):
        compile_reference(ReferenceExecutor(model, model.config, torch.device("cpu")), "default", "modules")


def test_region_outputs_are_the_callers_own():
    """_owned_outputs clones what a compiled region returns (tensors, also inside tuples), so a CUDA graph replay
    of the same region for the next layer cannot overwrite an output still in use."""
    from tools.benchmark_engine import _owned_outputs
    buf = torch.arange(4.0)
    pair = _owned_outputs(lambda: (buf, (buf, 3)))()
    single = _owned_outputs(lambda: buf)()
    buf.add_(10)                                              # the "next replay" writes the static buffer
    assert torch.equal(single, torch.arange(4.0)) and torch.equal(pair[0], torch.arange(4.0))
    assert torch.equal(pair[1][0], torch.arange(4.0)) and pair[1][1] == 3


def _compile_args(tmp_path, **kw):
    from argparse import Namespace
    args = dict(configs=["pi05", "pi0"], views=[1, 2, 3], horizons=[10, 50], compile_grid=False,
                compile_mode="max-autotune", compile_scope="layers", compile_timeout=240, compile_calls=20,
                deadline_s=None, ckpt_root=str(tmp_path / "no_checkpoints"), out_dir=str(tmp_path))
    args.update(kw)
    return Namespace(**args)


def _results(path):
    """A run's Results without the GPU's env (env_info asks CUDA)."""
    from tools.benchmark_engine import Results
    res = Results.__new__(Results)
    res.path, res.data = path, {"env": {}, "rows": [], "gates": [], "errors": [], "notes": []}
    return res


def test_compile_cells_are_the_targets_cell_or_every_cell_of_the_run(tmp_path):
    from tools.benchmark_engine import compile_cells
    assert compile_cells(_compile_args(tmp_path)) == [("pi05", 2, 10)]
    grid = compile_cells(_compile_args(tmp_path, compile_grid=True, configs=["pi0"], views=[1, 3]))
    assert grid == [("pi0", 1, 10), ("pi0", 1, 50), ("pi0", 3, 10), ("pi0", 3, 50)]   # a view count's horizons in turn


def test_a_later_process_takes_a_compiled_graph_from_inductors_disk_cache(tmp_path):
    """What compile_cells' order counts on: a compile child compiling a graph of the shapes an earlier child
    compiled on the machine takes it from inductor's on-disk cache, though its weights differ (they are the graph's
    inputs, not its constants); inductor_cache_counts says so in the child's row."""
    code = ("import torch\n"
            "from tools.benchmark_engine import inductor_cache_counts\n"
            "layer = torch.compile(torch.nn.Linear(16, 16))\n"
            "with torch.no_grad():\n"
            "    layer(torch.randn(4, 16))\n"
            "print(inductor_cache_counts())\n")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    repo = Path(__file__).resolve().parents[2]
    counts = []
    for _ in range(2):
        proc = run_checked([sys.executable, "-c", code], env=env, cwd=repo, timeout=600)
        counts.append(ast.literal_eval(proc.stdout.strip().splitlines()[-1]))
    first, second = counts
    assert first.get("fxgraph_cache_miss") == 1 and not first.get("fxgraph_cache_hit"), first
    assert second.get("fxgraph_cache_hit") == 1 and not second.get("fxgraph_cache_miss"), second


def test_compile_times_name_each_cells_compilation_and_its_cache_lookups():
    from tools.benchmark_engine import compile_times
    rows = [{"config": "pi05", "variant": "reference_compile_max-autotune_layers", "views": 1, "horizon": 50,
             "first_call_s": 61.24, "inductor_cache": {"fxgraph_cache_hit": 4, "fxgraph_cache_miss": 2}},
            {"config": "pi0", "variant": "reference_compile_max-autotune_layers", "views": 2, "horizon": 10,
             "first_call_s": 186.9},                                          # a row without inductor_cache (older files)
            {"config": "pi0", "variant": "reference_compile_max-autotune_layers", "views": 3, "horizon": 10,
             "did_not_finish_s": 300},
            {"config": "pi0", "variant": "engine_bf16", "views": 2, "horizon": 10, "first_call_s": 0.5}]
    assert compile_times(rows) == [
        "- pi0.5, 1 view, horizon 50: 61.2 s; inductor's caches: fxgraph_cache_hit 4, fxgraph_cache_miss 2",
        "- pi0, 2 views, horizon 10: 186.9 s"]


def test_cells_past_the_deadline_get_a_row_that_says_so_and_no_child(tmp_path):
    import time

    from tools.benchmark_engine import run_compile_cells
    res = _results(tmp_path / "run.json")
    args = _compile_args(tmp_path, compile_grid=True, configs=["pi0"], views=[2], deadline_s=70.0)
    run_compile_cells(args, res, time.perf_counter() - 30.0)             # 70 - 30 - 15 = 25 s left: under 60
    assert [(r["config"], r["views"], r["horizon"]) for r in res.data["rows"]] == [("pi0", 2, 10), ("pi0", 2, 50)]
    assert all(r["error"].startswith("not run: 2") and r["variant"] == "reference_compile_max-autotune_layers"
               for r in res.data["rows"])
    assert not list(tmp_path.glob("compile_*.log")) and not (tmp_path / "no_checkpoints").exists()


def test_a_failed_compile_child_leaves_its_cells_row_and_log(tmp_path):
    """The child of one cell (here it finds no checkpoint and no GPU) ends in a row naming its own log, one per
    cell, so the cells of a --compile-grid run do not overwrite each other's logs."""
    from tools.benchmark_engine import run_compile
    res = _results(tmp_path / "run.json")
    run_compile(_compile_args(tmp_path), res, "pi0", 3, 50, timeout=120)
    (row,) = res.data["rows"]
    assert (row["config"], row["views"], row["horizon"]) == ("pi0", 3, 50)
    assert row["error"].startswith("exit ") and row["error"].endswith("see compile_pi0_v3_h50_layers.log")
    assert (tmp_path / "compile_pi0_v3_h50_layers.log").is_file() and row["progress"]["log"] == \
        "compile_pi0_v3_h50_layers.log"
    assert not list(tmp_path.glob(".compile_*.json"))
