"""GR00T N1.6 against NVIDIA's reference source on the same random tiny weights (CPU, fp32), stage by stage:
the embodiment encoders, one DiT evaluation, the whole action chunk (pinned noise), and the backbone features.

Runs where FLASHRT_GROOT_SOURCE names an Isaac-GR00T checkout with gr00t/model/gr00t_n1d6 and its
dependencies diffusers and dm-tree import (FLASHRT_GROOT_DEPS may add a folder holding them); skips otherwise
with the reason (groot_reference.py).
"""

import pytest
import torch

import groot_reference
from flashrt_core.groot_checkpoint import load_state_dict
from flashrt_core.groot_fixtures import write_random_groot_checkpoint
from flashrt_core.model.groot.config import get_groot_config, to_checkpoint_json
from flashrt_core.model.groot.model import GrootModel
from flashrt_core.model.groot.sampler import sample_actions

pytestmark = pytest.mark.skipif(groot_reference.missing_reason() is not None,
                                reason=str(groot_reference.missing_reason()))
TINY = "groot_n1.6_tiny"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(ours, reference action head, config), both holding the fixture checkpoint's tensors."""
    cfg = get_groot_config(TINY)
    ckpt = write_random_groot_checkpoint(tmp_path_factory.mktemp("parity") / "c", TINY, seed=11)
    weights = load_state_dict(ckpt, cfg)
    ours = GrootModel(cfg).eval()
    ours.load_state_dict(weights, strict=True)
    ref = groot_reference.import_reference()
    head = ref.n1d6.Gr00tN1d6ActionHead(groot_reference.head_config(to_checkpoint_json(cfg))).eval()
    prefix = "action_head."
    head.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}, strict=True)
    return ours, head, cfg, ref


def inputs(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq = 12
    feats = torch.randn(1, seq, cfg.backbone_embedding_dim, generator=g)
    image_mask = torch.zeros(1, seq, dtype=torch.bool)
    image_mask[0, 3:3 + 8] = True
    attention = torch.ones(1, seq, dtype=torch.bool)
    state = torch.randn(1, 1, cfg.max_state_dim, generator=g)
    return feats, image_mask, attention, state, torch.tensor([10])


def backbone_output(ref, feats, image_mask, attention):
    from transformers.feature_extraction_utils import BatchFeature
    return BatchFeature(data={"backbone_features": feats.clone(), "backbone_attention_mask": attention,
                              "image_mask": image_mask})


@torch.no_grad()
def test_encoders(pair):
    ours, head, cfg, _ = pair
    feats, image_mask, attention, state, emb = inputs(cfg)
    torch.testing.assert_close(ours.action_head.state_encoder(state, emb), head.state_encoder(state, emb))
    actions = torch.randn(1, cfg.action_horizon, cfg.max_action_dim)
    t = torch.tensor([500])
    torch.testing.assert_close(ours.action_head.action_encoder(actions, t, emb), head.action_encoder(actions, t, emb))
    torch.testing.assert_close(ours.action_head.vlln(feats), head.vlln(feats))


@torch.no_grad()
@pytest.mark.parametrize("bucket", [0, 750])
def test_one_dit_step(pair, bucket):
    ours, head, cfg, _ = pair
    feats, image_mask, attention, state, emb = inputs(cfg, seed=1)
    sa = torch.randn(1, 1 + cfg.action_horizon, cfg.input_embedding_dim)
    t = torch.tensor([bucket])
    ref = head.model(hidden_states=sa, encoder_hidden_states=feats, timestep=t, image_mask=image_mask,
                     backbone_attention_mask=attention)
    mine = ours.action_head.model(sa, feats, t, image_mask=image_mask, attention_mask=attention)
    assert ref.shape == mine.shape == (1, 1 + cfg.action_horizon, cfg.hidden_size)
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_chunk_with_pinned_noise(pair):
    ours, head, cfg, ref_ns = pair
    feats, image_mask, attention, state, emb = inputs(cfg, seed=2)
    from transformers.feature_extraction_utils import BatchFeature
    torch.manual_seed(123)
    ref = head.get_action(backbone_output(ref_ns, feats, image_mask, attention),
                          BatchFeature(data={"state": state, "embodiment_id": emb}))["action_pred"]
    torch.manual_seed(123)       # the reference's first draw is its initial noise
    noise = torch.randn(1, cfg.action_horizon, cfg.max_action_dim)
    mine = sample_actions(ours.action_head, feats, attention, image_mask, state, emb, noise)
    assert mine.shape == (1, 16, cfg.max_action_dim)
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
    assert float((mine - noise).abs().max()) > 1e-2            # the flow moved the noise


@pytest.fixture(scope="module")
def eagle_pair(tmp_path_factory):
    cfg = get_groot_config(TINY)
    ckpt = write_random_groot_checkpoint(tmp_path_factory.mktemp("eagle") / "c", TINY, seed=12)
    weights = load_state_dict(ckpt, cfg)
    ours = GrootModel(cfg).eval()
    ours.load_state_dict(weights, strict=True)
    ref = groot_reference.eagle_model(cfg).eval()
    prefix = "backbone.model."
    result = ref.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)},
                                 strict=False)
    # what the reference holds beyond the checkpoint's loaded tensors: the unused pooling head and tied lm_head
    assert all(k.startswith("vision_model.vision_model.head.") or k == "language_model.lm_head.weight"
               for k in result.missing_keys), result.missing_keys
    assert not result.unexpected_keys
    # EagleBackbone keeps the LLM's first select_layer layers (the fixture's LLM has exactly those)
    assert len(ref.language_model.model.layers) == cfg.llm.num_layers
    return ours, ref, cfg


def one_view(cfg, seed=0, hw=(56, 56)):
    g = torch.Generator().manual_seed(seed)
    pixels = torch.rand(1, 3, *hw, generator=g) * 2 - 1
    text = torch.randint(0, 100, (7,), generator=g)
    n = cfg.image_tokens(*hw)
    ids = torch.cat([text[:4], torch.full((n,), cfg.image_token_index), text[4:]])[None]
    return pixels, ids, torch.ones_like(ids)


@torch.no_grad()
@pytest.mark.parametrize("hw", [(56, 56), (56, 84), (84, 56)])
def test_image_tokens(eagle_pair, hw):
    """Square and non-square views: the 4 x 4 position grid resized to the image's patch grid."""
    ours, ref, cfg = eagle_pair
    pixels, _, _ = one_view(cfg, hw=hw)
    mine = ours.backbone.model.image_features(pixels)[0]
    theirs = ref.extract_feature([pixels])
    assert mine.shape == theirs.shape == (cfg.image_tokens(*hw), cfg.llm.width)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_backbone_features(eagle_pair):
    """EagleBackbone.forward: the last of the LLM's hidden states (after its final norm) with the prompt's image
    slots holding the projected image tokens."""
    ours, ref, cfg = eagle_pair
    pixels, ids, mask = one_view(cfg, seed=1, hw=(56, 84))
    theirs = ref(pixel_values=[pixels], input_ids=ids, attention_mask=mask, output_hidden_states=True)
    theirs = theirs["hidden_states"][-1]
    feats, valid, image_mask = ours.backbone(pixels, ids, mask)
    assert feats.shape == theirs.shape == (1, ids.shape[1], cfg.llm.width)
    torch.testing.assert_close(feats, theirs, rtol=1e-5, atol=1e-5)
    assert image_mask.sum() == cfg.image_tokens(56, 84) and bool(valid.all())


def test_prompt_matches_eagles_chat_template():
    """The prompt string is Eagle's chat template (chat_template.json of the checkout) with each <image-k>
    expanded as Eagle3_VLProcessor.replace_media_placeholder does, and the real Qwen3 tokenizer maps every
    <IMG_CONTEXT> to image_token_index 151669."""
    import json

    from jinja2 import Template

    from flashrt_core.groot_inputs import IMAGE_CONTEXT, GrootTokenizer, prompt_ids, prompt_text
    eagle_dir = groot_reference.source_root().joinpath(*groot_reference.EAGLE_DIR)
    template = json.loads((eagle_dir / "chat_template.json").read_text())["chat_template"]
    counts = [81, 108]
    conversation = [{"role": "user", "content": [{"type": "text", "text": "pick up the cube"},
                                                 *[{"type": "image", "image": None} for _ in counts]]}]
    text = Template(template).render(messages=conversation, add_generation_prompt=False, add_vision_id=False)
    for k, n in enumerate(counts):
        text = text.replace(f"<image-{k + 1}>", f"<image {k + 1}><img>{IMAGE_CONTEXT * n}</img>")
    assert prompt_text("Pick up the cube!", counts) == text
    cfg = get_groot_config("groot_n1.6")
    ids = prompt_ids(GrootTokenizer(eagle_dir), cfg, "Pick up the cube!", counts)
    assert int((ids == 151669).sum()) == sum(counts) and cfg.image_token_index == 151669


def test_released_layout_is_the_references_module_tree(monkeypatch):
    """At the released sizes (the checkout's Eagle config.json and Gr00tN1d6Config defaults, built on the meta
    device), the reference's backbone and action head hold exactly weight_table("groot_n1.6")'s tensors,
    apart from the unused vision pooling head and tied lm_head, and the LLM truncated at select_layer."""
    import json

    from flashrt_core.groot_checkpoint import is_known_unused, weight_table
    cfg = get_groot_config("groot_n1.6")
    table = weight_table(cfg)
    ref = groot_reference.import_reference()
    monkeypatch.setattr(ref.n1d6, "Beta", lambda *args: None)   # the training-time sampler of t: not on meta
    with torch.device("meta"):
        head = ref.n1d6.Gr00tN1d6ActionHead(groot_reference.head_config(to_checkpoint_json(cfg)))
    ours_head = {k[len("action_head."):]: v for k, v in table.items() if k.startswith("action_head.")}
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == ours_head
    eagle_cfg = json.loads(groot_reference.source_root().joinpath(*groot_reference.EAGLE_DIR, "config.json")
                           .read_text())
    assert eagle_cfg["image_token_index"] == cfg.image_token_index
    v, t = eagle_cfg["vision_config"], eagle_cfg["text_config"]
    assert (v["hidden_size"], v["num_hidden_layers"], v["num_attention_heads"], v["intermediate_size"],
            v["patch_size"], v["num_patches"]) == (cfg.vision.width, cfg.vision.depth, cfg.vision.num_heads,
                                                    cfg.vision.mlp_dim, cfg.vision.patch_size, cfg.vision.num_positions)
    assert (t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"],
            t["intermediate_size"], t["vocab_size"]) == (cfg.llm.width, cfg.llm.num_heads, cfg.llm.num_kv_heads,
                                                         cfg.llm.head_dim, cfg.llm.mlp_dim, cfg.llm.vocab_size)
    with torch.device("meta"):
        eagle = groot_reference.eagle_model(cfg)
    held = {"backbone.model." + k: tuple(p.shape) for k, p in eagle.state_dict().items()}
    ours_backbone = {k: s for k, s in table.items() if k.startswith("backbone.")}
    assert {k: s for k, s in held.items() if not is_known_unused(k, cfg)} == ours_backbone


@torch.no_grad()
def test_whole_model_with_pinned_noise(tmp_path):
    """Backbone then action head, the reference's EagleBackbone.forward + Gr00tN1d6ActionHead.get_action against
    GrootModel.predict_normalized, one view, one checkpoint, the same initial noise."""
    from transformers.feature_extraction_utils import BatchFeature
    cfg = get_groot_config(TINY)
    ckpt = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=13)
    weights = load_state_dict(ckpt, cfg)
    ours = GrootModel(cfg).eval()
    ours.load_state_dict(weights, strict=True)
    ref = groot_reference.import_reference()
    head = ref.n1d6.Gr00tN1d6ActionHead(groot_reference.head_config(to_checkpoint_json(cfg))).eval()
    head.load_state_dict({k[12:]: v for k, v in weights.items() if k.startswith("action_head.")}, strict=True)
    eagle = groot_reference.eagle_model(cfg).eval()
    eagle.load_state_dict({k[15:]: v for k, v in weights.items() if k.startswith("backbone.model.")}, strict=False)
    pixels, ids, mask = one_view(cfg, seed=3, hw=(84, 56))
    state = torch.randn(1, 1, cfg.max_state_dim, generator=torch.Generator().manual_seed(4))
    emb = torch.tensor([10])
    feats = eagle(pixel_values=[pixels], input_ids=ids, attention_mask=mask, output_hidden_states=True)
    backbone = BatchFeature(data={"backbone_features": feats["hidden_states"][-1],
                                  "backbone_attention_mask": mask == 1,
                                  "image_mask": ids == eagle.config.image_token_index})
    torch.manual_seed(321)
    theirs = head.get_action(backbone, BatchFeature(data={"state": state, "embodiment_id": emb}))["action_pred"]
    torch.manual_seed(321)
    noise = torch.randn(1, cfg.action_horizon, cfg.max_action_dim)
    mine = ours.predict_normalized([pixels[0]], ids, mask, state, emb, noise)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_views_of_different_sizes_attend_to_themselves(eagle_pair):
    """Several views in one call: each view's tokens are the reference's for that view alone (its flash-attention
    packing keeps views apart), in prompt order, whatever their sizes."""
    ours, ref, cfg = eagle_pair
    views = [one_view(cfg, seed=s, hw=hw)[0][0] for s, hw in ((5, (56, 84)), (6, (56, 56)), (7, (56, 84)))]
    mine = ours.backbone.model.all_image_tokens(views, torch.float32)
    theirs = torch.cat([ref.extract_feature([v[None]]) for v in views])
    assert mine.shape == (6 + 4 + 6, cfg.llm.width)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
