#!/usr/bin/env bash
# The main job on the embedded default, set-up included: bootstraps the venv (idempotent), then starts the
# policy node on the embedded demo checkpoint (tiny pi0.5, CPU or GPU), feeds it a generated two-camera stream
# and an instruction over loopback DDS, and prints the action chunks and staleness figures it publishes.
# Extra arguments go to flashrt_ros.demo_main (e.g. --duration 10, --device cuda).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
tools/bootstrap.sh
. tools/venv.sh
exec "$VENV/bin/python" -m flashrt_ros.demo_main "$@"
