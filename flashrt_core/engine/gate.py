"""Accuracy gate: the engine's action chunk against the eager reference path, same weights, same pinned noise.

    cosine(engine chunk, reference chunk) over the flattened (horizon, action_dim) normalized actions
    bf16 engine >= GATE_BF16, FP8 engine >= GATE_FP8 (issue 4; the seed project publishes 0.9992-0.9996)

Observations are random: uint8 images (at the model's image size, so both paths see identical pixels),
random token ids with right padding, random state and N(0, 1) noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flashrt_core.config import ModelConfig
from flashrt_core.executor import ReferenceExecutor

GATE_BF16 = 0.999
GATE_FP8 = 0.998


@dataclass
class Observation:
    images: list[np.ndarray | None]     # uint8 (S, S, 3) per view, None = missing
    tokens: np.ndarray                  # (max_token_len,) int64
    token_mask: np.ndarray              # (max_token_len,) bool
    state: np.ndarray                   # (max_action_dim,) float32 normalized
    noise: np.ndarray                   # (horizon, max_action_dim) float32


def random_observation(cfg: ModelConfig, rng: np.random.Generator, views: int, n_text: int,
                       image_hw: tuple[int, int] | None = None, vocab: int | None = None) -> Observation:
    """`views` present views (the first ones), `n_text` valid tokens; images at image_hw (default model size)."""
    h, w = image_hw or (cfg.vision.image_size, cfg.vision.image_size)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) if v < views else None
              for v in range(len(cfg.view_names))]
    tokens = np.zeros(cfg.max_token_len, dtype=np.int64)
    tokens[0] = 2  # BOS
    tokens[1:n_text] = rng.integers(3, vocab or cfg.paligemma.vocab_size, n_text - 1)
    mask = np.arange(cfg.max_token_len) < n_text
    state = rng.uniform(-1, 1, cfg.max_action_dim).astype(np.float32)
    noise = rng.standard_normal((cfg.action_horizon, cfg.max_action_dim)).astype(np.float32)
    return Observation(images, tokens, mask, state, noise)


def reference_inputs(cfg: ModelConfig, obs: Observation, device: torch.device) -> tuple:
    """The reference executor's sample_actions inputs for `obs` on `device`: (pixels (1, V, 3, S, S) in [-1, 1],
    image masks, tokens, token mask, state or None (pi0.5), noise). Images must be at the model's size: no resize."""
    size = cfg.vision.image_size
    pixels = torch.stack([torch.from_numpy(img).permute(2, 0, 1).float() / 255.0 * 2.0 - 1.0 if img is not None
                          else torch.full((3, size, size), -1.0) for img in obs.images])       # (V, 3, S, S)
    masks = torch.tensor([img is not None for img in obs.images])
    state = torch.from_numpy(obs.state)[None].to(device) if cfg.model_type == "pi0" else None
    return (pixels[None].to(device), masks[None].to(device), torch.from_numpy(obs.tokens)[None].to(device),
            torch.from_numpy(obs.token_mask)[None].to(device), state, torch.from_numpy(obs.noise)[None].to(device))


def reference_actions(reference: ReferenceExecutor, obs: Observation) -> np.ndarray:
    """The reference executor on the same observation (images must be at the model's size: no resize)."""
    out = reference.sample_actions(*reference_inputs(reference.config, obs, reference.device))
    return out[0].float().cpu().numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
