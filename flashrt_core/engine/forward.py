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

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from flashrt_core.preprocess import resize_views_torch

from .ops import KeyMask, Ops
from .weights import EngineWeights


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
    ada_fold: AdaFoldBuffers | None = None       # pi0.5 with ops.ada_fold: the folded norms' buffers
    denoise_layer: object | None = None          # pi0.5 with ops.denoise_layer: kernels' DenoiseLayerScratch
    extras: dict = field(default_factory=dict)


@dataclass
class AdaFoldBuffers:
    """Static buffers of the adaRMSNorms folded into the GEMMs around them (ops.Op.ADA_NORM_FOLD), one set per norm
    site of an expert layer (0: before QKV, fed by the previous layer's down GEMM; 1: before gate/up, fed by O):
    xs (S, We) engine dtype, the next GEMM's input x' = h * (1 + scale); sq (We / 64, 16) fp32, per-tile row sums
    of h^2; counter (We / 64,) int32, zero between launches (kernels/flashrt_kernels/smem_gemm.py NormOut)."""

    xs: tuple[torch.Tensor, torch.Tensor]
    sq: tuple[torch.Tensor, torch.Tensor]
    counter: tuple[torch.Tensor, torch.Tensor]

    @classmethod
    def allocate(cls, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> "AdaFoldBuffers":
        """Made outside any graph capture: the counters must start at zero and stay allocated."""
        tiles = width // 64
        return cls(xs=tuple(torch.empty(rows, width, device=device, dtype=dtype) for _ in range(2)),
                   sq=tuple(torch.zeros(tiles, 16, device=device) for _ in range(2)),
                   counter=tuple(torch.zeros(tiles, device=device, dtype=torch.int32) for _ in range(2)))


class PhaseTimer:
    """CUDA events at phase boundaries (eager runs only): vision, prefix, denoise."""

    def __init__(self) -> None:
        self.events: list[tuple[str, torch.cuda.Event]] = []

    def mark(self, name: str) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.events.append((name, ev))

    def durations_ms(self) -> dict[str, float]:
        torch.cuda.synchronize()
        return {name: start.elapsed_time(end) for (_, start), (name, end) in zip(self.events, self.events[1:])}


def _mark(timer: PhaseTimer | None, name: str) -> None:
    if timer is not None:
        timer.mark(name)


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
        # patch rows in the engine dtype: straight from the uint8 views at the model's size (kernels/flashrt_kernels/patch_embed.py),
        # else from the pixels in one converting copy; then the patch GEMM in the engine dtype
        # (the rows as wide as the padded GEMM weight, their extra columns zeros)
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
    heads, dh = vc.num_heads, vc.head_dim
    y = torch.empty(residual.shape, device=residual.device, dtype=w.dtype)
    x = None
    for layer in w.vision:
        ln = layer.ln1 or (None, None)
        ops.norm(x, residual, y, ln[0], ln[1], vc.eps, layer_norm=True)
        qkv = ops.linear(y, layer.qkv).view(views, grid * grid, 3, heads, dh)          # (V, N, 3, Hv, dh)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))                     # (V, Hv, N, dh)
        attn = ops.attention(q, k, v, dh ** -0.5)                                      # (V, Hv, N, dh)
        attn = attn.transpose(1, 2).reshape(views * grid * grid, heads * dh)
        o = ops.linear(attn, layer.out)
        ln = layer.ln2 or (None, None)
        ops.norm(o, residual, y, ln[0], ln[1], vc.eps, layer_norm=True)
        x = ops.linear(ops.linear_gelu(y, layer.fc1), layer.fc2)
    ln = w.post_ln or (None, None)
    ops.norm(x, residual, y, ln[0], ln[1], vc.eps, layer_norm=True)
    return ops.linear(y, w.projector)                                                  # (V*N, Wg)


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
    reads of the prefix (forward_overlapped)."""
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


def denoise(ws: Workspace, w: EngineWeights, ops: Ops, key_bias: torch.Tensor, n_valid: torch.Tensor) -> None:
    """`num_steps` Euler steps of the action expert, unrolled; ws.actions goes from noise to actions."""
    for _ in denoise_layers(ws, w, ops, key_bias, n_valid):
        pass


def denoise_layers(ws: Workspace, w: EngineWeights, ops: Ops, key_bias: torch.Tensor,
                   n_valid: torch.Tensor) -> Iterator[int]:
    """denoise() a layer of its first step at a time: yields i before the first step's layer i, the first of its
    ops to read layer i's prefix K/V (the persistent-layer path yields the last layer once: it reads them all
    without a yield between layers). The later steps follow without a yield."""
    cfg = w.config
    e = cfg.expert
    heads, dh, horizon = e.num_heads, e.head_dim, ws.actions.shape[0]   # horizon: the executor's, not w.config's
    pi05 = w.tables is not None
    S = ws.suffix_visible.shape[0]
    P = key_bias.shape[0]
    dev = key_bias.device
    pos = n_valid + torch.arange(S, device=dev)                                        # (S,)
    smask = KeyMask(key_bias, P, ws.suffix_visible, heads)
    residual = torch.empty(S, e.width, device=dev)                                     # (S, We) fp32
    y = torch.empty(S, e.width, device=dev, dtype=w.dtype)
    q = torch.empty(S, heads, dh, device=dev, dtype=w.dtype)
    x_t = ws.actions.copy_(ws.noise)                                                   # (horizon, A) fp32
    out_w, out_b = w.action_out
    state_token = None if pi05 else ops.linear(ws.state[None].to(w.dtype), w.state_proj).float()   # (1, We)
    # per layer: the window of later weights its QKV GEMM may prefetch into L2 (ops applies l2_prefetch), or None
    arena = w.expert_arena
    windows = [arena.prefetch_window(i) if arena is not None else None for i in range(len(w.expert))]
    # pi0.5: the adaRMSNorms after O and down folded into the GEMMs around them, where the picks allow it
    fold = ws.ada_fold if pi05 and ws.ada_fold is not None and ops.ada_fold_applies(S) else None
    fold_bias = w.ada_fold_bias() if fold is not None else None          # (qkv, gate_up): (steps, layers, N)
    # pi0.5: each step's two ends in one kernel each (kernels/flashrt_kernels/denoise_step.py)
    step_ends = pi05 and ops.fused_denoise_step and len(w.action_in.parts) == 1 and w.action_in.fp8 is None
    if step_ends and ws.denoise_layer is not None and ops.denoise_layer != "separate":
        yield len(w.expert) - 1
        _denoise_persistent_layers(ws, w, ops, key_bias, pos, x_t, residual, y)
        return
    # pi0: the start of each step up to its time MLP's output GEMM in one kernel, its end in step_out
    pi0_ends = pi0_fused_step_ends(w, ops)
    if pi0_ends:
        pi0_tables = w.pi0_step_tables()             # made when the executor was built, before any capture
        hidden = torch.empty(S, e.width, device=dev, dtype=w.dtype)
    for step, dt in enumerate(w.dts):
        if step_ends:        # input projection + the first layer's norm 1
            mod = w.tables.norm[step, 0]
            ops.denoise_step_in(x_t, w.action_in, mod[0, 0], mod[0, 1], residual, y, e.eps)
        elif pi05:
            residual.copy_(ops.linear(x_t.to(w.dtype), w.action_in))                   # (horizon, We)
        elif pi0_ends:
            # residual = [state token; b_out], hidden = [0; silu(...)]; the first norm adds hidden @ W_out^T
            ops.time_mlp_in(x_t, pi0_tables.w_fold, pi0_tables.c[step], state_token[0], pi0_tables.b_out,
                            residual, hidden)
        else:
            a = ops.linear(x_t.to(w.dtype), w.action_in)                               # (horizon, We)
            h = torch.nn.functional.silu(ops.linear(a, w.time_in_action).float() + w.time_in_bias[step])
            residual[1:].copy_(ops.linear(h.to(w.dtype), w.time_out))
            residual[:1].copy_(state_token)
        x = gate = None
        if pi0_ends:
            x = ops.decoder(hidden, pi0_tables.out, "qkv", impl=ops.plain_pick("qkv"))   # (S, We): row 0 zeros
        for i, layer in enumerate(w.expert):
            if step == 0:
                yield i
            qkv_in, norm_in = y, None
            if pi05:
                mod = w.tables.norm[step, i]                                           # (2, 3, We)
                if fold is not None and i > 0:       # the previous down GEMM left x' and the sums of squares
                    qkv_in = fold.xs[0]
                    norm_in = ops.k.NormIn(fold.sq[0], fold_bias[0][step, i], e.eps)
                elif not (step_ends and i == 0):
                    ops.ada_norm(x, residual, gate, mod[0, 0], mod[0, 1], y, e.eps, site="norm1")
            else:
                ops.norm(x, residual, y, layer.norm1, None, e.eps, site="norm1")
            attn = ops.decoder_attention(qkv_in, layer.qkv, pos, ws.rope_cos, ws.rope_sin, q, ws.k_cache[i],
                                         ws.v_cache[i], smask, heads, dh ** -0.5, prefetch=windows[i],
                                         norm_in=norm_in)                              # (S*H, Dh)
            if fold is not None:
                # O's split-K partials -> residual, x' and the sums of squares; gate/up normalizes in its epilogue
                ops.decoder(attn.view(S, heads * dh), layer.o, "o",
                            norm_out=ops.k.NormOut(residual, mod[0, 2], mod[1, 0], fold.xs[1], fold.sq[1],
                                                   fold.counter[1]))
                g = ops.decoder(fold.xs[1], layer.gate_up, "gate_up",
                                norm_in=ops.k.NormIn(fold.sq[1], fold_bias[1][step, i], e.eps))
                if i + 1 < len(w.expert):            # the next layer's first norm, folded the same way
                    ops.decoder(g, layer.down, "down",
                                norm_out=ops.k.NormOut(residual, mod[1, 2], w.tables.norm[step, i + 1, 0, 0],
                                                       fold.xs[0], fold.sq[0], fold.counter[0]))
                else:                                # the final norm keeps its kernel
                    x, gate = ops.decoder(g, layer.down, "down"), mod[1, 2]
                continue
            o = ops.decoder(attn.view(S, heads * dh), layer.o, "o")                       # (M, N) or partials
            if pi05:
                ops.ada_norm(o, residual, mod[0, 2], mod[1, 0], mod[1, 1], y, e.eps, site="norm2")
                gate = mod[1, 2]
            else:
                ops.norm(o, residual, y, layer.norm2, None, e.eps, site="norm2")
            x = ops.decoder_mlp(y, layer.gate_up, layer.down)   # two decoder GEMMs, or one launch (fused_mlp)
        if step_ends:        # the final norm, the output projection and the Euler step
            ops.denoise_step_out(x, residual, gate, w.tables.final[step, 0], w.tables.final[step, 1], out_w, out_b,
                                 x_t, dt, e.eps)
            continue
        if pi0_ends:         # pi0's final RMSNorm: a gate of ones, its scale (ones when folded), no shift
            ops.denoise_step_out(x, residual, pi0_tables.ones, pi0_tables.final_scale, pi0_tables.zeros, out_w,
                                 out_b, x_t, dt, e.eps)
            continue
        if pi05:
            ops.ada_norm(x, residual, gate, w.tables.final[step, 0], w.tables.final[step, 1], y, e.eps)
        else:
            ops.norm(x, residual, y, w.expert_final_norm, None, e.eps)
        velocity = torch.nn.functional.linear(y[S - horizon:], out_w)                 # (horizon, A)
        ops.euler(x_t, velocity, out_b, dt)


def pi0_fused_step_ends(w: EngineWeights, ops: Ops) -> bool:
    """Whether denoise runs pi0's fused step ends (ops.fused_denoise_step_pi0, the default): pi0 with one unquantized
    block each for the action input projection and the time MLP's GEMMs."""
    return (w.tables is None and ops.fused_denoise_step_pi0 and w.time_in_action is not None
            and all(len(lin.parts) == 1 and lin.fp8 is None for lin in (w.action_in, w.time_in_action, w.time_out)))


def _denoise_persistent_layers(ws: Workspace, w: EngineWeights, ops: Ops, key_bias: torch.Tensor, pos: torch.Tensor,
                               x_t: torch.Tensor, residual: torch.Tensor, y: torch.Tensor) -> None:
    """pi0.5's denoising steps with each expert layer in one launch of kernels/flashrt_kernels/denoise_layer.py (ops.denoise_layer
    "grid" or "grid_prefetch", which also prefetches the later weight tiles into L2; "phases": a launch per phase),
    between the fused step ends; x_t, residual and y are denoise's (y takes the step-in's norm, which the layers
    recompute). Each layer leaves its down output in x_acc[layer % 2], which the next layer (or the step's end)
    adds with its gate."""
    e = w.config.expert
    scratch = ws.denoise_layer
    layer_weights, tables = w.denoise_layer_inputs(ops.k)
    out_w, out_b = w.action_out
    depth = len(w.expert)
    grid_sync, prefetch = ops.denoise_layer.startswith("grid"), ops.denoise_layer == "grid_prefetch"
    scratch.reset_counters()
    for step, dt in enumerate(w.dts):
        mod = w.tables.norm[step, 0]
        ops.denoise_step_in(x_t, w.action_in, mod[0, 0], mod[0, 1], residual, y, e.eps)
        x_prev = None
        for i in range(depth):
            x_prev = ops.k.denoise_layer(residual, x_prev, scratch.x_acc[i % 2], tables[step][i], layer_weights[i],
                                         ws.k_cache[i, 0], ws.v_cache[i, 0], pos, ws.rope_cos, ws.rope_sin,
                                         key_bias, ws.suffix_visible, scratch, step * depth + i, e.num_heads,
                                         e.head_dim ** -0.5, e.eps, grid_sync=grid_sync, prefetch=prefetch,
                                         next_qkv=layer_weights[(i + 1) % depth].qkv, cfg=ops.denoise_layer_config)
        ops.denoise_step_out(x_prev, residual, w.tables.norm[step, depth - 1, 1, 2], w.tables.final[step, 0],
                             w.tables.final[step, 1], out_w, out_b, x_t, dt, e.eps)


def forward(ws: Workspace, w: EngineWeights, ops: Ops, timer: PhaseTimer | None = None) -> None:
    """The whole predict over ws: inputs already in ws, normalized actions left in ws.actions."""
    _mark(timer, "start")
    image_tokens = vision(ws, w, ops)
    _mark(timer, "vision")
    if ops.overlap_first_step and timer is None and ops.calibration is None:
        forward_overlapped(ws, w, ops, image_tokens)
    else:
        key_bias, n_valid = prefix(ws, w, ops, image_tokens)
        _mark(timer, "prefix")
        denoise(ws, w, ops, key_bias, n_valid)
    if ws.action_affine is not None:
        scale, offset = ws.action_affine
        torch.addcmul(offset, ws.actions, scale, out=ws.robot_actions)                # unnormalize
    _mark(timer, "denoise")


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
    graph_executor.side_stream (cuBLAS keeps a workspace per handle and stream), and another than that one, which
    the warm-ups before a capture run on."""
    return _denoise_stream(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _denoise_stream(index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(torch.device("cuda", index))
