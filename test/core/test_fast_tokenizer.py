"""FAST action tokenizer: the DCT, round trips through a BPE trained offline, exact decoding of known token
sequences, invalid sequences and the processor's files."""

import json
import math

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from flashrt_core.errors import CheckpointError
from flashrt_core.fast_tokenizer import (PROCESSOR_CONFIG_FILE, TOKENIZER_FILE, ActionDecodeError, FastTokenizer,
                                         dct, idct, quantize, smooth_chunks, write_fast_tokenizer)

HORIZON, DIM, SCALE = 10, 7, 10.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = write_fast_tokenizer(tmp_path_factory.mktemp("fast"), HORIZON, DIM, vocab_size=512, scale=SCALE)
    return path, FastTokenizer.load(path)


def dct_by_definition(x):
    """DCT-II with orthonormal scaling written out as a sum (scipy.fft.dct(norm='ortho') over axis 0)."""
    n = x.shape[0]
    out = np.zeros_like(x, dtype=np.float64)
    for k in range(n):
        weight = math.sqrt((1 if k == 0 else 2) / n)
        out[k] = weight * sum(x[t] * math.cos(math.pi * (2 * t + 1) * k / (2 * n)) for t in range(n))
    return out


def test_dct_is_the_orthonormal_dct_ii_and_idct_inverts_it():
    x = np.random.default_rng(0).normal(size=(HORIZON, DIM))
    np.testing.assert_allclose(dct(x), dct_by_definition(x), atol=1e-12)
    np.testing.assert_allclose(idct(dct(x)), x, atol=1e-12)
    constant = np.full((HORIZON, 1), 0.3)
    np.testing.assert_allclose(dct(constant)[:, 0], [0.3 * math.sqrt(HORIZON)] + [0.0] * (HORIZON - 1), atol=1e-12)


def test_fixture_writer_saves_the_processor_files(trained):
    path, tok = trained
    record = json.loads((path / PROCESSOR_CONFIG_FILE).read_text())
    assert record["scale"] == SCALE and record["min_token"] == tok.min_token < 0
    assert (record["time_horizon"], record["action_dim"]) == (HORIZON, DIM)
    assert tok.vocab_size == 512 == Tokenizer.from_file(str(path / TOKENIZER_FILE)).get_vocab_size()


def test_round_trip_is_within_the_quantization_error(trained):
    _, tok = trained
    bound = 0.5 / SCALE * math.sqrt(HORIZON * DIM)  # |x - x'|_inf <= |rounding error|_2 (orthonormal inverse)
    lengths = []
    for chunk in smooth_chunks(40, HORIZON, DIM, seed=123):  # not the training chunks
        ids = tok.encode(chunk)
        lengths.append(len(ids))
        np.testing.assert_array_equal(tok.decode_coefficients(ids), quantize(chunk, SCALE).reshape(-1))
        decoded = tok.decode(ids, HORIZON, DIM)
        np.testing.assert_allclose(decoded, idct(quantize(chunk, SCALE) / SCALE), atol=1e-12)
        assert np.abs(decoded - chunk).max() <= bound
    assert np.mean(lengths) < HORIZON * DIM / 2  # the BPE compresses smooth chunks


def byte_level_tokenizer(vocab, merges):
    """A hand-built byte-level BPE (token ids known by construction) in the processor's format."""
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return bpe


def test_known_token_sequence_decodes_to_exact_actions():
    # min_token -65: "A" (65) is coefficient 0, "B" (66) is 1, "C" (67) is 2; "AB" one merged token
    bpe = byte_level_tokenizer({"A": 0, "B": 1, "C": 2, "AB": 3}, [("A", "B")])
    tok = FastTokenizer(bpe, scale=2.0, min_token=-65)
    horizon, dim = 3, 2
    ids = [2, 0, 3, 1, 0]  # "C A AB B A" -> coefficients [2, 0, 0, 1, 1, 0] time-major
    coefficients = np.array([[2, 0], [0, 1], [1, 0]]) / 2.0
    expected = np.zeros((horizon, dim))
    for t in range(horizon):  # inverse orthonormal DCT written out
        for k in range(horizon):
            weight = math.sqrt((1 if k == 0 else 2) / horizon)
            expected[t] += weight * coefficients[k] * math.cos(math.pi * (2 * t + 1) * k / (2 * horizon))
    np.testing.assert_allclose(tok.decode(ids, horizon, dim), expected, atol=1e-12)
    # the DC term alone: a constant chunk of DC / scale / sqrt(horizon)
    np.testing.assert_allclose(tok.decode([2, 0, 0, 0, 0, 0], horizon, dim),
                               np.tile([1.0 / math.sqrt(horizon), 0.0], (horizon, 1)), atol=1e-12)
    assert tok.encode(tok.decode(ids, horizon, dim)) == ids


def test_invalid_sequences_raise_or_follow_the_relaxed_rule():
    bpe = byte_level_tokenizer({"A": 0, "B": 1, "C": 2, "AB": 3, "Ã": 4}, [("A", "B")])
    tok = FastTokenizer(bpe, scale=2.0, min_token=-65)
    with pytest.raises(ActionDecodeError, match="outside the FAST vocabulary"):
        tok.decode([0, 5], 2, 1)
    with pytest.raises(ActionDecodeError, match="no UTF-8"):  # byte 0xC3 alone: half a character
        tok.decode([0, 4], 2, 1)
    with pytest.raises(ActionDecodeError, match="give 3 DCT coefficients, expected 4"):
        tok.decode([3, 2], 2, 2)
    padded = tok.decode([3, 2], 2, 2, relaxed=True)  # [0, 1, 2] + a zero
    np.testing.assert_allclose(padded, idct(np.array([[0, 1], [2, 0]]) / 2.0), atol=1e-12)
    cut = tok.decode([3, 2, 2], 1, 2, relaxed=True)  # [0, 1, 2, 2] cut to [0, 1]
    np.testing.assert_allclose(cut, [[0.0, 0.5]], atol=1e-12)


def test_encode_refuses_chunks_outside_the_trained_range(trained):
    _, tok = trained
    with pytest.raises(ValueError, match="below the tokenizer's min_token"):
        tok.encode(np.full((HORIZON, DIM), -50.0))
    with pytest.raises(ValueError, match="finite"):
        tok.encode(np.full((HORIZON, DIM), np.nan))


def test_load_errors_name_the_file(tmp_path, trained):
    with pytest.raises(CheckpointError, match=TOKENIZER_FILE):
        FastTokenizer.load(tmp_path)
    path, _ = trained
    (tmp_path / TOKENIZER_FILE).write_text((path / TOKENIZER_FILE).read_text())
    (tmp_path / PROCESSOR_CONFIG_FILE).write_text(json.dumps({"scale": 0}))
    with pytest.raises(CheckpointError, match="'scale' must be a positive number"):
        FastTokenizer.load(tmp_path)
    (tmp_path / PROCESSOR_CONFIG_FILE).write_text(json.dumps({"scale": 10, "min_token": 1.5}))
    with pytest.raises(CheckpointError, match="'min_token' must be an int"):
        FastTokenizer.load(tmp_path)
    (tmp_path / TOKENIZER_FILE).write_text("not json")
    (tmp_path / PROCESSOR_CONFIG_FILE).write_text(json.dumps({"scale": 10}))
    with pytest.raises(CheckpointError, match="cannot read the BPE tokenizer"):
        FastTokenizer.load(tmp_path)


def test_fixture_writer_is_deterministic(tmp_path, trained):
    path, _ = trained
    again = write_fast_tokenizer(tmp_path, HORIZON, DIM, vocab_size=512, scale=SCALE)
    assert (again / TOKENIZER_FILE).read_text() == (path / TOKENIZER_FILE).read_text()


def test_the_released_processor_config_loads(tmp_path, trained):
    """physical-intelligence/fast's processor_config.json: null horizon and dim, an auto_map, min_token -354."""
    path, _ = trained
    (tmp_path / TOKENIZER_FILE).write_text((path / TOKENIZER_FILE).read_text())
    (tmp_path / PROCESSOR_CONFIG_FILE).write_text(json.dumps({
        "action_dim": None, "auto_map": {"AutoProcessor": "processing_action_tokenizer.UniversalActionProcessor"},
        "min_token": -354, "processor_class": "UniversalActionProcessor", "scale": 10, "time_horizon": None,
        "vocab_size": 2048}))
    tok = FastTokenizer.load(tmp_path)
    assert (tok.scale, tok.min_token) == (10.0, -354)
