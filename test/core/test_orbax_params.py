"""openpi Orbax params: ORBAX_TABLE at openpi's own array shapes (src/openpi/models/gemma.py, siglip.py), its
split / join pair, and the reader's handling of "value" paths, unknown arrays and a missing tensorstore."""

import sys

import numpy as np
import pytest
import torch

from flashrt_core.api import load_model
from flashrt_core.checkpoint import weight_spec
from flashrt_core.checkpoint_layout import Layout
from flashrt_core.config import get_config
from flashrt_core.errors import CheckpointError
from flashrt_core.fixture_layouts import tokenizer_for_tests, write_layout
from flashrt_core.orbax_params import PARAMS_DIR, orbax_table, write_random_params

STATE_DIM, ACTION_DIM = 8, 7
# Arrays of openpi's full-size pi0.5 whose shape is not simply the transposed Linear weight (per layer, without
# the scanned layer axis): the einsum kernels of gemma.py (q (N, D, H), kv (2, K, D, H), attn_vec (N, H, D),
# gating (2, D, F)) and the SigLIP patch, position and attention kernels of siglip.py.
OPENPI_SHAPES = {
    "PaliGemma/img/embedding/kernel": (14, 14, 3, 1152),
    "PaliGemma/img/pos_embedding": (1, 256, 1152),
    "PaliGemma/img/Transformer/encoderblock/MultiHeadDotProductAttention_0/query/kernel": (1152, 16, 72),
    "PaliGemma/img/Transformer/encoderblock/MultiHeadDotProductAttention_0/query/bias": (16, 72),
    "PaliGemma/img/Transformer/encoderblock/MultiHeadDotProductAttention_0/out/kernel": (16, 72, 1152),
    "PaliGemma/llm/layers/attn/q_einsum/w": (8, 2048, 256),
    "PaliGemma/llm/layers/attn/kv_einsum/w": (2, 1, 2048, 256),
    "PaliGemma/llm/layers/attn/attn_vec_einsum/w": (8, 256, 2048),
    "PaliGemma/llm/layers/mlp/gating_einsum": (2, 2048, 16384),
    "PaliGemma/llm/layers/attn/q_einsum_1/w": (8, 1024, 256),
    "PaliGemma/llm/layers/attn/kv_einsum_1/w": (2, 1, 1024, 256),
    "PaliGemma/llm/layers/attn/attn_vec_einsum_1/w": (8, 256, 1024),
    "PaliGemma/llm/layers/mlp_1/gating_einsum": (2, 1024, 4096),
    "PaliGemma/llm/layers/pre_attention_norm_1/Dense_0/kernel": (1024, 3072),
}


@pytest.mark.parametrize("preset", ["pi05", "pi0"])
def test_the_table_maps_openpis_shapes_onto_every_weight(preset):
    config = get_config(preset)
    spec = weight_spec(config)
    covered = set()
    for row in orbax_table(config):
        wanted = [spec[t.format(i=0)][0] for t in row.targets]
        transposed = row.source.endswith(("kernel", "/linear"))   # Dense kernel [in, out], mlp linear [F, D]
        shape = OPENPI_SHAPES.get(row.source, wanted[0][::-1] if transposed else wanted[0])
        parts = row.split(torch.empty(shape, device="meta"))
        assert [tuple(p.shape) for p in parts] == wanted, row.source
        depth = {"vision": config.vision.depth, "paligemma": config.paligemma.depth, "expert": config.expert.depth}
        for target in row.targets:
            covered |= {target.format(i=i) for i in range(depth[row.layers_of])} if row.layers_of else {target}
    assert covered == set(spec)


@pytest.mark.parametrize("preset", ["pi05_tiny", "pi0_tiny"])
def test_join_inverts_split_exactly(preset):
    config = get_config(preset)
    spec = weight_spec(config)
    generator = torch.Generator().manual_seed(0)
    for row in orbax_table(config):
        parts = [torch.randn(spec[t.format(i=0)][0], generator=generator) for t in row.targets]
        back = row.split(row.join(parts, config))
        assert all(torch.equal(a, b) for a, b in zip(back, parts)), row.source


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tokenizer_for_tests(tmp_path_factory.mktemp("tok") / "tokenizer.model")


def chunk(folder, tokenizer):
    noise = np.random.default_rng(3).standard_normal((10, 32)).astype(np.float32)
    images = [np.full((30, 40, 3), 77, np.uint8)] * 2
    policy = load_model(folder, device="cpu", hardware="reference", tokenizer=tokenizer)
    try:
        return policy.predict(images, "open the drawer", state=np.linspace(-1, 1, STATE_DIM), noise=noise)
    finally:
        policy.close()


def test_orbax_paths_ending_in_value_load_the_same(tmp_path, tokenizer):
    """Checkpoints saved during openpi training end every tree path in "value" (nnx.State)."""
    plain = write_layout(tmp_path / "plain", Layout.OPENPI_JAX, seed=5)
    suffixed = tmp_path / "suffixed"
    write_random_params(suffixed, get_config("pi05_tiny", state_dim=STATE_DIM, action_dim=ACTION_DIM), seed=5,
                        value_suffix=True)
    (suffixed / "assets").symlink_to(plain / "assets")
    np.testing.assert_array_equal(chunk(suffixed, tokenizer), chunk(plain, tokenizer))


def test_orbax_arrays_outside_the_table_are_refused_by_tree_path(tmp_path, tokenizer):
    """A LoRA adapter (openpi's *_lora variants) has no place in the model: named, never dropped silently."""
    import tensorstore as ts
    folder = write_layout(tmp_path / "lora", Layout.OPENPI_JAX, seed=5)
    kv = {"driver": "ocdbt", "base": {"driver": "file", "path": str(folder / PARAMS_DIR) + "/"}}
    lora = "params.PaliGemma.llm.layers.attn.q_einsum.lora_a/"
    extra = ts.open({"driver": "zarr", "kvstore": {**kv, "path": lora},
                     "dtype": "float32", "metadata": {"shape": [2, 4, 64, 16], "chunks": [2, 4, 64, 16]},
                     "create": True}).result()
    extra.write(np.zeros((2, 4, 64, 16), np.float32)).result()
    with pytest.raises(CheckpointError, match="1 unexpected: openpi:PaliGemma/llm/layers/attn/q_einsum/lora_a"):
        load_model(folder, config="pi05_tiny", device="cpu", tokenizer=tokenizer)


def test_orbax_without_tensorstore_says_how_to_install_it(tmp_path, monkeypatch, tokenizer):
    folder = write_layout(tmp_path / "jax", Layout.OPENPI_JAX, seed=5)
    monkeypatch.setitem(sys.modules, "tensorstore", None)
    with pytest.raises(CheckpointError, match=r"needs tensorstore.*pip install 'flashrt-ros\[orbax\]'"):
        load_model(folder, config="pi05_tiny", device="cpu", tokenizer=tokenizer)
