"""GR00T N1.6's whole predict as a fixed-shape function of one input signature, with no host sync inside: what a
CUDA graph can capture (engine/groot_graph.py) and what runs eagerly on the CPU to check it against the reference.

The reference (model/groot/backbone.py) calls transformers' top-level Siglip2VisionModel and Qwen3Model, whose
forwards inspect values on the host: the masks' `.all()` (to pick SDPA's causal / unmasked path) and
masked_scatter's count. Here what depends on the signature alone is computed once, outside any capture
(StaticTables), and the same transformers layers are called directly:

  vision      per image size: SigLIP2's position embeddings resized by the HF embedding's own
              resize_positional_embeddings; in the run patch_embedding + those, the encoder layers without a
              mask (each image attends to itself, as the reference's all-ones mask gives), post_layernorm,
              EagleModel.project_vision. Views of one size run as one batch, as in the reference. With the
              engine vision (EngineOptions.groot_engine_vision) the same tower runs on the engine's ops instead
              (engine/groot_vision.py; its per-size patch-GEMM addends made here)
  scatter     image tokens into the prompt's <IMG_CONTEXT> slots by rank (cumsum of the slot mask, then a
              gather and a where): masked_scatter's order without reading the count on the host
  LLM         Qwen3's rotary cos / sin for positions 0..L-1 from the model's rotary_emb; the decoder layers with
              no mask (SDPA's causal path, what HF picks for an all-ones prompt mask) or, for a padded prompt,
              the causal-and-padding boolean mask HF's sdpa_mask builds, then the final norm; with
              engine_language (EngineOptions.groot_engine_language) the same layers on the engine's ops
              (engine/groot_language.py), with the same mask, or none where every prompt's padding is at its
              end (GrootSignature.right_padded: the causal path alone then gives every real token the same keys,
              and only the padding's own rows, which the DiT masks, differ; SDPA's causal flash kernel instead of
              the masked one)
  head        model/groot/sampler.sample_actions, the reference's own code (capture-safe as it is), or with
              step_tables (EngineOptions.groot_step_tables) engine/groot_dit.py: the same sampler with what depends
              on the timestep alone computed once here, and the backbone features' K / V once per predict;
              with fused_dit (EngineOptions.groot_fused_dit) the DiT's blocks run on the engine's fused ops
              (engine/groot_fused_dit.py), and with the batch's embodiment in the signature
              (EngineOptions.groot_step_ends) its weights and the steps' bias rows are prepared here
              (engine/groot_step_ends.py)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flashrt_core.model.groot.backbone import patchify, views_by_size
from flashrt_core.model.groot.model import GrootModel
from flashrt_core.model.groot.sampler import sample_actions

from .groot_dit import StepTables, sample_actions_tabled
from .groot_fused_dit import FusedDit, FusedStepTables, sample_actions_fused
from .groot_language import EngineLanguage, language_model
from .groot_step_ends import EmbodimentWeights
from .groot_vision import GrootVision, position_table
from .groot_vision import image_tokens as engine_image_tokens


@dataclass(frozen=True)
class GrootSignature:
    """What fixes every shape of a predict: batch, (H, W) per view in prompt order, prompt length, whether the
    prompt mask has padding (then the LLM reads it; otherwise it runs causally), whether all of it is at the end
    of each prompt (the policy's own padding, groot_prompt_multiple) and, where the graph picks the embodiment's
    weights when it is captured (EngineOptions.groot_step_ends), the embodiment id that every batch row has (None:
    the graph gathers each row's weights from its embodiment_id input)."""

    batch: int
    view_sizes: tuple[tuple[int, int], ...]
    prompt_len: int
    padded: bool
    right_padded: bool = False
    embodiment: int | None = None

    @classmethod
    def of(cls, views, input_ids: torch.Tensor, attention_mask: torch.Tensor,
           embodiments: Sequence[int] | None = None, padded_at_end: bool = False) -> GrootSignature:
        """The signature of one call (reads the prompt mask's values: on the host where it is there). embodiments:
        the batch rows' embodiment ids (read by the caller), whose one value, when all rows share it, is the
        signature's embodiment; None or several values: None. padded_at_end: the caller pads every prompt at its
        end (the graph executor's prompt_multiple), so a prompt that needed no padding takes the signature of the
        padded ones of its length (its all-ones mask masks nothing: the same chunk) instead of one of its own."""
        if input_ids.dim() != 2 or tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"input_ids and attention_mask must both be [B, L], got {tuple(input_ids.shape)} and "
                             f"{tuple(attention_mask.shape)}")
        sizes = tuple((int(v.shape[-2]), int(v.shape[-1])) for v in views)
        seen = attention_mask.to(torch.int8)
        padded = padded_at_end or not bool(seen.all())
        right = padded and bool((seen[:, 1:] <= seen[:, :-1]).all())       # no real token after a padding one
        ids = set(embodiments or ())
        return cls(int(input_ids.shape[0]), sizes, int(input_ids.shape[1]), padded, right,
                   int(ids.pop()) if len(ids) == 1 else None)


class StaticTables:
    """Everything of one signature that does not depend on the inputs' values, on the model's device.
    step_tables: the DiT's per-step tables too (groot_dit.StepTables); False runs the reference's sampler.
    fused: the executor's fused DiT (groot_fused_dit.FusedDit, shared, needs step_tables) or None.
    vision: the executor's engine vision (groot_vision.GrootVision, shared) or None: transformers' layers.
    language: the executor's engine language model (groot_language.EngineLanguage, shared) or None: transformers'
    layers."""

    def __init__(self, model: GrootModel, sig: GrootSignature, device: torch.device, step_tables: bool = True,
                 fused: FusedDit | None = None, vision: GrootVision | None = None,
                 language: EngineLanguage | None = None):
        if fused is not None and not step_tables:
            raise ValueError("the fused DiT reads the step tables: step_tables=True")
        eagle = model.backbone.model
        v = model.cfg.vision
        self.groups = views_by_size(sig.view_sizes)
        for h, w in self.groups:
            if h % (2 * v.patch_size) or w % (2 * v.patch_size):
                raise ValueError(f"view size {h}x{w} is not a multiple of {2 * v.patch_size} (2 x 2 patches of "
                                 f"{v.patch_size}): preprocess the views with groot_inputs.prepare_views")
        self.image_tokens = sum(model.cfg.image_tokens(h, w) for h, w in sig.view_sizes)
        emb = eagle.vision_model.vision_model.embeddings
        grid = emb.position_embedding.weight.reshape(emb.position_embedding_size, emb.position_embedding_size, -1)
        self.vision_pos = {}
        with torch.inference_mode():
            for (h, w), idxs in self.groups.items():
                gh, gw = h // v.patch_size, w // v.patch_size
                shapes = torch.tensor([[gh, gw]] * len(idxs), dtype=torch.long, device=grid.device)
                self.vision_pos[(h, w)] = emb.resize_positional_embeddings(grid, shapes, max_length=gh * gw)
            # the engine vision's patch-GEMM addend per size: position embedding + patch bias, in its row order
            self.vision_positions = {} if vision is None else {
                (h, w): position_table(vision, pos, h // v.patch_size, w // v.patch_size)
                for (h, w), pos in self.vision_pos.items()}
            lm = eagle.language_model.model
            length = sig.prompt_len
            self.position_ids = torch.arange(length, device=device)[None]
            dtype = lm.embed_tokens.weight.dtype
            self.rope = lm.rotary_emb(torch.empty(0, device=device, dtype=dtype), self.position_ids)
            # the causal mask the padding mask is combined with: None where the LLM runs causally alone (no padding,
            # or, on the engine's layers, all of it at the prompts' ends)
            masked = sig.padded and not (language is not None and sig.right_padded)
            self.causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=device)) if masked else None
        self.language = language
        self.language_rope = None if language is None else language.rope(sig.batch, sig.prompt_len, device)
        self.steps = StepTables(model.action_head, sig.batch) if step_tables else None
        self.fused = fused
        self.fused_mods = FusedStepTables(self.steps) if fused is not None else None
        # the signature's embodiment's weights and step bias rows (engine/groot_step_ends.py): with the fused DiT,
        # when the signature names the batch's one embodiment
        self.embodiment = (EmbodimentWeights(model.action_head, sig.embodiment, self.steps, fused)
                           if fused is not None and sig.embodiment is not None else None)
        self.vision = vision
        self.signature = sig

    def to(self, device: torch.device | str) -> StaticTables:
        """These tables with every tensor on `device` (the meta device: a check that the run reads no value on
        the host, test_groot_graph.py)."""
        self.vision_pos = {k: v.to(device) for k, v in self.vision_pos.items()}
        self.vision_positions = {k: v.to(device) for k, v in self.vision_positions.items()}
        self.position_ids = self.position_ids.to(device)
        self.rope = tuple(t.to(device) for t in self.rope)
        self.causal = None if self.causal is None else self.causal.to(device)
        self.language_rope = None if self.language_rope is None else tuple(t.to(device) for t in self.language_rope)
        self.steps = None if self.steps is None else self.steps.to(device)
        self.fused_mods = None if self.fused_mods is None else self.fused_mods.to(device)
        self.embodiment = None if self.embodiment is None else self.embodiment.to(device)
        return self


def image_tokens(model: GrootModel, tables: StaticTables, views: list[torch.Tensor], dtype: torch.dtype):
    """views [3, H_i, W_i] -> projected image tokens of all views in view order [sum of tokens, llm width]; with
    the engine vision (tables.vision) on the engine's ops (engine/groot_vision.py), else transformers' layers."""
    if tables.vision is not None:
        return engine_image_tokens(tables.vision, tables.groups, tables.vision_positions, views)
    eagle = model.backbone.model
    vm = eagle.vision_model.vision_model
    patch = model.cfg.vision.patch_size
    out: list[torch.Tensor | None] = [None] * len(views)
    for (h, w), idxs in tables.groups.items():
        pixels = torch.stack([views[i] for i in idxs]).to(dtype)
        patches = patchify(pixels, patch)
        hidden = vm.embeddings.patch_embedding(patches.to(vm.embeddings.patch_embedding.weight.dtype))
        hidden = hidden + tables.vision_pos[(h, w)]
        for layer in vm.encoder.layers:
            hidden = layer(hidden, None)
        feats = eagle.project_vision(vm.post_layernorm(hidden), h // patch, w // patch)
        for i, f in zip(idxs, feats):
            out[i] = f
    return torch.cat(out, dim=0)


def scatter_image_tokens(embeds: torch.Tensor, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """embeds [B, L, D] with tokens [N, D] written into the slots [B, L] (bool) in row-major order: what
    embeds.masked_scatter(slots[..., None], tokens) gives when there are N slots, with no host sync."""
    b, length, d = embeds.shape
    rank = (torch.cumsum(slots.reshape(-1), 0) - 1).clamp_(min=0)
    gathered = tokens.to(embeds.dtype).index_select(0, rank).view(b, length, d)
    return torch.where(slots.unsqueeze(-1), gathered, embeds)


def language_features(model: GrootModel, tables: StaticTables, vit: torch.Tensor, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor) -> torch.Tensor:
    """The prompt's embeddings with the image tokens `vit` in its slots, through the LLM -> its final-norm output
    [B, L, llm width] (EagleModel.forward's result)."""
    lm = model.backbone.model.language_model.model
    embeds = lm.embed_tokens(input_ids)
    hidden = scatter_image_tokens(embeds, input_ids == model.cfg.image_token_index, vit)
    mask = None
    if tables.causal is not None:
        mask = tables.causal[None, None] & attention_mask.bool()[:, None, None, :]
    if tables.language is not None:
        return language_model(tables.language, tables.language_rope, hidden, mask)
    for layer in lm.layers[: lm.config.num_hidden_layers]:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=tables.rope,
                       position_ids=tables.position_ids, cache=None, use_cache=False)
    return lm.norm(hidden)


def action_chunk(model: GrootModel, tables: StaticTables, feats: torch.Tensor, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, state: torch.Tensor, embodiment_id: torch.Tensor,
                 noise: torch.Tensor) -> torch.Tensor:
    """Backbone features -> the Euler sampler's normalized actions [B, horizon, max_action_dim]."""
    head = model.action_head
    dtype = next(head.parameters()).dtype
    image_mask = input_ids == model.cfg.image_token_index
    args = (feats.to(dtype), attention_mask.bool(), image_mask, state.to(dtype), embodiment_id, noise.to(dtype))
    if tables.fused is not None:
        return sample_actions_fused(head, tables.steps, tables.fused_mods, tables.fused, *args, tables.embodiment)
    if tables.steps is not None:
        return sample_actions_tabled(head, tables.steps, *args)
    return sample_actions(head, *args)


def predict(model: GrootModel, tables: StaticTables, views: list[torch.Tensor], input_ids: torch.Tensor,
            attention_mask: torch.Tensor, state: torch.Tensor, embodiment_id: torch.Tensor,
            noise: torch.Tensor) -> torch.Tensor:
    """GrootModel.predict_normalized's result for one signature's inputs -> [B, horizon, max_action_dim]."""
    vit = image_tokens(model, tables, views, embed_dtype(model))
    feats = language_features(model, tables, vit, input_ids, attention_mask)
    return action_chunk(model, tables, feats, input_ids, attention_mask, state, embodiment_id, noise)


def embed_dtype(model: GrootModel) -> torch.dtype:
    """The dtype of the prompt embeddings, which the image tokens are computed in (as the reference does)."""
    return model.backbone.model.language_model.model.embed_tokens.weight.dtype
