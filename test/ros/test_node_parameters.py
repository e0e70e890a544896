"""node_parameters: every parameter described, defaults valid, reasons for invalid values, config_id."""

from __future__ import annotations

import dataclasses

import pytest
from rclpy.parameter import Parameter

from flashrt_ros.node_parameters import (CONFIGURE_PARAMETERS, PARAMETERS, RUNTIME_PARAMETERS, SPECS, Changeable,
                                         SettingsError, StateInput, TriggerMode, on_set_parameters,
                                         settings_from_values, validate)

DEFAULTS = {spec.name: spec.default for spec in PARAMETERS}


def test_every_parameter_is_described_and_its_default_is_valid():
    for spec in PARAMETERS:
        assert len(spec.description) > 20, spec.name
        assert validate(spec.name, spec.default) is None, spec.name
        descriptor = spec.descriptor()
        assert descriptor.read_only == spec.read_only and descriptor.type == spec.param_type()
    assert set(RUNTIME_PARAMETERS) == {"default_instruction", "sync_slop", "max_observation_age",
                                       "staleness_warn_threshold", "max_future_stamp", "camera_timeout",
                                       "pairing_timeout", "max_state_age"}
    startup = {spec.name for spec in PARAMETERS if spec.changeable is Changeable.STARTUP}
    assert startup == {"executor", "autostart", "diagnostics_period"}
    assert all(spec.read_only == (spec.name in startup) for spec in PARAMETERS)
    for name in ("camera_timeout", "pairing_timeout", "max_state_age"):     # detection well under a second
        assert SPECS[name].default < 1.0, name
    settings = settings_from_values(DEFAULTS)
    assert settings.trigger is TriggerMode.ON_OBSERVATION and settings.state_type is StateInput.JOINT_STATE
    assert settings.config is None and settings.load_precision is None      # auto -> flashrt_core picks


@pytest.mark.parametrize("name, value, reason", [
    ("trigger", "sometimes", "not one of"),
    ("precision", "int8", "not one of"),
    ("device", "gpu", "expected auto, cpu, cuda or cuda:N"),
    ("hardware", "h100", "expected auto, reference, cpu, smXY or gfxNNN"),
    ("device", "cuda:x", "expected auto, cpu, cuda or cuda:N"),
    ("sync_slop", 2.0, "outside [0.0, 1.0]"),
    ("max_observation_age", float("inf"), "outside"),
    ("warmup_iterations", -1, "outside [0, 100]"),
    ("camera_topics", [], "must not be empty"),
    ("camera_topics", ["a", ""], "empty entry"),
    ("action_names", ["x", "x"], "duplicate entries"),
    ("output_topic", "", "must not be empty"),
    ("warmup_image_size", [640], "expected [width, height]"),
    ("warmup_image_size", [640, 0], "each in 1..16384"),
])
def test_invalid_values_have_a_reason_naming_them(name, value, reason):
    message = validate(name, value)
    assert message is not None and reason in message and name in message


@pytest.mark.parametrize("hardware", ["auto", "reference", "cpu", "sm90", "sm120", "gfx942"])
def test_engine_hardware_targets_are_accepted(hardware):
    assert validate("hardware", hardware) is None


def test_on_set_callback_rejects_the_whole_set_with_all_reasons():
    result = on_set_parameters([Parameter("sync_slop", value=0.01), Parameter("trigger", value="never"),
                                Parameter("device", value="tpu")])
    assert not result.successful
    assert "trigger='never'" in result.reason and "device='tpu'" in result.reason
    assert on_set_parameters([Parameter("sync_slop", value=0.01), Parameter("use_sim_time", value=True)]).successful


@pytest.mark.parametrize("state", ["inactive", "active", "configuring"])
def test_configure_time_parameters_are_refused_with_a_reason_unless_unconfigured(state):
    checkpoint = Parameter("checkpoint", value="/new/checkpoint")
    assert "checkpoint" in CONFIGURE_PARAMETERS
    assert on_set_parameters([checkpoint], "unconfigured").successful
    refused = on_set_parameters([checkpoint, Parameter("sync_slop", value=0.01)], state)
    assert not refused.successful
    assert "checkpoint is read at configure" in refused.reason and state in refused.reason
    assert on_set_parameters([Parameter("sync_slop", value=0.01)], state).successful      # runtime: any state


def test_settings_error_lists_every_problem_and_cross_checks():
    values = dict(DEFAULTS, trigger="x", camera_views=["base_0_rgb"], sync_slop=-1.0)
    with pytest.raises(SettingsError) as raised:
        settings_from_values(values)
    text = str(raised.value)
    assert "trigger='x'" in text and "sync_slop=-1.0" in text
    assert "camera_views has 1 entries but camera_topics has 2" in text


def test_config_id_follows_model_settings_not_runtime_thresholds():
    base = settings_from_values(DEFAULTS)
    assert base.config_id() == settings_from_values(DEFAULTS).config_id() and len(base.config_id()) == 12
    assert base.with_runtime_values({"staleness_warn_threshold": 1.0}).config_id() == base.config_id()
    assert dataclasses.replace(base, checkpoint="/other").config_id() != base.config_id()
    assert dataclasses.replace(base, precision="bfloat16").config_id() != base.config_id()
    with pytest.raises(SettingsError, match="not changeable at runtime"):
        base.with_runtime_values({"checkpoint": "/x"})
    assert set(SPECS) == {spec.name for spec in PARAMETERS}


def test_engine_tuning_cache_reaches_the_engine_options(tmp_path, monkeypatch):
    """engine_tuning_cache becomes load_model's engine_options (EngineOptions.tuning_cache), on by default in the
    user's cache directory (~ expanded), the environment's FLASHRT_TUNING_CACHE winning; empty with no
    engine_text_buckets leaves engine_options None (defaults and the environment). The node's default policy
    factory loads a real checkpoint with them on the CPU, which tunes nothing and writes nothing there."""
    from flashrt_core.fixtures import write_random_checkpoint
    from flashrt_ros.policy_node import load_policy
    monkeypatch.delenv("FLASHRT_TUNING_CACHE", raising=False)
    monkeypatch.delenv("FLASHRT_TEXT_BUCKETS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    from flashrt_core.engine.tuning_cache import TuningCache
    default = settings_from_values(DEFAULTS)
    assert TuningCache(default.engine_options().tuning_cache).directory == tmp_path / "home" / ".cache" / "flashrt" \
        / "tuning"
    assert settings_from_values(dict(DEFAULTS, engine_tuning_cache="")).engine_options() is None
    settings = settings_from_values(dict(DEFAULTS, engine_tuning_cache=str(tmp_path / "tuning")))
    assert settings.engine_options().tuning_cache == str(tmp_path / "tuning")
    monkeypatch.setenv("FLASHRT_TUNING_CACHE", "/elsewhere")
    assert settings.engine_options().tuning_cache == "/elsewhere"
    monkeypatch.setenv("FLASHRT_TUNING_CACHE", "")
    assert default.engine_options().tuning_cache == ""                       # the environment turns it off
    monkeypatch.delenv("FLASHRT_TUNING_CACHE")
    ckpt = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny", seed=4)
    policy = load_policy(dataclasses.replace(default, checkpoint=str(ckpt), device="cpu"))
    try:
        assert policy.horizon > 0 and not (tmp_path / "home" / ".cache").exists()    # the CPU path tunes nothing
    finally:
        policy.close()


def test_engine_text_buckets_reach_the_engine_options(monkeypatch):
    """engine_text_buckets becomes EngineOptions.text_buckets (empty: the engine's default), FLASHRT_TEXT_BUCKETS
    winning; a bucket outside 1..4096 is rejected with its reason. Neither it nor a tuning cache set: no
    engine_options (the engine's defaults and the environment)."""
    from flashrt_core.engine.options import DEFAULT_TEXT_BUCKETS
    monkeypatch.delenv("FLASHRT_TEXT_BUCKETS", raising=False)
    assert settings_from_values(dict(DEFAULTS, engine_tuning_cache="")).engine_options() is None
    assert settings_from_values(DEFAULTS).engine_options().text_buckets == DEFAULT_TEXT_BUCKETS
    settings = settings_from_values(dict(DEFAULTS, engine_tuning_cache="", engine_text_buckets=[64, 128]))
    assert settings.engine_text_buckets == (64, 128)
    assert settings.engine_options().text_buckets == (64, 128)
    monkeypatch.setenv("FLASHRT_TEXT_BUCKETS", "32,96")
    assert settings.engine_options().text_buckets == (32, 96)
    assert "1..4096" in validate("engine_text_buckets", [64, 0])
    assert validate("engine_text_buckets", [16, 144]) is None
