"""GR00T N1.6's language-model ops at a prompt's rows, each alone, in the forms engine/groot_language.py runs or
was measured against:

  down GEMM     the MLP's down projection (2048 x 6144) as one cuBLAS GEMM (F.linear, what the engine runs) against
                K-slices in one strided-batched GEMM with fp32 partials (split_k_partials), each with the residual
                norm after it (the norm sums the partials): alone they are faster, in the whole graph they are not
                (engine.md's "tried and rejected")
  O GEMM        the same for the attention's output projection (2048 x 2048)
  qkv_rope      q/k RMSNorm + RoPE + split (flashrt_kernels/qkv_rope.py, with head_norm) at each rows-per-program
                choice: the choice of QKV_ROPE_WIDE_ROWS
  attention     SDPA with GQA over the prompt, causal alone against causal plus a padding mask (the additive mask
                the engine makes): what GrootSignature.right_padded saves

Random bf16 inputs at the released sizes (Qwen3-1.7B: 2048 wide, 16 heads, 8 KV heads, head_dim 128, MLP 6144).
Each form is `--calls` calls captured in one CUDA graph; the time is the median over `--replays` replays, per call.
One weight serves every call, so a weight of a few tens of MB stays in the H200's 50 MB L2: these are the ops' times
with their weights cached, not as a predict streams them (benchmark_groot.py's rows time the whole graph).

    python tools/benchmark_groot_language_ops.py [--rows 208] [--real 196] [--calls 20] [--replays 15] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.dispatch import resolve  # noqa: E402
from flashrt_core.engine.groot_fused_dit import additive_mask  # noqa: E402
from flashrt_core.engine.hardware import detect_hardware  # noqa: E402
from flashrt_core.engine.ops import Ops  # noqa: E402
from flashrt_core.engine.timing import graph_time_us  # noqa: E402
from flashrt_core.model.groot.config import get_groot_config  # noqa: E402
from tools.benchmark_engine import env_info, write_result  # noqa: E402

SPLITS = (2, 3, 4, 6, 8)
ROWS_PER_PROGRAM = (1, 2, 4, 8, 16)


def split_k_partials(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T as `splits` K-slices (views of x and w) in one strided-batched GEMM -> fp32 partials
    (S, M, N), which Ops.norm sums."""
    m, k = x.shape
    xs = x.view(m, splits, k // splits).transpose(0, 1)                        # (S, M, K/S)
    ws = w.view(w.shape[0], splits, k // splits).permute(1, 2, 0)              # (S, K/S, N)
    return torch.bmm(xs, ws, out_dtype=torch.float32)


def gemm_rows(ops: Ops, rows: int, n: int, k: int, calls: int, replays: int) -> dict:
    """One GEMM + residual norm against each K-slice count's partials + the norm: us per call, and the largest
    difference of the summed partials from the one GEMM's product."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(n + k)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16, generator=gen)
    residual = torch.randn(rows, n, device=dev, dtype=torch.float32, generator=gen)
    out = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)
    weight = torch.rand(n, device=dev, generator=gen) + 0.5
    want = F.linear(x, w).float()
    row = {"gemm_us": graph_time_us(lambda: F.linear(x, w), calls, replays),
           "gemm_norm_us": graph_time_us(lambda: ops.norm(F.linear(x, w), residual, out, weight), calls, replays)}
    for s in SPLITS:
        if k % s or (k // s) % 8:                  # each slice whole 16-byte rows (the batched GEMM's need)
            continue
        err = float((split_k_partials(x, w, s).sum(0) - want).abs().max())
        row[f"split{s}"] = {
            "gemm_us": graph_time_us(lambda s=s: split_k_partials(x, w, s), calls, replays),
            "gemm_norm_us": graph_time_us(lambda s=s: ops.norm(split_k_partials(x, w, s), residual, out, weight),
                                          calls, replays),
            "max_abs_diff": err}
    return row


def qkv_rope_rows(ops: Ops, rows: int, calls: int, replays: int) -> dict:
    """qkv_rope with the q/k head norms at each rows-per-program choice -> us per call, and the default's choice."""
    llm = get_groot_config("groot_n1.6").llm
    h, g, dh = llm.num_heads, llm.num_kv_heads, llm.head_dim
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(rows)
    qkv = torch.randn(rows, (h + 2 * g) * dh, device=dev, dtype=torch.bfloat16, generator=gen)
    pos = torch.arange(rows, device=dev, dtype=torch.int32)
    cos, sin = ops.k.rope_tables(rows, dh, llm.rope_theta, dev)
    q = torch.empty(rows, h, dh, device=dev, dtype=torch.bfloat16)
    k_cache = torch.empty(g, rows, dh, device=dev, dtype=torch.bfloat16)
    v_cache = torch.empty_like(k_cache)
    head_norm = torch.rand(2, dh, device=dev, generator=gen) + 0.5
    row = {"default_rows_per_program": ops.k.qkv_rope_rows_per_program(rows)}
    for r in ROWS_PER_PROGRAM:
        row[f"rows_per_program_{r}_us"] = graph_time_us(lambda r=r: ops.k.qkv_rope(
            qkv, pos, cos, sin, q, k_cache, v_cache, 0, h, g, dh ** -0.5, rows_per_program=r, head_norm=head_norm),
            calls, replays)
    return row


def attention_rows(ops: Ops, rows: int, real: int, calls: int, replays: int) -> dict:
    """Ops.causal_attention over `rows` prompt tokens, alone and with the mask of a prompt of `real` tokens."""
    llm = get_groot_config("groot_n1.6").llm
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(real)
    q = torch.randn(1, rows, llm.num_heads, llm.head_dim, device=dev, dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, rows, llm.num_kv_heads, llm.head_dim, device=dev, dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    seen = torch.tril(torch.ones(rows, rows, dtype=torch.bool, device=dev)) & (torch.arange(rows, device=dev) < real)
    mask = additive_mask(seen[None, None], torch.bfloat16)
    causal = ops.causal_attention(q, k, v, None)
    masked = ops.causal_attention(q, k, v, mask)
    return {"causal_us": graph_time_us(lambda: ops.causal_attention(q, k, v, None), calls, replays),
            "causal_and_mask_us": graph_time_us(lambda: ops.causal_attention(q, k, v, mask), calls, replays),
            "real_rows_max_abs_diff": float((causal[:, :, :real] - masked[:, :, :real]).abs().max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=208, help="prompt tokens (the policy pads 196 to 208)")
    parser.add_argument("--real", type=int, default=196, help="real (unpadded) tokens of the prompt")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--replays", type=int, default=15)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark_groot_language_ops.py times CUDA graphs: no CUDA device here", file=sys.stderr)
        return 2
    ops = Ops(resolve(detect_hardware("auto", torch.device("cuda"))))
    llm = get_groot_config("groot_n1.6").llm
    result = {**env_info(), "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
              "rows": args.rows, "real": args.real, "calls": args.calls, "replays": args.replays,
              "down": gemm_rows(ops, args.rows, llm.width, llm.mlp_dim, args.calls, args.replays),
              "o": gemm_rows(ops, args.rows, llm.width, llm.num_heads * llm.head_dim, args.calls, args.replays),
              "qkv_rope": qkv_rope_rows(ops, args.rows, args.calls, args.replays),
              "attention": attention_rows(ops, args.rows, args.real, args.calls, args.replays)}
    print(f"GR00T language ops at {args.rows} rows on {result['gpu']} (us per call, weights L2-resident)")
    for name in ("down", "o"):
        r = result[name]
        splits = " ".join(f"{key}={v['gemm_norm_us']:.2f}" for key, v in r.items() if key.startswith("split"))
        print(f"{name:5s} GEMM + norm: one GEMM {r['gemm_norm_us']:.2f}; K-slices {splits}")
    r = result["qkv_rope"]
    print("qkv_rope: " + " ".join(f"{key.split('_')[3]}={v:.2f}" for key, v in r.items() if key.endswith("_us"))
          + f" (default {r['default_rows_per_program']} rows per program)")
    r = result["attention"]
    print(f"attention: causal {r['causal_us']:.2f}, causal + mask {r['causal_and_mask_us']:.2f} "
          f"(real rows differ by {r['real_rows_max_abs_diff']:.2g})")
    if args.out:
        write_result(args.out, result, "groot_language_ops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
