"""A chain of dependent one-shot GEMMs, the building block of a persistent denoiser: how much a dependency between
layers costs when it is a kernel boundary (one launch per layer, in a CUDA graph, with or without PDL) or a counter
in global memory inside one persistent kernel (docs/performance.md, "What a dependency between layers costs", has
what each costs on an H200).

    x_0 = x;  x_{l+1} = bf16(x_l @ W_l^T)   x (M, D), W_l (D, D), l = 0 .. L-1;  returns x_L

Every program owns BLOCK_N output columns of a layer (a tile: its BLOCK_N x D weight slice, loaded whole, "one
shot", before it waits for its input), so a layer is D / BLOCK_N tiles and every weight byte is read once.
- ``wait="launch"``: layer l is its own launch of D / BLOCK_N programs; with PDL the next layer's programs start,
  load their weights and wait (griddepcontrol) while this one finishes.
- ``wait="counter"``: one persistent launch of D / BLOCK_N programs (all resident: at most one per SM), each owning
  the same tile of every layer. A program loads its slice of W_l, then spins (volatile loads, then one acquire)
  until layer l - 1's counter holds D / BLOCK_N (every tile of x_l written), reads x_l, writes its tile of x_{l+1}
  and adds one to layer l's counter (a CTA barrier, then a release at GPU scope). The weights of layer l stream
  while the program waits for layer l - 1; the counters are zeroed before each run (the launcher does it).
``resident=True`` makes every layer multiply by W_0 (x_{l+1} = bf16(x_l @ W_0^T)): the persistent form loads its
slice of it once, before the first layer, and the launches read it from L2 each time, so what a layer costs is the
hand-over alone, without its weight stream; set beside the streamed chain, it says how much of that stream the wait
hides.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs

BLOCK_M = 16           # rows a program covers (the denoiser's 10-row steps; at most 16)
WAITS = ("launch", "counter")
PERSISTENT_WAITS = ("counter",)          # programs wait on each other


def layer_chain_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch. x (M, D), w (L, D, D) -> x_L (M, D) in x.dtype, each layer's product rounded to x.dtype."""
    for layer in w:
        x = (x.float() @ layer.float().T).to(x.dtype)
    return x


@triton.jit
def _tile_indices(M, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's output columns rn, the reduction index rk, the rows rm and the (BLOCK_M, 1) row mask."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    return rn, tl.arange(0, D), rm, (rm < M)[:, None]


@triton.jit
def _layer_kernel(x_ptr, w_ptr, y_ptr, M, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PDL: tl.constexpr):
    """One layer: y[:, tile] = x @ W[tile, :]^T."""
    release_dependents(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, D)
    rm = tl.arange(0, BLOCK_M)
    w = tl.load(w_ptr + rn[:, None] * D + rk[None, :])                                  # (BLOCK_N, D)
    wait_for_inputs(PDL)
    x = tl.load(x_ptr + rm[:, None] * D + rk[None, :], mask=(rm < M)[:, None], other=0.0)
    y = tl.dot(x, tl.trans(w))                                                          # (BLOCK_M, BLOCK_N) fp32
    tl.store(y_ptr + rm[:, None] * D + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=(rm < M)[:, None])


@triton.jit
def _persistent_chain_kernel(buf_ptr, w_ptr, counter_ptr, M, LAYERS: tl.constexpr, D: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RESIDENT: tl.constexpr):
    """Every layer's tile `program_id` in turn; buf (LAYERS + 1, M, D): buf[0] = x, buf[l + 1] = layer l's output.
    RESIDENT: W_0's slice loaded once, for every layer."""
    tiles: tl.constexpr = D // BLOCK_N
    rn, rk, rm, m_ok = _tile_indices(M, D, BLOCK_M, BLOCK_N)
    if RESIDENT:
        w = tl.load(w_ptr + rn[:, None] * D + rk[None, :])
    for layer in range(LAYERS):
        if not RESIDENT:
            w = tl.load(w_ptr + layer * D * D + rn[:, None] * D + rk[None, :])          # before the wait
        ok = m_ok
        if layer > 0:
            counter = counter_ptr + layer - 1
            done = tl.load(counter, volatile=True)       # spin on the L2 line, no read-modify-write traffic
            while done < tiles:
                done = tl.load(counter, volatile=True)
            # the acquire: its value masks the input's loads, which keeps it (an atomic whose result nothing
            # reads is dropped by the compiler) and orders them after it
            ok = m_ok & (tl.atomic_add(counter, 0, sem="acquire") >= tiles)
        x = tl.load(buf_ptr + layer * M * D + rm[:, None] * D + rk[None, :], mask=ok, other=0.0,
                    cache_modifier=".cg")                                               # written by other SMs
        y = tl.dot(x, tl.trans(w))
        tl.store(buf_ptr + (layer + 1) * M * D + rm[:, None] * D + rn[None, :], y.to(buf_ptr.dtype.element_ty),
                 mask=m_ok)
        tl.debug_barrier()                       # every thread's stores of the tile before the release
        tl.atomic_add(counter_ptr + layer, 1, sem="release")


def chain_tiles(D: int, block_n: int) -> int:
    return D // block_n


def check_shapes(x: torch.Tensor, w: torch.Tensor, block_n: int) -> None:
    M, D = x.shape
    if w.dim() != 3 or w.shape[1:] != (D, D) or M > BLOCK_M or D % block_n or D & (D - 1):
        raise ValueError(f"layer_chain: x (M <= {BLOCK_M}, D) with D a power of two, w (L, D, D), D a multiple of "
                         f"block_n={block_n}; got x {tuple(x.shape)}, w {tuple(w.shape)}")


class LayerChain:
    """Static buffers for one chain: `run()` computes x_L from `x` (written in place into bf16[0]); capturable.
    wait: one of WAITS (the module's docstring); pdl applies to wait="launch"; resident: every layer multiplies by
    w[0] (the module's docstring; layer_chain_reference(x, resident_weights(w)) is then the result)."""

    def __init__(self, w: torch.Tensor, rows: int, wait: str, pdl: bool | int = False, block_n: int = 16,
                 num_warps: int = 4, resident: bool = False):
        if wait not in WAITS:
            raise ValueError(f"layer_chain: wait {wait!r} is not one of {WAITS}")
        self.w, self.wait, self.pdl, self.block_n, self.resident = w, wait, pdl, block_n, resident
        self.num_warps = num_warps
        layers, D, _ = w.shape
        self.bf16 = torch.zeros(layers + 1, rows, D, device=w.device, dtype=w.dtype)
        check_shapes(self.bf16[0], w, block_n)
        self.counters = torch.zeros(layers, device=w.device, dtype=torch.int32)
        tiles = chain_tiles(D, block_n)
        if wait in PERSISTENT_WAITS and w.is_cuda:
            sms = torch.cuda.get_device_properties(w.device).multi_processor_count
            if tiles > sms:
                raise ValueError(f"layer_chain: a persistent run needs its {tiles} programs resident at once, "
                                 f"this GPU has {sms} multiprocessors (raise block_n)")

    @property
    def x(self) -> torch.Tensor:
        """The chain's input (rows, D) in the weights' dtype: write it before run()."""
        return self.bf16[0]

    @property
    def out(self) -> torch.Tensor:
        """x_L (rows, D) after run()."""
        return self.bf16[-1]

    def _weight(self, layer: int) -> torch.Tensor:
        """The weight the launch of `layer` reads: W_layer, or W_0 for every layer when resident."""
        return self.w[0 if self.resident else layer]

    def run(self) -> torch.Tensor:
        layers, rows, D = self.bf16.shape[0] - 1, self.bf16.shape[1], self.bf16.shape[2]
        tiles = chain_tiles(D, self.block_n)
        if self.wait == "counter":
            self.counters.zero_()
            _persistent_chain_kernel[(tiles,)](self.bf16, self.w, self.counters, rows, LAYERS=layers, D=D,
                                               BLOCK_M=BLOCK_M, BLOCK_N=self.block_n, RESIDENT=self.resident,
                                               num_warps=self.num_warps)
        else:
            for layer in range(layers):
                _layer_kernel[(tiles,)](self.bf16[layer], self._weight(layer), self.bf16[layer + 1], rows, D=D,
                                        BLOCK_M=BLOCK_M, BLOCK_N=self.block_n, PDL=int(self.pdl),
                                        num_warps=self.num_warps, **launch_options(self.pdl))
        return self.out


def resident_weights(w: torch.Tensor) -> torch.Tensor:
    """The weights a resident chain multiplies by: w[0] for each of w's layers (a view, no copy)."""
    return w[:1].expand_as(w)


def layer_chain(x: torch.Tensor, w: torch.Tensor, wait: str, pdl: bool | int = False,
                block_n: int = 16) -> torch.Tensor:
    """Triton launcher; contract of layer_chain_reference (a new chain's buffers per call: tests)."""
    chain = LayerChain(w, x.shape[0], wait, pdl, block_n)
    chain.x.copy_(x)
    return chain.run().clone()
