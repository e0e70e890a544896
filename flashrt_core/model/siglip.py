"""SigLIP vision tower (So400m/14 in pi0 / pi0.5) and the PaliGemma projector.

Pre-LN ViT: patch Conv (VALID, stride = patch) + learned position embedding, no CLS token, no pooling;
blocks: x += MHSA(LN1(x)); x += fc2(gelu_tanh(fc1(LN2(x)))); final post LayerNorm (eps 1e-6).
The projector is one Linear (vision width -> Gemma width) with no activation and no 1/sqrt(width) scaling.
Patch and position embeddings may be kept in fp32 while the rest runs in bf16 (openpi does so).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_core.config import VisionConfig


class SiglipAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.width, cfg.width)
        self.k_proj = nn.Linear(cfg.width, cfg.width)
        self.v_proj = nn.Linear(cfg.width, cfg.width)
        self.out_proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, N, W] -> [B, N, W]; full bidirectional attention, softmax in fp32
        batch, tokens, width = x.shape
        heads, head_dim = self.cfg.num_heads, self.cfg.head_dim
        q = self.q_proj(x).view(batch, tokens, heads, head_dim).transpose(1, 2)  # [B, H, N, Dh]
        k = self.k_proj(x).view(batch, tokens, heads, head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, heads, head_dim).transpose(1, 2)
        logits = (q.float() @ k.float().transpose(-1, -2)) * head_dim**-0.5  # [B, H, N, N]
        probs = torch.softmax(logits, dim=-1).to(v.dtype)
        out = (probs @ v).transpose(1, 2).reshape(batch, tokens, width)  # [B, N, W]
        return self.out_proj(out)


class SiglipMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipLayer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.self_attn = SiglipAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.mlp = SiglipMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, N, W] -> [B, N, W]
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionTower(nn.Module):
    """Images [B, 3, H, W] in [-1, 1] -> projected image tokens [B, N, gemma_width]."""

    def __init__(self, cfg: VisionConfig, out_width: int):
        super().__init__()
        self.cfg = cfg
        self.patch_embedding = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = nn.Parameter(torch.zeros(cfg.num_patches, cfg.width))
        self.layers = nn.ModuleList(SiglipLayer(cfg) for _ in range(cfg.depth))
        self.post_layernorm = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.projector = nn.Linear(cfg.width, out_width)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """SigLIP features before the projector.  pixels: [B, 3, H, W] -> [B, N, Wv]"""
        expected = (3, self.cfg.image_size, self.cfg.image_size)
        if tuple(pixels.shape[1:]) != expected:
            raise ValueError(f"vision tower expects pixels [B, {expected}], got {tuple(pixels.shape)}")
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))  # [B, Wv, h, w]
        x = patches.flatten(2).transpose(1, 2)  # [B, N, Wv], row-major patch order
        x = x + self.position_embedding.to(x.dtype)
        x = x.to(self.projector.weight.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.post_layernorm(x)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # pixels: [B, 3, H, W] -> [B, N, gemma_width]
        return self.projector(self.encode(pixels))
