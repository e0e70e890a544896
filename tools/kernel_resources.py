#!/usr/bin/env python3
"""Registers, spilled bytes and shared memory of the denoiser's hot Triton kernels, compiled for sm90 without a GPU.

Triton lowers each kernel ahead of time for an H100/H200 (``GPUTarget("cuda", 90, 32)``), its bundled ptxas
assembles the cubin, and its bundled ``cuobjdump -res-usage`` reads back registers per thread, the local-memory
stack (spills) and shared memory. Only Triton is needed, so this runs in CI. It found that the denoiser's early-K/V
attention (64-key blocks held across the PDL wait) compiled to 32 registers and ~9 KB of spills per thread, a path
every earlier H200 benchmark had run (2026-11-29);
test/core/test_kernel_resources.py keeps the hot paths free of spills.

    python tools/kernel_resources.py            # a markdown table, one row per kernel configuration
    python tools/kernel_resources.py --sass --match "smem GEMM"   # + a digest of each one's machine code

The SASS digest checks a refactor that must not change what runs (helpers pulled out of a Gluon or Triton
kernel) without a GPU: the table before and after the change has the same digest in every row exactly when every
configuration compiles to the same instructions.

The configurations are the engine's own: the attention plans of pi0.5 and pi0 denoising steps (1-3 views,
horizons 10 and 50) and the prefix, every decoder GEMM candidate the load-time tuning may pick (the Triton
skinny GEMMs, and the Gluon shared-memory GEMMs of kernels/flashrt_kernels/smem_gemm.py), the QKV RoPE kernels, the denoising
step's ends and the prefix attention on wgmma.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flashrt_core.config import GEMMA_300M  # noqa: E402

TARGET_SM = 90


@dataclass(frozen=True)
class KernelConfig:
    """One compiled configuration: the kernel, its argument types and constexpr values, and launch options."""

    name: str
    kernel: object
    signature: dict
    constexprs: dict
    num_warps: int
    num_stages: int
    divisible: tuple[str, ...] = ()     # integer arguments that are multiples of 16 at run time


def specialization(cfg: KernelConfig) -> dict:
    """The argument attributes Triton's JIT would give this launch: it marks every pointer to a 16-byte aligned
    tensor and every integer that is a multiple of 16 as divisible by 16 (triton/backends/compiler.py), which is
    what lets it vectorize loads and stage them through shared memory with cp.async. Without them an
    ahead-of-time compile loads element by element and reports registers the GPU never uses. Pointers are taken as
    aligned (the engine's tensors are), integers as listed in cfg.divisible."""
    names = [n for n in cfg.kernel.arg_names]
    return {(names.index(n),): [["tt.divisibility", 16]] for n, ty in cfg.signature.items()
            if ty.startswith("*") or n in cfg.divisible}


def compile_sm90(cfg: KernelConfig):
    """The Triton CompiledKernel of cfg for sm90 (ptxas has run: ``asm["cubin"]`` is set)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**cfg.signature, **{name: "constexpr" for name in cfg.constexprs}}
    source = ASTSource
    if getattr(cfg.kernel, "is_gluon", lambda: False)():          # kernels/flashrt_kernels/smem_gemm.py
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(fn=cfg.kernel, signature=signature, constexprs=cfg.constexprs,
                                 attrs=specialization(cfg)),
                          target=GPUTarget("cuda", TARGET_SM, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def cuobjdump(compiled, flag: str) -> str:
    """What Triton's bundled cuobjdump prints for the compiled kernel's cubin with flag (-res-usage, -sass)."""
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        return subprocess.run([str(tool), flag, str(cubin)], capture_output=True, text=True, check=True).stdout


def resources(compiled) -> dict:
    """{"registers", "stack_bytes", "shared_bytes"} of a compiled kernel, read from its cubin by cuobjdump."""
    text = cuobjdump(compiled, "-res-usage")
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage gave no REG/STACK line:\n{text}")
    return {"registers": int(found.group(1)), "stack_bytes": int(found.group(2)),
            "shared_bytes": int(compiled.metadata.shared)}


def tma_copies_around_pdl_wait(ptx: str) -> tuple[int, int]:
    """How many TMA copies (cp.async.bulk.tensor) a kernel's PTX issues before and after its PDL wait
    (griddepcontrol.wait; a kernel without one: all after). The shared-memory GEMMs are written to issue their
    weight boxes before it, so that they stream beside the kernel ahead, and only x's after it."""
    wait = max(ptx.find("griddepcontrol.wait"), 0)
    return ptx[:wait].count("cp.async.bulk.tensor"), ptx[wait:].count("cp.async.bulk.tensor")


def sass_digest(compiled) -> str:
    """16 hex digits of sha256 over the kernel's sm90 instructions (``cuobjdump -sass`` of its cubin, each
    instruction's text without its address): the same digest, the same machine code."""
    text = cuobjdump(compiled, "-sass")
    address = re.compile(r"/\*[0-9a-f]{4}\*/")
    instructions = [address.sub("", line).strip() for line in text.splitlines() if address.search(line)]
    if not instructions:
        raise RuntimeError(f"cuobjdump -sass gave no instructions:\n{text[:2000]}")
    return hashlib.sha256("\n".join(instructions).encode()).hexdigest()[:16]


ATTN_SIGNATURE = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "bias_ptr": "*fp32", "vis_ptr": "*i32",
                  "o_ptr": "*bf16", "acc_ptr": "*fp32", "ml_ptr": "*fp32", "pos_ptr": "*i64", "cos_ptr": "*fp32",
                  "sin_ptr": "*fp32", "Mq": "i32", "L": "i32", "P": "i32", "heads": "i32", "scale": "fp32",
                  "q_scale": "fp32", "stride_q": "i32", "stride_k": "i32", "stride_v": "i32", "stride_o": "i32"}
SKINNY_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32", "F": "i32",
                    "stride_x": "i32", "stride_w": "i32", "stride_y": "i32", "split_stride": "i32"}
# At the expert's shapes every size and stride of these launches is a multiple of 16 except the row counts (M, Mq,
# L: 10-51 rows, 8 heads) and the head count.
ATTN_DIVISIBLE = ("P", "stride_q", "stride_k", "stride_v", "stride_o")
SKINNY_DIVISIBLE = ("N", "F", "stride_x", "stride_w", "stride_y", "split_stride")
EXPERT_N = {kind: n for kind, (n, _) in GEMMA_300M.layer_gemm_shapes().items()}   # the action expert's GEMM N
EXPERT_K = {kind: k for kind, (_, k) in GEMMA_300M.layer_gemm_shapes().items()}   # ... and K per kind


def _kernels_module(name: str):
    """A submodule of flashrt_kernels (kernels/ of this checkout), e.g. "attention"."""
    from flashrt_core.engine.kernel_import import load_kernels
    load_kernels()
    return sys.modules[f"flashrt_kernels.{name}"]


def attention_configs() -> list[KernelConfig]:
    """The split-attention kernel as its launchers plan it (attention.split_launch) for the engine's shapes:
    one-KV-head Gemma attention (8 heads, head dim 256), the denoising steps of pi0.5 (10 / 50 suffix rows) and
    pi0 (11 / 51), with the RoPE inside (up to ops.ROPE_IN_ATTENTION_MAX_ROWS rows) or before the attention, and
    the prefix; 1-3 views of 256 tokens + 64 text slots; launched with PDL, as on sm90."""
    from flashrt_core.engine.kernel_configs import ROPE_IN_ATTENTION_MAX_ROWS
    attn = _kernels_module("attention")
    heads, dh = 8, 256
    configs: dict[tuple, KernelConfig] = {}

    def add(name: str, launch) -> None:
        constexprs = dict(launch.constexprs)
        key = tuple(sorted(constexprs.items())) + (launch.num_warps,)
        configs.setdefault(key, KernelConfig(name, attn._attn_split_kernel, ATTN_SIGNATURE, constexprs,
                                             launch.num_warps, launch.num_stages, ATTN_DIVISIBLE))
    for views in (1, 2, 3):
        prefix = views * 256 + 64
        for model, rows in (("pi05", 10), ("pi05", 50), ("pi0", 11), ("pi0", 51)):
            for from_qkv in (True, False):
                if from_qkv and rows > ROPE_IN_ATTENTION_MAX_ROWS:
                    continue
                launch = attn.split_launch(rows * heads, prefix + rows, prefix, dh, True, from_qkv, True)
                path = ("decoder_attention" if from_qkv else "attention") + (
                    ", early K/V" if launch.constexprs["EARLY_KV"] else ", key loop")
                add(f"{path} ({model}, {rows} rows, {views} views)", launch)
        add(f"prefix attention ({views} views)", attn.split_launch(prefix * heads, prefix, prefix, dh, False, False,
                                                                     True))
        for splits in (1, 4):          # the prefix attention's other candidates (ops.PREFIX_ATTENTION_IMPLS)
            add(f"prefix attention ({views} views, {splits} key splits)",
                attn.split_launch(prefix * heads, prefix, prefix, dh, False, False, True, splits))
    return list(configs.values())


def skinny_configs(block_m: int | None = 16) -> list[KernelConfig]:
    """Every decoder GEMM candidate of the load-time tuning (kernel_configs.SKINNY_CANDIDATES) at the expert's K; row tiles of
    block_m (16: the 10-16-row steps of horizon 10), or None: the largest tile each candidate serves (64 rows for a
    candidate allowed 17-64 rows, horizon 50)."""
    from flashrt_core.engine.kernel_configs import SKINNY_CANDIDATES
    skinny = _kernels_module("skinny_gemm")
    out = []
    for kind, candidates in SKINNY_CANDIDATES.items():
        for c in candidates:
            tile = block_m or skinny.row_tile(c.max_rows)
            ce = {"K_PER_SPLIT": EXPERT_K[kind] // c.split_k, "GEGLU": kind == "gate_up", "SPLIT_K": c.split_k,
                  "KGELU": skinny._K_GELU, "BLOCK_M": tile, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "PDL": True}
            signature = dict(SKINNY_SIGNATURE, y_ptr="*fp32" if c.split_k > 1 else "*bf16")
            out.append(KernelConfig(f"skinny GEMM {kind} {c} ({tile}-row tile)",
                                    skinny._skinny_kernel, signature, ce, c.warps, c.stages, SKINNY_DIVISIBLE))
    return out


QKV_ROPE_SIGNATURE = {"qkv_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "q_ptr": "*bf16",
                      "k_ptr": "*bf16", "v_ptr": "*bf16", "M": "i32", "cache_offset": "i32", "q_scale": "fp32",
                      "stride_qkv": "i32", "stride_q_m": "i32", "stride_q_h": "i32", "stride_cache_g": "i32",
                      "stride_cache_l": "i32"}
QKV_GEMM_ROPE_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32",
                           "sin_ptr": "*fp32", "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "M": "i32",
                           "K": "i32", "cache_offset": "i32", "q_scale": "fp32", "stride_x": "i32", "stride_w": "i32",
                           "stride_q_m": "i32", "stride_q_h": "i32", "stride_cache_g": "i32", "stride_cache_l": "i32"}
ROPE_DIVISIBLE = ("stride_qkv", "stride_x", "stride_w", "stride_q_m", "stride_q_h", "stride_cache_g",
                  "stride_cache_l", "K")


def rope_configs() -> list[KernelConfig]:
    """kernels/flashrt_kernels/qkv_rope.py as its launcher plans it (the prefix's 560 rows in 8-row programs, a denoising step's
    10 rows one per program) and kernels/flashrt_kernels/qkv_gemm_rope.py in every candidate of the load-time tuning
    (ops.ROPE_GEMM_CANDIDATES) at 10 and 51 rows: 8 query heads and one KV head of 256 (pi0.5 / pi0)."""
    from flashrt_core.engine.kernel_configs import ROPE_GEMM_CANDIDATES
    rope = _kernels_module("qkv_rope")
    gemm_rope = _kernels_module("qkv_gemm_rope")
    heads = {"H": 8, "G": 1, "HALF": 128, "PDL": True}
    out = []
    for rows in (560, 10):
        block = rope.qkv_rope_rows_per_program(rows)
        out.append(KernelConfig(f"qkv_rope ({rows} rows, {block} per program)", rope._qkv_rope_kernel,
                                QKV_ROPE_SIGNATURE, {**heads, "BLOCK_M": block}, 1 if block == 1 else 4, 1,
                                ROPE_DIVISIBLE))
    for c in ROPE_GEMM_CANDIDATES:
        for rows in (10, 51):
            ce = {**heads, "BLOCK_M": gemm_rope.row_tile(rows), "BLOCK_P": c.block_p, "BLOCK_K": c.block_k}
            out.append(KernelConfig(f"qkv_gemm_rope {c} ({rows} rows)", gemm_rope._qkv_gemm_rope_kernel,
                                    QKV_GEMM_ROPE_SIGNATURE, ce, c.warps, c.stages, ROPE_DIVISIBLE))
    return out


def smem_configs() -> list[KernelConfig]:
    """Every kernels/flashrt_kernels/smem_gemm.py candidate of the load-time tuning (kernel_configs.SMEM_CANDIDATES) at the expert's shapes,
    with the TMA descriptors the launcher builds; empty where Triton has no Gluon."""
    from flashrt_core.engine.kernel_configs import SMEM_CANDIDATES
    smem = _kernels_module("smem_gemm")
    if not smem.HAVE_GLUON:
        return []
    from triton.experimental.gluon import language as gl
    out = []
    for kind, candidates in SMEM_CANDIDATES.items():
        for c in candidates:
            rows = smem.ROWS // 2 if kind == "gate_up" else smem.ROWS
            w_layout = gl.NVMMASharedLayout.get_default_for([rows, smem.BOX_K], gl.bfloat16)
            x_layout = gl.NVMMASharedLayout.get_default_for([smem.X_ROWS, smem.BOX_K], gl.bfloat16)
            signature = {"w_desc": f"tensordesc<bf16[{rows}, {smem.BOX_K}],{w_layout!r}>",
                         "x_desc": f"tensordesc<bf16[{smem.X_ROWS}, {smem.BOX_K}],{x_layout!r}>",
                         "y_ptr": "*fp32" if c.split_k > 1 else "*bf16", "M": "i32", "F": "i32", "stride_y": "i32",
                         "split_stride": "i32"}
            ce = {"K_PER_SPLIT": EXPERT_K[kind] // c.split_k, "GEGLU": kind == "gate_up", "KGELU": smem._K_GELU,
                  "PDL": True}
            out.append(KernelConfig(f"smem GEMM {kind} {c}", smem._smem_gemm_kernel, signature, ce, 4, 1,
                                    ("F", "stride_y", "split_stride")))
            for M in (32, 51):                      # 17-64 rows (horizon 50: 50-51): the ring kernel
                if not smem.smem_gemm_supported(M, EXPERT_N[kind], EXPERT_K[kind], kind == "gate_up", c.split_k):
                    continue
                xr = smem.x_tile_rows(M)
                xr_layout = gl.NVMMASharedLayout.get_default_for([xr, smem.BOX_K], gl.bfloat16)
                sig = {"w_desc": signature["w_desc"], "x_desc": f"tensordesc<bf16[{xr}, {smem.BOX_K}],{xr_layout!r}>",
                       "y_ptr": signature["y_ptr"], "M": "i32", "F": "i32", "stride_y": "i32", "split_stride": "i32"}
                stages = smem.x_ring_stages(M, EXPERT_K[kind] // c.split_k, kind == "gate_up")
                out.append(KernelConfig(f"smem GEMM {kind} {c}, {M} rows ({xr}-row x boxes, {stages} stages)",
                                        smem._smem_gemm_rows_kernel, sig,
                                        {"K_PER_SPLIT": ce["K_PER_SPLIT"], "GEGLU": ce["GEGLU"], "KGELU": ce["KGELU"],
                                         "PDL": True, "X_STAGES": stages}, 4, 1, ("F", "stride_y", "split_stride")))
    return out


STEP_IN_SIGNATURE = {"x_ptr": "*fp32", "w_ptr": "*bf16", "b_ptr": "*bf16", "s_ptr": "*fp32", "t_ptr": "*fp32",
                     "res_ptr": "*fp32", "y_ptr": "*bf16", "A": "i32", "eps": "fp32", "stride_res": "i32",
                     "stride_y": "i32"}
STEP_OUT_SIGNATURE = {"x_ptr": "*fp32", "res_ptr": "*fp32", "g_ptr": "*fp32", "s_ptr": "*fp32", "t_ptr": "*fp32",
                      "w_ptr": "*bf16", "b_ptr": "*fp32", "xt_ptr": "*fp32", "A": "i32", "row0": "i32",
                      "eps": "fp32", "dt": "fp32", "stride_x": "i32", "split_stride": "i32", "stride_res": "i32"}


TIME_MLP_IN_SIGNATURE = {"x_ptr": "*fp32", "w_ptr": "*bf16", "c_ptr": "*fp32", "st_ptr": "*fp32", "bo_ptr": "*fp32",
                         "res_ptr": "*fp32", "h_ptr": "*bf16", "A": "i32", "stride_res": "i32", "stride_h": "i32"}


def denoise_step_configs(width: int = 1024) -> list[KernelConfig]:
    """kernels/flashrt_kernels/denoise_step.py's two kernels at pi0.5's step (32 action dims, the expert's width) as their
    launchers plan them (denoise_step.step_block): the row in one pass (the default) and in two passes of 256-wide
    blocks; step_out on the last down GEMM's output as split-K partials (4, the tuning's pick) and unsplit; and
    pi0's step start (time_mlp_in) at the same width."""
    step = _kernels_module("denoise_step")
    out = []
    for block_d in (None, 256):
        block, warps = step.step_block(width, block_d)
        ce = {"D": width, "HAS_B": True, "BLOCK_A": 32, "BLOCK_D": block, "PDL": True}
        passes = "one pass" if block >= width else f"two passes of {block}"
        out.append(KernelConfig(f"denoise step_in ({passes})", step._step_in_kernel, STEP_IN_SIGNATURE, ce, warps, 1,
                                ("stride_res", "stride_y")))
        for splits in (1, 4):
            out.append(KernelConfig(f"denoise step_out ({passes}, {splits} partials)", step._step_out_kernel,
                                    STEP_OUT_SIGNATURE, {**ce, "X_SPLITS": splits}, warps, 1,
                                    ("stride_x", "split_stride", "stride_res")))
    block, warps = step.step_block(width, None)                 # pi0's step start: one pass only
    out.append(KernelConfig("pi0 time_mlp_in (one pass)", step._time_mlp_in_kernel, TIME_MLP_IN_SIGNATURE,
                            {"D": width, "BLOCK_A": 32, "BLOCK_D": block, "PDL": True}, warps, 1,
                            ("stride_res", "stride_h")))
    return out


def prefix_attention_configs() -> list[KernelConfig]:
    """kernels/flashrt_kernels/prefix_attention.py (the prefix attention on wgmma) at the backbone's head dim 256, with the TMA
    descriptors its launcher builds: the forms the engine's tuning weighs (64-key blocks, both forms, both launch
    modes); empty where Triton has no Gluon."""
    pa = _kernels_module("prefix_attention")
    if not pa.HAVE_GLUON:
        return []
    from triton.experimental.gluon import language as gl
    q_layout = gl.NVMMASharedLayout.get_default_for([pa.BLOCK_M, pa.CHUNK], gl.bfloat16)

    def config(block_n: int, splits: int, overlap: bool, pdl: int) -> KernelConfig:
        kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, pa.CHUNK], gl.bfloat16)
        part = "*fp32" if splits > 1 else "*bf16"          # with one split the launcher passes `out` for both
        signature = {"q_desc": f"tensordesc<bf16[{pa.BLOCK_M}, {pa.CHUNK}],{q_layout!r}>",
                     "k_desc": f"tensordesc<bf16[{block_n}, {pa.CHUNK}],{kv_layout!r}>",
                     "v_desc": f"tensordesc<bf16[{block_n}, {pa.CHUNK}],{kv_layout!r}>",
                     "bias_ptr": "*fp32", "o_ptr": "*bf16", "acc_ptr": part, "ml_ptr": part, "Mq": "i32",
                     "P": "i32", "stride_o": "i32", "blocks_per_split": "i32"}
        name = (f"prefix attention on wgmma (head dim 256, {block_n}-key blocks, {splits} split"
                f"{'s' if splits > 1 else ''}, PDL {pdl}{', overlap' if overlap else ''})")
        return KernelConfig(name, pa._prefix_attention_kernel, signature,
                            {"NCHUNK": 256 // pa.CHUNK, "LOG2E": pa.LOG2E, "PDL": pdl, "OVERLAP": overlap,
                             "SPLITS": splits}, 4, 1, ("stride_o",))

    return [config(pa.BLOCK_N, 1, overlap, pdl) for overlap in (False, True) for pdl in (0, 1)]


def all_configs() -> list[KernelConfig]:
    return (attention_configs() + skinny_configs() + smem_configs() + rope_configs() + denoise_step_configs()
            + prefix_attention_configs())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sass", action="store_true", help="add a digest of each configuration's machine code")
    ap.add_argument("--match", default="", help="only the configurations whose name holds this text")
    args = ap.parse_args(argv)
    configs = [cfg for cfg in all_configs() if args.match in cfg.name]
    if not configs:
        raise SystemExit(f"kernel_resources: no configuration's name holds {args.match!r}")
    rows = []
    for cfg in configs:
        compiled = compile_sm90(cfg)
        r = resources(compiled)
        digest = sass_digest(compiled) if args.sass else None
        rows.append((cfg.name, cfg.num_warps, r, digest))
        print(f"{cfg.name}: {r}", file=sys.stderr, flush=True)
    sass = " SASS digest |" if args.sass else ""
    print(f"| kernel configuration (sm{TARGET_SM}) | warps | registers | spill stack (bytes) | shared (bytes) |{sass}")
    print("|---|---|---|---|---|" + ("---|" if args.sass else ""))
    for name, warps, r, digest in rows:
        print(f"| {name} | {warps} | {r['registers']} | {r['stack_bytes']} | {r['shared_bytes']} |"
              + (f" {digest} |" if args.sass else ""))


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)      # ahead-of-time compilation needs the real JIT
    main()
