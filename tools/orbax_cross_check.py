#!/usr/bin/env python3
"""Check flashrt_core's Orbax reader against checkpoints written by orbax itself.

The test suite's openpi_jax fixtures are written with tensorstore in Orbax's layout (flashrt_core.orbax_params),
without orbax or JAX. This tool closes the loop where orbax is available: it hands the fixture's params tree to a
Python that has orbax-checkpoint and JAX (`--orbax-python`), which saves it with `PyTreeCheckpointer` as openpi
saves params ({"params": tree}, and once with every leaf under "value", as nnx.State during openpi training);
then it loads both folders here and checks that their action chunks are bit-identical to the flashrt fixture's
on the reference path. Exit status 0 when every chunk is identical.

    python3 -m venv /tmp/orbax_venv && /tmp/orbax_venv/bin/pip install orbax-checkpoint 'jax[cpu]'
    .venv/bin/python tools/orbax_cross_check.py --orbax-python /tmp/orbax_venv/bin/python

The arrays travel as an .npz of float32 values (bf16 widens exactly) with their dtype in the key.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flashrt_core.api import load_model  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.fixture_layouts import tokenizer_for_tests, write_layout  # noqa: E402
from flashrt_core.orbax_params import random_source_arrays  # noqa: E402

SEED = 3
STATE_DIM, ACTION_DIM = 8, 7
HORIZON = {"pi05_tiny": 10, "pi0_tiny": 50}

SAVE_WITH_ORBAX = """
import sys, numpy as np, jax, jax.numpy as jnp, orbax.checkpoint as ocp
from importlib.metadata import version
data = np.load(sys.argv[1])
for directory, leaf in ((sys.argv[2], "plain"), (sys.argv[3], "value")):
    tree = {}
    for key in data.files:
        path, kind = key.split("#")
        array = jnp.asarray(data[key], dtype=jnp.bfloat16 if kind == "bf16" else jnp.float32)
        node = tree
        parts = path.split("|")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = {"value": array} if leaf == "value" else array
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(directory, {"params": tree})
print(f"orbax-checkpoint {version('orbax-checkpoint')}, jax {jax.__version__}")
"""


def chunk(folder: Path, tokenizer: Path, config: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]
    noise = rng.standard_normal((HORIZON[config], 32)).astype(np.float32)
    policy = load_model(folder, device="cpu", hardware="reference", tokenizer=tokenizer)
    try:
        return policy.predict(images, "stack the blocks", state=np.linspace(-1, 1, STATE_DIM), noise=noise)
    finally:
        policy.close()


def cross_check(orbax_python: str, workdir: Path) -> bool:
    tokenizer = tokenizer_for_tests(workdir / "tokenizer.model")
    identical = True
    for config in HORIZON:
        reference = write_layout(workdir / f"{config}_flashrt", "flashrt", config, SEED, STATE_DIM, ACTION_DIM)
        arrays = random_source_arrays(get_config(config, state_dim=STATE_DIM, action_dim=ACTION_DIM), SEED)
        tree = workdir / f"{config}_tree.npz"
        np.savez(tree, **{source.replace("/", "|") + ("#bf16" if a.dtype == torch.bfloat16 else "#f32"):
                          a.float().numpy() for source, a in arrays})
        folders = [workdir / f"{config}_orbax", workdir / f"{config}_orbax_value"]
        done = subprocess.run([orbax_python, "-c", SAVE_WITH_ORBAX, str(tree),
                               *(str(f / "params") for f in folders)], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{orbax_python} could not save with orbax:\n{done.stderr[-3000:]}")
        print(f"{config}: saved with {done.stdout.strip()}")
        expected = chunk(reference, tokenizer, config)
        for folder in folders:
            (folder / "assets" / "robot").mkdir(parents=True)
            shutil.copy(reference / "norm_stats.json", folder / "assets" / "robot" / "norm_stats.json")
            same = np.array_equal(chunk(folder, tokenizer, config), expected)
            identical &= same
            print(f"  {folder.name}: {'bit-identical' if same else 'DIFFERENT'} chunk")
    return identical


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orbax-python", required=True, help="a Python with orbax-checkpoint and JAX")
    parser.add_argument("--workdir", help="keep the folders here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        return 0 if cross_check(args.orbax_python, Path(args.workdir)) else 1
    with tempfile.TemporaryDirectory() as tmp:
        return 0 if cross_check(args.orbax_python, Path(tmp)) else 1


if __name__ == "__main__":
    sys.exit(main())
