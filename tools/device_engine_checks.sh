#!/usr/bin/env bash
# The engine's open GPU checks, in parts that each fit one device call (<= 10 minutes with the machine's start):
#
#   OUT=/path bash tools/device_engine_checks.sh kernels      # GPU kernel tests + Policy GPU tests, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh engine-new   # the tuning cache's and the chain tuning's tests, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh engine-rest  # the other engine tests but the gates, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh engine-gates # the gates of the defaults and switches, ~7.5 min
#   OUT=/path bash tools/device_engine_checks.sh engine-gates-forced  # TMA GEMMs forced, FP8 opt-ins, ~3.5 min
#   OUT=/path bash tools/device_engine_checks.sh bench        # engine A/B rows + one replay's critical path, ~5 min
#   OUT=/path bash tools/device_engine_checks.sh gemms        # the wide GEMMs in every form, ~3-6 min
#   OUT=/path bash tools/device_engine_checks.sh fp8-scopes   # gates + rows of FP8 on wider scopes, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh load         # engine load: tuning cache off / stored / read, ~1.5 min
#   OUT=/path bash tools/device_engine_checks.sh buckets      # replay time per text bucket, bf16 and FP8, ~4.5 min
#   OUT=/path bash tools/device_engine_checks.sh host         # Policy.predict's host and GPU segments, ~5 min
#   OUT=/path bash tools/device_engine_checks.sh layer        # the persistent expert layer: tests, timings, ~6 min
#   OUT=/path bash tools/device_engine_checks.sh layer-gates  # its three accuracy gates, ~3.5 min
#   OUT=/path bash tools/device_engine_checks.sh h50          # horizon 50's defaults: tests, A/B rows, ~6.5 min
#   OUT=/path bash tools/device_engine_checks.sh overlap      # the first step beside the prefix: A/B rows, ~7 min
#   OUT=/path bash tools/device_engine_checks.sh tune         # tune_engine.py: best of 3 loads stored, ~5 min
#   OUT=/path bash tools/device_engine_checks.sh attention-forms        # the step attention's forms: test, A/B, ~7 min
#   OUT=/path bash tools/device_engine_checks.sh attention-forms-gates  # their two gates, ~4 min
#   OUT=/path bash tools/device_engine_checks.sh compile-cells  # the compiled reference at 2 more cells, ~6-9 min
#   OUT=/path bash tools/device_engine_checks.sh mlp          # the expert MLP in one launch: tests, timing, ~8 min
#   OUT=/path bash tools/device_engine_checks.sh mlp-gates    # its two gates (fused_mlp), ~4 min
#   OUT=/path bash tools/device_engine_checks.sh fp8-decoder  # the FP8 TMA decoder GEMMs: test, A/B rows, ~8 min
#   OUT=/path bash tools/device_engine_checks.sh fp8-decoder-gates  # their three gates (fp8_decoder_weights), ~4 min
#   OUT=/path bash tools/device_engine_checks.sh              # kernels to bench, where one call has the time
#
# The times were measured in sessions 12-13 (all but gemms and fp8-scopes) or estimated: the
# interleaved chain tuning takes ~17-20 s per pass of a full-size engine load (two passes by default; the tests
# whose checks do not depend on its picks run one, test_engine_gpu.py ONE_PASS). The engine parts print each test's duration (--durations=0) to check them.
# kernels: every kernel at real shapes (the skinny and shared-memory TMA GEMM candidates, GeGLU with an FP8 out;
#   both PDL modes), the Policy GPU tests and the resize on the GPU (pytest_kernels.log); not the persistent
#   layer's kernel tests (opt-in, the slow end: session 20's run was cut there at 300 s, 69 % through), which the
#   `layer` part runs.
# engine-new: the tests of what has not run on a GPU yet or changed last: the tuning cache (written after session
#   11's device time), the chain tuning and its interleaved timer (pytest_engine_new.log).
# engine-rest: the rest of test_engine_gpu.py but the gates: replay, the L2 prefetch, the fusion switches, the
#   vision attention backends (pytest_engine_rest.log).
# engine-gates: the accuracy gates of pi0.5 and pi0 on the defaults, bf16 and FP8, and of the switches that turn
#   a default off (pytest_engine_gates.log; ten gates, 7.6 min on a warm machine in session 18);
#   engine-gates-forced: the gates with the TMA GEMMs forced, with the adaRMSNorm fold, with the split-K QKV, with
#   the TMA GEMMs off, with the prefix attention forced to kernels/flashrt_kernels/prefix_attention.py, one split or two, and of
#   FP8's fast accumulation (pytest_engine_gates_forced.log; the FP8 decoder GEMM weights' gates: fp8-decoder-gates).
# Every pytest log is verbose (-v), so a part cut off by its time limit still names the tests that ran.
# bench: pi0.5 2 views h10, bf16 and FP8 on the defaults, beside the A/B rows of the wgmma prefix attention left
#   out of the tuning (bf16, no_prefix_attention_wgmma); the fused step ends, the 8-row qkv_rope, the one-pass
#   step ends, FP8's fast accumulation, the vision MLP padding, the key-split prefix attention and the chain tuning
#   from three launch policies were A/B-measured in sessions 13-17: three engines of ~45-90 s load each
#   (engine_device_checks_<date>.json/.md, engine.log); then the critical path per kernel of one bf16 replay
#   (timeline.json, timeline.log: per kernel, what runs before the vision tower, one vision layer, one denoising
#   layer), and again with 480x640 camera frames resized inside the graph (timeline_480x640.*: the resize's cost).
# gemms: tools/benchmark_wide_gemms.py at 2 views: the vision and prefix GEMMs as F.linear, with the bias apart,
#   addmm, the engine's epilogues, FP8 per-tensor and Inductor's autotuned Triton templates, and the vision MLP
#   with its width 4304 padded to 4352 and 4608 (wide_gemms.json/.log).
# fp8-scopes: the accuracy gate and latency of FP8 with per-tensor static scales on every wide GEMM (vision too) and
#   on the whole backbone, beside the default scope (engine_fp8_scopes_<date>.json/.md, fp8_scopes.log); session 3
#   measured only row scales on those scopes (all: failed the gate).
# load: tools/benchmark_policy_predict.py --tuning-cache: pi0.5 loaded with the tuning cache off, then on twice (the
#   first measures and stores the picks, the second reads them), the load seconds and Policy.predict after each
#   (policy_predict_*_tuning_cache.json/.md, load.log; the entry itself under tuning_cache/).
# host: tools/benchmark_policy_predict.py --host-waits sync warm --host-unnormalize --host-trace 30: pi0.5 with the
#   GPU resize and the actions unnormalized inside the graph (the default), waiting by the stream's synchronize and
#   then by the "warm" wait (the host steps rehearsed during it: flashrt_core/host_rehearsal.py), then unnormalized
#   on the host after the copy out (gpu_unnormalize=False), then with the host resize (~5 min on a fresh machine);
#   200 timed calls each, then 30 traced calls split into
#   the host's work before the GPU, the copy in, the wait for the graph launch, the replay, the copy out and the
#   host after it, and the host steps timed alone and in line (policy_predict_*.json/.md, host.log). Session 14
#   measured `--host-waits sync poll` and `--spin-sweep` here.
# layer: kernels/flashrt_kernels/denoise_layer.py (opt-in: each pi0.5 expert layer in one persistent launch): its kernel tests
#   (pytest_layer_kernel.log), each phase timed alone in several tile configurations (denoise_layer_phases_*,
#   denoise_layer_phases.log) and the whole denoise against the separate kernels in one engine
#   (tools/benchmark_denoise_layer.py --random-init: denoise_layer_*.json/.md, denoise_layer.log); layer-gates:
#   its three accuracy gates (pytest_layer_gates.log).
# h50: kernels/flashrt_kernels/smem_gemm.py's ring kernel (17-64 rows, EngineOptions.smem_gemm_rows) and pi0's fused step ends
#   (EngineOptions.fused_denoise_step_pi0), both defaults since session 17: their kernel tests alone
#   (pytest_rows_kernel.log), then, if all six passed, pi0.5 and pi0 (bf16) at horizon 50 with each of them off
#   too (engine_h50_pi05_*, engine_h50_pi0_*, h50.log); their gates are in engine-gates-forced and engine-gates.
# overlap: the first denoising step beside the prefix on a second stream (EngineOptions.overlap_first_step, the
#   default since session 18): pi0.5 2 views h10 bf16 and FP8 with it and without it (engine_overlap_*,
#   overlap.log), then pi0.5 2 views h50 bf16 both ways (engine_overlap_h50_*, overlap_h50.log). Its tiny
#   two-stream capture test is in engine-rest, its gates (on and off) in engine-gates.
# tune: tools/tune_engine.py on pi0.5 (2 views, 480x640 frames, bf16): three loads with the tuning measured, their
#   graphs timed in turn, the fastest load's picks stored in $OUT/tuning_cache, then a load from that entry timed
#   (tune_engine.json, tune.log): whether the spread between loads comes from the picks (written in session 18).
# attention-forms: the denoising step's attention forms weighed by the chain tuning (rows per program x keys per
#   block; EngineOptions.decoder_attention_tuning, opt-in, written in session 18 without a GPU): the kernel test of
#   every form at real shapes (pytest_attention_forms_kernel.log), then, if both passed, pi0.5 2 views h10 bf16 and
#   FP8 and h50 bf16, each with the forms tuned too (engine_attention_forms*, attention_forms*.log: the picked form
#   and the chain's times per form are in the log); attention-forms-gates: `[pi05-bf16+decoder_attention_tuning]`
#   and `[pi0-bf16+decoder_attention_tuning]` (pytest_attention_forms_gates.log).
# compile-cells: torch.compile(mode="max-autotune") of the reference path, layer by layer, at the cells of the grid
#   that have no compiled row yet (runs 43 and 49 timed it at the two 2-view horizon-10 cells only), beside an eager
#   row per cell in the same run, no engines (--references-only --compile-grid). The cells are $COMPILE_CONFIGS x
#   $COMPILE_VIEWS x $COMPILE_HORIZONS (default pi05 x 1 x "10 50"), a view count's horizons in turn: the second
#   can take the vision tower's and the prefix's graphs from inductor's disk cache (~150 of run 49's 187 s of
#   compilation), so two cells should fit a call (estimated). Each cell runs within 300 s and what is left of the
#   call's 540 s (engine_compile_cells_*.json/.md with each cell's compilation time and cache lookups,
#   compile_cells.log, one compile_<cell>_layers.log per cell). Session 21 ran the part this replaced, `references`
#   (pi0's eager rows at 1 / 3 views, then its compiled reference at 2 views: runs 48-49).
# mlp: kernels/flashrt_kernels/smem_mlp.py (the expert MLP in one launch: both GEMMs' weights in shared memory before the PDL wait,
#   one grid barrier; written without a GPU in session 21, a candidate off the engine's path): its two kernel tests
#   (pytest_mlp_kernel.log), then, if both passed, tools/benchmark_smem_mlp.py: 180 MLPs per graph against the
#   chain's gate/up + down in every down form the tuning weighs, 10 and 16 rows (smem_mlp.json, smem_mlp.log), and
#   pi0.5 2 views h10, bf16 and FP8, with it in the engine (EngineOptions.fused_mlp) and without
#   (engine_fused_mlp_*, fused_mlp.log); mlp-gates: `[pi05-bf16+fused_mlp]`, `[pi05-fp8+fused_mlp]`
#   (pytest_mlp_gates.log).
# fp8-decoder: kernels/flashrt_kernels/smem_gemm_fp8.py (the TMA decoder GEMMs in FP8 with fp8_decoder_weights; written without a
#   GPU in session 23): its kernel test (pytest_fp8_decoder_kernel.log), then, if it passed, pi0.5 2 views h10:
#   bf16 and FP8 on the defaults, FP8 with fp8_decoder_weights (the FP8 TMA GEMMs weighed by the tuning) and FP8
#   without the FP8 TMA GEMMs (smem_gemm_fp8 off: the bf16 and weight-only ones weighed) (engine_fp8_decoder_*,
#   fp8_decoder.log), and each engine's picks;
#   fp8-decoder-gates: `[pi05-fp8+fp8_decoder_weights*]`: tuned, the FP8 TMA GEMMs forced, the weight-only Triton
#   GEMMs forced (pytest_fp8_decoder_gates.log).
# buckets: tools/benchmark_text_buckets.py: pi0.5 2 views with a graph per 16-token text bucket, bf16 and FP8, all
#   graphs timed in turn (text_buckets_*.json/.md, buckets.log): what a prompt pays for the padding of its bucket.
# A short table last (summary.txt). Each step has its own time limit, so a step that hangs still leaves the
# others' results. Full-size random checkpoints are generated into $FLASHRT_FULL_CKPT_ROOT (default /tmp/full).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-test_output/device_engine_checks}"
PART="${1:-all}"
PARTS="all kernels engine-new engine-rest engine-gates engine-gates-forced bench gemms fp8-scopes load buckets host layer
  layer-gates h50 overlap tune attention-forms attention-forms-gates compile-cells mlp mlp-gates fp8-decoder
  fp8-decoder-gates"
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
  timeout 400 "$PY" -m pytest -v --durations=0 test/gpu/test_kernels.py test/gpu/test_policy_gpu.py \
    test/core/test_preprocess.py -k "not denoise_layer" > "$OUT/pytest_kernels.log" 2>&1
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
    -k "accuracy_gate and not (smem_gemm or split_k_qkv or prefix_attention_wgmma or prefix_attention_split or denoise_layer or fp8_fast_accum or fp8_decoder_weights or decoder_attention_tuning or fused_mlp)" \
    > "$OUT/pytest_engine_gates.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_engine_gates.log"
fi

if [ "$PART" = engine-gates-forced ] || [ "$PART" = all ]; then
  timeout 400 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py \
    -k "accuracy_gate and (smem_gemm or split_k_qkv or prefix_attention_wgmma or prefix_attention_split or fp8_fast_accum)" \
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

if [ "$PART" = gemms ]; then          # not in "all": its Inductor autotuning alone can take minutes
  timeout 480 "$PY" tools/benchmark_wide_gemms.py --views 2 --pad-vision-mlp 128 512 --out "$OUT/wide_gemms.json" \
    > "$OUT/wide_gemms.log" 2>&1
  echo "benchmark_wide_gemms rc=$?" >> "$OUT/wide_gemms.log"
fi

if [ "$PART" = load ]; then           # not in "all": three full loads of pi0.5 and 200 calls after each
  CKPT="$FLASHRT_FULL_CKPT_ROOT/pi05"
  [ -f "$CKPT/flashrt_config.json" ] || "$PY" -m flashrt_core.fixtures "$CKPT" --config pi05 > "$OUT/load.log" 2>&1
  timeout 420 "$PY" tools/benchmark_policy_predict.py --checkpoint "$CKPT" --tuning-cache "$OUT/tuning_cache" \
    --out "$OUT" >> "$OUT/load.log" 2>&1
  echo "benchmark_policy_predict rc=$?" >> "$OUT/load.log"
fi

if [ "$PART" = host ]; then           # not in "all": two full loads of pi0.5 (the second reads the tuning cache)
  CKPT="$FLASHRT_FULL_CKPT_ROOT/pi05"
  [ -f "$CKPT/flashrt_config.json" ] || "$PY" -m flashrt_core.fixtures "$CKPT" --config pi05 > "$OUT/host.log" 2>&1
  FLASHRT_TUNING_CACHE=/tmp/flashrt_tuning_cache timeout 420 "$PY" tools/benchmark_policy_predict.py \
    --checkpoint "$CKPT" --host-waits sync warm --host-unnormalize --host-trace 30 --out "$OUT" \
    >> "$OUT/host.log" 2>&1
  echo "benchmark_policy_predict rc=$?" >> "$OUT/host.log"
fi

if [ "$PART" = layer ]; then          # not in "all": kernels/flashrt_kernels/denoise_layer.py (opt-in)
  # its kernel tests first (a grid barrier that never completes gives up after ~4 s per barrier: the time limit
  # bounds a hang), then each phase timed alone, then the denoise A/B in one engine (the gates: layer-gates)
  timeout 240 "$PY" -m pytest -v test/gpu/test_kernels.py -k denoise_layer > "$OUT/pytest_layer_kernel.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_layer_kernel.log"
  timeout 240 "$PY" tools/benchmark_denoise_layer.py --phase-breakdown --out "$OUT" > "$OUT/denoise_layer_phases.log" 2>&1
  echo "benchmark_denoise_layer --phase-breakdown rc=$?" >> "$OUT/denoise_layer_phases.log"
  timeout 240 "$PY" tools/benchmark_denoise_layer.py --random-init --out "$OUT" > "$OUT/denoise_layer.log" 2>&1
  echo "benchmark_denoise_layer rc=$?" >> "$OUT/denoise_layer.log"
fi

if [ "$PART" = layer-gates ]; then    # not in "all": the persistent layer's three accuracy gates, ~3.5 min
  timeout 400 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py -k "accuracy_gate and denoise_layer" \
    > "$OUT/pytest_layer_gates.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_layer_gates.log"
fi

if [ "$PART" = buckets ]; then        # not in "all": two full loads with 13 graphs each
  timeout 420 "$PY" tools/benchmark_text_buckets.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --config pi05 --views 2 \
    --precisions bf16 fp8 --out-dir "$OUT" > "$OUT/buckets.log" 2>&1
  echo "benchmark_text_buckets rc=$?" >> "$OUT/buckets.log"
fi

if [ "$PART" = h50 ]; then            # not in "all": horizon 50's defaults of session 17 against them off
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

if [ "$PART" = attention-forms ]; then   # not in "all": decoder_attention_tuning (opt-in), its kernel test and A/B
  timeout 120 "$PY" -m pytest -v test/gpu/test_kernels.py -k "every_row_and_key_block" \
    > "$OUT/pytest_attention_forms_kernel.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_attention_forms_kernel.log"
  if grep -q "2 passed" "$OUT/pytest_attention_forms_kernel.log"; then
    timeout 260 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
      --horizons 10 --fp8-configs pi05 --reference-calls 2 --no-gate --ab-switches-on decoder_attention_tuning \
      --out-dir "$OUT" --tag attention_forms > "$OUT/attention_forms.log" 2>&1
    echo "benchmark_engine rc=$?" >> "$OUT/attention_forms.log"
    timeout 150 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
      --horizons 50 --reference-calls 2 --no-gate --ab-switches-on decoder_attention_tuning \
      --out-dir "$OUT" --tag attention_forms_h50 > "$OUT/attention_forms_h50.log" 2>&1
    echo "benchmark_engine rc=$?" >> "$OUT/attention_forms_h50.log"
  fi
fi

if [ "$PART" = attention-forms-gates ]; then
  timeout 400 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py \
    -k "accuracy_gate and decoder_attention_tuning" > "$OUT/pytest_attention_forms_gates.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_attention_forms_gates.log"
fi

if [ "$PART" = compile-cells ]; then   # not in "all": the compiled reference (and an eager row) per cell
  timeout 560 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" \
    --configs ${COMPILE_CONFIGS:-pi05} --views ${COMPILE_VIEWS:-1} --horizons ${COMPILE_HORIZONS:-10 50} \
    --references-only --reference-calls 2 --no-gate --compile --compile-grid --compile-timeout 300 --deadline-s 540 \
    --out-dir "$OUT" --tag compile_cells > "$OUT/compile_cells.log" 2>&1
  echo "benchmark_engine rc=$?" >> "$OUT/compile_cells.log"
fi

if [ "$PART" = mlp ]; then            # not in "all": the expert MLP in one launch (a candidate)
  # a grid barrier that never completes gives up after 2^20 polls: the time limit bounds a hang
  timeout 180 "$PY" -m pytest -v test/gpu/test_kernels.py -k smem_mlp > "$OUT/pytest_mlp_kernel.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_mlp_kernel.log"
  if grep -q "2 passed" "$OUT/pytest_mlp_kernel.log"; then
    timeout 240 "$PY" tools/benchmark_smem_mlp.py --out "$OUT/smem_mlp.json" > "$OUT/smem_mlp.log" 2>&1
    echo "benchmark_smem_mlp rc=$?" >> "$OUT/smem_mlp.log"
    timeout 400 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
      --horizons 10 --fp8-configs pi05 --ab-switches-on fused_mlp --reference-calls 2 --no-gate \
      --out-dir "$OUT" --tag fused_mlp > "$OUT/fused_mlp.log" 2>&1
    echo "benchmark_engine rc=$?" >> "$OUT/fused_mlp.log"
  fi
fi

if [ "$PART" = mlp-gates ]; then      # not in "all": its two gates, bf16 and FP8
  timeout 400 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py -k "accuracy_gate and fused_mlp" \
    > "$OUT/pytest_mlp_gates.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_mlp_gates.log"
fi

if [ "$PART" = fp8-decoder ]; then    # not in "all": the FP8 TMA decoder GEMMs (opt-in fp8_decoder_weights)
  timeout 180 "$PY" -m pytest -v test/gpu/test_kernels.py -k smem_gemm_fp8 > "$OUT/pytest_fp8_decoder_kernel.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_fp8_decoder_kernel.log"
  if grep -q "4 passed" "$OUT/pytest_fp8_decoder_kernel.log"; then
    timeout 420 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
      --horizons 10 --fp8-configs pi05 \
      --ab-fp8-options with_fp8_decoder_weights with_fp8_decoder_weights-no_smem_gemm_fp8 --reference-calls 2 --no-gate \
      --out-dir "$OUT" --tag fp8_decoder > "$OUT/fp8_decoder.log" 2>&1
    echo "benchmark_engine rc=$?" >> "$OUT/fp8_decoder.log"
  fi
fi

if [ "$PART" = fp8-decoder-gates ]; then   # not in "all": its gates, the FP8 TMA GEMMs weighed, forced and off
  timeout 400 "$PY" -m pytest -v --durations=0 test/gpu/test_engine_gpu.py -k "accuracy_gate and fp8_decoder_weights" \
    > "$OUT/pytest_fp8_decoder_gates.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest_fp8_decoder_gates.log"
fi

if [ "$PART" = fp8-scopes ]; then
  timeout 480 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
    --horizons 10 --fp8-configs pi05 --fp8-scalings "" "@all" "@backbone" --gate-observations 2 \
    --reference-calls 2 --out-dir "$OUT" --tag fp8_scopes > "$OUT/fp8_scopes.log" 2>&1
  echo "benchmark_engine rc=$?" >> "$OUT/fp8_scopes.log"
fi

{
  for log in pytest_kernels pytest_engine_new pytest_engine_rest pytest_engine_gates pytest_engine_gates_forced \
      pytest_rows_kernel pytest_layer_kernel pytest_layer_gates pytest_attention_forms_kernel \
      pytest_attention_forms_gates pytest_mlp_kernel pytest_mlp_gates pytest_fp8_decoder_kernel \
      pytest_fp8_decoder_gates; do
    [ -f "$OUT/$log.log" ] && { echo "== $log"; grep -E "FAILED|ERROR|passed|failed|rc=" "$OUT/$log.log" | tail -n 20; }
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
  [ -f "$OUT/load.log" ] && { echo "== load with the tuning cache"; grep -E "^\| pi05|rc=" "$OUT/load.log"; }
  [ -f "$OUT/host.log" ] && { echo "== Policy.predict and its host trace"
    grep -E "^\| (pi05|[0-9]|validate|spin)|rc=" "$OUT/host.log"; }
  [ -f "$OUT/buckets.log" ] && { echo "== text buckets"; grep -E "^(## |\| [0-9])|rc=" "$OUT/buckets.log"; }
  [ -f "$OUT/overlap.log" ] && { echo "== the first step beside the prefix (overlap_first_step), on and off"
    grep -hE '^\| pi05' "$OUT"/engine_overlap*.md 2>/dev/null || tail -n 5 "$OUT/overlap.log" "$OUT/overlap_h50.log"; }
  [ -f "$OUT/tune.log" ] && { echo "== the best of three measured loads, stored and loaded again"
    grep -E "^\| |rc=|^stored" "$OUT/tune.log"; }
  [ -f "$OUT/attention_forms.log" ] && { echo "== the step attention's forms tuned (decoder_attention_tuning)"
    grep -hE '^\| pi05' "$OUT"/engine_attention_forms*.md 2>/dev/null || tail -n 5 "$OUT/attention_forms.log"
    grep -h "attention form\|decoder GEMMs in the denoiser" "$OUT"/attention_forms*.log | tail -n 6; }
  [ -f "$OUT/smem_mlp.log" ] && { echo "== the expert MLP in one launch against the chain"
    grep -E "^\| [0-9]|rc=" "$OUT/smem_mlp.log"; }
  [ -f "$OUT/fused_mlp.log" ] && { echo "== pi0.5 2 views h10 with the MLPs in one launch (fused_mlp) and without"
    grep -hE '^\| pi05' "$OUT"/engine_fused_mlp*.md 2>/dev/null || tail -n 5 "$OUT/fused_mlp.log"; }
  [ -f "$OUT/fp8_decoder.log" ] && { echo "== pi0.5 2 views h10 with FP8 decoder GEMM weights (fp8_decoder_weights)"
    grep -hE '^\| pi05' "$OUT"/engine_fp8_decoder*.md 2>/dev/null || tail -n 5 "$OUT/fp8_decoder.log"
    "$PY" - "$OUT" <<'PYEOF' 2>/dev/null
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/engine_fp8_decoder*.json")):
    for r in json.load(open(path))["rows"]:
        d = r.get("decoder_gemm")
        if d:   # each engine's picks and the denoise (ms) of each kind's candidates in the chain tuning's last pass
            chain = {k: {c: round(t, 3) for c, t in v.items()} for k, v in d.get("chain_timings_ms", {}).items()}
            print(r["variant"], d["choice"], d.get("launch_policy"), chain)
PYEOF
  }
  [ -f "$OUT/compile_cells.log" ] && { echo "== reference rows per cell (eager, compiled)"
    grep -hE '^\| pi05? \| reference|^- pi0.*: [0-9.]+ s' "$OUT"/engine_compile_cells*.md 2>/dev/null
    grep -h 'rc=' "$OUT/compile_cells.log"; }
  [ -f "$OUT/h50.log" ] && { echo "== horizon 50, A/B of smem_gemm_rows and fused_denoise_step_pi0"; grep -hE '^\| pi05? \|' "$OUT"/engine_h50_*.md \
    2>/dev/null || tail -n 5 "$OUT/h50.log"; }
  true   # the summary's exit status is not the checks': a part's absent log is not a failure (each log has its rc)
} | tee "$OUT/summary.txt"
