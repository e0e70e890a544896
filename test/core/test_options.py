"""The engine's options (flashrt_core/engine/options.py): each field's one environment variable, the values each
accepts, retired variable names refused with their replacement, the product's other FLASHRT_* variables, and
docs/engine_options.md equal to the reference generated from the options' own metadata."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashrt_core.engine.options import PRODUCT_ENVIRONMENT, EngineOptions, env_name, read_path, read_switch
from flashrt_core.engine.options_doc import options_markdown

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "engine_options.md"
BOOL_OPTIONS = [f.name for f in dataclasses.fields(EngineOptions) if f.type == "bool"]


def _env(**kv):
    return EngineOptions.from_env(env={k: str(v) for k, v in kv.items()})


@pytest.mark.parametrize("name", BOOL_OPTIONS)
def test_every_switch_is_one_field_and_one_variable(name):
    """A switch is its field and FLASHRT_<FIELD>: 0 turns it off, 1 on; fast_paths=False turns every one off."""
    var = env_name(name)
    assert var == "FLASHRT_" + name.upper()
    assert getattr(_env(**{var: 0}), name) is False and getattr(_env(**{var: 1}), name) is True
    assert EngineOptions(**{name: True}).enabled(name)
    assert not EngineOptions(**{name: True, "fast_paths": False}).enabled(name)
    with pytest.raises(ValueError, match=f"{var} must be 0 or 1"):
        _env(**{var: "yes"})


def test_retired_disable_variables_are_refused_with_their_replacement():
    with pytest.raises(ValueError, match="FLASHRT_DISABLE_TRITON is not read.*FLASHRT_TRITON=0"):
        _env(FLASHRT_DISABLE_TRITON=1)


@pytest.mark.parametrize("value", ["sync", "poll", "warm", ""])
def test_the_retired_host_wait_variable_is_refused(value):
    """predict waits by the stream's synchronize: FLASHRT_HOST_WAIT, set to anything, is an error naming it."""
    with pytest.raises(ValueError, match="FLASHRT_HOST_WAIT is not read: predict waits by the stream's synchronize"):
        _env(FLASHRT_HOST_WAIT=value)
    assert "host_wait" not in {f.name for f in dataclasses.fields(EngineOptions)}


def test_the_environment_goes_on_top_of_the_given_options_and_empty_is_unset():
    base = EngineOptions(fp8=True, decode_graph_tokens=4, tuning_cache="/a")
    assert EngineOptions.from_env(base, env={}) == base
    assert EngineOptions.from_env(base, env={"FLASHRT_FP8": "", "FLASHRT_DECODE_GRAPH_TOKENS": ""}) == base
    assert EngineOptions.from_env(base, env={"FLASHRT_TUNING_CACHE": ""}).tuning_cache == ""      # "" = off
    assert EngineOptions.from_env(base, env={"FLASHRT_FP8": "0"}).fp8 is False


def test_pinned_implementations_come_from_their_own_variables():
    assert _env(FLASHRT_IMPL_MQA="sdpa", FLASHRT_IMPL_ATTENTION="math").impl == {"mqa": "sdpa", "attention": "math"}
    assert EngineOptions.from_env(EngineOptions(impl={"mqa": "math"}), env={"FLASHRT_IMPL_EULER": "torch"}).impl == \
        {"mqa": "math", "euler": "torch"}
    with pytest.raises(ValueError, match="impl must map"):
        EngineOptions(impl={"mqa": 1})


@pytest.mark.parametrize("field,default,env_value,bad_values", [
    ("chain_tuning_passes", 2, 1, (0, 9, 1.5)),
    ("vision_mlp_pad", 128, 0, (-8, 12, 1.5)),
    ("decode_graph_tokens", 8, 16, (0, 65, 1.5)),
    ("groot_prompt_multiple", 16, 0, (-1, 257, 1.5)),
])
def test_integer_options_and_their_env(field, default, env_value, bad_values):
    """Each integer option: its default, its FLASHRT_<FIELD> variable, values out of range refused naming the
    field, a variable that is not a number refused naming the variable."""
    env = env_name(field)
    assert getattr(EngineOptions(), field) == default
    assert getattr(_env(**{env: env_value}), field) == env_value
    for bad in bad_values:
        with pytest.raises(ValueError, match=field):
            EngineOptions(**{field: bad})
    with pytest.raises(ValueError, match=env):
        _env(**{env: "many"})


def test_text_buckets_option_and_env():
    assert EngineOptions().text_buckets == (16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176)
    assert _env(FLASHRT_TEXT_BUCKETS="64, 128").text_buckets == (64, 128)
    for bad in ("64;128", "64,-1", "sixty"):
        with pytest.raises(ValueError, match="FLASHRT_TEXT_BUCKETS"):
            _env(FLASHRT_TEXT_BUCKETS=bad)
    with pytest.raises(ValueError, match="text_buckets must be positive"):
        _env(FLASHRT_TEXT_BUCKETS="0,64")


def test_product_variables_default_and_refuse_bad_values(monkeypatch):
    monkeypatch.delenv("FLASHRT_GPU_PREPROCESS", raising=False)
    assert read_switch("FLASHRT_GPU_PREPROCESS") is True
    monkeypatch.setenv("FLASHRT_GPU_PREPROCESS", "0")
    assert read_switch("FLASHRT_GPU_PREPROCESS") is False
    monkeypatch.setenv("FLASHRT_GPU_UNNORMALIZE", "on")
    with pytest.raises(ValueError, match="FLASHRT_GPU_UNNORMALIZE must be 0 or 1"):
        read_switch("FLASHRT_GPU_UNNORMALIZE")
    monkeypatch.setenv("FLASHRT_TOKENIZER", "/x/tokenizer.model")
    assert read_path("FLASHRT_TOKENIZER") == "/x/tokenizer.model"
    with pytest.raises(KeyError):
        read_path("FLASHRT_NOT_A_VARIABLE")


def test_every_field_has_its_reference():
    for f in dataclasses.fields(EngineOptions):
        assert f.metadata.get("what"), f.name
        if f.type == "bool":
            assert f.metadata.get("off"), f"{f.name}: what turning it off falls back to"


def test_the_doc_is_the_generated_reference():
    assert DOC.read_text() == options_markdown(), \
        "docs/engine_options.md is stale: python -m flashrt_core.engine.options_doc --write"
    run = subprocess.run([sys.executable, "-m", "flashrt_core.engine.options_doc"], cwd=REPO, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.stdout == options_markdown() and run.stderr == ""


def test_only_the_options_module_reads_flashrt_variables():
    """Every FLASHRT_* variable the product reads is read in engine/options.py and documented there."""
    readers = []
    for root in ("flashrt_core", "flashrt_ros", "kernels/flashrt_kernels"):
        for path in sorted((REPO / root).rglob("*.py")):
            text = path.read_text()
            if ("os.environ" in text or "getenv" in text) and "FLASHRT_" in text:
                readers.append(str(path.relative_to(REPO)))
    assert readers == ["flashrt_core/engine/options.py"]
    documented = {env_name(f.name) for f in dataclasses.fields(EngineOptions)} | {v.name for v in PRODUCT_ENVIRONMENT}
    assert {"FLASHRT_GPU_PREPROCESS", "FLASHRT_GPU_UNNORMALIZE", "FLASHRT_TOKENIZER", "FLASHRT_CACHE_DIR"} <= documented
