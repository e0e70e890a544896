#!/usr/bin/env bash
# Make a fresh Debian/Ubuntu machine ready, without a ROS install: a venv (.venv) with the ROS 2 Kilted
# Python wheels, PyTorch (CPU build unless FLASHRT_TORCH=cuda), the rest of tools/requirements-venv.txt,
# the CMake path fix for the wheels, and this package's messages + Python code built and installed into the venv.
# Idempotent: a second run only re-checks and re-installs what changed (seconds).
#
#   tools/bootstrap.sh            # then: . .venv/bin/activate
#   FLASHRT_TORCH=cuda tools/bootstrap.sh   # the default (CUDA) torch build instead of the CPU one
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLASHRT_VENV:-$REPO/.venv}"
PYTHON="${FLASHRT_PYTHON:-python3}"
log() { printf '[bootstrap] %s\n' "$*" >&2; }

# 1. System tools: cmake and a C compiler build the message typesupport.
missing=()
for tool in cmake gcc g++ make; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  log "installing system packages: cmake build-essential (missing: ${missing[*]})"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq cmake build-essential python3-venv python3-dev
fi

# 2. The virtual environment.
pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
case "$pyver" in 3.11|3.12) ;; *) log "Python $pyver found; the ROS 2 Kilted wheels need CPython 3.11 or 3.12 (set FLASHRT_PYTHON)"; exit 1;; esac
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV (Python $pyver)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
export VIRTUAL_ENV="$VENV" PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() { "$PY" -m pip install -q "$@"; }

# 3. Python packages, re-run only when the requirements change.
req_hash="$(cat "$REPO/tools/requirements-venv.txt" "$REPO/tools/bootstrap.sh" | sha256sum | cut -c1-16)-${FLASHRT_TORCH:-cpu}"
stamp="$VENV/.flashrt_requirements"
if [ "$(cat "$stamp" 2>/dev/null)" != "$req_hash" ]; then
  log "installing Python packages into $VENV"
  pip_install --upgrade pip wheel "setuptools>=70,<80"
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    if [ "${FLASHRT_TORCH:-cpu}" = cuda ]; then
      pip_install torch
    else
      # CPU build: a local +cpu wheel where the machine has one, else PyTorch's CPU index, else the default build.
      pip_install "torch==2.13.0+cpu" 2>/dev/null \
        || pip_install torch --index-url "${FLASHRT_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" 2>/dev/null \
        || pip_install torch
    fi
  fi
  pip_install -r "$REPO/tools/requirements-venv.txt"
  echo "$req_hash" > "$stamp"
else
  log "Python packages up to date"
fi

# 4. The ROS wheels' exported CMake files carry their build machine's Python and numpy include paths:
#    point them at this venv's own (otherwise rosidl fails with "includes non-existent path").
py_include="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
np_include="$("$PY" -c 'import numpy; print(numpy.get_include())')"
{ grep -rlE '/opt/python/cp3[0-9]+-cp3[0-9]+/' "$VENV/share" --include='*.cmake' 2>/dev/null || true; } | while read -r f; do
  sed -i -E \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/_core/include#${np_include}#g" \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/core/include#${np_include}#g" \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${py_include}#g" "$f"
done

# 5. Build the messages and install the package (messages, Python packages, executables, launch, config)
#    into the venv prefix, exactly as colcon would into install/.
export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
build_dir="$REPO/build/venv"
mkdir -p "$REPO/build"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  log "configuring the message build"
  cmake -S "$REPO" -B "$build_dir" -DCMAKE_PREFIX_PATH="$VENV" -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$PY" -DCMAKE_BUILD_TYPE=Release >"$build_dir.configure.log" 2>&1 \
    || { cat "$build_dir.configure.log" >&2; exit 1; }
fi
cmake --build "$build_dir" -j "$(nproc)" >"$build_dir.build.log" 2>&1 || { cat "$build_dir.build.log" >&2; exit 1; }
cmake --install "$build_dir" >"$build_dir.install.log" 2>&1 || { cat "$build_dir.install.log" >&2; exit 1; }

"$PY" -c 'from flashrt_ros.msg import ActionChunk, PolicyStatus; import flashrt_core, rclpy' \
  || { log "the installed environment does not import; see $build_dir.*.log"; exit 1; }
log "ready: . $VENV/bin/activate"
