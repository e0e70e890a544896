#!/usr/bin/env python3
"""Full-size pi0.5 in every checkpoint layout: the same random weights written as a flashrt folder, a lerobot
folder, openpi's PyTorch conversion and an openpi Orbax checkpoint (tensorstore's writer, and orbax's own
PyTreeCheckpointer where orbax and JAX are installed), each loaded (load_model_weights, bf16, CPU) and converted
(flashrt-convert) in a process of its own. Every load must give the flashrt folder's tensors bit for bit (one
SHA-256 over every parameter); the table gives each step's time and peak memory (ru_maxrss of its process).

    python3 tools/full_size_layouts.py WORKDIR [--markdown OUT.md]

About 45 GB of disk: five 8-9 GB checkpoints and the converted folders (each removed once checked).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FULL_SIZE = "pi05"
SEED = 0
STATE_DIM, ACTION_DIM = 8, 7
LAYOUTS = ("flashrt", "lerobot", "openpi_pytorch", "openpi_jax", "orbax_saved")


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def step_write(layout: str, folder: Path, config: str) -> dict:
    import torch

    from flashrt_core.config import get_config
    from flashrt_core.fixture_layouts import write_layout
    from flashrt_core.orbax_params import random_source_arrays
    if layout != "orbax_saved":
        write_layout(folder, layout, config, SEED, STATE_DIM, ACTION_DIM)
        return {}
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    tree: dict = {}
    for source, array in random_source_arrays(get_config(config, state_dim=STATE_DIM, action_dim=ACTION_DIM),
                                              SEED):
        node = tree
        parts = source.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        bf16 = array.dtype == torch.bfloat16
        node[parts[-1]] = jnp.asarray(array.float().numpy(), dtype=jnp.bfloat16 if bf16 else jnp.float32)
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(str(folder / "params"), {"params": tree})
    write_layout(folder / "_stats_source", "openpi_jax", "pi05_tiny", SEED, STATE_DIM, ACTION_DIM)
    shutil.move(str(folder / "_stats_source" / "assets"), str(folder / "assets"))
    shutil.rmtree(folder / "_stats_source")
    from importlib.metadata import version
    return {"orbax": version("orbax-checkpoint")}


def step_load(folder: Path) -> dict:
    import torch

    from flashrt_core.checkpoint import load_model_weights
    from flashrt_core.checkpoint_config import fit_robot_dims, resolve_config
    from flashrt_core.normalization import load_norm_stats
    config, explicit = resolve_config(None, folder)
    config = fit_robot_dims(config, load_norm_stats(folder), explicit, folder)
    model = load_model_weights(folder, config, "cpu", torch.bfloat16)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return {"config": config.name, "horizon": config.action_horizon, "sha256": digest.hexdigest()}


def step_convert(folder: Path, dst: Path, tokenizer: Path) -> dict:
    from flashrt_core.checkpoint_convert import convert
    convert(folder, dst, tokenizer=tokenizer, force=True)
    return {"bytes": sum(p.stat().st_size for p in dst.iterdir())}


def run_step(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--step", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"step {args} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", nargs="?")
    parser.add_argument("--markdown", help="write the result table here")
    parser.add_argument("--config", default=FULL_SIZE, help="preset (pi05_tiny for a quick run of the tool)")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, help="these only (the flashrt folder's digest is "
                        "kept in WORKDIR/reference.sha256 for later runs)")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        start = time.perf_counter()
        kind, *rest = args.step
        if kind == "write":
            result = step_write(rest[0], Path(rest[1]), rest[2])
        elif kind == "load":
            result = step_load(Path(rest[0]))
        else:
            result = step_convert(Path(rest[0]), Path(rest[1]), Path(rest[2]))
        print(json.dumps({**result, "seconds": time.perf_counter() - start, "peak_gb": _peak_gb()}))
        return 0
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    from flashrt_core.fixture_layouts import tokenizer_for_tests
    tokenizer = tokenizer_for_tests(work / "tokenizer.model")
    try:
        import orbax.checkpoint  # noqa: F401
        layouts = LAYOUTS
    except ImportError:
        layouts = LAYOUTS[:-1]
    reference_file = work / "reference.sha256"
    rows, same = [], True
    reference = reference_file.read_text().strip() if reference_file.is_file() else None
    for layout in args.layouts or layouts:
        folder = work / layout
        written = run_step("write", layout, str(folder), args.config)
        loaded = run_step("load", str(folder))
        converted = run_step("convert", str(folder), str(work / f"{layout}_converted"), str(tokenizer))
        reloaded = run_step("load", str(work / f"{layout}_converted"))
        if reference is None:
            reference = loaded["sha256"]
            reference_file.write_text(reference + "\n")
        identical = loaded["sha256"] == reference == reloaded["sha256"]
        same &= identical
        rows.append(f"| {layout}{' (orbax ' + written['orbax'] + ')' if 'orbax' in written else ''} | "
                    f"{written['seconds']:.0f} s | {loaded['seconds']:.1f} s, {loaded['peak_gb']:.1f} GB | "
                    f"{converted['seconds']:.1f} s, {converted['peak_gb']:.1f} GB | "
                    f"{'yes' if identical else 'NO'} ({loaded['config']}, horizon {loaded['horizon']}) |")
        print(rows[-1], flush=True)
        if args.markdown:
            Path(args.markdown).write_text("\n".join(rows) + "\n")
        shutil.rmtree(folder)
        shutil.rmtree(work / f"{layout}_converted")
    import torch
    table = "\n".join([
        f"{args.config}, seed {SEED}; {platform.node()}, Python {platform.python_version()}, torch "
        f"{torch.__version__}, {time.strftime('%Y-%m-%d')}. Each step in a process of its own; load = "
        "load_model_weights (bf16, CPU); peak = ru_maxrss.", "",
        "| layout | write | load | flashrt-convert | same tensors as flashrt, directly and converted |",
        "|---|---|---|---|---|", *rows])
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
