"""The engine forward: preprocessing, vision, prefix, unrolled denoising, over one Workspace's static buffers.

Straight-line code with fixed shapes and no host sync, so it can be captured as one CUDA graph. Every op goes
through `Ops` (dispatch-chosen implementation). Layouts (batch 1, V present views, N patches per view, T text
slots, P = V*N + T prefix tokens, S suffix tokens, H query heads, one KV head, Dh head dim):
    residual streams fp32 (rows, width); GEMM inputs/outputs in the engine dtype (bf16)
    q (rows, H, Dh) viewed as (1, 1, rows*H, Dh): with one KV head every query head attends the same keys,
    so the heads are stacked along the query axis and one attention call serves them all
    k_cache / v_cache (layers, 1, P + S, Dh): prefix K/V written once; suffix rows rewritten every step, except
    with rope_in_attention, where the attention reads the suffix K/V from the QKV GEMM output instead
    key masks: a (P,) 0/-inf vector for prefix keys + per-token visible suffix counts (ops.KeyMask)
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from flashrt_core.preprocess import resize_views_torch

from . import rtc_blend, rtc_guided
from .ops import KeyMask, Ops
from .weights import EngineWeights, ExpertTables, VisionLayer


@dataclass
class Workspace:
    """Static device buffers of one graph signature (present views, image sizes, text length)."""

    views: tuple[int, ...]                       # indices of the present views
    images: list[torch.Tensor] | None            # uint8 (H_i, W_i, 3) per present view, or None: pixel input
    pixels: torch.Tensor | None                  # (V, 3, S, S) fp32 in [-1, 1] when the input is pixels
    tokens: torch.Tensor                         # (T,) int64
    token_mask: torch.Tensor                     # (T,) bool
    state: torch.Tensor                          # (A,) fp32, normalized + padded (pi0)
    noise: torch.Tensor                          # (horizon, A) fp32
    actions: torch.Tensor                        # (horizon, A) fp32: normalized actions out
    robot_actions: torch.Tensor                  # (horizon, A) fp32: actions * scale + offset (unnormalized)
    action_affine: tuple[torch.Tensor, torch.Tensor] | None   # (scale (A,), offset (A,)) or None: identity
    k_cache: torch.Tensor                        # (layers, 1, P + S, Dh)
    v_cache: torch.Tensor
    rope_cos: torch.Tensor                       # (P + S, Dh / 2) fp32
    rope_sin: torch.Tensor
    suffix_visible: torch.Tensor                 # (S,) int32: suffix keys each suffix token may see
    extras: dict = field(default_factory=dict)  # "rtc": rtc_blend.RtcBuffers of an RTC workspace


def vision(ws: Workspace, w: EngineWeights, ops: Ops) -> torch.Tensor:
    """Present views -> image tokens (V*N, Wg) in the engine dtype."""
    vc = w.config.vision
    size, p = vc.image_size, vc.patch_size
    grid = size // p
    pixels = ws.pixels                                                                 # (V, 3, S, S) fp32
    fused_rows = ops.fused_patch_embed and pixels is None and all(img.shape == (size, size, 3) for img in ws.images)
    if pixels is None and not fused_rows:
        pixels = resize_views_torch(ws.images, size)                                   # (V, 3, S, S) fp32
    views = len(ws.images) if pixels is None else pixels.shape[0]
    if ops.fused_patch_embed:
        # patch rows in the engine dtype: straight from the uint8 views at the model's size
        # (flashrt_kernels/patch_embed.py), else from the pixels in one converting copy; then the patch GEMM in the
        # engine dtype (the rows as wide as the padded GEMM weight, their extra columns zeros)
        dev = ws.images[0].device if pixels is None else pixels.device
        patch_w, pos_bias = w.patch_gemm_tables()                                      # (Wv, Kp), (N, Wv)
        if fused_rows:
            rows = torch.empty(views * grid * grid, patch_w.shape[1], device=dev, dtype=w.dtype)   # (V*N, Kp)
            for v, img in enumerate(ws.images):
                ops.patch_rows(img, p, rows[v * grid * grid:(v + 1) * grid * grid])
        else:
            rows = torch.zeros(views * grid * grid, patch_w.shape[1], device=dev, dtype=w.dtype)   # (V*N, Kp)
            rows[:, :3 * p * p].view(views, grid, grid, 3, p, p).copy_(pixels.view(views, 3, grid, p, grid, p)
                                                                       .permute(0, 2, 4, 1, 3, 5))
        emb = torch.mm(rows, patch_w.t()).view(views, grid * grid, -1)                 # (V, N, Wv) engine dtype
        residual = torch.add(pos_bias, emb).view(views * grid * grid, -1)              # (V*N, Wv) fp32
    else:
        patches = (pixels.view(views, 3, grid, p, grid, p).permute(0, 2, 4, 1, 3, 5)
                   .reshape(views * grid * grid, 3 * p * p))                           # (V*N, 3*p*p) fp32
        residual = torch.addmm(w.patch_b, patches, w.patch_w.t())                      # (V*N, Wv) fp32
        residual = (residual.view(views, grid * grid, -1) + w.pos_emb).view(views * grid * grid, -1)
    y = vision_encoder(ops, w.vision, w.post_ln, residual, views, vc.num_heads, vc.head_dim, vc.eps, w.dtype)
    return ops.linear(y, w.projector)                                                  # (V*N, Wg)


def vision_encoder(ops: Ops, layers: list[VisionLayer], post_ln: tuple[torch.Tensor, torch.Tensor] | None,
                   residual: torch.Tensor, views: int, heads: int, head_dim: int, eps: float, dtype: torch.dtype,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A SigLIP encoder (weights.vision_layers) over the fp32 residual stream (V*N, Wv) of `views` images of N
    tokens each, updated in place: per layer the residual add and LayerNorm in one Ops.norm, one QKV GEMM, the
    unmasked attention of each image to itself (the views as the batch), the O GEMM, Ops.norm, fc1 with its tanh
    GELU (Ops.linear_gelu), fc2; then the last residual add and the post-LayerNorm (its fp32 weights, or None:
    folded into what follows). GEMM inputs in `dtype`. Returns the post-LayerNorm output (V*N, Wv) in `out_dtype`
    (None: `dtype`). Shared by pi's vision (vision above) and GR00T's (groot_vision.py)."""
    tokens = residual.shape[0] // views
    y = torch.empty(residual.shape, device=residual.device, dtype=dtype)
    x = None
    for layer in layers:
        ln = layer.ln1 or (None, None)
        ops.norm(x, residual, y, ln[0], ln[1], eps, layer_norm=True)
        qkv = ops.linear(y, layer.qkv).view(views, tokens, 3, heads, head_dim)         # (V, N, 3, Hv, dh)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))                     # (V, Hv, N, dh)
        o = ops.linear(ops.attention(q, k, v, head_dim ** -0.5), layer.out)            # attention: (V*N, Hv*dh)
        ln = layer.ln2 or (None, None)
        ops.norm(o, residual, y, ln[0], ln[1], eps, layer_norm=True)
        x = ops.linear(ops.linear_gelu(y, layer.fc1), layer.fc2)
    out = y if out_dtype in (None, dtype) else torch.empty(residual.shape, device=residual.device, dtype=out_dtype)
    ln = post_ln or (None, None)
    ops.norm(x, residual, out, ln[0], ln[1], eps, layer_norm=True)
    return out


def prefix(ws: Workspace, w: EngineWeights, ops: Ops, image_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Backbone over [image tokens; text] -> fills the K/V caches. Returns (key bias (P,), n_valid (1,))."""
    layers = prefix_layers(ws, w, ops, image_tokens)
    key_bias, n_valid = next(layers)
    for _ in layers:
        pass
    return key_bias, n_valid


def prefix_layers(ws: Workspace, w: EngineWeights, ops: Ops, image_tokens: torch.Tensor) -> Iterator:
    """prefix() a layer at a time: yields (key bias (P,), n_valid (1,)) before its first layer, then i as soon as
    layer i's K/V are in the caches (before that layer's attention and MLP), which is all the denoiser's layer i
    reads of the prefix (forward_overlapped). With a whole last layer (pi0-FAST's weights) the backbone's output
    stream, (residual (P, Wg) fp32, last MLP output x), is left in ws.extras["prefix_out"]."""
    g = w.config.paligemma
    heads, dh = g.num_heads, g.head_dim
    text = w.embed_tokens[ws.tokens].float() * math.sqrt(g.width)                      # (T, Wg) fp32
    residual = torch.cat([image_tokens.float(), text])                                 # (P, Wg) fp32
    P = residual.shape[0]
    valid = torch.cat([torch.ones(image_tokens.shape[0], dtype=torch.bool, device=text.device), ws.token_mask])
    pos = torch.cumsum(valid, 0) - 1                                                   # (P,) int64
    key_bias = torch.where(valid, 0.0, float("-inf"))                                 # (P,) fp32
    yield key_bias, valid.sum().view(1)
    mask = KeyMask(key_bias, P, None, heads)
    y = torch.empty(P, g.width, device=text.device, dtype=w.dtype)
    q = torch.empty(P, heads, dh, device=text.device, dtype=w.dtype)
    x = None
    for i, layer in enumerate(w.backbone):
        ops.norm(x, residual, y, layer.norm1, None, g.eps)
        qkv = ops.linear(y, layer.qkv)                                                 # (P, (H+2)*Dh)
        ops.qkv_rope(qkv, pos, ws.rope_cos, ws.rope_sin, q, ws.k_cache[i], ws.v_cache[i], 0, heads, 1, dh ** -0.5)
        yield i
        if layer.o is None:     # last layer: its K/V are all the denoiser needs
            break
        attn = ops.prefix_attention(q, ws.k_cache[i, 0, :P], ws.v_cache[i, 0, :P], mask)         # (P, H*Dh)
        o = ops.linear(attn, layer.o)
        ops.norm(o, residual, y, layer.norm2, None, g.eps)
        x = ops.mlp_down(ops.linear(y, layer.gate_up), layer.down)
    if w.backbone[-1].o is not None:         # pi0-FAST: every layer whole; the output stream is residual + x
        ws.extras["prefix_out"] = (residual, x)


def denoise(ws: Workspace, w: EngineWeights, ops: Ops, key_bias: torch.Tensor, n_valid: torch.Tensor) -> None:
    """`num_steps` Euler steps of the action expert, unrolled; ws.actions goes from noise to actions."""
    if _guided(ws):
        guided_denoise(ws, w, ops, key_bias, n_valid)
        return
    for _ in denoise_layers(ws, w, ops, key_bias, n_valid):
        pass


@dataclass
class DenoiseSteps:
    """What every denoise step of one predict shares: its ops, the positions and key mask of the suffix, and the
    step's work buffers (made once per predict, reused by every step)."""

    w: EngineWeights
    ops: Ops
    ws: Workspace
    pos: torch.Tensor                      # (S,) suffix positions
    smask: KeyMask
    residual: torch.Tensor                 # (S, We) fp32
    y: torch.Tensor                        # (S, We) engine dtype
    q: torch.Tensor                        # (S, H, Dh) engine dtype
    state_token: torch.Tensor | None       # pi0: (1, We) fp32
    step_ends: bool                        # pi0.5's fused step ends (kernels/flashrt_kernels/denoise_step.py)
    pi0_tables: object | None              # pi0's fused step ends: EngineWeights.pi0_step_tables()
    hidden: torch.Tensor | None            # pi0's fused step ends: (S, We) engine dtype
    mod_tables: ExpertTables | None = None  # pi0.5: the modulation tables the steps read (w.tables, or in a
                                           # training-time RTC workspace w.training_time_tables())
    row_variant: torch.Tensor | None = None    # pi0.5, training-time RTC: (S,) int32, 1 on the frozen prefix rows
    clean_rows: torch.Tensor | None = None     # pi0, training-time RTC: (horizon, 1) bool, the frozen prefix rows


def denoise_steps(ws: Workspace, w: EngineWeights, ops: Ops, key_bias: torch.Tensor,
                  n_valid: torch.Tensor) -> DenoiseSteps:
    """The shared part of one predict's denoise steps (denoise_step runs each)."""
    e = w.config.expert
    heads, dh = e.num_heads, e.head_dim
    pi05 = w.tables is not None
    S = ws.suffix_visible.shape[0]
    P = key_bias.shape[0]
    dev = key_bias.device
    state_token = None if pi05 else ops.linear(ws.state[None].to(w.dtype), w.state_proj).float()   # (1, We)
    # training-time RTC: the frozen prefix rows' tokens get the time of clean data, per row; the fused step ends
    # take one modulation (time bias) for every row, so they stay off there
    clean = rtc_blend.training_time(ws.extras.get("rtc"))
    step_ends = (pi05 and ops.fused_denoise_step and len(w.action_in.parts) == 1 and w.action_in.fp8 is None
                 and clean is None)
    pi0_ends = pi0_fused_step_ends(w, ops) and clean is None
    return DenoiseSteps(
        w, ops, ws, pos=n_valid + torch.arange(S, device=dev), smask=KeyMask(key_bias, P, ws.suffix_visible, heads),
        residual=torch.empty(S, e.width, device=dev), y=torch.empty(S, e.width, device=dev, dtype=w.dtype),
        q=torch.empty(S, heads, dh, device=dev, dtype=w.dtype), state_token=state_token, step_ends=step_ends,
        pi0_tables=w.pi0_step_tables() if pi0_ends else None,     # made when the executor was built
        hidden=torch.empty(S, e.width, device=dev, dtype=w.dtype) if pi0_ends else None,
        mod_tables=w.training_time_tables() if pi05 and clean is not None else w.tables,
        row_variant=rtc_blend.row_variant(clean, S) if pi05 and clean is not None else None,
        clean_rows=clean.rows if clean is not None and not pi05 else None)


def denoise_layers(ws: Workspace, w: EngineWeights, ops: Ops, key_bias: torch.Tensor,
                   n_valid: torch.Tensor) -> Iterator[int]:
    """denoise() a layer of its first step at a time: yields i before the first step's layer i, the first of its
    ops to read layer i's prefix K/V. The later steps follow without a yield."""
    steps = denoise_steps(ws, w, ops, key_bias, n_valid)
    x_t = ws.actions.copy_(ws.noise)                                                   # (horizon, A) fp32
    rtc = ws.extras.get("rtc")                       # real-time chunking (rtc_blend), or None
    for step in range(len(w.dts)):
        if rtc is not None:
            if step > 0:     # the previous step's correction (its Euler update may be fused into its last kernel)
                rtc_blend.after_step(x_t, rtc, step - 1, w.dts[step - 1])
            rtc_blend.before_step(x_t, ws.noise, rtc, step)
        layers = denoise_step(steps, step, x_t)
        if step == 0:
            yield from layers
        else:
            collections.deque(layers, maxlen=0)
    if rtc is not None:
        rtc_blend.after_step(x_t, rtc, len(w.dts) - 1, w.dts[-1])
        rtc_blend.blend_final(x_t, rtc)


def denoise_step(steps: DenoiseSteps, step: int, x_t: torch.Tensor) -> Iterator[int]:
    """Euler step `step` of the action expert on x_t (horizon, A) fp32, in place; yields i before layer i."""
    w, ops, ws = steps.w, steps.ops, steps.ws
    e = w.config.expert
    heads, dh, horizon = e.num_heads, e.head_dim, x_t.shape[0]    # horizon: the executor's, not w.config's
    pi05 = w.tables is not None
    S = ws.suffix_visible.shape[0]
    residual, y, q = steps.residual, steps.y, steps.q
    out_w, out_b = w.action_out
    dt = w.dts[step]
    pi0_tables = steps.pi0_tables
    if steps.step_ends:  # input projection + the first layer's norm 1
        mod = w.tables.norm[step, 0]
        ops.denoise_step_in(x_t, w.action_in, mod[0, 0], mod[0, 1], residual, y, e.eps)
    elif pi05:
        residual.copy_(ops.linear(x_t.to(w.dtype), w.action_in))                       # (horizon, We)
    elif pi0_tables is not None:
        # residual = [state token; b_out], hidden = [0; silu(...)]; the first norm adds hidden @ W_out^T
        ops.time_mlp_in(x_t, pi0_tables.w_fold, pi0_tables.c[step], steps.state_token[0], pi0_tables.b_out,
                        residual, steps.hidden)
    else:
        a = ops.linear(x_t.to(w.dtype), w.action_in)                                   # (horizon, We)
        bias = w.time_in_bias[step]                                                    # (We,)
        if steps.clean_rows is not None:    # training-time RTC: the frozen rows' time bias is clean data's
            bias = torch.where(steps.clean_rows, w.clean_time_bias, bias)               # (horizon, We)
        h = torch.nn.functional.silu(ops.linear(a, w.time_in_action).float() + bias)
        residual[1:].copy_(ops.linear(h.to(w.dtype), w.time_out))
        residual[:1].copy_(steps.state_token)
    x = gate = None
    if pi0_tables is not None:
        x = ops.decoder(steps.hidden, pi0_tables.out, "qkv", impl=ops.plain_pick("qkv"))   # (S, We): row 0 zeros
    for i, layer in enumerate(w.expert):
        yield i
        if pi05:
            mod = steps.mod_tables.norm[step, i]                          # (2, 3, We), or (2, 3, 2, We) per row
            if not (steps.step_ends and i == 0):
                ops.ada_norm(x, residual, gate, mod[0, 0], mod[0, 1], y, e.eps, site="norm1",
                             row_variant=steps.row_variant)
        else:
            ops.norm(x, residual, y, layer.norm1, None, e.eps, site="norm1")
        attn = ops.decoder_attention(y, layer.qkv, steps.pos, ws.rope_cos, ws.rope_sin, q, ws.k_cache[i],
                                     ws.v_cache[i], steps.smask, heads, dh ** -0.5)     # (S*H, Dh)
        o = ops.decoder(attn.view(S, heads * dh), layer.o, "o")                           # (M, N) or partials
        if pi05:
            ops.ada_norm(o, residual, mod[0, 2], mod[1, 0], mod[1, 1], y, e.eps, site="norm2",
                         row_variant=steps.row_variant)
            gate = mod[1, 2]
        else:
            ops.norm(o, residual, y, layer.norm2, None, e.eps, site="norm2")
        x = ops.decoder_mlp(y, layer.gate_up, layer.down)
    if steps.step_ends:  # the final norm, the output projection and the Euler step
        ops.denoise_step_out(x, residual, gate, w.tables.final[step, 0], w.tables.final[step, 1], out_w, out_b,
                             x_t, dt, e.eps)
    elif pi0_tables is not None:     # pi0's final RMSNorm: a gate of ones, its scale (ones when folded), no shift
        ops.denoise_step_out(x, residual, pi0_tables.ones, pi0_tables.final_scale, pi0_tables.zeros, out_w,
                             out_b, x_t, dt, e.eps)
    else:
        if pi05:
            final = steps.mod_tables.final[step]
            ops.ada_norm(x, residual, gate, final[0], final[1], y, e.eps, row_variant=steps.row_variant)
        else:
            ops.norm(x, residual, y, w.expert_final_norm, None, e.eps)
        velocity = torch.nn.functional.linear(y[S - horizon:], out_w)                 # (horizon, A)
        ops.euler(x_t, velocity, out_b, dt)


def guided_denoise(ws: Workspace, w: EngineWeights, ops: Ops, key_bias: torch.Tensor, n_valid: torch.Tensor) -> None:
    """denoise() for a guided RTC workspace (engine/rtc_guided.py): every step on the plain-PyTorch ops under
    autograd, its update corrected toward the staged previous chunk through the step's vector-Jacobian product."""
    rtc = ws.extras["rtc"]
    plain_ops = rtc_guided.grad_ops(rtc, w, ops)
    with torch.inference_mode(False), torch.enable_grad():
        steps = denoise_steps(ws, w, plain_ops, key_bias.clone(), n_valid.clone())
        x = ws.noise.clone()
        for step, dt in enumerate(w.dts):
            x = rtc_guided.guided_step(lambda x_next, step=step: collections.deque(
                denoise_step(steps, step, x_next), maxlen=0), x, step, dt, rtc)
        for cache in (ws.k_cache, ws.v_cache):       # the suffix rows' autograd history, kept alive otherwise
            cache.detach_()
    ws.actions.copy_(x)


def _guided(ws: Workspace) -> bool:
    """A workspace of guided RTC (rtc_guided: its denoiser runs under autograd, after the whole prefix)."""
    rtc = ws.extras.get("rtc")
    return rtc is not None and rtc.mode == "guided"


def pi0_fused_step_ends(w: EngineWeights, ops: Ops) -> bool:
    """Whether denoise runs pi0's fused step ends (ops.fused_denoise_step_pi0, the default): pi0 with one unquantized
    block each for the action input projection and the time MLP's GEMMs."""
    return (w.tables is None and ops.fused_denoise_step_pi0 and w.time_in_action is not None
            and all(len(lin.parts) == 1 and lin.fp8 is None for lin in (w.action_in, w.time_in_action, w.time_out)))


def forward(ws: Workspace, w: EngineWeights, ops: Ops) -> None:
    """The whole predict over ws: inputs already in ws, normalized actions left in ws.actions."""
    image_tokens = vision(ws, w, ops)
    if ops.overlap_first_step and ops.calibration is None and not _guided(ws):
        forward_overlapped(ws, w, ops, image_tokens)
    else:
        key_bias, n_valid = prefix(ws, w, ops, image_tokens)
        denoise(ws, w, ops, key_bias, n_valid)
    if ws.action_affine is not None:
        scale, offset = ws.action_affine
        torch.addcmul(offset, ws.actions, scale, out=ws.robot_actions)                # unnormalize


def forward_overlapped(ws: Workspace, w: EngineWeights, ops: Ops, image_tokens: torch.Tensor) -> None:
    """prefix() and denoise() with the first denoising step's layers beside the prefix's later ones
    (ops.overlap_first_step, the default): the expert's layer i reads only layer i of the prefix's K/V, so the first
    step's layer i can run once the prefix's layer i has written them, during that layer's attention and MLP.
    The prefix stays on the current stream, the denoiser runs on denoise_stream(), each of the first step's
    layers after an event of the prefix's layer it reads; the current stream waits for the denoiser at the end.
    Captured, the two streams become branches of one graph. On the CPU (Triton's interpreter, the plain-PyTorch
    ops) there are no streams: the same interleaved order runs in one."""
    prefix_steps = prefix_layers(ws, w, ops, image_tokens)
    key_bias, n_valid = next(prefix_steps)
    cuda = key_bias.is_cuda
    main = torch.cuda.current_stream(key_bias.device) if cuda else None
    side = denoise_stream(key_bias.device) if cuda else None
    if cuda:
        side.wait_stream(main)
        for t in (key_bias, n_valid):        # made on the current stream, read on the denoiser's until its end
            t.record_stream(side)
    denoise_steps = denoise_layers(ws, w, ops, key_bias, n_valid)
    with _on(side):
        need = next(denoise_steps, None)             # the setup, up to the first layer that reads the caches
    for written in prefix_steps:
        if need is None or need > written:
            continue
        if cuda:
            side.wait_stream(main)                   # an event after the prefix's layer `written`, waited for
        with _on(side):
            while need is not None and need <= written:
                need = next(denoise_steps, None)
    with _on(side):
        for _ in denoise_steps:                      # the later steps (every cache is written by now)
            pass
    if cuda:
        main.wait_stream(side)


def _on(stream: torch.cuda.Stream | None):
    """torch.cuda.stream(stream), or nothing on the CPU."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def denoise_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream the denoiser runs on beside the prefix (forward_overlapped): one per device for the process, like
    timing.side_stream (cuBLAS keeps a workspace per handle and stream), and another than that one, which
    the warm-ups before a capture run on."""
    return _denoise_stream(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _denoise_stream(index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(torch.device("cuda", index))
