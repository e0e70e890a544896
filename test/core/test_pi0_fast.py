"""pi0-FAST end to end on tiny fixtures: load_model(config="pi0fast"...) + predict, the prompt, the checkpoint
layouts and name table, the FAST tokenizer's search and invalid outputs (the engine: test_pi0_fast_engine.py).

A random checkpoint decodes no action sequence, so the end-to-end tests plant one (pi0_fast_fixtures.
plant_output_tokens): greedy decoding through the real model writes "Action: ", the FAST tokens of a known chunk,
"|" and EOS, and predict must return that chunk unnormalized with the checkpoint's statistics."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import flashrt_core
from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import ModelType, get_config
from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.fast_tokenizer import ActionDecodeError, FastTokenizer, smooth_chunks
from flashrt_core.pi0_fast_fixtures import plant_output_tokens, write_random_fast_checkpoint
from flashrt_core.pi0_fast_policy import FAST_TOKENIZER_DIR, FastPolicy, fast_prompt
from flashrt_core.tokenizer import EOS_ID, PromptTokenizer

STATE_DIM, ACTION_DIM = 8, 7
IMAGES = [np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)]
STATE = np.linspace(-0.5, 0.7, STATE_DIM)
PROMPT = "Pick_up the RED cube"


def planted_chain(policy, seed=0):
    """A chunk whose output tokens are distinct (the planted chain needs that) and its FAST tokens."""
    for offset in range(200):
        chunk = smooth_chunks(1, policy.horizon, ACTION_DIM, seed=1000 + seed + offset)[0]
        fast_ids = policy.codec.fast.encode(chunk)
        out = policy.codec.output_tokens(fast_ids)
        if len(set(out)) == len(out):
            return chunk, fast_ids, out
    raise AssertionError("no chunk with distinct output tokens")


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    return write_random_fast_checkpoint(tmp_path_factory.mktemp("fast_random"), seed=1, state_dim=STATE_DIM,
                                        action_dim=ACTION_DIM)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    path = write_random_fast_checkpoint(tmp_path_factory.mktemp("fast_planted"), seed=2, state_dim=STATE_DIM,
                                        action_dim=ACTION_DIM)
    policy = flashrt_core.load_model(path, device="cpu")
    chunk, fast_ids, out = planted_chain(policy)
    last_prompt_token = policy.tokenizer.encode("\n", add_bos=False)[-1]
    plant_output_tokens(path, last_prompt_token, out)
    return path, fast_ids, out


def test_presets():
    for name in ("pi0fast", "pi0fast_tiny"):
        cfg = get_config(name)
        assert cfg.model_type is ModelType.PI0_FAST and cfg.fast is not None
        assert cfg.view_names == ("base_0_rgb", "base_1_rgb", "wrist_0_rgb")
    assert get_config("pi0fast").fast.max_decoding_steps == 256 and get_config("pi05").fast is None
    with pytest.raises(ValueError, match="must be a FastDecoding for pi0fast"):
        get_config("pi05", model_type="pi0fast")
    assert get_config("pi0fast_tiny", fast={"decode_position_offset": 0}).fast.decode_position_offset == 0


def test_predict_returns_the_planted_chunk_unnormalized(planted):
    path, fast_ids, out = planted
    policy = flashrt_core.load_model(path, device="cpu")
    assert isinstance(policy, FastPolicy) and policy.executor.name == "reference"
    actions = policy.predict(IMAGES, PROMPT, STATE)
    assert policy.last_tokens.tolist() == out
    normalized = policy.codec.fast.decode(fast_ids, policy.horizon, ACTION_DIM)
    expected = policy.normalizer.unnormalize_actions(normalized, ACTION_DIM)
    assert actions.shape == (policy.horizon, ACTION_DIM) and actions.dtype == np.float32
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(expected, normalized, atol=1e-3)  # the statistics were applied
    np.testing.assert_array_equal(policy.predict({"base_0_rgb": IMAGES[0]}, PROMPT, STATE, noise=None), actions)


def test_prompt_is_openpis_fast_prefix(random_dir):
    policy = flashrt_core.load_model(random_dir, device="cpu")
    tokens, mask, state = policy._encode_prompt_and_state(PROMPT, STATE)
    bins = flashrt_core.preprocess.discretize_state(policy.normalizer.normalize_state(STATE))
    text = "Task: pick up the red cube, State: " + " ".join(map(str, bins)) + ";\n"
    assert fast_prompt("pick up the red cube", bins) == text
    expected = policy.tokenizer.encode(text, add_bos=True)
    assert tokens[:mask.sum()].tolist() == expected and not tokens[mask.sum():].any() and state is None
    assert mask.sum() == len(expected) and policy.requires_state
    with pytest.raises(InputError, match="needs the robot state"):
        policy.predict(IMAGES, PROMPT, None)


def test_random_weights_give_a_named_decode_error(random_dir):
    policy = flashrt_core.load_model(random_dir, device="cpu")
    with pytest.raises(ActionDecodeError, match="no 'Action: ' marker"):
        policy.predict(IMAGES, PROMPT, STATE)
    assert len(policy.last_tokens) == policy.config.fast.max_decoding_steps  # no EOS: ran to the limit


def test_codec_extraction_rules(random_dir):
    policy = flashrt_core.load_model(random_dir, device="cpu")
    codec = policy.codec
    fast_ids = [0, 5, 17]
    out = codec.output_tokens(fast_ids)
    assert codec.to_paligemma(fast_ids) == [codec.vocab - 1 - 128 - t for t in fast_ids]
    assert codec.extract(out) == fast_ids
    assert codec.extract([9, 9] + out + [77, 78]) == fast_ids  # text before the marker, tokens after EOS
    assert codec.extract(out[:-2]) == fast_ids  # no "|" or EOS: up to the end
    with pytest.raises(ActionDecodeError, match="outside the FAST range"):
        codec.extract(codec.prefix_ids + [codec.vocab - 1])
    with pytest.raises(ActionDecodeError, match="no 'Action: ' marker"):
        codec.extract([EOS_ID] + out)


def test_truncated_output_is_refused_or_relaxed(tmp_path):
    path = write_random_fast_checkpoint(tmp_path, seed=3, state_dim=STATE_DIM, action_dim=ACTION_DIM)
    policy = flashrt_core.load_model(path, device="cpu")
    _, fast_ids, _ = planted_chain(policy, seed=7)
    short = fast_ids[:-3]
    out = policy.codec.output_tokens(short)
    plant_output_tokens(path, policy.tokenizer.encode("\n", add_bos=False)[-1], out)
    with pytest.raises(ActionDecodeError, match="DCT coefficients, expected 70"):
        flashrt_core.load_model(path, device="cpu").predict(IMAGES, PROMPT, STATE)
    relaxed = flashrt_core.load_model(path, config=get_config("pi0fast_tiny", state_dim=STATE_DIM,
                                                              action_dim=ACTION_DIM, fast={"relaxed_decoding": True}),
                                      device="cpu")
    actions = relaxed.predict(IMAGES, PROMPT, STATE)
    expected = relaxed.normalizer.unnormalize_actions(
        relaxed.codec.fast.decode(short, relaxed.horizon, ACTION_DIM, relaxed=True), ACTION_DIM)
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("prefix_model, drop_embed_tokens", [(False, False), (True, True)])
def test_layouts_load_the_same_weights(tmp_path, random_dir, prefix_model, drop_embed_tokens):
    cfg = get_config("pi0fast_tiny", state_dim=STATE_DIM, action_dim=ACTION_DIM)
    other = write_random_fast_checkpoint(tmp_path, seed=1, state_dim=STATE_DIM, action_dim=ACTION_DIM,
                                         prefix_model=prefix_model, drop_embed_tokens=drop_embed_tokens)
    names = load_file(other / "model.safetensors").keys()
    assert all(n.startswith("model.") == prefix_model for n in names)
    assert any(n.endswith("lm_head.weight") for n in names) == drop_embed_tokens
    a = load_model_weights(random_dir, cfg).state_dict()
    b = load_model_weights(other, cfg).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(k.startswith(("expert.", "action_")) for k in a)


def test_name_table_names_missing_and_unexpected_tensors(tmp_path):
    path = write_random_fast_checkpoint(tmp_path, seed=4, state_dim=STATE_DIM, action_dim=ACTION_DIM)
    cfg = get_config("pi0fast_tiny", state_dim=STATE_DIM, action_dim=ACTION_DIM)
    tensors = load_file(path / "model.safetensors")
    norm = "model.paligemma_with_expert.paligemma.model.language_model.norm.weight"
    tensors["model.action_in_proj.weight"] = torch.zeros(32, 32)
    del tensors[norm]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"1 missing: .*language_model\.norm\.weight; 1 unexpected: "
                                              r"model\.action_in_proj\.weight"):
        load_model_weights(path, cfg)


def test_fast_tokenizer_is_searched_and_a_missing_one_is_named(tmp_path, random_dir, monkeypatch):
    import shutil
    bare = tmp_path / "bare"
    shutil.copytree(random_dir, bare)
    shutil.move(bare / FAST_TOKENIZER_DIR, tmp_path / "elsewhere")
    monkeypatch.delenv("FLASHRT_FAST_TOKENIZER", raising=False)
    with pytest.raises(CheckpointError, match="FAST tokenizer not found.*physical-intelligence/fast"):
        flashrt_core.load_model(bare, device="cpu")
    monkeypatch.setenv("FLASHRT_FAST_TOKENIZER", str(tmp_path / "elsewhere"))
    assert flashrt_core.load_model(bare, device="cpu").codec.fast.source == str(tmp_path / "elsewhere")
    given = FastTokenizer.load(tmp_path / "elsewhere")
    assert flashrt_core.load_model(bare, device="cpu", fast_tokenizer=tmp_path / "elsewhere").codec.fast.vocab_size \
        == given.vocab_size


def test_fast_vocabulary_must_fit_below_the_skipped_ids(random_dir, tmp_path):
    small = PromptTokenizer(flashrt_core.pi0_fast_fixtures.fixtures.tokenizer.train_test_tokenizer(
        tmp_path / "small.model", vocab_size=512))
    with pytest.raises(CheckpointError, match="does not fit below the top 129 ids"):
        flashrt_core.load_model(random_dir, device="cpu", tokenizer=small)



def test_real_time_chunking_is_refused_naming_why(planted):
    path, _, _ = planted
    policy = flashrt_core.load_model(path, device="cpu")
    previous = np.zeros((policy.horizon, ACTION_DIM), np.float32)
    with pytest.raises(InputError, match="pi0-FAST decodes tokens and takes rtc=None"):
        policy.predict(IMAGES, PROMPT, STATE, rtc=flashrt_core.RtcRequest(previous, 2, "hard_prefix"))

def test_build_executor_points_pi0fast_to_its_own_executors():
    with pytest.raises(ValueError, match="pi0_fast_policy.fast_executor"):
        flashrt_core.api.build_executor(None, get_config("pi0fast_tiny"), torch.device("cpu"), "auto")


@pytest.mark.gpu
def test_cuda_bf16_predicts_the_planted_chunk(planted):
    path, fast_ids, out = planted
    policy = flashrt_core.load_model(path, device="cuda", dtype="bf16")
    actions = policy.predict(IMAGES, PROMPT, STATE)
    assert policy.last_tokens.tolist() == out
    cpu = flashrt_core.load_model(path, device="cpu").predict(IMAGES, PROMPT, STATE)
    np.testing.assert_allclose(actions, cpu, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_cuda_fp32_decodes_the_same_tokens_as_the_cpu(random_dir):
    cfg = get_config("pi0fast_tiny", state_dim=STATE_DIM, action_dim=ACTION_DIM)
    gen = torch.Generator().manual_seed(0)
    pixels = torch.rand(1, 3, 3, 224, 224, generator=gen) * 2 - 1
    inputs = (pixels, torch.ones(1, 3, dtype=torch.bool), torch.randint(5, 1000, (1, 30), generator=gen),
              torch.ones(1, 30, dtype=torch.bool))
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False   # the patch conv too
    try:
        with torch.no_grad():
            cpu = load_model_weights(random_dir, cfg, "cpu", torch.float32).generate(*inputs, 16, -1)
            gpu = load_model_weights(random_dir, cfg, "cuda", torch.float32).generate(*(t.cuda() for t in inputs),
                                                                                      16, -1)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    assert gpu.cpu().tolist() == cpu.tolist()


def test_openpi_orbax_params_load_the_same_weights_and_tell_pi0fast(tmp_path, random_dir):
    """openpi's pi0-FAST checkpoints are Orbax params/ (PaliGemma/img, PaliGemma/llm: the backbone's names);
    without a config the weights tell pi0-FAST and the preset they fit."""
    import shutil
    pytest.importorskip("tensorstore")
    from flashrt_core import orbax_params
    cfg = get_config("pi0fast_tiny", state_dim=STATE_DIM, action_dim=ACTION_DIM)
    orbax_dir = tmp_path / "pi0_fast_openpi"
    orbax_params.write_random_params(orbax_dir, cfg, seed=1)
    a = load_model_weights(random_dir, cfg).state_dict()
    b = load_model_weights(orbax_dir, cfg).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    (orbax_dir / "assets" / "robot").mkdir(parents=True)
    shutil.copy(random_dir / "norm_stats.json", orbax_dir / "assets" / "robot" / "norm_stats.json")
    shutil.copy(random_dir / "tokenizer.model", orbax_dir / "tokenizer.model")
    shutil.copytree(random_dir / FAST_TOKENIZER_DIR, orbax_dir / FAST_TOKENIZER_DIR)
    policy = flashrt_core.load_model(orbax_dir, device="cpu")
    assert isinstance(policy, FastPolicy) and policy.config.name == "pi0fast_tiny"
    assert (policy.state_dim, policy.action_dim) == (STATE_DIM, ACTION_DIM)


def test_flashrt_convert_keeps_the_fast_tokenizer_and_decoding_changes(planted, tmp_path):
    from flashrt_core.checkpoint_convert import main
    path, _, out = planted
    dst = tmp_path / "converted"
    assert main([str(path), str(dst), "--set", 'fast={"relaxed_decoding": true}']) == 0
    record = __import__("json").loads((dst / "flashrt_config.json").read_text())
    assert record["overrides"]["fast"] == {"relaxed_decoding": True}
    converted = flashrt_core.load_model(dst, device="cpu")
    assert converted.config.fast.relaxed_decoding and converted.config.fast.max_decoding_steps == 64
    original = flashrt_core.load_model(path, device="cpu").predict(IMAGES, PROMPT, STATE)
    np.testing.assert_array_equal(converted.predict(IMAGES, PROMPT, STATE), original)
    assert converted.last_tokens.tolist() == out


def test_flashrt_inspect_names_the_fast_tokenizer(random_dir, tmp_path, monkeypatch, capsys):
    import shutil
    from flashrt_core.checkpoint_inspect import main
    monkeypatch.delenv("FLASHRT_FAST_TOKENIZER", raising=False)
    assert main([str(random_dir)]) == 0
    assert f"FAST tokenizer {random_dir / FAST_TOKENIZER_DIR}" in capsys.readouterr().out
    bare = tmp_path / "bare"
    shutil.copytree(random_dir, bare, ignore=shutil.ignore_patterns(FAST_TOKENIZER_DIR))
    assert main([str(bare)]) == 1
    assert "FAST tokenizer not found" in capsys.readouterr().out


def test_lerobot_pi0_fast_folder_loads_with_its_prompt_style(tmp_path, random_dir):
    """lerobot's pi0_fast folder: config.json type "pi0_fast" gives the preset, its decoding fields, z-score
    statistics and lerobot's prompt (instruction as given, BOS after it, contiguous positions)."""
    from flashrt_core.checkpoint_layout import Layout, detect_layout
    path = write_random_fast_checkpoint(tmp_path / "lerobot", seed=6, state_dim=STATE_DIM, action_dim=ACTION_DIM,
                                        layout="lerobot")
    assert detect_layout(path) is Layout.LEROBOT
    tokenizer = random_dir / "tokenizer.model"  # lerobot folders hold no sentencepiece model
    policy = flashrt_core.load_model(path, device="cpu", tokenizer=tokenizer)
    cfg = policy.config
    assert cfg.name == "pi0fast_tiny" and cfg.norm_mode.value == "zscore"
    assert (cfg.fast.prompt_style, cfg.fast.decode_position_offset, cfg.fast.max_decoding_steps) == ("lerobot", 0, 64)
    assert (policy.state_dim, policy.action_dim) == (STATE_DIM, ACTION_DIM)
    tokens, mask, _ = policy._encode_prompt_and_state(PROMPT, STATE)
    bins = flashrt_core.preprocess.discretize_state(policy.normalizer.normalize_state(STATE))
    text = "Task: Pick up the RED cube, State: " + " ".join(map(str, bins)) + ";\n"
    expected = policy.tokenizer.encode(text, add_bos=True) + [policy.tokenizer.bos_id]
    assert tokens.shape == (cfg.max_token_len + 1,) and tokens[:mask.sum()].tolist() == expected
    _, fast_ids, out = planted_chain(policy, seed=11)
    plant_output_tokens(path, policy.tokenizer.bos_id, out)  # decoding starts from the BOS
    planted_policy = flashrt_core.load_model(path, device="cpu", tokenizer=tokenizer)
    actions = planted_policy.predict(IMAGES, PROMPT, STATE)
    assert planted_policy.last_tokens.tolist() == out
    expected = planted_policy.normalizer.unnormalize_actions(
        planted_policy.codec.fast.decode(fast_ids, cfg.action_horizon, ACTION_DIM), ACTION_DIM)
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)


def test_missing_views_are_unmasked_black_images_in_the_openpi_style(random_dir, monkeypatch):
    """openpi feeds pi0-FAST a missing view as a black image with its mask on; lerobot masks it."""
    seen = {}
    for style in ("openpi", "lerobot"):
        cfg = get_config("pi0fast_tiny", state_dim=STATE_DIM, action_dim=ACTION_DIM, fast={"prompt_style": style})
        policy = flashrt_core.load_model(random_dir, config=cfg, device="cpu")
        original = policy.executor.generate

        def recording(pixels, image_masks, tokens, token_masks, original=original, style=style):
            seen[style] = (pixels.clone(), image_masks.clone())
            return original(pixels, image_masks, tokens, token_masks)

        monkeypatch.setattr(policy.executor, "generate", recording)
        with pytest.raises(ActionDecodeError):
            policy.predict(IMAGES, PROMPT, STATE)  # one of three views
    assert seen["openpi"][1].tolist() == [[True, True, True]]
    assert seen["lerobot"][1].tolist() == [[True, False, False]]
    assert bool((seen["openpi"][0][0, 1:] == -1.0).all())  # black
