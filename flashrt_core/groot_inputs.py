"""GR00T N1.6 inputs: camera views to SigLIP2 pixels, the instruction to the Eagle prompt's token ids.

Images (the reference processor's eval transform, then Eagle's smart_resize): every view of the embodiment is
required, uint8 HxWx3; each is scaled so its shortest side is shortest_image_edge (256), centre-cropped to
crop_fraction (0.95) of each side (int(side * f), offsets (side - crop) // 2), scaled to the shortest edge again,
resized to sides rounded to multiples of 28 (2 x 2 patches of 14), and mapped to [-1, 1] ((x / 255 - 0.5) / 0.5):
224 x 224 -> 252 x 252, 81 tokens; 480 x 640 -> 252 x 336, 108 tokens. The two shortest-edge scalings are
OpenCV's INTER_AREA resize itself (what albumentations' SmallestMaxSize runs in the reference); the last resize is
PIL's bicubic, as Eagle's fetch_image runs it.

Prompt (Eagle's chat template with the instruction first, then the views, as the reference builds it):
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{instruction}"
    + per view k: "<image k><img>" + n_k x "<IMG_CONTEXT>" + "</img>"   + "<|im_end|>\n"
tokenized as one string; the instruction is lower-cased and stripped of punctuation when the checkpoint
formalizes language. <IMG_CONTEXT> must tokenize to config.image_token_index: the backbone writes the projected
image tokens into those slots. The tokenizer is Eagle's Qwen3 tokenizer: a folder that transformers'
AutoTokenizer reads (vocab.json, merges.txt, tokenizer_config.json, added_tokens.json) or a tokenizer.json file.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image

from flashrt_core import preprocess
from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.groot_checkpoint import SUPPLY_TOKENIZER
from flashrt_core.model.groot.config import GrootConfig
from flashrt_core.tokenizer import PROMPT_CACHE_SIZE

SYSTEM_TURN = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
USER_PREFIX = "<|im_start|>user\n"
IMAGE_OPEN, IMAGE_CONTEXT, IMAGE_CLOSE, TURN_END = "<img>", "<IMG_CONTEXT>", "</img>", "<|im_end|>\n"
MIN_PIXELS, MAX_PIXELS, MAX_SIDE = 4 * 28 * 28, 4096 * 28 * 28, 500 * 14      # Eagle's smart_resize limits


class GrootTokenizer:
    """Eagle's tokenizer (a tokenizer.json file or a transformers folder) with an LRU of encodings: the node
    repeats one instruction every frame, and its prompt (~200-260 ids, mostly image-context slots) costs the
    tokenizer ~0.2 ms per call on the host."""

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
        self._encoded = functools.lru_cache(maxsize=PROMPT_CACHE_SIZE)(lambda text: tuple(self._encode(text)))

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (a new list each call; the same text is tokenized once while it stays among the last
        PROMPT_CACHE_SIZE distinct ones)."""
        return list(self._encoded(text))


def formalize(instruction: str) -> str:
    """The reference's formalize_language: lower case, punctuation removed."""
    return re.sub(r"[^\w\s]", "", instruction.lower())


def prompt_text(instruction: str, image_tokens: Sequence[int], formalize_language: bool = True) -> str:
    if not isinstance(instruction, str) or not instruction.strip():
        raise InputError(f"prompt must be a non-empty str, got {instruction!r}")
    text = formalize(instruction) if formalize_language else instruction
    views = "".join(f"<image {k + 1}>{IMAGE_OPEN}{IMAGE_CONTEXT * n}{IMAGE_CLOSE}" for k, n in enumerate(image_tokens))
    return SYSTEM_TURN + USER_PREFIX + text + views + TURN_END


def prompt_ids(tokenizer: GrootTokenizer, cfg: GrootConfig, instruction: str, image_tokens: Sequence[int],
               formalize_language: bool | None = None) -> np.ndarray:
    """-> int64 [L] token ids of the Eagle prompt; image_tokens: the image-token count of each view."""
    formal = cfg.formalize_language if formalize_language is None else formalize_language
    ids = np.asarray(tokenizer.encode(prompt_text(instruction, image_tokens, formal)), dtype=np.int64)
    slots = int((ids == cfg.image_token_index).sum())
    if slots != sum(image_tokens):
        raise CheckpointError(f"the tokenizer gives {slots} image-context ids {cfg.image_token_index} for "
                              f"{sum(image_tokens)} image tokens ({IMAGE_CONTEXT} must be that id): it is not the "
                              "tokenizer of this model")
    if ids.max() >= cfg.llm.vocab_size:
        raise CheckpointError(f"the tokenizer produced id {ids.max()}, outside the model's vocabulary "
                              f"({cfg.llm.vocab_size}): it is not the tokenizer of this model")
    return ids


def _scale_shortest(h: int, w: int, edge: int) -> tuple[int, int]:
    scale = edge / min(h, w)
    return max(1, int(round(h * scale))), max(1, int(round(w * scale)))


def smart_resize(h: int, w: int, factor: int = 28) -> tuple[int, int]:
    """Eagle's smart_resize: sides rounded to multiples of factor within its pixel-count limits."""
    hb = min(max(factor, round(h / factor) * factor), MAX_SIDE)
    wb = min(max(factor, round(w / factor) * factor), MAX_SIDE)
    if hb * wb > MAX_PIXELS:
        beta = math.sqrt(h * w / MAX_PIXELS)
        hb, wb = math.floor(h / beta / factor) * factor, math.floor(w / beta / factor) * factor
    elif hb * wb < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (h * w))
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hb, wb


def image_geometry(h: int, w: int, edge: int, crop_fraction: float, factor: int = 28):
    """-> ((h1, w1) after the first resize, (top, left, ch, cw) crop box, (h2, w2), (H, W) final)."""
    h1, w1 = _scale_shortest(h, w, edge)
    ch, cw = max(1, int(h1 * crop_fraction)), max(1, int(w1 * crop_fraction))
    crop = ((h1 - ch) // 2, (w1 - cw) // 2, ch, cw)
    h2, w2 = _scale_shortest(ch, cw, edge)
    return (h1, w1), crop, (h2, w2), smart_resize(h2, w2, factor)


def resize_area(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 HxWxC -> uint8 height x width x C by OpenCV's INTER_AREA: what the reference's eval transform runs
    (albumentations' SmallestMaxSize calls cv2.resize with it), so the image is the reference's to the level."""
    if img.shape[:2] == (height, width):
        return img
    return cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)


def process_image(img: np.ndarray, cfg: GrootConfig, edge: int, crop_fraction: float) -> np.ndarray:
    """uint8 HxWx3 -> the uint8 image the reference's vision encoder sees (before scaling to [-1, 1])."""
    first, (top, left, ch, cw), second, final = image_geometry(img.shape[0], img.shape[1], edge, crop_fraction,
                                                               cfg.image_factor)
    x = resize_area(np.ascontiguousarray(img), *first)[top:top + ch, left:left + cw]
    x = resize_area(np.ascontiguousarray(x), *second)
    if x.shape[:2] != final:
        x = np.array(Image.fromarray(x).resize((final[1], final[0]), Image.Resampling.BICUBIC))   # writable
    return x


def prepare_views(images, view_names: Sequence[str], cfg: GrootConfig, edge: int | None = None,
                  crop_fraction: float | None = None) -> list[torch.Tensor]:
    """Images (list in view order or dict by view name) -> one float32 [3, H, W] in [-1, 1] per view."""
    views = preprocess.validate_images(images, view_names)
    absent = [name for name, img in zip(view_names, views) if img is None]
    if absent:
        raise InputError(f"GR00T needs every view of the embodiment {list(view_names)}; missing {absent}")
    edge = cfg.shortest_image_edge if edge is None else edge
    frac = cfg.crop_fraction if crop_fraction is None else crop_fraction
    out = []
    for img in views:
        x = torch.from_numpy(process_image(img, cfg, edge, frac)).permute(2, 0, 1).float()
        out.append((x / 255.0 - 0.5) / 0.5)
    return out
