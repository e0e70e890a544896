"""Load-time weight preparation: everything that does not depend on the observation is computed once here.

- RMSNorm (1 + w) of Gemma and the LayerNorm affine of SigLIP are folded into the GEMM that follows:
      rms(x) * (1 + w) @ W^T          = rms(x) @ (W * (1 + w)[None, :])^T
      (ln(x) * g + b) @ W^T + c       = ln(x) @ (W * g[None, :])^T + (W @ b + c)
  so the norm kernels run without weights (`fused_weights=False` keeps the weights in the norm instead).
- Q/K/V are merged into one GEMM, gate/up into one GEMM (rows [gate; up]).
- pi0.5: the time conditioning takes `num_steps` known values of t, so every adaRMSNorm's (1 + scale), shift and
  gate of every layer and step is computed once: `ExpertTables` (steps x layers x 2 norms x 3 x width, fp32).
- pi0: the time half of action_time_mlp_in is precomputed per step as a bias.
- The last backbone layer only needs its K/V (the prefix output is unused), so its o/MLP weights are not kept;
  pi0-FAST (prepare_fast_weights) keeps every backbone layer whole, the final norm and the tied LM head, and has
  no action expert.
Folds are computed in fp32 and rounded once to the engine dtype.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashrt_core.config import ModelConfig
from flashrt_core.flow import time_schedule
from flashrt_core.model import PiModel, sincos_time_embedding
from flashrt_core.rtc import CLEAN_TIME

log = logging.getLogger(__name__)


@dataclass
class Linear:
    """y = x @ W^T + b over one or more row blocks of W (several blocks = unmerged GEMMs, concatenated)."""

    parts: list[tuple[torch.Tensor, torch.Tensor | None]]  # [(W (N_i, K), b (N_i,) or None)]
    fp8: object | None = None                               # Fp8Linear, set by fp8.quantize_wide when asked
    w8: tuple[torch.Tensor, torch.Tensor] | None = None     # (W FP8 (N, K), scale (N,) fp32): fp8.weight_only_fp8

    @property
    def out_features(self) -> int:
        return sum(w.shape[0] for w, _ in self.parts)


@dataclass
class VisionLayer:
    ln1: tuple[torch.Tensor, torch.Tensor] | None   # (gamma, beta) when not folded
    qkv: Linear
    out: Linear
    ln2: tuple[torch.Tensor, torch.Tensor] | None
    fc1: Linear
    fc2: Linear


@dataclass
class GemmaLayer:
    norm1: torch.Tensor | None   # (1 + w) when not folded (RMSNorm experts only)
    qkv: Linear
    o: Linear | None             # None: the backbone's last layer (only its K/V are needed)
    norm2: torch.Tensor | None
    gate_up: Linear | None
    down: Linear | None


@dataclass
class ExpertTables:
    """pi0.5 adaRMSNorm modulation for every step: norm[s, l, j] = (scale1p, shift, gate) of norm j of layer l."""

    norm: torch.Tensor         # (steps, layers, 2, 3, W) fp32
    final: torch.Tensor        # (steps, 2, W) fp32: (scale1p, shift) of the final norm


@dataclass(frozen=True)
class Pi0StepTables:
    """EngineWeights.pi0_step_tables: w_fold (We, A) engine dtype, c (steps, We) fp32, out (the time MLP's output
    GEMM, bias-free), b_out (We,) fp32, and step_out's final_scale, gate (ones) and shift (zeros), (We,) fp32."""

    w_fold: torch.Tensor
    c: torch.Tensor
    out: Linear
    b_out: torch.Tensor
    final_scale: torch.Tensor
    ones: torch.Tensor
    zeros: torch.Tensor


@dataclass
class EngineWeights:
    config: ModelConfig
    dtype: torch.dtype
    folded: bool
    patch_w: torch.Tensor               # (Wv, 3 * p * p) fp32, rows of the patch conv
    patch_b: torch.Tensor               # (Wv,) fp32
    pos_emb: torch.Tensor               # (N, Wv) fp32
    vision: list[VisionLayer]
    post_ln: tuple[torch.Tensor, torch.Tensor] | None
    projector: Linear
    embed_tokens: torch.Tensor          # (vocab, Wg), shared with the model
    backbone: list[GemmaLayer]
    expert: list[GemmaLayer]
    expert_final_norm: torch.Tensor | None    # (1 + w) of pi0's final norm when not folded; pi0.5: None
    action_in: Linear
    action_out: tuple[torch.Tensor, torch.Tensor]   # (W (A, We) engine dtype, b (A,) fp32) for GEMM + Euler
    tables: ExpertTables | None               # pi0.5
    state_proj: Linear | None                 # pi0
    time_in_action: Linear | None             # pi0: action half of action_time_mlp_in
    time_in_bias: torch.Tensor | None         # pi0: (steps, We) fp32 = W_time @ emb(t_s) + b
    time_out: Linear | None                   # pi0: action_time_mlp_out
    dts: list[float]                          # Euler step sizes (all -1/steps)
    vision_mlp_pad: int = 0                   # the vision MLP width rounded up to a multiple of this (0: as is)
    final_norm: torch.Tensor | None = None    # pi0-FAST: (1 + w) of the backbone's final RMSNorm, fp32
    lm_head: torch.Tensor | None = None       # pi0-FAST: the tied LM head (vocab, Wg) in the engine dtype
    lm_head8: object | None = None            # pi0-FAST, FP8: (Linear with w8, SkinnyConfig) of the LM head
    clean_tables: ExpertTables | None = None  # pi0.5: the modulation at rtc.CLEAN_TIME, norm (1, L, 2, 3, We)
    clean_time_bias: torch.Tensor | None = None   # pi0: (We,) fp32, time_in_bias at rtc.CLEAN_TIME

    def patch_gemm_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused patch embedding's (flashrt_kernels/patch_embed.py) GEMM weight in the engine dtype, (Wv, 3 * p * p)
        with zero columns up to a multiple of 8 (16-byte rows: cuBLAS runs an unaligned bf16 operand, 588 wide for
        SigLIP, on slower kernels), and its fp32 (N, Wv) addend, the position embedding plus the conv bias; made at
        first use, then kept."""
        if self._patch_gemm is None:
            width = self.patch_w.shape[1]
            padded = torch.zeros(self.patch_w.shape[0], -(-width // 8) * 8, device=self.patch_w.device,
                                 dtype=self.dtype)
            padded[:, :width] = self.patch_w
            self._patch_gemm = (padded, (self.pos_emb + self.patch_b[None, :]).contiguous())
        return self._patch_gemm

    _patch_gemm: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def pi0_step_tables(self) -> Pi0StepTables:
        """pi0's fused step ends (flashrt_kernels/denoise_step.py time_mlp_in and step_out): the action input projection
        folded into the action half of the time MLP's input GEMM, W_ta W_in (We, A) in the engine dtype, and W_ta
        b_in + the time bias of each step (steps, We) fp32 (both folds in fp32 from the prepared weights); the
        output GEMM without its bias and the bias apart; the final norm's scale (ones when folded into
        action_out) and a gate of ones and a shift of zeros for step_out. Made at first use, then kept."""
        if self.tables is not None or self.time_in_action is None:
            raise ValueError("pi0_step_tables: only pi0 has a time MLP")
        if self._pi0_step is None:
            (w_ta, _), = self.time_in_action.parts
            (w_in, b_in), = self.action_in.parts
            (w_out, b_out), = self.time_out.parts
            w_ta = w_ta.float()
            c = self.time_in_bias.float() + (w_ta @ b_in.float() if b_in is not None else 0.0)
            width = w_ta.shape[0]
            ones = torch.ones(width, device=w_ta.device)
            scale = self.expert_final_norm.float() if self.expert_final_norm is not None else ones
            self._pi0_step = Pi0StepTables(
                w_fold=(w_ta @ w_in.float()).to(self.dtype).contiguous(), c=c.contiguous(),
                out=Linear([(w_out, None)]),
                b_out=(b_out.float() if b_out is not None else torch.zeros_like(ones)).contiguous(),
                final_scale=scale.contiguous(), ones=ones, zeros=torch.zeros_like(ones))
        return self._pi0_step

    _pi0_step: Pi0StepTables | None = None

    def training_time_tables(self) -> ExpertTables:
        """pi0.5's modulation for training-time RTC: each vector of each step beside its value at the time of clean
        data, norm (steps, L, 2, 3, 2, We) and final (steps, 2, 2, We), variant 0 the step's time, 1 clean, one
        row (We) apart, so that ada_rms_norm's row_variant picks a row's variant. Made at first use (by the first
        training-time workspace, before its capture), then kept: steps * L * 12 * We * 4 bytes, 8.8 MB for pi0.5
        (10 steps, 18 layers, We 1024)."""
        if self.tables is None or self.clean_tables is None:
            raise ValueError("training_time_tables: only pi0.5 has adaRMS modulation tables")
        if self._training_time is None:
            t, c = self.tables, self.clean_tables
            self._training_time = ExpertTables(
                norm=torch.stack([t.norm, c.norm.expand_as(t.norm)], dim=-2).contiguous(),
                final=torch.stack([t.final, c.final.expand_as(t.final)], dim=-2).contiguous())
        return self._training_time

    _training_time: ExpertTables | None = None


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float()


def _fold(weights: list[torch.Tensor], biases: list[torch.Tensor | None], scale: torch.Tensor | None,
          shift: torch.Tensor | None, dtype: torch.dtype, merge: bool) -> Linear:
    """W_i * scale[None, :] (and b_i + W_i @ shift); merged into one block when `merge`."""
    parts = []
    for w, b in zip(weights, biases):
        w32 = _f32(w)
        b32 = None if b is None else _f32(b)
        if shift is not None:
            b32 = (torch.zeros(w32.shape[0], device=w32.device) if b32 is None else b32) + w32 @ _f32(shift)
        if scale is not None:
            w32 = w32 * _f32(scale)[None, :]
        parts.append((w32, b32))
    if merge and len(parts) > 1:
        w_cat = torch.cat([w for w, _ in parts])
        b_cat = None if all(b is None for _, b in parts) else torch.cat(
            [b if b is not None else torch.zeros(w.shape[0], device=w.device) for w, b in parts])
        parts = [(w_cat, b_cat)]
    return Linear([(w.to(dtype).contiguous(), None if b is None else b.to(dtype)) for w, b in parts])


def _merged_already(modules: list[torch.nn.Linear]) -> torch.Tensor | None:
    """The merged tensor when the modules' weights are already consecutive rows of one storage (an executor built
    before on the same model merged them), else None."""
    first = modules[0].weight
    rows, width = sum(m.weight.shape[0] for m in modules), first.shape[1]
    offset = 0
    for m in modules:
        w = m.weight
        if (w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or w.storage_offset() != offset
                or not w.is_contiguous() or w.shape[1] != width):
            return None
        offset += w.numel()
    if first.untyped_storage().nbytes() != rows * width * first.element_size():
        return None
    return first.detach().as_strided((rows, width), (width, 1), 0)


def merge_in_place(modules: list[torch.nn.Linear]) -> Linear:
    """The modules' weights as one merged Linear, with their biases concatenated (a copy) where they have them;
    each module's weight becomes a view into the merged weight (one copy in memory; a second executor on the same
    model reads the same one)."""
    bias = (None if all(m.bias is None for m in modules) else
            torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.weight.shape[0])
                       for m in modules]))
    merged = _merged_already(modules)
    if merged is not None:
        return Linear([(merged, bias)])
    merged = torch.cat([m.weight.detach() for m in modules]).contiguous()
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(merged[start:start + rows], requires_grad=False)
        start += rows
    return Linear([(merged, bias)])


def _linear(module: torch.nn.Linear, dtype: torch.dtype) -> Linear:
    return _fold([module.weight], [module.bias], None, None, dtype, merge=True)


def pad_mlp_width(fc1: Linear, fc2: Linear, multiple: int) -> tuple[Linear, Linear]:
    """fc1 / fc2 of an MLP with its hidden width rounded up to a multiple of `multiple`: zero rows (and zero bias)
    appended to fc1, zero columns to fc2. The extra hidden units are act(0) = 0 for GELU, times zero weights: the
    output is the same, only the GEMM shapes change (SigLIP's 4304 is not a multiple of 64). Merged Linears only."""
    (w1, b1), (w2, b2) = fc1.parts[0], fc2.parts[0]
    if len(fc1.parts) != 1 or len(fc2.parts) != 1 or w2.shape[1] != w1.shape[0]:
        raise ValueError("pad_mlp_width: fc1 and fc2 must be single blocks with fc2's K = fc1's N")
    width = w1.shape[0]
    extra = -(-width // multiple) * multiple - width
    if extra == 0:
        return fc1, fc2
    w1 = torch.cat([w1, w1.new_zeros(extra, w1.shape[1])])
    b1 = None if b1 is None else torch.cat([b1, b1.new_zeros(extra)])
    w2 = torch.cat([w2, w2.new_zeros(w2.shape[0], extra)], dim=1).contiguous()
    return Linear([(w1, b1)]), Linear([(w2, b2)])


def vision_layers(layers, dtype: torch.dtype, fold: bool, mlp_pad: int = 0) -> list[VisionLayer]:
    """SigLIP-style encoder layers (layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1 / fc2: pi's SigLIP
    and GR00T's transformers Siglip2 alike) as forward.vision_encoder reads them: with `fold` each LayerNorm's
    scale and shift folded into the GEMM after it (Q/K/V merged into one), else the norms' fp32 weights kept and
    Q/K/V as three blocks; cast to `dtype`; `mlp_pad`: fc1 / fc2 padded by pad_mlp_width (0: as is)."""
    out = []
    for layer in layers:
        att, mlp = layer.self_attn, layer.mlp
        ln1 = (layer.layer_norm1.weight, layer.layer_norm1.bias)
        ln2 = (layer.layer_norm2.weight, layer.layer_norm2.bias)
        qkv_w = [att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]
        qkv_b = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
        out.append(VisionLayer(
            ln1=None if fold else tuple(_f32(t) for t in ln1),
            qkv=_fold(qkv_w, qkv_b, *(ln1 if fold else (None, None)), dtype, merge=fold),
            out=_linear(att.out_proj, dtype),
            ln2=None if fold else tuple(_f32(t) for t in ln2),
            fc1=_fold([mlp.fc1.weight], [mlp.fc1.bias], *(ln2 if fold else (None, None)), dtype, merge=True),
            fc2=_linear(mlp.fc2, dtype)))
        if mlp_pad:
            last = out[-1]
            last.fc1, last.fc2 = pad_mlp_width(last.fc1, last.fc2, mlp_pad)
    return out


def _vision(model: PiModel, dtype: torch.dtype, fold: bool,
            mlp_pad: int = 0) -> tuple[list[VisionLayer], tuple | None, Linear]:
    layers = vision_layers(model.vision.layers, dtype, fold, mlp_pad)
    post = (model.vision.post_layernorm.weight, model.vision.post_layernorm.bias)
    proj = model.vision.projector
    projector = _fold([proj.weight], [proj.bias], *(post if fold else (None, None)), dtype, merge=True)
    return layers, (None if fold else tuple(_f32(t) for t in post)), projector


def _gemma(stack, dtype: torch.dtype, fold: bool, adaptive: bool, kv_only_last: bool) -> list[GemmaLayer]:
    out = []
    for i, layer in enumerate(stack.layers):
        fold_here = fold and not adaptive           # adaRMSNorm has no weight to fold
        one_plus = (lambda norm: None if adaptive else 1.0 + _f32(norm.weight))
        n1, n2 = one_plus(layer.input_layernorm), one_plus(layer.post_attention_layernorm)
        qkv = _fold([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight], [None] * 3,
                    n1 if fold_here else None, None, dtype, merge=fold)
        last = kv_only_last and i == len(stack.layers) - 1
        out.append(GemmaLayer(
            norm1=None if (fold_here or adaptive) else n1,
            qkv=qkv,
            o=None if last else _linear(layer.o_proj, dtype),
            norm2=None if (fold_here or adaptive or last) else n2,
            gate_up=None if last else _fold([layer.gate_proj.weight, layer.up_proj.weight], [None, None],
                                            n2 if fold_here else None, None, dtype, merge=fold),
            down=None if last else _linear(layer.down_proj, dtype)))
    return out


@torch.no_grad()
def _pi05_tables(model: PiModel, times: list[float]) -> ExpertTables:
    """Every adaRMSNorm modulation of every step, from the model's own time MLP and dense layers, in fp32."""
    device = model.time_mlp_in.weight.device
    t = torch.tensor(times, dtype=torch.float32, device=device)                      # (S,)
    cfg = model.config
    emb = sincos_time_embedding(t, cfg.expert.width, cfg.time_min_period, cfg.time_max_period)   # (S, We)
    lin = lambda m, x: F.linear(x, _f32(m.weight), _f32(m.bias))  # noqa: E731
    cond = F.silu(lin(model.time_mlp_out, F.silu(lin(model.time_mlp_in, emb))))    # (S, We) fp32

    def modulation(norm) -> torch.Tensor:
        scale, shift, gate = lin(norm.dense, cond).chunk(3, dim=-1)                 # each (S, We)
        return torch.stack([1.0 + scale, shift, gate], dim=1)                       # (S, 3, We)

    per_layer = [torch.stack([modulation(layer.input_layernorm), modulation(layer.post_attention_layernorm)], 1)
                 for layer in model.expert.layers]                                  # L x (S, 2, 3, We)
    final = modulation(model.expert.norm)[:, :2]                                    # (S, 2, We)
    return ExpertTables(norm=torch.stack(per_layer, dim=1).contiguous(), final=final.contiguous())


@torch.no_grad()
def _pi0_time_bias(model: PiModel, times: list[float]) -> torch.Tensor:
    """pi0's time half of the action-time MLP's input GEMM plus its bias at each time: (len(times), We) fp32."""
    mlp_in = model.action_time_mlp_in
    ex_w = model.config.expert.width
    t = torch.tensor(times, dtype=torch.float32, device=mlp_in.weight.device)
    emb = sincos_time_embedding(t, ex_w, model.config.time_min_period, model.config.time_max_period)   # (S, We)
    return emb @ _f32(mlp_in.weight[:, ex_w:]).T + _f32(mlp_in.bias)


def _vision_fields(model, dtype: torch.dtype, fold: bool, vision_mlp_pad: int) -> dict:
    """The EngineWeights fields of the config and the vision tower (shared by pi0 / pi0.5 and pi0-FAST)."""
    vis = model.vision
    vision_layers, post_ln, projector = _vision(model, dtype, fold, vision_mlp_pad)
    return dict(config=model.config, dtype=dtype, folded=fold,
                patch_w=_f32(vis.patch_embedding.weight).flatten(1).contiguous(),
                patch_b=_f32(vis.patch_embedding.bias), pos_emb=_f32(vis.position_embedding).contiguous(),
                vision=vision_layers, post_ln=post_ln, projector=projector, vision_mlp_pad=vision_mlp_pad)


@torch.no_grad()
def prepare_weights(model: PiModel, dtype: torch.dtype = torch.bfloat16, fold: bool = True,
                    vision_mlp_pad: int = 0) -> EngineWeights:
    """Engine weights from a loaded PiModel (any dtype): folded, merged, precomputed, cast to `dtype`;
    `vision_mlp_pad`: the vision MLP's hidden width rounded up to a multiple of it (pad_mlp_width; 0: as is)."""
    cfg = model.config
    times = time_schedule(cfg.num_steps)
    is_pi05 = model.is_pi05
    ex_w = cfg.expert.width
    tables = time_in_bias = clean_tables = clean_time_bias = None
    state_proj = time_in_action = time_out = None
    if is_pi05:
        tables = _pi05_tables(model, times)
        clean_tables = _pi05_tables(model, [CLEAN_TIME])     # training-time RTC's prefix rows (training_time_tables)
    else:
        mlp_in = model.action_time_mlp_in
        time_in_bias = _pi0_time_bias(model, times)                                       # (S, We)
        clean_time_bias = _pi0_time_bias(model, [CLEAN_TIME])[0]                          # (We,)
        time_in_action = _fold([mlp_in.weight[:, :ex_w]], [None], None, None, dtype, merge=True)
        state_proj = _linear(model.state_proj, dtype)
        time_out = _linear(model.action_time_mlp_out, dtype)
    expert_final = None
    if not is_pi05 and not fold:
        expert_final = 1.0 + _f32(model.expert.norm.weight)
    out_w, out_b = _f32(model.action_out_proj.weight), _f32(model.action_out_proj.bias)
    if not is_pi05 and fold:   # pi0's final RMSNorm (1 + w) folds into action_out_proj
        out_w = out_w * (1.0 + _f32(model.expert.norm.weight))[None, :]
    weights = EngineWeights(
        **_vision_fields(model, dtype, fold, vision_mlp_pad),
        embed_tokens=model.embed_tokens.weight,
        backbone=_gemma(model.paligemma, dtype, fold, adaptive=False, kv_only_last=True),
        expert=_gemma(model.expert, dtype, fold, adaptive=is_pi05, kv_only_last=False),
        expert_final_norm=expert_final,
        action_in=_linear(model.action_in_proj, dtype),
        action_out=(out_w.to(dtype).contiguous(), out_b),
        tables=tables, state_proj=state_proj, time_in_action=time_in_action, time_in_bias=time_in_bias,
        time_out=time_out, dts=[-1.0 / cfg.num_steps] * cfg.num_steps, clean_tables=clean_tables,
        clean_time_bias=clean_time_bias)
    log.info("engine weights prepared (%s, folded=%s)", dtype, fold)
    return weights


@torch.no_grad()
def prepare_fast_weights(model, dtype: torch.dtype = torch.bfloat16, fold: bool = True,
                         vision_mlp_pad: int = 0) -> EngineWeights:
    """Engine weights of a Pi0FastModel: vision and every backbone layer as prepare_weights makes them (folded,
    merged, cast), the final RMSNorm's (1 + w) in fp32 (the norm kernel applies it: the LM head is the token
    embedding, shared with the prefix's text embedding, so nothing is folded into it), the LM head in `dtype`
    (the embedding table itself when it already is). No action expert."""
    embed = model.embed_tokens.weight
    weights = EngineWeights(
        **_vision_fields(model, dtype, fold, vision_mlp_pad),
        embed_tokens=embed,
        backbone=_gemma(model.paligemma, dtype, fold, adaptive=False, kv_only_last=False),
        expert=[], expert_final_norm=None, action_in=None, action_out=None, tables=None, state_proj=None,
        time_in_action=None, time_in_bias=None, time_out=None, dts=[],
        final_norm=(1.0 + _f32(model.paligemma.norm.weight)).contiguous(),
        lm_head=embed.detach() if embed.dtype == dtype else embed.detach().to(dtype).contiguous())
    log.info("pi0-FAST engine weights prepared (%s, folded=%s)", dtype, fold)
    return weights
