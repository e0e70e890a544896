"""flashrt_core.groot_inputs.GrootTokenizer's LRU of encodings, on the fixtures' real word-level tokenizer: a
repeated prompt is tokenized once, every call still gets its own list, and prompt_ids checks the ids on every
call, cached or not."""

from __future__ import annotations

import dataclasses

import pytest

from flashrt_core.errors import CheckpointError
from flashrt_core.groot_fixtures import write_tokenizer
from flashrt_core.groot_inputs import GrootTokenizer, prompt_ids, prompt_text
from flashrt_core.model.groot.config import get_groot_config
from flashrt_core.tokenizer import PROMPT_CACHE_SIZE


@pytest.fixture
def counted(tmp_path):
    """(tokenizer, calls): the tokenizer with its underlying encoder counting the texts it tokenizes."""
    cfg = get_groot_config("groot_n1.6_tiny")
    tok = GrootTokenizer(write_tokenizer(tmp_path / "tokenizer.json", cfg.image_token_index))
    calls, encode = [], tok._encode

    def counting(text):
        calls.append(text)
        return encode(text)
    tok._encode = counting
    return tok, calls


def test_a_repeated_prompt_is_tokenized_once(counted):
    tok, calls = counted
    text = prompt_text("pick up the cube", [4, 4])
    first, second = tok.encode(text), tok.encode(text)
    assert first == second and len(first) > 8 and calls == [text]
    first.append(-1)                                  # each call's list is its own
    assert tok.encode(text) == second
    other = prompt_text("place it", [4, 4])
    assert tok.encode(other) != second and calls == [text, other]


def test_the_cache_keeps_the_last_distinct_prompts(counted):
    tok, calls = counted
    texts = [prompt_text("pick up the cube " + "up " * i, [4]) for i in range(PROMPT_CACHE_SIZE + 1)]
    for text in texts:
        tok.encode(text)
    tok.encode(texts[-1])                             # among the last: cached
    assert len(calls) == len(texts)
    tok.encode(texts[0])                              # pushed out by the newer ones: tokenized again
    assert len(calls) == len(texts) + 1


def test_prompt_ids_checks_a_cached_encoding_too(counted):
    tok, calls = counted
    cfg = get_groot_config("groot_n1.6_tiny")
    ids = prompt_ids(tok, cfg, "Pick up the cube!", [4, 4])
    assert int((ids == cfg.image_token_index).sum()) == 8
    wrong = dataclasses.replace(cfg, image_token_index=cfg.image_token_index + 1)
    for _ in range(2):
        with pytest.raises(CheckpointError, match="image-context ids"):
            prompt_ids(tok, wrong, "Pick up the cube!", [4, 4])
    assert len(calls) == 1
