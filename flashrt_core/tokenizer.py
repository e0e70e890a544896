"""Prompt tokenization for pi0 / pi0.5 (PaliGemma sentencepiece tokenizer).

Follows openpi ``PaligemmaTokenizer.tokenize`` (src/openpi/models/tokenizer.py) and lerobot's
``Pi05PrepareStateTokenizerProcessorStep`` (src/lerobot/policies/pi05/processor_pi05.py):

- text cleaning: ``text.strip().replace("_", " ").replace("\\n", " ")`` (no lower-casing; only pi0-FAST
  lower-cases);
- pi0 layout (and pi0.5 with ``discrete_state_input=False``): ``encode(text, bos) + encode("\\n")``;
- pi0.5 discrete state: ``encode("Task: {text}, State: {b0 b1 ...};\\nAction: ", bos)``;
- lerobot pi0.5 without state: ``encode("Task: {text};\\nAction: ", bos)``;
- right padding with 0 and a bool mask; longer prompts are cut to ``max_len`` with a logged warning
  (openpi keeps the first ``max_len`` tokens and a mask of all True).

``train_test_tokenizer`` trains a small but real sentencepiece BPE model with PaliGemma's special ids
(pad 0, eos 1, bos 2, unk 3), identity normalization and byte fallback, so tests and the demo checkpoint run
offline with the same code path as the real 257,152-piece PaliGemma model.
"""

from __future__ import annotations

import enum
import functools
import io
import itertools
import logging
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from flashrt_core.config import ModelType, PromptMode
from flashrt_core.errors import CheckpointError, InputError

logger = logging.getLogger(__name__)

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3
MIN_TEST_VOCAB = 400  # 4 specials + 256 byte pieces + characters + a few merges
MAX_TEST_VOCAB = 2048  # the built-in corpus supports ~2700 BPE pieces
PROMPT_CACHE_SIZE = 256  # distinct full prompts kept; the node repeats one instruction every frame






def clean_text(text: str) -> str:
    """openpi's prompt cleaning: strip first, then '_' and newlines become spaces."""
    return text.strip().replace("_", " ").replace("\n", " ")


def build_prompt(text: str, state_bins: Sequence[int] | None, mode: PromptMode | str) -> str:
    """The pi0.5 prompt string (without BOS) for ``mode``; ``text`` must already be cleaned."""
    mode = _parse_enum(PromptMode, mode, "prompt mode")
    if mode is PromptMode.DISCRETE_STATE:
        if state_bins is None:
            raise InputError("state is required for prompt mode 'discrete_state' (the state is part of the prompt)")
        state_str = " ".join(str(int(b)) for b in state_bins)
        return f"Task: {text}, State: {state_str};\nAction: "
    if mode is PromptMode.LEROBOT_NO_STATE:
        return f"Task: {text};\nAction: "
    raise ValueError(f"prompt mode {mode.value!r} has no single prompt string (it is the pi0 layout)")


class PromptTokenizer:
    """PaliGemma sentencepiece tokenizer with the pi0 / pi0.5 prompt layouts and an LRU of encodings."""

    def __init__(self, model_path: str | Path):
        path = Path(model_path)
        if not path.is_file():
            raise CheckpointError(f"tokenizer model not found: {path}")
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(path))
        except (OSError, RuntimeError) as exc:
            raise CheckpointError(f"tokenizer model {path} is not a sentencepiece model: {exc}") from exc
        if self._sp.bos_id() != BOS_ID:
            raise CheckpointError(
                f"tokenizer model {path} has bos id {self._sp.bos_id()}, pi0/pi0.5 need PaliGemma's bos id {BOS_ID}"
            )
        self.model_path = path
        # One entry per (full prompt, pi0 layout, max_len): frames repeating an instruction skip sentencepiece.
        self._cached_tokens = functools.lru_cache(maxsize=PROMPT_CACHE_SIZE)(self._tokens_uncached)
        logger.info("loaded tokenizer %s (vocab %d)", path, self.vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Plain sentencepiece encoding (no cleaning), BOS first when ``add_bos``."""
        return self._sp.Encode(text, add_bos=add_bos)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.Decode([int(i) for i in ids])

    def tokenize_prompt(
        self,
        text: str,
        max_len: int,
        state_bins: Sequence[int] | None,
        mode: PromptMode | str,
        model_type: ModelType | str,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens int64 [max_len] right-padded with 0, and mask bool [max_len] (True on real tokens).

        ``state_bins`` (from ``preprocess.discretize_state``) is used only by pi0.5 with mode
        ``discrete_state``; other layouts ignore it (pi0 feeds its state to the action expert instead).
        """
        if not isinstance(text, str):
            raise InputError(f"prompt must be a str, got {type(text).__name__}")
        if not text.strip():
            raise InputError("prompt is empty")
        if not isinstance(max_len, int) or max_len <= 0:
            raise ValueError(f"max_len must be a positive int, got {max_len!r}")
        mode = _parse_enum(PromptMode, mode, "prompt mode")
        model_type = _parse_enum(ModelType, model_type, "model type")
        cleaned = clean_text(text)
        if model_type is ModelType.PI0 or mode is PromptMode.NO_STATE:
            tokens = self._cached_tokens(cleaned, True, max_len)
        else:
            tokens = self._cached_tokens(build_prompt(cleaned, state_bins, mode), False, max_len)
        ids = np.zeros(max_len, dtype=np.int64)  # [max_len], PAD_ID = 0
        ids[: len(tokens)] = tokens
        mask = np.zeros(max_len, dtype=np.bool_)  # [max_len]
        mask[: len(tokens)] = True
        return ids, mask

    def _tokens_uncached(self, prompt: str, pi0_layout: bool, max_len: int) -> tuple[int, ...]:
        tokens = self._sp.Encode(prompt, add_bos=True)
        if pi0_layout:  # "\n" encoded separately: the pi0 "start of answer" token
            tokens = tokens + self._sp.Encode("\n")
        if len(tokens) > max_len:
            logger.warning(
                "prompt is %d tokens, more than max_len %d: truncating (raise the model's max token length "
                "if this happens often): %r",
                len(tokens),
                max_len,
                prompt[:80],
            )
            tokens = tokens[:max_len]
        return tuple(tokens)


def _parse_enum(enum_cls: type[enum.Enum], value, what: str):
    try:
        return enum_cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum_cls)
        raise ValueError(f"unknown {what} {value!r}; expected one of {allowed}") from None


# ---------------------------------------------------------------------------------------------------------------
# Test tokenizer: a real sentencepiece model trained offline on a generated robot-instruction corpus.

_VERBS = (
    "pick up", "put", "place", "move", "push", "pull", "open", "close", "turn on", "turn off", "grasp", "lift",
    "stack", "slide", "rotate", "pour", "wipe", "fold", "insert", "drop", "hand over", "flip", "press", "hang",
)
_COLORS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple", "pink", "brown", "gray")
_OBJECTS = (
    "cube", "bowl", "mug", "plate", "cup", "bottle", "block", "box", "drawer", "microwave", "stove", "cabinet",
    "towel", "sponge", "spoon", "fork", "knife", "pan", "pot", "basket", "tray", "book", "can", "lid",
    "ketchup", "alphabet soup", "cream cheese", "butter", "milk", "orange juice", "tomato sauce", "chocolate pudding",
    "salad dressing", "bbq sauce", "wine bottle", "moka pot", "caddy", "shelf", "door", "faucet", "switch", "cloth",
)
_PLACES = (
    "on the plate", "in the basket", "into the drawer", "on top of the cabinet", "next to the bowl",
    "on the stove", "in the microwave", "on the shelf", "to the left", "to the right", "on the table",
    "behind the box", "in front of the mug", "into the pot", "onto the tray", "back to the start",
)
_EXTRA = (
    "Task:", "State:", "Action:", "Task: ", ", State: ", ";", "the robot arm moves slowly and carefully",
    "both arms", "left wrist camera", "right wrist camera", "base camera", "gripper open", "gripper closed",
    "then", "and", "after that", "first", "finally", "please", "carefully", "quickly", "all the objects",
)
_WORDS = (
    "kitchen living room bedroom bathroom garage office laboratory warehouse factory garden workshop counter sink "
    "dishwasher refrigerator fridge freezer oven toaster kettle blender cutting board napkin paper glass jar "
    "container bucket bin trash recycling laundry shirt sock trousers jacket blanket pillow sheet curtain window "
    "handle knob button lever valve hinge screw bolt nut washer wrench hammer screwdriver pliers scissors tape "
    "marker pen pencil eraser notebook folder envelope package parcel carton crate pallet conveyor belt gear "
    "motor wheel joint elbow shoulder wrist finger thumb palm gripper suction camera sensor lidar battery charger "
    "cable plug socket laptop keyboard mouse monitor phone remote controller toy ball puzzle piece brick lego "
    "banana apple lemon lime peach pear grape carrot potato onion garlic pepper cucumber lettuce cabbage bread "
    "cheese egg rice pasta noodle soup sauce salt sugar flour coffee tea water juice soda beer wine candle vase "
    "flower plant leaf stick rope string chain hook magnet coin key lock card ticket wallet bag backpack shoe "
    "hat glove helmet mask umbrella broom mop brush dustpan vacuum cleaner spray detergent soap shampoo tooth "
    "comb mirror lamp bulb fan heater radiator chair stool bench sofa couch desk wardrobe closet hanger shelf "
    "slowly quickly gently firmly upright sideways upside down horizontally vertically clockwise counterclockwise "
    "above below beside between inside outside under over through across along around toward away from near "
    "far left right middle center corner edge top bottom front back side half quarter full empty clean dirty "
    "small large big tiny heavy light soft hard round square flat tall short long wide narrow thin thick "
    "grab release hold carry bring fetch deliver sort arrange organize tidy sweep scrub rinse dry wash cook "
    "heat cool cut slice chop peel stir mix shake squeeze twist unscrew tighten loosen attach detach connect "
    "disconnect plug unplug align center balance catch throw toss roll spin wave point touch tap knock"
)


def _corpus_lines(seed: int = 0) -> Iterator[str]:
    """Deterministic training sentences: instructions, pi0.5 prompts with state bins, the numbers 0..255."""
    rng = random.Random(seed)
    for verb, obj in itertools.product(_VERBS, _OBJECTS):
        color = rng.choice(_COLORS)
        place = rng.choice(_PLACES)
        yield f"{verb} the {color} {obj} {place}"
        yield f"{verb} the {obj}"
    for color, obj in itertools.product(_COLORS, _OBJECTS):
        yield f"the {color} {obj}"
    for _ in range(600):
        instruction = f"{rng.choice(_VERBS)} the {rng.choice(_COLORS)} {rng.choice(_OBJECTS)} {rng.choice(_PLACES)}"
        bins = " ".join(str(rng.randrange(256)) for _ in range(rng.choice((7, 8, 14, 32))))
        # The corpus is line based, so the prompt's newline is a separate user-defined piece.
        yield f"Task: {instruction}, State: {bins};"
        yield "Action: "
    yield from (str(i) for i in range(256))
    yield from _EXTRA
    words = _WORDS.split()
    yield from words
    for _ in range(800):
        yield " ".join(rng.choice(words) for _ in range(rng.randrange(3, 9)))


def train_test_tokenizer(out_path: str | Path, vocab_size: int = 1024) -> Path:
    """Train a small real sentencepiece BPE model at ``out_path`` (a ``.model`` file) and return its path.

    PaliGemma conventions: pad 0, eos 1, bos 2, unk 3; identity normalization, no dummy prefix, digits split,
    byte fallback (any text encodes), ``"\\n"`` as a piece. Deterministic: one thread, fixed seed, fixed corpus.
    """
    if not MIN_TEST_VOCAB <= vocab_size <= MAX_TEST_VOCAB:
        raise ValueError(
            f"vocab_size must be in [{MIN_TEST_VOCAB}, {MAX_TEST_VOCAB}] for the built-in corpus, got {vocab_size}"
        )
    out_path = Path(out_path)
    if out_path.suffix != ".model":
        raise ValueError(f"out_path must end in .model, got {out_path}")
    spm.set_random_generator_seed(0)
    model = io.BytesIO()  # written through model_writer: the proto holds no output path, so bytes are path-independent
    spm.SentencePieceTrainer.Train(
        sentence_iterator=_corpus_lines(),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=["\n"],
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        num_threads=1,
        minloglevel=2,
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(model.getvalue())
    logger.info("trained test tokenizer %s (vocab %d)", out_path, vocab_size)
    return out_path
