"""GR00T N1.6's graph kernel by kernel: vision, language and action head each captured as a CUDA graph of its own
(GrootGraphExecutor.phase_graphs) and replayed under torch.profiler; per phase the kernels of one replay, their
span and busy time, and the kernels summed by name (count, total and mean us, exposed us: how much of the span
they account for, phase_profile), the most exposed first.

Random weights of a preset (full size "groot_n1.6" by default; timing does not depend on the values) in bf16,
`--views` camera views of 224 x 224, a prompt of --prompt-tokens random ids before the views' image slots
(benchmark_groot.make_inputs), right-padded by the executor to a multiple of --prompt-multiple (the policy's
groot_prompt_multiple, 16: 196 tokens -> 208). --dit-layers cuts the DiT to fewer blocks (a shorter build when
only the backbone is looked at). Under the profiler each kernel runs a little slower than in a plain replay; the
phase times of benchmark_groot.py are the ones to quote as latency.

    python tools/profile_groot.py [--config groot_n1.6] [--views 2] [--prompt-tokens 30] [--prompt-multiple 16]
        [--dit-layers N] [--top 16] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.groot_graph import GrootGraphExecutor  # noqa: E402
from flashrt_core.groot_fixtures import random_groot_model  # noqa: E402
from flashrt_core.model.groot.config import get_groot_config  # noqa: E402
from tools.benchmark_engine import env_info, write_result  # noqa: E402
from tools.benchmark_groot import make_inputs  # noqa: E402

PROFILED_REPLAYS = 3          # replays under the profiler; the last one is reported


def one_replay(graph, replays: int = PROFILED_REPLAYS) -> list:
    """The GPU kernels (and memsets / copies) of the last of `replays` replays of graph, in start order."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    per_replay = len(events) // replays
    return events[-per_replay:]


def phase_profile(events: list, top: int) -> dict:
    """Kernels, span, busy time and the kernels summed by name (the `top` largest by exposed time) of one replay's
    events. A kernel's exposed time is how far it moves the replay's end: from the latest end of the kernels that
    started before it (or its own start, after an idle gap: the gap counts, it is the launch) to its own end, zero
    when it ends inside them. The exposed times add up to the span; under PDL a kernel's own duration includes its
    wait for the one ahead, so the total is not where the time goes, the exposed time is."""
    span = events[-1].time_range.end - events[0].time_range.start
    busy = sum(e.time_range.end - e.time_range.start for e in events)
    by_name: dict[str, list] = {}
    frontier = events[0].time_range.start
    for e in events:
        row = by_name.setdefault(e.name, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += e.time_range.end - e.time_range.start
        row[2] += max(0.0, e.time_range.end - frontier)
        frontier = max(frontier, e.time_range.end)
    largest = sorted(by_name.items(), key=lambda kv: -kv[1][2])[:top]
    return {"kernels": len(events), "span_us": span, "busy_us": busy,
            "by_name": [{"name": name, "count": count, "total_us": total, "mean_us": total / count,
                         "exposed_us": exposed}
                        for name, (count, total, exposed) in largest]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="groot_n1.6")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--prompt-tokens", type=int, default=30)
    parser.add_argument("--prompt-multiple", type=int, default=16)
    parser.add_argument("--dit-layers", type=int, default=None, help="DiT blocks (default: the preset's)")
    parser.add_argument("--top", type=int, default=16, help="kernel names listed per phase")
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_groot.py profiles CUDA graphs: no CUDA device here", file=sys.stderr)
        return 2
    cfg = get_groot_config(args.config)
    if args.dit_layers is not None:
        cfg = cfg.replace(dit=dataclasses.replace(cfg.dit, num_layers=args.dit_layers))
    device = torch.device("cuda")
    model = random_groot_model(cfg, seed=0, dtype=torch.bfloat16, device=device)
    executor = GrootGraphExecutor(model, device, prompt_multiple=args.prompt_multiple)
    executor.sample_actions(*make_inputs(cfg, args, seed=0))
    (sig,) = executor.entries
    graphs, _held = executor.phase_graphs(sig)
    result = {**env_info(), "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
              "config": args.config, "dit_layers": cfg.dit.num_layers, "views": args.views,
              "prompt_len": sig.prompt_len, "right_padded": sig.right_padded,
              "phases": {name: phase_profile(one_replay(graph), args.top) for name, graph in graphs.items()}}
    print(f"GR00T {args.config} on {result['gpu']}: {args.views} views, prompt {sig.prompt_len} tokens "
          f"(right-padded: {sig.right_padded}), DiT {cfg.dit.num_layers} blocks; one replay of each phase's graph")
    for name, phase in result["phases"].items():
        print(f"== {name}: {phase['kernels']} kernels, span {phase['span_us']:.1f} us, busy {phase['busy_us']:.1f} us")
        print("   exposed     total  count      mean  kernel")
        for row in phase["by_name"]:
            print(f"{row['exposed_us']:8.1f} us {row['total_us']:8.1f} us {row['count']:5d} x {row['mean_us']:6.2f} us  "
                  f"{row['name'][:90]}")
    if args.out:
        write_result(args.out, result, "groot_profile")
    executor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
