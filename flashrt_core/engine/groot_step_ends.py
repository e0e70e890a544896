"""GR00T N1.6's Euler steps around the fused DiT in few kernels (EngineOptions.groot_step_ends, with the fused DiT).

Between two DiT passes the reference (model/groot/action_head.py) runs the embodiment's action encoder, the decoder
and the Euler update; in a CUDA graph each of their small ops is a launch on the critical path, and each
CategorySpecificLinear gathers its embodiment's weights W[embodiment_id] (a copy) in every call. Here, when every
row of a batch has one embodiment (a robot's own predicts), that embodiment is part of the graph's signature
(GrootSignature.embodiment, read on the host when the call arrives) and what depends on it and on the step alone
is made once per signature, outside the graph (EmbodimentWeights):

    encoder W1, W2   the action encoder's x = cat([actions @ W1 + b1, tau_k]) @ W2 + b2 is linear in the actions,
                     and tau_k (the sinusoid of step k's timestep) is the same for every row: x = actions @ W12 +
                     c_k with W12 = W1 @ W2[:D] ([max_action_dim, D]) and c_k = b1 @ W2[:D] + tau_k @ W2[D:] + b2
                     (a bias row per step), both made in fp32 once: one GEMM with K = max_action_dim per step
                     instead of two (K = max_action_dim, then 2 D), and no concatenation
    encoder W3       silu(x) @ W3 + b3 + the learned action positions: W3 as the DiT's GEMMs run it (the few-row
                     GEMM's partials with the output projection's launch configuration, where the DiT has one for
                     its shape), summed by the DiT's first LayerNorm into the residual stream, which starts each
                     step as [state features; b3 + positions] (fp32, one copy); the state row's input is zero
    state encoder,   the embodiment's weights as views (no copy); ReLU and the bias in the GEMM's epilogue
    decoder          (torch._addmm_activation: cuBLASLt's on the GPU)

Per step, in the graph: one GEMM and one SiLU for the encoder's x, the residual stream's copy, W3's GEMM, the DiT
(engine/groot_fused_dit.py), the decoder's two GEMMs and the Euler update (actions + dt * velocity, one kernel).
The step tables' path (groot_dit.euler_steps) runs ~16 kernels there, 5 of them copies of a broadcast bias ahead
of its batched GEMMs, and gathers the embodiment's weights (14 copies) once per predict; a batch of several
embodiments keeps that path. Rounding differs from the reference's by the folded weights' and the bias rows'
own rounding: in fp32 the chunk is the reference's (test/core/test_groot_step_ends.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from flashrt_core.model.groot.action_head import CategorySpecificLinear, GrootActionHead

from .groot_dit import StepTables
from .ops import Ops
from .weights import Linear

if TYPE_CHECKING:
    from .groot_fused_dit import FusedDit


def _views(layer: CategorySpecificLinear, embodiment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's (b [out], W [in, out]) of one embodiment: views of the model's weights."""
    return layer.b.detach()[embodiment], layer.W.detach()[embodiment]


def _relu_linear(x: torch.Tensor, bias: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """relu(x @ w + bias), bias and ReLU in the GEMM's epilogue on the GPU."""
    return torch._addmm_activation(bias, x, w, use_gelu=False)


class EmbodimentWeights:
    """One embodiment's encoder / decoder weights and the per-step bias rows, as the step ends read them (module
    docstring); made once per signature, outside the graph."""

    def __init__(self, head: GrootActionHead, embodiment: int, steps: StepTables, fused: FusedDit):
        enc = head.action_encoder
        d = enc.hidden_size
        with torch.inference_mode():
            b1, w1 = (t.float() for t in _views(enc.W1, embodiment))
            b2, w2 = (t.float() for t in _views(enc.W2, embodiment))
            dtype = enc.W1.W.dtype
            self.enc12 = (w1 @ w2[:d]).to(dtype)                                   # [max_action_dim, D]
            self.enc12_bias = [(b1 @ w2[:d] + tau[0, 0].float() @ w2[d:] + b2).to(dtype) for tau in steps.tau]
            b3, w3 = _views(enc.W3, embodiment)
            self.enc3 = Linear([(w3.t().contiguous(), None)])                      # x @ W3 as x @ W^T
            positions = 0.0 if steps.positions is None else steps.positions[0].float()
            self.action_rows = (b3.float() + positions).expand(head.cfg.action_horizon, -1).contiguous()
        out = fused.blocks[0].out if fused.blocks else None      # W3 on the output projection's few-row config
        self.enc3_config = (fused.few_row.get(id(out)) if out is not None and out.w8 is None
                            and out.parts[0][0].shape == self.enc3.parts[0][0].shape else None)
        self.state = (_views(head.state_encoder.layer1, embodiment), _views(head.state_encoder.layer2, embodiment))
        self.decoder = (_views(head.action_decoder.layer1, embodiment), _views(head.action_decoder.layer2, embodiment))
        self.steps = steps.steps

    def to(self, device: torch.device | str) -> EmbodimentWeights:
        pairs = lambda layers: tuple(tuple(t.to(device) for t in pair) for pair in layers)  # noqa: E731
        self.enc12 = self.enc12.to(device)
        self.enc12_bias = [t.to(device) for t in self.enc12_bias]
        self.enc3 = Linear([(self.enc3.parts[0][0].to(device), None)])
        self.action_rows = self.action_rows.to(device)
        self.state, self.decoder = pairs(self.state), pairs(self.decoder)
        return self

    def state_features(self, state: torch.Tensor) -> torch.Tensor:
        """The state encoder (CategorySpecificMLP): state [B, 1, max_state_dim] -> [B, 1, D]."""
        (b1, w1), (b2, w2) = self.state
        return torch.addmm(b2, _relu_linear(state.reshape(state.shape[0], -1), b1, w1), w2).unsqueeze(1)

    def stream_start(self, state_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per predict: the residual stream's value at each step's start [B, 1 + H, D] fp32 ([state features;
        b3 + positions]) and W3's input buffer [B, 1 + H, D] (the state row zero, the action rows each step's)."""
        b, _, d = state_features.shape
        start = torch.empty(b, 1 + self.action_rows.shape[0], d, device=state_features.device, dtype=torch.float32)
        start[:, :1] = state_features
        start[:, 1:] = self.action_rows
        return start, torch.zeros(start.shape, device=start.device, dtype=state_features.dtype)

    def tokens(self, ops: Ops, k: int, actions: torch.Tensor, w3_input: torch.Tensor) -> torch.Tensor:
        """Step k's action encoder up to W3's GEMM: silu(actions @ W12 + c_k) into W3's input rows, then the GEMM
        (its bias is in the stream's start) -> what the DiT's first norm adds to the residual stream (fp32
        split-K partials or [B (1 + H), D])."""
        b, horizon, a = actions.shape
        x = torch.addmm(self.enc12_bias[k], actions.reshape(b * horizon, a), self.enc12)
        torch.ops.aten.silu.out(x.view(b, horizon, -1), out=w3_input[:, 1:])
        rows = w3_input.view(b * (1 + horizon), -1)
        if self.enc3_config is None:
            return ops.linear(rows, self.enc3)
        return ops.few_row_linear(rows, self.enc3, self.enc3_config)

    def euler_update(self, actions: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The decoder on the DiT's output [B, 1 + H, out] and one Euler step: actions + dt * velocity."""
        (b1, w1), (b2, w2) = self.decoder
        b, t, _ = out.shape
        velocity = torch.addmm(b2, _relu_linear(out.reshape(b * t, -1), b1, w1), w2).view(b, t, -1)
        return actions.add(velocity[:, 1:], alpha=1.0 / self.steps)


def sample_steps(embodiment: EmbodimentWeights, ops: Ops, dit, state_features: torch.Tensor,
                 actions: torch.Tensor) -> torch.Tensor:
    """The Euler steps from `actions` (the noise): dit(k, residual, pending) is the DiT at step k on the residual
    stream with W3's output pending -> [B, 1 + H, out]."""
    start, w3_input = embodiment.stream_start(state_features)
    residual = torch.empty_like(start)
    for k in range(embodiment.steps):
        residual.copy_(start)
        pending = embodiment.tokens(ops, k, actions, w3_input)
        actions = embodiment.euler_update(actions, dit(k, residual, pending))
    return actions
