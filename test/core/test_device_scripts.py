"""The device-machine scripts (tools/device_*.sh) are valid bash, call tools and flags that exist, and their pytest
selections select tests: they run on a GPU machine only, where a typo costs a device call."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from checked_run import failure_report, run_checked

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "tools").glob("device_*.sh"))


def _logical_lines(script: Path) -> list[str]:
    """The script's lines with backslash continuations joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", script.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _pytest_call(line: str) -> tuple[list[str], list[str]]:
    """The test paths and the -k selection (["-k", expression] or []) of one of the script's pytest lines."""
    words = shlex.split(line.split("-m pytest", 1)[1].split(">", 1)[0])
    return [w for w in words if w.startswith("test/")], (["-k", words[words.index("-k") + 1]] if "-k" in words else [])


def _collected(paths: list[str], selection: list[str] = ()) -> str:
    """What `pytest --collect-only -q` prints for these paths and -k selection."""
    return run_checked([sys.executable, "-m", "pytest", "--collect-only", "-q", *paths, *selection], cwd=REPO).stdout


def _ids(listed: str) -> list[str]:
    return [row for row in listed.splitlines() if "::" in row]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_valid_bash(script):
    run_checked(["bash", "-n", str(script)])


def test_engine_checks_call_existing_tools_with_their_flags():
    script = REPO / "tools" / "device_engine_checks.sh"
    calls = [line for line in _logical_lines(script) if '"$PY" tools/' in line]
    assert len(calls) == 26     # benchmark_engine (bench, grid-*, h50 twice, overlap twice, compile-cells),
                                # profile_engine_timeline (224 and 480x640 frames), benchmark_wide_gemms and
                                # benchmark_cublaslt_algorithms (gemms),
                                # benchmark_policy_predict (load, host), benchmark_text_buckets (buckets),
                                # tune_engine (tune), benchmark_pi0_fast (fast), benchmark_groot and
                                # benchmark_groot_language_ops (groot), profile_groot (groot-profile),
                                # benchmark_groot_warm_up (groot-warm-up),
                                # benchmark_layer_chain and benchmark_partial_sums (layer-chain),
                                # benchmark_denoise_ablation (denoise-ablation),
                                # benchmark_handover_chain and benchmark_streamed_gemm_chain
                                # (streamed-chain), benchmark_rtc (rtc)
    for line in calls:
        words = shlex.split(line.split('"$PY"', 1)[1].split(">", 1)[0])
        tool = REPO / words[0]
        assert tool.is_file(), tool
        help_text = run_checked([sys.executable, str(tool), "--help"], cwd=REPO).stdout
        for flag in (w for w in words[1:] if w.startswith("--")):
            assert flag in help_text, f"{tool.name} has no {flag}"


def test_engine_checks_pytest_selections_select_tests():
    """Every pytest line of the script collects tests, each -k term of the engine-new selection ($NEW) selects
    one, and the engine parts (new, rest, gates, forced gates) together select every test of test_engine_gpu.py
    exactly once."""
    script = REPO / "tools" / "device_engine_checks.sh"
    lines = _logical_lines(script)
    new = next(line for line in lines if line.startswith("NEW=")).split("=", 1)[1].strip('"')
    pytest_lines = [line.replace("$NEW", new) for line in lines if "-m pytest" in line]
    assert len(pytest_lines) == 11      # kernels, engine-new, engine-rest, engine-gates, engine-gates-forced,
                                        # h50's kernel tests, fast, groot, layer-chain, streamed-chain, rtc
    engine_ids: list[str] = []
    for line in pytest_lines:
        paths, selection = _pytest_call(line)
        assert paths and all((REPO / p).exists() for p in paths), paths
        listed = _collected(paths, selection)
        assert re.search(r"^\d+(/\d+)? tests? collected", listed, re.M), (line, listed[-500:])
        ids = _ids(listed)
        if paths == ["test/gpu/test_engine_gpu.py"]:
            engine_ids += ids
        if selection and selection[1] == new:
            for term in selection[1].split(" or "):
                assert any(term in test_id for test_id in ids), f"-k term {term!r} selects nothing"
    assert sorted(engine_ids) == sorted(_ids(_collected(["test/gpu/test_engine_gpu.py"])))


def test_engine_checks_name_their_parts_and_refuse_an_unknown_one(tmp_path):
    """The script's list of parts is the parts it has; a misspelt part stops at once with exit status 2 and the
    list (before, it ran nothing and its summary's last test set the status)."""
    script = REPO / "tools" / "device_engine_checks.sh"
    text = script.read_text()
    listed = set(re.search(r'^PARTS="([^"]*)"', text, re.M).group(1).split())
    blocks = set(re.findall(r'^if \[ "\$PART" = ([a-z0-9-]+) \]', text, re.M))
    assert listed == blocks | {"all"}
    done = subprocess.run(["bash", str(script), "gird-pi05"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert done.returncode == 2, failure_report(done)
    assert "no part named 'gird-pi05'" in done.stderr and "grid-pi05" in done.stderr
    assert not (tmp_path / "summary.txt").exists()


def test_engine_checks_part_without_a_gpu_ends_with_status_zero_and_its_summary(tmp_path):
    """A part whose tests skip here (no GPU) runs them, writes its log and the summary and exits 0: the exit
    status no longer comes from the summary's last optional section (a part's log that is absent)."""
    script = REPO / "tools" / "device_engine_checks.sh"
    run_checked(["bash", str(script), "engine-gates-forced"], cwd=REPO,
                env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "FLASHRT_PYTHON": sys.executable})
    log = (tmp_path / "pytest_engine_gates_forced.log").read_text()
    assert "pytest rc=0" in log and "skipped" in log
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith("== pytest_engine_gates_forced") and "pytest rc=0" in summary


def test_kernels_part_runs_every_kernel_test():
    """Every test of test/gpu/test_kernels.py runs on the device: the `kernels` part runs the whole file (no -k
    selection), and the `layer-chain` part runs the layer chain's and the partial sums' tests again, beside their
    benchmarks."""
    lines = _logical_lines(REPO / "tools" / "device_engine_checks.sh")
    kernels = next(line for line in lines if "-m pytest" in line and "test_policy_gpu.py" in line)
    paths, selection = _pytest_call(kernels)
    assert "test/gpu/test_kernels.py" in paths and selection == []
    everything = set(_ids(_collected(["test/gpu/test_kernels.py"])))
    assert len(everything) > 100
    chain = next(line for line in lines if "-m pytest" in line and "layer_chain" in line)
    ran = set(_ids(_collected(*_pytest_call(chain))))
    assert ran and ran == {test_id for test_id in everything if "layer_chain" in test_id or "partial_sums" in test_id}


def test_before_after_uses_flags_the_benchmark_has_and_refuses_without_an_earlier_tree(tmp_path):
    """tools/device_before_after.sh passes each side's benchmark only flags this benchmark_engine.py has (the earlier
    tree's is the one of its commit), and stops at once with exit status 2, naming the folder, when the earlier tree
    is missing (before any device time goes into a checkpoint)."""
    script = REPO / "tools" / "device_before_after.sh"
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", "\n".join(
        line for line in _logical_lines(script) if "GRID=" in line or "benchmark_engine.py" in line)))
    assert {"--configs", "--horizons", "--fp8-configs", "--no-gate", "--tag"} <= flags
    help_text = run_checked([sys.executable, str(REPO / "tools" / "benchmark_engine.py"), "--help"], cwd=REPO).stdout
    assert all(flag in help_text for flag in flags), sorted(f for f in flags if f not in help_text)
    done = subprocess.run(["bash", str(script), "pi05"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"),
                               "BEFORE_TREE": str(tmp_path / "missing")})
    assert done.returncode == 2, failure_report(done)
    assert f"no earlier tree at {tmp_path / 'missing'}" in done.stderr
    assert not (tmp_path / "out").exists()
