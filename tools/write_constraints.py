#!/usr/bin/env python3
"""Write tools/constraints.txt: the exact version of every package installed from a wheel or sdist in this
environment, the pins that tools/bootstrap.sh installs with (and so the environment of CI and of new users).

Run it from the venv the whole suite has just passed in (`tools/run_tests.sh`), then commit the file:

    .venv/bin/python tools/write_constraints.py

Packages that pip did not install are left out: this repository's own package and the egg-info records that the
ROS message builds write (they carry the names of ROS packages, not of installable distributions). torch is pinned
by its public version (`torch==2.13.0` admits both the +cpu and the CUDA build of that release)."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from datetime import date
from pathlib import Path

OWN = {"flashrt-ros", "flashrt_ros"}
DEFAULT_OUT = Path(__file__).resolve().parent / "constraints.txt"


def installed_pins() -> list[str]:
    """`name==version` of every distribution installed by pip (a .dist-info record), sorted by name."""
    pins = {}
    for dist in importlib.metadata.distributions():
        record = getattr(dist, "_path", None)
        name = dist.metadata["Name"]
        if record is None or Path(record).suffix != ".dist-info" or name in OWN:
            continue
        version = dist.version.split("+", 1)[0]         # the public version: a local label names one build only
        pins[name.lower()] = f"{name}=={version}"
    return [pins[key] for key in sorted(pins)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write (default: %(default)s)")
    args = parser.parse_args()
    header = [
        "# The environment the test suite passed in: tools/bootstrap.sh installs exactly these versions.",
        "# Written by tools/write_constraints.py; bump deliberately (tools/run_tests.sh with FLASHRT_DEPENDENCIES=newest",
        "# tries the newest releases first).",
        f"# Python {platform.python_version()} on {sys.platform}/{platform.machine()}, {date.today().isoformat()}.",
    ]
    args.out.write_text("\n".join(header + installed_pins()) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
