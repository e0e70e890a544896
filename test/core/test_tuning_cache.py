"""The load-time tuning cache (flashrt_core/engine/tuning_cache.py): entries written and read back, every way an
entry can be unusable, the source fingerprint, and the option that turns it on. The engine's use of it needs a
GPU (test/gpu/test_engine_gpu.py::test_tuning_cache_*)."""

from __future__ import annotations

import json
import logging
import shutil
import types

import pytest
import torch

from flashrt_core.engine import EngineOptions
from flashrt_core.engine import tuning_cache as tc
from flashrt_core.engine.kernel_import import load_kernels

KEY = {"format": tc.TUNING_CACHE_FORMAT, "code": "c0de", "gpu": "NVIDIA H200", "capability": "9.0",
       "dtype": str(torch.bfloat16), "rows": 10, "text_bucket": 64, "views": 2, "model": {"view_names": ("a", "b")},
       "options": {"text_buckets": (64, 128), "overrides": {}}}
PICKS = {"launch_policy": "all", "decoder": {"qkv": "gluon_smem(s1)", "down": "triton(n16,k1024,s4,st1,w4)"},
         "prefix_attention": "mqa_split1", "vision_attention": "cudnn"}


def test_an_entry_is_written_as_json_and_read_back(tmp_path):
    cache = tc.TuningCache(tmp_path / "tuning")             # made on the first store
    assert cache.load(KEY) is None
    path = cache.store(KEY, PICKS, {"decoder_chain_ms": {"qkv": {"gluon_smem(s1)": 4.27}}})
    assert path == cache.path(KEY) and path.parent == tmp_path / "tuning"
    assert [p.name for p in path.parent.iterdir()] == [path.name]          # no temporary file left behind
    entry = json.loads(path.read_text())
    assert entry["format"] == tc.TUNING_CACHE_FORMAT and entry["picks"] == PICKS
    assert entry["key"]["options"]["text_buckets"] == [64, 128]            # tuples stored as lists
    assert entry["timings"]["decoder_chain_ms"]["qkv"]["gluon_smem(s1)"] == 4.27
    assert cache.load(KEY) == PICKS
    assert tc.TuningCache(str(tmp_path / "tuning")).load(dict(reversed(list(KEY.items())))) == PICKS   # key order


def test_another_key_is_another_entry(tmp_path):
    cache = tc.TuningCache(tmp_path)
    cache.store(KEY, PICKS)
    for change in ({"rows": 50}, {"gpu": "NVIDIA H100"}, {"code": "other"}, {"dtype": str(torch.float16)}):
        other = {**KEY, **change}
        assert cache.path(other) != cache.path(KEY), change
        assert cache.load(other) is None, change


@pytest.mark.parametrize("damage,reason", [
    (lambda entry, text: "{not json", "Expecting"),
    (lambda entry, text: json.dumps({**entry, "format": 99}), "format 99"),
    (lambda entry, text: json.dumps([entry]), "format"),
    (lambda entry, text: json.dumps({**entry, "key": {**entry["key"], "rows": 11}}), "key differs"),
    (lambda entry, text: json.dumps({**entry, "picks": "all"}), "no picks"),
], ids=["not_json", "other_format", "not_an_object", "other_key", "no_picks"])
def test_an_unusable_entry_is_logged_and_treated_as_missing(tmp_path, caplog, damage, reason):
    cache = tc.TuningCache(tmp_path)
    path = cache.store(KEY, PICKS)
    text = path.read_text()
    path.write_text(damage(json.loads(text), text))
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        assert cache.load(KEY) is None
    assert reason in caplog.text and str(path) in caplog.text
    assert cache.store(KEY, PICKS) == path and cache.load(KEY) == PICKS     # measured again and overwritten


def test_a_directory_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would be")
    cache = tc.TuningCache(blocker / "tuning")
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        assert cache.store(KEY, PICKS) is None
        assert cache.load(KEY) is None
    assert "could not write the tuning cache entry" in caplog.text


def test_the_cache_needs_a_directory():
    with pytest.raises(ValueError, match="needs a directory"):
        tc.TuningCache("")


def test_a_pick_is_found_by_its_name_or_named_in_the_error():
    class Config:
        def __init__(self, split):
            self.split = split

        def __str__(self):
            return f"gluon_smem(s{self.split})"
    candidates = ["library", Config(1), Config(2)]
    assert tc.pick_by_name(candidates, "gluon_smem(s2)", "the o GEMM") is candidates[2]
    assert tc.pick_by_name({"none": (), "all": ()}, "all", "launch policy") == "all"
    with pytest.raises(ValueError, match=r"the o GEMM 'gluon_smem\(s8\)' is not among .*'gluon_smem\(s1\)'"):
        tc.pick_by_name(candidates, "gluon_smem(s8)", "the o GEMM")
    with pytest.raises(ValueError, match="launch policy None"):
        tc.pick_by_name(["none", "all"], None, "launch policy")


def test_the_fingerprint_covers_the_engine_and_the_kernels_sources(tmp_path, monkeypatch):
    fingerprint = tc.code_fingerprint.__wrapped__            # the uncached function
    assert fingerprint() == tc.code_fingerprint() and len(fingerprint()) == 64
    kernels = tmp_path / "flashrt_kernels"
    shutil.copytree(load_kernels().__file__.rsplit("/", 1)[0], kernels,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr("flashrt_core.engine.kernel_import.load_kernels",
                        lambda: types.SimpleNamespace(__file__=str(kernels / "__init__.py")))
    copied = fingerprint()
    assert copied == tc.code_fingerprint()                    # the same bytes under the same names
    (kernels / "attention.py").write_text((kernels / "attention.py").read_text() + "\n# one more line\n")
    assert fingerprint() != copied
    (kernels / "attention.py").unlink()
    assert fingerprint() != copied


def test_the_option_turns_it_on_from_the_environment():
    assert EngineOptions().tuning_cache == ""
    assert EngineOptions.from_env(env={"FLASHRT_TUNING_CACHE": "/var/cache/flashrt"}).tuning_cache == \
        "/var/cache/flashrt"
    on = EngineOptions(tuning_cache="/var/cache/flashrt")
    assert EngineOptions.from_env(on, env={"FLASHRT_TUNING_CACHE": ""}).tuning_cache == ""
    assert EngineOptions.from_env(on, env={}).tuning_cache == "/var/cache/flashrt"
    with pytest.raises(ValueError, match="tuning_cache must be a directory path"):
        EngineOptions(tuning_cache=None)
