"""The streamed GEMM chain's dependency mechanism alone (cuda/handover_chain.cu says how): `steps` dependent steps in
one persistent launch, each waiting on a release / acquire counter for the step before, reading that step's whole
output from L2 and writing its own share of the next. It checks the mechanism's memory ordering (every value a step
reads is counted when it is not what the step before wrote) and measures what a hand-over costs with the
activation bytes each CTA reads after it (tools/benchmark_handover_chain.py): the chain reads each GEMM's whole A
operand in every CTA, ~40-80 KB per GEMM at 10 rows. In clusters of 2 or 4 CTAs, each CTA loads only its share of
a step's output from L2 and reads the rest from the other CTAs' shared memory: what broadcasting A within clusters
would save. With `slices` = SLICES the hand-over goes by slices of the output: each warp of a CTA waits for one
eighth of the previous step's output alone, on that slice's own counter, then reads it: the dependency mechanism of
a chain whose GEMM steps start their products on each slice of K as soon as its writers are done.
"""

from __future__ import annotations

import ctypes

import torch

LIBRARY = "handover_chain"
CLUSTERS = (1, 2, 4)         # cluster sizes the benchmark and the tests run (1: no clusters)
SLICES = 8                   # the sliced hand-over: one slice per warp of the kernel's 8


def slice_writers(elems: int, ctas: int, slices: int = SLICES) -> list[int]:
    """Per slice of a step's output (`slices` equal parts of `elems`), the CTAs whose share touches it: what its
    counter gains per step (each CTA writes elements [elems c // ctas, elems (c + 1) // ctas))."""
    per = elems // slices
    shares = [(elems * c // ctas, elems * (c + 1) // ctas) for c in range(ctas)]
    return [sum(1 for b, e in shares if b < e and b < (j + 1) * per and e > j * per) for j in range(slices)]


def value(step: int, i: torch.Tensor) -> torch.Tensor:
    """What step `step` writes at element i (the kernel's value()), fp32."""
    return ((step * 7919 + i) % 65521).float()


def library() -> ctypes.CDLL:
    """The kernel's library (built by nvcc on first use: cuda_build.py), its C functions typed."""
    from .cuda_build import load_library
    lib = load_library(LIBRARY)
    lib.handover_chain_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_int, ctypes.c_void_p]
    lib.handover_chain_max_ctas.argtypes = [ctypes.c_int]
    lib.handover_chain_launch.restype = ctypes.c_int
    lib.handover_chain_error_string.argtypes = [ctypes.c_int]
    lib.handover_chain_error_string.restype = ctypes.c_char_p
    return lib


class HandoverChain:
    """`steps` hand-overs over `elems` fp32 values (each step's output; every CTA reads all of it), as one launch
    of `ctas` CTAs (default: as many as can be resident, one per SM) in clusters of `cluster` (1: none; 2 or 4:
    each CTA loads its share from L2 and reads the others' from their shared memory). `readers` (no clusters):
    only the first `readers` CTAs read each step's output, the others hand over alone (default: all read). After
    run(): `mismatches` holds the count of values read that were not the previous step's (0 when the mechanism
    orders the steps; wait_inputs=False skips the waits, for measuring the reads and writes alone, and then counts
    races), `counter` steps x CTAs, and the buffer of the last step (`output()`) every value of it. `slices`
    (SLICES, without clusters, every CTA reading, with the waits): the sliced hand-over (module docstring);
    `counter` then holds one count per slice, steps x slice_writers(elems, ctas)."""

    def __init__(self, elems: int, steps: int, wait_inputs: bool = True, ctas: int | None = None,
                 cluster: int = 1, readers: int | None = None, slices: int = 1,
                 device: str | torch.device = "cuda"):
        if cluster not in CLUSTERS:
            raise ValueError(f"cluster must be one of {CLUSTERS}; got {cluster}")
        if elems < 0 or elems % (4 * cluster):
            raise ValueError(f"elems must be a non-negative multiple of {4 * cluster} (16-byte loads, an equal "
                             f"share per CTA of a cluster of {cluster}); got {elems}")
        if steps < 1:
            raise ValueError(f"steps must be at least 1; got {steps}")
        if slices not in (1, SLICES):
            raise ValueError(f"slices must be 1 or {SLICES}; got {slices}")
        if slices > 1 and (cluster > 1 or readers is not None or not wait_inputs or elems % (4 * SLICES)
                           or elems == 0):
            raise ValueError(f"the sliced hand-over runs without clusters, with every CTA reading and the waits on, "
                             f"over a positive multiple of {4 * SLICES} values; got cluster {cluster}, readers "
                             f"{readers}, wait_inputs {wait_inputs}, elems {elems}")
        self.lib = library()
        if cluster > 1 and elems > self.lib.handover_chain_max_stage_elems():
            raise ValueError(f"a cluster stages at most {self.lib.handover_chain_max_stage_elems()} values per "
                             f"step; got {elems}")
        most = self.lib.handover_chain_max_ctas(cluster)
        if most < 1:
            raise RuntimeError("handover_chain: no CUDA device to size the grid for")
        self.ctas = most if ctas is None else ctas
        if not 1 <= self.ctas <= most or self.ctas % cluster:
            raise ValueError(f"ctas must be a multiple of {cluster} from 1 to {most} (every CTA resident at "
                             f"once); got {ctas}")
        if readers is not None and (cluster > 1 or not 1 <= readers <= self.ctas):
            raise ValueError(f"readers must be 1 to {self.ctas} CTAs, without clusters; got {readers} "
                             f"(cluster {cluster})")
        self.elems, self.steps, self.wait_inputs, self.cluster = elems, steps, wait_inputs, cluster
        self.readers = self.ctas if readers is None else readers
        self.slices = slices
        self.buffers = torch.full((2, max(elems, 4)), float("nan"), device=device)
        self.counter = torch.zeros(slices, device=device, dtype=torch.int32)
        self.mismatches = torch.zeros(1, device=device, dtype=torch.int32)

    def run(self) -> None:
        """One launch on the current stream (captured when it is capturing); mismatches add up over runs."""
        stream = torch.cuda.current_stream(self.buffers.device).cuda_stream
        error = self.lib.handover_chain_launch(self.buffers.data_ptr(), self.elems, self.steps,
                                               self.counter.data_ptr(), self.mismatches.data_ptr(),
                                               int(self.wait_inputs), self.ctas, self.cluster, self.readers,
                                               self.slices, stream)
        if error:
            raise RuntimeError("handover_chain launch failed: " + self.lib.handover_chain_error_string(error).decode())

    def output(self) -> torch.Tensor:
        """The last step's output."""
        return self.buffers[(self.steps - 1) % 2, :self.elems]
