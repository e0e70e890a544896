"""The denoiser's hot Triton kernels compile for sm90 without spilling (tools/kernel_resources.py: Triton's
ahead-of-time compile, its bundled ptxas and cuobjdump; no GPU needed, skips without Triton).

The denoising step's early-K/V attention once compiled to 32 registers and ~9 KB of spills per thread (64-key
blocks held across the PDL wait), unseen by the H200 benchmarks of the time: this test keeps every attention configuration the launchers plan for pi0.5 / pi0 steps and the prefix, the decoder GEMM
configurations the H200 tuning picks, and the QKV RoPE kernels (the prefix's qkv_rope, every qkv_gemm_rope
candidate), at zero spilled bytes.
"""

from __future__ import annotations

import re

import pytest

from flashrt_kernels import HAVE_TRITON

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed")

# The decoder GEMM configurations the load-time tuning picks on the H200 (docs/benchmarks): alone and inside the
# denoiser (chain tuning: one-shot o and down).
TUNED_ON_H200 = ("triton(n32,k128,s1,st4,w4)", "triton(n32,k128,s4,st4,w4)", "triton(n32,k128,s8,st4,w4)",
                 "triton(n16,k512,s4,st1,w4)", "triton(n16,k1024,s4,st1,w4)", "triton(n16,k1024,s2,st1,w4)")


def _configs():
    from tools.kernel_resources import attention_configs, denoise_step_configs, rope_configs, skinny_configs
    return attention_configs() + [c for c in skinny_configs() if c.name.split()[-3] in TUNED_ON_H200] + \
        rope_configs() + denoise_step_configs()


def test_the_configuration_list_covers_the_engine_paths():
    names = [c.name for c in _configs()]
    assert any(n.startswith("decoder_attention, early K/V (pi05, 10 rows") for n in names)
    assert any(n.startswith("attention, early K/V (pi05, 10 rows") for n in names)      # rope_in_attention off
    assert any(n.startswith("attention, key loop (pi05, 50 rows") for n in names)       # horizon 50
    assert any(n.startswith("prefix attention") for n in names)
    kinds = {n.split()[2] for n in names if n.startswith("skinny GEMM")}
    assert kinds == {"qkv", "gate_up", "o", "down"}
    assert "denoise step_in (one pass)" in names and "denoise step_out (one pass, 4 partials)" in names
    assert "qkv_rope (560 rows, 8 per program)" in names                                 # the prefix's
    assert sum(n.startswith("qkv_gemm_rope") for n in names) == 8                       # 4 candidates x 10 / 51 rows


@pytest.mark.parametrize("cfg", _configs(), ids=lambda c: c.name)
def test_hot_kernel_does_not_spill(cfg):
    from tools.kernel_resources import compile_sm90, resources
    r = resources(compile_sm90(cfg))
    assert r["stack_bytes"] == 0, f"{cfg.name}: {r['registers']} registers, {r['stack_bytes']} bytes of local stack"
    assert r["shared_bytes"] <= 227 * 1024, f"{cfg.name}: {r['shared_bytes']} bytes of shared memory"


def test_smem_gemm_candidates_compile_without_spills_and_fit_shared_memory():
    """kernels/flashrt_kernels/smem_gemm.py (on by default on sm90+): every candidate compiles for sm90 with no spill, its
    weight slice and x rows fit one SM's shared memory, and the weight TMA copies are issued before the PDL wait,
    the x copies after it (what the kernel is for)."""
    from tools.kernel_resources import compile_sm90, resources, smem_configs, tma_copies_around_pdl_wait
    configs = smem_configs()
    if not configs:
        pytest.skip("Triton has no Gluon here")
    assert {c.name.split()[2] for c in configs} == {"qkv", "gate_up", "o", "down"}
    for cfg in configs:
        compiled = compile_sm90(cfg)
        r = resources(compiled)
        assert r["stack_bytes"] == 0 and r["shared_bytes"] <= 227 * 1024, (cfg.name, r)
        ptx = compiled.asm["ptx"]
        assert "griddepcontrol.wait" in ptx, cfg.name
        before, after = tma_copies_around_pdl_wait(ptx)
        boxes = cfg.constexprs["K_PER_SPLIT"] // 64
        assert before == boxes * (2 if cfg.constexprs["GEGLU"] else 1) and after == boxes, (cfg.name, before, after)


def test_every_skinny_candidate_fits_shared_memory_at_the_largest_rows_it_serves():
    """A candidate that overflows an SM's shared memory at the row tile it is offered for fails at launch
    (OutOfResources): at horizon 50 (51-row tiles of 64) two deep gate/up candidates need 256 KB, so they serve
    at most 16 rows (SkinnyConfig.max_rows); this keeps every candidate inside the 227 KB at its largest tile."""
    from tools.kernel_resources import compile_sm90, resources, skinny_configs
    for cfg in skinny_configs(block_m=None):
        r = resources(compile_sm90(cfg))
        assert r["shared_bytes"] <= 227 * 1024, (cfg.name, r)


def test_prefix_attention_on_wgmma_compiles_without_spills_and_runs_both_products_on_tensor_cores():
    """kernels/flashrt_kernels/prefix_attention.py at head dim 256, every form and launch mode: compiles for sm90 with no spill
    inside one SM's shared memory, and the PTX has what the kernel is for: the 16 + 16 wgmma instructions of one
    key block (q @ k^T over four 64-wide K steps; p @ v into four 64-column chunks, in 64-key blocks 4 k16 steps
    each), TMA copies of q and of K / V, and no trip of p through shared memory between the two products."""
    from tools.kernel_resources import compile_sm90, prefix_attention_configs, resources
    configs = prefix_attention_configs()
    if not configs:
        pytest.skip("Triton has no Gluon here")
    forms = [(c.signature["k_desc"].split("[")[1].split(",")[0], c.constexprs["SPLITS"], c.constexprs["OVERLAP"],
              c.constexprs["PDL"]) for c in configs]
    assert forms == [("64", 1, False, 0), ("64", 1, False, 1), ("64", 1, True, 0), ("64", 1, True, 1)]
    for cfg, (block_n, splits, overlap, pdl) in zip(configs, forms):
        compiled = compile_sm90(cfg)
        r = resources(compiled)
        assert r["stack_bytes"] == 0 and r["shared_bytes"] <= 227 * 1024, (cfg.name, r)
        ptx = compiled.asm["ptx"]
        mmas = re.findall(r"wgmma\.mma_async\S*", ptx)
        # with OVERLAP the first block's q @ k^T is issued before the loop: 16 more in the code, not per block
        assert len(mmas) == (48 if overlap else 32), (cfg.name, len(mmas))
        assert set(mmas) == {f"wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.bf16.bf16"}, mmas
        assert ptx.count("cp.async.bulk.tensor") >= 4 + 2 * 2 * 4        # q's 4 boxes, 2 stages of K and V
        assert "st.shared" not in ptx                                    # p goes to wgmma from registers
        if pdl:          # every copy of q, K or V after the wait for the kernel ahead
            assert ptx[:ptx.index("griddepcontrol.wait")].count("cp.async.bulk.tensor") == 0
        else:
            assert "griddepcontrol" not in ptx


def test_the_counted_layer_chain_keeps_its_acquire():
    """kernels/flashrt_kernels/layer_chain.py's persistent counter chain (Triton): an atomic add of 0 whose result
    nothing reads is dropped by the compiler, acquire and all, so the kernel masks its input's loads with the
    value; the PTX has the acquire (LLVM makes it an acquire load) beside the release."""
    from tools.kernel_resources import KernelConfig, _kernels_module, compile_sm90
    lc = _kernels_module("layer_chain")
    cfg = KernelConfig("persistent counter chain", lc._persistent_chain_kernel,
                       {"buf_ptr": "*bf16", "w_ptr": "*bf16", "counter_ptr": "*i32", "M": "i32"},
                       {"LAYERS": 18, "D": 1024, "BLOCK_M": lc.BLOCK_M, "BLOCK_N": 16, "RESIDENT": False}, 4, 1)
    ptx = compile_sm90(cfg).asm["ptx"]
    assert "atom.global.gpu.release.add" in ptx and "ld.global.gpu.acquire" in ptx


def test_sass_digest_tells_the_same_machine_code_from_other_code(capsys):
    """The refactor check of tools/kernel_resources.py --sass: a configuration compiled twice has one digest (no
    addresses, names or dates in it), two configurations that differ in a constexpr have two; the table of
    --match rows carries it in its last column."""
    from tools.kernel_resources import compile_sm90, main, sass_digest, skinny_configs
    qkv = [c for c in skinny_configs() if c.name.startswith("skinny GEMM qkv")][:2]
    first, again, other = sass_digest(compile_sm90(qkv[0])), sass_digest(compile_sm90(qkv[0])), \
        sass_digest(compile_sm90(qkv[1]))
    assert first == again and first != other and len(first) == 16
    main(["--sass", "--match", qkv[0].name])
    table = capsys.readouterr().out.splitlines()
    assert table[0].endswith("| SASS digest |") and len(table) == 3
    assert table[2] == table[2][:table[2].rindex("|", 0, -1)] + f"| {first} |"
    with pytest.raises(SystemExit, match="no configuration"):
        main(["--match", "no such kernel"])
