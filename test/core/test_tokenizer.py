"""Prompt tokenization: a real trained sentencepiece model, the three prompt layouts, padding, truncation."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.tokenizer import BOS_ID, PROMPT_CACHE_SIZE, PromptTokenizer, train_test_tokenizer

TRAIN_TIME_LIMIT_S = 10.0
INSTRUCTION = "pick up the red cube"
STATE_BINS = [0, 128, 255]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return train_test_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.model")


@pytest.fixture()
def tokenizer(tokenizer_path):
    return PromptTokenizer(tokenizer_path)


def pieces(tok: PromptTokenizer, ids) -> list[str]:
    return [tok._sp.IdToPiece(int(i)) for i in ids]


def test_training_is_fast_deterministic_and_uses_paligemma_special_ids(tmp_path, tokenizer_path):
    start = time.perf_counter()
    again = train_test_tokenizer(tmp_path / "other_dir" / "again.model")
    assert time.perf_counter() - start < TRAIN_TIME_LIMIT_S
    assert again.read_bytes() == tokenizer_path.read_bytes()  # same bytes for the same call, any output path
    tok = PromptTokenizer(again)
    assert tok.vocab_size == 1024
    assert pieces(tok, [0, 1, 2, 3]) == ["<pad>", "</s>", "<s>", "<unk>"]
    assert tok.bos_id == BOS_ID == 2


def test_vocab_size_out_of_range_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_test_tokenizer(tmp_path / "t.model", vocab_size=100_000)


def test_byte_fallback_encodes_any_text(tokenizer):
    text = "Grüß dich, 机器人 🤖"
    ids = tokenizer.encode(text, add_bos=False)
    assert 3 not in ids  # no <unk>
    assert tokenizer.decode(ids) == text


def test_pi05_discrete_state_layout_exact_ids(tokenizer):
    tokens, mask = tokenizer.tokenize_prompt(INSTRUCTION, 48, STATE_BINS, "discrete_state", "pi05")
    n = int(mask.sum())
    assert tokens.dtype == np.int64 and mask.dtype == np.bool_ and tokens.shape == mask.shape == (48,)
    assert mask[:n].all() and not mask[n:].any()
    assert (tokens[n:] == 0).all()
    expected_pieces = (
        ["<s>", "Task", ":", "▁pick", "▁up", "▁the", "▁red", "▁cube", ",", "▁State", ":"]
        + ["▁", "0", "▁", "1", "2", "8", "▁", "2", "5", "5", ";", "\n", "Action", ":", "▁"]
    )
    assert pieces(tokenizer, tokens[:n]) == expected_pieces
    # Exact ids of this trained model (pinned: a change in the corpus or sentencepiece shows up here).
    expected_ids = [2, 291, 1005, 684, 426, 263, 346, 541, 1017, 294, 1005, 981, 1007]
    expected_ids += [981, 989, 993, 1011, 981, 993, 1004, 1004, 1018, 4, 293, 1005, 981]
    assert tokens[:n].tolist() == expected_ids
    assert tokenizer.decode(tokens[:n]) == "Task: pick up the red cube, State: 0 128 255;\nAction: "


def test_pi0_layout_is_text_bos_then_newline(tokenizer):
    tokens, mask = tokenizer.tokenize_prompt(INSTRUCTION, 48, None, "no_state", "pi0")
    n = int(mask.sum())
    assert tokens[0] == BOS_ID
    assert pieces(tokenizer, tokens[:n]) == ["<s>", "pick", "▁up", "▁the", "▁red", "▁cube", "\n"]
    # pi0.5 with discrete_state_input=False uses the same layout; pi0 ignores state bins.
    same, same_mask = tokenizer.tokenize_prompt(INSTRUCTION, 48, STATE_BINS, "no_state", "pi05")
    np.testing.assert_array_equal(same, tokens)
    np.testing.assert_array_equal(same_mask, mask)
    pi0_with_bins, _ = tokenizer.tokenize_prompt(INSTRUCTION, 48, STATE_BINS, "discrete_state", "pi0")
    np.testing.assert_array_equal(pi0_with_bins, tokens)


def test_lerobot_no_state_layout(tokenizer):
    tokens, mask = tokenizer.tokenize_prompt(INSTRUCTION, 48, None, "lerobot_no_state", "pi05")
    assert tokens[0] == BOS_ID
    assert tokenizer.decode(tokens[mask]) == "Task: pick up the red cube;\nAction: "


def test_text_is_cleaned_like_openpi(tokenizer):
    tokens, mask = tokenizer.tokenize_prompt("  Pick_up the\nred cube \n", 48, [7], "discrete_state", "pi05")
    # strip first, then '_' and '\n' -> ' ' (no lower-casing)
    assert tokenizer.decode(tokens[mask]) == "Task: Pick up the red cube, State: 7;\nAction: "


def test_negative_bin_from_below_range_state_is_written(tokenizer):
    tokens, mask = tokenizer.tokenize_prompt("go", 48, [-1, 3], "discrete_state", "pi05")
    assert tokenizer.decode(tokens[mask]) == "Task: go, State: -1 3;\nAction: "


def test_long_prompt_is_truncated_with_warning(tokenizer, caplog):
    text = " ".join(["pick up the red cube and place it on the plate"] * 10)
    full, full_mask = tokenizer.tokenize_prompt(text, 400, None, "no_state", "pi0")
    with caplog.at_level(logging.WARNING, logger="flashrt_core.tokenizer"):
        cut, cut_mask = tokenizer.tokenize_prompt(text, 16, None, "no_state", "pi0")
    assert full_mask.sum() > 16
    assert cut_mask.all() and cut.shape == (16,)
    np.testing.assert_array_equal(cut, full[:16])  # openpi keeps the first max_len tokens
    assert any("truncating" in r.message for r in caplog.records)


@pytest.mark.parametrize("bad", ["", "   ", "\n\t "])
def test_empty_prompt_is_an_input_error(tokenizer, bad):
    with pytest.raises(InputError, match="prompt is empty"):
        tokenizer.tokenize_prompt(bad, 48, None, "no_state", "pi0")


def test_bad_arguments_name_the_problem(tokenizer):
    with pytest.raises(InputError, match="prompt must be a str"):
        tokenizer.tokenize_prompt(42, 48, None, "no_state", "pi0")
    with pytest.raises(InputError, match="state is required"):
        tokenizer.tokenize_prompt(INSTRUCTION, 48, None, "discrete_state", "pi05")
    with pytest.raises(ValueError, match="unknown prompt mode 'chat'"):
        tokenizer.tokenize_prompt(INSTRUCTION, 48, None, "chat", "pi05")
    with pytest.raises(ValueError, match="unknown model type 'pi1'"):
        tokenizer.tokenize_prompt(INSTRUCTION, 48, None, "no_state", "pi1")
    with pytest.raises(ValueError, match="max_len"):
        tokenizer.tokenize_prompt(INSTRUCTION, 0, None, "no_state", "pi0")


def test_repeated_prompts_hit_the_cache_and_results_are_independent(tokenizer):
    first, _ = tokenizer.tokenize_prompt(INSTRUCTION, 48, STATE_BINS, "discrete_state", "pi05")
    hits = tokenizer._cached_tokens.cache_info().hits
    first[:] = -7  # callers may modify their arrays
    second, _ = tokenizer.tokenize_prompt(INSTRUCTION, 48, STATE_BINS, "discrete_state", "pi05")
    assert tokenizer._cached_tokens.cache_info().hits == hits + 1
    assert second[0] == BOS_ID and (second >= 0).all()
    assert tokenizer._cached_tokens.cache_info().maxsize == PROMPT_CACHE_SIZE


def test_missing_or_invalid_model_file_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer model not found"):
        PromptTokenizer(tmp_path / "absent.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a sentencepiece model")
    with pytest.raises(CheckpointError, match="not a sentencepiece model"):
        PromptTokenizer(junk)
