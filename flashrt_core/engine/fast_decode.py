"""pi0-FAST on the graph engine: the prefill and the greedy decoding, each replayed as CUDA graphs.

Prefill (one graph per signature: present views, text bucket): the pi engine's vision and backbone
(forward.vision, forward.prefix_layers over weights.prepare_fast_weights: every backbone layer whole), then the
final RMSNorm and the tied LM head on the last valid prefix token, whose argmax is decoded token 0.

Decoding: `decode_step(step)` feeds token `step` (its embedding * sqrt(width)) through the backbone at position
n_valid + step + decode_position_offset, writes its K/V into cache row P + step, attends to the valid prefix keys
and the step + 1 decoded ones (a static slice of the cache: the step index is a constant of its graph), and
writes the argmax of its logits as token step + 1. Its one-row GEMMs are the engine's decoder GEMMs (Ops.decoder:
GeGLU in the gate/up GEMM, split-K partials summed by the next norm), each kind's implementation measured at
load among the library GEMM and the Triton / shared-memory candidates (tuning.tune_decoder at one row). One decode graph unrolls `EngineOptions.decode_graph_tokens`
(K) consecutive steps; a signature has ceil((max_decoding_steps - 1) / K) of them, captured in order.

Stop: every emitted token updates a device flag (any token so far == the end token). The host replays the graphs
in order and reads graph j's flag (a pinned copy and an event) after launching graph j + 1: the GPU never waits
for the host, there is one host sync per K tokens, and at most K + K - 1 steps run past the end token. The tokens
after the first end token are cut off, as Pi0FastModel.generate does.

Nothing is allocated on the host and nothing syncs inside a replay. What one graph writes and a later one reads
(the K/V caches, the tokens, the key bias, n_valid, the end flag) lives in buffers allocated outside capture.
All graphs share one memory pool: they replay in the order they were captured, never at the same time.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from flashrt_core.config import ModelConfig, ModelType
from flashrt_core.errors import InputError
from flashrt_core.stopping import raise_if_stopped

from .dispatch import Dispatch, Op
from .forward import Workspace, prefix_layers, vision
from .fp8 import FP8_DTYPES, weight_only_fp8
from .graph_executor import bucket_for, text_buckets
from .kernel_configs import SKINNY_CANDIDATES, SkinnyConfig
from .kernel_import import load_kernels
from .ops import KeyMask, Ops
from .timing import capture, graph_time_us, warm_up
from .tuning import tune_decoder
from .weights import EngineWeights, Linear, prepare_fast_weights

log = logging.getLogger(__name__)


@dataclass
class FastWorkspace:
    """Static buffers of one signature (present views, text bucket) and its graphs."""

    ws: Workspace                  # pixels, tokens, token mask, K/V caches (P + max_steps rows), RoPE tables
    prefix_len: int                # P = present views * patches + text bucket
    key_bias: torch.Tensor         # (P + max_steps,) fp32: the prefix's 0 / -inf, then zeros (decoded keys)
    n_valid: torch.Tensor          # (1,) int64: valid prefix tokens
    generated: torch.Tensor        # (max_steps,) int64: the decoded tokens
    finished: torch.Tensor         # (1,) bool: an end token was emitted
    flags_host: torch.Tensor       # (launches,) bool, pinned: `finished` after each launch
    launches: list = field(default_factory=list)   # [prefill, decode steps 0..K-1, ...]: what each launch runs
    graphs: list = field(default_factory=list)     # their CUDA graphs (none when eager)
    events: list = field(default_factory=list)


def lm_head(w: EngineWeights, ops: Ops, y: torch.Tensor) -> torch.Tensor:
    """The tied LM head on y (1, Wg): bf16 through the library GEMM, or (FP8) the Triton one-row GEMM on its
    weight-only FP8 copy. -> logits (1, vocab)"""
    if w.lm_head8 is None:
        return F.linear(y, w.lm_head)
    lin, cfg = w.lm_head8
    return ops.skinny_fp8(y, lin, cfg)


def emit(fw: FastWorkspace, logits: torch.Tensor, index: int, eos_id: int) -> None:
    """Greedy token `index` (argmax, first maximum on ties) of logits (1, vocab) and the end flag."""
    token = logits.argmax(dim=-1)                                                       # (1,)
    fw.generated[index:index + 1].copy_(token)
    if index == 0:
        torch.eq(token, eos_id, out=fw.finished)
    else:
        fw.finished.logical_or_(token == eos_id)


def prefill(fw: FastWorkspace, w: EngineWeights, ops: Ops, eos_id: int) -> torch.Tensor:
    """Vision and the backbone over the prefix into the caches, then token 0. -> its logits (1, vocab)."""
    ws = fw.ws
    g = w.config.paligemma
    layers = prefix_layers(ws, w, ops, vision(ws, w, ops))
    key_bias, n_valid = next(layers)
    for _ in layers:
        pass
    residual, x = ws.extras["prefix_out"]                                               # (P, Wg) fp32, (P, Wg)
    fw.key_bias[:fw.prefix_len].copy_(key_bias)
    fw.n_valid.copy_(n_valid)
    last = n_valid - 1               # the valid prefix tokens come first: images, then the right-padded prompt
    stream = residual.index_select(0, last)                                             # (1, Wg) fp32
    y = torch.empty(1, g.width, device=stream.device, dtype=w.dtype)
    ops.norm(x.index_select(0, last), stream, y, w.final_norm, None, g.eps)
    logits = lm_head(w, ops, y)                                                         # (1, vocab)
    emit(fw, logits, 0, eos_id)
    return logits


def decode_step(fw: FastWorkspace, w: EngineWeights, ops: Ops, step: int, eos_id: int,
                position_offset: int) -> torch.Tensor:
    """Token `step` through the backbone; writes token step + 1. -> its logits (1, vocab)."""
    ws = fw.ws
    g = w.config.paligemma
    heads, dh = g.num_heads, g.head_dim
    row = fw.prefix_len + step                          # this token's cache row
    keys = row + 1
    residual = w.embed_tokens[fw.generated[step:step + 1]].float() * math.sqrt(g.width)   # (1, Wg) fp32
    pos = fw.n_valid + (step + position_offset)                                        # (1,) int64
    mask = KeyMask(fw.key_bias[:keys], keys, None, heads)
    dev = residual.device
    y = torch.empty(1, g.width, device=dev, dtype=w.dtype)
    q = torch.empty(1, heads, dh, device=dev, dtype=w.dtype)
    x = None
    for i, layer in enumerate(w.backbone):
        ops.norm(x, residual, y, layer.norm1, None, g.eps, site="norm1")
        ops.decoder_qkv_rope(y, layer.qkv, pos, ws.rope_cos, ws.rope_sin, q, ws.k_cache[i], ws.v_cache[i], row,
                             heads, 1, dh ** -0.5)
        attn = ops.mqa(q.view(heads, dh), ws.k_cache[i, 0, :keys], ws.v_cache[i, 0, :keys], mask, 1.0,
                       site="attention")
        o = ops.decoder(attn.view(1, heads * dh), layer.o, "o")                         # (1, Wg) or partials
        ops.norm(o, residual, y, layer.norm2, None, g.eps, site="norm2")
        x = ops.decoder_mlp(y, layer.gate_up, layer.down)
    ops.norm(x, residual, y, w.final_norm, None, g.eps)
    logits = lm_head(w, ops, y)                                                         # (1, vocab)
    emit(fw, logits, step + 1, eos_id)
    return logits


class FastGraphExecutor:
    """pi0-FAST's generate (FastReferenceExecutor's contract) on the engine: graphs on a GPU with cuda_graph on
    (executor "graph"), the same ops launched one by one otherwise (executor "eager_engine")."""

    uses_model = False           # reads the model once, at load, into its own prepared weights

    def __init__(self, model, config: ModelConfig, device: torch.device, dispatch: Dispatch,
                 eos_id: int, dtype: torch.dtype = torch.bfloat16):
        device = torch.device(device)
        if config.model_type != ModelType.PI0_FAST:
            raise ValueError(f"FastGraphExecutor serves pi0fast configs, got {config.model_type.value!r}")
        if config.paligemma.num_kv_heads != 1:
            raise ValueError("the engine implements multi-query attention with one KV head; got "
                             f"{config.paligemma.num_kv_heads}")
        self.fp8 = dispatch[Op.GEMM_PREFIX] == "fp8"
        if self.fp8 and dispatch[Op.GEMM_DECODER] != "triton":
            raise ValueError("FP8 pi0-FAST decoding reads weight-only FP8 weights in the Triton few-row GEMM "
                             f"(kernels/flashrt_kernels/skinny_gemm.py), which this dispatch does not run "
                             f"(gemm_decoder={dispatch[Op.GEMM_DECODER]!r}); turn the fp8 option off, or triton on")
        self.use_graph = dispatch[Op.EXECUTOR] == "graph"
        if self.use_graph and device.type != "cuda":
            raise ValueError(f"graph replay needs a CUDA/ROCm device, got {device}")
        self.config = config
        self.device = device
        self.dtype = dtype
        self.dispatch = dispatch
        self.eos_id = eos_id
        self.name = "engine-fast-" + ("graph" if self.use_graph else "eager") + "-" + (
            "fp8" if self.fp8 else str(dtype).split(".")[-1])
        options = dispatch.options
        self.ops = Ops(dispatch)
        self.ops.rope_in_attention = False      # every decoded token's K/V goes into the cache for the later steps
        self.weights = prepare_fast_weights(model, dtype, fold=options.enabled("fused_weights"),
                                            vision_mlp_pad=options.vision_mlp_pad if options.fast_paths else 0)
        g = config.paligemma
        if self.fp8:
            fp8_dtype = FP8_DTYPES[dispatch[Op.FP8_FORMAT]]
            for layer in self.weights.backbone:
                for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
                    weight_only_fp8(lin, fp8_dtype)
            head = weight_only_fp8(Linear([(self.weights.lm_head, None)]), fp8_dtype)
            self.weights.lm_head8 = (head, self._pick_head_config(head))
        if device.type == "cuda":
            # the one-row GEMMs of a decoding step: the library's or a Triton / shared-memory one with the GeGLU
            # epilogue (gate_up) and split-K partials summed by the next norm (o, down), by their measured time
            tune_decoder(self.ops, 1, self.weights.backbone, g.num_heads, g.head_dim)
        fast = config.fast
        self.max_steps = fast.max_decoding_steps
        self.position_offset = fast.decode_position_offset
        self.graph_tokens = options.decode_graph_tokens
        self.text_buckets = text_buckets(options.text_buckets, config.max_token_len)
        max_pos = (len(config.view_names) * config.vision.num_patches + config.max_token_len + self.max_steps
                   + self.position_offset)
        self._rope = load_kernels().rope_tables(max_pos, g.head_dim, g.rope_max_wavelength, device)
        self._entries: dict[tuple, FastWorkspace] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graph else None
        self.capture_seconds: dict[tuple, float] = {}
        log.info("pi0-FAST engine ready: %s, %d decoding steps at most, %d per graph, text buckets %s", self.name,
                 self.max_steps, self.graph_tokens, self.text_buckets)

    # ---------------------------------------------------------------------------------------------- set-up
    def _pick_head_config(self, head: Linear) -> SkinnyConfig:
        """The FP8 LM head's launch configuration: the fastest of the one-row QKV GEMM's candidates, timed at load
        on the GPU (the first that fits elsewhere)."""
        y = torch.randn(1, head.parts[0][0].shape[1], device=self.device, dtype=self.dtype)
        fits = [c for c in SKINNY_CANDIDATES["qkv"] if self.ops.skinny_fits(y, head, c)]
        if self.device.type != "cuda":
            return fits[0]
        times = {c: graph_time_us(lambda c=c: self.ops.skinny_fp8(y, head, c), reps=4) for c in fits}
        log.info("pi0-FAST FP8 LM head: %s", {str(c): round(t, 1) for c, t in times.items()})
        return min(times, key=times.get)

    def step_ranges(self) -> list[range]:
        """The decoding steps of each decode graph, in order (steps 0 .. max_steps - 2 write tokens 1 ..)."""
        last = self.max_steps - 1
        return [range(s, min(s + self.graph_tokens, last)) for s in range(0, last, self.graph_tokens)]

    def make_workspace(self, views: tuple[int, ...], text_len: int) -> FastWorkspace:
        cfg, dev, g = self.config, self.device, self.config.paligemma
        size = cfg.vision.image_size
        P = len(views) * cfg.vision.num_patches + text_len
        cache_shape = (g.depth, 1, P + self.max_steps, g.head_dim)
        ws = Workspace(views=views, images=None,
                       pixels=torch.empty(len(views), 3, size, size, device=dev),
                       tokens=torch.zeros(text_len, dtype=torch.int64, device=dev),
                       token_mask=torch.zeros(text_len, dtype=torch.bool, device=dev),
                       state=None, noise=None, actions=None, robot_actions=None, action_affine=None,
                       k_cache=torch.zeros(cache_shape, device=dev, dtype=self.dtype),
                       v_cache=torch.zeros(cache_shape, device=dev, dtype=self.dtype),
                       rope_cos=self._rope[0], rope_sin=self._rope[1], suffix_visible=None)
        launches = 1 + len(self.step_ranges())
        return FastWorkspace(
            ws=ws, prefix_len=P,
            key_bias=torch.zeros(P + self.max_steps, device=dev),
            n_valid=torch.zeros(1, dtype=torch.int64, device=dev),
            generated=torch.zeros(self.max_steps, dtype=torch.int64, device=dev),
            finished=torch.zeros(1, dtype=torch.bool, device=dev),
            flags_host=torch.zeros(launches, dtype=torch.bool, pin_memory=dev.type == "cuda"))

    def _phases(self, fw: FastWorkspace) -> list:
        """The work of each launch as a callable: the prefill, then each decode graph's steps."""
        w, ops, eos, offset = self.weights, self.ops, self.eos_id, self.position_offset

        def steps(r: range):
            return lambda: [decode_step(fw, w, ops, s, eos, offset) for s in r]
        return [lambda: prefill(fw, w, ops, eos)] + [steps(r) for r in self.step_ranges()]

    @torch.inference_mode()
    def _capture(self, key: tuple, fw: FastWorkspace) -> None:
        """Warm up every phase once on a side stream (compiles the kernels of every key length), then capture each
        as its own graph, in replay order, into the shared pool."""
        raise_if_stopped(f"capturing the pi0-FAST graphs {key}")
        start = time.perf_counter()
        phases = self._phases(fw)
        warm_up(self.device, lambda: [phase() for phase in phases])
        graphs = [capture(phase, self._pool)[0] for phase in phases]
        torch.cuda.synchronize(self.device)
        fw.graphs = graphs
        fw.launches = [g.replay for g in graphs]
        fw.events = [torch.cuda.Event() for _ in graphs]
        self.capture_seconds[key] = time.perf_counter() - start
        log.info("captured pi0-FAST graphs %s (%d) in %.2f s", key, len(graphs), self.capture_seconds[key])

    def workspace(self, views: tuple[int, ...], text_len: int) -> FastWorkspace:
        """The signature's workspace, made (and on a GPU captured) on first use."""
        key = (views, text_len)
        if key not in self._entries:
            fw = self.make_workspace(views, text_len)
            self._entries[key] = fw
            if self.use_graph:
                self._capture(key, fw)
            else:
                fw.launches = self._phases(fw)
        return self._entries[key]

    # ---------------------------------------------------------------------------------------------- generate
    def _decode(self, fw: FastWorkspace) -> int:
        """Runs the launches until the end flag is seen; -> how many launches ran."""
        if not self.use_graph:
            with torch.inference_mode():
                for j, launch in enumerate(fw.launches):
                    launch()
                    if bool(fw.finished):
                        return j + 1
            return len(fw.launches)
        stream = torch.cuda.current_stream(self.device)
        for j, launch in enumerate(fw.launches):
            launch()
            fw.flags_host[j:j + 1].copy_(fw.finished, non_blocking=True)
            fw.events[j].record(stream)
            if j > 0:
                fw.events[j - 1].synchronize()
                if bool(fw.flags_host[j - 1]):
                    return j + 1
        return len(fw.launches)

    def _signature(self, image_masks: torch.Tensor, token_masks: torch.Tensor) -> tuple[tuple[int, ...], int]:
        """(present views, text bucket) of a batch-1 call."""
        present = tuple(int(i) for i in torch.nonzero(image_masks[0].cpu()).flatten())
        if not present:
            raise InputError("no images given: at least one view is required")
        valid = torch.nonzero(token_masks[0].cpu()).flatten()
        return present, bucket_for(self.text_buckets, int(valid[-1]) + 1 if valid.numel() else 1)

    @staticmethod
    def _stage(fw: FastWorkspace, pixels: torch.Tensor, tokens: torch.Tensor, token_masks: torch.Tensor) -> None:
        """One call's inputs into the workspace's static buffers."""
        text_len = fw.ws.tokens.shape[0]
        fw.ws.pixels.copy_(pixels[0, list(fw.ws.views)])
        fw.ws.tokens.copy_(tokens[0, :text_len])
        fw.ws.token_mask.copy_(token_masks[0, :text_len])

    def generate(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                 token_masks: torch.Tensor) -> torch.Tensor:
        """Shapes as FastReferenceExecutor.generate (batch 1) -> decoded PaliGemma ids [1, n] int64 (CPU), up to and
        including the first end token, or max_decoding_steps of them."""
        if pixels.shape[0] != 1:
            raise InputError(f"the engine runs batch 1, got a batch of {pixels.shape[0]}")
        fw = self.workspace(*self._signature(image_masks, token_masks))
        self._stage(fw, pixels, tokens, token_masks)
        self._decode(fw)
        out = fw.generated.cpu()                        # waits for the launches in flight
        ends = torch.nonzero(out == self.eos_id).flatten()
        n = int(ends[0]) + 1 if ends.numel() else self.max_steps
        return out[:n][None]

    @torch.inference_mode()
    def teacher_forced_logits(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                              token_masks: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        """The logits after the prefill and after feeding each of `forced` (n,) int64 tokens, by the same prefill /
        decode_step code the graphs capture, launched eagerly on a workspace of their own: -> (n + 1, vocab) fp32.
        For fidelity tests against the reference model, which then runs on the same tokens whatever each side
        would pick."""
        fw = self.make_workspace(*self._signature(image_masks, token_masks))
        self._stage(fw, pixels, tokens, token_masks)
        out = [prefill(fw, self.weights, self.ops, self.eos_id).float()]
        for step, token in enumerate(forced.tolist()):
            fw.generated[step] = token
            out.append(decode_step(fw, self.weights, self.ops, step, self.eos_id, self.position_offset).float())
        return torch.cat(out)

    def close(self) -> None:
        self._entries.clear()
        self.weights = None
