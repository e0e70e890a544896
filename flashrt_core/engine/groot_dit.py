"""GR00T N1.6's Euler sampler with what does not change between steps computed once (EngineOptions.groot_step_tables).

The reference (model/groot/sampler.py -> action_head.velocity -> dit.DiT) recomputes in every step what depends on
the step's timestep bucket alone, and what depends on the backbone features alone. Here:

  StepTables (once, outside any graph: weights and buckets only)
      per step and DiT block the AdaLayerNorm's (1 + scale, shift) = norm1.linear(silu(temb)), the final
      modulation proj_out_1(silu(temb)), the action encoder's sinusoid of the timestep; the learned action
      positions
  per predict (once, inside the graph)
      each cross-attention block's K / V of the backbone features, and the cross-attention masks (two kinds); the
      action encoder's and decoder's weights of the predict's embodiments (EmbodimentSlices: the reference's
      CategorySpecificLinear gathers W[embodiment] anew in every step, a copy of each weight)
  per step
      the action encoder, the DiT blocks with the tables above, the decoder: the reference's ops in its order (each
      category-specific layer's bias added in its batched GEMM), so the chunk is the reference's
      (test/core/test_groot_graph.py compares them)
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


def context_kv(dit: DiT, context: torch.Tensor, image_mask: torch.Tensor, attention_mask: torch.Tensor,
               projected: dict | None = None) -> dict:
    """Per cross-attention block: (K, V, mask) of the backbone features, the same in every step. projected: the
    blocks' (K, V) [B, L, inner] made elsewhere (the fused DiT's one merged GEMM), else each block's to_k / to_v."""
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
        key, value = (attn.to_k(context), attn.to_v(context)) if projected is None else projected[idx]
        out[idx] = (_heads(key, attn.heads), _heads(value, attn.heads), masks[kind])
    return out


class EmbodimentSlices:
    """The action encoder's (W1, W2, W3) and decoder's (layer1, layer2) weights of each batch row's embodiment,
    gathered once per predict: (W [B, in, out], b [B, 1, out]) per layer, in the model's dtype."""

    def __init__(self, head: GrootActionHead, embodiment_id: torch.Tensor):
        enc, dec = head.action_encoder, head.action_decoder
        self.layers = {name: (m.W[embodiment_id], m.b[embodiment_id].unsqueeze(1))
                       for name, m in (("W1", enc.W1), ("W2", enc.W2), ("W3", enc.W3), ("layer1", dec.layer1),
                                       ("layer2", dec.layer2))}

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """CategorySpecificLinear's x [B, T, in] @ W[e] + b[e] -> [B, T, out], the bias in the batched GEMM."""
        w, b = self.layers[name]
        return torch.baddbmm(b, x, w)


def step_tokens(tables: StepTables, slices: EmbodimentSlices, k: int, state_features: torch.Tensor,
                actions: torch.Tensor) -> torch.Tensor:
    """The DiT's input at step k: [state features; the action encoder's tokens (+ learned positions)]
    -> [B, 1 + horizon, D] (GrootActionHead.velocity's, with the step's sinusoid from the tables)."""
    a_emb = slices.linear("W1", actions)
    x = slices.linear("W2", torch.cat([a_emb, tables.tau[k]], dim=-1))
    features = slices.linear("W3", x * torch.sigmoid(x))
    if tables.positions is not None:
        features = features + tables.positions
    return torch.cat([state_features, features], dim=1)


def euler_steps(head: GrootActionHead, tables: StepTables, state_features: torch.Tensor, actions: torch.Tensor,
                embodiment_id: torch.Tensor, dit: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The sampler's Euler steps from `actions` (the noise): dit(k, tokens) is the DiT's output at step k, which the
    embodiment's decoder (CategorySpecificMLP: layer2(relu(layer1))) turns into the velocity of the action rows."""
    dt = 1.0 / tables.steps
    slices = EmbodimentSlices(head, embodiment_id)
    for k in range(tables.steps):
        out = dit(k, step_tokens(tables, slices, k, state_features, actions))
        velocity = slices.linear("layer2", F.relu(slices.linear("layer1", out)))
        actions = actions + dt * velocity[:, -head.cfg.action_horizon:]
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
