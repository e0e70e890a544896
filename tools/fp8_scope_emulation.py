"""What FP8 E4M3 on a scope of GEMMs does to pi0.5's / pi0's action chunk, emulated on the CPU: the fp32 reference
path with each GEMM of the scope run on its operands quantized and dequantized (E4M3, clamped to +-448), the
operands the engine's GEMM sees (a norm's affine folded into the next GEMM's weight, as engine/weights.py folds it:
Gemma's (1 + w) and SigLIP's LayerNorm (g, b)), against the same reference unquantized, on the accuracy gate's
observations (engine/gate.py: the cosine of the action chunk, GATE_FP8).

Scopes (GEMMs of the backbone, the action expert and the vision tower), joined by "+", each per-tensor (static
scales: a weight's amax, an input's amax on one calibration observation times fp8.CALIB_MARGIN; the GEMMs the
engine merges share one weight scale), with "@row" per row (each input row's own amax, each weight row's own amax),
or with "@weight" the weight alone, per row (the input stays exact: a kernel that streams FP8 weights and converts
them to bf16 before its products, as a weight-bound denoiser would):

    backbone_mlp   gate / up (merged) and down of every backbone layer: the engine's FP8 scope (engine/fp8.py)
    backbone_attn  q / k / v (merged) and o of every backbone layer
    expert_mlp     gate / up (merged) and down of every action expert layer (the denoise's GEMMs; pi0.5's
                   adaRMSNorm modulates the input with the step's time, so nothing is folded: the input as the
                   norm gives it; pi0's RMSNorm affine folded as the backbone's)
    expert_attn    q / k / v (merged) and o of every action expert layer
    vision_mlp     fc1 and fc2 of every SigLIP layer
    vision_attn    q / k / v (merged) and the output projection of every SigLIP layer

    python tools/fp8_scope_emulation.py CHECKPOINT_DIR "backbone_mlp;backbone_mlp+vision_mlp;vision_mlp@row"

prints, per scope, the cosine on each gate observation and the lowest. FP8 GEMMs accumulate in fp32 (cuBLASLt on
Hopper), so the quantization of the operands is the error the emulation adds; the engine's bf16 rounding elsewhere
is not in it (its own cosine to the reference is ~0.99998).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine.fp8 import CALIB_MARGIN, FP8_MAX  # noqa: E402
from flashrt_core.engine.gate import GATE_FP8, cosine, random_observation, reference_actions  # noqa: E402
from flashrt_core.executor import ReferenceExecutor  # noqa: E402
from flashrt_core.model.gemma import RMSNorm  # noqa: E402

FMAX = FP8_MAX[torch.float8_e4m3fn]
SCOPES = ("backbone_mlp", "backbone_attn", "expert_mlp", "expert_attn", "vision_mlp", "vision_attn")
MODES = ("", "row", "weight")     # per tensor, per row, the weight alone per row
GATE_OBSERVATIONS = 3      # as test/gpu/test_engine_gpu.py's gate


def quantize_dequantize(t: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """t / scale rounded to E4M3 (clamped to +-448), times scale, in fp32."""
    return (t / scale).clamp(-FMAX, FMAX).to(torch.float8_e4m3fn).float() * scale


class EmulatedGemm:
    """One nn.Linear of the reference model run on the engine's operands: the input before the preceding norm's
    affine (`norm`: RMSNorm, LayerNorm or None) and the weight (and bias) with that affine folded in; quantized
    when `quantized`, else exact. `group`: the GEMMs the engine merges with it (one weight scale for all). The
    folded weight is made while the GEMM is quantized (switch drops it after), so wrapping a model copies none."""

    def __init__(self, lin: nn.Linear, norm: nn.Module | None):
        self.lin, self.norm, self.group = lin, norm, [self]
        self.input_amax, self.quantized, self.mode, self.calibrating = 0.0, False, "", False
        self._folded: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.reference_forward = lin.forward
        lin.forward = self.forward

    def folded(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) with the preceding norm's affine folded in, fp32."""
        if self._folded is None:
            w = self.lin.weight.float()
            bias = self.lin.bias.float() if self.lin.bias is not None else None
            if isinstance(self.norm, RMSNorm):
                w = w * (1.0 + self.norm.weight.float())
            elif isinstance(self.norm, nn.LayerNorm):
                bias = (0.0 if bias is None else bias) + w @ self.norm.bias.float()
                w = w * self.norm.weight.float()
            self._folded = w, bias
        return self._folded

    def engine_input(self, y: torch.Tensor) -> torch.Tensor:
        """The GEMM's input as the engine computes it: the norm's output without its affine."""
        if self.norm is None:
            return y.float()
        x = self.norm.emulation_input.float()
        if isinstance(self.norm, RMSNorm):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.norm.eps)
        return F.layer_norm(x, x.shape[-1:], eps=self.norm.eps)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if self.calibrating:
            self.input_amax = max(self.input_amax, float(self.engine_input(y).abs().max()))
        if not self.quantized:
            return self.reference_forward(y)
        x = self.engine_input(y)
        weight, bias = self.folded()
        if self.mode in ("row", "weight"):
            w_scale = weight.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / FMAX
        else:
            w_scale = max(float(g.folded()[0].abs().max()) for g in self.group) / FMAX
        if self.mode == "weight":
            return F.linear(x, quantize_dequantize(weight, w_scale), bias).to(y.dtype)
        if self.mode == "row":
            x_scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / FMAX
        else:
            x_scale = self.input_amax * CALIB_MARGIN / FMAX
        return F.linear(quantize_dequantize(x, x_scale), quantize_dequantize(weight, w_scale), bias).to(y.dtype)


def _keep_norm_input(norm: nn.Module) -> None:
    def keep(module, args):
        module.emulation_input = args[0]
    norm.register_forward_pre_hook(keep)


def _merged(gemms: list[EmulatedGemm]) -> list[EmulatedGemm]:
    for g in gemms:
        g.group = gemms
    return gemms


def attach(model) -> dict[str, list[EmulatedGemm]]:
    """Every GEMM of SCOPES in `model` (a PiModel) wrapped, exact until a scope is switched on."""
    scopes: dict[str, list[EmulatedGemm]] = {name: [] for name in SCOPES}
    for layer in model.paligemma.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            _keep_norm_input(norm)
        scopes["backbone_mlp"] += _merged([EmulatedGemm(layer.gate_proj, layer.post_attention_layernorm),
                                           EmulatedGemm(layer.up_proj, layer.post_attention_layernorm)])
        scopes["backbone_mlp"].append(EmulatedGemm(layer.down_proj, None))
        scopes["backbone_attn"] += _merged([EmulatedGemm(m, layer.input_layernorm)
                                            for m in (layer.q_proj, layer.k_proj, layer.v_proj)])
        scopes["backbone_attn"].append(EmulatedGemm(layer.o_proj, None))
    for layer in model.expert.layers:
        folds = [n if isinstance(n, RMSNorm) else None for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        for norm in filter(None, folds):
            _keep_norm_input(norm)
        scopes["expert_mlp"] += _merged([EmulatedGemm(layer.gate_proj, folds[1]),
                                         EmulatedGemm(layer.up_proj, folds[1])])
        scopes["expert_mlp"].append(EmulatedGemm(layer.down_proj, None))
        scopes["expert_attn"] += _merged([EmulatedGemm(m, folds[0]) for m in (layer.q_proj, layer.k_proj,
                                                                              layer.v_proj)])
        scopes["expert_attn"].append(EmulatedGemm(layer.o_proj, None))
    for layer in model.vision.layers:
        for norm in (layer.layer_norm1, layer.layer_norm2):
            _keep_norm_input(norm)
        scopes["vision_mlp"] += [EmulatedGemm(layer.mlp.fc1, layer.layer_norm2), EmulatedGemm(layer.mlp.fc2, None)]
        attn = layer.self_attn
        scopes["vision_attn"] += _merged([EmulatedGemm(m, layer.layer_norm1)
                                          for m in (attn.q_proj, attn.k_proj, attn.v_proj)])
        scopes["vision_attn"].append(EmulatedGemm(attn.out_proj, None))
    return scopes


def switch(scopes: dict[str, list[EmulatedGemm]], scope: str) -> None:
    """Quantize exactly the GEMMs of `scope` ("" for none): names of SCOPES joined by "+", each "@row" for per-row
    scales or "@weight" for the weight alone."""
    for gemms in scopes.values():
        for g in gemms:
            g.quantized, g.mode = False, ""
            g._folded = None
    for part in filter(None, scope.split("+")):
        name, _, how = part.partition("@")
        if name not in scopes or how not in MODES:
            raise ValueError(f"a scope is names of {SCOPES} joined by '+', each optionally '@row' or '@weight'; "
                             f"got {part!r}")
        for g in scopes[name]:
            g.quantized, g.mode = True, how


def emulate(model, cfg, scope_list: list[str], report=print) -> dict[str, list[float]]:
    """{scope: the cosine on each gate observation} of the reference with the scope's GEMMs quantized against the
    reference; the scales calibrated on the gate's calibration observation first."""
    reference = ReferenceExecutor(model, cfg, torch.device("cpu"))
    scopes = attach(model)
    observations = [random_observation(cfg, np.random.default_rng(seed), views=2 + seed % 2,
                                       n_text=20 + 13 * seed, vocab=1024) for seed in range(GATE_OBSERVATIONS)]
    exact = [reference_actions(reference, obs)[:, :cfg.action_dim] for obs in observations]
    every = [g for gemms in scopes.values() for g in gemms]
    for g in every:
        g.calibrating = True
    reference_actions(reference, random_observation(cfg, np.random.default_rng(0), views=2, n_text=20, vocab=1024))
    for g in every:
        g.calibrating = False
    result = {}
    for scope in scope_list:
        switch(scopes, scope)
        result[scope] = [cosine(reference_actions(reference, obs)[:, :cfg.action_dim], want)
                         for obs, want in zip(observations, exact)]
        report(f"| {scope or '(none)'} | {min(result[scope]):.5f} | "
               f"{', '.join(f'{c:.5f}' for c in result[scope])} |")
    switch(scopes, "")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a pi0.5 or pi0 checkpoint folder (python -m flashrt_core.fixtures)")
    parser.add_argument("scopes", help="scopes separated by ';' (module docstring)")
    parser.add_argument("--config", default="pi05")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = get_config(args.config)
    model = load_model_weights(args.checkpoint, cfg, "cpu", torch.float32)
    print(f"FP8 E4M3 emulated, {args.config}, gate {GATE_FP8} (the lowest cosine must reach it)\n"
          "| scope | lowest cosine | each observation |\n|---|---|---|", flush=True)
    emulate(model, cfg, args.scopes.split(";"), report=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
