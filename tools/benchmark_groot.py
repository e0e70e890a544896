"""Benchmark GR00T N1.6: the eager reference executor against the graph executor's replay, in one process.

Random weights of a preset (full size "groot_n1.6" by default: groot_fixtures.random_groot_model, built in memory;
timing does not depend on the values) in --dtype, `--views` camera views of --image x --image uint8 pixels through
the policy's preprocessing (224 x 224 -> 252 x 252, 81 image tokens each), a prompt of --prompt-tokens random text
ids followed by each view's image slots between two marker ids (the Eagle prompt's layout), the state, embodiment
and noise of a predict. Each path runs --warmup times, then --runs times with a device synchronize around each:

  reference      GrootReferenceExecutor.sample_actions (inputs on the device, as the policy gives them)
  graph          GrootGraphExecutor.sample_actions (inputs on the host: staging, one copy, replay, output clone);
                 capture=False off CUDA (the same static code, eager)
  graph replay   the captured graph alone, CUDA events around each replay (CUDA only)
  no fused DiT   the same two with EngineOptions.groot_fused_dit off (the step tables' sampler with the
                 reference DiT's ops: the A/B of engine/groot_fused_dit.py)
  no step tables the same two with EngineOptions.groot_step_tables off (the reference's sampler in the graph)
  cuBLAS DiT     the graph replay and phases with EngineOptions.groot_few_row_gemms off (the fused DiT's GEMMs on
                 cuBLAS instead of the Triton few-row GEMM: the A/B of engine/groot_dit_gemms.py)
  GEMMs alone    the same with EngineOptions.groot_tune_with_norm off (the DiT's split-K GEMMs' configurations
                 timed without the norm that sums their partials)
  SDPA DiT       the same with EngineOptions.groot_head_attention off (torch SDPA and a transpose copy instead of
                 flashrt_kernels/head_attention.py)
  HF language    the same with EngineOptions.groot_engine_language off (transformers' Qwen3 layers instead of
                 engine/groot_language.py)
  gathered steps the same with EngineOptions.groot_step_ends off (the embodiment's weights gathered in every
                 predict and the reference's step ops instead of engine/groot_step_ends.py)
  HF vision      the same with EngineOptions.groot_engine_vision off (transformers' SigLIP2 layers and projector
                 instead of engine/groot_vision.py)
  fp8            the same two with weight-only FP8 on the fused DiT's GEMMs (engine/groot_dit_gemms.py, precision "fp8";
                 on the CPU the few-row GEMM's plain-PyTorch reference)
  phases         vision, language, action head, each captured as a graph of its own (CUDA only), for the graph,
                 the graph without the fused DiT and the FP8 graph

Accuracy: the chunk cosine of the graph (fused DiT on and off), of the FP8 graph and of the reference in --dtype
against an fp32 reference on the same weights (the --dtype weights cast up) over --observations random
observations (mean and worst), and GR00T's gate (engine/groot_gate.py: cosine mean >= 0.999, worst >= 0.995, no
sign flip in the gripper column of the fixtures' embodiment layout) for the graph and the FP8 graph, all on the
same observations in this process.

    python tools/benchmark_groot.py [--config groot_n1.6] [--device cuda] [--dtype bfloat16] [--views 2]
        [--image 224] [--prompt-tokens 30] [--runs N] [--warmup N] [--observations N] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.groot_gate import cosine, gate, gripper_dims  # noqa: E402
from flashrt_core.engine.groot_graph import GrootGraphExecutor  # noqa: E402
from flashrt_core.engine.timing import graph_replay_ms  # noqa: E402
from flashrt_core.groot_fixtures import DEFAULT_ACTION, random_groot_model  # noqa: E402
from flashrt_core.groot_inputs import prepare_views  # noqa: E402
from flashrt_core.groot_policy import GrootReferenceExecutor  # noqa: E402
from flashrt_core.model.groot.config import get_groot_config  # noqa: E402
from tools.benchmark_engine import env_info, write_result  # noqa: E402

EMBODIMENT_ID = 10              # new_embodiment's projector slot
MARKERS = (7, 8)                # the ids around each view's image slots (<img>, </img> in the real vocabulary)


def make_inputs(cfg, args, seed: int) -> tuple:
    """Host tensors in sample_actions' argument order (the policy's preprocessing for the views)."""
    rng = np.random.default_rng(seed)
    names = [f"view{i}" for i in range(args.views)]
    images = [rng.integers(0, 256, (args.image, args.image, 3), dtype=np.uint8) for _ in names]
    views = prepare_views(images, names, cfg)
    pieces = [rng.integers(0, min(cfg.image_token_index, cfg.llm.vocab_size), args.prompt_tokens)]
    for v in views:
        pieces += [[MARKERS[0]], [cfg.image_token_index] * cfg.image_tokens(*v.shape[-2:]), [MARKERS[1]]]
    ids = torch.from_numpy(np.concatenate(pieces).astype(np.int64))[None]
    mask = torch.ones_like(ids, dtype=torch.bool)
    state = torch.from_numpy(rng.uniform(-1, 1, (1, 1, cfg.max_state_dim)).astype(np.float32))
    noise = torch.from_numpy(rng.standard_normal((1, cfg.action_horizon, cfg.max_action_dim)).astype(np.float32))
    return views, ids, mask, state, torch.tensor([EMBODIMENT_ID]), noise


def to_device(inputs: tuple, device: torch.device) -> tuple:
    views, *rest = inputs
    return ([v.to(device) for v in views], *(t.to(device) for t in rest))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        out.append((time.perf_counter() - start) * 1e3)
    return out


def summary(samples: list[float]) -> dict:
    return {"median_ms": float(np.median(samples)), "p99_ms": float(np.percentile(samples, 99)),
            "samples_ms": [round(s, 4) for s in samples]}


# The A/B rows timed by their graph replay and phases alone (CUDA): result name -> (the executor's switch off,
# the table's row label, the phase line's label)
REPLAY_ROWS = {
    "cublas_dit": ({"few_row_gemms": False}, "cuBLAS DiT", "with the DiT's GEMMs on cuBLAS"),
    "sdpa_dit": ({"head_attention": False}, "SDPA DiT", "with the DiT's attention on SDPA"),
    "gemms_timed_alone": ({"tune_with_norm": False}, "GEMMs alone", "with the DiT's split-K GEMMs timed alone"),
    "transformers_language": ({"engine_language": False}, "HF language", "with transformers' language layers"),
    "no_step_ends": ({"step_ends": False}, "gathered steps", "with the embodiment's weights gathered per predict"),
    "transformers_vision": ({"engine_vision": False}, "HF vision", "with transformers' vision layers"),
}


def run(args, argv: list[str]) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cfg = get_groot_config(args.config)
    model = random_groot_model(cfg, seed=0, dtype=dtype, device=device)
    reference = GrootReferenceExecutor(model, device)
    graph = GrootGraphExecutor(model, device)
    unfused = GrootGraphExecutor(model, device, fused_dit=False)
    plain = GrootGraphExecutor(model, device, step_tables=False)
    fp8 = GrootGraphExecutor(model, device, fp8=True)
    host = make_inputs(cfg, args, seed=0)
    on_device = to_device(host, device)
    start = time.perf_counter()
    graph.sample_actions(*host)                                    # the signature's capture (CUDA)
    synchronize(device)
    first_call_s = time.perf_counter() - start
    results = {"reference": summary(timed(lambda: reference.sample_actions(*on_device), device, args.warmup,
                                          args.runs)),
               "graph": summary(timed(lambda: graph.sample_actions(*host), device, args.warmup, args.runs)),
               "graph_no_fused_dit": summary(timed(lambda: unfused.sample_actions(*host), device, args.warmup,
                                                   args.runs)),
               "graph_no_step_tables": summary(timed(lambda: plain.sample_actions(*host), device, args.warmup,
                                                     args.runs)),
               "graph_fp8": summary(timed(lambda: fp8.sample_actions(*host), device, args.warmup, args.runs))}
    (entry,) = graph.entries.values()
    if entry.graph is not None:
        results["graph_replay"] = summary(graph_replay_ms(entry.graph, args.runs))
        (unfused_entry,) = unfused.entries.values()
        results["graph_replay_no_fused_dit"] = summary(graph_replay_ms(unfused_entry.graph, args.runs))
        (plain_entry,) = plain.entries.values()
        results["graph_replay_no_step_tables"] = summary(graph_replay_ms(plain_entry.graph, args.runs))
        (fp8_entry,) = fp8.entries.values()
        results["graph_replay_fp8"] = summary(graph_replay_ms(fp8_entry.graph, args.runs))
        results["phases_ms"] = graph.phase_times(reps=args.runs)
        results["phases_ms_no_fused_dit"] = unfused.phase_times(reps=args.runs)
        results["phases_ms_fp8"] = fp8.phase_times(reps=args.runs)
        for name, (switch_off, _, _) in REPLAY_ROWS.items():        # each switch's A/B: replay and phases
            other = GrootGraphExecutor(model, device, **switch_off)
            other.sample_actions(*host)                            # its capture
            (other_entry,) = other.entries.values()
            results[f"graph_replay_{name}"] = summary(graph_replay_ms(other_entry.graph, args.runs))
            results[f"phases_ms_{name}"] = other.phase_times(reps=args.runs)
            other.close()
    model32 = model if dtype == torch.float32 else copy.deepcopy(model).float()
    reference32 = GrootReferenceExecutor(model32, device)
    wants, chunks_graph, chunks_fp8, cos_unfused, cos_reference = [], [], [], [], []
    for k in range(args.observations):
        obs = make_inputs(cfg, args, seed=100 + k)
        want = reference32.sample_actions(*to_device(obs, device)).float().cpu().numpy()
        wants.append(want)
        chunks_graph.append(graph.sample_actions(*obs).float().cpu().numpy())
        chunks_fp8.append(fp8.sample_actions(*obs).float().cpu().numpy())
        cos_unfused.append(cosine(unfused.sample_actions(*obs).float().cpu().numpy(), want))
        cos_reference.append(cosine(reference.sample_actions(*to_device(obs, device)).float().cpu().numpy(), want))
    grippers = gripper_dims(DEFAULT_ACTION)
    gate_graph, gate_fp8 = gate(chunks_graph, wants, grippers), gate(chunks_fp8, wants, grippers)
    sig = entry.tables.signature
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python tools/benchmark_groot.py " + shlex.join(argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "driver": env_info()["driver"] if device.type == "cuda" else None,
        "weights": f"random {cfg.name} (in memory)", "config": cfg.name, "dtype": args.dtype,
        "executor": graph.name, "fused_dit": graph.fused_dit, "views": args.views, "image": args.image,
        "view_sizes": [list(s) for s in sig.view_sizes], "prompt_len": sig.prompt_len,
        "horizon": cfg.action_horizon, "steps": cfg.num_inference_timesteps, "runs": args.runs,
        "warmup": args.warmup, "first_call_s": first_call_s, **results,
        "speedup": results["reference"]["median_ms"] / results["graph"]["median_ms"],
        "cosine_vs_fp32": {"graph_mean": gate_graph.mean, "graph_worst": gate_graph.worst,
                           "graph_fp8_mean": gate_fp8.mean, "graph_fp8_worst": gate_fp8.worst,
                           "graph_no_fused_dit_mean": float(np.mean(cos_unfused)),
                           "graph_no_fused_dit_worst": float(np.min(cos_unfused)),
                           "reference_mean": float(np.mean(cos_reference)),
                           "reference_worst": float(np.min(cos_reference)),
                           "observations": args.observations},
        "gate": {"graph": gate_graph.as_dict(), "graph_fp8": gate_fp8.as_dict()},
    }


def table(r: dict) -> str:
    (h, w) = r["view_sizes"][0]
    lines = [f"GR00T N1.6 {r['config']} {r['dtype']} on {r['device']}: {r['views']} views {r['image']}x{r['image']} "
             f"({h}x{w}), prompt {r['prompt_len']} tokens, horizon {r['horizon']}, {r['steps']} steps, "
             f"{r['runs']} runs",
             f"{'path':<28}{'median ms':>10}{'p99 ms':>10}"]
    for key, label in (("reference", "reference (eager)"), ("graph", f"{r['executor']} (sample_actions)"),
                       ("graph_replay", "graph replay (GPU)"),
                       ("graph_no_fused_dit", f"{r['executor']}, no fused DiT"),
                       ("graph_replay_no_fused_dit", "graph replay, no fused DiT"),
                       ("graph_no_step_tables", f"{r['executor']}, no step tables"),
                       ("graph_replay_no_step_tables", "graph replay, no step tables"),
                       ("graph_fp8", f"{r['executor']}, FP8 DiT"),
                       ("graph_replay_fp8", "graph replay, FP8 DiT"),
                       *((f"graph_replay_{name}", f"graph replay, {row}")
                         for name, (_, row, _) in REPLAY_ROWS.items())):
        if key in r:
            lines.append(f"{label:<28}{r[key]['median_ms']:>10.2f}{r[key]['p99_ms']:>10.2f}")
    if "phases_ms" in r:
        phase_lines = [("phases_ms", "(each its own graph, median ms)"),
                       ("phases_ms_no_fused_dit", "without the fused DiT"), ("phases_ms_fp8", "with the FP8 DiT"),
                       *((f"phases_ms_{name}", label) for name, (_, _, label) in REPLAY_ROWS.items())]
        for key, label in phase_lines:
            lines.append(f"graph phases {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in r[key].items()))
    c = r["cosine_vs_fp32"]
    lines.append(f"speed-up {r['speedup']:.1f}x; first call {r['first_call_s']:.2f} s (with the capture on CUDA)")
    lines.append(f"cosine vs fp32 reference ({c['observations']} observations): graph mean {c['graph_mean']:.6f} "
                 f"worst {c['graph_worst']:.6f}; without the fused DiT mean {c['graph_no_fused_dit_mean']:.6f} worst "
                 f"{c['graph_no_fused_dit_worst']:.6f}; {r['dtype']} reference mean {c['reference_mean']:.6f} worst "
                 f"{c['reference_worst']:.6f}")
    for key, label in (("graph", f"{r['dtype']} graph"), ("graph_fp8", "FP8 graph")):
        g = r["gate"][key]
        lines.append(f"gate ({label} vs fp32): cosine mean {g['mean']:.6f} (>= {g['gate_mean']}) worst "
                     f"{g['worst']:.6f} (>= {g['gate_worst']}), {g['sign_flips']} gripper sign flips (dims "
                     f"{g['gripper_dims']}): "
                     f"{'pass' if g['passed'] else 'FAIL'}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="groot_n1.6", help="preset with random weights")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--image", type=int, default=224, help="camera image side (before preprocessing)")
    parser.add_argument("--prompt-tokens", type=int, default=30, help="text ids before the image slots")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--observations", type=int, default=4, help="observations of the accuracy check and gate")
    parser.add_argument("--out", help="folder for the JSON result")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    result = run(args, argv)
    print(table(result))
    if args.out:
        write_result(args.out, result, "groot_graph", args.device.split(":")[0], result["config"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
