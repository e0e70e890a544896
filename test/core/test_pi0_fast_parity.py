"""Independent check of pi0-FAST's prefill and greedy decode: Hugging Face transformers'
PaliGemmaForConditionalGeneration with the same random weights (fp32, CPU, tiny config) must generate the same
tokens with the same logits.

HF runs its own path end to end: image placeholder tokens in input_ids replaced by its SigLIP + projector
features, token_type_ids 0 over the prompt (bidirectional prefix), causal generation with its KV cache, its
own positions, greedy `generate`. openpi's position gap (the first decoded token at prefix_len + 1) is checked
against one HF forward over [prompt; decoded tokens] with explicit position_ids (teacher forcing).
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.fixtures import write_random_checkpoint

transformers = pytest.importorskip("transformers")
from paligemma_testing import paligemma_from_checkpoint  # noqa: E402  (needs transformers)

PARITY_REL_TOL = 1e-4  # fp32 on both sides; op order only
STEPS = 12
NO_EOS = -1  # generate a fixed number of tokens
EMBED_GAIN, LAYER_GAIN = 0.05, 6.0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cfg = get_config("pi0fast_tiny")
    path = write_random_checkpoint(tmp_path_factory.mktemp("fast_parity"), "pi0fast_tiny", seed=5,
                                   dtype=torch.float32, prefix_model=False, include_lm_heads=False)
    # Random fixture weights make greedy decoding repeat one token (the tied head scores a token's own embedding
    # highest); a smaller embedding table and stronger layer outputs let the layers steer, so the tokens vary.
    weights_path = path / "model.safetensors"
    tensors = load_file(weights_path)
    for name in tensors:
        if name.endswith("embed_tokens.weight"):
            tensors[name] *= EMBED_GAIN
        elif "language_model" in name and name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] *= LAYER_GAIN
    save_file(tensors, weights_path)
    ours = load_model_weights(path, cfg, "cpu", torch.float32)
    return cfg, ours, paligemma_from_checkpoint(cfg, weights_path)


def inputs(cfg, prompt_len=20, pad=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    size = cfg.vision.image_size
    pixels = torch.rand(1, 2, 3, size, size, generator=gen) * 2 - 1  # [B, V, 3, H, W]
    tokens = torch.randint(5, cfg.paligemma.vocab_size, (1, prompt_len + pad), generator=gen)
    tokens[0, 0] = 2  # BOS
    token_masks = torch.zeros(1, prompt_len + pad, dtype=torch.bool)
    token_masks[0, :prompt_len] = True
    return pixels, torch.ones(1, 2, dtype=torch.bool), tokens, token_masks


def hf_prompt(cfg, pixels, tokens):
    num_images = pixels.shape[1] * cfg.vision.num_patches
    ids = torch.cat([torch.full((1, num_images), cfg.paligemma.vocab_size, device=tokens.device), tokens], dim=1)
    return ids, pixels[0]  # PaliGemma takes the views as a batch of images for one prompt


def rel_err(ours, theirs):
    return float((ours - theirs).abs().max() / theirs.abs().max())


@pytest.mark.parametrize("seed", [1, 4])
def test_greedy_tokens_and_logits_match_transformers_generate(models, seed):
    cfg, ours, hf = models
    pixels, image_masks, tokens, token_masks = inputs(cfg, seed=seed)
    with torch.no_grad():
        mine = ours.generate(pixels, image_masks, tokens, token_masks, STEPS, NO_EOS, position_offset=0)
        ids, hf_pixels = hf_prompt(cfg, pixels, tokens)
        out = hf.generate(input_ids=ids, pixel_values=hf_pixels, token_type_ids=torch.zeros_like(ids),
                          attention_mask=torch.ones_like(ids), max_new_tokens=STEPS, min_new_tokens=STEPS,
                          do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True)
    theirs = out.sequences[0, ids.shape[1]:]
    assert mine[0].tolist() == theirs.tolist()
    assert len(set(theirs.tolist())) > 3, f"the check needs varied tokens, got {theirs.tolist()}"
    # logits of every step, fed by the same tokens
    embs, valid = ours.embed_prefix(pixels, image_masks, tokens, token_masks)
    with torch.no_grad():
        state, logits = ours.prefill(embs, valid)
        for step, token in enumerate(mine[0]):
            assert rel_err(logits[0], out.logits[step][0]) <= PARITY_REL_TOL, f"step {step}"
            logits = ours.decode_step(state, token[None], position_offset=0)


def test_padding_does_not_change_the_tokens(models):
    cfg, ours, _ = models
    with torch.no_grad():
        plain = ours.generate(*inputs(cfg), STEPS, NO_EOS)
        padded = ours.generate(*inputs(cfg, pad=7), STEPS, NO_EOS)
    assert plain.tolist() == padded.tolist()


def test_openpi_position_gap_matches_a_teacher_forced_transformers_pass(models):
    """openpi's decode positions (prefix_len + step + 1): one HF forward over [prompt; decoded] with those
    position_ids and causal decoded tokens predicts each next token; offset 0 positions give other logits."""
    cfg, ours, hf = models
    pixels, image_masks, tokens, token_masks = inputs(cfg, seed=3)
    with torch.no_grad():
        mine = ours.generate(pixels, image_masks, tokens, token_masks, STEPS, NO_EOS, position_offset=1)
        ids, hf_pixels = hf_prompt(cfg, pixels, tokens)
        prefix_len = ids.shape[1]
        full = torch.cat([ids, mine[:, :-1]], dim=1)
        token_type = torch.cat([torch.zeros_like(ids), torch.ones_like(mine[:, :-1])], dim=1)

        def logits_at(offset):
            positions = torch.cat([torch.arange(prefix_len),
                                   prefix_len + offset + torch.arange(STEPS - 1)])[None]
            return hf(input_ids=full, pixel_values=hf_pixels, token_type_ids=token_type, position_ids=positions,
                      attention_mask=torch.ones_like(full)).logits[0, prefix_len - 1:]

        gap = logits_at(1)
        contiguous = logits_at(0)
    assert gap.argmax(dim=-1).tolist() == mine[0].tolist()
    embs, valid = ours.embed_prefix(pixels, image_masks, tokens, token_masks)
    with torch.no_grad():
        state, logits = ours.prefill(embs, valid)
        step_logits = [logits]
        for token in mine[0, :-1]:
            step_logits.append(ours.decode_step(state, token[None], position_offset=1))
    step_logits = torch.cat(step_logits)
    assert rel_err(step_logits, gap) <= PARITY_REL_TOL
    assert rel_err(step_logits[1:], contiguous[1:]) > 100 * PARITY_REL_TOL  # the position matters


@pytest.mark.gpu
def test_cuda_fp32_matches_transformers_on_cuda(models):
    """The same comparison on the GPU (fp32, TF32 off): the reference path on CUDA decodes as transformers does."""
    import copy
    cfg, ours, hf = models
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ours_gpu, hf_gpu = copy.deepcopy(ours).cuda(), copy.deepcopy(hf).cuda()
        pixels, image_masks, tokens, token_masks = (t.cuda() for t in inputs(cfg, seed=1))
        with torch.no_grad():
            mine = ours_gpu.generate(pixels, image_masks, tokens, token_masks, STEPS, NO_EOS, position_offset=0)
            ids, hf_pixels = hf_prompt(cfg, pixels, tokens)
            out = hf_gpu.generate(input_ids=ids, pixel_values=hf_pixels, token_type_ids=torch.zeros_like(ids),
                                  attention_mask=torch.ones_like(ids), max_new_tokens=STEPS, min_new_tokens=STEPS,
                                  do_sample=False, eos_token_id=None, pad_token_id=0, return_dict_in_generate=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert mine[0].tolist() == out.sequences[0, ids.shape[1]:].tolist()


def test_a_batch_decodes_each_row_as_alone(models):
    """Rows of different prompt lengths in one batch: per-row last prefix token, positions and masks."""
    cfg, ours, _ = models
    rows = [inputs(cfg, prompt_len=20, pad=4, seed=1), inputs(cfg, prompt_len=13, pad=11, seed=4)]
    batch = [torch.cat(parts) for parts in zip(*rows)]
    with torch.no_grad():
        together = ours.generate(*batch, STEPS, NO_EOS)
        alone = [ours.generate(*row, STEPS, NO_EOS)[0].tolist() for row in rows]
    assert together.tolist() == alone and alone[0] != alone[1]
