"""The graph engine on a GPU: accuracy gate vs the fp32 reference (full-size random weights), graph replay vs
eager, no recapture for a new prompt. Skips without CUDA.

Full-size checkpoints are generated once (flashrt_core.fixtures) into $FLASHRT_FULL_CKPT_ROOT/<config>
(default: $FLASHRT_CACHE_DIR/full), which takes about a minute per config.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine import tuning
from flashrt_core.engine import EngineOptions, Op, build_executor
from flashrt_core.engine.gate import GATE_BF16, GATE_FP8, cosine, random_observation, reference_actions
from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.engine.forward import pi0_fused_step_ends
from flashrt_core.engine.fp8 import wide_linears
from flashrt_core.engine.fp8_calibration import calibrate_executor
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import CONFIG_FILE, write_random_checkpoint

pytestmark = pytest.mark.gpu

GATE_OBSERVATIONS = 3
REPLAY_ATOL = 0.0  # the same kernels on the same inputs: bitwise equal
FUSION_COSINE = 0.99995  # a fusion on vs off: same math, bf16 roundings in other places (gate: 0.999 vs fp32)
FUSION_COSINE_FP8 = 0.9995  # the FP8 quantization moved into GeGLU: a few down-GEMM inputs land one E4M3 step away
                            # (no bf16 rounding before quantizing), far inside the FP8 gate (0.998 vs fp32)
# Engines whose checks do not depend on the chain tuning's picks (the variant gates, the switch flips) tune in one
# pass instead of the default two: a pass takes ~17-20 s per full-size engine (interleaved timing). The default
# gates and the tuning's own tests keep the default.
ONE_PASS = {"chain_tuning_passes": 1}
# What a build stopped midway may leave allocated, as a share of what a whole build takes: caches made once per
# process (cuBLAS workspaces of a new stream), never the stopped engine's weights, workspaces or graphs.
STOPPED_BUILD_LEFT = 0.05


def _checkpoint(name: str) -> Path:
    root = Path(os.environ.get("FLASHRT_FULL_CKPT_ROOT")
                or Path(os.environ.get("FLASHRT_CACHE_DIR", Path.home() / ".cache" / "flashrt")) / "full")
    path = root / name
    if not (path / CONFIG_FILE).is_file():
        write_random_checkpoint(path, name, seed=0)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("pi05_tiny")
    write_random_checkpoint(path, "pi05_tiny", seed=1)
    return load_model_weights(path, get_config("pi05_tiny"), "cuda", torch.float32)


def test_build_executor_picks_the_graph_engine(tiny):
    ex = build_executor(tiny, tiny.config, torch.device("cuda"), "auto")
    assert isinstance(ex, EngineExecutor) and ex.use_graph
    off = build_executor(tiny, tiny.config, torch.device("cuda"), "auto", EngineOptions(fast_paths=False))
    assert isinstance(off, ReferenceExecutor)


def test_graph_replay_equals_eager_engine(tiny):
    cfg = tiny.config
    graph = build_executor(tiny, cfg, torch.device("cuda"), "auto")
    eager = build_executor(tiny, cfg, torch.device("cuda"), "auto", EngineOptions(cuda_graph=False))
    assert not eager.use_graph
    eager.ops.decoder_impl = dict(graph.ops.decoder_impl)   # the load-time tuning may pick differently per build
    for seed in range(3):
        obs = random_observation(cfg, np.random.default_rng(seed), views=2, n_text=7 + seed)
        args = (obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
        got, want = graph.predict_observation(*args), eager.predict_observation(*args)
        np.testing.assert_allclose(got, want, atol=REPLAY_ATOL, rtol=0)


@pytest.mark.parametrize("switch", ["rope_in_attention", "gemm_epilogue", "fp8_fused_quant", "prefix_attention_tuning"])
def test_fusion_switch_keeps_the_actions(switch):
    """Full-size pi0.5, the graph engine with one switch at its default and flipped: the fusion moves work between
    kernels (RoPE into the attention; bias + GELU into the fc1 GEMM's epilogue; the FP8 quantization of the down
    GEMM's input into the GeGLU kernel, FP8 engines; the prefix attention to SDPA where it measured faster), so
    the actions agree to bf16 rounding (one FP8 step on a few values for the quantization), far inside the accuracy
    gate, and the switch really changes the dispatch."""
    cfg = get_config("pi05")
    model = load_model_weights(_checkpoint("pi05"), cfg, "cuda", torch.bfloat16)
    fp8 = switch == "fp8_fused_quant"
    fused = build_executor(model, cfg, torch.device("cuda"), "auto", EngineOptions(fp8=fp8, **ONE_PASS))
    plain = build_executor(model, cfg, torch.device("cuda"), "auto",                 # the switch flipped
                           EngineOptions(fp8=fp8, **ONE_PASS, **{switch: not getattr(EngineOptions(), switch)}))
    op = {"rope_in_attention": "decoder_qkv", "gemm_epilogue": "vision_gelu", "fp8_fused_quant": "fp8_input_quant",
          "prefix_attention_tuning": "prefix_attention"}[switch]
    assert fused.dispatch.summary() != plain.dispatch.summary(), op
    if fp8:                     # both calibrated on the same observation: the same scales
        calibration = random_observation(cfg, np.random.default_rng(7), views=2, n_text=20, vocab=1024)
        for engine in (fused, plain):
            calibrate_executor(engine, [calibration])
    for seed in range(2):
        obs = random_observation(cfg, np.random.default_rng(seed), views=2, n_text=20 + seed, vocab=1024)
        args = (obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
        assert cosine(fused.predict_observation(*args), plain.predict_observation(*args)) >= \
            (FUSION_COSINE_FP8 if fp8 else FUSION_COSINE)
    del fused, plain, model
    torch.cuda.empty_cache()


def test_new_prompt_does_not_recapture(tiny):
    cfg = tiny.config
    engine = build_executor(tiny, cfg, torch.device("cuda"), "auto")
    obs = random_observation(cfg, np.random.default_rng(0), views=2, n_text=9)
    engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    graphs = {k: e.graph for k, e in engine.entries.items()}
    obs2 = random_observation(cfg, np.random.default_rng(1), views=2, n_text=15)
    out = engine.predict_observation(obs2.images, obs2.tokens, obs2.token_mask, obs2.state, obs2.noise)
    assert {k: e.graph for k, e in engine.entries.items()} == graphs
    ref = reference_actions(ReferenceExecutor(tiny, cfg, torch.device("cuda")), obs2)
    assert cosine(out, ref) >= GATE_BF16


class Consulted:
    """A stop condition (flashrt_core.stopping) that counts its consultations and holds from the `stop_at`-th on
    (None: never)."""

    def __init__(self, stop_at: int | None = None):
        self.stop_at, self.calls = stop_at, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.stop_at is not None and self.calls >= self.stop_at


def test_a_stopped_build_frees_its_gpu_memory_and_a_stopped_capture_is_made_at_the_next_predict(tiny):
    """build_executor under stop_when, stopped at its first, middle and last step (the tuning's candidates and the
    chain tuning's denoiser captures): Stopped names the step, and once it is gone the GPU memory the build took is
    free again. A first predict stopped before its graph capture leaves the engine as it was: the next predict
    captures the graph and gives the eager engine's actions bit for bit."""
    import gc
    from flashrt_core.stopping import Stopped, stop_when
    cfg, dev = tiny.config, torch.device("cuda")
    options = EngineOptions(**ONE_PASS)
    gc.collect()
    start = torch.cuda.memory_allocated(dev)
    counted = Consulted()
    with stop_when(counted):
        engine = build_executor(tiny, cfg, dev, "auto", options)
    built = torch.cuda.memory_allocated(dev)
    assert counted.calls > 2 and built > start
    for stop_at in (1, counted.calls // 2, counted.calls):
        with stop_when(Consulted(stop_at)), pytest.raises(Stopped, match="^stopped at (tuning: |capturing )"):
            build_executor(tiny, cfg, dev, "auto", options)
        gc.collect()
        left = torch.cuda.memory_allocated(dev) - built
        assert left <= STOPPED_BUILD_LEFT * (built - start), (stop_at, left, built - start)
    obs = random_observation(cfg, np.random.default_rng(0), views=2, n_text=9)
    args = (obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    with stop_when(lambda: True), pytest.raises(Stopped, match="^stopped at capturing graph "):
        engine.predict_observation(*args)
    assert all(entry.graph is None for entry in engine.entries.values())
    got = engine.predict_observation(*args)
    assert all(entry.graph is not None for entry in engine.entries.values())
    eager = build_executor(tiny, cfg, dev, "auto", EngineOptions(cuda_graph=False, **ONE_PASS))
    eager.ops.decoder_impl = dict(engine.ops.decoder_impl)
    eager.ops.set_launch_policy(engine.ops.launch_policy)
    np.testing.assert_allclose(got, eager.predict_observation(*args), atol=REPLAY_ATOL, rtol=0)


def test_overlapped_first_step_graph_gives_the_sequential_graphs_actions(tiny):
    """overlap_first_step (the default): the captured graph with the denoiser on a second stream (two branches, an event
    per prefix layer) gives the actions of the sequential graph and passes the bf16 gate against the reference, on
    several observations, replayed more than once; the quick check before the full-size gates."""
    cfg = tiny.config
    engines = {flag: build_executor(tiny, cfg, torch.device("cuda"), "auto", EngineOptions(overlap_first_step=flag))
               for flag in (False, True)}
    assert engines[True].ops.overlap_first_step and not engines[False].ops.overlap_first_step
    reference = ReferenceExecutor(tiny, cfg, torch.device("cuda"))
    for seed in range(3):
        obs = random_observation(cfg, np.random.default_rng(seed), views=1 + seed % 2, n_text=7 + 5 * seed)
        outs = {flag: [e.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
                       for _ in range(2)] for flag, e in engines.items()}
        assert all(entry.graph is not None for entry in engines[True].entries.values())     # captured, replayed
        np.testing.assert_array_equal(outs[True][0], outs[True][1])                           # replays agree
        np.testing.assert_allclose(outs[True][0], outs[False][0], atol=2e-3, rtol=0)
        assert cosine(outs[True][0], reference_actions(reference, obs)) >= GATE_BF16


@pytest.mark.parametrize("name,precision", [
    ("pi05", "bf16"), ("pi0", "bf16"),
    ("pi05", "fp8"), ("pi0", "fp8"),        # FP8 on the default scope (backbone MLP), per-tensor static scales
    ("pi05", "bf16+smem_gemm"),             # every decoder GEMM forced to the shared-memory (TMA) kernels
    ("pi05", "bf16+no_smem_gemm"),          # the shared-memory GEMMs and early PDL triggers off
    ("pi05", "bf16+no_fused_patch_embed"),  # the patch embedding as torch ops, fp32 GEMM (the fused one: default)
    ("pi05", "bf16+no_fused_denoise_step"),  # the step ends as separate ops (the fused ones: default)
    ("pi05", "fp8+no_fused_denoise_step"),
    ("pi0", "bf16+smem_gemm_rows"),         # the TMA GEMMs forced at pi0's 51 rows (horizon 50; the x ring kernel)
    ("pi0", "bf16+no_fused_denoise_step_pi0"),  # pi0's step ends as separate ops (fused: the default), horizon 50
    ("pi05", "bf16+prefix_attention_wgmma"),  # the prefix attention forced to kernels/flashrt_kernels/prefix_attention.py
    ("pi05", "bf16+no_overlap_first_step"),  # the first denoising step after the prefix, one stream (the
    ("pi0", "fp8+no_overlap_first_step"),     # default: beside it, two streams)
])
def test_accuracy_gate_full_size(name, precision):
    cfg = get_config(name)
    model = load_model_weights(_checkpoint(name), cfg, "cuda", torch.float32)
    reference = ReferenceExecutor(model, cfg, torch.device("cuda"))
    prec, _, extra = precision.partition("+")
    engine = build_executor(model, cfg, torch.device("cuda"), "auto",
                            EngineOptions(fp8=prec == "fp8",
                                          smem_gemm=extra != "no_smem_gemm",
                                          pdl_early_trigger=extra != "no_smem_gemm",
                                          fused_patch_embed=extra != "no_fused_patch_embed",
                                          fused_denoise_step=extra != "no_fused_denoise_step",
                                          fused_denoise_step_pi0=extra != "no_fused_denoise_step_pi0",
                                          overlap_first_step=extra != "no_overlap_first_step",
                                          **(ONE_PASS if extra else {})))
    assert isinstance(engine, EngineExecutor) and engine.use_graph
    assert engine.name.endswith(prec)
    assert engine.ops.fused_patch_embed == (extra != "no_fused_patch_embed")
    assert engine.ops.fused_denoise_step == (extra != "no_fused_denoise_step")
    assert engine.ops.fused_denoise_step_pi0 == (extra not in ("no_fused_denoise_step", "no_fused_denoise_step_pi0"))
    assert engine.ops.overlap_first_step == (extra != "no_overlap_first_step")
    if name == "pi0":                       # the fused step ends serve pi0 (fp8 leaves its step GEMMs in bf16)
        assert pi0_fused_step_ends(engine.weights, engine.ops) == engine.ops.fused_denoise_step_pi0
        if engine.ops.smem_gemm:            # pi0's 51 rows: the ring kernel was weighed
            assert engine.suffix_len > 16 and engine.ops.smem_gemm_rows
            assert all(any(c.startswith("gluon_smem") for c in engine.ops.decoder_timings[kind])
                       for kind in ("qkv", "o", "gate_up", "down")), engine.ops.decoder_timings
    if extra.startswith("smem_gemm"):       # the tuning weighed the TMA GEMMs; force them
        assert all(any(c.startswith("gluon_smem") for c in engine.ops.decoder_timings[kind])
                   for kind in ("qkv", "o", "gate_up", "down")), engine.ops.decoder_timings
        from flashrt_core.engine.kernel_configs import SMEM_CANDIDATES, SmemConfig
        engine.ops.decoder_impl.update({kind: SmemConfig(cands[0].split_k) for kind, cands in SMEM_CANDIDATES.items()})
        engine._entries.clear()     # recapture with them
        assert (engine.suffix_len > 16) == (extra == "smem_gemm_rows"), engine.suffix_len    # the ring kernel
    if extra == "prefix_attention_wgmma":   # the tuning (a default candidate) checked it and timed it; force it
        assert {"wgmma", "wgmma_overlap"} <= set(engine.ops.prefix_attention_timings), \
            engine.ops.prefix_attention_timings
        engine.ops.prefix_attention_impl = "wgmma"
        engine._entries.clear()
    cosines = []
    if prec == "fp8":                       # calibrated on the first gate observation: every backbone MLP GEMM in FP8
        calibrate_executor(engine, [random_observation(cfg, np.random.default_rng(0), views=2, n_text=20,
                                                       vocab=1024)])
        assert all(lin.fp8 is not None and lin.fp8.calibrated for lin in wide_linears(engine.weights))
    for seed in range(GATE_OBSERVATIONS):
        obs = random_observation(cfg, np.random.default_rng(seed), views=2 + seed % 2, n_text=20 + 13 * seed,
                                 vocab=1024)
        got = engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
        cosines.append(cosine(got[:, :cfg.action_dim], reference_actions(reference, obs)[:, :cfg.action_dim]))
    del engine, reference, model
    torch.cuda.empty_cache()
    gate = GATE_FP8 if precision.startswith("fp8") else GATE_BF16
    assert min(cosines) >= gate, f"{name} {precision}: cosine per observation {cosines}"


def test_vision_attention_backends_match_the_softmax_attention_and_the_fastest_is_kept():
    """Every SDPA backend the vision attention may be tuned to (torch's choice, flash, memory-efficient, cuDNN), at
    pi0.5's vision shape (2 views, 256 tokens, 16 heads of 72) on the strided q / k / v views of one QKV output,
    against the fp32 softmax attention; then the tuning times exactly the backends that run and keeps the
    fastest."""
    from flashrt_core.engine import detect_hardware, resolve
    from flashrt_core.engine.kernel_configs import VISION_ATTENTION_BACKENDS
    from flashrt_core.engine.ops import Ops
    dev = torch.device("cuda")
    vc = get_config("pi05").vision
    ops = Ops(resolve(detect_hardware("auto", dev), EngineOptions()))
    g = torch.Generator(device=dev).manual_seed(5)
    qkv = torch.randn(2, vc.num_patches, 3, vc.num_heads, vc.head_dim, device=dev, generator=g).to(torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    scale = vc.head_dim ** -0.5
    want = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, dim=-1) @ v.float()
    want = want.transpose(1, 2).reshape(2 * vc.num_patches, vc.num_heads * vc.head_dim)   # token-major rows
    ran = []
    for backend in VISION_ATTENTION_BACKENDS:
        try:
            got = ops.attention(q, k, v, scale, backend)
        except RuntimeError:             # no kernel of this backend for the shape: the tuning leaves it out too
            continue
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
        ran.append(backend)
    assert "default" in ran and len(ran) >= 2, ran
    times = tuning.tune_vision_attention(ops, 2, vc.num_patches, vc.num_heads, vc.head_dim, torch.bfloat16, dev, vc.depth)
    assert set(times) == set(ran)
    assert ops.vision_attention_backend == min(times, key=times.get)
    assert all(0.5 < us < 500 for us in times.values()), times


def test_tuning_cache_reuses_the_picks_and_measures_where_an_entry_does_not_fit(tmp_path):
    """With options.tuning_cache, the first engine measures and stores its picks; a second engine of the same
    model and options reads them (no tuning ran: no chain timings) and runs the same kernels, so its actions are
    bitwise the first one's; an entry with a pick this engine does not have is left aside and measured again."""
    import json
    cfg = get_config("pi05")
    model = load_model_weights(_checkpoint("pi05"), cfg, "cuda", torch.bfloat16)
    options = EngineOptions(tuning_cache=str(tmp_path))
    first = build_executor(model, cfg, torch.device("cuda"), "auto", options)
    assert first.tuning_source == "measured" and first.decoder_chain_timings
    path = first.tuning_cache_path
    assert path is not None and path.parent == tmp_path
    picks = json.loads(path.read_text())["picks"]
    assert picks == first.tuning_picks()
    assert set(picks["decoder"]) == {"qkv", "o", "gate_up", "down"} and picks["launch_policy"] == \
        first.ops.launch_policy
    second = build_executor(model, cfg, torch.device("cuda"), "auto", options)
    assert second.tuning_source == "cache" and second.tuning_cache_path == path
    assert second.decoder_chain_timings == {} and second.ops.decoder_timings == {}      # nothing was measured
    assert second.tuning_picks() == picks
    assert second.ops.early_sites == first.ops.early_sites
    obs = random_observation(cfg, np.random.default_rng(3), views=2, n_text=20, vocab=1024)
    a = first.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    b = second.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    assert np.abs(a - b).max() == 0.0, "the same picks gave other actions"
    del second
    entry = json.loads(path.read_text())
    entry["picks"]["decoder"]["o"] = "gluon_smem(s3)"                   # no such candidate
    path.write_text(json.dumps(entry))
    third = build_executor(model, cfg, torch.device("cuda"), "auto", options)
    assert third.tuning_source == "measured" and third.decoder_chain_timings
    assert json.loads(path.read_text())["picks"] == third.tuning_picks()             # written again
    assert str(third.ops.decoder_impl["o"]) != "gluon_smem(s3)"
    del first, third, model
    torch.cuda.empty_cache()


def test_chain_tuning_times_graphs_in_turn_and_ranks_them_by_their_work():
    """interleaved_replay_ms, the chain tuning's timer: every graph gets a time, and of two captured graphs that
    differ only in how much they do (4 and 16 dependent 2048x2048 GEMMs on random inputs), the bigger one is
    timed slower, by about its work."""
    from flashrt_core.engine.timing import interleaved_replay_ms, side_stream
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(2048, 2048, device="cuda", generator=g, dtype=torch.bfloat16) / 45
    stream = side_stream(torch.device("cuda"))
    graphs = {}
    for n in (4, 16):
        x = torch.randn(2048, 2048, device="cuda", generator=g, dtype=torch.bfloat16)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            x @ a                                           # cuBLAS makes its handle outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(n):
                x = x @ a
        graphs[n] = graph
    times = interleaved_replay_ms(graphs, rounds=5, reps=3)
    assert set(times) == {4, 16} and all(ms > 0 for ms in times.values()), times
    assert 2.0 < times[16] / times[4] < 6.0, times


@pytest.mark.parametrize("early", [False, True], ids=["pdl", "pdl_early_trigger"])
def test_chain_tuning_keeps_the_fastest_candidate_inside_the_denoiser(early):
    """The decoder GEMMs are picked by the captured denoiser's time: every kind the isolated tuning measured with
    more than one candidate is timed again in the chain, each of its candidates, and the fastest there is kept.
    With pdl_early_trigger (the default), the launch policy is picked the same way first."""
    from flashrt_core.engine.kernel_configs import LAUNCH_POLICIES
    cfg = get_config("pi05")
    model = load_model_weights(_checkpoint("pi05"), cfg, "cuda", torch.bfloat16)
    engine = build_executor(model, cfg, torch.device("cuda"), "auto", EngineOptions(pdl_early_trigger=early))
    assert engine.dispatch[Op.CHAIN_TUNING] == "chain"
    assert 1 <= engine.decoder_chain_passes <= engine.dispatch.options.chain_tuning_passes == 2
    chain = dict(engine.decoder_chain_timings)
    if early:
        policies = chain.pop("launch_policy")
        assert set(policies) == set(LAUNCH_POLICIES)
        assert engine.ops.launch_policy == min(policies, key=policies.get), policies
        assert engine.ops.early_sites == LAUNCH_POLICIES[engine.ops.launch_policy]
    else:
        assert "launch_policy" not in chain and engine.ops.launch_policy == "none"
    assert set(chain) == {kind for kind, alone in engine.ops.decoder_timings.items() if len(alone) > 1}
    assert {"down", "o", "gate_up", "qkv"} <= set(chain)               # full size: Triton candidates fit every kind
    for kind, times in chain.items():
        assert set(times) == set(engine.ops.decoder_timings[kind]), kind       # the same candidates as alone
        assert all(2.0 < ms < 100.0 for ms in times.values()), (kind, times)   # a whole denoise: milliseconds
        assert str(engine.ops.decoder_impl[kind]) == min(times, key=times.get), (kind, times)
    obs = random_observation(cfg, np.random.default_rng(0), views=2, n_text=20, vocab=1024)
    assert np.isfinite(engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)).all()
    del engine, model
    torch.cuda.empty_cache()
