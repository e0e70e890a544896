"""FAST action tokenizer (Pertsch et al., "FAST: Efficient Action Tokenization for VLA Models", 2025).

The format is the one of the Hugging Face processor "physical-intelligence/fast" (processing_action_tokenizer.py,
class UniversalActionProcessor) that openpi's pi0-FAST and lerobot's pi0_fast load:

  encode  chunk [T, D] -> DCT-II (orthonormal) over time, per dimension -> round(coefficients * scale)
          -> flattened time-major ([k0 d0, k0 d1, ..., k1 d0, ...]) -> each integer c becomes the character
          chr(max(c - min_token, 0)) -> byte-level BPE (the `tokenizers` library) -> token ids
  decode  token ids -> BPE decode to a string -> ord(char) + min_token -> reshape [T, D] -> / scale
          -> inverse DCT (orthonormal) over time -> chunk [T, D]

The DCT here is the orthonormal DCT-II matrix, equal to scipy.fft.dct / idct with norm="ortho" (not imported:
scipy is not a dependency). Files, as the processor saves them: tokenizer.json (the BPE vocabulary and merges)
and processor_config.json ("scale", "min_token", "vocab_size", optional "time_horizon" / "action_dim").

Invalid sequences (a model's output need not be well formed) raise ActionDecodeError naming the problem:
a token outside the vocabulary, bytes that are no UTF-8 text (a byte-level token cut in half), or a coefficient
count that is not T * D. `relaxed=True` applies lerobot's documented fallback for the count instead: the
coefficients are zero-padded or cut on the right to T * D. The order is frequency-major, so a short sequence
loses its highest frequencies and decodes to a smoothed chunk of the full length T.

`write_fast_tokenizer` trains a small real BPE offline on synthetic smooth chunks, the way the processor's
`fit` trains (ByteLevelBPETokenizer's model, BpeTrainer with the coefficient alphabet), for fixtures and tests.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from flashrt_core.errors import ActionDecodeError, CheckpointError

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
PROCESSOR_CONFIG_FILE = "processor_config.json"
DEFAULT_SCALE = 10.0        # the processor's default and the released tokenizer's value
REPLACEMENT_CHAR = "\ufffd"  # what byte-level decoding yields for bytes that are no UTF-8


@functools.lru_cache(maxsize=16)
def dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix C [n, n] (float64): dct(x, norm="ortho") = C @ x, idct = C.T @ x."""
    if n <= 0:
        raise ValueError(f"DCT length must be positive, got {n}")
    k = np.arange(n)[:, None]
    t = np.arange(n)[None, :]
    c = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * t + 1) * k / (2 * n))
    c[0] /= np.sqrt(2.0)
    c.setflags(write=False)
    return c


def dct(x: np.ndarray) -> np.ndarray:
    """Orthonormal DCT-II over axis 0.  x: [T, D] -> [T, D] float64"""
    x = np.asarray(x, dtype=np.float64)
    return dct_matrix(x.shape[0]) @ x


def idct(x: np.ndarray) -> np.ndarray:
    """Orthonormal inverse DCT (DCT-III) over axis 0.  x: [T, D] -> [T, D] float64"""
    x = np.asarray(x, dtype=np.float64)
    return dct_matrix(x.shape[0]).T @ x


def coefficients_to_text(coefficients: np.ndarray, min_token: int) -> str:
    """Integer coefficients (any shape, flattened row-major) -> the BPE input string chr(max(c - min_token, 0))."""
    flat = np.asarray(coefficients, dtype=np.int64).reshape(-1)
    return "".join(map(chr, np.maximum(flat - min_token, 0).tolist()))


def quantize(chunk: np.ndarray, scale: float) -> np.ndarray:
    """chunk [T, D] -> integer DCT coefficients [T, D] (int64): round(dct(chunk) * scale), half to even as numpy."""
    return np.around(dct(chunk) * scale).astype(np.int64)


class FastTokenizer:
    """One FAST tokenizer: a BPE model over coefficient characters plus the quantization scale and offset."""

    def __init__(self, bpe: Tokenizer, scale: float = DEFAULT_SCALE, min_token: int = 0, source: str = "<memory>"):
        if not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"FAST scale must be a positive number, got {scale!r}")
        self.bpe = bpe
        self.scale = float(scale)
        self.min_token = int(min_token)
        self.source = source

    @property
    def vocab_size(self) -> int:
        """Number of BPE tokens; valid token ids are 0 .. vocab_size - 1."""
        return self.bpe.get_vocab_size()

    @classmethod
    def load(cls, directory: str | Path) -> FastTokenizer:
        """The tokenizer of a folder holding tokenizer.json and processor_config.json (the processor's files)."""
        directory = Path(directory)
        tok_path, cfg_path = directory / TOKENIZER_FILE, directory / PROCESSOR_CONFIG_FILE
        for path in (tok_path, cfg_path):
            if not path.is_file():
                raise CheckpointError(f"FAST tokenizer file missing: {path} (a FAST tokenizer folder holds "
                                      f"{TOKENIZER_FILE} and {PROCESSOR_CONFIG_FILE})")
        try:
            record = json.loads(cfg_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"cannot read {cfg_path}: {exc}") from exc
        if not isinstance(record, dict):
            raise CheckpointError(f"{cfg_path} must hold a JSON object")
        try:
            bpe = Tokenizer.from_file(str(tok_path))
        except Exception as exc:  # the tokenizers library raises its own exception type
            raise CheckpointError(f"cannot read the BPE tokenizer {tok_path}: {exc}") from exc
        scale, min_token = record.get("scale", DEFAULT_SCALE), record.get("min_token", 0)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
            raise CheckpointError(f"{cfg_path}: 'scale' must be a positive number, got {scale!r}")
        if not isinstance(min_token, int) or isinstance(min_token, bool):
            raise CheckpointError(f"{cfg_path}: 'min_token' must be an int, got {min_token!r}")
        log.info("loaded FAST tokenizer %s (vocab %d, scale %g, min_token %d)", directory, bpe.get_vocab_size(),
                 scale, min_token)
        return cls(bpe, float(scale), min_token, str(directory))

    # ------------------------------------------------------------------------------------------------ encode
    def encode(self, chunk: np.ndarray) -> list[int]:
        """Action chunk [T, D] (normalized units) -> FAST token ids.

        Raises ValueError when a coefficient does not survive the BPE (a character outside the vocabulary's
        alphabet: the chunk lies outside the range the tokenizer was trained on) or lies below min_token.
        """
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim != 2 or 0 in chunk.shape or not np.isfinite(chunk).all():
            raise ValueError(f"FAST encode needs a finite [T, D] chunk, got shape {chunk.shape}")
        coefficients = quantize(chunk, self.scale)
        if coefficients.min() < self.min_token:
            raise ValueError(f"coefficient {int(coefficients.min())} lies below the tokenizer's min_token "
                             f"{self.min_token}: the chunk is outside its trained range")
        text = coefficients_to_text(coefficients, self.min_token)
        ids = self.bpe.encode(text).ids
        if self.bpe.decode(ids) != text:
            raise ValueError("the chunk's coefficients are outside the FAST tokenizer's alphabet (they do not "
                             "survive BPE encoding)")
        return ids

    # ------------------------------------------------------------------------------------------------ decode
    def decode_coefficients(self, tokens) -> np.ndarray:
        """FAST token ids -> the integer coefficient sequence (int64 [N]); ActionDecodeError when invalid."""
        ids = [int(t) for t in tokens]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ActionDecodeError(f"token ids {bad[:8]} lie outside the FAST vocabulary [0, {self.vocab_size})")
        text = self.bpe.decode(ids)
        if REPLACEMENT_CHAR in text:
            raise ActionDecodeError("the FAST tokens decode to bytes that are no UTF-8 text (a multi-byte "
                                    "coefficient character is cut)")
        return np.fromiter(map(ord, text), dtype=np.int64, count=len(text)) + self.min_token

    def decode(self, tokens, horizon: int, action_dim: int, relaxed: bool = False) -> np.ndarray:
        """FAST token ids -> chunk float64 [horizon, action_dim] (normalized units).

        Strict (default): the tokens must give exactly horizon * action_dim coefficients, else
        ActionDecodeError. relaxed=True: zero-pad or cut on the right to that count (lerobot's rule).
        """
        if horizon <= 0 or action_dim <= 0:
            raise ValueError(f"horizon and action_dim must be positive, got {horizon}, {action_dim}")
        coefficients = self.decode_coefficients(tokens)
        expected = horizon * action_dim
        if coefficients.size != expected:
            if not relaxed:
                raise ActionDecodeError(f"the FAST tokens give {coefficients.size} DCT coefficients, expected "
                                        f"{expected} (horizon {horizon} x action_dim {action_dim})")
            coefficients = np.pad(coefficients[:expected], (0, max(0, expected - coefficients.size)))
        return idct(coefficients.reshape(horizon, action_dim) / self.scale)


# ---------------------------------------------------------------------------------------------------- fixtures
def smooth_chunks(count: int, horizon: int, action_dim: int, seed: int = 0, amplitude: float = 0.8) -> np.ndarray:
    """Synthetic smooth action chunks [count, horizon, action_dim] in about [-amplitude, amplitude]: a few low
    sinusoids plus a slow drift per dimension, the kind of trajectory FAST compresses well."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, horizon)[None, :, None]                              # [1, T, 1]
    shape = (count, 1, action_dim)
    chunks = rng.uniform(-0.5, 0.5, shape) + rng.uniform(-0.4, 0.4, shape) * t
    for _ in range(2):
        freq = rng.uniform(0.2, 1.5, shape)
        chunks = chunks + rng.uniform(0.0, 0.25, shape) * np.sin(2 * np.pi * freq * t + rng.uniform(0, 6.3, shape))
    return np.clip(chunks, -amplitude, amplitude)


def train_fast_bpe(coefficient_texts, vocab_size: int, alphabet_size: int) -> Tokenizer:
    """A byte-level BPE over coefficient strings, trained as the processor's `fit` does, with the byte-level
    alphabet added so that any character encodes."""
    from tokenizers import ByteLevelBPETokenizer, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    bpe = ByteLevelBPETokenizer()
    alphabet = sorted({chr(i) for i in range(alphabet_size)} | set(pre_tokenizers.ByteLevel.alphabet()))
    trainer = BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[],
                         initial_alphabet=alphabet, max_token_length=10000)
    bpe._tokenizer.train_from_iterator(coefficient_texts, trainer=trainer)
    return bpe._tokenizer


def write_fast_tokenizer(out_dir: str | Path, horizon: int, action_dim: int, vocab_size: int = 512,
                         scale: float = DEFAULT_SCALE, num_chunks: int = 400, seed: int = 0) -> Path:
    """Train a small FAST tokenizer offline on `num_chunks` synthetic smooth chunks and save it in the processor's
    layout (tokenizer.json, processor_config.json) in out_dir; returns out_dir. Deterministic for its arguments."""
    chunks = smooth_chunks(num_chunks, horizon, action_dim, seed)
    coefficients = np.stack([quantize(c, scale) for c in chunks])                   # [N, T, D]
    min_token, max_token = int(coefficients.min()), int(coefficients.max())
    alphabet_size = max_token - min_token + 1
    if vocab_size < alphabet_size + 256:
        raise ValueError(f"vocab_size {vocab_size} is too small for {alphabet_size} coefficient characters plus the "
                         "256 byte-level characters")
    bpe = train_fast_bpe((coefficients_to_text(c, min_token) for c in coefficients), vocab_size, alphabet_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bpe.save(str(out / TOKENIZER_FILE))
    record = {"processor_class": "UniversalActionProcessor", "scale": scale, "vocab_size": vocab_size,
              "min_token": min_token, "time_horizon": horizon, "action_dim": action_dim}
    (out / PROCESSOR_CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")
    log.info("trained FAST tokenizer (vocab %d, min_token %d) into %s", bpe.get_vocab_size(), min_token, out)
    return out

