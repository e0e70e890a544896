"""tools/benchmark_configure_stop.py: the policy node process over real loopback DDS, configured once without a
signal and then signalled during its configure; the report's rows and the JSON beside them."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from ros_processes import REPO_ROOT
from checked_run import run_checked

pytestmark = pytest.mark.ros


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_each_row_signals_the_configuring_node_which_exits_cleanly_before_it_configured(tmp_path, signal_name):
    """The embedded demo configures in about 2 s on the development machine (most of it the first import of
    torch); a signal 0.2 s after 'configuring:' lands before 'configured:'."""
    report = tmp_path / "stop.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    run_checked([sys.executable, "tools/benchmark_configure_stop.py", "--delays", "0.2", "--signal", signal_name,
                 "--output", str(report)], cwd=REPO_ROOT, env=env, timeout=240)
    text = report.read_text()
    alone = re.search(r"without a signal \('configuring:' to 'configured:'\): ([\d.]+) s; the configured node exits "
                      r"([\d.]+) s after the signal \(exit code 0\)", text)
    assert alone and 0.0 < float(alone[1]) < 120.0 and 0.0 < float(alone[2]) < 60.0, text
    rows = re.findall(r"^\| ([\d.]+) s \| ([\d.]+) s \| (-?\d+) \| (yes|no) \| (yes|no) \|$", text, re.M)
    assert rows == [("0.2", rows[0][1], "0", "no", "no")], text
    result = json.loads(report.with_suffix(".json").read_text())
    assert [row["delay_s"] for row in result["rows"]] == [0.2]
    assert result["rows"][0]["exit_code"] == 0 and not result["rows"][0]["configured_before_exit"]
    assert result["configure_alone"]["exit_code"] == 0
