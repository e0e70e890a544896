"""openpi JAX checkpoints: <ckpt>/params/ in Orbax's layout, read on the CPU with tensorstore (no JAX, no orbax).

Orbax (PyTreeCheckpointHandler) keeps every array of the params tree as a zarr array (v2 `.zarray`, or v3
`zarr.json`) named by its tree path joined with "." ("params.PaliGemma.llm.layers.attn.q_einsum.w"), inside one
OCDBT key-value store (params/manifest.ocdbt) or, in older checkpoints, as plain folders of params/. Checkpoints
saved during openpi training end every path in "value" (nnx.State); openpi's restore_params drops it, and so
does this reader. tensorstore lists the store, so _METADATA is not needed.

ORBAX_TABLE maps openpi's tree (src/openpi/models/pi0.py, gemma.py, siglip.py; the conversion of
examples/convert_jax_model_to_pytorch.py) onto checkpoint.WEIGHT_TABLE's names, one row per source array:
  PaliGemma/img/...                    SigLIP; encoderblock arrays are scanned (leading layer axis)
  PaliGemma/llm/embedder, final_norm    Gemma 2B embedding and final norm
  PaliGemma/llm/layers/{attn,mlp,pre_attention_norm,pre_ffw_norm}/...     the backbone's scanned layers
  PaliGemma/llm/layers/{attn/*_1,mlp_1,pre_*_norm_1}/..., final_norm_1   the action expert (pi0.5: Dense_0
                                        adaRMS modulation in place of the norm scales)
  action_in_proj, action_out_proj, state_proj / action_time_mlp_*, time_mlp_*   the projections (Dense: kernel
                                        [in, out], bias)
Each row's `split` turns the source array (one layer of it for scanned arrays) into its torch tensors
(transposes and reshapes, exact), and `join` is its inverse (the fixture writer). Source arrays the table does
not know (LoRA adapters, for one) are reported as unexpected by checkpoint.match_tensors, under their tree path.

OrbaxTensors holds the last source array read, whole: each is read once (the table's rows come layer by layer
of one source), and the peak memory is the largest source array (the backbone's gating_einsum, 2.4 GB in bf16).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from flashrt_core.checkpoint import EXPERT, LANGUAGE, PALIGEMMA, VISION, weight_spec
from flashrt_core.config import ModelConfig, get_config
from flashrt_core.errors import CheckpointError

PARAMS_DIR = "params"
OCDBT_MANIFEST = "manifest.ocdbt"
ORBAX_METADATA = "_METADATA"
TREE_ROOT = "params"
NNX_VALUE = "value"
ZARR_METADATA = (".zarray", "zarr.json")  # zarr v2, v3
INSTALL_TENSORSTORE = ("tensorstore, which reads Orbax checkpoints: `pip install 'flashrt-ros[orbax]'` (or "
                       "`pip install tensorstore`)")
_TORCH_OF_NUMPY = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Split = Callable[[torch.Tensor], list[torch.Tensor]]
Join = Callable[[list[torch.Tensor], ModelConfig], torch.Tensor]


@dataclass(frozen=True)
class OrbaxRow:
    """One source array of openpi's tree -> WEIGHT_TABLE names ("{i}": the layer of a scanned array)."""

    source: str  # tree path below "params", "/"-separated
    targets: tuple[str, ...]
    split: Split
    join: Join
    layers_of: str | None = None  # "vision" | "paligemma" | "expert": scanned over that stack's depth


def _same(x):
    return [x]


def _kernel(x):                      # Dense kernel [in, out] -> Linear weight [out, in]
    return [x.T]


def _kernel_back(parts, cfg):
    return parts[0].T


def _as_is(parts, cfg):
    return parts[0]


def _heads(stack: str) -> Callable[[ModelConfig], tuple[int, int]]:
    """(heads, head_dim) of a stack."""
    if stack == "vision":
        return lambda c: (c.vision.num_heads, c.vision.head_dim)
    gemma = (lambda c: c.paligemma) if stack == "paligemma" else (lambda c: c.expert)
    return lambda c: (gemma(c).num_heads, gemma(c).head_dim)


def _linear_rows(source: str, target: str, layers_of: str | None = None) -> list[OrbaxRow]:
    return [OrbaxRow(f"{source}/kernel", (f"{target}.weight",), _kernel, _kernel_back, layers_of),
            OrbaxRow(f"{source}/bias", (f"{target}.bias",), _same, _as_is, layers_of)]


def _vision_rows() -> list[OrbaxRow]:
    img, block, layer = "PaliGemma/img", "PaliGemma/img/Transformer/encoderblock", VISION + "encoder.layers.{i}."
    heads = _heads("vision")
    rows = [
        # patch kernel [kh, kw, c_in, c_out] -> conv weight [c_out, c_in, kh, kw]
        OrbaxRow(f"{img}/embedding/kernel", (VISION + "embeddings.patch_embedding.weight",),
                 lambda x: [x.permute(3, 2, 0, 1)], lambda p, c: p[0].permute(2, 3, 1, 0)),
        OrbaxRow(f"{img}/embedding/bias", (VISION + "embeddings.patch_embedding.bias",), _same, _as_is),
        # [1, patches, width] -> [patches, width]
        OrbaxRow(f"{img}/pos_embedding", (VISION + "embeddings.position_embedding.weight",),
                 lambda x: [x.reshape(-1, x.shape[-1])], lambda p, c: p[0][None]),
    ]
    for norm, ours in (("LayerNorm_0", "layer_norm1"), ("LayerNorm_1", "layer_norm2")):
        rows += [OrbaxRow(f"{block}/{norm}/scale", (layer + ours + ".weight",), _same, _as_is, "vision"),
                 OrbaxRow(f"{block}/{norm}/bias", (layer + ours + ".bias",), _same, _as_is, "vision")]
    rows += _linear_rows(f"{block}/MlpBlock_0/Dense_0", layer + "mlp.fc1", "vision")
    rows += _linear_rows(f"{block}/MlpBlock_0/Dense_1", layer + "mlp.fc2", "vision")
    attention = f"{block}/MultiHeadDotProductAttention_0"
    for theirs, ours in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        rows += [  # kernel [width, heads, head_dim] -> [heads * head_dim, width]; bias [heads, head_dim]
            OrbaxRow(f"{attention}/{theirs}/kernel", (f"{layer}self_attn.{ours}.weight",),
                     lambda x: [x.reshape(x.shape[0], -1).T],
                     lambda p, c: p[0].T.reshape(p[0].shape[1], *heads(c)), "vision"),
            OrbaxRow(f"{attention}/{theirs}/bias", (f"{layer}self_attn.{ours}.bias",),
                     lambda x: [x.reshape(-1)], lambda p, c: p[0].reshape(*heads(c)), "vision")]
    rows += [  # out kernel [heads, head_dim, width] -> [width, heads * head_dim]
        OrbaxRow(f"{attention}/out/kernel", (f"{layer}self_attn.out_proj.weight",),
                 lambda x: [x.reshape(-1, x.shape[-1]).T], lambda p, c: p[0].T.reshape(*heads(c), -1), "vision"),
        OrbaxRow(f"{attention}/out/bias", (f"{layer}self_attn.out_proj.bias",), _same, _as_is, "vision")]
    for theirs, ours in (("scale", "weight"), ("bias", "bias")):
        rows.append(OrbaxRow(f"{img}/Transformer/encoder_norm/{theirs}", (f"{VISION}post_layernorm.{ours}",),
                             _same, _as_is))
    rows += _linear_rows(f"{img}/head", PALIGEMMA + "model.multi_modal_projector.linear")
    return rows


def _gemma_rows(suffix: str, prefix: str, stack: str, adaptive: bool) -> list[OrbaxRow]:
    """One Gemma stack's scanned layers and final norm; suffix "" is the backbone, "_1" the action expert."""
    llm, layer = "PaliGemma/llm", prefix + "layers.{i}."
    heads = _heads(stack)
    rows = [
        # q_einsum [heads, width, head_dim] -> [heads * head_dim, width]
        OrbaxRow(f"{llm}/layers/attn/q_einsum{suffix}/w", (layer + "self_attn.q_proj.weight",),
                 lambda x: [x.permute(0, 2, 1).reshape(-1, x.shape[1])],
                 lambda p, c: p[0].reshape(*heads(c), -1).permute(0, 2, 1), stack),
        # kv_einsum [2, kv_heads, width, head_dim] -> k, v [kv_heads * head_dim, width]
        OrbaxRow(f"{llm}/layers/attn/kv_einsum{suffix}/w", (layer + "self_attn.k_proj.weight",
                                                             layer + "self_attn.v_proj.weight"),
                 lambda x: [x[j].permute(0, 2, 1).reshape(-1, x.shape[2]) for j in (0, 1)],
                 lambda p, c: torch.stack([t.reshape(-1, heads(c)[1], t.shape[1]).permute(0, 2, 1) for t in p]),
                 stack),
        # attn_vec_einsum [heads, head_dim, width] -> o_proj [width, heads * head_dim]
        OrbaxRow(f"{llm}/layers/attn/attn_vec_einsum{suffix}/w", (layer + "self_attn.o_proj.weight",),
                 lambda x: [x.reshape(-1, x.shape[-1]).T], lambda p, c: p[0].T.reshape(*heads(c), -1), stack),
        # gating_einsum [2, width, mlp] -> gate, up [mlp, width]
        OrbaxRow(f"{llm}/layers/mlp{suffix}/gating_einsum",
                 (layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"),
                 lambda x: [x[0].T, x[1].T], lambda p, c: torch.stack([p[0].T, p[1].T]), stack),
        # linear [mlp, width] -> down [width, mlp]
        OrbaxRow(f"{llm}/layers/mlp{suffix}/linear", (layer + "mlp.down_proj.weight",), _kernel, _kernel_back, stack),
    ]
    norms = ((f"{llm}/layers/pre_attention_norm{suffix}", layer + "input_layernorm", stack),
             (f"{llm}/layers/pre_ffw_norm{suffix}", layer + "post_attention_layernorm", stack),
             (f"{llm}/final_norm{suffix}", prefix + "norm", None))
    for source, target, layers_of in norms:
        if adaptive:  # adaRMS: Dense(width -> 3 * width) of the time condition
            rows += _linear_rows(f"{source}/Dense_0", f"{target}.dense", layers_of)
        else:
            rows.append(OrbaxRow(f"{source}/scale", (f"{target}.weight",), _same, _as_is, layers_of))
    return rows


def orbax_table(config: ModelConfig) -> tuple[OrbaxRow, ...]:
    """The rows of `config`'s model type (pi0.5: the expert's adaRMS norms and time_mlp; pi0: state_proj;
    pi0-FAST: no expert, no projections)."""
    pi05 = config.model_type == "pi05"
    rows = _vision_rows()
    rows.append(OrbaxRow("PaliGemma/llm/embedder/input_embedding", (LANGUAGE + "embed_tokens.weight",), _same, _as_is))
    rows += _gemma_rows("", LANGUAGE, "paligemma", adaptive=False)
    if config.model_type == "pi0fast":  # openpi's pi0_fast.py: PaliGemma/img and PaliGemma/llm alone (gemma_fast.py
        return tuple(rows)              # names its arrays as gemma.py names the backbone's)
    rows += _gemma_rows("_1", EXPERT, "expert", adaptive=pi05)
    projections = ["action_in_proj", "action_out_proj"]
    projections += ["time_mlp_in", "time_mlp_out"] if pi05 else ["state_proj", "action_time_mlp_in",
                                                                 "action_time_mlp_out"]
    for name in projections:
        rows += _linear_rows(name, name)
    return tuple(rows)


def is_orbax_checkpoint(directory: Path) -> bool:
    params = Path(directory) / PARAMS_DIR
    return (params / OCDBT_MANIFEST).is_file() or (params / ORBAX_METADATA).is_file()


def _tensorstore():
    try:
        import tensorstore
    except ModuleNotFoundError as exc:
        raise CheckpointError(f"reading an openpi Orbax checkpoint needs {INSTALL_TENSORSTORE}") from exc
    return tensorstore


def _kvstore(params: Path) -> dict:
    base = {"driver": "file", "path": str(params.resolve()) + "/"}
    return {"driver": "ocdbt", "base": base} if (params / OCDBT_MANIFEST).is_file() else base


def _to_torch(array: np.ndarray) -> torch.Tensor:
    if array.dtype.name == "bfloat16":                       # ml_dtypes' bfloat16: same bits as torch's
        return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    if array.dtype.name not in _TORCH_OF_NUMPY:
        raise CheckpointError(f"unsupported dtype {array.dtype} in an Orbax checkpoint")
    return torch.from_numpy(np.ascontiguousarray(array))


class OrbaxTensors:
    """An openpi Orbax params/ tree as checkpoint tensors (the interface of checkpoint.SafetensorsTensors), named
    by WEIGHT_TABLE; the model type (which rows apply) is told by the tree itself (time_mlp_in: pi0.5)."""

    def __init__(self, checkpoint_dir: str | Path):
        self.ts = _tensorstore()
        params = Path(checkpoint_dir) / PARAMS_DIR
        self.path = params
        self._kv = _kvstore(params)
        try:
            keys = [k.decode() for k in self.ts.KvStore.open(self._kv).result().list().result()]
        except Exception as exc:  # tensorstore raises ValueError / its own errors for a damaged store
            raise CheckpointError(f"cannot read the Orbax store {params}: {exc}") from exc
        stored = sorted({k.rsplit("/", 1)[0] for k in keys if k.rsplit("/", 1)[-1] in ZARR_METADATA})
        if not stored:
            raise CheckpointError(f"{params} holds no arrays (no zarr metadata among {len(keys)} keys)")
        self._zarr = "zarr3" if any(k.endswith("/zarr.json") for k in keys) else "zarr"
        value_suffix = all(name.endswith("." + NNX_VALUE) for name in stored)
        tree = {}
        for name in stored:
            parts = name.split(".")
            parts = parts[1:] if parts[0] == TREE_ROOT else parts
            parts = parts[:-1] if value_suffix else parts
            tree["/".join(parts)] = name
        self._arrays: dict[str, object] = {}
        pi05 = "time_mlp_in/kernel" in tree
        self._names: dict[str, tuple[OrbaxRow, int | None, int]] = {}       # WEIGHT_TABLE name -> where
        known = set()
        for row in orbax_table(get_config("pi05" if pi05 else "pi0")):     # the rows of the tree's model type
            if row.source not in tree:
                continue
            known.add(row.source)
            depth = self._array(tree[row.source]).shape[0] if row.layers_of else None
            for i in range(depth) if depth is not None else [None]:
                for part, target in enumerate(row.targets):
                    self._names[target.format(i=i) if i is not None else target] = (row, i, part)
        self._sources = tree
        # arrays the table does not know, named by their tree path: checkpoint.match_tensors lists them as unexpected
        self._unknown = {f"openpi:{source}": source for source in sorted(set(tree) - known)}
        self._cached: tuple[str, torch.Tensor] | None = None

    def _array(self, stored: str):
        if stored not in self._arrays:
            spec = {"driver": self._zarr, "kvstore": {**self._kv, "path": stored + "/"}}
            try:
                self._arrays[stored] = self.ts.open(spec, read=True).result()
            except Exception as exc:
                raise CheckpointError(f"cannot open {stored} in {self.path}: {exc}") from exc
        return self._arrays[stored]

    def keys(self) -> list[str]:
        return [*self._names, *self._unknown]

    def _source_tensor(self, row: OrbaxRow, meta: bool) -> torch.Tensor:
        array = self._array(self._sources[row.source])
        if meta:
            return torch.empty(tuple(array.shape), device="meta")
        if self._cached is None or self._cached[0] != row.source:
            self._cached = None                                   # free the last one before reading the next
            self._cached = (row.source, _to_torch(array.read().result()))
        return self._cached[1]

    def _tensor(self, key: str, meta: bool) -> torch.Tensor:
        if key in self._unknown:
            return torch.empty(tuple(self._array(self._sources[self._unknown[key]]).shape), device="meta")
        row, layer, part = self._names[key]
        source = self._source_tensor(row, meta)
        return row.split(source[layer] if layer is not None else source)[part]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensor(key, meta=True).shape)

    def dtype(self, key: str) -> torch.dtype:
        source = self._unknown[key] if key in self._unknown else self._names[key][0].source
        name = self._array(self._sources[source]).dtype.name
        return _TORCH_OF_NUMPY.get(name, torch.float32)

    def get(self, key: str) -> torch.Tensor:
        if key in self._unknown:
            raise CheckpointError(f"{self._unknown[key]} of {self.path} has no place in the model")
        return self._tensor(key, meta=False).contiguous()

    def close(self) -> None:
        self._arrays.clear()
        self._cached = None

    def __enter__(self) -> OrbaxTensors:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def random_source_arrays(config: ModelConfig, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(openpi tree path "PaliGemma/llm/...", source array) pairs, one array at a time: fixtures.write_random_weights'
    tensors for `config` arranged as openpi's JAX model holds them (scanned layers, einsum kernels), in their
    dtypes."""
    from flashrt_core.fixtures import _random_tensor
    spec = weight_spec(config, torch.bfloat16)
    depth = {"vision": config.vision.depth, "paligemma": config.paligemma.depth, "expert": config.expert.depth}
    for row in orbax_table(config):
        def source_of(i):
            names = [t.format(i=i) if i is not None else t for t in row.targets]
            return row.join([_random_tensor(n, spec[n][0], seed).to(spec[n][1]) for n in names], config)
        layers = [source_of(i) for i in range(depth[row.layers_of])] if row.layers_of else [source_of(None)]
        yield row.source, (torch.stack(layers) if row.layers_of else layers[0]).contiguous()


def write_random_params(checkpoint_dir: str | Path, config: ModelConfig, seed: int,
                        value_suffix: bool = False) -> Path:
    """params/ in Orbax's OCDBT layout (zarr v2 arrays named by tree path, zstd, and a _METADATA tree record)
    holding random_source_arrays: the fixture of the openpi_jax layout. value_suffix: paths end in "value", as
    in checkpoints saved during openpi training. Returns the params directory."""
    import ml_dtypes  # tensorstore's dependency: numpy's bfloat16
    ts = _tensorstore()
    params = Path(checkpoint_dir) / PARAMS_DIR
    params.mkdir(parents=True, exist_ok=True)
    kv = {"driver": "ocdbt", "base": {"driver": "file", "path": str(params.resolve()) + "/"}}
    tree_metadata = {}
    for source, array in random_source_arrays(config, seed):
        path = [TREE_ROOT, *source.split("/")] + ([NNX_VALUE] if value_suffix else [])
        bf16 = array.dtype == torch.bfloat16
        data = array.view(torch.uint16).numpy().view(ml_dtypes.bfloat16) if bf16 else array.numpy()
        store = ts.open({"driver": "zarr", "kvstore": {**kv, "path": ".".join(path) + "/"},
                         "dtype": "bfloat16" if bf16 else "float32",
                         "metadata": {"shape": list(data.shape), "chunks": list(data.shape),
                                      "compressor": {"id": "zstd"}},
                         "create": True}).result()
        store.write(data).result()
        tree_metadata[str(tuple(path))] = {
            "key_metadata": [{"key": k, "key_type": 2} for k in path],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False,
                               "write_shape": list(data.shape)}}
    (params / ORBAX_METADATA).write_text(json.dumps({"tree_metadata": tree_metadata, "use_zarr3": False}))
    return params
