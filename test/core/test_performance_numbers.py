"""The numbers of docs/performance.md and of the README's performance table are quoted from the result files in
docs/benchmarks/<date>/: each is read here from the JSON the benchmark wrote and must stand in the page as it prints
them. A number typed by hand, or left behind when its result file changed, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "docs" / "benchmarks"
PAGE = (REPO / "docs" / "performance.md").read_text()
README = (REPO / "README.md").read_text()
ENGINE = {"pi0.5": BENCH / "2026-12-04" / "engine_grid_pi05_h200.json",
          "pi0": BENCH / "2026-12-04" / "engine_after_pi0_2026-12-04.json"}
GRID = BENCH / "2026-12-02" / "engine_grid_h200.json"
POLICY = BENCH / "2026-12-01" / "policy_predict_h200.json"
FAST = BENCH / "2026-12-04" / "pi0_fast_h200.json"
GROOT = BENCH / "2026-12-04" / "groot_graph_h200.json"
GROOT_OPS = BENCH / "2026-12-04" / "groot_language_ops_h200.json"
GROOT_PROFILE = BENCH / "2026-12-04" / "groot_profile_h200.json"
CHAIN = BENCH / "2026-12-05" / "layer_chain_h200.json"
ONE_PROCESS = BENCH / "2026-12-05" / "engine_compile_pi05_h200.json"
ABLATION = BENCH / "2026-12-05" / "denoise_ablation_pi05_bf16_h200.json"
GROOT_WARM_UP = BENCH / "2026-12-05" / "groot_warm_up_h200.json"
GROOT_INPUTS = {when: BENCH / "2026-12-05" / f"groot_inputs{when}_devmachine.json" for when in ("_before", "")}
RTC = BENCH / "2026-12-04" / "rtc_cost_pi05_h200.json"
HOST_RESIZE = BENCH / "2026-12-05" / "host_resize_devmachine.json"
STREAMED = {form: BENCH / "2026-12-05" / f"streamed_gemm_chain_{form}_form_h200.log" for form in ("first", "second")}
STREAMED_JSON = BENCH / "2026-12-05" / "streamed_gemm_chain_second_form_h200.json"
STREAMED_H100 = BENCH / "2026-12-05" / "streamed_gemm_chain_h100.json"
STREAMED_WINDOW_H100 = BENCH / "2026-12-05" / "streamed_gemm_chain_a_window_h100.json"
STREAMED_SUMS_H100 = BENCH / "2026-12-05" / "streamed_gemm_chain_down_sums_h100.json"
HANDOVER_SLICED_H100 = BENCH / "2026-12-05" / "handover_chain_sliced_h100.json"
STREAMED_H200 = BENCH / "2026-12-05" / "streamed_gemm_chain_h200.json"
ABLATION = BENCH / "2026-12-05" / "denoise_ablation_pi05_bf16_h200.json"
HANDOVER_H100 = BENCH / "2026-12-05" / "handover_chain_h100.json"
GROOT_SPLIT_H100 = BENCH / "2026-12-05" / "groot_warm_up_h100.json"
NODE = BENCH / "2026-12-01" / "node_overhead_h200_raw.json"


def _engine(model: str, variant: str, horizon: int) -> dict:
    rows = json.loads(ENGINE[model].read_text())["rows"]
    return next(r for r in rows if r["variant"] == variant and r["views"] == 2 and r["horizon"] == horizon)


def _row(text: str, starts: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| {starts} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def _ms(stats: dict) -> str:
    return f"{stats['median']:.2f} ms ({stats['p99']:.2f})"


# The streamed chain's forms with the A window, as the performance page's tables name them.
WINDOW_FORM_LABELS = {"streamed_a_window": "the A window alone", "streamed_a_window_cluster2": "in clusters of 2",
                      "streamed_a_window_cluster2_no_atomics": "in clusters of 2, without the atomics",
                      "streamed_a_window_cluster2_down_sum": "in clusters of 2, with the cluster sum",
                      "streamed_a_window_cluster4_down_sum": "in clusters of 4, with the cluster sum",
                      "streamed_a_window_four_gemms": "the A window alone, four GEMMs per layer"}


def _chain_cells(r: dict) -> list[str]:
    """A streamed-chain variant's cells as the performance page's tables quote them: us per layer, the weight
    stream's TB/s, the relative L2 error (empty where the form's result is wrong by design)."""
    err = r["rel_l2_vs_reference"]
    return [f"{r['us_per_layer']:.2f}", f"{r['weight_tb_per_s']:.2f}", "" if err is None else f"{err:.1e}"]


@pytest.mark.parametrize("model,horizon", [("pi0.5", 10), ("pi0.5", 50), ("pi0", 10), ("pi0", 50)])
def test_the_engine_rows_quote_the_latest_engine_calls(model, horizon):
    bf16, fp8 = (_engine(model, f"engine_{p}", horizon)["predict_ms"] for p in ("bf16", "fp8"))
    eager = _engine(model, "reference_eager_bf16", horizon)["predict_ms"]["median"]
    speedups = f"{eager / bf16['median']:.1f}x / {eager / fp8['median']:.1f}x"
    assert _row(PAGE, f"{model} | {horizon} | {_ms(bf16)}") == [model, str(horizon), _ms(bf16), _ms(fp8), f"{eager:.0f} ms",
                                                   speedups]
    assert _row(README, f"{model}, {horizon}") == [f"{model}, {horizon}", _ms(bf16), _ms(fp8), f"{eager:.0f} ms"]


def test_the_targets_and_gates_quote_the_latest_engine_calls():
    bf16, fp8 = (_engine("pi0.5", f"engine_{p}", 10)["predict_ms"] for p in ("bf16", "fp8"))
    assert _row(PAGE, "median <= 6 ms in bf16")[1:] == [f"{bf16['median']:.2f} ms", "missed"]
    assert _row(PAGE, "median <= 4.5 ms in FP8")[1:] == [f"{fp8['median']:.2f} ms", "missed"]
    ratios = [s["p99"] / s["median"] for s in (bf16, fp8)]
    assert all(r <= 1.05 for r in ratios)
    assert _row(PAGE, "p99 <= 1.05 x the median")[1:] == [f"{ratios[0]:.2f} x (bf16), {ratios[1]:.2f} x (FP8)", "met"]
    gates = {(m, g["precision"]): g for m, path in ENGINE.items() for g in json.loads(path.read_text())["gates"]}
    assert all(g["pass"] for g in gates.values()) and len(gates) == 4
    cos = {k: f"{g['min']:.5f}" for k, g in gates.items()}
    assert (f"pi0.5 {cos['pi0.5', 'bf16']} bf16 / {cos['pi0.5', 'fp8']} FP8, "
            f"pi0 {cos['pi0', 'bf16']} / {cos['pi0', 'fp8']}") in " ".join(PAGE.split())
    assert f"{cos['pi0.5', 'bf16']} / {cos['pi0.5', 'fp8']} | met" in PAGE
    fp8 = sorted(cos[m, "fp8"] for m in ENGINE)
    assert cos["pi0.5", "bf16"] == cos["pi0", "bf16"]
    assert f"{cos['pi0', 'bf16']} in bf16, {fp8[0]}-{fp8[1]} with FP8" in " ".join(README.split())


def test_the_compile_row_quotes_the_call_that_timed_every_row_in_one_process():
    rows = {r["variant"]: r["predict_ms"] for r in json.loads(ONE_PROCESS.read_text())["rows"] if "predict_ms" in r}
    c = rows["reference_compile_max-autotune_layers"]
    eager = rows["reference_eager_bf16"]["median"]
    engines = [rows[f"engine_{p}"]["median"] for p in ("bf16", "fp8")]
    assert _row(PAGE, "pi0.5 | 10 | " + f"{c['median']:.0f} ms ({c['p99']:.0f})")[2:] == [
        f"{c['median']:.0f} ms ({c['p99']:.0f})", f"{engines[0]:.2f} / {engines[1]:.2f} ms", f"{eager:.0f} ms",
        f"{c['median'] / engines[0]:.1f}x / {c['median'] / engines[1]:.1f}x"]
    assert f"compiling gains {eager / c['median']:.1f}x over the" in PAGE


def test_the_denoise_ablation_rows_quote_their_result_file():
    result = json.loads(ABLATION.read_text())
    assert _row(PAGE, "whole")[1] == f"{result['whole_ms']:.3f}"
    for starts, key in (("without the two adaRMSNorms of each layer", "norms"),
                        ("without the merge of the attention's key splits", "attention_merge"),
                        ("without the attention (split and merge)", "attention"),
                        ("without the QKV GEMM", "qkv"), ("without the O GEMM", "o"),
                        ("without the gate/up GEMM (GeGLU in its epilogue)", "gate_up"),
                        ("without the down GEMM", "down"), ("without the four GEMMs", "gemms"),
                        ("without the norms and the attention (the four GEMMs left)", "norms_attention")):
        row = result["ablations"][key]
        assert _row(PAGE, starts)[1:] == [f"{row['ms']:.3f}", f"{row['saved_ms']:.3f}",
                                          f"{row['saved_us_per_layer']:.2f}"], starts
    assert f"timed again at the end: {result['whole_again_ms']:.3f} ms" in " ".join(PAGE.split())
    assert result["layers"] == 180 and "180 expert layers" in PAGE


def test_the_policy_predict_rows_quote_their_result_file():
    rows = json.loads(POLICY.read_text())["rows"]
    graph = next(r for r in rows if r["tuning"] == "measured" and r["gpu_unnormalize"] and r["gpu_preprocess"])
    host = next(r for r in rows if not r["gpu_preprocess"])
    for starts, r in (("`Policy.predict`, frames resized in the graph (the default)", graph),
                      ("the same, frames resized on the host", host)):
        assert _row(PAGE, starts)[1:] == [f"{r['median_ms']:.2f} ms", f"{r['p99_ms']:.2f} ms"]
    assert f"({graph['prompt_tokens']} tokens in the {graph['text_bucket']}-token bucket)" in PAGE
    assert f"The graph replay alone takes {graph['replay_median_ms']:.2f} ms of the {graph['median_ms']:.2f}" in PAGE
    cached = min(r["load_s"] for r in rows if r["tuning"] == "cache")
    text = " ".join(PAGE.split())
    assert f"Loading the engine took {graph['load_s']:.1f} s when it measured its kernel choices and {cached:.1f} s" \
        in text
    assert f"{cached:.1f} s instead of {graph['load_s']:.1f} s on the H200" in " ".join(README.split())


def test_the_node_rows_quote_the_raw_samples():
    raw = json.loads(NODE.read_text())
    chunks = np.array(raw["chunks"][raw["skip"]:])
    col = {name: chunks[:, i] * 1e3 for i, name in enumerate(raw["columns"])}
    for starts, values in (("staleness (node clock at publish - capture stamp)", col["staleness_s"]),
                           ("inference", col["inference_s"]),
                           ("bare transport of the two frames between two processes (no node, heap kept)",
                            np.array(raw["transport_floor_heap_reuse_s"]) * 1e3)):
        assert _row(PAGE, starts)[1] == f"{np.median(values):.2f} ms", starts
    assert len(chunks) == 954 and "954\nchunks" in PAGE


def test_the_pi0_fast_rows_quote_their_result_file():
    result = json.loads(FAST.read_text())
    ref = result["reference"]
    assert _row(PAGE, "pi0-FAST eager reference, bf16")[1:4] == [f"{ref['prefill_ms_median']:.2f} ms",
                                                                f"{ref['decode_ms_per_token_median']:.2f} ms",
                                                                f"{ref['chunk_ms_median']:.0f} ms"]
    for starts, key in (("pi0-FAST engine, bf16", "engine"), ("pi0-FAST engine, weight-only FP8 decoding", "engine_fp8")):
        row = result[key]
        assert _row(PAGE, starts)[1:] == [f"{row['prefill_ms_median']:.2f} ms",
                                          f"{row['decode_ms_per_token_median']:.3f} ms",
                                          f"{row['chunk_ms_median']:.1f} ms", f"{row['logits_cosine_min']:.5f}"]
    assert f"{result['engine']['lm_head_argmax_ms']:.3f} ms" in PAGE


def test_the_groot_rows_quote_their_result_file():
    result = json.loads(GROOT.read_text())
    for starts, key in (("GR00T eager reference, bf16", "reference"),
                        ("graph, `sample_actions` (inputs in, chunk out)", "graph"),
                        ("graph replay alone", "graph_replay"),
                        ("graph replay, `groot_fused_dit` off", "graph_replay_no_fused_dit"),
                        ("graph replay, `groot_step_tables` off (the fused DiT with it)", "graph_replay_no_step_tables"),
                        ("graph replay, `groot_few_row_gemms` off (the DiT's GEMMs on cuBLAS)", "graph_replay_cublas_dit"),
                        ("graph replay, `groot_head_attention` off (the DiT's attention on SDPA)", "graph_replay_sdpa_dit"),
                        ("graph replay, FP8 DiT (`precision=\"fp8\"`)", "graph_replay_fp8"),
                        ("graph replay, `groot_engine_vision` off (transformers' SigLIP2 layers)",
                         "graph_replay_transformers_vision"),
                        ("graph replay, `groot_engine_language` off (transformers' Qwen3 layers)",
                         "graph_replay_transformers_language"),
                        ("graph replay, `groot_step_ends` off (the embodiment's weights gathered in every predict)",
                         "graph_replay_no_step_ends"),
                        ("graph replay, `groot_tune_with_norm` off (the DiT's split-K GEMMs timed alone)",
                         "graph_replay_gemms_timed_alone")):
        stats, digits = result[key], 1 if key == "reference" else 2
        assert _row(PAGE, starts)[1:] == [f"{stats['median_ms']:.{digits}f} ms", f"{stats['p99_ms']:.{digits}f} ms"]
    assert f"cosine {result['cosine_vs_fp32']['graph_mean']:.6f}" in PAGE
    assert f"action head {result['phases_ms']['action_head']:.2f} ms" in PAGE
    phases, text = result["phases_ms"], " ".join(PAGE.split())          # the prose, line breaks as spaces
    assert f"vision {phases['vision']:.2f} ms" in text and f"language model {phases['language']:.2f} ms" in text
    for precision in ("graph", "graph_fp8"):                      # the gate, bf16 and FP8
        assert result["gate"][precision]["passed"]
        assert f"mean {result['gate'][precision]['mean']:.6f}" in PAGE


def test_the_groot_warm_up_quotes_its_result_file():
    r = json.loads(GROOT_WARM_UP.read_text())
    captures = sorted(r["warm_up_captures_s"].values())
    predicts = sorted(i["predict_s"] * 1e3 for i in r["instructions"])
    text = " ".join(PAGE.split())
    assert (f"`load_model` {r['load_s']:.2f} s, the first predict {r['first_predict_s']:.2f} s (its capture "
            f"{r['first_capture_s'][0]:.2f} s" in text)
    assert (f"`warm_up_text_buckets` {r['warm_up_s']:.2f} s for {len(r['warmed_prompt_lengths'])} prompt lengths "
            f"({r['warmed_prompt_lengths'][0]} to {r['warmed_prompt_lengths'][-1]} tokens: {len(captures)} captures "
            f"of {captures[0]:.2f}-{captures[-1]:.2f} s" in text)
    assert all(i["captures"] == 0 for i in r["instructions"])
    assert f"takes {predicts[0]:.0f}-{predicts[-1]:.0f} ms per call" in text
    groot_page = " ".join((REPO / "docs" / "groot.md").read_text().split())
    assert f"the warm-up {r['warm_up_s']:.2f} s for its {len(r['warmed_prompt_lengths'])} prompt lengths" in groot_page


def test_the_groot_inputs_times_quote_their_result_files():
    before, after = ({(r["height"], r["width"]): r["median_ms"] for r in json.loads(path.read_text())["rows"]}
                     for path in GROOT_INPUTS.values())
    text = " ".join(PAGE.split())
    assert f"{before[224, 224]:.2f} -> {after[224, 224]:.2f} ms at 224 x 224" in text
    assert f"{before[480, 640]:.2f} -> {after[480, 640]:.2f} ms at 480 x 640" in text
    assert all(after[k] < before[k] for k in before)


def test_the_groot_language_ops_rows_quote_their_result_file():
    r = json.loads(GROOT_OPS.read_text())
    slices = lambda gemm, counts: " / ".join(f"{r[gemm][f'split{s}']['gemm_norm_us']:.2f}" for s in counts)  # noqa: E731
    down, o = r["down"], r["o"]
    assert _row(PAGE, "MLP down GEMM + the norm after it")[2] == f"{down['gemm_norm_us']:.2f}"
    (line,) = [ln for ln in PAGE.splitlines() if ln.startswith("| | 2 / 3 / 4 / 6 / 8 K-slices")]
    assert line.strip("|").split("|")[2].strip() == slices("down", (2, 3, 4, 6, 8))
    assert _row(PAGE, "O GEMM + the norm after it")[2] == f"{o['gemm_norm_us']:.2f}; {slices('o', (2, 4, 8))}"
    rope = " / ".join(f"{r['qkv_rope'][f'rows_per_program_{n}_us']:.2f}" for n in (1, 2, 4, 8, 16))
    assert _row(PAGE, "q/k norm + RoPE + split (`qkv_rope`)")[2] == rope
    att = r["attention"]
    assert _row(PAGE, "attention, 16 heads over 8 K/V heads")[2] == \
        f"{att['causal_us']:.2f}; {att['causal_and_mask_us']:.2f}"
    assert min(("split2", "split3", "split4", "split6", "split8"), key=lambda k: down[k]["gemm_norm_us"]) == "split4"
    assert r["qkv_rope"]["default_rows_per_program"] == 8 and att["real_rows_max_abs_diff"] == 0


def test_the_groot_profile_rows_quote_their_result_file():
    """The action head's kernels by exposed time: the named rows, and the rest as the span's remainder."""
    head = json.loads(GROOT_PROFILE.read_text())["phases"]["action_head"]
    named = {row["name"]: row for row in head["by_name"]}
    shown = 0.0
    for starts, name in (("the DiT's GEMMs (`_smem_gemm_rows_kernel`)", "_smem_gemm_rows_kernel"),
                         ("residual LayerNorms (`_residual_norm_kernel`)", "_residual_norm_kernel"),
                         ("attention (`_head_attention_kernel`)", "_head_attention_kernel")):
        row = named[name]
        assert _row(PAGE, starts)[1:] == [str(row["count"]), f"{row['exposed_us']:.0f} us"]
        shown += row["exposed_us"]
    kv = max((row for row in head["by_name"] if row["count"] == 1 and row["name"].startswith("nvjet")),
             key=lambda row: row["exposed_us"])                 # the largest single cuBLAS GEMM: K / V of the features
    assert _row(PAGE, "the backbone features' K / V for every cross-attention block (one cuBLAS GEMM, 201 MB of "
                      "weights)")[1:] == ["1", f"{kv['exposed_us']:.0f} us"]
    rest = _row(PAGE, "everything else: the steps' ends, vlln, masks, state encoder")[1:]
    counted = sum(named[n]["count"] for n in ("_smem_gemm_rows_kernel", "_residual_norm_kernel",
                                               "_head_attention_kernel")) + 1
    assert rest == [str(head["kernels"] - counted), f"{head['span_us'] - shown - kv['exposed_us']:.0f} us"]
    text = " ".join(PAGE.split())
    assert f"kernels ({head['kernels']} in one replay)" in text and f"its span is {head['span_us'] / 1e3:.2f} ms" in text


def test_the_layer_chain_rows_quote_their_result_file():
    variants = json.loads(CHAIN.read_text())["variants"]

    def us(key: str) -> str:
        return f"{variants[key]['us_per_layer']:.2f}"
    for starts, key, resident in (
            ("a kernel boundary (one launch per layer, stream order)", "launch_per_layer", None),
            ("a kernel boundary with PDL (the next layer's weights load during the wait)", "launch_per_layer_pdl",
             "launch_per_layer_pdl_resident"),
            ("PDL, each kernel releasing the next at its start", "launch_per_layer_pdl_early", None),
            ("cuBLAS per layer (stream order)", "library_per_layer", None),
            ("one persistent kernel, a counter per layer in global memory (volatile spin, then an acquire)",
             "persistent_counters",
             "persistent_counters_resident"),
            ("one persistent kernel polling flagged words (value and flag in one 32-bit word)",
             "persistent_flagged_data",
             "persistent_flagged_data_resident"),
            ("a launch per layer polling flagged words after PDL's early trigger",
             "launch_per_layer_flagged_data",
             "launch_per_layer_flagged_data_resident"),
            ("one persistent kernel, weights staged in a TMA ring 8 layers ahead, flagged words",
             "persistent_staged_flagged_data",
             "persistent_staged_flagged_data_resident"),
            ("the same staged ring, E4M3 weights (half the bytes)", "persistent_staged_flagged_data_fp8", None),
            ("the same staged ring, a counter per layer", "persistent_staged_counters", None),
            ("the staged ring with no dependency between layers (each multiplies the chain's input)",
             "persistent_staged_flagged_data_unchained", None)):
        assert _row(PAGE, starts)[1:] == [us(key), us(resident) if resident else ""], starts


def _streamed_us(form: str, switches: str, wait: bool) -> float:
    """us per layer of a 180-layer run of the streamed chain's leave-out log (`| <switches> | wait=.. | layers=180`)."""
    text = STREAMED[form].read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| {switches} | wait={wait} | layers=180 |")]
    return float(re.search(r"\| ([0-9.]+) us/layer", line).group(1))


def test_the_streamed_chain_rows_quote_their_logs_and_result_file():
    both = "-DSGC_SKIP_COPY -DSGC_SKIP_COMPUTE"
    rows = (("the kernel", "as is", True), ("the kernel without the waits between GEMMs", "as is", False),
            ("without the A loads and products: the weight stream, the slot hand-overs, the sums, the waits",
             "-DSGC_SKIP_COMPUTE", True),
            ("without the A loads and products, nor the waits", "-DSGC_SKIP_COMPUTE", False),
            ("without the products and the weight stream", both, True),
            ("without the products, the weight stream, nor the waits", both, False))
    for starts, switches, wait in rows:
        assert _row(PAGE, starts)[1:] == [f"{_streamed_us(form, switches, wait):.2f}" for form in ("first", "second")], \
            starts
    flat = " ".join(PAGE.split())
    variants = json.loads(STREAMED_JSON.read_text())["variants"]
    assert f"the kernel {variants['streamed']['us_per_layer']:.2f} us per layer" in flat
    assert f"the chain as PyTorch ops {variants['library_per_op']['us_per_layer']:.2f} us" in flat
    assert f"(relative L2 error {variants['library_per_op']['rel_l2_vs_reference']:.1e} against" in flat
    stream, waits = (_streamed_us("second", "-DSGC_SKIP_COMPUTE", w) for w in (False, True))
    bare, bare_waits = (_streamed_us("second", both, w) for w in (False, True))
    assert f"34.6 MB per layer in {stream:.2f} us, {34.6 / stream:.1f} TB/s" in flat
    assert f"costs ~{(waits - stream) / 4:.2f} us while the stream runs ({waits:.2f} against {stream:.2f} us" in flat
    assert f"~{(bare_waits - bare) / 4:.2f} us without it ({bare_waits:.2f} against {bare:.2f})" in flat
    assert f"the stream: {bare:.2f} us per layer with neither stream nor products" in flat


def test_the_rtc_rows_quote_their_result_file():
    rows = json.loads(RTC.read_text())["rows"]
    assert _row(PAGE, "off (plain)")[1] == f"{rows['plain']['replay_ms']:.3f} ms"
    for mode, row in rows.items():
        if mode == "plain":
            continue
        cells = _row(PAGE, f"`{mode}`")
        assert cells[1:] == [f"{row['replay_ms']:.3f} ms", f"+{row['over_plain_ms']:.3f} ms",
                             f"{row['cosine_vs_reference']:.6f}", f"{row['reference_fp32_ms']:.1f} ms"], mode


def test_the_streamed_chain_h100_rows_quote_their_result_files():
    """The tree's streamed chain and its hand-over on the H100: every row, and the differences the text draws
    from them."""
    chain = json.loads(STREAMED_H100.read_text())["variants"]
    labels = {"streamed": "`streamed` (the paired MLP)",
              "library_per_op": "`library_per_op` (the chain as PyTorch ops)"}
    for name, r in chain.items():
        assert _row(PAGE, labels.get(name, f"`{name}`"))[1:] == _chain_cells(r), name
    us = {name: r["us_per_layer"] for name, r in chain.items()}
    flat = " ".join(PAGE.split())
    assert f"{us['streamed']:.2f} against {us['streamed_four_gemms']:.2f} us per layer, " \
           f"{us['streamed_four_gemms'] - us['streamed']:.2f} us" in flat
    assert f"{us['streamed_no_products']:.2f} - {us['streamed_no_compute']:.2f} = " \
           f"{us['streamed_no_products'] - us['streamed_no_compute']:.2f} us per layer" in flat
    assert f"{us['streamed'] - us['streamed_no_wait']:.2f} us per layer" in flat
    assert f"{us['library_per_op'] / us['streamed']:.2f}x faster" in flat
    steps = json.loads(HANDOVER_H100.read_text())["variants"]
    for name, r in steps.items():
        assert _row(PAGE, f"`{name}`")[1:] == [f"{r['us_per_step']:.2f}"], name
        assert r["mismatches"] in (None, 0), name
    base = steps["counter_only"]["us_per_step"]
    assert f"40 KB per CTA after a hand-over adds {steps['read_40kb']['us_per_step'] - base:.2f} us" in flat
    assert f"one CTA reading 256 KB adds {steps['read_256kb_8_readers']['us_per_step'] - base:.2f} us" in flat


def test_the_groot_predict_split_quotes_its_result_file():
    result = json.loads(GROOT_SPLIT_H100.read_text())
    rows = result["instructions"]
    flat = " ".join(PAGE.split())
    for key, label in (("predict_s", "`predict`"), ("prepare_inputs_s", "`prepare_inputs`"),
                       ("sample_actions_s", "`sample_actions`")):
        ms = [r[key] * 1e3 for r in rows]
        assert f"{min(ms):.1f}-{max(ms):.1f} ms" in flat, key
    assert f"{result['torch_threads']} torch threads on {result['usable_cpus']} usable CPUs" in flat


def test_the_a_window_rows_quote_their_result_file():
    """The streamed chain's A window on the H100: the quoted rows, the trace's phases and the differences drawn."""
    result = json.loads(STREAMED_WINDOW_H100.read_text())
    chain = result["variants"]
    labels = {"streamed": "`streamed` (A in registers, the paired MLP)",
              "streamed_stream_only": "`streamed_stream_only` (the weight stream alone)"}
    for name in ("streamed", "streamed_a_window", "streamed_a_window_cluster2", "streamed_a_window_cluster4",
                 "streamed_a_window_no_wait", "streamed_a_window_no_products", "streamed_stream_only"):
        assert _row(PAGE, labels.get(name, f"`{name}`"))[1:] == _chain_cells(chain[name]), name
    phases = ("wait", "A", "to the first product", "products", "sums", "barrier", "step", "to the next step")
    for trace, form in (("streamed", "registers"), ("streamed_a_window", "window")):
        for kind, row in result["traces"][trace]["steps"].items():
            assert _row(PAGE, f"{kind}, {form}")[1:] == [f"{row[p]:.0f}" for p in phases], (trace, kind)
    across = result["traces"]["streamed_a_window"]["across_ctas"]
    flat = " ".join(PAGE.split())
    assert (f"the releases of a step spread over {across['release_spread_ns']:.0f} ns; from the last release, the "
            f"first CTA has its inputs {across['last_release_to_first_ready_ns']:.0f} ns later, the last "
            f"{across['last_release_to_last_ready_ns']:.0f} ns later") in flat
    us = {name: r["us_per_layer"] for name, r in chain.items()}
    assert f"{us['streamed_a_window']:.2f} against {us['streamed']:.2f} us per layer" in flat
    assert f"Clusters of 2 save another {us['streamed_a_window'] - us['streamed_a_window_cluster2']:.2f} us" in flat
    assert chain["streamed_a_window_cluster4"]["ctas"] == 120 and "on 120 CTAs" in flat
    assert f"{chain['streamed_stream_only']['weight_tb_per_s']:.2f} TB/s ({us['streamed_stream_only']:.2f} us" in flat


def test_the_paired_mlp_sums_rows_quote_their_result_file():
    """The streamed chain's paired MLP sums on the H100: the quoted rows, the MLP step's traced phases and the
    differences drawn."""
    result = json.loads(STREAMED_SUMS_H100.read_text())
    chain = result["variants"]
    labels = {**WINDOW_FORM_LABELS, "streamed_stream_only": "the weight stream alone"}
    for name, label in labels.items():
        assert _row(PAGE, label)[1:] == _chain_cells(chain[name]), name
    for trace, label in (("streamed_a_window_cluster2", "atomics of every CTA"),
                         ("streamed_a_window_cluster2_down_sum", "the cluster sum")):
        mlp, qkv = result["traces"][trace]["steps"]["mlp"], result["traces"][trace]["steps"]["qkv"]
        assert _row(PAGE, label)[1:] == [f"{mlp[p]:.0f}" for p in ("wait", "A", "down products", "down sums", "step")
                                         ] + [f"{qkv['wait']:.0f}"], trace
    us = {name: r["us_per_layer"] for name, r in chain.items()}
    flat = " ".join(PAGE.split())
    assert (f"The atomics cost {us['streamed_a_window_cluster2'] - us['streamed_a_window_cluster2_no_atomics']:.2f}"
            f" us per layer ({us['streamed_a_window_cluster2']:.2f} against "
            f"{us['streamed_a_window_cluster2_no_atomics']:.2f} without them)") in flat
    assert (f"In the same process it is {us['streamed_a_window_cluster2_down_sum']:.2f} against "
            f"{us['streamed_a_window_cluster2']:.2f} us") in flat
    assert chain["streamed_a_window_cluster4_down_sum"]["ctas"] == 120


def test_the_sliced_hand_over_rows_quote_their_result_file():
    """The hand-over by slices on the H100: each row's two forms and the difference drawn."""
    chain = json.loads(HANDOVER_SLICED_H100.read_text())["variants"]
    extra = []
    for kb in (20, 40, 80):
        whole, sliced = chain[f"read_{kb}kb"]["us_per_step"], chain[f"read_{kb}kb_sliced"]["us_per_step"]
        assert _row(PAGE, str(kb))[1:] == [f"{whole:.2f}", f"{sliced:.2f}"], kb
        assert chain[f"read_{kb}kb_sliced"]["slices"] == 8 and chain[f"read_{kb}kb_sliced"]["mismatches"] == 0
        extra.append(sliced - whole)
    flat = " ".join(PAGE.split())
    assert f"costs {min(extra):.2f} to {max(extra):.2f} us more per step" in flat


def test_the_streamed_chain_h200_rows_quote_their_result_file():
    """The streamed chain on the H200, FP8 weights among its forms: the quoted rows, the fastest form's steps, and
    its comparison with the engine's four GEMM kernels under PDL (the denoise ablation's file)."""
    result = json.loads(STREAMED_H200.read_text())
    assert result["device"] == "NVIDIA H200" and result["layers"] == 180 and result["rows"] == 10
    chain = result["variants"]
    labels = {**WINDOW_FORM_LABELS, "streamed": "A in registers (no window)",
              "streamed_stream_only": "the weight stream alone, bf16", "library_per_op": "the chain as PyTorch ops"}
    labels |= {f"{name}_fp8": f"{labels[name]}, FP8 weights" for name in (
        "streamed_a_window", "streamed_a_window_four_gemms", "streamed_a_window_cluster2_down_sum")}
    labels["streamed_stream_only_fp8"] = "the weight stream alone, FP8"
    for name, label in labels.items():
        assert _row(PAGE, f"{label}, H200")[1:] == _chain_cells(chain[name]), name
    steps = result["traces"]["streamed_a_window_cluster2_down_sum"]["steps"]
    for kind, label in (("qkv", "QKV with its norm"), ("o", "O"), ("mlp", "the paired MLP with its norm")):
        p = steps[kind]
        assert _row(PAGE, f"{label}, H200")[1:] == [
            f"{p['wait']:.0f}", f"{p['A']:.0f}", f"{p['to the first product'] + p['products'] + p['sums']:.0f}",
            f"{p['barrier']:.0f}", f"{p['step']:.0f}"], kind
    us = {name: r["us_per_layer"] for name, r in chain.items()}
    fastest = min(us[name] for name in labels if chain[name]["rel_l2_vs_reference"] is not None)   # right forms
    assert fastest == us["streamed_a_window_cluster2_down_sum"]
    ablation = json.loads(ABLATION.read_text())
    gemms_us = ablation["ablations"]["norms_attention"]["ms"] * 1e3 / ablation["layers"]
    whole_us = ablation["whole_ms"] * 1e3 / ablation["layers"]
    flat = " ".join(PAGE.split())
    assert f"its fastest form takes {fastest:.2f} us per layer for the four GEMMs alone, against {gemms_us:.1f} us" \
        in flat
    assert f"{fastest:.2f} us per layer for the four GEMMs, is slower than the engine's four GEMM kernels under PDL, " \
           f"{gemms_us:.1f} us per layer" in flat
    assert f"the engine's whole layer with its norms and attention ({whole_us:.1f} us there)" in flat
    before = [steps[k]["wait"] + steps[k]["A"] for k in ("qkv", "mlp")]
    assert f"{min(before) / 1e3:.1f}-{max(before) / 1e3:.1f} us of each normalized step" in flat
    assert (f"{us['streamed_a_window_fp8']:.2f} against {us['streamed_a_window']:.2f} us with the window alone, "
            f"{us['streamed_a_window_cluster2_down_sum_fp8']:.2f} against {fastest:.2f} in clusters") in flat


def test_the_host_resize_rows_quote_their_result_file():
    ms = {(r["height"], r["width"], r["path"]): r["median_ms"] for r in json.loads(HOST_RESIZE.read_text())["rows"]}
    labels = {(224, 224): "224 x 224 (no resize)", (480, 640): "480 x 640", (720, 1280): "720 x 1280"}
    for (h, w), label in labels.items():
        assert _row(PAGE, label)[1:] == [f"{ms[h, w, 'pillow']:.2f} ms", f"{ms[h, w, 'numpy']:.2f} ms"]
    assert ms[480, 640, "pillow"] < ms[480, 640, "numpy"] and ms[720, 1280, "pillow"] < ms[720, 1280, "numpy"]
