"""pi0-FAST as a Policy: the prompt with the discretized state, greedy decoding, FAST tokens back to a chunk.

Prompt (openpi FASTTokenizer.tokenize): the instruction is cleaned with ``text.lower().strip().replace("_", " ")``,
the normalized state is cut into openpi's 256 bins (preprocess.discretize_state, the robot's state_dim values,
unpadded) and the prefix is ``encode("Task: {text}, State: {b0 b1 ...};\\n", add_bos=True)``, right-padded to
max_token_len with a mask (cut with a warning when longer). The model then writes ``"Action: "``, the FAST
tokens, ``"|"`` and EOS.

Action tokens (openpi ``_act_tokens_to_paligemma_tokens``): FAST token t is the PaliGemma id
``vocab - 1 - fast_skip_tokens - t`` (vocab = the sentencepiece model's size, 257,152 for PaliGemma; the last 128
ids are skipped), so FAST tokens fill the top of the vocabulary downwards.

lerobot's pi0_fast policy (FastDecoding.prompt_style "lerobot"; read from its code, not run here) cleans the
instruction as pi0 does (no lower-casing, newlines to spaces), appends a BOS after the prompt, from which decoding
starts, and uses contiguous positions.

Images: a missing view is a black image (-1 after scaling); openpi's pi0-FAST inputs (DroidInputs,
LiberoInputs) leave it unmasked ("we don't mask out padding images for FAST models"), so the openpi style does too;
the lerobot style masks it, as lerobot does. The preset's view order is openpi's DROID one (base_0_rgb, base_1_rgb,
wrist_0_rgb); openpi's LIBERO pi0-FAST names pi0's views (base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb).

Extraction, on tokens (openpi does the same on the decoded text, then re-encodes; with PaliGemma's tokenizer the
action ids are single pieces, so both agree on well-formed output): cut at the first EOS; take what follows the
first ``"Action: "`` token sequence up to the first ``"|"``; map back to FAST ids; FAST-decode (fast_tokenizer).
An output without the marker, with an id outside the FAST range, or that does not decode to horizon x action_dim
coefficients raises ActionDecodeError (openpi returns a zero chunk instead, which unnormalizes to the middle of
the action range: a motion, not a stop); ``FastDecoding.relaxed_decoding`` pads / cuts the coefficients instead
(fast_tokenizer.FastTokenizer.decode). predict returns the full chunk (horizon, action_dim): the DCT spans the
whole horizon, so a FAST chunk has no shorter valid length.

The FAST tokenizer files (tokenizer.json + processor_config.json, as "physical-intelligence/fast" ships them) are
looked for in the checkpoint's fast_tokenizer/ folder, the checkpoint folder itself, then $FLASHRT_FAST_TOKENIZER;
`fast_tokenizer=` overrides.

Executors: on a GPU the graph engine (engine/fast_decode.py: the prefill and the decoding steps replayed as CUDA
graphs, bf16); on the CPU, with hardware="reference" or with the engine's fast paths off, the eager reference
(FastReferenceExecutor).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from flashrt_core import preprocess
from flashrt_core.api import Policy
from flashrt_core.config import ModelConfig, ModelType
from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.fast_tokenizer import PROCESSOR_CONFIG_FILE, TOKENIZER_FILE, ActionDecodeError, FastTokenizer
from flashrt_core.model import Pi0FastModel
from flashrt_core.tokenizer import EOS_ID, PromptTokenizer, clean_text
from flashrt_core.engine import resolve_dispatch
from flashrt_core.engine.fast_decode import FastGraphExecutor
from flashrt_core.engine.options import EngineOptions, read_path

log = logging.getLogger(__name__)

FAST_TOKENIZER_DIR = "fast_tokenizer"
FAST_TOKENIZER_ENV = "FLASHRT_FAST_TOKENIZER"
ACTION_PREFIX = "Action: "
ACTION_END = "|"
SUPPLY_FAST_TOKENIZER = ("download the FAST tokenizer (the Hugging Face repository physical-intelligence/fast: "
                         f"{TOKENIZER_FILE} and {PROCESSOR_CONFIG_FILE}) into the checkpoint's {FAST_TOKENIZER_DIR}/ "
                         f"folder, set {FAST_TOKENIZER_ENV}, or pass fast_tokenizer=PATH")


def clean_fast_text(text: str) -> str:
    """openpi FASTTokenizer's cleaning: lower-case, strip, '_' -> ' ' (newlines are kept)."""
    return text.lower().strip().replace("_", " ")


def fast_prompt(text: str, state_bins) -> str:
    """The pi0-FAST prefix string (without BOS); `text` already cleaned."""
    return f"Task: {text}, State: {' '.join(str(int(b)) for b in state_bins)};\n"


def find_fast_tokenizer(checkpoint_dir: Path) -> Path:
    candidates = [checkpoint_dir / FAST_TOKENIZER_DIR, checkpoint_dir]
    if read_path(FAST_TOKENIZER_ENV):
        candidates.append(Path(read_path(FAST_TOKENIZER_ENV)))
    for path in candidates:
        if (path / TOKENIZER_FILE).is_file() and (path / PROCESSOR_CONFIG_FILE).is_file():
            return path
    raise CheckpointError("FAST tokenizer not found; tried " + ", ".join(map(str, candidates))
                          + f". To supply it, {SUPPLY_FAST_TOKENIZER}")


class FastActionCodec:
    """PaliGemma prompt and output tokens <-> FAST tokens <-> action chunks, for one config."""

    def __init__(self, text_tokenizer: PromptTokenizer, fast_tokenizer: FastTokenizer, config: ModelConfig):
        self.text = text_tokenizer
        self.fast = fast_tokenizer
        self.config = config
        self.vocab = text_tokenizer.vocab_size
        self.skip = config.fast.fast_skip_tokens
        top = self.vocab - 1 - self.skip
        if top - (fast_tokenizer.vocab_size - 1) < 0 or top >= config.paligemma.vocab_size:
            raise CheckpointError(f"the FAST vocabulary ({fast_tokenizer.vocab_size} tokens from "
                                  f"{fast_tokenizer.source}) does not fit below the top {self.skip + 1} ids of "
                                  f"the text tokenizer's {self.vocab} (and the model's "
                                  f"{config.paligemma.vocab_size})")
        self.prefix_ids = text_tokenizer.encode(ACTION_PREFIX, add_bos=False)
        self.end_ids = text_tokenizer.encode(ACTION_END, add_bos=False)

    def to_paligemma(self, fast_ids) -> list[int]:
        return [self.vocab - 1 - self.skip - int(t) for t in fast_ids]

    def to_fast(self, paligemma_ids) -> list[int]:
        return [self.vocab - 1 - self.skip - int(t) for t in paligemma_ids]

    def prompt_tokens(self, text: str, state_bins, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """-> (tokens int64 [L] right-padded with 0, mask bool [L]); L = max_len, + 1 in the lerobot style (its
        BOS after the prompt)."""
        lerobot = self.config.fast.prompt_style == "lerobot"
        cleaned = clean_text(text) if lerobot else clean_fast_text(text)
        ids = self.text.encode(fast_prompt(cleaned, state_bins), add_bos=True)
        if len(ids) > max_len:
            log.warning("pi0-FAST prompt is %d tokens, more than max_token_len %d: truncating", len(ids), max_len)
            ids = ids[:max_len]
        if lerobot:
            ids, max_len = ids + [self.text.bos_id], max_len + 1
        tokens = np.zeros(max_len, dtype=np.int64)
        tokens[:len(ids)] = ids
        return tokens, np.arange(max_len) < len(ids)

    def output_tokens(self, fast_ids) -> list[int]:
        """What a trained model writes for these FAST tokens: "Action: ", the tokens, "|", EOS (openpi's postfix)."""
        return self.prefix_ids + self.to_paligemma(fast_ids) + self.end_ids + [EOS_ID]

    def extract(self, generated) -> list[int]:
        """Decoded PaliGemma ids -> FAST ids; ActionDecodeError when the output is not an action sequence."""
        ids = [int(t) for t in generated]
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        start = _find(ids, self.prefix_ids)
        if start is None:
            raise ActionDecodeError(f"the model's output has no {ACTION_PREFIX!r} marker (first tokens {ids[:12]})")
        ids = ids[start + len(self.prefix_ids):]
        end = _find(ids, self.end_ids)
        if end is not None:
            ids = ids[:end]
        fast_ids = self.to_fast(ids)
        outside = [pg for pg, t in zip(ids, fast_ids) if not 0 <= t < self.fast.vocab_size]
        if outside:
            raise ActionDecodeError(f"the model's action tokens {outside[:8]} lie outside the FAST range of ids")
        return fast_ids

    def decode(self, generated, relaxed: bool) -> np.ndarray:
        """Decoded PaliGemma ids -> normalized chunk float64 [horizon, action_dim]."""
        return self.fast.decode(self.extract(generated), self.config.action_horizon, self.config.action_dim, relaxed)


def _find(seq: list[int], pattern: list[int]) -> int | None:
    for i in range(len(seq) - len(pattern) + 1):
        if seq[i:i + len(pattern)] == pattern:
            return i
    return None


class FastReferenceExecutor:
    """Prefill + greedy decode with a KV cache on the eager reference model."""

    name = "reference"
    uses_model = True

    def __init__(self, model: Pi0FastModel, config: ModelConfig, device: torch.device):
        self.model = model
        self.config = config
        self.device = torch.device(device)

    @torch.inference_mode()
    def generate(self, pixels: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                 token_masks: torch.Tensor) -> torch.Tensor:
        """Shapes as ReferenceExecutor.sample_actions -> decoded PaliGemma ids [B, n] int64"""
        fast = self.config.fast
        return self.model.generate(pixels, image_masks, tokens, token_masks, fast.max_decoding_steps, EOS_ID,
                                   fast.decode_position_offset)

    def close(self) -> None:
        self.model = None


class FastPolicy(Policy):
    """A loaded pi0-FAST policy: predict(images, prompt, state) -> (horizon, action_dim) in robot units.

    `noise` is accepted for the Policy API and unused (greedy decoding). After each predict, `last_tokens` holds
    the decoded PaliGemma ids (numpy int64) for diagnostics, also when decoding them failed."""

    def __init__(self, *args, fast_tokenizer: FastTokenizer, **kwargs):
        super().__init__(*args, **kwargs)
        self.codec = FastActionCodec(self.tokenizer, fast_tokenizer, self.config)
        self.last_tokens: np.ndarray | None = None

    def _encode_prompt_and_state(self, prompt: str, state, text_slots: int | None = None):
        cfg = self.config
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError(f"prompt must be a non-empty str, got {prompt!r}")
        if state is None:
            raise InputError("pi0-FAST needs the robot state (state=None given): it is part of the prompt")
        state_norm = self.normalizer.normalize_state(preprocess.validate_state(state, cfg.state_dim))
        tokens, masks = self.codec.prompt_tokens(prompt, preprocess.discretize_state(state_norm), cfg.max_token_len)
        if text_slots is not None:
            masks = np.arange(masks.shape[0]) < text_slots
        return tokens, masks, None

    def _predict(self, images, prompt: str, state, noise, text_slots: int | None = None, rtc=None) -> np.ndarray:
        if self.executor is None:
            raise RuntimeError("Policy.predict called after close()")
        if rtc is not None:
            raise InputError("real-time chunking (rtc) conditions a flow-matching denoiser; pi0-FAST decodes tokens "
                             "and takes rtc=None")
        cfg = self.config
        pixels, image_masks = preprocess.prepare_images(images, cfg.view_names, cfg.vision.image_size)
        if cfg.fast.prompt_style == "openpi":      # openpi feeds pi0-FAST a missing view as a black image, unmasked
            image_masks[:] = True
        tokens, token_masks, _ = self._encode_prompt_and_state(prompt, state, text_slots)
        dev = self.device
        generated = self.executor.generate(torch.from_numpy(pixels)[None].to(dev),
                                           torch.from_numpy(image_masks)[None].to(dev),
                                           torch.from_numpy(tokens)[None].to(dev),
                                           torch.from_numpy(token_masks)[None].to(dev))
        self.last_tokens = generated[0].cpu().numpy()
        chunk = self.codec.decode(self.last_tokens, cfg.fast.relaxed_decoding)  # [horizon, action_dim] normalized
        return self.postprocess(torch.from_numpy(chunk))


def build_fast_policy(model: Pi0FastModel, config: ModelConfig, device: torch.device, hardware: str,
                      tokenizer: PromptTokenizer, normalizer, model_id: str, checkpoint_dir: Path,
                      fast_tokenizer: str | Path | FastTokenizer | None = None,
                      engine_options: EngineOptions | None = None) -> FastPolicy:
    """The pi0-FAST Policy (load_model's pi0fast branch) on the executor fast_executor picks."""
    if config.model_type != ModelType.PI0_FAST:
        raise ValueError(f"build_fast_policy needs a pi0fast config, got {config.model_type.value!r}")
    if not isinstance(fast_tokenizer, FastTokenizer):
        fast_tokenizer = FastTokenizer.load(fast_tokenizer if fast_tokenizer is not None
                                            else find_fast_tokenizer(checkpoint_dir))
    executor = fast_executor(model, config, device, hardware, engine_options)
    keep = model if executor.uses_model else None        # the engine keeps its own prepared weights
    return FastPolicy(keep, config, executor, tokenizer, normalizer, device, model_id, gpu_preprocess=False,
                      gpu_unnormalize=False, fast_tokenizer=fast_tokenizer)


def fast_executor(model: Pi0FastModel, config: ModelConfig, device: torch.device, hardware: str,
                  options: EngineOptions | None = None):
    """The reference executor where engine.resolve_dispatch says so (hardware="reference", a CPU device, fast paths
    off), else engine/fast_decode.py's executor on the dispatch table it picks (graphs with cuda_graph on)."""
    device = torch.device(device)
    dispatch = resolve_dispatch(device, hardware, options)
    if dispatch is None:
        return FastReferenceExecutor(model, config, device)
    return FastGraphExecutor(model, config, device, dispatch, eos_id=EOS_ID)
