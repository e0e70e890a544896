"""Flow-matching sampler of GR00T N1.6: Euler from noise (t = 0) to actions (t = 1) in N steps.

x_{k+1} = x_k + (1/N) v(x_k, bucket_k), bucket_k = int(k / N * num_timestep_buckets): the DiT sees discrete
timesteps 0, 250, 500, 750 for N = 4 (the reference's get_action_with_features). The noise is an argument so a
caller can pin it.
"""

from __future__ import annotations

import torch

from flashrt_core.model.groot.action_head import GrootActionHead


def sample_actions(head: GrootActionHead, backbone_features: torch.Tensor, backbone_mask: torch.Tensor,
                   image_mask: torch.Tensor, state: torch.Tensor, embodiment_id: torch.Tensor,
                   noise: torch.Tensor, num_steps: int | None = None) -> torch.Tensor:
    """backbone_features [B, L, D], masks [B, L] bool, state [B, 1, max_state_dim] normalized + padded,
    embodiment_id [B] int64, noise [B, horizon, max_action_dim] -> normalized actions [B, horizon, max_action_dim]"""
    steps = head.cfg.num_inference_timesteps if num_steps is None else num_steps
    vl_embeds, state_features = head.encode(backbone_features, state, embodiment_id)
    actions = noise.to(vl_embeds.dtype)
    dt = 1.0 / steps
    for k in range(steps):
        bucket = int(k / float(steps) * head.cfg.num_timestep_buckets)
        v = head.velocity(vl_embeds, state_features, actions, bucket, embodiment_id, image_mask, backbone_mask)
        actions = actions + dt * v
    return actions
