"""How long GR00T N1.6's prompt-length warm-up takes at the released size, and that it leaves nothing to capture.

A random-weight checkpoint in the released layout (groot_fixtures.write_random_groot_checkpoint, "groot_n1.6" in
bf16; written to --ckpt-root once) is loaded with `load_model` as the policy node loads it. Then, timed on the
host's clock with the device synchronized:

  load          load_model (weights, the graph executor's preparation)
  first predict the node's first predict with its instruction: the signature's capture (two eager warm-up runs,
                then the capture) and its replay
  warm-up       GrootPolicy.warm_up_text_buckets with the same images and instruction (what the node's configure
                runs with `warmup_all_text_buckets`): one capture per prompt length multiple that an instruction of
                1 to 64 tokens lands in; each signature's capture time from the executor's capture_seconds
  instructions  a predict per instruction of --instruction-lengths words after the warm-up, each with its text
                tokens and the captures its first call made (none may, up to 64 tokens: the exit status says), then
                timed (median of --calls) whole and in its two parts: GrootPolicy.prepare_inputs (the host's image
                processing, tokenization and state) and the executor's sample_actions on those inputs (copies in,
                the replay, the copy out); what predict takes beyond the two is the rest of its host work. The
                host's torch threads, its CPU affinity, cgroup CPU quota and usable CPUs are recorded beside them
                (torch's small host ops slow down when its threads outnumber the CPUs: flashrt_core/host_threads.py).

    python tools/benchmark_groot_warm_up.py --ckpt-root /tmp/groot [--views 2] [--image 224] [--calls 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core import host_threads  # noqa: E402
from flashrt_core.api import load_model  # noqa: E402
from flashrt_core.groot_fixtures import write_random_groot_checkpoint  # noqa: E402
from flashrt_core.groot_policy import WARMUP_INSTRUCTION_TOKENS  # noqa: E402
from tools.benchmark_engine import env_info, write_result  # noqa: E402

CONFIG = "groot_n1.6"
EMBODIMENT = "new_embodiment"
INSTRUCTION = "pick up the cube"


def timed_s(fn) -> tuple[float, object]:
    """(seconds, fn()) with the device synchronized before and after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


WORDS = ("pick", "up", "the", "red", "cube", "and", "place", "it")


def instruction(words: int) -> str:
    """An instruction of `words` short words."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def median_s(fn, calls: int) -> float:
    """The median of `calls` timed_s(fn) seconds."""
    return statistics.median(timed_s(fn)[0] for _ in range(calls))


def measure(ckpt: Path, views: int, image: int, lengths: list[int], calls: int) -> dict:
    load_s, policy = timed_s(lambda: load_model(ckpt, embodiment=EMBODIMENT, device="cuda"))
    executor = policy.executor
    if executor.name != "graph":
        raise SystemExit(f"benchmark_groot_warm_up.py: the graph executor did not load (got {executor.name})")
    rng = np.random.default_rng(0)
    images = {v: rng.integers(0, 256, (image, image, 3), dtype=np.uint8) for v in policy.view_names[:views]}
    state = rng.uniform(-1, 1, policy.state_dim)
    first_s, _ = timed_s(lambda: policy.predict(images, INSTRUCTION, state))
    first_captures = dict(executor.capture_seconds)
    warm_s, warmed = timed_s(lambda: policy.warm_up_text_buckets(images, INSTRUCTION, state))
    captures = {str(sig): s for sig, s in executor.capture_seconds.items() if sig not in first_captures}
    shortest = policy.prepare_inputs(images, "a", state)[1].shape[1]
    later = []
    for words in lengths:
        text = instruction(words)
        inputs = policy.prepare_inputs(images, text, state)
        tokens = inputs[1].shape[1] - shortest + 1                              # its text tokens
        before = len(executor.capture_seconds)
        policy.predict(images, text, state)                  # its first call after the warm-up
        later.append({"words": words, "text_tokens": tokens, "captures": len(executor.capture_seconds) - before,
                      "predict_s": median_s(lambda: policy.predict(images, text, state), calls),
                      "prepare_inputs_s": median_s(lambda: policy.prepare_inputs(images, text, state), calls),
                      "sample_actions_s": median_s(lambda: executor.sample_actions(*inputs), calls)})
    return {"load_s": load_s, "first_predict_s": first_s, "first_capture_s": list(first_captures.values()),
            "warm_up_s": warm_s, "warmed_prompt_lengths": warmed, "warm_up_captures_s": captures,
            "instructions": later, "prompt_multiple": executor.prompt_multiple, "calls": calls,
            "torch_threads": torch.get_num_threads(), "affinity_cpus": len(os.sched_getaffinity(0)),
            "cpu_quota": host_threads.cpu_quota(), "usable_cpus": host_threads.usable_cpus()}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-root", required=True, help="where the released-size checkpoint is (made if missing)")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--image", type=int, default=224, help="camera image side")
    parser.add_argument("--instruction-lengths", type=int, nargs="+", default=[3, 12, 25, 40, 60],
                        help="text tokens of the instructions predicted after the warm-up")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per instruction (their median)")
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmark_groot_warm_up.py needs a CUDA GPU (the warm-up captures CUDA graphs)")
    ckpt = Path(args.ckpt_root) / CONFIG
    if not (ckpt / "config.json").is_file():
        t0 = time.perf_counter()
        write_random_groot_checkpoint(ckpt, CONFIG, seed=0, shards=4, dtype=torch.bfloat16)
        print(f"wrote {ckpt} in {time.perf_counter() - t0:.0f} s", flush=True)
    result = measure(ckpt, args.views, args.image, args.instruction_lengths, args.calls)
    print(f"GR00T N1.6 released size, {args.views} views of {args.image} x {args.image}, {torch.cuda.get_device_name()}")
    print("| step | seconds |\n|---|---|")
    print(f"| load_model | {result['load_s']:.2f} |")
    print(f"| first predict (its capture) | {result['first_predict_s']:.2f} |")
    print(f"| warm_up_text_buckets ({len(result['warmed_prompt_lengths'])} prompt lengths, "
          f"{len(result['warm_up_captures_s'])} captures) | {result['warm_up_s']:.2f} |")
    for sig, s in result["warm_up_captures_s"].items():
        print(f"| capture {sig} | {s:.2f} |")
    for row in result["instructions"]:
        print(f"| predict after the warm-up, {row['text_tokens']} text tokens ({row['captures']} captures on its "
              f"first call) | {row['predict_s']:.4f} |")
        print(f"| its prepare_inputs / sample_actions ({result['torch_threads']} torch threads, "
              f"{result['usable_cpus']} usable CPUs) | {row['prepare_inputs_s']:.4f} / {row['sample_actions_s']:.4f} |")
    out = {**env_info(), "command": "python tools/benchmark_groot_warm_up.py " + " ".join(argv), "config": CONFIG,
           "views": args.views, "image": args.image, **result}
    if args.out:
        write_result(args.out, out, "groot_warm_up")
    bounded = [r for r in result["instructions"] if r["text_tokens"] <= WARMUP_INSTRUCTION_TOKENS]
    return 0 if all(r["captures"] == 0 for r in bounded) else 1


if __name__ == "__main__":
    raise SystemExit(main())
