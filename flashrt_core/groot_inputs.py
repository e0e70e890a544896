"""GR00T N1.6 inputs: camera views to SigLIP2 pixels, the instruction to the Eagle prompt's token ids.

Images: every view of the embodiment (video modality keys, in that order) is required; each uint8 HxWx3 image is
resized (bilinear, antialiased) to image_size x image_size and scaled to [-1, 1] ((x / 255 - 0.5) / 0.5, SigLIP's
mean / std).

Prompt: the instruction is lower-cased and stripped of punctuation when the checkpoint formalizes language (as
the reference processor does), then laid out as the Eagle user turn, the text before the images:
    "<|im_start|>user\n{instruction}" + per view ("<img>" + tokens_per_image x <IMG_CONTEXT> + "</img>")
    + "<|im_end|>\n"
The image-context slots carry config.image_token_index; the backbone writes the projected image tokens there.
The tokenizer is Eagle's Qwen3 tokenizer: a tokenizer.json file (tokenizers library) or a folder that
transformers' AutoTokenizer reads (vocab.json, merges.txt, tokenizer_config.json).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from flashrt_core import preprocess
from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.model.groot.config import GrootConfig

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_ENV = "FLASHRT_GROOT_TOKENIZER"
USER_PREFIX = "<|im_start|>user\n"
IMAGE_OPEN, IMAGE_CLOSE, TURN_END = "<img>", "</img>", "<|im_end|>\n"
SUPPLY_TOKENIZER = ("GR00T N1.6 checkpoints do not ship Eagle's Qwen3 tokenizer: it is in the Isaac-GR00T source, "
                    "gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2 (or the Hugging Face repository "
                    "nvidia/Eagle-Block2A-2B-v2); pass tokenizer=THAT_FOLDER, set "
                    f"{TOKENIZER_ENV}, or copy its {TOKENIZER_FILE} into the checkpoint folder")


class GrootTokenizer:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_file():
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(str(self.path))
            self._encode = lambda text: tok.encode(text, add_special_tokens=False).ids
        elif self.path.is_dir():
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            self._encode = lambda text: tok.encode(text, add_special_tokens=False)
        else:
            raise CheckpointError(f"GR00T tokenizer {self.path} not found. {SUPPLY_TOKENIZER}")

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))


def find_tokenizer(checkpoint_dir: Path, tokenizer: str | Path | None) -> Path:
    candidates = [Path(tokenizer)] if tokenizer is not None else []
    candidates += [checkpoint_dir / TOKENIZER_FILE]
    if (checkpoint_dir / "tokenizer_config.json").is_file():
        candidates.append(checkpoint_dir)
    if os.environ.get(TOKENIZER_ENV):
        candidates.append(Path(os.environ[TOKENIZER_ENV]))
    for path in candidates:
        if path.exists():
            return path
    raise CheckpointError("GR00T tokenizer not found; tried " + ", ".join(map(str, candidates))
                          + f". {SUPPLY_TOKENIZER}")


def formalize(instruction: str) -> str:
    """The reference's formalize_language: lower case, punctuation removed."""
    return re.sub(r"[^\w\s]", "", instruction.lower())


def prompt_ids(tokenizer: GrootTokenizer, cfg: GrootConfig, instruction: str, num_views: int) -> np.ndarray:
    """-> int64 [L] token ids of the Eagle prompt with num_views image blocks."""
    if not isinstance(instruction, str) or not instruction.strip():
        raise InputError(f"prompt must be a non-empty str, got {instruction!r}")
    text = formalize(instruction) if cfg.formalize_language else instruction
    image_block = (tokenizer.encode(IMAGE_OPEN) + [cfg.image_token_index] * cfg.tokens_per_image
                   + tokenizer.encode(IMAGE_CLOSE))
    ids = tokenizer.encode(USER_PREFIX + text) + image_block * num_views + tokenizer.encode(TURN_END)
    text_ids = [i for i in ids if i != cfg.image_token_index]
    if len(text_ids) != len(ids) - num_views * cfg.tokens_per_image:
        raise CheckpointError(f"the tokenizer produced the image-context id {cfg.image_token_index} for text: "
                              "it is not the tokenizer of this model")
    if max(text_ids) >= cfg.llm.vocab_size:
        raise CheckpointError(f"the tokenizer produced id {max(text_ids)}, outside the model's vocabulary "
                              f"({cfg.llm.vocab_size}): it is not the tokenizer of this model")
    return np.asarray(ids, dtype=np.int64)


def prepare_views(images, view_names: Sequence[str], size: int) -> torch.Tensor:
    """Images (list in view order or dict by view name) -> float32 [V, 3, size, size] in [-1, 1]."""
    views = preprocess.validate_images(images, view_names)
    absent = [name for name, img in zip(view_names, views) if img is None]
    if absent:
        raise InputError(f"GR00T needs every view of the embodiment {list(view_names)}; missing {absent}")
    out = []
    for img in views:
        x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float() / 255.0
        if x.shape[-2:] != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out.append((x[0].clamp(0.0, 1.0) - 0.5) / 0.5)
    return torch.stack(out)
