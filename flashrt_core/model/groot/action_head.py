"""GR00T N1.6 action head: embodiment-specific state / action encoders and decoder around a flow-matching DiT.

Module and parameter names follow the released checkpoints (`action_head.` prefix there), so state_dict keys
load one to one:
  state_encoder.layer{1,2}.{W,b}        CategorySpecificMLP: relu(x W1[e] + b1[e]) W2[e] + b2[e]
  action_encoder.W{1,2,3}.{W,b}         W3 swish(W2 [W1 a ; sincos(t)])  (per embodiment e)
  action_decoder.layer{1,2}.{W,b}
  position_embedding.weight             learned positions of the action tokens
  vlln.{weight,bias}                    LayerNorm over the backbone features
  model.*                               the DiT (dit.py)
W has shape [embodiments, in, out] (x @ W, not x @ W^T).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_core.model.groot.config import GrootConfig
from flashrt_core.model.groot.dit import DiT


class CategorySpecificLinear(nn.Module):
    def __init__(self, num_categories: int, input_dim: int, output_dim: int):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(num_categories, input_dim, output_dim))
        self.b = nn.Parameter(torch.zeros(num_categories, output_dim))

    def forward(self, x: torch.Tensor, cat_ids: torch.Tensor) -> torch.Tensor:
        """x [B, T, in], cat_ids [B] int64 -> [B, T, out]"""
        return torch.bmm(x, self.W[cat_ids]) + self.b[cat_ids].unsqueeze(1)


class CategorySpecificMLP(nn.Module):
    def __init__(self, num_categories: int, input_dim: int, hidden_dim: int, output_dim: int):
        super().__init__()
        self.layer1 = CategorySpecificLinear(num_categories, input_dim, hidden_dim)
        self.layer2 = CategorySpecificLinear(num_categories, hidden_dim, output_dim)

    def forward(self, x: torch.Tensor, cat_ids: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.relu(self.layer1(x, cat_ids)), cat_ids)


def sincos_encoding(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """timesteps [B, T] -> [B, T, dim] fp32: [sin(t f), cos(t f)], f_i = 10000^(-i / (dim/2))."""
    half = dim // 2
    exponent = -torch.arange(half, dtype=torch.float32, device=timesteps.device) * (math.log(10000.0) / half)
    freqs = timesteps.float().unsqueeze(-1) * exponent.exp()
    return torch.cat([torch.sin(freqs), torch.cos(freqs)], dim=-1)


class MultiEmbodimentActionEncoder(nn.Module):
    def __init__(self, action_dim: int, hidden_size: int, num_embodiments: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.W1 = CategorySpecificLinear(num_embodiments, action_dim, hidden_size)
        self.W2 = CategorySpecificLinear(num_embodiments, 2 * hidden_size, hidden_size)
        self.W3 = CategorySpecificLinear(num_embodiments, hidden_size, hidden_size)

    def forward(self, actions: torch.Tensor, timesteps: torch.Tensor, cat_ids: torch.Tensor) -> torch.Tensor:
        """actions [B, T, A], timesteps [B] (discrete buckets), cat_ids [B] -> [B, T, hidden]"""
        b, t, _ = actions.shape
        a_emb = self.W1(actions, cat_ids)
        tau = sincos_encoding(timesteps.unsqueeze(1).expand(b, t), self.hidden_size).to(a_emb.dtype)
        x = self.W2(torch.cat([a_emb, tau], dim=-1), cat_ids)
        return self.W3(x * torch.sigmoid(x), cat_ids)


class GrootActionHead(nn.Module):
    def __init__(self, cfg: GrootConfig):
        super().__init__()
        self.cfg = cfg
        self.model = DiT(cfg.dit, cross_attention_dim=cfg.backbone_embedding_dim)
        n = cfg.max_num_embodiments
        self.state_encoder = CategorySpecificMLP(n, cfg.max_state_dim, cfg.hidden_size, cfg.input_embedding_dim)
        self.action_encoder = MultiEmbodimentActionEncoder(cfg.max_action_dim, cfg.input_embedding_dim, n)
        self.action_decoder = CategorySpecificMLP(n, cfg.hidden_size, cfg.hidden_size, cfg.max_action_dim)
        self.vlln = nn.LayerNorm(cfg.backbone_embedding_dim) if cfg.use_vlln else nn.Identity()
        if cfg.add_pos_embed:
            self.position_embedding = nn.Embedding(cfg.max_seq_len, cfg.input_embedding_dim)

    def encode(self, backbone_features: torch.Tensor, state: torch.Tensor, embodiment_id: torch.Tensor):
        """-> (vl_embeds [B, S, D] after vlln, state_features [B, 1, input_embedding_dim])"""
        return self.vlln(backbone_features), self.state_encoder(state, embodiment_id)

    def timestep_bucket(self, step: int) -> int:
        """The discrete timestep of Euler step `step`: int(step / N * buckets), as the reference computes it."""
        return int(step / float(self.cfg.num_inference_timesteps) * self.cfg.num_timestep_buckets)

    def velocity(self, vl_embeds: torch.Tensor, state_features: torch.Tensor, actions: torch.Tensor,
                 bucket: int, embodiment_id: torch.Tensor, image_mask: torch.Tensor,
                 attention_mask: torch.Tensor) -> torch.Tensor:
        """One DiT evaluation: actions [B, H, A] at discrete time `bucket` -> velocity [B, H, A]."""
        batch = actions.shape[0]
        timesteps = torch.full((batch,), bucket, device=actions.device, dtype=torch.long)
        action_features = self.action_encoder(actions, timesteps, embodiment_id)
        if self.cfg.add_pos_embed:
            pos = torch.arange(action_features.shape[1], device=actions.device)
            action_features = action_features + self.position_embedding(pos).unsqueeze(0)
        sa_embs = torch.cat([state_features, action_features], dim=1)
        out = self.model(sa_embs, vl_embeds, timesteps, image_mask=image_mask, attention_mask=attention_mask)
        pred = self.action_decoder(out, embodiment_id)
        return pred[:, -self.cfg.action_horizon:]
