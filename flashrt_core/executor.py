"""The eager reference forward: the exact, readable path every fast executor is compared with.

An executor turns preprocessed model inputs into a normalized action chunk:
    sample_actions(pixels, image_masks, tokens, token_masks, state, noise) -> actions
The graph engine (flashrt_core.engine.build_executor) returns objects with the same method, so the Policy
can use either. `rtc` (a flashrt_core.rtc.RtcPlan) conditions the chunk on the previous one (real-time chunking);
None runs the plain sampler, unchanged.
"""

from __future__ import annotations

import torch

from flashrt_core.config import ModelConfig
from flashrt_core.flow import euler_integrate
from flashrt_core.model import PiModel
from flashrt_core.rtc import RtcPlan, rtc_euler_integrate


class ReferenceExecutor:
    """Prefix once into a KV cache, then `num_steps` Euler steps of the action expert (eager PyTorch)."""

    name = "reference"
    uses_model = True            # runs the PiModel's modules on every call

    def __init__(self, model: PiModel, config: ModelConfig, device: torch.device):
        self.model = model
        self.config = config
        self.device = torch.device(device)

    @torch.inference_mode()
    def sample_actions(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                       token_masks: torch.Tensor, state: torch.Tensor | None, noise: torch.Tensor) -> torch.Tensor:
        """pixels: [B, V, 3, H, W] fp32 in [-1, 1], image_masks: [B, V] bool, tokens: [B, L] int64,
        token_masks: [B, L] bool, state: [B, A] fp32 normalized + zero-padded (pi0) or None,
        noise: [B, horizon, A] fp32 -> normalized actions [B, horizon, A] fp32 (A = max_action_dim)"""
        model = self.model
        embs, valid = model.embed_prefix(pixels, image_masks, tokens, token_masks)  # [B, P, Wg], [B, P]
        cache, _ = model.fill_prefix_cache(embs, valid)
        batch = noise.shape[0]

        def velocity(x_t: torch.Tensor, t: float) -> torch.Tensor:
            time = torch.full((batch,), t, dtype=torch.float32, device=x_t.device)  # [B]
            return model.denoise_step(cache, state, x_t, time)  # [B, horizon, A]

        return euler_integrate(velocity, noise, self.config.num_steps)

    @torch.no_grad()
    def sample_actions_rtc(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                           token_masks: torch.Tensor, state: torch.Tensor | None, noise: torch.Tensor,
                           rtc: RtcPlan) -> torch.Tensor:
        """sample_actions conditioned on a previous chunk (rtc.rtc_euler_integrate). Under no_grad rather than
        inference_mode: guided RTC differentiates every step through the denoiser, which saves the prefix cache
        for its backward."""
        model = self.model
        embs, valid = model.embed_prefix(pixels, image_masks, tokens, token_masks)
        cache, _ = model.fill_prefix_cache(embs, valid)

        def velocity(x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
            return model.denoise_step(cache, state, x_t, time)  # time [B] or per token [B, horizon]

        return rtc_euler_integrate(velocity, noise, self.config.num_steps, rtc)

    def close(self) -> None:
        self.model = None
