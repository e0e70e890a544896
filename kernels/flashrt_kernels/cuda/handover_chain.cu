// Hand-over chain: the dependency mechanism of the streamed GEMM chain (cuda/streamed_gemm_chain.cu) alone, with
// the activation reads that come with it, as a check of its memory ordering and a measure of its cost.
// kernels/flashrt_kernels/handover_chain.py launches it; docs/performance.md has what it measures.
//
// `steps` dependent steps in one cooperative launch of one CTA per SM. Step s:
//   - waits until every CTA has finished step s - 1 (thread 0 spins with an acquire at GPU scope on one counter in
//     global memory until it holds s * CTAs, then a CTA barrier): the chain's own code (chain_handover.cuh);
//   - reads the WHOLE output of step s - 1 (`elems` fp32 values, buffer (s - 1) % 2) from L2 (ld.global.cg, up to
//     kBatch 16-byte loads per thread issued before any is used), as each CTA of the chain reads a GEMM's whole A
//     operand, and counts the values that are not what step s - 1 wrote;
//   - writes its share of step s's output (buffer s % 2: the CTA's contiguous 1 / CTAs of the elements, plain
//     stores), then a CTA barrier and one release add of 1 to the counter by thread 0.
// A step's value at element i is value(s, i) below, exact in fp32, so a read that sees a stale or half-written
// buffer is counted. Buffer s % 2 is rewritten two steps after it was written, when every CTA has finished reading
// it (the wait of step s covers every read of step s - 1), the reuse the chain's residual buffers make.
// `wait_inputs = 0` skips the waits (the reads and writes alone; mismatches are then expected and not a failure).
// `readers` < CTAs: only CTAs 0 .. readers - 1 read (the others hand over alone): what one SM's reads of a large
// block cost on the critical path, e.g. one attention head's keys and values read by the CTA that computes it.
//
// Launched in clusters of 2 or 4 CTAs, the reads go through distributed shared memory instead: after the wait, each
// CTA of a cluster loads 1 / cluster of the output of step s - 1 from L2 into its shared memory (one of two stage
// buffers, by step), a cluster barrier (release / acquire) makes the shares visible, and each CTA reads the whole
// output from the cluster's shared memory (its own share locally, the others' with ld.shared::cluster). L2 then
// serves each value once per cluster instead of once per CTA: what broadcasting a GEMM's A operand within clusters
// would save the chain. The two stage buffers take turns, so one cluster barrier per step keeps a share from being
// overwritten while another CTA still reads it (a CTA writes buffer s % 2 in step s only after every CTA of its
// cluster has arrived at the barrier of step s - 1, which each does after its reads of step s - 2's buffer).
//
// With `slices` = 8 (kSlices, no clusters), the hand-over goes by slices of the output instead of by steps: slice j
// is the j-th eighth of a step's output, with a counter of its own, and warp j of every CTA waits for slice j alone
// (lane 0 spins with an acquire until the counter holds s x the CTAs whose share touches slice j), then reads it:
// the eight warps wait and read in parallel, with no CTA barrier between the wait and the reads. A CTA ends a step
// with a release add of 1 to the counter of each slice its share touches. Before a CTA writes step s, a CTA
// barrier gathers its warps' waits, so every CTA has ended step s - 1 (and its reads of the buffer it rewrites).
// What the streamed chain's next design needs: each warp of a GEMM step covers one eighth of K, so its products
// could start on its slice of A as soon as that slice's writers are done, while the rest are still being written.

#include <cuda_runtime.h>
#include <stdint.h>

#include "chain_handover.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 16;  // 16-byte loads per thread in flight at once: 64 KB per CTA per round trip
constexpr int kMaxStageElems = 20 * 1024;  // a step's output in a cluster's stage buffers: at most 80 KB
// Two stage buffers (clusters); more than half an SM's shared memory in any case, so that no two CTAs share an SM
// and the grid spreads over the SMs as the chain's does.
constexpr int kSmemBytes = 2 * kMaxStageElems * 4;
constexpr int kSlices = kThreads / 32;      // the sliced hand-over: one slice per warp

__device__ __forceinline__ float value(unsigned step, unsigned i) {
  return static_cast<float>((step * 7919u + i) % 65521u);
}

__device__ __forceinline__ unsigned cluster_size() {
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// 16 bytes of CTA `rank`'s shared memory at the offset of `local` in this CTA's.
__device__ __forceinline__ float4 load_cluster(const float4* local, unsigned rank) {
  const uint32_t remote = cluster_addr(local, rank);
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

__device__ __forceinline__ unsigned mismatched(const float4& v, unsigned step, unsigned i) {
  return (v.x != value(step, i)) + (v.y != value(step, i + 1)) + (v.z != value(step, i + 2)) +
         (v.w != value(step, i + 3));
}

// Step `step`'s output from 16-byte value `first` on, `quads` values each fetched by load(q) (q counted from
// `first`), checked by the `kReaders` threads that call it (this one is `tid` among them; up to kBatch loads per
// thread in flight before any is used): the values that are wrong.
template <int kReaders = kThreads, typename Load>
__device__ __forceinline__ unsigned check_all(Load load, int quads, unsigned step, int tid, int first = 0) {
  unsigned bad = 0;
  for (int base = tid; base < quads; base += kReaders * kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = base + b * kReaders;
      if (q < quads) v[b] = load(q);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = base + b * kReaders;
      if (q < quads) bad += mismatched(v[b], step, 4u * static_cast<unsigned>(first + q));
    }
  }
  return bad;
}

// The output read from L2 by this CTA.
__device__ __forceinline__ unsigned read_direct(const float4* src, int quads, unsigned step, int tid) {
  return check_all([src](int q) { return __ldcg(src + q); }, quads, step, tid);
}

// The sliced hand-over's read of slice `warp` (quads / kSlices 16-byte values) by that warp's lanes, after lane 0
// has seen the slice's counter reach `target` (the warp reconverges before its loads).
__device__ __forceinline__ unsigned read_slice(const float4* src, int quads, const unsigned* counter,
                                               unsigned target, unsigned step, int warp, int lane) {
  if (lane == 0) wait_until(counter, target);
  __syncwarp();
  const int first = warp * (quads / kSlices);
  return check_all<32>([src, first](int q) { return __ldcg(src + first + q); }, quads / kSlices, step, lane, first);
}

// The CTAs whose share of `elems` touches elements [lo, hi) (shares as handover_chain_kernel splits them).
__device__ __forceinline__ unsigned writers_of(int lo, int hi, int elems, int ctas) {
  unsigned n = 0;
  for (int c = 0; c < ctas; ++c) {
    const int b = static_cast<int>(static_cast<long long>(elems) * c / ctas);
    const int e = static_cast<int>(static_cast<long long>(elems) * (c + 1) / ctas);
    n += b < e && b < hi && e > lo;
  }
  return n;
}

// The same through the cluster: this rank's `share` of the values from L2 into `buf` (a stage buffer), a cluster
// barrier, then every value from the shared memory of the rank that loaded it. Every thread of the CTA calls it.
__device__ __forceinline__ unsigned read_via_cluster(const float4* src, float4* buf, int quads, int share,
                                                     unsigned rank, unsigned step, int tid) {
  for (int base = tid; base < share; base += kThreads * kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = base + b * kThreads;
      if (q < share) v[b] = __ldcg(src + rank * share + q);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = base + b * kThreads;
      if (q < share) buf[rank * share + q] = v[b];
    }
  }
  cluster_sync();
  return check_all([buf, share](int q) { return load_cluster(buf + q, static_cast<unsigned>(q / share)); }, quads,
                   step, tid);
}

__global__ void __launch_bounds__(kThreads, 1)
    handover_chain_kernel(float* buffers, int elems, int steps, unsigned* counter, unsigned* mismatches,
                          int wait_inputs, int readers, int slices) {
  const int ctas = gridDim.x, cta = blockIdx.x, tid = threadIdx.x;
  const int quads = elems / 4;                          // elems is a multiple of 4
  const int begin = static_cast<int>(static_cast<long long>(elems) * cta / ctas);
  const int end = static_cast<int>(static_cast<long long>(elems) * (cta + 1) / ctas);
  const unsigned cluster = cluster_size(), rank = cluster_rank();
  const int share = quads / static_cast<int>(cluster);  // 16-byte values per cluster rank (quads % cluster == 0)
  extern __shared__ __align__(16) float4 stage[];       // clusters: 2 x kMaxStageElems / 4
  unsigned bad = 0;
  if (slices > 1) {  // the sliced hand-over (one counter per slice, counter[0 .. kSlices - 1])
    const int warp = tid / 32, lane = tid % 32, per = elems / kSlices;
    const unsigned writers = writers_of(warp * per, (warp + 1) * per, elems, ctas);
    for (int s = 0; s < steps; ++s) {
      if (s > 0) {
        const float4* src = reinterpret_cast<const float4*>(buffers + static_cast<size_t>((s - 1) % 2) * elems);
        bad += read_slice(src, quads, counter + warp, static_cast<unsigned>(s) * writers, static_cast<unsigned>(s - 1),
                          warp, lane);
        __syncthreads();  // every slice of step s - 1 is whole: every CTA has ended it, and its reads of step s - 2
      }
      float* dst = buffers + static_cast<size_t>(s % 2) * elems;
      for (int i = begin + tid; i < end; i += kThreads) {
        dst[i] = value(static_cast<unsigned>(s), static_cast<unsigned>(i));
      }
      __syncthreads();  // this CTA's share of step s is written
      if (tid == 0 && begin < end) {
        for (int j = begin / per; j <= (end - 1) / per; ++j) add_release(counter + j, 1u);
      }
    }
    if (bad) atomicAdd(mismatches, bad);
    return;
  }
  for (int s = 0; s < steps; ++s) {
    if (s > 0 && wait_inputs) {  // every CTA waits, reader or not: buffer s % 2 is free once all of step s - 1 is
      if (tid == 0) wait_for_step(counter, s, ctas);
      __syncthreads();
    }
    if (s > 0 && (cluster > 1 || cta < readers)) {
      const float4* src = reinterpret_cast<const float4*>(buffers + static_cast<size_t>((s - 1) % 2) * elems);
      const unsigned step = static_cast<unsigned>(s - 1);
      float4* buf = stage + (s % 2) * (kMaxStageElems / 4);
      bad += cluster > 1 ? read_via_cluster(src, buf, quads, share, rank, step, tid)
                         : read_direct(src, quads, step, tid);
    }
    float* dst = buffers + static_cast<size_t>(s % 2) * elems;
    for (int i = begin + tid; i < end; i += kThreads) {
      dst[i] = value(static_cast<unsigned>(s), static_cast<unsigned>(i));
    }
    __syncthreads();  // this CTA's share of step s is written (and its reads of step s - 1 are done)
    if (tid == 0) add_release(counter, 1u);
  }
  if (cluster > 1) cluster_sync();  // no CTA leaves while another of its cluster may still read its shared memory
  if (bad) atomicAdd(mismatches, bad);
}

}  // namespace

extern "C" {

int handover_chain_threads() { return kThreads; }

// Values of a step's output the clustered form can stage (its two shared-memory buffers).
int handover_chain_max_stage_elems() { return kMaxStageElems; }

// CTAs that can be resident at once on the current device in clusters of `cluster` (one CTA per SM: the largest
// cooperative grid), or -1 on an error.
int handover_chain_max_ctas(int cluster) {
  return resident_ctas(handover_chain_kernel, kThreads, kSmemBytes, cluster);
}

// Slices of the sliced hand-over (`slices` of handover_chain_launch), one per warp.
int handover_chain_slices() { return kSlices; }

// Zero the counter(s), then launch `steps` steps over two buffers of `elems` fp32 values each (`buffers`: 2 x
// elems) on `stream` as `ctas` CTAs in clusters of `cluster` (1: no clusters), of which the first `readers` read
// each step's output (clusters: all), mismatches added into *mismatches. `slices`: 1, or kSlices for the sliced
// hand-over (no clusters, every CTA reading, the waits on; `counter` then holds kSlices counters and elems is a
// multiple of 4 kSlices). Returns a cudaError_t (0: success).
int handover_chain_launch(void* buffers, int elems, int steps, void* counter, void* mismatches, int wait_inputs,
                          int ctas, int cluster, int readers, int slices, void* stream) {
  unsigned* count = static_cast<unsigned*>(counter);
  if (slices != 1 && (slices != kSlices || cluster != 1 || readers != ctas || !wait_inputs ||
                      elems % (4 * kSlices))) {
    return cudaErrorInvalidValue;
  }
  if (slices > 1) {
    const cudaError_t e = cudaMemsetAsync(count, 0, kSlices * sizeof(unsigned), static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) return e;
  }
  return launch_chain(handover_chain_kernel, ctas, kThreads, kSmemBytes, cluster, count,
                      static_cast<cudaStream_t>(stream), static_cast<float*>(buffers), elems, steps, count,
                      static_cast<unsigned*>(mismatches), wait_inputs, readers, slices);
}

const char* handover_chain_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
