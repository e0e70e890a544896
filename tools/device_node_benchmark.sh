#!/usr/bin/env bash
# The node-overhead benchmark and the GPU node tests on a machine with a CUDA GPU and Python, but no ROS 2 and no
# network (the lent GPU machine: Python 3.12 + torch, cmake, a C/C++ compiler). ROS 2 comes from wheels carried
# in .whl/, the messages are built there; DDS stays on loopback throughout.
#
#   bash tools/device_node_benchmark.sh [--setup-only]
#
# Run from anywhere; it works in the repository root. Steps:
#  1. checks: Python 3.11/3.12 matching the wheels' cpXY tag, Python headers, numpy, cmake, a C and a C++ compiler;
#  2. installs .whl/*.whl (no index, no dependencies) with `pip install --prefix $PREFIX`. Not --target: pip's
#     --target drops a wheel's data/lib directory, which is where the ROS wheels keep their shared libraries;
#  3. rewrites the build-machine include paths in the wheels' CMake files (/opt/python/cpXY-cpXY/...) to this
#     Python's and numpy's own, as tools/bootstrap.sh does for the venv;
#  4. builds msg/ (ActionChunk, PolicyStatus) with the repository's CMakeLists.txt into $MSG_PREFIX;
#  5. sets PYTHONPATH (repository first), LD_LIBRARY_PATH, AMENT_PREFIX_PATH, and the loopback DDS settings of
#     flashrt_ros.loopback_dds (LOCALHOST discovery, loopback-only Fast DDS profile, a random domain id); the
#     benchmark and the tests apply them again themselves before rclpy starts;
#  6. records a machine trace (tools/machine_trace.py: CPU steal, page faults, memory) and a memory probe, runs
#     `tools/benchmark_node_overhead.py --device $BENCH_DEVICE --duration $BENCH_DURATION --output
#     $OUT/node_overhead_h200.md --raw-output $OUT/node_overhead_h200_raw.json`, with CPU_CONTROL=1 the same
#     with --device cpu (same machine and transport, inference on the CPU) into node_overhead_h200_cpu.md,
#     and (unless RUN_TESTS=0) `pytest -q test/ros/test_node_gpu.py`, logs under $OUT;
#  7. prints a summary table last (also $OUT/summary.txt).
#
# $OUT defaults to test_output/device_node_benchmark. Files there: env.txt (GPU, driver, versions, memory),
# setup.log, benchmark.log, memory_probe.txt, machine_trace.tsv + machine_trace_summary.md, stalls.txt,
# node_overhead_h200.md + node_overhead_h200_raw.json (one pair per A/B run, + *_threads.txt with
# WATCH_THREADS=1), pytest.log, summary.txt. The device returns at most 8 files a call: at the end everything but
# the reports (*.md) and summary.txt is packed into logs.tgz.
#
# The wheel set (.whl/, git-ignored, 107 wheels, ~45 MB) is made on a machine with PyPI access, for the
# device's Python:
#   pip wheel --no-deps empy==4.2.1 -w /tmp/empy        # empy is published as an sdist only
#   pip download -d .whl --find-links /tmp/empy --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --only-binary=:all: ros-kilted-rclpy ros-kilted-rcl-lifecycle ros-kilted-rmw-fastrtps-cpp \
#     ros-kilted-builtin-interfaces ros-kilted-std-msgs ros-kilted-sensor-msgs ros-kilted-lifecycle-msgs \
#     ros-kilted-diagnostic-msgs ros-kilted-trajectory-msgs ros-kilted-rosgraph-msgs \
#     ros-kilted-rosidl-default-generators ros-kilted-rosidl-core-generators ros-kilted-ament-cmake \
#     ros-kilted-ament-cmake-python ros-kilted-ament-package ros-kilted-ament-cmake-include-directories \
#     ros-kilted-ament-cmake-ros-core catkin-pkg          # catkin-pkg: ament_cmake reads package.xml with it
#   rm .whl/numpy-* .whl/pyyaml-* .whl/setuptools-* .whl/typing_extensions-* .whl/packaging-* \
#     .whl/pyparsing-* .whl/python_dateutil-* .whl/tzdata-*      # the device's own are used
# and carried with the run: run(command="bash tools/device_node_benchmark.sh", carry=[".whl"]).
#
# Environment (defaults): FLASHRT_PYTHON (python3), FLASHRT_WHEELS (.whl), FLASHRT_ROS_PREFIX (/tmp/site),
# FLASHRT_MSG_PREFIX (/tmp/flashrt_msgs), BENCH_DEVICE (cuda), BENCH_DURATION (30), BENCH_TIMEOUT (240),
# TEST_TIMEOUT (130), CPU_CONTROL (0), CPU_DURATION (20), RUN_TESTS (1), GC_AB (0: 1 adds a run with --no-gc-freeze),
# YIELD_AB (0: 1 adds a run with --no-yield), HEAP_AB (0: 1 adds a run with --no-heap-reuse),
# HANDOVER_AB (0: 1 adds a run with the hand-over wait off, --handover-timeout 0),
# SERIALIZED_AB (0: 1 adds a run whose feeder publishes pre-serialized CDR frames, --feeder-serialized),
# EXECUTOR_AB (empty; "multi_threaded": one more run per executor named),
# STOP_AB (0: 1 adds tools/benchmark_configure_stop.py on a full-size pi0.5 at $FLASHRT_FULL_CKPT_ROOT/pi05, made
# there if missing: SIGINT STOP_DELAYS seconds ("5 15 25") into the configure, configure_stop_h200.md),
# WATCH_THREADS (0: 1 logs the node's busy threads, with WATCH_BACKTRACES (2) native stack dumps), OUT.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
SETUP_ONLY=0
[ "${1:-}" = "--setup-only" ] && SETUP_ONLY=1
PY="$(command -v "${FLASHRT_PYTHON:-python3}")"
WHEELS="${FLASHRT_WHEELS:-$REPO/.whl}"
PREFIX="${FLASHRT_ROS_PREFIX:-/tmp/site}"
MSG_PREFIX="${FLASHRT_MSG_PREFIX:-/tmp/flashrt_msgs}"
BENCH_DEVICE="${BENCH_DEVICE:-cuda}"
BENCH_DURATION="${BENCH_DURATION:-30}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-240}"
TEST_TIMEOUT="${TEST_TIMEOUT:-130}"
OUT="${OUT:-$REPO/test_output/device_node_benchmark}"
mkdir -p "$OUT"
SETUP_LOG="$OUT/setup.log"
REPORT="$OUT/node_overhead_h200.md"
: >"$SETUP_LOG"
T0=$SECONDS
declare -a SUMMARY=()
log() { printf '[device_node_benchmark %3ds] %s\n' "$((SECONDS - T0))" "$*" | tee -a "$SETUP_LOG" >&2; }
row() { SUMMARY+=("$(printf '| %-34s | %-7s | %s |' "$1" "$2" "$3")"); }
print_summary() {
  {
    echo
    echo "| step | status | detail |"
    echo "|---|---|---|"
    printf '%s\n' "${SUMMARY[@]}"
  } | tee "$OUT/summary.txt"
}
fail() { log "FAILED: $2"; row "$1" FAIL "$2"; print_summary; exit 1; }

# 1. What this machine has.
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -srm); $(nproc) cores"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import sys, platform; print("python", platform.python_version(), sys.executable)'
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1
  "$PY" -c 'import triton; print("triton", triton.__version__)' 2>&1
  "$PY" -c 'import numpy; print("numpy", numpy.__version__)' 2>&1
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "cc: $( (cc --version || gcc --version) 2>/dev/null | head -1)"
  echo "c++: $( (c++ --version || g++ --version) 2>/dev/null | head -1)"
  echo "memory: $(free -m 2>/dev/null | awk '/Mem:/{print $2 " MiB total, " $7 " MiB available"}'); /dev/shm: $(df -h /dev/shm 2>/dev/null | awk 'NR==2{print $2 " size, " $4 " free"}')"
  echo "net.core.rmem_max: $(cat /proc/sys/net/core/rmem_max 2>/dev/null); loadavg: $(cat /proc/loadavg)"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >&2

pytag="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
case "$pytag" in cp311|cp312) ;; *) fail "python" "$pytag: the ROS 2 Kilted wheels exist for cp311 and cp312 only";; esac
ls "$WHEELS"/*.whl >/dev/null 2>&1 || fail "wheels" "no wheels in $WHEELS (carry .whl)"
ls "$WHEELS"/ros_rclpy-*-"$pytag"-*.whl >/dev/null 2>&1 || fail "wheels" "no $pytag rclpy wheel in $WHEELS"
missing=""
command -v cmake >/dev/null || missing+=" cmake"
command -v cc >/dev/null || command -v gcc >/dev/null || missing+=" cc/gcc"
command -v c++ >/dev/null || command -v g++ >/dev/null || missing+=" c++/g++"
[ -z "$missing" ] || fail "build tools" "missing:$missing"
py_include="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[ -f "$py_include/Python.h" ] || fail "build tools" "no Python.h in $py_include"
np_include="$("$PY" -c 'import numpy; print(numpy.get_include())')" || fail "build tools" "numpy does not import"
if command -v ninja >/dev/null; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi
row "machine" ok "$(grep -m1 -iE 'H200|H100|NVIDIA' "$OUT/env.txt" || echo "no nvidia-smi"); $pytag"

# 2. The ROS 2 wheels.
log "installing $(ls "$WHEELS"/*.whl | wc -l) wheels into $PREFIX"
rm -rf "$PREFIX"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --prefix "$PREFIX" "$WHEELS"/*.whl >>"$SETUP_LOG" 2>&1 || fail "wheels" "pip install failed (setup.log)"
ROS_SITE="$(dirname "$(find "$PREFIX" -path '*-packages/rclpy/__init__.py' | head -1)")"
ROS_SITE="${ROS_SITE%/rclpy}"
[ -d "$ROS_SITE" ] && [ -f "$PREFIX/lib/librcl.so" ] || fail "wheels" "rclpy or lib/librcl.so missing under $PREFIX"
row "wheels" ok "$(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) -> $PREFIX"

# 3. Build-machine include paths in the wheels' CMake files -> this Python's and numpy's.
{ grep -rlE '/opt/python/cp3[0-9]+-cp3[0-9]+/' "$PREFIX/share" --include='*.cmake' 2>/dev/null || true; } | while read -r f; do
  sed -i -E \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/_core/include#${np_include}#g" \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/core/include#${np_include}#g" \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${py_include}#g" "$f"
done

ros_libs="$PREFIX/lib"
for d in "$ROS_SITE"/ros_*.libs; do [ -d "$d" ] && ros_libs+=":$d"; done
export PYTHONPATH="$ROS_SITE${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$ros_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export AMENT_PREFIX_PATH="$PREFIX" CMAKE_PREFIX_PATH="$PREFIX"
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1      # the wheels' .pth re-exec hook is not on this path; set here instead

# 4. The messages.
BUILD_DIR="$MSG_PREFIX.build"
rm -rf "$BUILD_DIR" "$MSG_PREFIX"
log "building msg/ ($GENERATOR) into $MSG_PREFIX"
cmake -S "$REPO" -B "$BUILD_DIR" -G "$GENERATOR" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_INSTALL_PREFIX="$MSG_PREFIX" \
  -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$PY" -DCMAKE_BUILD_TYPE=Release >>"$SETUP_LOG" 2>&1 \
  || fail "messages" "cmake configure failed (setup.log)"
cmake --build "$BUILD_DIR" -j "$(nproc)" >>"$SETUP_LOG" 2>&1 || fail "messages" "build failed (setup.log)"
cmake --install "$BUILD_DIR" >>"$SETUP_LOG" 2>&1 || fail "messages" "install failed (setup.log)"
MSG_SITE="$(find "$MSG_PREFIX" -path '*-packages/flashrt_ros/msg/__init__.py' | head -1)"
MSG_SITE="${MSG_SITE%/flashrt_ros/msg/__init__.py}"
[ -d "$MSG_SITE" ] || fail "messages" "no flashrt_ros/msg installed under $MSG_PREFIX"
export PYTHONPATH="$REPO:$MSG_SITE:$PYTHONPATH"
export LD_LIBRARY_PATH="$MSG_PREFIX/lib:$LD_LIBRARY_PATH"
export AMENT_PREFIX_PATH="$MSG_PREFIX:$AMENT_PREFIX_PATH"
row "messages" ok "ActionChunk, PolicyStatus built in $((SECONDS - T0)) s since start"

# 5. Loopback DDS for everything started from here on (the benchmark and conftest.py apply it again).
eval "$("$PY" -c '
import shlex, sys
from flashrt_ros.loopback_dds import loopback_dds_environment
for k, v in loopback_dds_environment(sys.argv[1]).items():
    print(f"export {k}={shlex.quote(v)}")' /tmp/flashrt_dds)" || fail "loopback DDS" "could not write the loopback settings"
[ "${ROS_AUTOMATIC_DISCOVERY_RANGE:-}" = LOCALHOST ] && [ -f "${FASTDDS_DEFAULT_PROFILES_FILE:-}" ] \
  || fail "loopback DDS" "loopback settings not in effect"
export FLASHRT_CACHE_DIR="${FLASHRT_CACHE_DIR:-/tmp/flashrt_cache}"
env | grep -E '^(ROS_|FASTDDS_|RMW_|AMENT_PREFIX_PATH|PYTHONPATH|LD_LIBRARY_PATH)' | sort >>"$SETUP_LOG"

"$PY" - >>"$SETUP_LOG" 2>&1 <<'EOF' || fail "import check" "rclpy / flashrt_ros.msg / a loopback node failed (setup.log)"
import os
assert os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
import rclpy
from rclpy.lifecycle import LifecycleNode
from flashrt_ros.msg import ActionChunk, PolicyStatus
import flashrt_core, flashrt_ros.policy_node
rclpy.init()
node = LifecycleNode("device_import_check")
pub = node.create_publisher(ActionChunk, "device_import_check", 1)
pub.publish(ActionChunk(sequence=1))
node.destroy_node()
rclpy.shutdown()
print("import check ok:", rclpy.__file__, ActionChunk.__module__)
EOF
row "import check" ok "rclpy, flashrt_ros.msg, LifecycleNode on domain $ROS_DOMAIN_ID (LOCALHOST)"
log "setup done"

if [ "$SETUP_ONLY" = 1 ]; then print_summary; exit 0; fi

# 6. The benchmark (+ the CPU control), then the GPU node tests.
status=0
pick() { grep -F "| $2 |" "$1" | head -1 | awk -F'|' '{gsub(/ /,"",$3); gsub(/ /,"",$4); print "median " $3 ", p99 " $4 " ms"}'; }
bench() {   # device duration report raw [extra benchmark arguments]
  log "benchmark: --device $1 --duration $2 ${*:5}"
  timeout -k 10 "$BENCH_TIMEOUT" "$PY" tools/benchmark_node_overhead.py --device "$1" --duration "$2" \
    --output "$3" --raw-output "$4" "${@:5}" >>"$OUT/benchmark.log" 2>&1 &
  local bench_pid=$! watcher=""
  if [ "${WATCH_THREADS:-0}" = 1 ]; then
    # Once the measured feeder runs (the node is active), log the node's busy threads with native stacks.
    (
      for _ in $(seq 600); do pgrep -f -- "--feeder --duration $2" >/dev/null && break; sleep 0.2; done
      sleep 3
      node_pid="$(pgrep -P "$bench_pid" | head -1)"      # the benchmark under `timeout`: the node's process
      [ -n "$node_pid" ] && exec "$PY" tools/machine_trace.py --watch-pid "$node_pid" --interval 0.5 --busy 0.9 \
        --backtraces "${WATCH_BACKTRACES:-2}" --output "${3%.md}_threads.txt"
    ) &
    watcher=$!
  fi
  wait "$bench_pid"
  local rc=$?
  [ -n "$watcher" ] && { kill "$watcher" 2>/dev/null; pkill -f -- "--watch-pid" 2>/dev/null; wait "$watcher" 2>/dev/null; }
  if [ $rc = 0 ] && [ -f "$3" ]; then
    row "benchmark --device $1 ${*:5}" ok "$(grep -m1 -o '[0-9]* chunks measured' "$3"), $(grep -m1 -o '[0-9]* observations completed' "$3"), $(grep -m1 -o 'device `[^`]*`' "$3")"
    row "  overhead = staleness - inference" "" "$(pick "$3" 'overhead = staleness - inference')"
    row "  staleness" "" "$(pick "$3" staleness)"
    row "  inference time" "" "$(pick "$3" 'inference time')"
    row "  queue wait" "" "$(pick "$3" 'queue wait (node statistics)')"
    row "  node code (conversion + build)" "" "$(pick "$3" 'node code: conversion + message build (node statistics)')"
    row "  input latency (transport)" "" "$(pick "$3" 'input latency: capture -> observation complete in the node (node statistics)')"
    row "  in node" "" "$(pick "$3" 'in node = overhead - input latency (node statistics)')"
    row "  transport floor (no node)" "" "$(pick "$3" 'transport floor: capture -> later frame of a pair, plain subscriber, no node')"
    row "  transport floor, heap reuse" "" "$(pick "$3" 'transport floor, frame buffers kept on the heap (keep_large_buffers_on_heap)')"
    row "  full GC pauses" "" "$(pick "$3" 'full Python garbage collections, pause (node statistics)')"
  else
    status=1
    row "benchmark --device $1 ${*:5}" FAIL "exit $rc$([ $rc = 124 ] && echo ' (timeout)'); benchmark.log: $(tail -1 "$OUT/benchmark.log" | cut -c1-120)"
  fi
}
: >"$OUT/benchmark.log"
# The machine's side of the story: CPU steal, page faults and memory size while the benchmark runs, and how fast
# fresh and reused memory can be written (a VM that hands freed memory back to its host makes fresh pages slow).
"$PY" tools/machine_trace.py --memory-probe 1024 >"$OUT/memory_probe.txt" 2>&1
row "memory probe" "" "$(sed -n '1p;4p;5p;9p' "$OUT/memory_probe.txt" | tr '\n' ';' | cut -c1-200)"
"$PY" tools/machine_trace.py --output "$OUT/machine_trace.tsv" --interval 0.25 &
TRACE_PID=$!
bench "$BENCH_DEVICE" "$BENCH_DURATION" "$REPORT" "$OUT/node_overhead_h200_raw.json"
for kind in ${EXECUTOR_AB:-}; do
  # The same run with another executor for the node (multi_threaded).
  bench "$BENCH_DEVICE" "$BENCH_DURATION" "$OUT/node_overhead_h200_$kind.md" "$OUT/node_overhead_h200_${kind}_raw.json" \
    --executor "$kind"
done
if [ "${YIELD_AB:-0}" = 1 ]; then
  # The same run with the hand-over of the GIL to the inference thread off (yield_to_inference_thread=false).
  bench "$BENCH_DEVICE" "$BENCH_DURATION" "$OUT/node_overhead_h200_no_yield.md" \
    "$OUT/node_overhead_h200_no_yield_raw.json" --no-yield
fi
if [ "${HANDOVER_AB:-0}" = 1 ]; then
  # The same run without the callback's wait until the idle inference thread took the observation (default on).
  bench "$BENCH_DEVICE" "$BENCH_DURATION" "$OUT/node_overhead_h200_no_handover.md" \
    "$OUT/node_overhead_h200_no_handover_raw.json" --handover-timeout 0
fi
if [ "${SERIALIZED_AB:-0}" = 1 ]; then
  # The same run with the camera feeder publishing CDR serialized once (stamp patched per frame): the trip a C++
  # camera driver's frames would take, without rclpy's Python message conversion on the sender.
  bench "$BENCH_DEVICE" "$BENCH_DURATION" "$OUT/node_overhead_h200_serialized_feeder.md" \
    "$OUT/node_overhead_h200_serialized_feeder_raw.json" --feeder-serialized
fi
if [ "${HEAP_AB:-0}" = 1 ]; then
  # The same run with the node's mallopt step off (keep_large_buffers_on_heap=false).
  bench "$BENCH_DEVICE" "$BENCH_DURATION" "$OUT/node_overhead_h200_no_heap_reuse.md" \
    "$OUT/node_overhead_h200_no_heap_reuse_raw.json" --no-heap-reuse
fi
if [ "${GC_AB:-0}" = 1 ]; then
  # The same run with the node's gc.freeze step off (freeze_gc_after_configure=false).
  bench "$BENCH_DEVICE" "$BENCH_DURATION" "$OUT/node_overhead_h200_no_gc_freeze.md" \
    "$OUT/node_overhead_h200_no_gc_freeze_raw.json" --no-gc-freeze
fi
kill "$TRACE_PID" 2>/dev/null; wait "$TRACE_PID" 2>/dev/null
"$PY" tools/machine_trace.py --summary "$OUT/machine_trace.tsv" >"$OUT/machine_trace_summary.md" 2>&1
row "machine trace" "" "$(head -1 "$OUT/machine_trace_summary.md" | cut -c1-200)"
for f in "$OUT"/node_overhead_h200*.md; do grep -E '^- (Node|Feeder) process' "$f" | sed "s#^#$(basename "$f"): #" ; done >"$OUT/stalls.txt"
if [ "${CPU_CONTROL:-0}" = 1 ]; then
  bench cpu "${CPU_DURATION:-20}" "$OUT/node_overhead_h200_cpu.md" "$OUT/node_overhead_h200_cpu_raw.json"
fi

if [ "${STOP_AB:-0}" = 1 ]; then
  # SIGINT during the configure of a full-size pi0.5 on the GPU (checkpoint read, load-time tuning, captures, each
  # stopping between its steps): seconds to exit, beside the configure without a signal.
  ckpt="${FLASHRT_FULL_CKPT_ROOT:-/tmp/full}/pi05"
  [ -f "$ckpt/flashrt_config.json" ] || "$PY" -m flashrt_core.fixtures "$ckpt" --config pi05 >>"$SETUP_LOG" 2>&1
  log "configure stop: $ckpt on $BENCH_DEVICE"
  timeout -k 10 "${STOP_TIMEOUT:-420}" "$PY" tools/benchmark_configure_stop.py --checkpoint "$ckpt" \
    --device "$BENCH_DEVICE" --delays ${STOP_DELAYS:-5 15 25} --output "$OUT/configure_stop_h200.md" \
    >"$OUT/configure_stop.log" 2>&1
  rc=$?
  row "configure stop" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
    "$(grep -m1 'without a signal' "$OUT/configure_stop_h200.md" 2>/dev/null | cut -c1-160)"
fi

if [ "${RUN_TESTS:-1}" = 1 ]; then
  log "pytest test/ros/test_node_gpu.py"
  timeout -k 10 "$TEST_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider test/ros/test_node_gpu.py >"$OUT/pytest.log" 2>&1
  rc=$?
  result="$(grep -E '(passed|failed|skipped|error)' "$OUT/pytest.log" | tail -1)"
  if [ $rc = 0 ] && ! grep -q skipped <<<"$result"; then
    row "test/ros/test_node_gpu.py" ok "$result"
  else
    status=1
    row "test/ros/test_node_gpu.py" FAIL "exit $rc: ${result:-see pytest.log}"
  fi
fi
row "total" "" "$((SECONDS - T0)) s"
print_summary
# The device returns 8 files a call: the reports (*.md) and summary stay, the logs and raw data this script writes
# (*.json, *.log, *.tsv, *.txt) go into one archive; nothing else in $OUT is touched.
logs=()
while IFS= read -r -d '' f; do logs+=("$f"); done < <(find "$OUT" -maxdepth 1 -type f \
  \( -name '*.json' -o -name '*.log' -o -name '*.tsv' -o -name '*.txt' \) ! -name summary.txt -printf '%f\0')
if ((${#logs[@]})); then
  tar czf "$OUT/logs.tgz" -C "$OUT" --remove-files -- "${logs[@]}"
fi
exit $status
