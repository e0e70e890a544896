"""The engine's options and every FLASHRT_* environment variable the product reads, in one place.

Each `EngineOptions` field carries its own reference (field metadata): what it does and what turning it off falls
back to. Its environment variable is FLASHRT_<FIELD IN UPPER CASE>, except `impl` (one op pinned per variable,
FLASHRT_IMPL_<OP>=<impl>). `EngineOptions.from_env` is the only reader of those variables; `read_switch` and
`read_path` read the few that are not engine options (`PRODUCT_ENVIRONMENT`: flashrt_core/api.py's). The
reference docs/engine_options.md is generated from it (engine/options_doc.py; a test keeps it equal):

    python -m flashrt_core.engine.options_doc --write
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, replace
from typing import Mapping, NamedTuple

ENV_PREFIX = "FLASHRT_"
IMPL_PREFIX = ENV_PREFIX + "IMPL_"          # FLASHRT_IMPL_<OP>=<impl>: EngineOptions.impl
HOST_WAIT_ENV = ENV_PREFIX + "HOST_WAIT"    # not read: from_env refuses it (docs/engine.md, Tried and rejected)

# The token-buffer lengths the engine captures a graph for (max_token_len is always added): every 16 tokens up to
# 176. A prompt pays for the padding of its bucket: on the H200 (pi0.5, 2 views,
# docs/benchmarks/2026-12-01/text_buckets_h200.md) a replay costs ~0.3 ms more per 64 tokens of buffer (bf16), so
# coarse buckets make pi0.5's discretized-state prompts (129-200 tokens) pay for 200. 192 is left out: its replay
# is slower than 200's in bf16 and FP8 (12.03 vs 11.54 ms, 10.33 vs 10.18 ms). Each bucket costs one capture
# (0.4-3 s) when it is first used or warmed up.
DEFAULT_TEXT_BUCKETS = tuple(range(16, 177, 16))


def _option(default, what: str, off: str = "", **kwargs):
    """A dataclass field with its reference: what it does and what turning it off (0, False, "") falls back to."""
    return field(default=default, metadata={"what": what, "off": off}, **kwargs)


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings. Every fast path has one switch here; `fast_paths=False` turns them all off."""

    fast_paths: bool = _option(True, "Master switch of every fast path below.",
                               "The eager reference executor (flashrt_core/executor.py), whatever else is set.")
    cuda_graph: bool = _option(True, "Captures the whole predict as one CUDA/HIP graph per input signature.",
                               "The same engine ops launched one by one (executor `eager_engine`).")
    triton: bool = _option(True, "The fused Triton kernels of kernels/flashrt_kernels/.",
                           "Every Triton kernel replaced by its plain-PyTorch reference (attention by SDPA).")
    fused_weights: bool = _option(True, "Folds the norm scales into the GEMMs and merges Q/K/V and gate/up at load.",
                                  "Separate GEMMs; the norm weights applied in the norms.")
    flash_attention: bool = _option(True, "torch's fused SDPA kernels for the attentions.",
                                    "The math attention (matmul, fp32 softmax, matmul).")
    fp8: bool = _option(False, "FP8 E4M3 with static per-tensor scales on the backbone's gate/up and down GEMMs "
                        "(opt-in; the scope that passes the 0.998 accuracy gate, engine/fp8.py). GR00T: weight-only "
                        "FP8 on the DiT blocks' GEMMs (engine/groot_dit_gemms.py).",
                        "bf16 GEMMs everywhere.")
    pdl: bool = _option(True, "Programmatic dependent launch between the Triton kernels (NVIDIA sm90+): a kernel "
                        "starts while the one before it ends and streams its weights before its wait.",
                        "Plain stream order.")
    pdl_early_trigger: bool = _option(True, "Chosen denoiser kernels release the next one at their start; the "
                                      "chain tuning picks the launch policy (kernel_configs.LAUNCH_POLICIES).",
                                      "Plain PDL: no kernel releases the next one early.")
    rope_in_attention: bool = _option(True, "The denoiser's attention kernel applies RoPE and reads the suffix K/V "
                                      "from the QKV GEMM's output (no qkv_rope launch).",
                                      "RoPE and the KV write in their own kernel, or in the QKV GEMM's epilogue "
                                      "where the tuning picks it.")
    gemm_epilogue: bool = _option(True, "The vision fc1's bias and tanh GELU in the cuBLASLt / hipBLASLt epilogue.",
                                  "The GEMM with its bias, then torch's GELU.")
    vision_mlp_pad: int = _option(128, "The vision MLP's width (4304) rounded up to a multiple of this at load (zero "
                                  "rows of fc1, zero columns of fc2: the same output).",
                                  "0: the width as it is.")
    chain_tuning: bool = _option(True, "The decoder GEMMs' candidates timed again inside the captured denoiser, "
                                 "where they run (engine/tuning.py).",
                                 "The decoder GEMMs picked by their time alone.")
    chain_tuning_passes: int = _option(2, "At most this many passes of the chain tuning (1-8); it repeats until a "
                                       "pass changes no pick.")
    fp8_fused_quant: bool = _option(True, "FP8 engines: the GeGLU kernel writes the down GEMM's FP8 input.",
                                    "A bf16 GeGLU output, then kernels/flashrt_kernels/fp8_quant.py.")
    smem_gemm: bool = _option(True, "kernels/flashrt_kernels/smem_gemm.py (weights staged in shared memory by TMA "
                              "before the PDL wait) among the decoder GEMM candidates, and among GR00T's bf16 DiT "
                              "GEMMs' (NVIDIA Hopper with Gluon).",
                              "The tuning picks among the Triton and library GEMMs.")
    smem_gemm_rows: bool = _option(True, "The shared-memory GEMM candidates at 17-64 rows too (horizon-50 steps, "
                                   "GR00T's DiT), x streamed through a ring of TMA boxes.",
                                   "Shared-memory GEMM candidates only up to 16 rows.")
    prefix_attention_tuning: bool = _option(True, "The prefix attention picked at load by its time among the mqa "
                                            "kernel's forms and torch SDPA.",
                                            "The mqa implementation, unmeasured.")
    prefix_attention_wgmma: bool = _option(True, "kernels/flashrt_kernels/prefix_attention.py (Gluon, wgmma) joins "
                                           "the prefix attention tuning where it serves the GPU.",
                                           "The tuning leaves it out.")
    vision_attention_tuning: bool = _option(True, "The vision attention's SDPA backend picked at load by its time.",
                                            "torch's own choice of SDPA backend, unmeasured.")
    fused_patch_embed: bool = _option(True, "Each uint8 view becomes its patch rows in one "
                                      "kernels/flashrt_kernels/patch_embed.py launch; the patch GEMM runs in the "
                                      "engine dtype.",
                                      "torch ops and an fp32 patch GEMM.")
    fused_denoise_step: bool = _option(True, "pi0.5: each denoising step's two ends in one kernel each "
                                       "(kernels/flashrt_kernels/denoise_step.py).",
                                       "Separate ops (cast, input GEMM, copy, norm; norm, output GEMM, Euler).")
    fused_denoise_step_pi0: bool = _option(True, "pi0: the step ends fused too (time_mlp_in, one few-row GEMM, "
                                           "denoise_step_out); needs fused_denoise_step.",
                                           "pi0's step ends as separate ops.")
    overlap_first_step: bool = _option(True, "The first denoising step's layer i runs beside the prefix's later "
                                       "layers on a second stream (forward.forward_overlapped).",
                                       "The first step after the whole prefix, on one stream.")
    decode_graph_tokens: int = _option(8, "pi0-FAST: decoding steps per replayed decode graph (1-64); the host "
                                       "reads the end-of-sequence flag once per graph (engine/fast_decode.py).")
    groot_step_tables: bool = _option(True, "GR00T: what each Euler step's DiT takes from its timestep alone (AdaLN "
                                      "scales and shifts, the output modulation, the action encoder's sinusoid) "
                                      "computed once at capture, the backbone features' cross-attention K/V once per "
                                      "predict (engine/groot_dit.py).",
                                      "The reference's sampler (model/groot/sampler.py) inside the graph.")
    groot_fused_dit: bool = _option(True, "GR00T: the DiT's blocks on the engine's fused ops: AdaLN and norm3 with the "
                                    "residual add in one norm kernel over an fp32 residual stream, Q/K/V of the "
                                    "self-attention blocks in one GEMM, GELU in the MLP GEMM's epilogue "
                                    "(engine/groot_fused_dit.py); needs groot_step_tables.",
                                    "The step tables' sampler with the reference DiT's ops.")
    groot_few_row_gemms: bool = _option(True, "GR00T: the fused DiT's GEMMs (17 rows per observation) on the Triton "
                                        "few-row GEMM, bias and GELU in its epilogue, the output projection and "
                                        "MLP down as split-K partials that the next norm sums; launch "
                                        "configurations timed per shape at build (engine/groot_dit_gemms.py). FP8 always "
                                        "reads its weights this way.",
                                        "bf16 DiT GEMMs on cuBLAS (the GELU in cuBLASLt's epilogue).")
    groot_tune_with_norm: bool = _option(True, "GR00T: the fused DiT's split-K GEMMs (output projection, MLP down) "
                                         "timed at build together with the LayerNorm that sums their partials, so "
                                         "the pick weighs the norm's reads of each K-slice's partial "
                                         "(engine/groot_dit_gemms.py).",
                                         "Each GEMM's configuration timed alone.")
    groot_head_attention: bool = _option(True, "GR00T: the fused DiT's attention in one Triton kernel that reads Q, K "
                                         "and V in place from the GEMM's output and writes the O projection's "
                                         "input rows, launched with PDL (flashrt_kernels/head_attention.py).",
                                         "torch SDPA and a transpose copy per block.")
    groot_engine_vision: bool = _option(True, "GR00T: the SigLIP2 vision tower and the pixel-unshuffle projector on "
                                        "the engine's ops, as pi's vision: residual add and LayerNorm in one norm "
                                        "kernel over an fp32 residual stream, LayerNorms folded into merged Q/K/V "
                                        "and fc1 GEMMs, fc1's tanh GELU in the GEMM's epilogue, the SDPA backend "
                                        "timed at the first signature (engine/groot_vision.py).",
                                        "transformers' Siglip2 encoder layers, post-LayerNorm and projector.")
    groot_engine_language: bool = _option(True, "GR00T: the language model's layers on the engine's ops: the "
                                          "residual add in the RMSNorm kernel over an fp32 stream, Q/K/V and "
                                          "gate/up each one GEMM, q_norm / k_norm with RoPE in one kernel, SiLU-GLU "
                                          "in one kernel (engine/groot_language.py).",
                                          "transformers' Qwen3 decoder layers.")
    groot_step_ends: bool = _option(True, "GR00T: the Euler steps' ends around the fused DiT in few kernels: a "
                                    "batch's one embodiment is part of the graph's signature, so its encoder and "
                                    "decoder weights are views picked at capture instead of gathered in every "
                                    "predict, the action encoder's first two GEMMs folded into one per step "
                                    "(engine/groot_step_ends.py).",
                                    "The embodiment's weights gathered in the graph from its embodiment_id input, "
                                    "and the reference's step ops.")
    groot_prompt_multiple: int = _option(16, "GR00T: the prompt right-padded with masked tokens up to a multiple of "
                                         "this many, so instructions of nearby lengths replay one graph instead of "
                                         "capturing a new one (the LLM is causal and the DiT masks the padding: the "
                                         "same chunk); AlternateVLDiT checkpoints only (engine/groot_graph.py).",
                                         "0: every prompt length has its own graph, captured on first use.")
    text_buckets: tuple[int, ...] = _option(DEFAULT_TEXT_BUCKETS, "The token-buffer lengths with a graph each, "
                                            "comma-separated (max_token_len is always added).")
    tuning_cache: str = _option("", "A directory where the load-time tuning's picks are kept and reused at the next "
                                "load of the same model, GPU, software and options (engine/tuning_cache.py).",
                                "\"\": measure at every load.")
    impl: Mapping[str, str] = _option(None, "Pins ops: {op: implementation} (FLASHRT_IMPL_<OP>=<impl>, e.g. "
                                      "FLASHRT_IMPL_MQA=sdpa); one that cannot run raises ValueError.")

    def __post_init__(self) -> None:
        if self.impl is None:
            object.__setattr__(self, "impl", {})
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name} must be a bool, got {value!r}")
        if not isinstance(self.tuning_cache, str):
            raise ValueError(f"tuning_cache must be a directory path as a str ('' = off), got {self.tuning_cache!r}")
        if not (isinstance(self.vision_mlp_pad, int) and self.vision_mlp_pad >= 0 and self.vision_mlp_pad % 8 == 0):
            raise ValueError(f"vision_mlp_pad must be 0 (off) or a positive multiple of 8, got {self.vision_mlp_pad!r}")
        if not (isinstance(self.chain_tuning_passes, int) and 1 <= self.chain_tuning_passes <= 8):
            raise ValueError(f"chain_tuning_passes must be an int from 1 to 8, got {self.chain_tuning_passes!r}")
        if not (isinstance(self.decode_graph_tokens, int) and 1 <= self.decode_graph_tokens <= 64):
            raise ValueError(f"decode_graph_tokens must be an int from 1 to 64, got {self.decode_graph_tokens!r}")
        if not (isinstance(self.groot_prompt_multiple, int) and 0 <= self.groot_prompt_multiple <= 256):
            raise ValueError(f"groot_prompt_multiple must be an int from 0 (off) to 256, got "
                             f"{self.groot_prompt_multiple!r}")
        if any((not isinstance(b, int)) or b <= 0 for b in self.text_buckets):
            raise ValueError(f"text_buckets must be positive ints, got {self.text_buckets!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.impl.items()):
            raise ValueError(f"impl must map op names to implementation names (str), got {self.impl!r}")

    def enabled(self, name: str) -> bool:
        """Whether the boolean option `name` is on, fast_paths included."""
        return self.fast_paths and getattr(self, name)

    @classmethod
    def from_env(cls, base: "EngineOptions | None" = None, env: Mapping[str, str] | None = None) -> "EngineOptions":
        """`base` (default: the defaults) with the FLASHRT_* environment variables applied on top. The one reader
        of the engine's variables; an empty variable counts as unset, except FLASHRT_TUNING_CACHE ("" = off)."""
        base = base or cls()
        env = os.environ if env is None else env
        retired = sorted(name for name in env if name.startswith(ENV_PREFIX + "DISABLE_"))
        if retired:
            raise ValueError(f"{retired[0]} is not read: each switch has one variable, "
                             f"{ENV_PREFIX}{retired[0][len(ENV_PREFIX + 'DISABLE_'):]}=0 turns it off "
                             "(docs/engine_options.md)")
        if HOST_WAIT_ENV in env:
            raise ValueError(f"{HOST_WAIT_ENV} is not read: predict waits by the stream's synchronize "
                             "(docs/engine.md, Tried and rejected)")
        changes: dict = {}
        for f in dataclasses.fields(cls):
            if f.name == "impl":
                continue
            name = env_name(f.name)
            raw = env.get(name)
            if raw is None or (raw == "" and f.name != "tuning_cache"):
                continue
            changes[f.name] = _parse(name, f.type, raw)
        impl = dict(base.impl)
        impl.update({name[len(IMPL_PREFIX):].lower(): value for name, value in env.items()
                     if name.startswith(IMPL_PREFIX) and value})
        changes["impl"] = impl
        return replace(base, **changes)


def env_name(option: str) -> str:
    """The environment variable of an EngineOptions field."""
    return ENV_PREFIX + option.upper() if option != "impl" else IMPL_PREFIX + "<OP>"


def _parse(name: str, kind: str, raw: str):
    """One environment value as the field's type; a malformed one raises ValueError naming the variable."""
    if kind == "bool":
        if raw not in ("0", "1"):
            raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
        return raw == "1"
    if kind == "int":
        if not raw.isdigit():
            raise ValueError(f"{name} must be a non-negative integer, got {raw!r}")
        return int(raw)
    if kind == "tuple[int, ...]":
        parts = [p.strip() for p in raw.split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"{name} must be comma-separated token counts, got {raw!r}")
        return tuple(int(p) for p in parts)
    return raw


class EnvVariable(NamedTuple):
    """A FLASHRT_* variable the product reads that is not an engine option."""

    name: str
    default: str
    what: str


PRODUCT_ENVIRONMENT = (
    EnvVariable("FLASHRT_GPU_PREPROCESS", "1", "load_model(gpu_preprocess=None): with the graph engine, the raw "
                "uint8 images go into its graph, which resizes them; 0 resizes them on the host."),
    EnvVariable("FLASHRT_GPU_UNNORMALIZE", "1", "load_model(gpu_unnormalize=None): with the GPU preprocessing, the "
                "graph unnormalizes the actions too; 0 unnormalizes them on the host."),
    EnvVariable("FLASHRT_TOKENIZER", "", "The PaliGemma tokenizer model, looked for after the checkpoint's own "
                "tokenizer.model (flashrt_core.api.tokenizer_candidates)."),
    EnvVariable("FLASHRT_FAST_TOKENIZER", "", "pi0-FAST's FAST action tokenizer folder, looked for after the "
                "checkpoint's own (flashrt_core.pi0_fast_policy.find_fast_tokenizer)."),
    EnvVariable("FLASHRT_GROOT_TOKENIZER", "", "GR00T's Eagle (Qwen3) tokenizer folder, looked for after the "
                "checkpoint's own (flashrt_core.groot_checkpoint.find_tokenizer)."),
    EnvVariable("FLASHRT_CACHE_DIR", "~/.cache/flashrt", "Where the embedded demo checkpoint is generated and kept "
                "(load_model(None))."),
)
_PRODUCT = {v.name: v for v in PRODUCT_ENVIRONMENT}


def read_switch(name: str) -> bool:
    """A 0 / 1 variable of PRODUCT_ENVIRONMENT, its default when unset."""
    raw = os.environ.get(name, _PRODUCT[name].default)
    if raw not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
    return raw == "1"


def read_path(name: str) -> str:
    """A path variable of PRODUCT_ENVIRONMENT; "" when unset or empty."""
    if name not in _PRODUCT:
        raise KeyError(f"{name} is not in PRODUCT_ENVIRONMENT")
    return os.environ.get(name) or ""
