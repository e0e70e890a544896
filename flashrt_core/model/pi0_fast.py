"""pi0-FAST reference model: PaliGemma (SigLIP + Gemma 2B) decoding FAST action tokens greedily with a KV cache.

Follows openpi's Pi0FAST.sample_actions (src/openpi/models/pi0_fast.py, gemma_fast.py):
- prefix = [image tokens of every view; prompt tokens], bidirectional over its valid tokens (openpi's ar mask is 0
  over the whole prompt at inference), positions cumsum(valid) - 1; one pass fills the KV cache;
- the logits of the last valid prefix token give the first token; each decoded token is embedded
  (embedding * sqrt(width), as text), attends to every valid prefix token, every earlier decoded token and itself,
  and sits at position prefix_len + step + `position_offset` (openpi: offset 1, position prefix_len stays unused;
  offset 0 gives contiguous positions as transformers' generate and lerobot);
- the LM head is tied to the token embedding: logits = hidden @ embed_tokens^T, in the compute dtype;
- greedy (argmax, first maximum on ties); decoding stops once every sequence has emitted `eos_id`, or after
  max_steps tokens.
Parameter names (vision.*, embed_tokens.*, paligemma.*) are PiModel's, so checkpoint.py's table fills both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_core.config import ModelConfig, ModelType
from flashrt_core.model.gemma import GemmaStack, KVCache
from flashrt_core.model.pi_model import make_attention_mask
from flashrt_core.model.siglip import VisionTower


@dataclass
class DecodeState:
    """The growing KV cache of a decode: prefix entries first, then one entry per decoded token."""

    kv: KVCache  # per layer (k [B, T, KV, D] after RoPE, v [B, T, KV, D])
    valid: torch.Tensor  # [B, T] bool: cache entries that may be attended to
    prefix_len: torch.Tensor  # [B] int64: valid prefix tokens
    steps: int = 0  # tokens decoded into the cache so far


class Pi0FastModel(nn.Module):
    """Weights and forward functions of pi0-FAST (no action expert)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config.validate()
        if config.model_type != ModelType.PI0_FAST:
            raise ValueError(f"Pi0FastModel needs a pi0fast config, got model_type {config.model_type.value!r}")
        pg = config.paligemma
        self.vision = VisionTower(config.vision, pg.width)
        self.embed_tokens = nn.Embedding(pg.vocab_size, pg.width)
        self.paligemma = GemmaStack(pg)

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.paligemma.layers[0].q_proj.weight.dtype

    def embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [B, L] -> [B, L, W] in the compute dtype: embedding * sqrt(width) (rounded to the table's dtype)."""
        text = self.embed_tokens(tokens)
        text = text * torch.tensor(math.sqrt(text.shape[-1]), dtype=text.dtype)
        return text.to(self.compute_dtype)

    def embed_prefix(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                     token_masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pixels: [B, V, 3, H, W] in [-1, 1], image_masks: [B, V] bool, tokens/token_masks: [B, L]
        -> (embeddings [B, V*N + L, W] in compute dtype, valid [B, V*N + L] bool)"""
        batch, views = pixels.shape[:2]
        images = self.vision(pixels.flatten(0, 1))  # [B*V, N, W]
        num_patches = images.shape[1]
        images = images.reshape(batch, views * num_patches, -1).to(self.compute_dtype)  # [B, V*N, W]
        image_valid = image_masks.bool().repeat_interleave(num_patches, dim=1)  # [B, V*N]
        embs = torch.cat([images, self.embed_text(tokens)], dim=1)
        return embs, torch.cat([image_valid, token_masks.bool()], dim=1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied LM head. hidden: [B, S, W] -> logits [B, S, vocab] fp32 (the product in the compute dtype)."""
        weight = self.embed_tokens.weight
        return F.linear(hidden.to(weight.dtype), weight).float()

    def prefill(self, embs: torch.Tensor, valid: torch.Tensor) -> tuple[DecodeState, torch.Tensor]:
        """embs: [B, P, W], valid: [B, P] -> (decode state, logits of the last valid prefix token [B, vocab] fp32)"""
        if not bool(valid.any(dim=1).all()):
            raise ValueError("every sequence needs at least one valid prefix token")
        mask = make_attention_mask(valid, torch.zeros_like(valid))  # [B, P, P]
        positions = torch.cumsum(valid.long(), dim=1) - 1
        hidden, kv = self.paligemma(embs, positions, mask, return_kv=True)
        last = valid.shape[1] - 1 - torch.flip(valid.long(), dims=[1]).argmax(dim=1)  # [B] last valid index
        batch = torch.arange(valid.shape[0], device=valid.device)
        state = DecodeState(kv=kv, valid=valid, prefix_len=valid.long().sum(dim=1))
        return state, self.logits(hidden[batch, last][:, None])[:, 0]

    def decode_step(self, state: DecodeState, token: torch.Tensor, position_offset: int) -> torch.Tensor:
        """Feed one token per sequence; appends its K/V to `state`.  token: [B] -> next logits [B, vocab] fp32"""
        batch = token.shape[0]
        positions = (state.prefix_len + state.steps + position_offset)[:, None]  # [B, 1]
        valid = torch.cat([state.valid, torch.ones(batch, 1, dtype=torch.bool, device=token.device)], dim=1)
        mask = valid[:, None, :]  # [B, 1, T + 1]: every valid cache entry and itself
        hidden, new_kv = self.paligemma(self.embed_text(token[:, None]), positions, mask, past_kv=state.kv,
                                        return_kv=True)
        state.kv = [(torch.cat([k, nk], dim=1), torch.cat([v, nv], dim=1))
                    for (k, v), (nk, nv) in zip(state.kv, new_kv)]
        state.valid = valid
        state.steps += 1
        return self.logits(hidden)[:, 0]

    def generate(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                 token_masks: torch.Tensor, max_steps: int, eos_id: int, position_offset: int = 1) -> torch.Tensor:
        """Greedy decode. -> tokens [B, n] int64, n <= max_steps; n < max_steps when every row emitted eos_id
        (rows that finished earlier hold the tokens decoded after their eos_id, which callers cut off)."""
        embs, valid = self.embed_prefix(pixels, image_masks, tokens, token_masks)
        state, logits = self.prefill(embs, valid)
        out = []
        finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        for step in range(max_steps):
            token = logits.argmax(dim=-1)  # [B]
            out.append(token)
            finished |= token == eos_id
            if bool(finished.all()) or step == max_steps - 1:
                break
            logits = self.decode_step(state, token, position_offset)
        return torch.stack(out, dim=1)
