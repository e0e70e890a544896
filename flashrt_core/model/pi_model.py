"""pi0 / pi0.5 flow-matching policy model: prefix embedding, prefix KV cache, suffix embedding, denoise step.

Prefix = [image tokens of every view; text tokens], run once through the Gemma 2B backbone into a KV cache.
Suffix = pi0: [state token; action tokens], pi0.5: [action tokens]; every denoise step runs only the action
expert over the suffix, attending to the cached prefix K/V plus its own K/V. The cache is never modified.

Masks (openpi make_attn_mask): tokens carry a validity flag and an "autoregressive" flag; token i may attend
to token j iff both are valid and cumsum(ar)[j] <= cumsum(ar)[i]. The prefix has ar = 0 everywhere
(bidirectional), so it never sees the suffix; pi0's state token and first action token start new blocks.
Positions: prefix = cumsum(valid) - 1; suffix continues from the number of valid prefix tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_core.config import ModelConfig, ModelType
from flashrt_core.model.gemma import GemmaStack, KVCache, joint_forward
from flashrt_core.model.siglip import VisionTower


@dataclass
class PrefixCache:
    """What the denoise steps need from the prefix pass."""

    kv: KVCache  # per backbone layer: (k [B, P, KV, D] after RoPE, v [B, P, KV, D])
    valid: torch.Tensor  # [B, P] bool: prefix tokens that may be attended to


def make_attention_mask(valid: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """valid: [B, N] bool, ar: [N] or [B, N] bool -> [B, N, N] bool (query i may attend key j)."""
    blocks = torch.cumsum(ar.long().expand_as(valid), dim=-1)  # [B, N]
    causal = blocks[:, None, :] <= blocks[:, :, None]  # [B, N(query), N(key)]
    return causal & valid[:, None, :] & valid[:, :, None]


def sincos_time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """t: [B] (or per token [B, H]) -> [B, dim] ([B, H, dim]) fp32; [sin, cos] of 2*pi*t/period, periods
    geometric in [min, max] (fp64 math)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction  # [dim/2]
    angles = t.double()[..., None] * (2.0 * math.pi / period)  # [B, dim/2] or [B, H, dim/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


class PiModel(nn.Module):
    """Weights and forward functions of pi0 / pi0.5. Parameter names are the model side of checkpoint.py's table."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config.validate()
        pg, ex = config.paligemma, config.expert
        self.is_pi05 = config.model_type == ModelType.PI05
        self.vision = VisionTower(config.vision, pg.width)
        self.embed_tokens = nn.Embedding(pg.vocab_size, pg.width)
        self.paligemma = GemmaStack(pg)
        self.expert = GemmaStack(ex, cond_dim=ex.width if self.is_pi05 else None)
        self.action_in_proj = nn.Linear(config.max_action_dim, ex.width)
        self.action_out_proj = nn.Linear(ex.width, config.max_action_dim)
        if self.is_pi05:
            self.time_mlp_in = nn.Linear(ex.width, ex.width)
            self.time_mlp_out = nn.Linear(ex.width, ex.width)
        else:
            self.state_proj = nn.Linear(config.max_action_dim, ex.width)
            self.action_time_mlp_in = nn.Linear(2 * ex.width, ex.width)
            self.action_time_mlp_out = nn.Linear(ex.width, ex.width)

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.paligemma.layers[0].q_proj.weight.dtype

    # ----------------------------------------------------------------------------------------- prefix
    def embed_prefix(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                     token_masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pixels: [B, V, 3, H, W] in [-1, 1], image_masks: [B, V] bool, tokens/token_masks: [B, L]
        -> (embeddings [B, V*N + L, Wg] in compute dtype, valid [B, V*N + L] bool)"""
        batch, views = pixels.shape[:2]
        images = self.vision(pixels.flatten(0, 1))  # [B*V, N, Wg]
        num_patches = images.shape[1]
        images = images.reshape(batch, views * num_patches, -1)  # [B, V*N, Wg]
        image_valid = image_masks.bool().repeat_interleave(num_patches, dim=1)  # [B, V*N]
        text = self.embed_tokens(tokens)  # [B, L, Wg]
        text = text * torch.tensor(math.sqrt(text.shape[-1]), dtype=text.dtype)
        embs = torch.cat([images.to(self.compute_dtype), text.to(self.compute_dtype)], dim=1)
        return embs, torch.cat([image_valid, token_masks.bool()], dim=1)

    def fill_prefix_cache(self, embs: torch.Tensor, valid: torch.Tensor) -> tuple[PrefixCache, torch.Tensor]:
        """embs: [B, P, Wg], valid: [B, P] -> (cache, backbone output after final norm [B, P, Wg])"""
        mask = make_attention_mask(valid, torch.zeros_like(valid))  # [B, P, P] bidirectional over valid tokens
        positions = torch.cumsum(valid.long(), dim=1) - 1  # [B, P]
        hidden, kv = self.paligemma(embs, positions, mask, return_kv=True)
        return PrefixCache(kv=kv, valid=valid), hidden

    # ----------------------------------------------------------------------------------------- suffix
    def suffix_ar_mask(self, device: torch.device | None = None) -> torch.Tensor:
        """[S] bool: pi0 [state, a0, a1..] = [1, 1, 0..]; pi0.5 [a0, a1..] = [1, 0..]."""
        horizon = self.config.action_horizon
        ar = torch.zeros(horizon + (0 if self.is_pi05 else 1), dtype=torch.bool, device=device)
        ar[0] = True
        if not self.is_pi05:
            ar[1] = True
        return ar

    def time_conditioning(self, t: torch.Tensor) -> torch.Tensor:
        """pi0.5 adaRMS conditioning. t: [B] -> cond [B, We] = swish(out(swish(in(sincos(t))))); a per-token
        time [B, H] (training-time RTC) -> cond [B, H, We], one per action token"""
        cfg = self.config
        emb = sincos_time_embedding(t, cfg.expert.width, cfg.time_min_period, cfg.time_max_period)
        emb = emb.to(self.time_mlp_in.weight.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def embed_suffix(self, state: torch.Tensor | None, x_t: torch.Tensor, t: torch.Tensor):
        """state: [B, A] normalized padded state (pi0 only), x_t: [B, H, A], t: [B] or per token [B, H]
        (training-time RTC: the clean prefix at time 0) -> (embeddings [B, S, We], cond [B, We] or per token
        [B, H, We] for pi0.5 / None for pi0)"""
        cfg = self.config
        actions = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))  # [B, H, We]
        if self.is_pi05:
            return actions, self.time_conditioning(t)
        if state is None:
            raise ValueError("pi0 needs the robot state for its state token")
        state_token = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None, :]  # [B, 1, We]
        emb = sincos_time_embedding(t, cfg.expert.width, cfg.time_min_period, cfg.time_max_period)
        emb = emb.to(actions.dtype)
        emb = (emb if t.dim() == 2 else emb[:, None, :]).expand_as(actions)  # [B, H, We]
        fused = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(torch.cat([actions, emb], dim=-1))))
        return torch.cat([state_token.to(fused.dtype), fused], dim=1), None

    def suffix_positions_and_mask(self, prefix_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prefix_valid: [B, P] -> (positions [B, S], mask [B, S, P + S] for suffix queries over [prefix; suffix])"""
        ar = self.suffix_ar_mask(prefix_valid.device)  # [S]
        batch, num_suffix = prefix_valid.shape[0], ar.shape[0]
        suffix_valid = torch.ones(batch, num_suffix, dtype=torch.bool, device=prefix_valid.device)
        joint_valid = torch.cat([prefix_valid, suffix_valid], dim=1)  # [B, P + S]
        joint_ar = torch.cat([torch.zeros_like(prefix_valid[0]), ar])  # [P + S]
        mask = make_attention_mask(joint_valid, joint_ar)[:, prefix_valid.shape[1]:, :]  # [B, S, P + S]
        positions = prefix_valid.long().sum(dim=1, keepdim=True) + torch.arange(num_suffix, device=ar.device)
        return positions, mask

    def denoise_step(self, cache: PrefixCache, state: torch.Tensor | None, x_t: torch.Tensor,
                     t: torch.Tensor) -> torch.Tensor:
        """Velocity at (x_t, t). x_t: [B, H, A] fp32, t: [B] or per token [B, H] -> v [B, H, A] fp32"""
        embs, cond = self.embed_suffix(state, x_t, t)  # [B, S, We]
        positions, mask = self.suffix_positions_and_mask(cache.valid)
        out, _ = self.expert(embs.to(self.compute_dtype), positions, mask, past_kv=cache.kv, cond=cond)
        return self.action_out_proj(out[:, -self.config.action_horizon:].to(self.action_out_proj.weight.dtype)).float()

    def velocity_joint(self, prefix_embs: torch.Tensor, prefix_valid: torch.Tensor, state: torch.Tensor | None,
                       x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The same velocity without a cache: both experts over the joint sequence (training-time form).

        Used to check that caching the prefix changes nothing. Shapes as in denoise_step.
        """
        suffix_embs, cond = self.embed_suffix(state, x_t, t)
        positions, suffix_mask = self.suffix_positions_and_mask(prefix_valid)
        prefix_mask = make_attention_mask(prefix_valid, torch.zeros_like(prefix_valid))  # [B, P, P]
        prefix_rows = F.pad(prefix_mask, (0, suffix_embs.shape[1]), value=False)  # prefix never sees suffix
        mask = torch.cat([prefix_rows, suffix_mask], dim=1)  # [B, P + S, P + S]
        prefix_positions = torch.cumsum(prefix_valid.long(), dim=1) - 1
        _, out = joint_forward((self.paligemma, self.expert), (prefix_embs, suffix_embs.to(self.compute_dtype)),
                               torch.cat([prefix_positions, positions], dim=1), mask, conds=(None, cond))
        return self.action_out_proj(out[:, -self.config.action_horizon:].to(self.action_out_proj.weight.dtype)).float()
