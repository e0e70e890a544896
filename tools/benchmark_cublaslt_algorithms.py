#!/usr/bin/env python3
"""Benchmark of cuBLASLt's candidate algorithms for the engine's wide GEMMs: every algorithm its heuristic offers for
each vision and prefix GEMM shape, checked against torch's call and timed in a CUDA graph.

torch runs the first algorithm of cuBLASLt's heuristic list (F.linear with its bias epilogue, and
torch._addmm_activation for the vision fc1 with bias and tanh GELU: what ops.linear / ops.linear_gelu run), and
torch's TunableOp offers no other candidate on CUDA (docs/engine.md, "Tried and rejected"). Forms outside the list
show that the first pick is not always the fastest: the vision fc2 and the prefix down GEMM in two K slices (one
strided-batched GEMM, the partials summed after) took 10-17 % less time on the H200
(docs/benchmarks/2026-12-05/wide_gemm_forms_h200.log). This tool asks the heuristic for up to `--requested`
algorithms per shape (cublasLtMatmulAlgoGetHeuristic, `--workspace-mib` of workspace allowed), runs each through
cublasLtMatmul on the same operands and epilogue as torch's call, leaves out any whose output differs from torch's
(cosine < 0.999), and times the rest, each captured `--reps` times in one CUDA graph and replayed (GPU time per
call). What the fastest saves against torch's call, per GEMM and per predict, says whether the engine should pick
an algorithm per shape at load.

The engine's shapes (`engine_shapes`): the vision tower's QKV, O, fc1 (+ bias + GELU) and fc2 at 256 rows per view
with the MLP width padded to 4352 (the engine's default `vision_mlp_pad`), biases in the epilogue; the prefix's QKV,
O, gate/up (the GEMM alone: the engine's GeGLU is a kernel of its own) and down at 256 rows per view + the text
bucket, no bias. cuBLASLt is called through ctypes on the library torch loaded (found in /proc/self/maps after a
first torch GEMM), or else the one of the nvidia wheels in site-packages.

    python tools/benchmark_cublaslt_algorithms.py --out docs/benchmarks/<date>/cublaslt_algorithms_<gpu>.json

Prints a table per shape (every algorithm's time) and a summary (torch's call, the heuristic's first algorithm,
the fastest, what it saves); the JSON holds the same with GPU, driver and versions. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import json
import site
import sys
from pathlib import Path
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmark_wide_gemms import Shape, cosine, time_us, wide_shapes  # noqa: E402

from flashrt_core.config import get_config  # noqa: E402

# cublasLt.h / library_types.h values (stable across CUDA 11.4-13)
CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8       # cublasLtMatmulDescAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1                                                  # cublasLtMatmulPreferenceAttributes_t
EPILOGUE_DEFAULT, EPILOGUE_BIAS, EPILOGUE_GELU_BIAS = 1, 4, 36                # cublasLtEpilogue_t (GELU 32 | BIAS 4)
CHECK_COSINE = 0.999


class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: opaque, 8 x uint64."""
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""
    _fields_ = [("algo", MatmulAlgo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int32),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int32 * 4)]


def engine_shapes(config: str, views: int, text_slots: int, vision_mlp_pad: int = 128) -> list[Shape]:
    """The wide GEMMs as the engine runs them: the vision MLP padded to a multiple of `vision_mlp_pad` (0: as it
    is), the prefix at `views` x 256 image rows + `text_slots` text rows."""
    width = get_config(config).vision.mlp_dim
    padded = -(-width // vision_mlp_pad) * vision_mlp_pad if vision_mlp_pad else width
    shapes = wide_shapes(config, views, text_slots, 1, (vision_mlp_pad,) if padded != width else ())
    if padded == width:
        return shapes
    return [s for s in shapes if not (s.tower == "vision" and s.name in ("fc1", "fc2"))]


def epilogue_for(shape: Shape) -> int:
    """The cuBLASLt epilogue of torch's call for the shape: bias + GELU (vision fc1), bias (the other vision GEMMs:
    SigLIP's linears have biases), none (Gemma's have none; the prefix GeGLU is the engine's own kernel)."""
    if shape.tower != "vision":
        return EPILOGUE_DEFAULT
    return EPILOGUE_GELU_BIAS if shape.epilogue == "gelu" else EPILOGUE_BIAS


def operand_layouts(rows: int, n: int, k: int) -> tuple[tuple[int, int, int], ...]:
    """(rows, cols, leading dimension) of A, B and D in cuBLASLt's column-major terms for the row-major
    y (rows, n) = x (rows, k) @ w (n, k)^T: A is w read as a (k, n) column-major matrix and transposed (TRANSA = T),
    B is x read as (k, rows) (TRANSB = N), D is y read as (n, rows); the bias runs along D's rows (n)."""
    return (k, n, k), (k, rows, k), (n, rows, n)


def library_candidates() -> list[str]:
    """Where cuBLASLt may be: the copy this process has loaded (torch's), then the nvidia wheels' copies."""
    loaded = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1] if line.split() else ""
            if "libcublasLt.so" in path and path not in loaded:
                loaded.append(path)
    except OSError:
        pass
    wheels = sorted(p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/**/libcublasLt.so*",
                                                                          recursive=True))
    return loaded + [p for p in wheels if p not in loaded]


_P, _I32, _U32, _U64, _I64, _SIZE = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint64,
                                     ctypes.c_int64, ctypes.c_size_t)
SIGNATURES = {     # cublasLt.h: every function the tool calls, its arguments and result (cublasStatus_t: int32)
    "cublasLtGetVersion": ([], _SIZE),
    "cublasLtCreate": ([_P], _I32),
    "cublasLtMatmulDescCreate": ([_P, _I32, _I32], _I32),
    "cublasLtMatmulDescSetAttribute": ([_P, _I32, _P, _SIZE], _I32),
    "cublasLtMatmulDescDestroy": ([_P], _I32),
    "cublasLtMatrixLayoutCreate": ([_P, _I32, _U64, _U64, _I64], _I32),
    "cublasLtMatrixLayoutDestroy": ([_P], _I32),
    "cublasLtMatmulPreferenceCreate": ([_P], _I32),
    "cublasLtMatmulPreferenceSetAttribute": ([_P, _I32, _P, _SIZE], _I32),
    "cublasLtMatmulPreferenceDestroy": ([_P], _I32),
    "cublasLtMatmulAlgoGetHeuristic": ([_P, _P, _P, _P, _P, _P, _P, _I32, _P, _P], _I32),
    "cublasLtMatmul": ([_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _SIZE, _P], _I32),
}


def bind(lib):
    """Give every function of SIGNATURES its argument and result types: without them ctypes passes Python ints
    as 32-bit C ints, which a size_t or pointer argument does not take whole. Returns lib."""
    for name, (args, result) in SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    return lib


def load_cublaslt(candidates: list[str]) -> ctypes.CDLL:
    """The first loadable cuBLASLt of `candidates` with its functions typed (bind); an error naming every place
    tried when none loads."""
    errors = []
    for path in candidates:
        try:
            return bind(ctypes.CDLL(path))
        except OSError as error:
            errors.append(f"{path}: {error}")
    raise RuntimeError("no loadable cuBLASLt: not in this process's libraries (/proc/self/maps) nor among the "
                       "nvidia wheels in site-packages" + ("; tried " + "; ".join(errors) if errors else ""))


def _ok(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed: cublasStatus_t {status}")


class LtGemm:
    """One GEMM shape's cuBLASLt descriptors and the heuristic's algorithms; `run(i, x, w, y)` computes
    y = epilogue(x @ w^T [+ bias]) with algorithm i on torch's current stream (capturable in a CUDA graph)."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p, shape: Shape, epilogue: int,
                 bias: torch.Tensor | None, workspace: torch.Tensor, requested: int):
        self.lib, self.handle, self.workspace = lib, handle, workspace
        self.desc = ctypes.c_void_p()
        _ok(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate")
        for attr, value, ctype in ((DESC_TRANSA, CUBLAS_OP_T, ctypes.c_int32),
                                   (DESC_TRANSB, CUBLAS_OP_N, ctypes.c_int32),
                                   (DESC_EPILOGUE, epilogue, ctypes.c_uint32)):
            v = ctype(value)
            _ok(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), ctypes.sizeof(v)),
                f"MatmulDescSetAttribute({attr})")
        if bias is not None:
            ptr = ctypes.c_void_p(bias.data_ptr())
            _ok(lib.cublasLtMatmulDescSetAttribute(self.desc, DESC_BIAS_POINTER, ctypes.byref(ptr),
                                                   ctypes.sizeof(ptr)), "MatmulDescSetAttribute(bias)")
        self.layouts = []
        for rows, cols, ld in operand_layouts(shape.rows, shape.n, shape.k):
            layout = ctypes.c_void_p()
            _ok(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), CUDA_R_16BF, ctypes.c_uint64(rows),
                                               ctypes.c_uint64(cols), ctypes.c_int64(ld)), "MatrixLayoutCreate")
            self.layouts.append(layout)
        preference = ctypes.c_void_p()
        _ok(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "MatmulPreferenceCreate")
        limit = ctypes.c_uint64(workspace.numel())
        _ok(lib.cublasLtMatmulPreferenceSetAttribute(preference, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(limit),
                                                     ctypes.sizeof(limit)), "MatmulPreferenceSetAttribute")
        results, count = (HeuristicResult * requested)(), ctypes.c_int(0)
        a, b, d = self.layouts
        _ok(lib.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, a, b, d, d, preference, requested, results,
                                               ctypes.byref(count)), "MatmulAlgoGetHeuristic")
        lib.cublasLtMatmulPreferenceDestroy(preference)
        self.algorithms = [results[i] for i in range(count.value) if results[i].state == 0]
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def close(self) -> None:
        for layout in self.layouts:
            self.lib.cublasLtMatrixLayoutDestroy(layout)
        self.lib.cublasLtMatmulDescDestroy(self.desc)
        self.layouts = []

    def run(self, i: int, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a, b, d = self.layouts
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _ok(self.lib.cublasLtMatmul(self.handle, self.desc, ctypes.byref(self._alpha), ctypes.c_void_p(w.data_ptr()),
                                    a, ctypes.c_void_p(x.data_ptr()), b, ctypes.byref(self._beta),
                                    ctypes.c_void_p(y.data_ptr()), d, ctypes.c_void_p(y.data_ptr()), d,
                                    ctypes.byref(self.algorithms[i].algo), ctypes.c_void_p(self.workspace.data_ptr()),
                                    ctypes.c_size_t(self.workspace.numel()), stream), f"cublasLtMatmul(algorithm {i})")
        return y


def measure_shape(lib, handle, shape: Shape, workspace: torch.Tensor, requested: int, reps: int,
                  replays: int) -> dict:
    """torch's call and every heuristic algorithm of one shape: times (us per call) and checks."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(shape.rows, shape.k, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(shape.n, shape.k, device=dev, generator=g) * shape.k ** -0.5).to(torch.bfloat16)
    epilogue = epilogue_for(shape)
    bias = torch.randn(shape.n, device=dev, generator=g).to(torch.bfloat16) if epilogue != EPILOGUE_DEFAULT else None

    def torch_call() -> torch.Tensor:          # what ops.linear_gelu / ops.linear run
        if epilogue == EPILOGUE_GELU_BIAS:
            return torch._addmm_activation(bias, x, w.t(), use_gelu=True)
        return F.linear(x, w, bias)
    want = torch_call()
    row = {"tower": shape.tower, "gemm": shape.name, "rows": shape.rows, "n": shape.n, "k": shape.k,
           "epilogue": epilogue, "torch_us": time_us(torch_call, dev, reps, replays), "algorithms": []}
    gemm = LtGemm(lib, handle, shape, epilogue, bias, workspace, requested)
    y = torch.empty(shape.rows, shape.n, device=dev, dtype=torch.bfloat16)
    for i, found in enumerate(gemm.algorithms):
        entry = {"index": i, "workspace_bytes": int(found.workspace_size), "waves": float(found.waves_count)}
        try:
            entry["cosine"] = cosine(gemm.run(i, x, w, y), want)
            if entry["cosine"] >= CHECK_COSINE:
                entry["us"] = time_us(lambda: gemm.run(i, x, w, y), dev, reps, replays)
        except RuntimeError as error:            # an algorithm this problem cannot run: recorded, not fatal
            entry["error"] = str(error)[:200]
        row["algorithms"].append(entry)
    torch.cuda.synchronize()
    gemm.close()
    timed = [a for a in row["algorithms"] if "us" in a]
    if timed:
        best = min(timed, key=lambda a: a["us"])
        row.update(first_us=timed[0]["us"] if timed[0]["index"] == 0 else None, best_index=best["index"],
                   best_us=best["us"], saved_us=row["torch_us"] - best["us"])
    return row


def run(args: argparse.Namespace) -> dict:
    torch.nn.functional.linear(torch.ones(8, 8, device="cuda", dtype=torch.bfloat16),
                               torch.ones(8, 8, device="cuda", dtype=torch.bfloat16))    # torch loads cuBLASLt
    lib = load_cublaslt(library_candidates())
    handle = ctypes.c_void_p()
    _ok(lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    workspace = torch.empty(args.workspace_mib << 20, device="cuda", dtype=torch.uint8)
    rows = [measure_shape(lib, handle, shape, workspace, args.requested, args.reps, args.replays)
            for shape in engine_shapes(args.config, args.views, args.text_slots, args.vision_mlp_pad)]
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cublaslt": int(lib.cublasLtGetVersion()),
           "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return {"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}


def calls_per_predict(tower: str, gemm: str) -> int:
    """How often a predict of pi0.5 or pi0 runs the GEMM: 27 SigLIP layers; 18 Gemma layers, of which the last
    runs only its QKV (the denoiser reads its K / V and nothing after them)."""
    if tower == "vision":
        return 27
    return 18 if gemm == "qkv" else 17


def table(result: dict) -> str:
    """The summary: per shape torch's call, the heuristic's first algorithm, the fastest, and what it saves per
    call and per predict (calls_per_predict)."""
    env = result["env"]
    lines = [f"{env['device']}, torch {env['torch']}, cuBLASLt {env['cublaslt']}, {env['time_utc']}",
             "| tower | GEMM | rows x N x K | algorithms (timed) | torch us | first us | fastest | fastest us | "
             "saved us | saved ms per predict |", "|---|---|---|---|---|---|---|---|---|---|"]
    total = 0.0
    for r in result["rows"]:
        timed = sum("us" in a for a in r["algorithms"])
        if "best_us" not in r:
            lines.append(f"| {r['tower']} | {r['gemm']} | {r['rows']} x {r['n']} x {r['k']} | "
                         f"{len(r['algorithms'])} (0) | {r['torch_us']:.2f} | | | | | |")
            continue
        per_predict = max(r["saved_us"], 0.0) * calls_per_predict(r["tower"], r["gemm"]) * 1e-3
        total += per_predict
        first = f"{r['first_us']:.2f}" if r["first_us"] is not None else "failed"
        lines.append(f"| {r['tower']} | {r['gemm']} | {r['rows']} x {r['n']} x {r['k']} | "
                     f"{len(r['algorithms'])} ({timed}) | {r['torch_us']:.2f} | {first} | #{r['best_index']} | "
                     f"{r['best_us']:.2f} | {r['saved_us']:.2f} | {per_predict:.3f} |")
    lines.append(f"\nthe fastest algorithm of every shape together: {total:.3f} ms per predict")
    return "\n".join(lines)


def details(result: dict) -> str:
    """Every algorithm's time, per shape."""
    lines = []
    for r in result["rows"]:
        lines.append(f"\n{r['tower']} {r['gemm']} ({r['rows']} x {r['n']} x {r['k']}, epilogue {r['epilogue']}): "
                     f"torch {r['torch_us']:.2f} us")
        for a in r["algorithms"]:
            what = (f"{a['us']:.2f} us" if "us" in a else a.get("error") or f"left out: cosine {a['cosine']:.5f}")
            lines.append(f"  #{a['index']}: {what} (workspace {a['workspace_bytes'] >> 10} KiB, "
                         f"waves {a['waves']:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="pi05")
    ap.add_argument("--views", type=int, default=2)
    ap.add_argument("--text-slots", type=int, default=48, help="the text bucket (the engine's timed 48-token prompt)")
    ap.add_argument("--vision-mlp-pad", type=int, default=128, help="the engine's vision_mlp_pad (0: unpadded)")
    ap.add_argument("--requested", type=int, default=32, help="algorithms asked of the heuristic per shape")
    ap.add_argument("--workspace-mib", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark_cublaslt_algorithms.py needs a CUDA GPU", file=sys.stderr)
        return 2
    result = run(args)
    print(details(result))
    print()
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
