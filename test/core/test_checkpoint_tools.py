"""flashrt-inspect and flashrt-convert on fixture folders of each layout: what they report, what they write, and
what they refuse (naming how to fix it)."""

import json

import numpy as np
import pytest
from safetensors import safe_open

from flashrt_core.api import load_model
from flashrt_core.checkpoint import WEIGHTS_FILE, weight_spec
from flashrt_core.checkpoint_convert import main as convert_main
from flashrt_core.checkpoint_inspect import inspect_checkpoint
from flashrt_core.checkpoint_inspect import main as inspect_main
from flashrt_core.checkpoint_layout import Layout
from flashrt_core.config import PromptMode, get_config
from flashrt_core.fixture_layouts import tokenizer_for_tests, write_layout

IMAGES = [np.full((40, 40, 3), 120, np.uint8)] * 2


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("tools")
    tokenizer = tokenizer_for_tests(base / "tokenizer.model")
    written = {layout: write_layout(base / layout.value, layout, seed=2)
               for layout in (Layout.LEROBOT, Layout.OPENPI_PYTORCH, Layout.OPENPI_JAX)}
    written["empty"] = write_layout(base / "empty", Layout.LEROBOT, seed=2, empty_normalizer=True)
    return tokenizer, written


@pytest.fixture(autouse=True)
def no_tokenizer_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))            # no openpi download cache
    monkeypatch.delenv("FLASHRT_TOKENIZER", raising=False)


def test_inspect_reports_layout_model_statistics_and_the_missing_tokenizer(folders, capsys):
    tokenizer, written = folders
    assert inspect_main([str(written[Layout.LEROBOT])]) == 1
    out = capsys.readouterr().out
    for text in ("layout:     lerobot", "pi05_tiny (pi05), horizon 10", "state_dim 8, action_dim 7",
                 "policy_preprocessor_step_3_normalizer_processor.safetensors", "(state 8, actions 7)",
                 "tokenizer:  missing", "missing (1):", "google/paligemma-3b-pt-224", "flashrt-convert"):
        assert text in out, out
    assert inspect_main([str(written[Layout.LEROBOT]), "--tokenizer", str(tokenizer)]) == 0
    assert "ready:      yes" in capsys.readouterr().out


def test_inspect_json_names_every_missing_part(folders, capsys):
    _, written = folders
    assert inspect_main([str(written["empty"]), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["layout"] == "lerobot" and report["ready"] is False
    assert [line.split(":")[0] for line in report["missing"]] == ["statistics", "tokenizer"]
    assert "hold no statistics" in report["missing"][0] and "--norm-stats" in report["missing"][0]


def test_inspect_notes_what_a_layout_does_not_record(folders):
    tokenizer, written = folders
    report = inspect_checkpoint(written[Layout.OPENPI_JAX], tokenizer=tokenizer)
    assert report.ready and report.layout == "openpi_jax" and report.model["config"] == "pi05_tiny"
    assert "action_horizon" in report.notes[0] and "--set action_horizon=N" in report.notes[0]
    report = inspect_checkpoint(written[Layout.OPENPI_PYTORCH], tokenizer=tokenizer)
    assert report.ready and "prompt mode" in report.notes[0]


def test_inspect_names_mis_shaped_weights(folders):
    tokenizer, written = folders
    report = inspect_checkpoint(written[Layout.OPENPI_PYTORCH], config="pi0_tiny", tokenizer=tokenizer)
    assert not report.ready
    assert report.missing[0].startswith("weights:") and "state_proj.weight" in report.missing[0]


def test_convert_writes_a_self_contained_folder(folders, tmp_path, capsys):
    tokenizer, written = folders
    dst = tmp_path / "ready"
    assert convert_main([str(written[Layout.OPENPI_JAX]), str(dst), "--tokenizer", str(tokenizer),
                         "--set", "prompt_mode=no_state", "--set", "action_horizon=12"]) == 0
    assert capsys.readouterr().out.strip() == str(dst)
    assert sorted(p.name for p in dst.iterdir()) == ["flashrt_config.json", "model.safetensors", "norm_stats.json",
                                                      "tokenizer.model"]
    record = json.loads((dst / "flashrt_config.json").read_text())
    assert record["config"] == "pi05_tiny" and record["source_layout"] == "openpi_jax"
    assert record["overrides"] == {"action_horizon": 12, "prompt_mode": "no_state", "state_dim": 8, "action_dim": 7}
    with safe_open(str(dst / WEIGHTS_FILE), "pt") as f:
        assert set(f.keys()) == set(weight_spec(get_config("pi05_tiny")))
    policy = load_model(dst, device="cpu")
    assert (policy.horizon, policy.config.prompt_mode, policy.state_dim) == (12, PromptMode.NO_STATE, 8)
    assert policy.predict(IMAGES, "wave", state=np.zeros(8)).shape == (12, 7)
    policy.close()
    assert convert_main([str(written[Layout.LEROBOT]), str(dst), "--tokenizer", str(tokenizer)]) == 1
    assert "exists and is not empty" in capsys.readouterr().err


def test_convert_refuses_what_is_missing_and_writes_nothing(folders, tmp_path, capsys):
    tokenizer, written = folders
    assert convert_main([str(written[Layout.LEROBOT]), str(tmp_path / "a")]) == 1
    assert "tokenizer model not found" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert convert_main([str(written["empty"]), str(tmp_path / "b"), "--tokenizer", str(tokenizer)]) == 1
    err = capsys.readouterr().err
    assert "hold no statistics" in err and "--allow-no-stats" in err and not (tmp_path / "b").exists()
    assert list(tmp_path.iterdir()) == []                          # no temporary folder left either


def test_convert_supplies_statistics_or_declares_none(folders, tmp_path):
    """The empty-normalizer trap (lerobot/pi05_base): statistics given with --norm-stats, or none on purpose."""
    tokenizer, written = folders
    stats_source = written[Layout.OPENPI_PYTORCH] / "assets" / "fixture_robot" / "norm_stats.json"
    with_stats = tmp_path / "with_stats"
    assert convert_main([str(written["empty"]), str(with_stats), "--tokenizer", str(tokenizer),
                         "--norm-stats", str(stats_source), "--dtype", "float32"]) == 0
    assert (with_stats / "norm_stats.json").read_text() == stats_source.read_text()
    with safe_open(str(with_stats / WEIGHTS_FILE), "pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"F32"}
    without = tmp_path / "without"
    assert convert_main([str(written["empty"]), str(without), "--tokenizer", str(tokenizer),
                         "--allow-no-stats"]) == 0
    assert json.loads((without / "flashrt_config.json").read_text())["norm_stats"] == "none"
    policy = load_model(without, device="cpu")                    # the folder says so: no require_norm_stats=False
    assert policy.normalizer.stats is None
    policy.close()


def test_the_readme_commands_are_the_tools_options():
    """Every flashrt-inspect / flashrt-convert line of the README's checkpoint section parses with the tool's own
    options (their runs on fixture folders are the tests above)."""
    import shlex
    from pathlib import Path

    from flashrt_core import checkpoint_convert, checkpoint_inspect
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Your checkpoint and the tokenizer", 1)[1].split("\n## ", 1)[0]
    commands = [shlex.split(line.strip()) for line in section.splitlines() if line.startswith("    flashrt-")]
    parsers = {"flashrt-inspect": checkpoint_inspect.build_parser(),
               "flashrt-convert": checkpoint_convert.build_parser()}
    assert sorted({command[0] for command in commands}) == sorted(parsers) and len(commands) == 3
    for command in commands:
        args = parsers[command[0]].parse_args(command[1:])
        assert args.checkpoint if command[0] == "flashrt-inspect" else (args.src and args.dst), command
