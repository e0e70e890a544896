"""The action expert's GEMM chain as one persistent CUDA C++ kernel whose weights stream ahead of their
dependencies (cuda/streamed_gemm_chain.cu says how): the building block of a persistent denoiser, measured by
tools/benchmark_streamed_gemm_chain.py against the same chain launched GEMM by GEMM.

Per layer l, with the weights of layer l % len(layer_weights) (pi0.5's denoise: 18 layers' weights, 10 steps):

    q   = bf16(bf16(rms(h)) @ W_qkv^T)                                (rows, 2560)
    h  += q[:, :2048] @ W_o^T                                          h: the fp32 residual, (rows, 1024)
    gu  = bf16(bf16(rms(h)) @ W_gate_up^T)                            (rows, 8192)
    h  += bf16(gelu_tanh(gu[:, :4096]) * gu[:, 4096:]) @ W_down^T
    rms(h) = h * rsqrt(mean(h^2, row) + 1e-6)

The GEMMs have the expert's shapes (GEMMA_300M.layer_gemm_shapes()) and the denoise's dependencies: every GEMM
needs the whole output of the one before. The gate/up GEMM writes the GeGLU activation itself (its weight rows
interleaved by interleave_gate_up, so that the owner of 4 gate columns also holds their up columns). With
`pair_mlp` (the default) the MLP is one step of the chain instead of two: the owner of 4 GeGLU columns multiplies
them by the 4 matching columns of W_down (pack_down_pairs) and adds that partial product into h with atomics, so
the activation never leaves the SM and a layer has three hand-overs instead of four. The atomics go into a second
residual buffer that the O GEMM fills with a copy of its result (the MLP step reads h for its own norm while other
CTAs add into the copy); the two buffers swap roles every layer. The RMS norms
are folded into the QKV and gate/up GEMMs' loads of h (the place of the denoise's adaRMSNorms, without their
modulation); the attention's place is taken by q's first 2048 columns (what the attention costs in the chain is
measured apart: tools/benchmark_denoise_ablation.py).

`pack_weight` lays a (N, K) weight out as the kernel reads it: units of 8 output rows, each in chunks of 1024 of K
(16 KiB), a chunk in mma.sync m16n8k16 B-fragment order: 32-wide blocks of K, each 32 lanes x 16 bytes, lane
4 r + q holding row r's K offsets {2q, 2q+1, 2q+8, 2q+9} of the block's two 16-wide steps.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch
import torch.nn.functional as F

TILE_N = 8             # output columns of one unit of work (one mma n-tile)
CHUNK_K = 1024         # reduction length of one streamed weight chunk
MAX_ROWS = 16          # one m16 tile
IN_BF16, IN_RMS_NORM = 0, 1
RMS_EPS = 1e-6
OUT_BF16, OUT_ADD_F32, OUT_GEGLU, OUT_GEGLU_DOWN = 0, 1, 2, 3
LIBRARY = "streamed_gemm_chain"
# measurement switches of the kernel (its results are then wrong): what each leaves out -> the macro that does it
LEAVE_OUT = {"copy": "SGC_LEAVE_OUT_COPY", "compute": "SGC_LEAVE_OUT_COMPUTE", "products": "SGC_LEAVE_OUT_PRODUCTS",
             "consumers": "SGC_LEAVE_OUT_CONSUMERS", "atomics": "SGC_LEAVE_OUT_ATOMICS",
             "a_copy": "SGC_LEAVE_OUT_A_COPY"}
# the A operand through shared memory (cuda/streamed_gemm_chain.cu, SGC_A_WINDOW), shared in clusters (SGC_CLUSTER);
# the paired MLP's partial products added up within each cluster before the atomics (SGC_DOWN_CLUSTER_SUM)
A_WINDOW_MACRO, CLUSTER_MACRO, CLUSTERS = "SGC_A_WINDOW", "SGC_CLUSTER", (1, 2, 4)
DOWN_CLUSTER_SUM_MACRO = "SGC_DOWN_CLUSTER_SUM"
# the trace build (SGC_TRACE): per CTA (the first TRACE_CTAS) and per step of a window of TRACE_GEMMS steps, the SM
# clock and the GPU's global timer at each of TRACE_EVENTS points of the step (TRACE_EVENT_NAMES; the last only in a
# paired MLP step: its first group's down products done, before their cluster sum and atomics)
TRACE_MACRO = "SGC_TRACE"
TRACE_CTAS, TRACE_GEMMS, TRACE_EVENTS = 160, 64, 8
TRACE_EVENT_NAMES = ("start", "inputs ready", "A ready", "first product", "last product", "sums stored",
                     "released", "down products")


class LayerWeights(NamedTuple):
    """One expert layer's four weights, (N, K) bf16 as nn.Linear stores them (gate_up: gate rows, then up rows)."""
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """(N, K) bf16 -> the same values in the kernel's order (module docstring), flat bf16 of N * K."""
    n, k = w.shape
    if w.dtype != torch.bfloat16 or n % TILE_N or k % CHUNK_K:
        raise ValueError(f"pack_weight takes a bf16 (N, K) weight with N a multiple of {TILE_N} and K a multiple of "
                         f"{CHUNK_K}; got {tuple(w.shape)} {w.dtype}")
    # (unit, row r, chunk, block b, step s, half h, quad q, pair p) -> (unit, chunk, block, r, q, s, h, p)
    v = w.reshape(n // TILE_N, TILE_N, k // CHUNK_K, CHUNK_K // 32, 2, 2, 4, 2)
    return v.permute(0, 2, 3, 1, 6, 4, 5, 7).contiguous().reshape(-1)


def pack_down_pairs(w: torch.Tensor) -> torch.Tensor:
    """W_down (1024, mlp) bf16 -> per gate/up unit u (GeGLU columns 4u .. 4u + 3), its columns of W_down as a
    row-major (1024, 4) block of 8 KiB, flat: the kernel copies two units' blocks into one ring slot and a lane of
    warp w reads, for n-tile t, the 32-bit word of row 128 w + 8 t + lane // 4 at K pair lane % 2 of the unit in
    slot half (lane % 4) // 2 (the m16n8k8 B fragment)."""
    n, mlp = w.shape
    if w.dtype != torch.bfloat16 or n != CHUNK_K or mlp % 4:
        raise ValueError(f"pack_down_pairs takes a bf16 ({CHUNK_K}, mlp) W_down with mlp a multiple of 4; got "
                         f"{tuple(w.shape)} {w.dtype}")
    return w.reshape(n, mlp // 4, 4).permute(1, 0, 2).contiguous().reshape(-1)


def interleave_gate_up(w: torch.Tensor) -> torch.Tensor:
    """(2 mlp, K) gate rows then up rows -> rows in groups of 8: 4 gate rows, then the same 4 columns' up rows, so
    one unit of the kernel holds both halves of its 4 GeGLU outputs (OUT_GEGLU)."""
    mlp = w.shape[0] // 2
    if w.shape[0] % 8:
        raise ValueError(f"interleave_gate_up takes 2 mlp rows with mlp a multiple of 4; got {w.shape[0]} rows")
    gate, up = w[:mlp].reshape(mlp // 4, 4, -1), w[mlp:].reshape(mlp // 4, 4, -1)
    return torch.stack([gate, up], dim=1).reshape(w.shape)


def random_layer_weights(layers: int, width: int, qkv: int, attn: int, mlp: int, device,
                         generator: torch.Generator | None = None) -> list[LayerWeights]:
    """Random expert weights: the input projections scaled by K^-0.5 (outputs of about unit size from normalized
    inputs), the output projections (o, down) by 0.1 K^-0.5 (each layer changes the residual a little)."""
    def weight(n, k, scale):
        return (torch.randn(n, k, device=device, generator=generator) * scale * k ** -0.5).to(torch.bfloat16)
    return [LayerWeights(weight(qkv, width, 1.0), weight(width, attn, 0.1), weight(2 * mlp, width, 1.0),
                         weight(width, mlp, 0.1)) for _ in range(layers)]


def rms_norm(h: torch.Tensor) -> torch.Tensor:
    """h * rsqrt(mean(h^2) + RMS_EPS) per row, in fp32."""
    return h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)


def streamed_gemm_chain_reference(h: torch.Tensor, layer_weights: list[LayerWeights], layers: int) -> torch.Tensor:
    """Plain PyTorch (module docstring): the fp32 residual after `layers` layers, from h (rows, width)."""
    h = h.float().clone()
    for layer in range(layers):
        w = layer_weights[layer % len(layer_weights)]
        attn, mlp = w.o.shape[1], w.down.shape[1]
        q = (rms_norm(h).bfloat16().float() @ w.qkv.float().T).bfloat16()
        h = h + q[:, :attn].float() @ w.o.float().T
        gu = (rms_norm(h).bfloat16().float() @ w.gate_up.float().T).bfloat16()
        a = (F.gelu(gu[:, :mlp].float(), approximate="tanh") * gu[:, mlp:].float()).bfloat16()
        h = h + a.float() @ w.down.float().T
    return h


def _desc(packed, w, src, in_kind, in_stride, dst, out_kind, out_stride, w2=None, out2=None) -> list[int]:
    """One GEMM's descriptor: the kernel's GemmDesc, ten int64 fields in its order."""
    n, k = w.shape
    return [packed.data_ptr(), src.data_ptr(), dst.data_ptr(), n, k, in_kind | out_kind << 8, in_stride,
            out_stride, 0 if w2 is None else w2.data_ptr(), 0 if out2 is None else out2.data_ptr()]


def chain_descs(layer_weights: list[LayerWeights], packed: list[LayerWeights], layers: int, h: torch.Tensor,
                h_pair: torch.Tensor | None, q: torch.Tensor,
                act: torch.Tensor) -> tuple[list[list[int]], torch.Tensor]:
    """The kernel's descriptors of `layers` layers (packed: pack_weight of each weight, gate/up interleaved, W_down
    by pack_down_pairs when h_pair is given, which pairs the MLP) over the buffers h (the input), h_pair, q and
    act; and the buffer that holds the result after the last layer (h, or h_pair after an odd number of paired
    layers). Per layer with the pair: QKV reads h, O adds into h and copies into h_pair, the MLP step reads h and
    adds into h_pair; the next layer runs with the two swapped."""
    width, q_width, mlp = h.shape[1], q.shape[1], act.shape[1]
    descs, cur, nxt = [], h, h_pair
    for layer in range(layers):
        w, p = layer_weights[layer % len(layer_weights)], packed[layer % len(layer_weights)]
        descs += [_desc(p.qkv, w.qkv, cur, IN_RMS_NORM, width, q, OUT_BF16, q_width),
                  _desc(p.o, w.o, q, IN_BF16, q_width, cur, OUT_ADD_F32, width, out2=nxt)]
        if h_pair is not None:
            descs.append(_desc(p.gate_up, w.gate_up, cur, IN_RMS_NORM, width, nxt, OUT_GEGLU_DOWN, width, w2=p.down))
            cur, nxt = nxt, cur
        else:
            descs += [_desc(p.gate_up, w.gate_up, cur, IN_RMS_NORM, width, act, OUT_GEGLU, mlp),
                      _desc(p.down, w.down, act, IN_BF16, mlp, cur, OUT_ADD_F32, width)]
    return descs, cur


def build_macros(leave_out: tuple[str, ...] = (), trace: bool = False, a_window: bool = False,
                 cluster: int = 1, down_cluster_sum: bool = False) -> tuple[str, ...]:
    """The macros of the kernel's build with the LEAVE_OUT switches named, the trace, the A window, clusters and
    the cluster sum of the paired MLP's partial products."""
    unknown = set(leave_out) - set(LEAVE_OUT)
    if unknown:
        raise ValueError(f"leave_out takes {sorted(LEAVE_OUT)}; got {sorted(unknown)}")
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster takes {CLUSTERS}; got {cluster}")
    if cluster > 1 and not a_window:
        raise ValueError("clusters share the A window's copies: cluster > 1 needs a_window=True")
    if "a_copy" in leave_out and not a_window:
        raise ValueError("leave_out a_copy leaves out the A window's copy: it needs a_window=True")
    if down_cluster_sum and cluster == 1:
        raise ValueError("down_cluster_sum adds up the partial products of a cluster's CTAs: it needs cluster > 1")
    return (tuple(LEAVE_OUT[name] for name in sorted(leave_out)) + ((TRACE_MACRO,) if trace else ())
            + ((A_WINDOW_MACRO,) if a_window else ()) + ((f"{CLUSTER_MACRO}={cluster}",) if cluster > 1 else ())
            + ((DOWN_CLUSTER_SUM_MACRO,) if down_cluster_sum else ()))


def library(leave_out: tuple[str, ...] = (), trace: bool = False, a_window: bool = False,
            cluster: int = 1, down_cluster_sum: bool = False) -> ctypes.CDLL:
    """The kernel's library (built by nvcc on first use: cuda_build.py) of build_macros(...), its C functions
    typed."""
    from .cuda_build import load_library
    lib = load_library(LIBRARY, build_macros(leave_out, trace, a_window, cluster, down_cluster_sum))
    if trace:
        lib.streamed_gemm_chain_trace_setup.argtypes = [ctypes.c_int]
        lib.streamed_gemm_chain_trace_setup.restype = ctypes.c_int
        lib.streamed_gemm_chain_trace_read.argtypes = [ctypes.c_void_p]
        lib.streamed_gemm_chain_trace_read.restype = ctypes.c_int
    lib.streamed_gemm_chain_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                               ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.streamed_gemm_chain_launch.restype = ctypes.c_int
    lib.streamed_gemm_chain_error_string.argtypes = [ctypes.c_int]
    lib.streamed_gemm_chain_error_string.restype = ctypes.c_char_p
    return lib


class StreamedGemmChain:
    """`layers` layers of the chain on `rows` rows as one launch. `h` holds the fp32 residual: its value before
    run() is the input, after it the output. `pair_mlp` (module docstring): the MLP's two GEMMs as one step
    (False: four GEMMs per layer, the activation through global memory). `wait_inputs=False` skips every wait
    for a previous GEMM's output:
    the result is then wrong and the time is the weight stream and the compute alone (a ceiling, for measuring);
    `leave_out` ("copy": no weight stream, "compute": no A loads and products, "products": the A loads without
    the products, "consumers": the consumers only free each weight slot, the stream alone, "atomics": the paired
    MLP's partial products not added into the residual, "a_copy": with a_window, the window not copied in)
    likewise, for placing the time.
    `ctas`: the persistent grid (default: as many as can be resident, one per SM). `trace`: the kernel built with
    its trace (trace_steps, read_trace), which times every phase of a window of steps in each CTA. `a_window`:
    each GEMM's A copied into shared memory by the bulk copy engine after the hand-over, the fragments read from
    there (instead of every warp loading its fragments from L2 into registers); `cluster` (2 or 4, with
    a_window): the CTAs in clusters of that size, each copying a share of the rows into every CTA of its cluster,
    so L2 serves each row once per cluster (the waits are then required, and the MLP must be paired: the
    unpaired down GEMM's A needs two windows). `down_cluster_sum` (with clusters): the CTAs of a cluster add up
    their paired MLP partial products over distributed shared memory, each CTA adding a 1 / cluster share of the
    columns into the residual, so each element takes CTAs / cluster atomic adds instead of CTAs."""

    def __init__(self, layer_weights: list[LayerWeights], layers: int, rows: int, wait_inputs: bool = True,
                 ctas: int | None = None, leave_out: tuple[str, ...] = (), pair_mlp: bool = True,
                 trace: bool = False, a_window: bool = False, cluster: int = 1, down_cluster_sum: bool = False):
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"StreamedGemmChain covers 1 to {MAX_ROWS} rows; got {rows}")
        if layers < 1 or not layer_weights:
            raise ValueError("StreamedGemmChain needs at least one layer and one layer's weights")
        if cluster > 1 and not (wait_inputs and pair_mlp):
            raise ValueError("a clustered chain needs its waits (they keep a partner's next A out of a window still "
                             "being read) and the paired MLP (the unpaired down GEMM's A needs two windows)")
        self.lib = library(tuple(leave_out), trace, a_window, cluster, down_cluster_sum)
        self.cluster = cluster
        self.trace = trace
        most = self.lib.streamed_gemm_chain_max_ctas()
        if most < 1:
            raise RuntimeError("streamed_gemm_chain: the kernel does not fit one SM of this GPU (its shared memory: "
                               f"{self.lib.streamed_gemm_chain_smem_bytes()} bytes)")
        self.ctas = most if ctas is None else ctas
        if self.ctas % cluster:
            raise ValueError(f"ctas must be a multiple of the cluster size {cluster}; got {ctas}")
        if not 1 <= self.ctas <= most:
            raise ValueError(f"ctas must be 1 to {most} (every CTA resident at once); got {ctas}")
        w0 = layer_weights[0]
        device = w0.qkv.device
        width, attn, mlp = w0.qkv.shape[1], w0.o.shape[1], w0.down.shape[1]
        if width != CHUNK_K:
            raise ValueError(f"the kernel normalizes a row of h within one chunk: width must be {CHUNK_K}, got {width}")
        if attn > w0.qkv.shape[0]:
            raise ValueError(f"the o projection reads {attn} columns of q, which has {w0.qkv.shape[0]}")
        self.rows, self.layers, self.wait_inputs, self.pair_mlp = rows, layers, wait_inputs, pair_mlp
        down = pack_down_pairs if pair_mlp else pack_weight
        self.packed = [LayerWeights(pack_weight(w.qkv), pack_weight(w.o), pack_weight(interleave_gate_up(w.gate_up)),
                                    down(w.down)) for w in layer_weights]
        self.h = torch.zeros(rows, width, device=device, dtype=torch.float32)
        # pair_mlp: the residual copy the MLP step adds into; the two swap every layer
        self.h_pair = torch.zeros(rows, width, device=device, dtype=torch.float32) if pair_mlp else None
        self.q = torch.zeros(rows, w0.qkv.shape[0], device=device, dtype=torch.bfloat16)
        self.act = torch.zeros(rows, mlp, device=device, dtype=torch.bfloat16)      # gelu_tanh(gate) * up
        self.counter = torch.zeros(1, device=device, dtype=torch.int32)
        descs, self.result = chain_descs(layer_weights, self.packed, layers, self.h, self.h_pair, self.q, self.act)
        self.gemms = len(descs)            # the steps of the chain, each one hand-over: the counter's last value
        self.descs = torch.tensor(descs, dtype=torch.int64).to(device)

    def run(self) -> None:
        """One launch of the whole chain on the current stream (captured when it is capturing)."""
        stream = torch.cuda.current_stream(self.h.device).cuda_stream
        error = self.lib.streamed_gemm_chain_launch(self.descs.data_ptr(), self.descs.shape[0], self.rows,
                                                    self.counter.data_ptr(), int(self.wait_inputs), self.ctas, stream)
        if error:
            raise RuntimeError("streamed_gemm_chain launch failed: "
                               + self.lib.streamed_gemm_chain_error_string(error).decode())
        if self.result is not self.h:              # the last layer's MLP added into the residual copy
            self.h.copy_(self.result)

    def trace_steps(self, first: int) -> None:
        """Trace builds: the next launches record steps [first, first + TRACE_GEMMS) (the record zeroed first)."""
        if not self.trace:
            raise RuntimeError("trace_steps needs a chain built with trace=True")
        error = self.lib.streamed_gemm_chain_trace_setup(first)
        if error:
            raise RuntimeError("streamed_gemm_chain trace setup failed: "
                               + self.lib.streamed_gemm_chain_error_string(error).decode())

    def read_trace(self) -> torch.Tensor:
        """Trace builds: (ctas, TRACE_GEMMS, TRACE_EVENTS, 2) int64 on the CPU, per CTA and traced step the SM clock
        and the global timer (ns) at each event of TRACE_EVENT_NAMES (0 where a CTA did not reach that event: a CTA
        that owns no unit of a step has no A, products or sums there)."""
        if not self.trace:
            raise RuntimeError("read_trace needs a chain built with trace=True")
        torch.cuda.synchronize(self.h.device)
        buf = torch.zeros(TRACE_CTAS, TRACE_GEMMS, TRACE_EVENTS, 2, dtype=torch.int64)
        error = self.lib.streamed_gemm_chain_trace_read(buf.data_ptr())
        if error:
            raise RuntimeError("streamed_gemm_chain trace read failed: "
                               + self.lib.streamed_gemm_chain_error_string(error).decode())
        return buf[:min(self.ctas, TRACE_CTAS)]
