"""GR00T N1.6's graph executor: static buffers per input signature, the whole predict captured once as one CUDA
graph, replayed.

Per call: the inputs are copied into the signature's static buffers (one StagingBlob: inputs on the host are
written into its pinned half and moved by ONE host-to-device copy; inputs already on the device are copied on the
device), ONE graph replay runs the whole predict (vision for every view, projector, image-token scatter, the Qwen3
layers, vlln and the state encoder, the Euler steps of the DiT, the decoder: engine/groot_static.py), and the
actions come back as a clone of the graph's static output. A signature (batch, the views' sizes, the prompt
length, a padded prompt mask or not, with step_ends the batch's embodiment: groot_static.GrootSignature) is
captured on its first call; later calls of that signature only replay. All graphs share one memory pool (they
never run at the same time).

The DiT's blocks run on the engine's fused ops (engine/groot_fused_dit.py, fused_dit / EngineOptions.groot_fused_dit):
their weights are prepared once here, the Ops bound to the dispatch table's implementations. fp8=True (precision
"fp8") gives the fused DiT's GEMMs weight-only FP8 weights (engine/groot_dit_gemms.py); the rest stays in the model's dtype.
The vision tower runs on the same Ops (engine/groot_vision.py, engine_vision / EngineOptions.groot_engine_vision), its
weights prepared once here too, its SDPA backend timed at the first signature (Op.VISION_ATTENTION_TUNING, CUDA).

capture=False runs the same static function eagerly: on the CPU (where it is checked against the reference
executor) and on a GPU with EngineOptions.cuda_graph off (Op.EXECUTOR "eager_engine").

Prompts are right-padded with masked tokens up to a multiple of `prompt_multiple` (EngineOptions.groot_prompt_multiple)
so that an instruction a few tokens longer or shorter replays the same graph instead of capturing one mid-run; a
prompt of exactly such a multiple takes the padded prompts' signature too (its all-ones mask masks nothing).

The prompt's image-token slots are found on the device (groot_static.scatter_image_tokens), so a prompt of the
same length with its slots elsewhere replays correctly; their count must be the signature's image-token count
(groot_inputs.prompt_ids checks it for the policy; the first call of a signature checks it here).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from flashrt_core.errors import InputError
from flashrt_core.model.groot.backbone import views_by_size
from flashrt_core.model.groot.model import GrootModel
from flashrt_core.stopping import raise_if_stopped

from .dispatch import Dispatch, Op, eager_cpu_dispatch, resolve
from .fp8 import FP8_DTYPES
from .graph_executor import StagingBlob
from .groot_dit_gemms import quantize_fused_dit, tune_few_row_gemms
from .groot_fused_dit import FusedDit, prepare_fused_dit
from .groot_language import prepare_language
from .groot_static import (GrootSignature, StaticTables, action_chunk, embed_dtype, image_tokens,
                           language_features, predict)
from .groot_vision import GrootVision, prepare_groot_vision
from .hardware import detect_hardware
from .ops import Ops
from .options import EngineOptions
from .timing import graph_replay_ms, warm_up_and_capture
from .tuning import tune_vision_attention

log = logging.getLogger(__name__)

FEW_ROW_DTYPES = (torch.bfloat16, torch.float16)   # model dtypes whose DiT GEMMs take the few-row GEMM on a GPU
WARMUP_RUNS = 2          # eager runs on the side stream before a capture (library handles, kernel selection)


@dataclass
class _Entry:
    tables: StaticTables
    staging: StagingBlob
    uploaded: torch.cuda.Event | None      # the last host-to-device copy of the staging blob (CUDA)
    output: torch.Tensor | None = None     # the graph's static output [B, horizon, max_action_dim]
    graph: torch.cuda.CUDAGraph | None = None

    def views(self, count: int) -> list[torch.Tensor]:
        return [self.staging.device_views[f"view{i}"] for i in range(count)]

    def inputs(self) -> tuple:
        """The static device buffers in predict's argument order."""
        dv = self.staging.device_views
        return (self.views(len(self.tables.signature.view_sizes)), dv["input_ids"], dv["attention_mask"],
                dv["state"], dv["embodiment_id"], dv["noise"])


class GrootGraphExecutor:
    """GrootReferenceExecutor's sample_actions contract, run as one CUDA graph per input signature (capture=True,
    the default on CUDA) or as the same static code launched eagerly (capture=False, the default elsewhere)."""

    uses_model = True
    input_device = torch.device("cpu")      # GrootPolicy builds its inputs on the host: one staged copy moves them

    def __init__(self, model: GrootModel, device: torch.device | str, capture: bool | None = None,
                 step_tables: bool = True, fused_dit: bool = True, dispatch: Dispatch | None = None,
                 prompt_multiple: int = 0, fp8: bool = False, few_row_gemms: bool = True,
                 head_attention: bool = True, engine_vision: bool = True, vision_fold: bool = True,
                 vision_mlp_pad: int | None = None, engine_language: bool = True, step_ends: bool = True,
                 tune_with_norm: bool = True):
        """step_tables: the DiT's per-step tables (engine/groot_dit.py, EngineOptions.groot_step_tables); False runs
        the reference's sampler inside the graph. fused_dit: the DiT's blocks on the engine's fused ops
        (engine/groot_fused_dit.py, EngineOptions.groot_fused_dit; with step_tables only). dispatch: the ops'
        implementations (None: the table resolved for this device with the default options; the plain-PyTorch
        ones on the CPU). prompt_multiple: prompts right-padded (masked) up to a multiple of this many tokens
        (EngineOptions.groot_prompt_multiple; 0 or 1: as they come); applied only where the DiT masks its
        cross-attention (AlternateVLDiT), the one case where padding leaves the chunk as it is. fp8: weight-only FP8
        on the fused DiT's GEMMs (engine/groot_dit_gemms.py; needs fused_dit, and the Triton few-row GEMM on a GPU; on
        the CPU its plain-PyTorch reference runs, for tests); the E4M3 flavour is the dispatch table's Op.FP8_FORMAT.
        few_row_gemms: the fused DiT's bf16 GEMMs on the same few-row GEMM (EngineOptions.groot_few_row_gemms; on a
        GPU where the dispatch runs the Triton decoder GEMMs and the model is in a 16-bit dtype: the kernel's dot
        takes fp32 inputs as TF32, so an fp32 model keeps cuBLAS; on the CPU the kernel's reference, for tests).
        engine_vision: the vision tower on the engine's ops (engine/groot_vision.py, EngineOptions.groot_engine_vision;
        its LayerNorms folded into the GEMMs with vision_fold (EngineOptions.fused_weights), its MLP width padded to
        a multiple of vision_mlp_pad (EngineOptions.vision_mlp_pad, None: its default; 0: as is)); False:
        transformers' layers.
        engine_language: the language model's layers on the engine's ops (engine/groot_language.py,
        EngineOptions.groot_engine_language; the model's Q/K/V and gate/up weights become views into the merged
        copies it makes), else transformers' own layers. step_ends: with the fused DiT, a
        batch's one embodiment becomes part of the signature, and its weights and the steps' bias rows are
        prepared once per signature (engine/groot_step_ends.py, EngineOptions.groot_step_ends); False, or a batch
        of several embodiments: the graph gathers each row's weights from its embodiment_id input and runs the
        reference's step ops. tune_with_norm: the DiT's split-K GEMMs timed with the norm that sums their partials
        when their launch configurations are picked (engine/groot_dit_gemms.py, EngineOptions.groot_tune_with_norm)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        capture = device.type == "cuda" if capture is None else capture
        if capture and device.type != "cuda":
            raise ValueError(f"graph capture needs a CUDA device, got {device}; capture=False runs the same code "
                             "eagerly")
        self.model = model
        self.device = device
        self.capture = capture
        self.step_tables = step_tables
        self.fused_dit = fused_dit and step_tables
        if fp8 and not self.fused_dit:
            raise ValueError("GR00T's FP8 reads weight-only FP8 weights in the fused DiT: turn groot_fused_dit and "
                             "groot_step_tables on, or FP8 off (precision 'bf16')")
        self.fp8 = fp8
        self._fused: FusedDit | None = None
        self._vision: GrootVision | None = None
        self._vision_tuned = False
        self.ops: Ops | None = None            # the engine ops of the fused DiT, vision and language
        if self.fused_dit or engine_vision or engine_language:
            if dispatch is None:
                dispatch = (eager_cpu_dispatch() if device.type == "cpu"
                            else resolve(detect_hardware("auto", device)))
            self.ops = Ops(dispatch)
        self.dispatch = dispatch
        if engine_vision:
            pad = EngineOptions().vision_mlp_pad if vision_mlp_pad is None else vision_mlp_pad
            self._vision = prepare_groot_vision(model, self.ops, fold=vision_fold, mlp_pad=pad)
        self._language = prepare_language(model, self.ops) if engine_language else None
        if self.fused_dit:
            if fp8 and device.type == "cuda" and dispatch[Op.GEMM_DECODER] != "triton":
                raise ValueError("GR00T's FP8 reads weight-only FP8 weights in the Triton few-row GEMM "
                                 "(kernels/flashrt_kernels/skinny_gemm.py), which this dispatch does not run "
                                 f"(gemm_decoder={dispatch[Op.GEMM_DECODER]!r}); turn the fp8 option off, or triton on")
            self._fused = prepare_fused_dit(model.action_head, self.ops)
            self._fused.head_attention = head_attention
            rows = 1 + model.cfg.action_horizon
            if fp8:
                quantize_fused_dit(self._fused, FP8_DTYPES[dispatch[Op.FP8_FORMAT]], rows, tune_with_norm)
            elif few_row_gemms and (device.type == "cpu" or (dispatch[Op.GEMM_DECODER] == "triton"
                                                              and self._fused.dtype in FEW_ROW_DTYPES)):
                tune_few_row_gemms(self._fused, rows, tune_with_norm)
        self.step_ends = step_ends and self.fused_dit
        self.prompt_multiple = prompt_multiple if model.cfg.dit.alternate_vl else 0
        self.name = "graph" if capture else "static-eager"
        self._entries: dict[GrootSignature, _Entry] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.capture_seconds: dict[GrootSignature, float] = {}

    @property
    def entries(self) -> dict[GrootSignature, _Entry]:
        """The signatures seen so far -> their buffers, tables and graph (read-only use: tests, benchmarks)."""
        return self._entries

    # ---------------------------------------------------------------------------------------------- buffers
    def _make_entry(self, sig: GrootSignature, noise: torch.Tensor, state: torch.Tensor) -> _Entry:
        cfg = self.model.cfg
        fields = [(f"view{i}", (3, h, w), torch.float32) for i, (h, w) in enumerate(sig.view_sizes)]
        fields += [("input_ids", (sig.batch, sig.prompt_len), torch.int64),
                   ("attention_mask", (sig.batch, sig.prompt_len), torch.bool),
                   ("state", (sig.batch, 1, cfg.max_state_dim), torch.float32),
                   ("embodiment_id", (sig.batch,), torch.int64),
                   ("noise", (sig.batch, cfg.action_horizon, cfg.max_action_dim), torch.float32)]
        expect = {"state": (sig.batch, 1, cfg.max_state_dim),
                  "noise": (sig.batch, cfg.action_horizon, cfg.max_action_dim)}
        for name, tensor in (("state", state), ("noise", noise)):
            if tuple(tensor.shape) != expect[name]:
                raise InputError(f"{name} must have shape {expect[name]}, got {tuple(tensor.shape)}")
        staging = StagingBlob(fields, self.device)
        uploaded = torch.cuda.Event() if self.device.type == "cuda" else None
        self._tune_vision_attention(sig)
        return _Entry(StaticTables(self.model, sig, self.device, self.step_tables, self._fused,
                                   vision=self._vision, language=self._language), staging, uploaded)

    def _tune_vision_attention(self, sig: GrootSignature) -> None:
        """The engine vision's SDPA backend picked by its time (tuning.tune_vision_attention,
        Op.VISION_ATTENTION_TUNING) at the first signature's largest batch of one view size, once per executor, on
        CUDA."""
        if (self._vision is None or self._vision_tuned or self.device.type != "cuda"
                or self.dispatch[Op.VISION_ATTENTION_TUNING] != "measured"):
            return
        self._vision_tuned = True
        v = self._vision
        (h, w), idxs = max(views_by_size(sig.view_sizes).items(), key=lambda item: len(item[1]))
        times = tune_vision_attention(self.ops, len(idxs), (h // v.patch) * (w // v.patch), v.heads, v.head_dim,
                                      v.dtype, self.device, len(v.layers))
        log.info("GR00T vision attention: SDPA backend %s (us per layer: %s)", self.ops.vision_attention_backend,
                 times)

    def _stage(self, entry: _Entry, named: dict[str, torch.Tensor]) -> None:
        """Copy the call's inputs into the static buffers: host tensors through the pinned half and one upload,
        tensors already on the device directly (after the upload, which writes every field)."""
        hv, dv = entry.staging.host_views, entry.staging.device_views
        on_host = {n: t for n, t in named.items() if t.device != self.device}
        if on_host:
            if entry.uploaded is not None:
                entry.uploaded.synchronize()          # the previous upload has read the pinned buffer
            for name, src in on_host.items():
                hv[name].copy_(src)
            entry.staging.upload()
            if entry.uploaded is not None:
                entry.uploaded.record()
        for name, src in named.items():
            if name not in on_host:
                dv[name].copy_(src, non_blocking=True)

    # ---------------------------------------------------------------------------------------------- runs
    def _run_static(self, entry: _Entry) -> torch.Tensor:
        return predict(self.model, entry.tables, *entry.inputs())

    def _capture(self, sig: GrootSignature, entry: _Entry) -> None:
        raise_if_stopped(f"capturing GR00T graph {sig}")
        start = time.perf_counter()
        entry.graph, entry.output = warm_up_and_capture(self.device, lambda: self._run_static(entry), WARMUP_RUNS,
                                                         self._pool)
        self.capture_seconds[sig] = time.perf_counter() - start
        log.info("captured GR00T graph %s in %.2f s", sig, self.capture_seconds[sig])

    def _check_slots(self, entry: _Entry) -> None:
        """The first call of a signature: the prompt's image-token slots match the views' token count."""
        ids = entry.staging.device_views["input_ids"]
        slots = int((ids == self.model.cfg.image_token_index).sum())
        if slots != entry.tables.image_tokens:
            raise InputError(f"the prompt has {slots} image-token slots for {entry.tables.image_tokens} image "
                             "tokens of its views")

    def _pad_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt right-padded with masked id-0 tokens up to a multiple of prompt_multiple. The LLM is causal, so
        no real token sees the padding (nor do their positions change), and the DiT's cross-attention masks it: the
        chunk is the unpadded prompt's, and nearby prompt lengths share one signature (one graph)."""
        length, multiple = input_ids.shape[1], self.prompt_multiple
        if multiple <= 1 or length % multiple == 0:
            return input_ids, attention_mask
        pad = multiple - length % multiple
        return (torch.cat([input_ids, input_ids.new_zeros(input_ids.shape[0], pad)], dim=1),
                torch.cat([attention_mask.bool(), attention_mask.new_zeros(attention_mask.shape[0], pad,
                                                                           dtype=torch.bool)], dim=1))

    @torch.inference_mode()
    def sample_actions(self, views, input_ids: torch.Tensor, attention_mask: torch.Tensor, state: torch.Tensor,
                       embodiment_id: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """views: [N, 3, H, W] or a list of [3, H_i, W_i] normalized, input_ids / attention_mask [B, L],
        state [B, 1, max_state_dim], embodiment_id [B], noise [B, horizon, max_action_dim]
        -> normalized actions [B, horizon, max_action_dim] on the device (GrootModel.predict_normalized's)."""
        if self.model is None:
            raise RuntimeError("sample_actions called after close()")
        views = list(views)
        ids = embodiment_id.reshape(-1).tolist()          # on the host (the policy's inputs are): the check, the signature
        count = self.model.cfg.max_num_embodiments
        if any(not 0 <= e < count for e in ids):
            raise InputError(f"embodiment_id {ids} out of range: the checkpoint has {count} embodiment projectors "
                             f"(ids 0-{count - 1})")
        input_ids, attention_mask = self._pad_prompt(input_ids, attention_mask)
        sig = GrootSignature.of(views, input_ids, attention_mask, ids if self.step_ends else None,
                                padded_at_end=self.prompt_multiple > 1)
        entry = self._entries.get(sig)
        fresh = entry is None
        if fresh:
            entry = self._make_entry(sig, noise, state)
        named = {f"view{i}": v for i, v in enumerate(views)}
        named.update(input_ids=input_ids, attention_mask=attention_mask, state=state,
                     embodiment_id=embodiment_id.reshape(sig.batch), noise=noise)
        self._stage(entry, named)
        if fresh:
            self._check_slots(entry)
            self._entries[sig] = entry
        if not self.capture:
            return self._run_static(entry)
        if entry.graph is None:
            self._capture(sig, entry)
        entry.graph.replay()
        return entry.output.clone()

    @torch.inference_mode()
    def phase_graphs(self, sig: GrootSignature | None = None) -> tuple[dict, dict]:
        """Vision (with the projector), language (embedding, image-token scatter, Qwen3 layers) and action head
        (vlln, state encoder, Euler steps, decoder) of a signature already run (None: the only one), each captured
        as a CUDA graph of its own on the signature's buffers, in one memory pool.
        -> ({phase: graph}, {"vit" | "feats" | "out": each graph's output}); keep the outputs while replaying."""
        if not self.capture:
            raise ValueError("phase graphs are CUDA graphs: capture=True on a CUDA device")
        if sig is None:
            if len(self._entries) != 1:
                raise ValueError(f"{len(self._entries)} signatures captured: name one of {list(self._entries)}")
            (sig,) = self._entries
        entry = self._entries[sig]
        views, ids, mask, state, emb, noise = entry.inputs()
        m, t = self.model, entry.tables
        held: dict = {}
        phases = (("vision", lambda: image_tokens(m, t, views, embed_dtype(m)), "vit"),
                  ("language", lambda: language_features(m, t, held["vit"], ids, mask), "feats"),
                  ("action_head", lambda: action_chunk(m, t, held["feats"], ids, mask, state, emb, noise), "out"))
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for name, fn, output in phases:
            graphs[name], held[output] = warm_up_and_capture(self.device, fn, WARMUP_RUNS, pool)
        return graphs, held

    def phase_times(self, sig: GrootSignature | None = None, reps: int = 20) -> dict[str, float]:
        """Median GPU ms of each of phase_graphs' graphs, replayed `reps` times."""
        graphs, _held = self.phase_graphs(sig)
        return {name: float(np.median(graph_replay_ms(g, reps))) for name, g in graphs.items()}

    def close(self) -> None:
        self._entries.clear()
        self._fused = None
        self._vision = None
        self._language = None
        self.model = None
