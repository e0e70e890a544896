"""GR00T N1.6 behind the Policy API: load_model(checkpoint, config="groot_n1.6", embodiment=TAG).

predict(images, prompt, state, noise) -> float32 (horizon, action_dim) in robot units, as for the pi family:
images by view name (the embodiment's video keys) or in that order, state by joint group ({group: values}) or
flat in group order, noise (action_horizon, max_action_dim) to pin the flow. The embodiment picks the projector
slice, the joint groups and their statistics (groot_statistics).

Executors (build_groot_executor): on CUDA the graph executor (engine/groot_graph.py: the whole predict as one
CUDA graph per input signature), chosen as the pi family's is: the dispatch table's Op.EXECUTOR from the hardware
and EngineOptions ("graph"; "eager_engine" with cuda_graph off runs the same static code without a graph;
"reference" with fast_paths off). hardware="reference", and "auto" on the CPU, run the eager reference executor;
a GPU target ("sm90", ...) on the CPU is refused. precision="fp8" (engine_options.fp8) puts weight-only FP8 weights
on the fused DiT's GEMMs (engine/groot_dit_gemms.py); the CPU and the reference path refuse it (api.resolve_precision).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from flashrt_core import groot_inputs, preprocess
from flashrt_core.engine import EngineOptions, Op, detect_hardware, resolve_dispatch
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.errors import InputError
from flashrt_core.groot_checkpoint import find_tokenizer, load_state_dict, resolve_groot_config
from flashrt_core.groot_statistics import Embodiment, load_embodiment
from flashrt_core.model.groot.config import GrootConfig
from flashrt_core.model.groot.model import GrootModel
from flashrt_core.policy_lifetime import PolicyLifetime
from flashrt_core.stopping import raise_if_stopped

log = logging.getLogger(__name__)

# The longest instruction, in tokens, whose prompt's graph warm_up_text_buckets makes: a longer one costs a capture
# on its first call (a pause of seconds on a running robot). Instructions to robots are a few words to a sentence
# or two.
WARMUP_INSTRUCTION_TOKENS = 64


class GrootReferenceExecutor:
    """Backbone once, then num_inference_timesteps Euler steps of the DiT (eager PyTorch)."""

    name = "reference"
    uses_model = True

    def __init__(self, model: GrootModel, device: torch.device):
        self.model = model
        self.device = device

    def sample_actions(self, pixels, input_ids, attention_mask, state, embodiment_id, noise) -> torch.Tensor:
        return self.model.predict_normalized(pixels, input_ids, attention_mask, state, embodiment_id, noise)

    def close(self) -> None:
        self.model = None


class GrootPolicy(PolicyLifetime):
    """A loaded GR00T N1.6 policy for one embodiment. Not thread-safe: call predict from one thread at a time."""

    requires_state = True
    text_buckets: tuple[int, ...] = ()

    def __init__(self, model: GrootModel, config: GrootConfig, embodiment: Embodiment,
                 tokenizer: groot_inputs.GrootTokenizer, device: torch.device, model_id: str, executor=None):
        """executor: GrootReferenceExecutor (None) or GrootGraphExecutor over `model`."""
        self.model = model
        self.config = config
        self.embodiment = embodiment
        self.tokenizer = tokenizer
        self.device = device
        self.model_id = model_id
        self.executor = GrootReferenceExecutor(model, device) if executor is None else executor

    horizon = property(lambda self: self.embodiment.action_horizon or self.config.action_horizon)
    action_dim = property(lambda self: self.embodiment.action_dim)
    state_dim = property(lambda self: self.embodiment.state_dim)
    view_names = property(lambda self: list(self.embodiment.views))
    state_groups = property(lambda self: [(g.name, g.dim) for g in self.embodiment.state])
    action_groups = property(lambda self: [(g.name, g.dim) for g in self.embodiment.action])

    def prepare_inputs(self, images, prompt: str, state=None, noise=None):
        """Validated, preprocessed tensors in sample_actions' argument order, on the device the executor takes
        its inputs from (the policy's device; the host for the graph executor, which stages them in one copy)."""
        cfg, emb = self.config, self.embodiment
        views = groot_inputs.prepare_views(images, emb.views, cfg, emb.shortest_image_edge, emb.crop_fraction)
        ids = groot_inputs.prompt_ids(self.tokenizer, cfg, prompt, [cfg.image_tokens(*v.shape[-2:]) for v in views],
                                      emb.formalize_language)
        state_n = emb.normalize_state(state, cfg.max_state_dim)
        dev = getattr(self.executor, "input_device", None) or self.device
        mask = torch.ones(1, ids.shape[0], dtype=torch.bool, device=dev)
        flow_noise = preprocess.host_noise(noise, (cfg.action_horizon, cfg.max_action_dim))
        return ([v.to(dev) for v in views], torch.from_numpy(ids)[None].to(dev), mask,
                torch.from_numpy(state_n)[None, None].to(dev), torch.tensor([emb.id], dtype=torch.long, device=dev),
                torch.from_numpy(flow_noise)[None].to(dev))

    def reachable_text_buckets(self, state=None) -> tuple[int, ...]:
        """GR00T keeps no text buckets: the graph executor captures one graph per padded prompt length (and view
        sizes) on its first call (engine/groot_graph.py); warm_up_text_buckets makes those of every instruction
        length up to WARMUP_INSTRUCTION_TOKENS for given images."""
        return ()

    def warm_up_text_buckets(self, images, prompt: str, state=None,
                             max_instruction_tokens: int = WARMUP_INSTRUCTION_TOKENS) -> list[int]:
        """One predict per graph signature that an instruction of 1 to max_instruction_tokens tokens lands in with
        these images, so that no such instruction costs a capture while the robot runs (`prompt` has had its own
        predict: the node's warm-up passes). The graph executor pads every prompt with masked tokens up to a
        multiple of its prompt_multiple (groot_prompt_multiple), and a prompt whose length is that multiple shares
        the padded prompts' signature, so there is one graph per multiple; a graph depends on the prompt's length
        and mask, not on its token values, so each run is the shortest instruction's prompt with text tokens
        repeated up to the multiple's longest length. Each run checks for a stop first (flashrt_core.stopping); the
        actions are discarded. Returns the padded prompt lengths warmed: [] on the reference executor, which
        captures nothing, and where prompts are not padded (a plain DiT: every length would be a graph of its
        own)."""
        multiple = getattr(self.executor, "prompt_multiple", 0)
        if multiple <= 1:
            return []
        views, ids, mask, state_n, emb, noise = self.prepare_inputs(images, "a", state)     # the shortest prompt
        text = ids[0][ids[0] != self.config.image_token_index][:1]                           # one text token
        shortest = ids.shape[1]
        lengths: dict[int, int] = {}                    # padded length -> the longest prompt length padded to it
        for length in range(shortest, shortest + max_instruction_tokens):
            lengths[-(-length // multiple) * multiple] = length
        for padded, length in sorted(lengths.items()):
            raise_if_stopped(f"warming up the GR00T prompt length {length} (padded to {padded})")
            longer = torch.cat([text.repeat(length - shortest), ids[0]])[None]
            self.executor.sample_actions(views, longer, torch.ones_like(longer, dtype=mask.dtype), state_n, emb,
                                         noise)
        return sorted(lengths)

    def predict(self, images, prompt: str, state=None, noise=None, rtc=None) -> np.ndarray:
        """-> float32 (horizon, action_dim) in robot units (groot_statistics unnormalizes per joint group). rtc must
        be None: real-time chunking (flashrt_core.rtc) is built for the pi family's denoiser only."""
        if rtc is not None:
            raise InputError("real-time chunking (rtc) is built for the pi0 / pi0.5 denoiser, not GR00T N1.6's action "
                             "head: rtc=None (the policy node: rtc off)")
        if self.executor is None:
            raise RuntimeError("Policy.predict called after close()")
        actions = self.executor.sample_actions(*self.prepare_inputs(images, prompt, state, noise))
        return self.embodiment.unnormalize_actions(actions[0].float().cpu().numpy(), state)





def check_hardware(hardware: str, device: torch.device) -> None:
    """A known hardware name (engine.detect_hardware's forms), and a GPU target only with a CUDA device."""
    if hardware in ("auto", "reference"):
        return
    detect_hardware(hardware, device)                    # an unknown name raises ValueError naming it
    if device.type != "cuda":
        raise ValueError(f"hardware={hardware!r} needs a CUDA device, got {device}; GR00T runs on the CPU with "
                         "hardware='auto' or 'reference' (the eager reference executor)")


def build_groot_executor(model: GrootModel, device: torch.device, hardware: str = "auto",
                         options: EngineOptions | None = None):
    """The executor for this device, hardware and options (as engine.build_executor picks the pi family's):
    hardware="reference" or a CPU device -> GrootReferenceExecutor; on CUDA the dispatch table's Op.EXECUTOR:
    "graph" -> GrootGraphExecutor, "eager_engine" (cuda_graph off) -> the same without capture, "reference"
    (fast_paths off) -> GrootReferenceExecutor; with FP8 (engine_options.fp8 on an FP8-capable GPU: Op.GEMM_PREFIX
    "fp8") the fused DiT's GEMMs read weight-only FP8 weights (engine/groot_dit_gemms.py). options None reads the
    defaults with the environment on top."""
    device = torch.device(device)
    check_hardware(hardware, device)
    dispatch = resolve_dispatch(device, hardware, options)
    if dispatch is None:
        return GrootReferenceExecutor(model, device)
    chosen = dispatch.options
    return GrootGraphExecutor(model, device, capture=dispatch[Op.EXECUTOR] == "graph",
                              step_tables=chosen.enabled("groot_step_tables"),
                              fused_dit=chosen.enabled("groot_fused_dit"), dispatch=dispatch,
                              prompt_multiple=chosen.groot_prompt_multiple if chosen.fast_paths else 0,
                              fp8=dispatch[Op.GEMM_PREFIX] == "fp8",
                              few_row_gemms=chosen.enabled("groot_few_row_gemms"),
                              head_attention=chosen.enabled("groot_head_attention"),
                              engine_vision=chosen.enabled("groot_engine_vision"),
                              vision_fold=chosen.enabled("fused_weights"),
                              vision_mlp_pad=chosen.vision_mlp_pad if chosen.fast_paths else 0,
                              engine_language=chosen.enabled("groot_engine_language"),
                              step_ends=chosen.enabled("groot_step_ends"),
                              tune_with_norm=chosen.enabled("groot_tune_with_norm"))


def load_groot_policy(checkpoint_dir: Path, config=None, embodiment: str | None = None,
                      device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32,
                      hardware: str = "auto", tokenizer=None, statistics=None,
                      engine_options: EngineOptions | None = None) -> GrootPolicy:
    """hardware / engine_options pick the executor (build_groot_executor); a GPU target on the CPU is refused
    before the weights are read."""
    check_hardware(hardware, torch.device(device))
    cfg = resolve_groot_config(config, checkpoint_dir)
    if not embodiment:
        raise InputError("GR00T needs embodiment=TAG (the robot whose projectors, joint groups and statistics to "
                         "use), e.g. embodiment='new_embodiment'")
    emb = load_embodiment(checkpoint_dir, embodiment, cfg.max_state_dim, cfg.max_action_dim, statistics,
                          cfg.max_num_embodiments)
    tok = groot_inputs.GrootTokenizer(find_tokenizer(checkpoint_dir, tokenizer))
    weights = load_state_dict(checkpoint_dir, cfg, dtype, device)
    with torch.device("meta"):
        model = GrootModel(cfg)
    model.load_state_dict(weights, strict=True, assign=True)
    model.backbone.model.materialize_buffers(device)
    meta = [n for n, b in model.named_buffers() if b.is_meta]
    if meta:
        raise RuntimeError(f"buffers left on the meta device after loading: {meta}")
    model.eval()
    executor = build_groot_executor(model, device, hardware, engine_options)
    model_id = f"{cfg.name}:{checkpoint_dir.resolve().name}:{emb.tag}"
    log.info("loaded %s on %s (%s, %s executor)", model_id, device, dtype, executor.name)
    return GrootPolicy(model, cfg, emb, tok, device, model_id, executor)
