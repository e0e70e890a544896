"""Import NVIDIA Isaac-GR00T's N1.6 modules from a source checkout, for parity checks on random weights.

FLASHRT_GROOT_SOURCE names the checkout's root (the folder holding gr00t/, at a commit that still has
gr00t/model/gr00t_n1d6/, e.g. the one before the N1.7 release). Nothing is vendored: the modules are imported
from there. The package __init__ files that pull in training dependencies (tyro, the pipeline registry) are
not run: empty package modules with the right __path__ stand in for them, so `import gr00t.model.modules.dit`
and friends resolve to the checkout's files. The DiT needs diffusers and the model file needs dm-tree
(FLASHRT_GROOT_DEPS may name an extra folder for sys.path that holds them).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

SOURCE_ENV = "FLASHRT_GROOT_SOURCE"
DEPS_ENV = "FLASHRT_GROOT_DEPS"


def source_root() -> Path | None:
    raw = os.environ.get(SOURCE_ENV)
    if not raw:
        return None
    root = Path(raw)
    return root if (root / "gr00t" / "model" / "gr00t_n1d6" / "gr00t_n1d6.py").is_file() else None


def missing_reason() -> str | None:
    """Why the reference cannot be imported here, or None when it can."""
    if source_root() is None:
        return (f"{SOURCE_ENV} does not name an Isaac-GR00T checkout with gr00t/model/gr00t_n1d6 "
                f"(got {os.environ.get(SOURCE_ENV)!r})")
    _add_deps()
    for module, package in (("diffusers", "diffusers"), ("tree", "dm-tree")):
        try:
            importlib.import_module(module)
        except ImportError:
            return f"the reference's dependency {package} is not installed (or name a folder with {DEPS_ENV})"
    return None


def _add_deps() -> None:
    deps = os.environ.get(DEPS_ENV)
    if deps and deps not in sys.path:
        sys.path.append(deps)


def _package(name: str, path: Path) -> None:
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod


def import_reference():
    """-> namespace with the reference modules: n1d6 (gr00t_n1d6.py), dit, mlp (embodiment_conditioned_mlp)."""
    root = source_root()
    _add_deps()
    g = root / "gr00t"
    _package("gr00t", g)
    _package("gr00t.model", g / "model")
    _package("gr00t.model.modules", g / "model" / "modules")
    _package("gr00t.model.gr00t_n1d6", g / "model" / "gr00t_n1d6")
    _package("gr00t.configs", g / "configs")
    if "gr00t.configs.model" not in sys.modules:
        cfgpkg = types.ModuleType("gr00t.configs.model")
        cfgpkg.__path__ = [str(g / "configs" / "model")]
        cfgpkg.register_model_config = lambda shortname, configtype: None
        sys.modules["gr00t.configs.model"] = cfgpkg
    if "gr00t.configs.model.gr00t_n1d6" not in sys.modules:
        # The reference's Gr00tN1d6Config (a dataclass over PretrainedConfig) does not import under
        # transformers >= 5 (dataclass field order); the action head only reads attributes of its config, so a
        # registered stand-in class and a namespace of the fields (head_config) replace it.
        from transformers import PretrainedConfig

        stub = types.ModuleType("gr00t.configs.model.gr00t_n1d6")
        stub.Gr00tN1d6Config = type("Gr00tN1d6Config", (PretrainedConfig,), {"model_type": "Gr00tN1d6"})
        sys.modules["gr00t.configs.model.gr00t_n1d6"] = stub
    ns = types.SimpleNamespace()
    ns.dit = importlib.import_module("gr00t.model.modules.dit")
    ns.mlp = importlib.import_module("gr00t.model.modules.embodiment_conditioned_mlp")
    ns.n1d6 = importlib.import_module("gr00t.model.gr00t_n1d6.gr00t_n1d6")
    return ns


def head_config(checkpoint_json: dict):
    """The attributes Gr00tN1d6ActionHead reads, from a checkpoint's config.json (inference settings)."""
    fields = dict(checkpoint_json)
    fields.update(state_dropout_prob=0.0, state_additive_noise_scale=0.0, noise_beta_alpha=1.5, noise_beta_beta=1.0,
                  noise_s=0.999, tune_projector=False, tune_diffusion_model=False, tune_vlln=False)
    return types.SimpleNamespace(**fields)


EAGLE_DIR = ("gr00t", "model", "modules", "nvidia", "Eagle-Block2A-2B-v2")


def eagle_model(cfg):
    """The reference Eagle3_VLForConditionalGeneration at the sizes of a GrootConfig, on the CPU.

    Its constructor forces flash-attention 2 (absent on the CPU), so the SigLIP2 vision model (the checkout's
    modeling_siglip2.py) and the Qwen3ForCausalLM are built with eager attention and handed in; eager attention
    runs over all images of a call as one sequence, which equals the flash-attention packing for one image.
    peft (LoRA wrapping only) is replaced by an empty module; two classes its weight init names but does not
    define are stood in for (the weights are overwritten by the checkpoint's anyway).
    """
    root = source_root()
    _add_deps()
    if "peft" not in sys.modules:
        try:
            importlib.import_module("peft")
        except ImportError:
            peft = types.ModuleType("peft")
            peft.LoraConfig = object
            peft.get_peft_model = lambda *args, **kwargs: None
            sys.modules["peft"] = peft
    _package("gr00t_eagle_reference", root.joinpath(*EAGLE_DIR))
    config_mod = importlib.import_module("gr00t_eagle_reference.configuration_eagle3_vl")
    siglip2 = importlib.import_module("gr00t_eagle_reference.modeling_siglip2")
    eagle = importlib.import_module("gr00t_eagle_reference.modeling_eagle3_vl")
    for name in ("Siglip2Model", "Siglip2ForImageClassification"):
        if not hasattr(siglip2, name):
            setattr(siglip2, name, type(name, (), {}))
    v, q = cfg.vision, cfg.llm
    econf = config_mod.Eagle3_VLConfig(
        vision_config=dict(model_type="siglip2_vision_model", hidden_size=v.width, intermediate_size=v.mlp_dim,
                           num_hidden_layers=v.depth, num_attention_heads=v.num_heads, num_channels=3,
                           num_patches=v.num_positions, patch_size=v.patch_size, hidden_act="gelu_pytorch_tanh",
                           layer_norm_eps=v.eps, use_rope=False, use_windows_attn=False, window_size=14,
                           full_attention_indexes=[7, 14, 21, 26]),
        text_config=dict(architectures=["Qwen3ForCausalLM"], vocab_size=q.vocab_size, hidden_size=q.width,
                         intermediate_size=q.mlp_dim, num_hidden_layers=q.num_layers, num_attention_heads=q.num_heads,
                         num_key_value_heads=q.num_kv_heads, head_dim=q.head_dim, rms_norm_eps=q.eps,
                         rope_theta=q.rope_theta, tie_word_embeddings=True, max_position_embeddings=40960),
        select_layer=-1, downsample_ratio=cfg.downsample_ratio, image_token_index=cfg.image_token_index)
    econf.vision_config._attn_implementation = "eager"
    econf.text_config._attn_implementation = "eager"
    from transformers import Qwen3ForCausalLM
    vision = siglip2.Siglip2VisionModel(econf.vision_config)
    language = Qwen3ForCausalLM(econf.text_config)
    return eagle.Eagle3_VLForConditionalGeneration(econf, vision_model=vision, language_model=language)


def state_action_processor_class():
    """The reference's StateActionProcessor (gr00t/data/state_action; needs scipy), or None with the reason."""
    reason = missing_reason()
    if reason is not None:
        return None, reason
    try:
        importlib.import_module("scipy")
    except ImportError:
        return None, f"the reference's dependency scipy is not installed (or name a folder with {DEPS_ENV})"
    import_reference()
    g = source_root() / "gr00t"
    _package("gr00t.data", g / "data")
    _package("gr00t.data.state_action", g / "data" / "state_action")
    _package("gr00t.configs.data", g / "configs" / "data")
    module = importlib.import_module("gr00t.data.state_action.state_action_processor")
    return module.StateActionProcessor, None


def eagle_fetch_image():
    """The reference's Eagle fetch_image (smart_resize + PIL resize), or None with the reason.

    processing_eagle3_vl.py imports dataset and video readers (lmdb, torchvision, OpenCV) at module level, none of
    which fetch_image uses: its functions and constants are taken out of the checkout's file (ast) and run in a
    namespace of their own, so nothing is stubbed in sys.modules."""
    import ast
    import base64
    import math
    from io import BytesIO
    from typing import Literal

    from PIL import Image
    reason = missing_reason()
    if reason is not None:
        return None, reason
    path = source_root().joinpath(*EAGLE_DIR, "processing_eagle3_vl.py")
    tree = ast.parse(path.read_text())
    functions = {"adjust_by_factor", "to_rgb", "smart_resize", "fetch_image"}
    constants = {"IMAGE_FACTOR", "MIN_PIXELS", "MAX_PIXELS", "MAX_RATIO", "IMAGE_MAX_SIZE"}
    body = [node for node in tree.body
            if (isinstance(node, ast.FunctionDef) and node.name in functions)
            or (isinstance(node, ast.Assign) and {getattr(t, "id", None) for t in node.targets} <= constants)]
    found = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    if found != functions:
        return None, f"{path} lacks {sorted(functions - found)}"
    namespace = {"math": math, "Image": Image, "BytesIO": BytesIO, "base64": base64, "Literal": Literal}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["fetch_image"], None
