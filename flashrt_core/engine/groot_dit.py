"""GR00T N1.6's Euler sampler with what does not change between steps computed once (EngineOptions.groot_step_tables).

The reference (model/groot/sampler.py -> action_head.velocity -> dit.DiT) recomputes in every step what depends on
the step's timestep bucket alone, and what depends on the backbone features alone. Here:

  StepTables (once, outside any graph: weights and buckets only)
      per step and DiT block the AdaLayerNorm's (1 + scale, shift) = norm1.linear(silu(temb)), the final
      modulation proj_out_1(silu(temb)), the action encoder's sinusoid of the timestep; the learned action
      positions
  per predict (once, inside the graph)
      each cross-attention block's K / V of the backbone features, and the cross-attention masks (two kinds)
  per step
      the action encoder, the DiT blocks with the tables above, the decoder: the reference's ops in its order, so
      the chunk is the reference's (test/core/test_groot_graph.py compares them)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from flashrt_core.model.groot.action_head import GrootActionHead, sincos_encoding
from flashrt_core.model.groot.dit import DiT


class StepTables:
    """What each Euler step needs from its timestep alone, for a batch of `batch`, on the head's device."""

    def __init__(self, head: GrootActionHead, batch: int):
        cfg, dit = head.cfg, head.model
        device = head.action_encoder.W1.W.device
        enc_dtype = head.action_encoder.W1.W.dtype
        horizon = cfg.action_horizon
        self.steps = cfg.num_inference_timesteps
        self.ada: list[list[tuple[torch.Tensor, torch.Tensor]]] = []      # [step][block] (1 + scale, shift)
        self.out_mod: list[tuple[torch.Tensor, torch.Tensor]] = []        # [step] (1 + scale, shift)
        self.tau: list[torch.Tensor] = []                                 # [step] [B, horizon, hidden]
        with torch.inference_mode():
            for k in range(self.steps):
                timesteps = torch.full((batch,), head.timestep_bucket(k), device=device, dtype=torch.long)
                temb = dit.timestep_encoder(timesteps)
                per_block = []
                for block in dit.transformer_blocks:
                    scale, shift = block.norm1.linear(F.silu(temb)).chunk(2, dim=1)
                    per_block.append((1 + scale[:, None], shift[:, None]))
                self.ada.append(per_block)
                shift, scale = dit.proj_out_1(F.silu(temb)).chunk(2, dim=1)
                self.out_mod.append((1 + scale[:, None], shift[:, None]))
                self.tau.append(sincos_encoding(timesteps.unsqueeze(1).expand(batch, horizon),
                                                head.action_encoder.hidden_size).to(enc_dtype))
            self.positions = (head.position_embedding(torch.arange(horizon, device=device)).unsqueeze(0)
                              if cfg.add_pos_embed else None)

    def to(self, device: torch.device | str) -> StepTables:
        self.ada = [[(s.to(device), t.to(device)) for s, t in step] for step in self.ada]
        self.out_mod = [(s.to(device), t.to(device)) for s, t in self.out_mod]
        self.tau = [t.to(device) for t in self.tau]
        self.positions = None if self.positions is None else self.positions.to(device)
        return self


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def context_kv(dit: DiT, context: torch.Tensor, image_mask: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """Per cross-attention block: (K, V, mask) of the backbone features, the same in every step."""
    masks: dict = {}
    out = {}
    for idx, block in enumerate(dit.transformer_blocks):
        if not block.is_cross:
            continue
        kind = (idx % (2 * dit.cfg.attend_text_every_n_blocks) == 0) if dit.cfg.alternate_vl else None
        if kind not in masks:
            mask = dit.cross_mask(idx, image_mask, attention_mask)
            masks[kind] = None if mask is None else mask[:, None, None, :]
        attn = block.attn1
        out[idx] = (_heads(attn.to_k(context), attn.heads), _heads(attn.to_v(context), attn.heads), masks[kind])
    return out


def step_tokens(head: GrootActionHead, tables: StepTables, k: int, state_features: torch.Tensor,
                actions: torch.Tensor, embodiment_id: torch.Tensor) -> torch.Tensor:
    """The DiT's input at step k: [state features; the action encoder's tokens (+ learned positions)]
    -> [B, 1 + horizon, D] (GrootActionHead.velocity's, with the step's sinusoid from the tables)."""
    enc = head.action_encoder
    a_emb = enc.W1(actions, embodiment_id)
    x = enc.W2(torch.cat([a_emb, tables.tau[k]], dim=-1), embodiment_id)
    features = enc.W3(x * torch.sigmoid(x), embodiment_id)
    if tables.positions is not None:
        features = features + tables.positions
    return torch.cat([state_features, features], dim=1)


def euler_steps(head: GrootActionHead, tables: StepTables, state_features: torch.Tensor, actions: torch.Tensor,
                embodiment_id: torch.Tensor, dit: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The sampler's Euler steps from `actions` (the noise): dit(k, tokens) is the DiT's output at step k, which the
    embodiment's decoder turns into the velocity of the action rows."""
    dt = 1.0 / tables.steps
    for k in range(tables.steps):
        out = dit(k, step_tokens(head, tables, k, state_features, actions, embodiment_id))
        actions = actions + dt * head.action_decoder(out, embodiment_id)[:, -head.cfg.action_horizon:]
    return actions


def _dit(dit: DiT, tables: StepTables, k: int, kv: dict, hidden: torch.Tensor) -> torch.Tensor:
    """The DiT at step k with the step's tables and the cached K / V: tokens [B, T, D] -> proj_out_2's [B, T, out]."""
    b, t = hidden.shape[:2]
    for idx, block in enumerate(dit.transformer_blocks):
        scale1, shift = tables.ada[k][idx]
        normed = F.layer_norm(hidden, hidden.shape[-1:], eps=block.norm1.eps) * scale1 + shift
        attn = block.attn1
        q = _heads(attn.to_q(normed), attn.heads)
        if block.is_cross:
            key, value, mask = kv[idx]
        else:
            key, value, mask = _heads(attn.to_k(normed), attn.heads), _heads(attn.to_v(normed), attn.heads), None
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask)
        hidden = hidden + attn.to_out[0](out.transpose(1, 2).reshape(b, t, -1))
        hidden = hidden + block.ff(F.layer_norm(hidden, hidden.shape[-1:], eps=block.eps))
    scale1, shift = tables.out_mod[k]
    hidden = F.layer_norm(hidden, hidden.shape[-1:], eps=1e-6) * scale1 + shift
    return dit.proj_out_2(hidden)


def sample_actions_tabled(head: GrootActionHead, tables: StepTables, backbone_features: torch.Tensor,
                          backbone_mask: torch.Tensor, image_mask: torch.Tensor, state: torch.Tensor,
                          embodiment_id: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """sampler.sample_actions (same arguments, plus the tables) -> normalized actions [B, horizon, A]."""
    vl_embeds, state_features = head.encode(backbone_features, state, embodiment_id)
    kv = context_kv(head.model, vl_embeds, image_mask, backbone_mask)
    return euler_steps(head, tables, state_features, noise.to(vl_embeds.dtype), embodiment_id,
                       lambda k, tokens: _dit(head.model, tables, k, kv, tokens))
