"""kernels/flashrt_kernels/streamed_gemm_chain.py on the CPU: the packed weight layouts are the ones the CUDA kernel
reads (each element where a lane's B fragment load finds it), the chain's descriptors compute the reference when
an emulation of the kernel's work runs them, the CUDA C++ source builds with nvcc and exports its C functions
(where nvcc is installed), and tools/benchmark_streamed_gemm_chain.py's op-by-op chain computes the reference's
formula. The kernel itself runs in test/gpu/test_kernels.py::test_streamed_gemm_chain."""

from __future__ import annotations

import ctypes
import importlib

import pytest
import torch
import torch.nn.functional as F

from flashrt_core.config import GEMMA_300M
from flashrt_core.engine.kernel_import import load_kernels
from tools.benchmark_streamed_gemm_chain import library_chain, trace_phases, trace_table

K = load_kernels()
SGC = importlib.import_module(K.__name__ + ".streamed_gemm_chain")
BUILD = importlib.import_module(K.__name__ + ".cuda_build")


def kernel_element_index(n: int, k: int, K_total: int) -> int:
    """Where the kernel reads W[n, k] in the packed weight, as its code addresses it: unit n // 8, chunk k // 1024
    (16 KiB each, units then chunks); in a chunk, consumer warp w = (k % 1024) // 128 reads uint4 number
    w * 128 + j * 32 + lane (j: the 32-wide block of its 128, lane = 4 * (n % 8) + (k % 8) // 2); in the uint4,
    .x / .y are the first 16-wide step's b0 / b1 (K offsets 2q, 2q+1 / 2q+8, 2q+9), .z / .w the second step's."""
    unit, chunk, kc = n // 8, k // 1024, k % 1024
    warp, j, s, h, q, p = kc // 128, (kc % 128) // 32, (kc % 32) // 16, (kc % 16) // 8, (kc % 8) // 2, kc % 2
    lane = 4 * (n % 8) + q
    uint4_index = warp * 128 + j * 32 + lane
    chunk_start = (unit * (K_total // 1024) + chunk) * 8 * 1024
    return chunk_start + uint4_index * 8 + s * 4 + h * 2 + p


@pytest.mark.parametrize("n, k", [(16, 1024), (24, 3072)])
def test_pack_weight_puts_every_element_where_the_kernel_reads_it(n, k):
    w = torch.arange(n * k, dtype=torch.float32).reshape(n, k)          # every value distinct
    packed = SGC.pack_weight((w % 251).to(torch.bfloat16))              # exact in bf16
    assert packed.shape == (n * k,)
    index = torch.tensor([[kernel_element_index(i, j, k) for j in range(k)] for i in range(n)])
    assert sorted(index.flatten().tolist()) == list(range(n * k))       # a permutation
    assert torch.equal(packed[index], (w % 251).to(torch.bfloat16))


def kernel_down_pair_word(slot: torch.Tensor, warp: int, t: int, lane: int) -> torch.Tensor:
    """The 32-bit word (two bf16) a lane of `warp` reads for n-tile t from a ring slot of two units' W_down blocks
    (kOutGegluDown), as the kernel addresses it: half (lane % 4) // 2 of the slot (2048 words each), then
    warp * 16 * 16 + t * 16 + (lane // 4) * 2 + lane % 2."""
    group, quad = lane // 4, lane % 4
    word = (quad >> 1) * 2048 + warp * 256 + t * 16 + group * 2 + (quad & 1)
    return slot[2 * word: 2 * word + 2]


@pytest.mark.parametrize("ua, ub", [(0, 1), (5, 3), (7, 7)])
def test_pack_down_pairs_gives_each_lane_its_m16n8k8_b_fragment(ua, ub):
    """The m16n8k8 B fragment (K x N = 8 x 8, b0 = B[2 (lane % 4) .. + 1][lane // 4]) of each n-tile, gathered from
    the lanes' reads of a slot holding units ua and ub (ub = ua: an odd group's last unit twice), is W_down's rows of
    that tile at the 8 GeGLU columns 4 ua .. 4 ua + 3, 4 ub .. 4 ub + 3: a pair's product is act[:, those] @ W^T."""
    mlp = 32
    w = (torch.arange(1024 * mlp, dtype=torch.float32).reshape(1024, mlp) % 251).to(torch.bfloat16)
    packed = SGC.pack_down_pairs(w)
    assert packed.shape == (1024 * mlp,)
    block = 1024 * 4                                                    # one unit's bf16 values (8 KiB)
    slot = torch.cat([packed[ua * block:(ua + 1) * block], packed[ub * block:(ub + 1) * block]])
    cols = [4 * ua + i for i in range(4)] + [4 * ub + i for i in range(4)]
    for warp in range(8):
        for t in range(16):
            b = torch.empty(8, 8, dtype=torch.bfloat16)                 # (k, n) of this n-tile
            for lane in range(32):
                b[2 * (lane % 4): 2 * (lane % 4) + 2, lane // 4] = kernel_down_pair_word(slot, warp, t, lane)
            rows = [128 * warp + 8 * t + n for n in range(8)]
            assert torch.equal(b, w[rows][:, cols].T), (warp, t)


@pytest.mark.parametrize("group_units", [8, 3])
def test_the_paired_mlp_a_fragments_are_the_pairs_geglu_columns(group_units):
    """The GeGLU epilogue of kOutGegluDown writes element (row, c) of unit j at bf16 index row * 32 + 4 j + c of
    act_s (zero where the group has no unit j); for the pair starting at unit jp a lane reads the 32-bit words
    group * 16 + 2 jp + quad (a0) and (group + 8) * 16 + 2 jp + quad (a1). Gathered as the m16n8k8 A fragment
    (a0 = A[lane // 4][2 (lane % 4) .. + 1], a1 the same 8 rows further), that is the 16 rows of the pair's 8 GeGLU
    columns: unit jp's 4, then unit jp + 1's (zeros past the group's last unit)."""
    act = (torch.arange(16 * 8 * 4, dtype=torch.float32).reshape(16, 8, 4) + 1).to(torch.bfloat16)  # (row, j, c)
    act_s = torch.zeros(16 * 32, dtype=torch.bfloat16)
    for row in range(16):
        for j in range(8):
            for c in range(4):
                act_s[row * 32 + 4 * j + c] = act[row, j, c] if j < group_units else 0
    for jp in range(0, group_units, 2):
        a = torch.empty(16, 8, dtype=torch.bfloat16)
        for lane in range(32):
            group, quad = lane // 4, lane % 4
            for row in (group, group + 8):
                word = row * 16 + 2 * jp + quad
                a[row, 2 * quad: 2 * quad + 2] = act_s[2 * word: 2 * word + 2]
        second = act[:, jp + 1] if jp + 1 < group_units else torch.zeros(16, 4, dtype=torch.bfloat16)
        want = torch.cat([act[:, jp], second], 1)
        assert torch.equal(a, want), jp


def test_pack_down_pairs_names_what_it_cannot_take():
    with pytest.raises(ValueError, match="bf16 \\(1024, mlp\\) W_down"):
        SGC.pack_down_pairs(torch.zeros(512, 64, dtype=torch.bfloat16))


def test_interleave_gate_up_puts_four_gate_rows_before_their_up_rows():
    mlp, k = 8, 3
    w = torch.arange(2 * mlp * k, dtype=torch.float32).reshape(2 * mlp, k)
    got = SGC.interleave_gate_up(w)
    order = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]      # gate 0-3, up 0-3, gate 4-7, up 4-7
    assert torch.equal(got, w[order])


@pytest.mark.parametrize("shape, dtype", [((12, 1024), torch.bfloat16), ((8, 1000), torch.bfloat16),
                                          ((8, 1024), torch.float32)])
def test_pack_weight_names_what_it_cannot_take(shape, dtype):
    with pytest.raises(ValueError, match="bf16 \\(N, K\\) weight with N a multiple of 8"):
        SGC.pack_weight(torch.zeros(shape, dtype=dtype))


def test_the_benchmark_op_by_op_chain_computes_the_reference_formula():
    g = torch.Generator().manual_seed(3)
    shapes = GEMMA_300M.layer_gemm_shapes()
    weights = K.random_streamed_layer_weights(2, GEMMA_300M.width, shapes["qkv"][0], shapes["o"][1],
                                              shapes["down"][1], "cpu", g)
    h0 = torch.randn(10, GEMMA_300M.width, generator=g)
    want = K.streamed_gemm_chain_reference(h0, weights, 3)
    h = h0.clone()
    library_chain(h, weights, 3)()
    # the op-by-op chain rounds the o and down products to bf16 before adding them; nothing else differs
    assert float((h - want).norm() / want.norm()) < 1e-2
    assert float((h - h0).norm() / h0.norm()) > 0.05                    # the layers did change the residual


@pytest.mark.skipif(not K.cuda_build_available(), reason="no nvcc on this machine")
def test_the_cuda_source_builds_and_exports_its_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = BUILD.build_library(SGC.LIBRARY)
    assert path.parent == tmp_path / "flashrt" / "cuda" and path.is_file()
    assert BUILD.build_library(SGC.LIBRARY) == path                     # built once: the second call finds it
    lib = ctypes.CDLL(str(path))
    smem = lib.streamed_gemm_chain_smem_bytes()
    assert 200 * 1024 < smem <= 227 * 1024                               # the ring fits one H100/H200 SM
    assert lib.streamed_gemm_chain_threads() == 9 * 32
    for name in ("streamed_gemm_chain_launch", "streamed_gemm_chain_max_ctas", "streamed_gemm_chain_error_string"):
        assert hasattr(lib, name)
    if not torch.cuda.is_available():
        assert lib.streamed_gemm_chain_max_ctas() == -1                  # no device: says so, does not crash
    # each measurement switch builds its own library, beside the product one
    switched = {BUILD.build_library(SGC.LIBRARY, SGC.build_macros((name,), a_window=name == "a_copy"))
                for name in SGC.LEAVE_OUT}
    assert len(switched) == len(SGC.LEAVE_OUT) and path not in switched and all(p.is_file() for p in switched)
    window = ctypes.CDLL(str(BUILD.build_library(SGC.LIBRARY, SGC.build_macros(a_window=True))))
    assert 200 * 1024 < window.streamed_gemm_chain_smem_bytes() <= 227 * 1024   # the window beside a smaller ring
    assert BUILD.build_library(SGC.LIBRARY, SGC.build_macros(a_window=True, cluster=4)).is_file()
    summed = ctypes.CDLL(str(BUILD.build_library(SGC.LIBRARY, SGC.build_macros(a_window=True, cluster=2,
                                                                               down_cluster_sum=True))))
    assert summed.streamed_gemm_chain_smem_bytes() == window.streamed_gemm_chain_smem_bytes() + 16  # two mbarriers
    traced = ctypes.CDLL(str(BUILD.build_library(SGC.LIBRARY, (SGC.TRACE_MACRO,))))
    for name in ("streamed_gemm_chain_trace_setup", "streamed_gemm_chain_trace_read"):
        assert hasattr(traced, name) and not hasattr(lib, name)          # the product build has no trace


def test_the_kernel_library_refuses_an_unknown_switch():
    with pytest.raises(ValueError, match="leave_out takes \\['a_copy', 'atomics', 'compute', 'consumers', 'copy', "
                                         "'products'\\]"):
        SGC.library(("waits",))
    with pytest.raises(ValueError, match="cluster takes \\(1, 2, 4\\); got 3"):
        SGC.library(a_window=True, cluster=3)
    with pytest.raises(ValueError, match="cluster > 1 needs a_window=True"):
        SGC.library(cluster=2)
    with pytest.raises(ValueError, match="leave_out a_copy .* needs a_window=True"):
        SGC.library(("a_copy",))
    with pytest.raises(ValueError, match="down_cluster_sum .* needs cluster > 1"):
        SGC.library(a_window=True, down_cluster_sum=True)
    assert SGC.build_macros(("products",), True, True, 2) == ("SGC_LEAVE_OUT_PRODUCTS", "SGC_TRACE", "SGC_A_WINDOW",
                                                              "SGC_CLUSTER=2")
    assert SGC.build_macros(("atomics",), a_window=True, cluster=4, down_cluster_sum=True) == (
        "SGC_LEAVE_OUT_ATOMICS", "SGC_A_WINDOW", "SGC_CLUSTER=4", "SGC_DOWN_CLUSTER_SUM")


@pytest.mark.parametrize("form", [{"pair_mlp": False}, {"wait_inputs": False}], ids=["four-gemms", "no-waits"])
def test_a_clustered_chain_names_what_it_cannot_run(form):
    """Before any build or launch: a clustered chain needs its waits and the paired MLP."""
    shapes = GEMMA_300M.layer_gemm_shapes()
    weights = K.random_streamed_layer_weights(1, GEMMA_300M.width, shapes["qkv"][0], shapes["o"][1],
                                              shapes["down"][1], "cpu", torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="a clustered chain needs its waits .* and the paired MLP"):
        SGC.StreamedGemmChain(weights, 1, 10, a_window=True, cluster=2, **form)


def test_without_nvcc_the_build_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(BUILD, "find_nvcc", lambda: None)
    with pytest.raises(RuntimeError, match="needs nvcc"):
        BUILD.build_library(SGC.LIBRARY)


def _as_the_kernel_reads(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (n, k) weight the kernel multiplies by, gathered from a pack_weight buffer through its addressing."""
    index = kernel_element_index(torch.arange(n)[:, None], torch.arange(k)[None, :], k)
    return packed[index]


def _emulate_chain(descs, buffers: dict, rows: int, ctas: int) -> None:
    """The kernel's work on the CPU, step by step, CTA after CTA in each step (so a step that wrote into a buffer
    it also reads would be caught), reading every operand through its descriptor's pointers: unit u of a step
    belongs to CTA (u + rot) % ctas, a CTA's units go in groups of 8, kOutGegluDown multiplies each group's GeGLU
    columns by their W_down blocks and adds the product into its output (the atomics)."""
    rot = 0
    for w_ptr, in_ptr, out_ptr, n, k, kinds, _, _, w2_ptr, out2_ptr in descs:
        in_kind, out_kind = kinds & 0xFF, kinds >> 8 & 0xFF
        w = _as_the_kernel_reads(buffers[w_ptr], n, k).float()
        x = buffers[in_ptr][:rows, :k]
        a = (SGC.rms_norm(x) if in_kind == SGC.IN_RMS_NORM else x.float()).bfloat16().float()
        out = buffers[out_ptr]
        units = n // SGC.TILE_N
        for cta in range(ctas):
            first = (cta - rot) % ctas
            mine = (units - first + ctas - 1) // ctas if first < units else 0
            for g0 in range(0, mine, 8):
                group = [first + (g0 + j) * ctas for j in range(min(8, mine - g0))]
                acts = []
                for u in group:
                    y = a @ w[8 * u: 8 * u + 8].T                                # (rows, 8) fp32
                    if out_kind == SGC.OUT_BF16:
                        out[:rows, 8 * u: 8 * u + 8] = y.bfloat16()
                    elif out_kind == SGC.OUT_ADD_F32:
                        value = out[:rows, 8 * u: 8 * u + 8] + y
                        out[:rows, 8 * u: 8 * u + 8] = value
                        if out2_ptr:
                            buffers[out2_ptr][:rows, 8 * u: 8 * u + 8] = value
                    else:
                        gate, up = y[:, :4].bfloat16().float(), y[:, 4:].bfloat16().float()
                        act = (F.gelu(gate, approximate="tanh") * up).bfloat16()
                        if out_kind == SGC.OUT_GEGLU:
                            out[:rows, 4 * u: 4 * u + 4] = act
                        acts.append(act)
                if out_kind == SGC.OUT_GEGLU_DOWN:
                    blocks = buffers[w2_ptr].view(-1, 1024, 4)                   # pack_down_pairs' unit blocks
                    w_down = torch.cat([blocks[u] for u in group], dim=1).float()   # (1024, 4 * units)
                    out[:rows] += torch.cat(acts, dim=1).float() @ w_down.T
        rot = (rot + units) % ctas


@pytest.mark.parametrize("pair_mlp", [True, False], ids=["paired-mlp", "four-gemms"])
@pytest.mark.parametrize("layers, ctas", [(1, 132), (2, 37), (3, 132)])
def test_the_chain_descriptors_compute_the_reference(pair_mlp, layers, ctas):
    """chain_descs' descriptors, run by an emulation of the kernel's work (_emulate_chain), compute
    streamed_gemm_chain_reference at the expert's shapes: the buffers each step reads and writes (the paired
    MLP's residual copy, swapped every layer), the packed weights through the kernel's addressing, the units'
    owners and groups (37 CTAs: several groups, an odd last one), and the buffer chain_descs names as the result.
    The activations and the residual copy start as NaN, so a step that reads what no earlier step wrote fails."""
    g = torch.Generator().manual_seed(layers)
    shapes = GEMMA_300M.layer_gemm_shapes()
    width, attn, mlp = GEMMA_300M.width, shapes["o"][1], shapes["down"][1]
    weights = K.random_streamed_layer_weights(2, width, shapes["qkv"][0], attn, mlp, "cpu", g)
    down = SGC.pack_down_pairs if pair_mlp else SGC.pack_weight
    packed = [SGC.LayerWeights(SGC.pack_weight(w.qkv), SGC.pack_weight(w.o),
                               SGC.pack_weight(SGC.interleave_gate_up(w.gate_up)), down(w.down)) for w in weights]
    rows = 10
    h0 = torch.randn(rows, width, generator=g)
    h = h0.clone()
    h_pair = torch.full((rows, width), float("nan")) if pair_mlp else None
    q = torch.full((rows, shapes["qkv"][0]), float("nan"), dtype=torch.bfloat16)
    act = torch.full((rows, mlp), float("nan"), dtype=torch.bfloat16)
    descs, result = SGC.chain_descs(weights, packed, layers, h, h_pair, q, act)
    assert len(descs) == (3 if pair_mlp else 4) * layers
    assert result is (h_pair if pair_mlp and layers % 2 else h)
    buffers = {t.data_ptr(): t for t in [h, q, act] + ([h_pair] if pair_mlp else [])
               + [w for p in packed for w in p]}
    _emulate_chain(descs, buffers, rows, ctas)
    want = K.streamed_gemm_chain_reference(h0, weights, layers)
    assert not torch.isnan(result).any()
    assert float((result - want).norm() / want.norm()) < 1e-3


# A synthetic trace of 3 CTAs over 64 steps of the paired chain, every duration in SM clocks at 2 clocks per ns:
# per kind of step, the clocks from each event to the next (start, inputs ready, A ready, first product, last
# product, sums stored, released); the CTAs start each step 10 clocks apart, the next step 80 clocks after the last
# release; CTA 2 owns no unit of the o steps (no A, products or sums: those events stay 0). The MLP steps' down
# products end DOWN_CLOCKS after their last gate/up product (the trace's last event, recorded in paired MLP steps only).
TRACE_CLOCKS = {"qkv": [100, 200, 300, 400, 500, 600], "o": [10, 0, 30, 40, 50, 60], "mlp": [20, 40, 60, 80, 100, 120]}
KINDS = ("qkv", "o", "mlp")
DOWN_CLOCKS = 60


def _synthetic_trace(first: int) -> torch.Tensor:
    trace = torch.zeros(3, SGC.TRACE_GEMMS, SGC.TRACE_EVENTS, 2, dtype=torch.int64)
    start = 1000
    for i in range(SGC.TRACE_GEMMS):
        kind = KINDS[(first + i) % 3]
        for c in range(3):
            events = [start + 10 * c]
            for d in TRACE_CLOCKS[kind]:
                events.append(events[-1] + d)
            trace[c, i, :7, 0] = torch.tensor(events)
            trace[c, i, :7, 1] = torch.tensor(events) // 2 + 7   # the global timer: its own origin
            if kind == "mlp":
                trace[c, i, 7, 0] = events[4] + DOWN_CLOCKS
                trace[c, i, 7, 1] = (events[4] + DOWN_CLOCKS) // 2 + 7
            if kind == "o" and c == 2:
                trace[c, i, 2:6] = 0
        start = int(trace[:, i, 6, 0].max()) + 80
    return trace


def test_trace_phases_times_each_phase_of_each_kind_of_step():
    first = 271                                                          # an o step first: kinds rotate from there
    phases = trace_phases(_synthetic_trace(first), first)
    assert phases["ns_per_clock"] == pytest.approx(0.5, rel=1e-3)
    for kind, clocks in TRACE_CLOCKS.items():
        row = phases["steps"][kind]
        want = dict(zip(["wait", "A", "to the first product", "products", "sums", "barrier"], clocks))
        for name, c in want.items():
            assert row[name] == pytest.approx(c / 2, abs=0.6), (kind, name)
        assert row["step"] == pytest.approx(sum(clocks) / 2, abs=0.6)
        if kind == "mlp":                                                # the sums split at the last down product
            assert row["down products"] == pytest.approx(DOWN_CLOCKS / 2, abs=0.6)
            assert row["down sums"] == pytest.approx((clocks[4] - DOWN_CLOCKS) / 2, abs=0.6)
        else:
            assert row["down products"] is None and row["down sums"] is None
        # CTA c releases 10 c clocks after CTA 0 and starts the next step 10 c clocks after it too
        assert row["to the next step"] == pytest.approx((80 + 20) / 2, abs=0.6)
    across = phases["across_ctas"]
    assert across["release_spread_ns"] == pytest.approx(10, abs=1)       # 20 clocks between CTA 0 and CTA 2
    table = trace_table(phases)
    assert table.splitlines()[0].startswith("| step | wait | A |") and "| o | 5 | 0 | 15 |" in table


def test_trace_phases_leaves_out_what_a_cta_did_not_reach():
    trace = _synthetic_trace(270)
    trace[1:] = 0                                                        # one CTA's record only
    phases = trace_phases(trace, 270)
    assert phases["steps"]["o"]["products"] == pytest.approx(20, abs=0.6)
    assert phases["across_ctas"] is None                                 # no step that every CTA released
    with pytest.raises(ValueError, match="no CTA with two whole steps"):
        trace_phases(torch.zeros_like(trace), 270)
