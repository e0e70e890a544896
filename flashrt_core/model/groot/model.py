"""The GR00T N1.6 model: `backbone` (Eagle) and `action_head` (DiT + embodiment projectors), named as the
checkpoints are (their state_dict keys are groot_checkpoint.weight_table's)."""

from __future__ import annotations

import torch
from torch import nn

from flashrt_core.model.groot.action_head import GrootActionHead
from flashrt_core.model.groot.backbone import EagleBackbone
from flashrt_core.model.groot.config import GrootConfig
from flashrt_core.model.groot.sampler import sample_actions


class GrootModel(nn.Module):
    def __init__(self, cfg: GrootConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        self.cfg = cfg
        self.backbone = EagleBackbone(cfg, attn_implementation)
        self.action_head = GrootActionHead(cfg)

    @torch.inference_mode()
    def predict_normalized(self, views, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           state: torch.Tensor, embodiment_id: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """views: [N, 3, H, W] or a list of [3, H_i, W_i] normalized, input_ids / attention_mask [B, L],
        state [B, 1, max_state_dim], embodiment_id [B], noise [B, horizon, max_action_dim]
        -> normalized actions [B, horizon, max_action_dim]"""
        feats, mask, image_mask = self.backbone(views, input_ids, attention_mask)
        dtype = next(self.action_head.parameters()).dtype
        return sample_actions(self.action_head, feats.to(dtype), mask, image_mask, state.to(dtype),
                              embodiment_id, noise.to(dtype))
