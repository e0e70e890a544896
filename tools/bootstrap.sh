#!/usr/bin/env bash
# Make a fresh Debian/Ubuntu machine ready, without a ROS install: a venv (.venv) with the ROS 2 Kilted
# Python wheels, PyTorch (CPU build unless FLASHRT_TORCH=cuda), the rest of tools/requirements-venv.txt at the
# exact versions of tools/constraints.txt, the CMake path fix for the wheels, and this package's messages + Python
# code built and installed into the venv.
# Idempotent: a second run only re-checks and re-installs what changed (seconds).
#
#   tools/bootstrap.sh                                  # then: . .venv/bin/activate
#   FLASHRT_TORCH=cuda tools/bootstrap.sh               # the CUDA torch build instead of the CPU one
#   FLASHRT_DEPENDENCIES=newest tools/bootstrap.sh      # the newest releases instead of the pins, in .venv-newest
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$REPO/tools/venv.sh"
PYTHON="${FLASHRT_PYTHON:-python3}"
CONSTRAINTS="$REPO/tools/constraints.txt"
REQUIREMENTS="$REPO/tools/requirements-venv.txt"
START=$SECONDS
log() { printf '[bootstrap %3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }

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
# pinned: every install is held to tools/constraints.txt; newest: the newest releases the requirements admit.
if [ "$DEPENDENCIES" = pinned ]; then PIN_ARGS=(-c "$CONSTRAINTS"); else PIN_ARGS=(--upgrade --upgrade-strategy eager); fi
# pip's own lines about find-links folders that do not exist on this machine say nothing about the install.
pip_install() {
  "$PY" -m pip install -q "${PIN_ARGS[@]}" "$@" \
    2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$" >&2)
}
# A line every 30 s while a long step runs, so a quiet pip is not mistaken for a hung one.
with_heartbeat() {
  local what="$1"; shift
  ( while sleep 30; do log "  ... still installing $what"; done ) &
  local beat=$!
  local rc=0
  "$@" || rc=$?
  kill "$beat" 2>/dev/null; wait "$beat" 2>/dev/null || true
  return "$rc"
}
# The requirement lines of one "## set:" section of requirements-venv.txt.
requirement_set() { awk -v n="$1" '/^## set:/ {i++; next} i == n && NF && !/^#/' "$REQUIREMENTS"; }
set_title() { awk -v n="$1" '/^## set:/ {i++; if (i == n) {sub(/^## set: /, ""); print}}' "$REQUIREMENTS"; }
set_count="$(grep -c '^## set:' "$REQUIREMENTS")"

# 3. Python packages, re-run only when the requirements, the pins or this script change.
req_hash="$(cat "$REQUIREMENTS" "$CONSTRAINTS" "$REPO/tools/bootstrap.sh" | sha256sum | cut -c1-16)-${FLASHRT_TORCH:-cpu}-$DEPENDENCIES"
stamp="$VENV/.flashrt_requirements"
if [ "$(cat "$stamp" 2>/dev/null)" != "$req_hash" ]; then
  steps=$((set_count + 2))
  log "installing Python packages into $VENV ($DEPENDENCIES versions, $steps steps, 3-6 min on a fresh machine)"
  log "step 1/$steps: pip, wheel, setuptools"
  pip_install --upgrade pip wheel "setuptools>=70,<80"
  if [ "$DEPENDENCIES" = newest ] || ! "$PY" -c 'import torch' 2>/dev/null; then
    if [ "${FLASHRT_TORCH:-cpu}" = cuda ]; then
      log "step 2/$steps: PyTorch, CUDA build (~3 GB with its CUDA libraries, several minutes)"
      with_heartbeat "PyTorch (CUDA)" pip_install torch
    else
      log "step 2/$steps: PyTorch, CPU build (~200 MB, under a minute from a local wheel, 1-3 min downloaded)"
      # A local +cpu wheel where the machine has one, else PyTorch's CPU index, else the default build. The
      # newest versions look at PyTorch's CPU index first. A failed try's pip output goes to torch-install.log.
      torch_pin="$(grep -E '^torch==' "$CONSTRAINTS" | cut -d= -f3)"
      cpu_index="${FLASHRT_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
      torch_log="$VENV/torch-install.log"
      # PyTorch's CPU index alone (--isolated: no extra index from the user's pip configuration, whose newest
      # torch may be a CUDA build), failing in seconds where it is out of reach
      from_cpu_index() {
        pip_install --isolated --timeout 15 --retries 1 torch --index-url "$cpu_index" 2>>"$torch_log"
      }
      pinned_cpu_wheel() { pip_install "torch==${torch_pin}+cpu" 2>>"$torch_log"; }
      if [ "$DEPENDENCIES" = newest ]; then
        # where PyTorch's CPU index is out of reach the pinned CPU build stays (the default index's newest torch
        # is the CUDA build, several GB)
        with_heartbeat "PyTorch (CPU)" from_cpu_index \
          || { log "  PyTorch's CPU index is out of reach (see $torch_log): keeping torch==${torch_pin}+cpu"
               pip_install "torch==${torch_pin}+cpu"; }
      else
        with_heartbeat "PyTorch (CPU)" pinned_cpu_wheel \
          || with_heartbeat "PyTorch (CPU)" from_cpu_index \
          || with_heartbeat "PyTorch" pip_install torch
      fi
    fi
  else
    log "step 2/$steps: PyTorch $("$PY" -c 'import torch; print(torch.__version__)') already installed"
  fi
  for ((i = 1; i <= set_count; i++)); do
    log "step $((i + 2))/$steps: $(set_title "$i")"
    mapfile -t requirements < <(requirement_set "$i")
    with_heartbeat "$(set_title "$i" | cut -d'(' -f1 | sed 's/ *$//')" pip_install "${requirements[@]}"
  done
  echo "$req_hash" > "$stamp"
  log "Python packages installed"
else
  log "Python packages up to date ($DEPENDENCIES versions)"
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
build_dir="$REPO/build/$(basename "$VENV")"
mkdir -p "$REPO/build"
log "building the messages and installing the package into $VENV (~30 s the first time)"
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
