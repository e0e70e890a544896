#!/usr/bin/env bash
# The engine's open GPU checks, in parts that each fit one device call (<= 10 minutes with the machine's start):
#
#   OUT=/path bash tools/device_engine_checks.sh kernels      # GPU kernel tests + Policy GPU tests, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh engine-new   # the tuning cache's and the chain tuning's tests, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh engine-rest  # the other engine tests but the gates, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh engine-gates # the gates of the defaults and switches, ~7.5 min
#   OUT=/path bash tools/device_engine_checks.sh engine-gates-forced  # TMA GEMMs forced, FP8 opt-ins, ~3.5 min
#   OUT=/path bash tools/device_engine_checks.sh bench        # engine A/B rows + one replay's critical path, ~5 min
#   OUT=/path bash tools/device_engine_checks.sh grid-pi05    # pi0.5, 2 views, h10 / h50, bf16 / FP8, gated, ~6 min
#   OUT=/path bash tools/device_engine_checks.sh grid-pi0     # the same for pi0, ~6 min
#   OUT=/path bash tools/device_engine_checks.sh gemms        # the wide GEMMs in every form, ~3-6 min
#   OUT=/path bash tools/device_engine_checks.sh load         # engine load: tuning cache off / stored / read, ~1.5 min
#   OUT=/path bash tools/device_engine_checks.sh buckets      # replay time per text bucket, bf16 and FP8, ~4.5 min
#   OUT=/path bash tools/device_engine_checks.sh host         # Policy.predict's host and GPU segments, ~5 min
#   OUT=/path bash tools/device_engine_checks.sh h50          # horizon 50's defaults: tests, A/B rows, ~6.5 min
#   OUT=/path bash tools/device_engine_checks.sh overlap      # the first step beside the prefix: A/B rows, ~7 min
#   OUT=/path bash tools/device_engine_checks.sh tune         # tune_engine.py: best of 3 loads stored, ~5 min
#   OUT=/path bash tools/device_engine_checks.sh compile-cells  # the compiled reference at 2 more cells, ~6-9 min
#   OUT=/path bash tools/device_engine_checks.sh fast         # pi0-FAST: engine GPU tests, then reference vs engine
#   OUT=/path bash tools/device_engine_checks.sh groot        # GR00T N1.6: graph GPU tests, then reference vs graph, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh groot-profile  # GR00T N1.6's phases kernel by kernel
#   OUT=/path bash tools/device_engine_checks.sh groot-warm-up  # GR00T N1.6's prompt-length warm-up, timed
#   OUT=/path bash tools/device_engine_checks.sh layer-chain  # what one dependency between layers costs
#   OUT=/path bash tools/device_engine_checks.sh denoise-ablation  # the denoise with each kind of kernel left out
#   OUT=/path bash tools/device_engine_checks.sh streamed-chain  # the expert's GEMM chain as one CUDA C++ kernel
#   OUT=/path bash tools/device_engine_checks.sh rtc          # real-time chunking in the graph: tests, cost, ~3 min
#   OUT=/path bash tools/device_engine_checks.sh              # kernels to bench, where one call has the time
#
# The times are measured on the H200 or estimated (grid-*): the interleaved chain tuning takes ~17-20 s per pass of a full-size engine load (two passes by default; the tests
# whose checks do not depend on its picks run one, test_engine_gpu.py ONE_PASS). The engine parts print each test's duration (--durations=0) to check them.
# kernels: every kernel at real shapes (the skinny and shared-memory TMA GEMM candidates, GeGLU with an FP8 out;
#   both PDL modes), the Policy GPU tests and the resize on the GPU (pytest_kernels.log).
# engine-new: the tuning cache's tests, the chain tuning and its interleaved timer (pytest_engine_new.log).
# engine-rest: the rest of test_engine_gpu.py but the gates: replay, the fusion switches, the vision attention
#   backends, builds and a capture stopped midway (flashrt_core.stopping) (pytest_engine_rest.log).
# engine-gates: the accuracy gates of pi0.5 and pi0 on the defaults, bf16 and FP8, and of the switches that turn
#   a default off (pytest_engine_gates.log; ten gates, 7.6 min on a warm machine);
#   engine-gates-forced: the gates with the TMA GEMMs forced (16 rows, and the ring kernel at 51), with the TMA
#   GEMMs off, with the prefix attention forced to kernels/flashrt_kernels/prefix_attention.py
#   (pytest_engine_gates_forced.log).
# Every pytest log is verbose (-v), so a part cut off by its time limit still names the tests that ran.
# bench: pi0.5 2 views h10, bf16 and FP8 on the defaults, beside the A/B rows of the wgmma prefix attention left
#   out of the tuning (bf16, no_prefix_attention_wgmma): three engines of ~45-90 s load each
#   (engine_device_checks_<date>.json/.md, engine.log); then the critical path per kernel of one bf16 replay
#   (timeline.json, timeline.log: per kernel, what runs before the vision tower, one vision layer, one denoising
#   layer), and again with 480x640 camera frames resized inside the graph (timeline_480x640.*: the resize's cost).
# grid-pi05, grid-pi0: the regression grid of a refactor: tools/benchmark_engine.py on one model at 2 views,
#   horizons 10 and 50, bf16 and FP8, the accuracy gate of both precisions first (3 observations, 1-3 views, the
#   fp32 reference), no A/B rows; the tuning cache under /tmp lets the timed engine at the gate's horizon read the
#   gate engine's picks (engine_grid_<config>_<date>.json/.md, grid_<config>.log).
# gemms: tools/benchmark_wide_gemms.py at 2 views: the vision and prefix GEMMs as F.linear, with the bias apart,
#   addmm, the engine's epilogues, FP8 per-tensor and Inductor's autotuned Triton templates, and the vision MLP
#   with its width 4304 padded to 4352 and 4608 (wide_gemms.json/.log); then every algorithm cuBLASLt's heuristic
#   offers for the engine's wide GEMM shapes, timed against torch's call (tools/benchmark_cublaslt_algorithms.py:
#   cublaslt_algorithms.json/.log).
# load: tools/benchmark_policy_predict.py --tuning-cache: pi0.5 loaded with the tuning cache off, then on twice (the
#   first measures and stores the picks, the second reads them), the load seconds and Policy.predict after each
#   (policy_predict_*_tuning_cache.json/.md, load.log; the entry itself under tuning_cache/).
# host: tools/benchmark_policy_predict.py --host-unnormalize --host-trace 30: pi0.5 with the GPU resize and the
#   actions unnormalized inside the graph (the default), then unnormalized on the host after the copy out
#   (gpu_unnormalize=False), then with the host resize (under 5 min on a fresh machine);
#   200 timed calls each, then 30 traced calls split into
#   the host's work before the GPU, the copy in, the wait for the graph launch, the replay, the copy out and the
#   host after it, and the host steps timed alone and in line (policy_predict_*.json/.md, host.log).
# h50: kernels/flashrt_kernels/smem_gemm.py's ring kernel (17-64 rows, EngineOptions.smem_gemm_rows) and pi0's fused step ends
#   (EngineOptions.fused_denoise_step_pi0), both defaults: their kernel tests alone
#   (pytest_rows_kernel.log), then, if all six passed, pi0.5 and pi0 (bf16) at horizon 50 with each of them off
#   too (engine_h50_pi05_*, engine_h50_pi0_*, h50.log); their gates are in engine-gates-forced and engine-gates.
# overlap: the first denoising step beside the prefix on a second stream (EngineOptions.overlap_first_step, the
#   default): pi0.5 2 views h10 bf16 and FP8 with it and without it (engine_overlap_*,
#   overlap.log), then pi0.5 2 views h50 bf16 both ways (engine_overlap_h50_*, overlap_h50.log). Its tiny
#   two-stream capture test is in engine-rest, its gates (on and off) in engine-gates.
# tune: tools/tune_engine.py on pi0.5 (2 views, 480x640 frames, bf16): three loads with the tuning measured, their
#   graphs timed in turn, the fastest load's picks stored in $OUT/tuning_cache, then a load from that entry timed
#   (tune_engine.json, tune.log): whether the spread between loads comes from the picks.
# compile-cells: torch.compile(mode="max-autotune") of the reference path, layer by layer, at the cells of the grid
#   that have no compiled row yet (the compiled rows exist for the two 2-view horizon-10 cells only), beside an eager
#   row per cell in the same run, no engines (--references-only --compile-grid). The cells are $COMPILE_CONFIGS x
#   $COMPILE_VIEWS x $COMPILE_HORIZONS (default pi05 x 1 x "10 50"), a view count's horizons in turn: the second
#   can take the vision tower's and the prefix's graphs from inductor's disk cache (~150 of one measured run's 187 s of
#   compilation), so two cells should fit a call (estimated). Each cell runs within 300 s and what is left of the
#   call's 540 s (engine_compile_cells_*.json/.md with each cell's compilation time and cache lookups,
#   compile_cells.log, one compile_<cell>_layers.log per cell).
# buckets: tools/benchmark_text_buckets.py: pi0.5 2 views with a graph per 16-token text bucket, bf16 and FP8, all
#   graphs timed in turn (text_buckets_*.json/.md, buckets.log): what a prompt pays for the padding of its bucket.
# fast: pi0-FAST's GPU tests (test/gpu/test_fast_decode_gpu.py, test/core/test_pi0_fast.py: graphs vs eager ops,
#   the teacher-forced logits gate, the planted chunk through load_model's engine; pytest_fast.log), then
#   tools/benchmark_pi0_fast.py on the full-size preset at 2 views, a 50-token chunk: reference and engine in one
#   process (pi0_fast_cuda_pi0fast_<date>.json, fast.log).
# groot: GR00T N1.6's GPU tests (test/core/test_groot_graph_gpu.py, test/core/test_groot_gpu.py: the graph against
#   the reference, the bf16 and FP8 gates at the released size; test/core/test_groot_vision_gpu.py: the engine
#   vision's tokens against transformers' at the released vision sizes, both graphs timed; pytest_groot.log),
#   then tools/benchmark_groot.py: reference, graph and FP8 graph at 2 views 224x224 in one process, phase times,
#   cosines against fp32 and the GR00T gate of the bf16 and FP8 graphs (groot_<date>.json, groot.log), then
#   tools/benchmark_groot_language_ops.py: the language model's ops alone at the padded prompt's rows, in each form
#   the engine picks between (groot_language_ops_<date>.json, groot_language_ops.log).
# groot-warm-up: tools/benchmark_groot_warm_up.py: a released-size random checkpoint loaded as the node loads it,
#   its first predict, GrootPolicy.warm_up_text_buckets (each capture timed), then instructions of several lengths
#   that must replay, each predict timed whole and as its host part (prepare_inputs) and its executor part
#   (sample_actions) (groot_warm_up_<date>.json, groot_warm_up.log).
# groot-profile: tools/profile_groot.py: the released-size graph's vision, language and action-head graphs, each
#   replayed under torch.profiler, their kernels summed by name (groot_profile_<date>.json, groot_profile.log).
# layer-chain: the GPU tests of kernels/flashrt_kernels/layer_chain.py and kernels/flashrt_kernels/partial_sums.py
#   (pytest_layer_chain.log; they run in kernels too), then tools/benchmark_layer_chain.py: 180 dependent layers at
#   the expert's width launched per layer (stream order, PDL, early trigger, library GEMM) and as one persistent
#   kernel waiting on counters (layer_chain_<date>.json, layer_chain.log); then tools/benchmark_partial_sums.py:
#   128 programs folding their partials into one activation per layer (partial_sums_<date>.json, partial_sums.log).
# denoise-ablation: tools/benchmark_denoise_ablation.py on full-size pi0.5, 2 views, horizon 10, bf16 then FP8: the
#   denoise captured alone, whole and with each kind of its per-layer kernels left out: the most that fusing each
#   kind away can save (denoise_ablation_pi05_<precision>_<date>.json, denoise_ablation_<precision>.log).
# streamed-chain: the GPU tests of kernels/flashrt_kernels/cuda/handover_chain.cu and streamed_gemm_chain.cu (built
#   by nvcc; their log pytest_streamed_chain.log; they run in kernels too), then tools/benchmark_handover_chain.py:
#   the chain's hand-over alone with 0-80 KB read per CTA after it, also in clusters and by slices
#   (handover_chain_<date>.json, handover_chain.log), then tools/benchmark_streamed_gemm_chain.py: the expert's
#   four GEMMs per layer over 180 layers as the persistent kernel (the MLP's two as one paired step and apart, with
#   and without its waits, with its weight copies, its A loads and products, or its products alone left out, and
#   with one layer's weights for all; with the A window alone and in clusters, without the atomics, with the
#   cluster sum) and as PyTorch ops, in one process, then the trace of steps 270-333 (layers 90-111) in five forms
#   (streamed_gemm_chain_<date>.json, streamed_chain.log).
# rtc: test/gpu/test_engine_rtc_gpu.py (every engine RTC mode in the graph against the eager engine and the
#   reference sampler; pytest_rtc.log), then tools/benchmark_rtc.py: each mode's replay beside the plain graph on
#   full-size pi0.5 (rtc_cost_pi05_<date>.json, rtc.log).
# A short table last (summary.txt). Each step has its own time limit, so a step that hangs still leaves the
# others' results. Full-size random checkpoints are generated into $FLASHRT_FULL_CKPT_ROOT (default /tmp/full).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-test_output/device_engine_checks}"
PART="${1:-all}"
PARTS="all kernels engine-new engine-rest engine-gates engine-gates-forced bench grid-pi05 grid-pi0 gemms load buckets
  host h50 overlap tune compile-cells fast groot groot-profile groot-warm-up layer-chain denoise-ablation streamed-chain rtc"
case " $(echo $PARTS) " in
  *" $PART "*) ;;
  *) echo "device_engine_checks.sh: no part named '$PART'; the parts: $(echo $PARTS)" >&2; exit 2;;
esac
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export FLASHRT_FULL_CKPT_ROOT="${FLASHRT_FULL_CKPT_ROOT:-/tmp/full}"
PY="${FLASHRT_PYTHON:-python3}"

NEW="tuning_cache or chain_tuning"
if [ "$PART" = kernels ] || [ "$PART" = all ]; then
  timeout 480 "$PY" -m pytest -v --durations=0 test/gpu/test_kernels.py test/gpu/test_policy_gpu.py \
    test/core/test_preprocess.py > "$OUT/pytest_kernels.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_kernels.log"
fi

if [ "$PART" = engine-new ] || [ "$PART" = all ]; then
  timeout 480 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py -k "$NEW" \
    > "$OUT/pytest_engine_new.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_engine_new.log"
fi

if [ "$PART" = engine-rest ] || [ "$PART" = all ]; then
  timeout 520 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py \
    -k "not ($NEW) and not accuracy_gate" \
    > "$OUT/pytest_engine_rest.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_engine_rest.log"
fi

if [ "$PART" = engine-gates ] || [ "$PART" = all ]; then
  timeout 520 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py \
    -k "accuracy_gate and not (smem_gemm or prefix_attention_wgmma)" \
    > "$OUT/pytest_engine_gates.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_engine_gates.log"
fi

if [ "$PART" = engine-gates-forced ] || [ "$PART" = all ]; then
  timeout 400 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py \
    -k "accuracy_gate and (smem_gemm or prefix_attention_wgmma)" \
    > "$OUT/pytest_engine_gates_forced.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_engine_gates_forced.log"
fi

if [ "$PART" = bench ] || [ "$PART" = all ]; then
  # the tuning cache outside $OUT (its files would not come back): the timelines' engines read the picks the
  # benchmark's bf16 engine measured, so they profile the same kernels and load in seconds
  export FLASHRT_TUNING_CACHE="${FLASHRT_TUNING_CACHE:-/tmp/flashrt_tuning_cache}"
  timeout 450 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
    --horizons 10 --fp8-configs pi05 --reference-calls 2 --no-gate \
    --ab-switches-off prefix_attention_wgmma \
    --out-dir "$OUT" --tag device_checks \
    > "$OUT/engine.log" 2>&1
  timeout 60 "$PY" tools/profile_engine_timeline.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --config pi05 \
    --views 2 --out "$OUT/timeline.json" > "$OUT/timeline.log" 2>&1
  timeout 60 "$PY" tools/profile_engine_timeline.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --config pi05 \
    --views 2 --image-hw 480 640 --out "$OUT/timeline_480x640.json" > "$OUT/timeline_480x640.log" 2>&1
fi

grid() {                              # the regression grid of one model ($1: pi05 or pi0)
  FLASHRT_TUNING_CACHE="${FLASHRT_TUNING_CACHE:-/tmp/flashrt_tuning_cache}" timeout 540 "$PY" tools/benchmark_engine.py \
    --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs "$1" --views 2 --horizons 10 50 --fp8-configs "$1" \
    --reference-calls 2 --out-dir "$OUT" --tag "grid_$1" > "$OUT/grid_$1.log" 2>&1
  echo "benchmark_engine rc=$?" >> "$OUT/grid_$1.log"
}
if [ "$PART" = grid-pi05 ]; then grid pi05; fi     # not in "all"
if [ "$PART" = grid-pi0 ]; then grid pi0; fi       # not in "all"

if [ "$PART" = gemms ]; then          # not in "all": its Inductor autotuning alone can take minutes
  timeout 480 "$PY" tools/benchmark_wide_gemms.py --views 2 --pad-vision-mlp 128 512 --out "$OUT/wide_gemms.json" \
    > "$OUT/wide_gemms.log" 2>&1
  echo "benchmark_wide_gemms rc=$?" >> "$OUT/wide_gemms.log"
  timeout 150 "$PY" tools/benchmark_cublaslt_algorithms.py --out "$OUT/cublaslt_algorithms.json" \
    > "$OUT/cublaslt_algorithms.log" 2>&1
  echo "benchmark_cublaslt_algorithms rc=$?" >> "$OUT/cublaslt_algorithms.log"
fi

if [ "$PART" = load ]; then           # not in "all": three full loads of pi0.5 and 200 calls after each
  CKPT="$FLASHRT_FULL_CKPT_ROOT/pi05"
  [ -f "$CKPT/flashrt_config.json" ] || "$PY" -m flashrt_core.fixtures "$CKPT" --config pi05 > "$OUT/load.log" 2>&1
  timeout 420 "$PY" tools/benchmark_policy_predict.py --checkpoint "$CKPT" --tuning-cache "$OUT/tuning_cache" \
    --out "$OUT" >> "$OUT/load.log" 2>&1
  echo "benchmark_policy_predict rc=$?" >> "$OUT/load.log"
fi

if [ "$PART" = host ]; then   # not in "all": three full loads of pi0.5 (the later ones read the tuning cache)
  CKPT="$FLASHRT_FULL_CKPT_ROOT/pi05"
  [ -f "$CKPT/flashrt_config.json" ] || "$PY" -m flashrt_core.fixtures "$CKPT" --config pi05 > "$OUT/host.log" 2>&1
  FLASHRT_TUNING_CACHE=/tmp/flashrt_tuning_cache timeout 420 "$PY" tools/benchmark_policy_predict.py \
    --checkpoint "$CKPT" --host-unnormalize --host-trace 30 --out "$OUT" \
    >> "$OUT/host.log" 2>&1
  echo "benchmark_policy_predict rc=$?" >> "$OUT/host.log"
fi

if [ "$PART" = buckets ]; then        # not in "all": two full loads with 13 graphs each
  timeout 420 "$PY" tools/benchmark_text_buckets.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --config pi05 --views 2 \
    --precisions bf16 fp8 --out-dir "$OUT" > "$OUT/buckets.log" 2>&1
  echo "benchmark_text_buckets rc=$?" >> "$OUT/buckets.log"
fi

if [ "$PART" = h50 ]; then            # not in "all": horizon 50's defaults against them off
  # the ring kernel's tests and pi0's step-start kernel test first, then at horizon 50 bf16: pi0.5 with and
  # without smem_gemm_rows, pi0 on the defaults, without smem_gemm_rows and without its fused step ends
  timeout 190 "$PY" -m pytest -v test/gpu/test_kernels.py -k "rows_kernel or time_mlp_in" \
    > "$OUT/pytest_rows_kernel.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_rows_kernel.log"
  if grep -q "6 passed" "$OUT/pytest_rows_kernel.log"; then
    timeout 160 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
      --horizons 50 --reference-calls 2 --no-gate --ab-switches-off smem_gemm_rows \
      --out-dir "$OUT" --tag h50_pi05 > "$OUT/h50.log" 2>&1
    echo "benchmark_engine rc=$?" >> "$OUT/h50.log"
    timeout 230 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi0 --views 2 \
      --horizons 50 --reference-calls 2 --no-gate --ab-switches-off smem_gemm_rows fused_denoise_step_pi0 \
      --out-dir "$OUT" --tag h50_pi0 >> "$OUT/h50.log" 2>&1
    echo "benchmark_engine rc=$?" >> "$OUT/h50.log"
  fi
fi

if [ "$PART" = overlap ]; then        # not in "all": overlap_first_step on and off (two streams in one graph)
  export FLASHRT_TUNING_CACHE="${FLASHRT_TUNING_CACHE:-/tmp/flashrt_tuning_cache}"
  timeout 300 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
    --horizons 10 --fp8-configs pi05 --reference-calls 2 --no-gate --ab-switches-off overlap_first_step \
    --ab-fp8-switches-off overlap_first_step --out-dir "$OUT" --tag overlap > "$OUT/overlap.log" 2>&1
  echo "benchmark_engine rc=$?" >> "$OUT/overlap.log"
  timeout 200 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
    --horizons 50 --reference-calls 2 --no-gate --ab-switches-off overlap_first_step \
    --out-dir "$OUT" --tag overlap_h50 > "$OUT/overlap_h50.log" 2>&1
  echo "benchmark_engine rc=$?" >> "$OUT/overlap_h50.log"
fi

if [ "$PART" = tune ]; then           # not in "all": tools/tune_engine.py, the best of three measured loads stored
  CKPT="$FLASHRT_FULL_CKPT_ROOT/pi05"
  [ -f "$CKPT/flashrt_config.json" ] || "$PY" -m flashrt_core.fixtures "$CKPT" --config pi05 > "$OUT/tune.log" 2>&1
  timeout 420 "$PY" tools/tune_engine.py --checkpoint "$CKPT" --tuning-cache "$OUT/tuning_cache" --loads 3 \
    --out "$OUT/tune_engine.json" >> "$OUT/tune.log" 2>&1
  echo "tune_engine rc=$?" >> "$OUT/tune.log"
fi

if [ "$PART" = compile-cells ]; then   # not in "all": the compiled reference (and an eager row) per cell
  timeout 560 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" \
    --configs ${COMPILE_CONFIGS:-pi05} --views ${COMPILE_VIEWS:-1} --horizons ${COMPILE_HORIZONS:-10 50} \
    --references-only --reference-calls 2 --no-gate --compile --compile-grid --compile-timeout 300 --deadline-s 540 \
    --out-dir "$OUT" --tag compile_cells > "$OUT/compile_cells.log" 2>&1
  echo "benchmark_engine rc=$?" >> "$OUT/compile_cells.log"
fi

if [ "$PART" = fast ]; then
  timeout 300 "$PY" -m pytest -v -s --durations=0 test/gpu/test_fast_decode_gpu.py test/core/test_pi0_fast.py \
    > "$OUT/pytest_fast.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_fast.log"
  timeout 240 "$PY" tools/benchmark_pi0_fast.py --views 2 --tokens 50 --out "$OUT" > "$OUT/fast.log" 2>&1
  echo "benchmark_pi0_fast rc=$?" >> "$OUT/fast.log"
fi

if [ "$PART" = groot ]; then
  timeout 330 "$PY" -m pytest -v -s --durations=0 test/core/test_groot_graph_gpu.py test/core/test_groot_gpu.py \
    test/core/test_groot_vision_gpu.py > "$OUT/pytest_groot.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_groot.log"
  timeout 280 "$PY" tools/benchmark_groot.py --out "$OUT" > "$OUT/groot.log" 2>&1
  echo "benchmark_groot rc=$?" >> "$OUT/groot.log"
  timeout 120 "$PY" tools/benchmark_groot_language_ops.py --out "$OUT" > "$OUT/groot_language_ops.log" 2>&1
  echo "benchmark_groot_language_ops rc=$?" >> "$OUT/groot_language_ops.log"
fi

if [ "$PART" = groot-profile ]; then
  timeout 300 "$PY" tools/profile_groot.py --out "$OUT" > "$OUT/groot_profile.log" 2>&1
  echo "profile_groot rc=$?" >> "$OUT/groot_profile.log"
fi

if [ "$PART" = layer-chain ]; then
  timeout 120 "$PY" -m pytest -v test/gpu/test_kernels.py -k "layer_chain or partial_sums" \
    > "$OUT/pytest_layer_chain.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_layer_chain.log"
  timeout 150 "$PY" tools/benchmark_layer_chain.py --out "$OUT" > "$OUT/layer_chain.log" 2>&1
  echo "benchmark_layer_chain rc=$?" >> "$OUT/layer_chain.log"
  timeout 90 "$PY" tools/benchmark_partial_sums.py --out "$OUT" > "$OUT/partial_sums.log" 2>&1
  echo "benchmark_partial_sums rc=$?" >> "$OUT/partial_sums.log"
fi

if [ "$PART" = groot-warm-up ]; then
  timeout 400 "$PY" tools/benchmark_groot_warm_up.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" \
    --out "$OUT" > "$OUT/groot_warm_up.log" 2>&1
  echo "benchmark_groot_warm_up rc=$?" >> "$OUT/groot_warm_up.log"
fi

if [ "$PART" = denoise-ablation ]; then
  for PREC in bf16 fp8; do
    timeout 240 "$PY" tools/benchmark_denoise_ablation.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --precision "$PREC" \
      --out "$OUT" > "$OUT/denoise_ablation_$PREC.log" 2>&1
    echo "benchmark_denoise_ablation rc=$?" >> "$OUT/denoise_ablation_$PREC.log"
  done
fi

if [ "$PART" = streamed-chain ]; then
  # every build of the two CUDA C++ kernels that the tests and benchmarks load, by nvcc in parallel first (one at a
  # time, on first use, they would take most of the tests' time limit)
  timeout 240 "$PY" - > "$OUT/cuda_builds.log" 2>&1 <<'EOF_BUILDS'
import importlib, time
from concurrent.futures import ThreadPoolExecutor
from flashrt_core.engine.kernel_import import load_kernels
k = load_kernels()
SGC = importlib.import_module(k.__name__ + ".streamed_gemm_chain")
CB = importlib.import_module(k.__name__ + ".cuda_build")
HC = importlib.import_module(k.__name__ + ".handover_chain")
forms = {SGC.build_macros(leave_out, trace, a_window, cluster, down_sum)
         for leave_out in ((), ("copy",), ("compute",), ("products",), ("compute", "copy"), ("consumers",),
                           ("atomics",), ("a_copy",))
         for trace in (False, True) for a_window in (False, True) for cluster in (1, 2, 4)
         for down_sum in (False, True)
         if (cluster == 1 or a_window) and not (trace and leave_out) and (a_window or "a_copy" not in leave_out)
         and (cluster == 1 or leave_out in ((), ("atomics",))) and (not down_sum or (cluster > 1 and not leave_out))
         and not (trace and cluster == 4)}
builds = [(SGC.LIBRARY, m) for m in sorted(forms)] + [(HC.LIBRARY, ())]
start = time.time()
with ThreadPoolExecutor(16) as pool:
    for (name, macros), path in zip(builds, pool.map(lambda b: CB.build_library(*b), builds)):
        print(name, macros, path.name, flush=True)
print(f"{len(builds)} builds in {time.time() - start:.0f} s")
EOF_BUILDS
  echo "cuda builds rc=$?" >> "$OUT/cuda_builds.log"
  timeout 240 "$PY" -m pytest -v test/gpu/test_kernels.py -k "handover_chain or streamed_gemm_chain" \
    > "$OUT/pytest_streamed_chain.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_streamed_chain.log"
  timeout 60 "$PY" tools/benchmark_handover_chain.py --out "$OUT" > "$OUT/handover_chain.log" 2>&1
  echo "benchmark_handover_chain rc=$?" >> "$OUT/handover_chain.log"
  timeout 240 "$PY" tools/benchmark_streamed_gemm_chain.py --trace 270 --out "$OUT" > "$OUT/streamed_chain.log" 2>&1
  echo "benchmark_streamed_gemm_chain rc=$?" >> "$OUT/streamed_chain.log"
fi

if [ "$PART" = rtc ]; then
  timeout 240 "$PY" -m pytest -v -s test/gpu/test_engine_rtc_gpu.py > "$OUT/pytest_rtc.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_rtc.log"
  timeout 300 "$PY" tools/benchmark_rtc.py --ckpt-root "${FLASHRT_FULL_CKPT_ROOT:-/tmp/full}" --out "$OUT" \
    > "$OUT/rtc.log" 2>&1
  echo "benchmark_rtc rc=$?" >> "$OUT/rtc.log"
fi

{
  for log in pytest_kernels pytest_engine_new pytest_engine_rest pytest_engine_gates pytest_engine_gates_forced \
      pytest_rows_kernel pytest_fast pytest_groot pytest_layer_chain pytest_rtc; do
    [ -f "$OUT/$log.log" ] && { echo "== $log"; grep -E "FAILED|ERROR|passed|failed|rc=" "$OUT/$log.log" | tail -n 20; }
  done
  for MODEL in pi05 pi0; do
    [ -f "$OUT/grid_$MODEL.log" ] && { echo "== the grid of $MODEL (gates, then rows)"
      grep -hE '^\| (pi05?|gate)|PASS|FAIL|rc=' "$OUT/grid_$MODEL.log" "$OUT"/engine_grid_"$MODEL"*.md 2>/dev/null; }
  done
  if [ -f "$OUT/engine.log" ]; then
    echo "== engine"; grep -hE '^\| pi05' "$OUT"/engine_*.md 2>/dev/null || tail -n 5 "$OUT/engine.log"
  fi
  [ -f "$OUT/timeline_480x640.log" ] && { echo "== 480x640 frames"; grep "before the vision tower" \
    "$OUT/timeline_480x640.log" | head -n 1; }
  if [ -f "$OUT/timeline.log" ]; then
    echo "== one denoising layer"; grep -A12 "one denoising layer" "$OUT/timeline.log" || tail -n 5 "$OUT/timeline.log"
  fi
  [ -f "$OUT/wide_gemms.log" ] && { echo "== wide GEMMs"; grep -E "^\| (vision|prefix)|rc=" "$OUT/wide_gemms.log"; }
  [ -f "$OUT/cublaslt_algorithms.log" ] && { echo "== cuBLASLt algorithms";
    grep -E "^\| (vision|prefix)|together|rc=" "$OUT/cublaslt_algorithms.log"; }
  [ -f "$OUT/load.log" ] && { echo "== load with the tuning cache"; grep -E "^\| pi05|rc=" "$OUT/load.log"; }
  [ -f "$OUT/host.log" ] && { echo "== Policy.predict and its host trace"
    grep -E "^\| (pi05|[0-9]|validate|spin)|rc=" "$OUT/host.log"; }
  [ -f "$OUT/buckets.log" ] && { echo "== text buckets"; grep -E "^(## |\| [0-9])|rc=" "$OUT/buckets.log"; }
  [ -f "$OUT/overlap.log" ] && { echo "== the first step beside the prefix (overlap_first_step), on and off"
    grep -hE '^\| pi05' "$OUT"/engine_overlap*.md 2>/dev/null || tail -n 5 "$OUT/overlap.log" "$OUT/overlap_h50.log"; }
  [ -f "$OUT/groot.log" ] && { echo "== GR00T N1.6, reference and graph"; tail -n 15 "$OUT/groot.log"; }
  [ -f "$OUT/groot_language_ops.log" ] && { echo "== GR00T language ops"; tail -n 7 "$OUT/groot_language_ops.log"; }
  [ -f "$OUT/groot_warm_up.log" ] && { echo "== GR00T warm-up"; grep -E "^\| |rc=" "$OUT/groot_warm_up.log"; }
  [ -f "$OUT/groot_profile.log" ] && { echo "== GR00T profile"; grep -E "^==|rc=" "$OUT/groot_profile.log"; }
  [ -f "$OUT/layer_chain.log" ] && { echo "== dependent layers"; tail -n 24 "$OUT/layer_chain.log"; }
  [ -f "$OUT/partial_sums.log" ] && { echo "== partial sums"; tail -n 6 "$OUT/partial_sums.log"; }
  for PREC in bf16 fp8; do
    [ -f "$OUT/denoise_ablation_$PREC.log" ] && { echo "== the denoise without each kind of kernel, $PREC"
      grep -E "^\| |rc=" "$OUT/denoise_ablation_$PREC.log"; }
  done
  [ -f "$OUT/pytest_streamed_chain.log" ] && { echo "== streamed chain tests"; tail -n 3 "$OUT/pytest_streamed_chain.log"; }
  [ -f "$OUT/handover_chain.log" ] && { echo "== the chain's hand-over alone"; grep -E "^\| |rc=" "$OUT/handover_chain.log"; }
  [ -f "$OUT/streamed_chain.log" ] && { echo "== the GEMM chain as one CUDA C++ kernel"; tail -n 12 "$OUT/streamed_chain.log"; }
  [ -f "$OUT/rtc.log" ] && { echo "== real-time chunking in the graph"; tail -n 8 "$OUT/rtc.log"; }
  [ -f "$OUT/fast.log" ] && { echo "== pi0-FAST, reference and engine"; tail -n 6 "$OUT/fast.log"; }
  [ -f "$OUT/tune.log" ] && { echo "== the best of three measured loads, stored and loaded again"
    grep -E "^\| |rc=|^stored" "$OUT/tune.log"; }
  [ -f "$OUT/compile_cells.log" ] && { echo "== reference rows per cell (eager, compiled)"
    grep -hE '^\| pi05? \| reference|^- pi0.*: [0-9.]+ s' "$OUT"/engine_compile_cells*.md 2>/dev/null
    grep -h 'rc=' "$OUT/compile_cells.log"; }
  [ -f "$OUT/h50.log" ] && { echo "== horizon 50, A/B of smem_gemm_rows and fused_denoise_step_pi0"; grep -hE '^\| pi05? \|' "$OUT"/engine_h50_*.md \
    2>/dev/null || tail -n 5 "$OUT/h50.log"; }
  true   # the summary's exit status is not the checks': a part's absent log is not a failure (each log has its rc)
} | tee "$OUT/summary.txt"
