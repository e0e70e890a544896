// Streamed GEMM chain: a sequence of dependent small-row GEMMs (the action expert's four per layer, every layer of
// every denoising step) as ONE persistent kernel whose weights stream into shared memory ahead of their
// dependencies. kernels/flashrt_kernels/streamed_gemm_chain.py packs the weights, builds the chain and holds the
// PyTorch reference; docs/performance.md has what it measures on an H200.
//
//     for g in 0 .. G-1:   Y_g = A_g(inputs) @ W_g^T        A_g: (rows <= 16, K_g), W_g: (N_g, K_g) bf16
//
// A GEMM's A operand is read from global memory as a bf16 matrix (`kInBf16`) or as an fp32 matrix whose rows are
// scaled by rsqrt(mean(row^2) + 1e-6) and rounded to bf16 (`kInRmsNorm`, K = 1024). Its fp32 result is written as
// bf16 (`kOutBf16`), added into an fp32 matrix (`kOutAddF32`, the residual stream), or, for a gate/up GEMM whose
// weight rows interleave 4 gate rows and their 4 up rows per unit (interleave_gate_up()), written as
// bf16(gelu_tanh(bf16(gate)) * bf16(up)) (`kOutGeglu`: the MLP's activation, computed once by the column's owner).
// `kOutGegluDown` pairs the MLP's two GEMMs in one step: the owner of gate/up unit u keeps its 4 GeGLU columns in
// shared memory, multiplies them by the 4 matching columns of W_down (desc.w2: pack_down_pairs(), 8 KiB per unit,
// two units per ring slot) on mma.sync m16n8k8 and adds the (rows, N2) partial product into desc.out with fp32
// vector atomics. The activation never goes to global memory and the down GEMM needs no hand-over of its own; the
// atomics land on a second residual buffer (the O GEMM's `out2` copy of h), since the GEMM's own A is h itself.
//
// Work: GEMM g's output columns come in units of 8 (one mma n-tile); a unit's weight is (8, K_g), stored by
// pack_weight() in chunks of 8 x 1024 (16 KiB) laid out in mma fragment order, so a warp reads its B fragments
// with one conflict-free 16-byte shared load per lane per 32 of K. Unit u of GEMM g belongs to CTA
// (u + rot_g) % CTAs, rot_g being the units of GEMMs 0 .. g-1 modulo CTAs, so the bytes spread evenly over a layer.
// Each CTA has one producer warp and 8 consumer warps:
//   - the producer walks the CTA's chunks of the whole chain in order (per GEMM: groups of up to 8 units, each
//     group chunk by chunk, a chunk unit by unit; for kOutGegluDown then the group's W_down blocks, two units per
//     slot) and copies each into a ring of kStages
//     16-KiB slots with the bulk copy engine (cp.async.bulk, completion counted on the slot's `full` mbarrier). It
//     never waits for activations, only for a free slot (`empty` mbarrier), so the weights of the next GEMMs stream
//     while the consumers wait for this one's inputs;
//   - the consumers wait until every CTA has finished GEMM g-1 (one counter in global memory: each CTA adds 1 per
//     GEMM with a release at GPU scope after a CTA barrier; a GEMM's consumers spin with an acquire until it holds
//     g * CTAs: chain_handover.cuh, which cuda/handover_chain.cu checks and times alone), load their A fragments
//     (warp w covers K offsets [128 w, 128 w + 128) of each 1024-chunk; every load issued before any is used; a
//     GEMM of one chunk loads them once, a longer one loads the next chunk's while the current chunk's products
//     run), run mma.sync m16n8k16 (bf16, fp32 accumulate) on each slot as it fills and free it, and sum the 8
//     warps' partial tiles of the group through shared memory.
// Built with -DSGC_A_WINDOW, A goes through shared memory instead: after the hand-over one thread copies the GEMM's
// rows of A (a window of one fp32 chunk for kInRmsNorm, two bf16 chunks for kInBf16; a longer K loads its windows
// in turn) into a 66 KB buffer with the bulk copy engine, one copy per row, completion on the `a_full` mbarrier, and
// each warp reads its fragments from there (rows padded so the reads are conflict-free). The copy engine needs no
// registers for the bytes in flight, and the consumers hold one set of fragments (no prefetch copy); the ring
// shrinks to 8 slots beside the buffer. With -DSGC_CLUSTER=2 or 4 as well, the CTAs run in clusters of that size
// and each copies the rows r with r % size == its rank into every CTA of its cluster (multicast), so L2 serves each
// row once per cluster instead of once per CTA.
// With -DSGC_DOWN_CLUSTER_SUM as well (clusters, paired MLP), the CTAs of a cluster add up their down partial
// products before the atomics: warp w's 128 columns of N2 belong to cluster rank w % size; the warps of the other
// ranks store their partial tiles into the owner's A window (free once the MLP step's A fragments are read) over
// distributed shared memory, and the owner adds them to its own and does the atomics alone, so the residual copy
// takes CTAs / size adds per element instead of CTAs. Two mbarriers per CTA order the exchange: `sum_free` (in the
// sender: every partner has read its window) and `sum_full` (in the owner: every partner's tiles stored).
// The launch is cooperative (every CTA resident, one per SM), so the spin cannot deadlock. The counter is zeroed by
// a memset before each launch (inside a captured graph too).
// Measurement switches (the result is then wrong; never a product path): `wait_inputs = 0` skips the wait on the
// counter (the weight stream and the compute alone: the design's ceiling); built with -DSGC_LEAVE_OUT_COPY the
// producer signals each slot without copying into it (no weight stream), with -DSGC_LEAVE_OUT_COMPUTE the consumers
// skip the A loads and the products (the stream, the hand-overs and the sums alone), with -DSGC_LEAVE_OUT_PRODUCTS
// they load A as the kernel does but skip the products (what the A loads cost: each CTA reads every GEMM's whole A,
// ~200 KB per layer at 10 rows), with -DSGC_LEAVE_OUT_CONSUMERS the consumers only free each slot as it fills (the
// weight stream alone), with -DSGC_LEAVE_OUT_ATOMICS the paired MLP's partial products are not added into the
// residual copy (what the contended atomics cost: every CTA adds into the same rows x 1024), with
// -DSGC_LEAVE_OUT_A_COPY (the A window) the window is not copied in and its fragments are read from what the
// buffer holds (what the copy costs beside reading the fragments and the norm). -DSGC_STAGES=n sets the
// ring's slots, -DSGC_MAXNREG=n caps the registers per thread instead of the launch bounds (which hold the kernel's
// 288 threads to 168, the most with which a CTA still fits an SM).
// -DSGC_TRACE records, per CTA and per step of a window of 64 steps, the SM clock and the global timer at the
// step's start, its inputs ready, its A ready, its first and last product, its sums stored and its release, and in
// a paired MLP step its last down product before the atomics (streamed_gemm_chain.py reads it back).

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "chain_handover.cuh"

namespace {

constexpr int kChunkK = 1024;                          // reduction length of one weight chunk
constexpr int kTileN = 8;                              // output columns of one unit (one mma n-tile)
constexpr int kChunkBytes = kTileN * kChunkK * 2;      // 16 KiB of bf16
constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 32;        // + the producer warp
#ifndef SGC_STAGES
#ifdef SGC_A_WINDOW
#define SGC_STAGES 8                                   // 128 KiB beside the A window
#else
#define SGC_STAGES 12                                  // 192 KiB
#endif
#endif
constexpr int kStages = SGC_STAGES;                    // ring slots
constexpr int kWarpK = kChunkK / kConsumerWarps;       // 128: a consumer warp's share of a chunk
constexpr int kSteps = kWarpK / 16;                    // 8 mma k-steps per warp per chunk
constexpr int kGroupUnits = 8;                         // units whose partial tiles are summed at once
constexpr int kRedFloats = kGroupUnits * kConsumerWarps * 32 * 4;  // their partial m16n8 tiles, one per warp
constexpr int kSumsPerThread = kGroupUnits * 128 / kConsumerThreads;  // a group's m16n8 sums per consumer thread
constexpr int kNormRedFloats = kConsumerWarps * 16;    // per-warp sums of squares of the 16 rows
constexpr float kRmsEps = 1e-6f;
constexpr int kActCols = kGroupUnits * kTileN / 2;    // a group's GeGLU columns (kOutGegluDown): 32
constexpr int kActWords = 16 * kActCols / 2;           // ... as bf16 pairs for 16 rows
constexpr int kDownTiles = 1024 / kTileN / kConsumerWarps;  // kOutGegluDown: a warp's n-tiles of N2 = 1024: 16
constexpr int kDownUnitBytes = kChunkBytes / 2;        // one unit's 4 columns of W_down (1024 x 4 bf16): 8 KiB
#ifndef SGC_CLUSTER
#define SGC_CLUSTER 1
#endif
#if defined(SGC_LEAVE_OUT_A_COPY) && !defined(SGC_A_WINDOW)
#error "SGC_LEAVE_OUT_A_COPY leaves out the A window's copy: it needs SGC_A_WINDOW"
#endif
#if SGC_CLUSTER > 1 && !defined(SGC_A_WINDOW)
#error "SGC_CLUSTER shares the A window's copies: it needs SGC_A_WINDOW"
#endif
constexpr int kCluster = SGC_CLUSTER;                  // CTAs that share each A window's reads from L2
#if defined(SGC_DOWN_CLUSTER_SUM) && SGC_CLUSTER == 1
#error "SGC_DOWN_CLUSTER_SUM adds up the partial products of a cluster's CTAs: it needs SGC_CLUSTER"
#endif
#ifdef SGC_DOWN_CLUSTER_SUM
constexpr int kSumBars = 2;                            // sum_free, sum_full
// the receive buffer in the A window: per partner and per owned warp, one warp's 16 partial m16n8 tiles
static_assert((kCluster - 1) * (kConsumerWarps / kCluster) * kDownTiles * 32 * 16 <= 16 * (kChunkK * 4 + 32),
              "the partners' partial tiles fit the A window");
#else
constexpr int kSumBars = 0;
#endif
#ifdef SGC_A_WINDOW
constexpr int kMaxRows = 16;                           // one m16 tile
// A in shared memory: up to kMaxRows rows of one fp32 chunk (kInRmsNorm) or of two bf16 chunks (kInBf16), each row
// padded so that a warp's fragment loads hit 32 distinct banks (fp32: float2 per lane, 16 lanes per phase)
constexpr int kAStrideF32 = kChunkK * 4 + 32;
constexpr int kAStrideBf16 = 2 * kChunkK * 2 + 16;
constexpr int kABytes = kMaxRows * kAStrideF32, kABars = 1;  // the window and its `a_full` barrier
#else
constexpr int kABytes = 0, kABars = 0;
#endif
constexpr int kSmemBytes = kStages * kChunkBytes + kABytes + (kRedFloats + kNormRedFloats + kActWords) * 4 +
                           (2 * kStages + kABars + kSumBars) * 8;

#ifdef SGC_TRACE
constexpr int kTraceGemms = 64, kTraceEvents = 8, kTraceCtas = 160;
__device__ unsigned long long sgc_trace[kTraceCtas * kTraceGemms * kTraceEvents * 2];
__device__ int sgc_trace_from;
__device__ __forceinline__ void trace_mark(int g, int e) {
  const int t = g - sgc_trace_from;
  if (threadIdx.x == 0 && t >= 0 && t < kTraceGemms && blockIdx.x < kTraceCtas) {
    unsigned long long gt;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
    const long long c = clock64();
    unsigned long long* p = sgc_trace + ((blockIdx.x * kTraceGemms + t) * kTraceEvents + e) * 2;
    p[0] = static_cast<unsigned long long>(c);
    p[1] = gt;
  }
}
#define SGC_MARK(g, e) trace_mark(g, e)
#else
#define SGC_MARK(g, e)
#endif

enum InKind { kInBf16 = 0, kInRmsNorm = 1 };
enum OutKind { kOutBf16 = 0, kOutAddF32 = 1, kOutGeglu = 2, kOutGegluDown = 3 };

// One GEMM of the chain: ten int64 fields, in the order streamed_gemm_chain.py writes them.
struct GemmDesc {
  long long w;            // packed weight: (N / 8) units x (K / 1024) chunks x 16 KiB
  long long in;           // A's source matrix (bf16 or fp32, by in_kind)
  long long out;          // the output matrix (bf16 or fp32, by out_kind)
  long long n, k;         // N (a multiple of 8), K (a multiple of 1024)
  long long kinds;        // in_kind | out_kind << 8
  long long in_stride;    // elements between two rows of the source
  long long out_stride;   // elements between two rows of the output (kOutGegluDown: of out, N2 = 1024 columns)
  long long w2;           // kOutGegluDown: W_down (1024 rows) packed by pack_down_pairs(), 8 KiB per gate/up unit
  long long out2;         // kOutAddF32: a second fp32 matrix that receives the same sums (0: none)
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Spin until the mbarrier's phase of `parity` completes; kClusterAcquire: with an acquire at cluster scope, so
// what the arrivals of other CTAs released (mbar_arrive_cluster) is visible after it.
template <bool kClusterAcquire = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#define SGC_TRY_WAIT(SEM)                                                                                   \
  "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity" SEM ".shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
  uint32_t done = 0;
  while (!done) {
    if constexpr (kClusterAcquire) {
      asm volatile(SGC_TRY_WAIT(".acquire.cluster") : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    } else {
      asm volatile(SGC_TRY_WAIT("") : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    }
  }
#undef SGC_TRY_WAIT
}

// `bytes` (a multiple of 16) from global memory into a ring slot on the bulk copy engine; completion counted on
// `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// The consumer warps' own barrier (the producer never joins it).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}

#ifdef SGC_DOWN_CLUSTER_SUM
// Arrive on an mbarrier of a cluster CTA (cluster_addr), releasing this thread's writes before it at cluster scope.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}

// 16 bytes into the shared memory of a cluster CTA (cluster_addr).
__device__ __forceinline__ void st_cluster(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}
#endif

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// kOutGegluDown's products: m16n8k8, A = two units' 4 GeGLU columns each, B = their 8 columns of W_down.
__device__ __forceinline__ void mma_bf16_k8(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// The RMS scales of rows `group` and `group + 8` from this lane's sums of squares over its K offsets: summed over
// the quad, then over the 8 warps (which cover a row of length k together) through `norm_red` (kConsumerWarps x 16
// floats) and one consumer barrier; every consumer warp must call it.
__device__ __forceinline__ void rms_scales(float ss0, float ss1, float k, int warp, int group, int quad,
                                           float* norm_red, float& s0, float& s1) {
  ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
  ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
  ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
  ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
  if (quad == 0) {
    norm_red[warp * 16 + group] = ss0;
    norm_red[warp * 16 + group + 8] = ss1;
  }
  consumer_sync();
  float t0 = 0.f, t1 = 0.f;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) {
    t0 += norm_red[w * 16 + group];
    t1 += norm_red[w * 16 + group + 8];
  }
  s0 = rsqrtf(t0 / k + kRmsEps);
  s1 = rsqrtf(t1 / k + kRmsEps);
}

#ifndef SGC_A_WINDOW
// This warp's A fragments of K offsets [k0, k0 + 128): kSteps m16k16 tiles; a lane holds rows `group` (registers
// 0 and 2) and `group + 8` (1 and 3) at K offsets 2 quad (0, 1) and 2 quad + 8 (2, 3) of each 16-wide step. Every
// load is issued before any value is used, so a warp waits for one round trip to L2, not one per load; for kInBf16
// nothing here uses them, so the loads of the next chunk are in flight while the products of this one run. Rows
// past `rows` load the last row: their products land in accumulator rows that are never stored. Loads go to L2
// (.cg): the activations are written by other CTAs during this launch, so a line in this SM's L1 could be stale.
// kInRmsNorm normalizes each row over its whole length (K = 1024, covered by the 8 warps together), through
// `norm_red` (kConsumerWarps x 16 floats) and one consumer barrier; every consumer warp must call it.
__device__ __forceinline__ void load_a(uint32_t (&a)[kSteps][4], const GemmDesc& d, int in_kind, int rows, int k0,
                                       int warp, int group, int quad, float* norm_red) {
  const int r0 = min(group, rows - 1), r1 = min(group + 8, rows - 1);
  if (in_kind == kInRmsNorm) {
    const float* p0 = reinterpret_cast<const float*>(d.in) + r0 * d.in_stride + k0 + 2 * quad;
    const float* p1 = reinterpret_cast<const float*>(d.in) + r1 * d.in_stride + k0 + 2 * quad;
    float2 x[kSteps][4];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      x[s][0] = __ldcg(reinterpret_cast<const float2*>(p0 + 16 * s));
      x[s][1] = __ldcg(reinterpret_cast<const float2*>(p1 + 16 * s));
      x[s][2] = __ldcg(reinterpret_cast<const float2*>(p0 + 16 * s + 8));
      x[s][3] = __ldcg(reinterpret_cast<const float2*>(p1 + 16 * s + 8));
    }
    float ss0 = 0.f, ss1 = 0.f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      ss0 += x[s][0].x * x[s][0].x + x[s][0].y * x[s][0].y + x[s][2].x * x[s][2].x + x[s][2].y * x[s][2].y;
      ss1 += x[s][1].x * x[s][1].x + x[s][1].y * x[s][1].y + x[s][3].x * x[s][3].x + x[s][3].y * x[s][3].y;
    }
    float s0, s1;
    rms_scales(ss0, ss1, static_cast<float>(d.k), warp, group, quad, norm_red, s0, s1);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      a[s][0] = pack_bf16(x[s][0].x * s0, x[s][0].y * s0);
      a[s][1] = pack_bf16(x[s][1].x * s1, x[s][1].y * s1);
      a[s][2] = pack_bf16(x[s][2].x * s0, x[s][2].y * s0);
      a[s][3] = pack_bf16(x[s][3].x * s1, x[s][3].y * s1);
    }
    return;
  }
  const unsigned* p0 = reinterpret_cast<const unsigned*>(reinterpret_cast<const __nv_bfloat16*>(d.in) +
                                                         r0 * d.in_stride + k0 + 2 * quad);
  const unsigned* p1 = reinterpret_cast<const unsigned*>(reinterpret_cast<const __nv_bfloat16*>(d.in) +
                                                         r1 * d.in_stride + k0 + 2 * quad);
  // in 32-bit words: +8 words is +16 bf16 (the next step), +4 words is +8 bf16
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    a[s][0] = __ldcg(p0 + 8 * s);
    a[s][1] = __ldcg(p1 + 8 * s);
    a[s][2] = __ldcg(p0 + 8 * s + 4);
    a[s][3] = __ldcg(p1 + 8 * s + 4);
  }
}

#else  // SGC_A_WINDOW

// The A window of a GEMM: its rows' K offsets [lo * 1024, lo * 1024 + 1024) (kInRmsNorm, fp32) or
// [lo * 1024, lo * 1024 + 2048) (kInBf16) copied into `a_s` by the bulk copy engine, one copy per row, completion on
// `bar`. Called by one thread after the hand-over's acquire: the proxy fence orders the other CTAs' writes, which
// that acquire made visible to this thread, before the copy engine's reads (the async proxy). The copy engine reads
// L2, so no line of this SM's L1 can be stale.
// In clusters (kCluster > 1) each CTA copies the rows r with r % kCluster == its rank into the same place of every
// CTA of its cluster (multicast), so L2 serves each row once per cluster; every CTA of a cluster loads every GEMM's
// window, since each expects the whole window's bytes.
__device__ __forceinline__ void copy_a_window(uint8_t* a_s, const GemmDesc& d, int in_kind, int rows, int lo,
                                              int chunks, uint64_t* bar) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
#ifdef SGC_DOWN_CLUSTER_SUM
  // the partners' partial tiles were stored into the windows of the cluster by generic stores
  asm volatile("fence.proxy.async.shared::cluster;" ::: "memory");
#else
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
  const bool f32 = in_kind == kInRmsNorm;
  const int elem = f32 ? 4 : 2, stride = f32 ? kAStrideF32 : kAStrideBf16;
  const int bytes = (f32 ? 1 : min(2, chunks - lo)) * kChunkK * elem;
  mbar_arrive_expect_tx(bar, static_cast<uint32_t>(rows * bytes));
  const uint8_t* src = reinterpret_cast<const uint8_t*>(d.in) + static_cast<size_t>(lo) * kChunkK * elem;
  if (kCluster == 1) {
    for (int r = 0; r < rows; ++r) {
      bulk_copy(a_s + r * stride, src + static_cast<size_t>(r) * d.in_stride * elem, bytes, bar);
    }
    return;
  }
  const unsigned rank = cluster_rank();
  const uint16_t mask = static_cast<uint16_t>((1u << kCluster) - 1u);
  for (int r = static_cast<int>(rank); r < rows; r += kCluster) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;" ::"r"(smem_addr(a_s + r * stride)),
        "l"(src + static_cast<size_t>(r) * d.in_stride * elem), "r"(bytes), "r"(smem_addr(bar)), "h"(mask)
        : "memory");
  }
}

// This warp's A fragments of window offsets [k0, k0 + 128) from `a_s`: kSteps m16k16 tiles; a lane holds rows
// `group` (registers 0 and 2) and `group + 8` (1 and 3) at K offsets 2 quad (0, 1) and 2 quad + 8 (2, 3) of each
// 16-wide step. Rows past `rows` read the last row: their products land in accumulator rows that are never stored.
__device__ __forceinline__ void a_fragments_bf16(uint32_t (&a)[kSteps][4], const uint8_t* a_s, int rows, int k0,
                                                 int group, int quad) {
  const int r0 = min(group, rows - 1), r1 = min(group + 8, rows - 1);
  const uint32_t* p0 = reinterpret_cast<const uint32_t*>(a_s + r0 * kAStrideBf16) + k0 / 2 + quad;
  const uint32_t* p1 = reinterpret_cast<const uint32_t*>(a_s + r1 * kAStrideBf16) + k0 / 2 + quad;
  // in 32-bit words: +8 words is +16 bf16 (the next step), +4 words is +8 bf16
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    a[s][0] = p0[8 * s];
    a[s][1] = p1[8 * s];
    a[s][2] = p0[8 * s + 4];
    a[s][3] = p1[8 * s + 4];
  }
}

// The same fragments of rms(h) (kInRmsNorm, K = 1024: the 8 warps cover a row together): each row's sum of squares
// over the warps through `norm_red` (kConsumerWarps x 16 floats) and one consumer barrier (every consumer warp must
// call it), then a second pass over `a_s` scales and rounds to bf16.
__device__ __forceinline__ void a_fragments_rms(uint32_t (&a)[kSteps][4], const uint8_t* a_s, int rows, int k,
                                                int warp, int group, int quad, float* norm_red) {
  const int r0 = min(group, rows - 1), r1 = min(group + 8, rows - 1);
  const float* p0 = reinterpret_cast<const float*>(a_s + r0 * kAStrideF32) + warp * kWarpK + 2 * quad;
  const float* p1 = reinterpret_cast<const float*>(a_s + r1 * kAStrideF32) + warp * kWarpK + 2 * quad;
  float ss0 = 0.f, ss1 = 0.f;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 x0 = *reinterpret_cast<const float2*>(p0 + 16 * s + 8 * h);
      const float2 x1 = *reinterpret_cast<const float2*>(p1 + 16 * s + 8 * h);
      ss0 += x0.x * x0.x + x0.y * x0.y;
      ss1 += x1.x * x1.x + x1.y * x1.y;
    }
  }
  float s0, s1;
  rms_scales(ss0, ss1, static_cast<float>(k), warp, group, quad, norm_red, s0, s1);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 x0 = *reinterpret_cast<const float2*>(p0 + 16 * s + 8 * h);
      const float2 x1 = *reinterpret_cast<const float2*>(p1 + 16 * s + 8 * h);
      a[s][2 * h] = pack_bf16(x0.x * s0, x0.y * s0);
      a[s][2 * h + 1] = pack_bf16(x1.x * s1, x1.y * s1);
    }
  }
}
#endif  // SGC_A_WINDOW

__device__ __forceinline__ int first_unit(int cta, int rot, int ctas) { return (cta - rot + ctas) % ctas; }

// How many of a GEMM's `units` the CTA whose first unit is `first` owns (first, first + ctas, ...): the producer
// and the consumers walk the same units by it.
__device__ __forceinline__ int units_owned(int first, int units, int ctas) {
  return first < units ? (units - first + ctas - 1) / ctas : 0;
}

#ifdef SGC_MAXNREG
#define SGC_BOUNDS __maxnreg__(SGC_MAXNREG)
#else
#define SGC_BOUNDS __launch_bounds__(kThreads, 1)
#endif
__global__ void SGC_BOUNDS
    streamed_gemm_chain_kernel(const GemmDesc* __restrict__ descs, int num_gemms, int rows, unsigned* counter,
                               int wait_inputs) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  uint8_t* a_s = smem + kStages * kChunkBytes;  // the A window (SGC_A_WINDOW: copy_a_window)
  float* red = reinterpret_cast<float*>(a_s + kABytes);
  float* norm_red = red + kRedFloats;
  uint32_t* act_s = reinterpret_cast<uint32_t*>(norm_red + kNormRedFloats);  // kOutGegluDown: 16 x 32 bf16
  uint64_t* full = reinterpret_cast<uint64_t*>(act_s + kActWords);
  uint64_t* empty = full + kStages;
#ifdef SGC_A_WINDOW
  uint64_t* a_full = empty + kStages;  // the A window's copies landed
#endif
#ifdef SGC_DOWN_CLUSTER_SUM
  uint64_t* sum_free = a_full + 1;     // every partner's A window free for this CTA's partial tiles
  uint64_t* sum_full = sum_free + 1;   // every partner's partial tiles for this CTA's columns stored
#endif

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ctas = gridDim.x, cta = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
#ifdef SGC_A_WINDOW
    mbar_init(a_full, 1);
#endif
#ifdef SGC_DOWN_CLUSTER_SUM
    mbar_init(sum_free, kCluster - 1);                                       // each partner's thread 0
    mbar_init(sum_full, (kCluster - 1) * (kConsumerWarps / kCluster) * 32);  // each lane of its sending warps
#endif
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (kCluster > 1) {  // the cluster's barriers are initialized before any CTA copies into another
    cluster_sync();
  } else {
    __syncthreads();
  }

  if (warp == kConsumerWarps) {  // the producer: one lane streams the CTA's chunks of the whole chain
    if (lane == 0) {
      int stage = 0, rot = 0;
      uint32_t phase = 0;
      // the next ring slot, once free: 16 KiB from `src`, or (second_half given) 8 KiB from each of the two
      auto fill_slot = [&](const uint8_t* src, const uint8_t* second_half) {
        mbar_wait(&empty[stage], phase ^ 1u);
#ifdef SGC_LEAVE_OUT_COPY
        mbar_arrive(&full[stage]);
#else
        uint8_t* slot = ring + stage * kChunkBytes;
        mbar_arrive_expect_tx(&full[stage], kChunkBytes);
        if (second_half == nullptr) {
          bulk_copy(slot, src, kChunkBytes, &full[stage]);
        } else {
          bulk_copy(slot, src, kDownUnitBytes, &full[stage]);
          bulk_copy(slot + kDownUnitBytes, second_half, kDownUnitBytes, &full[stage]);
        }
#endif
        if (++stage == kStages) { stage = 0; phase ^= 1u; }
      };
      for (int g = 0; g < num_gemms; ++g) {
        const GemmDesc d = descs[g];
        const int units = static_cast<int>(d.n / kTileN), chunks = static_cast<int>(d.k / kChunkK);
        const uint8_t* w = reinterpret_cast<const uint8_t*>(d.w);
        const int first = first_unit(cta, rot, ctas);
        const int mine = units_owned(first, units, ctas);
        for (int g0 = 0; g0 < mine; g0 += kGroupUnits) {
          const int group_units = min(kGroupUnits, mine - g0);
          for (int c = 0; c < chunks; ++c)
          for (int j = 0; j < group_units; ++j) {
            const int u = first + (g0 + j) * ctas;
            fill_slot(w + (static_cast<size_t>(u) * chunks + c) * kChunkBytes, nullptr);
          }
          if ((d.kinds >> 8 & 0xff) == kOutGegluDown) {  // then the group's W_down columns, two units per slot
            const uint8_t* w2 = reinterpret_cast<const uint8_t*>(d.w2);
            for (int j = 0; j < group_units; j += 2) {
              const int ua = first + (g0 + j) * ctas;
              const int ub = j + 1 < group_units ? ua + ctas : ua;  // an odd last unit: its own columns twice,
              fill_slot(w2 + static_cast<size_t>(ua) * kDownUnitBytes,  // the second copy multiplied by zeros
                        w2 + static_cast<size_t>(ub) * kDownUnitBytes);
            }
          }
        }
        rot = (rot + units) % ctas;
      }
    }
    if (kCluster > 1) cluster_sync();  // the end barrier below, which the consumers reach
    return;
  }

  const int group = lane >> 2, quad = lane & 3;
  int stage = 0, rot = 0;
  uint32_t phase = 0;
#ifdef SGC_A_WINDOW
  uint32_t a_phase = 0;
#endif
#ifdef SGC_DOWN_CLUSTER_SUM
  const unsigned rank = cluster_rank();
  uint32_t sum_phase = 0;
#endif
#ifdef SGC_LEAVE_OUT_CONSUMERS
  for (int g = 0; g < num_gemms; ++g) {
    const GemmDesc d = descs[g];
    const int units = static_cast<int>(d.n / kTileN), chunks = static_cast<int>(d.k / kChunkK);
    const int first = first_unit(cta, rot, ctas);
    const int mine = units_owned(first, units, ctas);
    int slots = mine * chunks;
    if ((d.kinds >> 8 & 0xff) == kOutGegluDown) {
      for (int g0 = 0; g0 < mine; g0 += kGroupUnits) slots += (min(kGroupUnits, mine - g0) + 1) / 2;
    }
    for (int s = 0; s < slots; ++s) {
      mbar_wait(&full[stage], phase);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[stage]);
      if (++stage == kStages) { stage = 0; phase ^= 1u; }
    }
    rot = (rot + units) % ctas;
    if (threadIdx.x == 0) add_release(counter, 1u);  // counted as the kernel counts its steps, never waited for
  }
#else
  for (int g = 0; g < num_gemms; ++g) {
    SGC_MARK(g, 0);
    const GemmDesc d = descs[g];
    const int units = static_cast<int>(d.n / kTileN), chunks = static_cast<int>(d.k / kChunkK);
    const int in_kind = static_cast<int>(d.kinds & 0xff), out_kind = static_cast<int>((d.kinds >> 8) & 0xff);
    if (g > 0 && wait_inputs) {  // every CTA has written its part of GEMM g-1
      if (threadIdx.x == 0) wait_for_step(counter, g, ctas);
      consumer_sync();
    }
    SGC_MARK(g, 1);
    // in clusters, a second window of one GEMM could land in a partner still reading the first
    if (kCluster > 1 && in_kind == kInBf16 && chunks > 2) __trap();
    const int first = first_unit(cta, rot, ctas);
    const int mine = units_owned(first, units, ctas);
    // the groups this CTA runs: its units', and with SGC_DOWN_CLUSTER_SUM in a paired MLP step as many as the
    // cluster CTA with the most units (each group's partial products are exchanged by all of the cluster's CTAs;
    // a group without units exchanges zeros)
    int groups_to = mine;
#ifdef SGC_DOWN_CLUSTER_SUM
    if (out_kind == kOutGegluDown) {
      for (int r = 0; r < kCluster; ++r) {
        groups_to = max(groups_to, units_owned(first_unit(cta - static_cast<int>(rank) + r, rot, ctas), units, ctas));
      }
    }
#endif
#ifndef SGC_A_WINDOW
    // A of chunk 0, loaded once per GEMM: a GEMM of one chunk (QKV and gate/up, K = 1024, the RMS-normed ones)
    // keeps it for all its groups; a longer one (O, down) prefetches each next chunk's A into `a_next` while the
    // products of the current chunk run, and the next group's chunk 0 during its last chunk
    uint32_t a[kSteps][4], a_next[kSteps][4];
#ifndef SGC_LEAVE_OUT_COMPUTE
    if (mine > 0) load_a(a, d, in_kind, rows, warp * kWarpK, warp, group, quad, norm_red);
#endif
#else
    // A through shared memory: the window holding chunk c copied in (after every warp is done with the window
    // before), then each warp's fragments read from it. kInRmsNorm (K = 1024) loads and normalizes once per GEMM,
    // for all its groups; kInBf16 reads each chunk's fragments before its products, from a window of two chunks.
    uint32_t a[kSteps][4];
    int a_lo = -1;
    auto a_window = [&](int c) {
      const int lo = in_kind == kInRmsNorm ? 0 : c - c % 2;
      if (lo == a_lo) return;
      if (a_lo >= 0) consumer_sync();
#ifndef SGC_LEAVE_OUT_A_COPY
      if (threadIdx.x == 0) copy_a_window(a_s, d, in_kind, rows, lo, chunks, a_full);
      mbar_wait(a_full, a_phase);
      a_phase ^= 1u;
#endif
      a_lo = lo;
    };
#ifndef SGC_LEAVE_OUT_COMPUTE
    if (groups_to > 0 && in_kind == kInRmsNorm) {
      a_window(0);
      a_fragments_rms(a, a_s, rows, static_cast<int>(d.k), warp, group, quad, norm_red);
    }
#endif
#endif  // SGC_A_WINDOW
    SGC_MARK(g, 2);
    for (int g0 = 0; g0 < groups_to; g0 += kGroupUnits) {  // up to kGroupUnits units summed across warps at once
      const int group_units = max(0, min(kGroupUnits, mine - g0));
      // kOutAddF32: the values the sums are added to, read now so that the read is off the path after the sums
      // (GEMM g's outputs are written by their owner alone, and their last writer finished before GEMM g began)
      float old[kSumsPerThread];
#pragma unroll
      for (int m = 0; m < kSumsPerThread; ++m) {
        const int v = threadIdx.x + m * kConsumerThreads;
        const int j = v >> 7, l = (v >> 2) & 31, i = v & 3;
        const int row = (l >> 2) + (i >= 2 ? 8 : 0);
        old[m] = 0.f;
        if (out_kind == kOutAddF32 && j < group_units && row < rows) {
          const int col = (first + (g0 + j) * ctas) * kTileN + 2 * (l & 3) + (i & 1);
          old[m] = __ldcg(reinterpret_cast<const float*>(d.out) + row * d.out_stride + col);
        }
      }
      float acc[kGroupUnits][4];
#pragma unroll
      for (int j = 0; j < kGroupUnits; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
      }
      for (int c = 0; c < chunks; ++c) {
#ifndef SGC_A_WINDOW
        const bool prefetch = chunks > 1 && (c + 1 < chunks || g0 + kGroupUnits < mine);
#ifndef SGC_LEAVE_OUT_COMPUTE
        if (prefetch) {
          load_a(a_next, d, in_kind, rows, (c + 1 < chunks ? c + 1 : 0) * kChunkK + warp * kWarpK, warp, group, quad,
                 norm_red);
        }
#endif
#elif !defined(SGC_LEAVE_OUT_COMPUTE)
        if (in_kind == kInBf16) {
          a_window(c);
          a_fragments_bf16(a, a_s, rows, (c - a_lo) * kChunkK + warp * kWarpK, group, quad);
        }
#endif
#ifdef SGC_LEAVE_OUT_PRODUCTS
        uint32_t a_bits = 0u;  // every A value reaches the slot's release, so no load is dropped
#pragma unroll
        for (int s = 0; s < kSteps; ++s) a_bits ^= a[s][0] ^ a[s][1] ^ a[s][2] ^ a[s][3];
#endif
#pragma unroll
        for (int j = 0; j < kGroupUnits; ++j) {
          if (j < group_units) {
            mbar_wait(&full[stage], phase);
            const uint4* src =
                reinterpret_cast<const uint4*>(ring + stage * kChunkBytes + warp * (kChunkBytes / 8)) + lane;
            uint4 b[kSteps / 2];
#pragma unroll
            for (int q = 0; q < kSteps / 2; ++q) b[q] = src[q * 32];
#if defined(SGC_LEAVE_OUT_COMPUTE)
            acc[j][0] += __uint_as_float(b[0].x & 1u);
#elif defined(SGC_LEAVE_OUT_PRODUCTS)
            acc[j][0] += __uint_as_float((b[0].x ^ b[1].y ^ b[2].z ^ b[3].w ^ a_bits) & 1u);
#else
#pragma unroll
            for (int q = 0; q < kSteps / 2; ++q) {
              mma_bf16(acc[j], a[2 * q], b[q].x, b[q].y);
              mma_bf16(acc[j], a[2 * q + 1], b[q].z, b[q].w);
            }
#endif
            // Free the slot once the products have used every value read from it: the arrive's condition reads
            // the last product, which waits for the shared-memory loads. Without that data dependency the compiler
            // issues the arrive between the loads and the products, and nothing orders the barrier's update after
            // the loads' reads, so the bulk copy engine could refill the slot while a load from it is pending.
            __syncwarp();
            if (lane == 0 && __float_as_uint(acc[j][0]) != 0xffffffffu) mbar_arrive(&empty[stage]);
            if (g0 == 0 && c == 0 && j == 0) SGC_MARK(g, 3);
            if (++stage == kStages) { stage = 0; phase ^= 1u; }
          }
        }
#ifndef SGC_A_WINDOW
        if (prefetch) {
#pragma unroll
          for (int s = 0; s < kSteps; ++s) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[s][i] = a_next[s][i];
          }
        }
#endif
      }
      SGC_MARK(g, 4);
      // the 8 warps' partial tiles of the group's units, summed through shared memory
      float4* red4 = reinterpret_cast<float4*>(red);
#pragma unroll
      for (int j = 0; j < kGroupUnits; ++j) {
        if (j < group_units) {
          red4[(j * kConsumerWarps + warp) * 32 + lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        }
      }
      consumer_sync();
      if (out_kind == kOutGeglu || out_kind == kOutGegluDown) {
        // a unit holds 4 gate columns (tile columns 0-3) and the same 4 up columns (4-7): each output is
        // gelu_tanh(bf16(gate)) * bf16(up), rounded to bf16; C[r][c] is in lane 4 (r % 8) + c / 2 and C[r][c + 4]
        // two lanes further, in register (c % 2) + 2 (r >= 8). kOutGegluDown keeps the group's outputs in act_s
        // (row r, column 4 j + c), zeros where the group has no unit j, for the products with W_down below.
        __nv_bfloat16* act_h = reinterpret_cast<__nv_bfloat16*>(act_s);
#pragma unroll
        for (int m = 0; m < kSumsPerThread / 2; ++m) {
          const int v = threadIdx.x + m * kConsumerThreads;
          const int j = v >> 6, row = (v >> 2) & 15, c = v & 3;
          if (j >= group_units || row >= rows) {
            if (out_kind == kOutGegluDown) act_h[row * kActCols + 4 * j + c] = __float2bfloat16(0.f);
            continue;
          }
          const int l = (row & 7) * 4 + (c >> 1), i = (c & 1) + (row >= 8 ? 2 : 0);
          float gate = 0.f, up = 0.f;
#pragma unroll
          for (int w = 0; w < kConsumerWarps; ++w) {
            gate += red[((j * kConsumerWarps + w) * 32 + l) * 4 + i];
            up += red[((j * kConsumerWarps + w) * 32 + l + 2) * 4 + i];
          }
          gate = __bfloat162float(__float2bfloat16(gate));
          up = __bfloat162float(__float2bfloat16(up));
          const __nv_bfloat16 act = __float2bfloat16(gelu_tanh(gate) * up);
          if (out_kind == kOutGegluDown) {
            act_h[row * kActCols + 4 * j + c] = act;
          } else {
            const int col = (first + (g0 + j) * ctas) * (kTileN / 2) + c;
            reinterpret_cast<__nv_bfloat16*>(d.out)[row * d.out_stride + col] = act;
          }
        }
        if (out_kind == kOutGegluDown) {
          consumer_sync();  // the group's GeGLU columns are in act_s
#ifdef SGC_DOWN_CLUSTER_SUM
          // this CTA's A window is read (the fragments before the first group, a partner's tiles before the
          // barrier above): each partner may store its partial tiles into it
          if (threadIdx.x == 0) {
            for (unsigned r = 0; r < kCluster; ++r) {
              if (r != rank) mbar_arrive_cluster(cluster_addr(sum_free, r));
            }
          }
#endif
          // two units per slot: K = their 8 GeGLU columns; warp w covers N2 columns [128 w, 128 w + 128) in 16
          // n-tiles; a lane's A words hold rows `group` / `group + 8` at columns 4 jp + 2 quad (+1), its B word
          // n-tile t's column `group` at the slot half of unit jp + quad / 2, K pair quad % 2 (pack_down_pairs).
          // The group's partial product (this warp's 16 x 128 share) goes into the residual copy with fp32 vector
          // atomics after its last slot, so it lives in registers for one group only.
          float dacc[kDownTiles][4];
#pragma unroll
          for (int t = 0; t < kDownTiles; ++t) {
#pragma unroll
            for (int i = 0; i < 4; ++i) dacc[t][i] = 0.f;
          }
          for (int jp = 0; jp < group_units; jp += 2) {
            mbar_wait(&full[stage], phase);
            const uint32_t* slot = reinterpret_cast<const uint32_t*>(ring + stage * kChunkBytes) +
                                   (quad >> 1) * (kDownUnitBytes / 4) + warp * kDownTiles * 16 + group * 2 +
                                   (quad & 1);
            uint32_t b[kDownTiles];
#pragma unroll
            for (int t = 0; t < kDownTiles; ++t) b[t] = slot[t * 16];
            const uint32_t a0 = act_s[group * (kActCols / 2) + 2 * jp + quad];
            const uint32_t a1 = act_s[(group + 8) * (kActCols / 2) + 2 * jp + quad];
#if defined(SGC_LEAVE_OUT_COMPUTE) || defined(SGC_LEAVE_OUT_PRODUCTS)
            dacc[kDownTiles - 1][0] += __uint_as_float((b[0] ^ b[kDownTiles - 1] ^ a0 ^ a1) & 1u);
#else
#pragma unroll
            for (int t = 0; t < kDownTiles; ++t) mma_bf16_k8(dacc[t], a0, a1, b[t]);
#endif
            // as above: the release waits for the last product, which waits for every load from the slot
            __syncwarp();
            if (lane == 0 && __float_as_uint(dacc[kDownTiles - 1][0]) != 0xffffffffu) mbar_arrive(&empty[stage]);
            if (++stage == kStages) { stage = 0; phase ^= 1u; }
          }
          if (g0 == 0) SGC_MARK(g, 7);
          bool adds = true;  // this warp adds its (summed) partial product into the residual copy
#ifdef SGC_DOWN_CLUSTER_SUM
          // the cluster's sum: warp w's columns belong to rank w % kCluster; a warp of another rank stores its 16
          // tiles into the owner's A window (slot: the sender's distance from the owner, then w / kCluster; tile t
          // of lane l at float4 (slot * 16 + t) * 32 + l), then arrives on the owner's sum_full; the owner's warp
          // adds the partners' tiles of its columns to its own
          {
            const unsigned owner = static_cast<unsigned>(warp) % kCluster;
            float4* recv = reinterpret_cast<float4*>(a_s);
            if (owner != rank) {
              mbar_wait<true>(sum_free, sum_phase);
              const int from = static_cast<int>((rank - owner - 1 + kCluster) % kCluster);
              const int slot = from * (kConsumerWarps / kCluster) + warp / kCluster;
              const uint32_t dst = cluster_addr(recv + slot * kDownTiles * 32 + lane, owner);
#pragma unroll
              for (int t = 0; t < kDownTiles; ++t) {
                st_cluster(dst + t * 32 * 16, dacc[t][0], dacc[t][1], dacc[t][2], dacc[t][3]);
              }
              mbar_arrive_cluster(cluster_addr(sum_full, owner));
              adds = false;
            } else {
              mbar_wait<true>(sum_full, sum_phase);
              for (int p = 0; p < kCluster - 1; ++p) {
                const int slot = p * (kConsumerWarps / kCluster) + warp / kCluster;
                const float4* src = recv + slot * kDownTiles * 32 + lane;
#pragma unroll
                for (int t = 0; t < kDownTiles; ++t) {
                  const float4 v = src[t * 32];
                  dacc[t][0] += v.x;
                  dacc[t][1] += v.y;
                  dacc[t][2] += v.z;
                  dacc[t][3] += v.w;
                }
              }
            }
            sum_phase ^= 1u;
          }
#endif
          float* out = reinterpret_cast<float*>(d.out);
#ifdef SGC_LEAVE_OUT_ATOMICS
          // no atomics; every partial sum still reaches a (never taken) store, so no product is dropped
          float kept = 0.f;
#pragma unroll
          for (int t = 0; t < kDownTiles; ++t) kept += dacc[t][0] + dacc[t][1] + dacc[t][2] + dacc[t][3];
          if (adds && __float_as_uint(kept) == 0xffffffffu) out[0] = kept;
#else
          if (adds) {
#pragma unroll
            for (int t = 0; t < kDownTiles; ++t) {
              const int col = (warp * kDownTiles + t) * kTileN + 2 * quad;
              if (group < rows) {
                atomicAdd(reinterpret_cast<float2*>(out + group * d.out_stride + col),
                          make_float2(dacc[t][0], dacc[t][1]));
              }
              if (group + 8 < rows) {
                atomicAdd(reinterpret_cast<float2*>(out + (group + 8) * d.out_stride + col),
                          make_float2(dacc[t][2], dacc[t][3]));
              }
            }
          }
#endif
        }
      } else {
#pragma unroll
        for (int m = 0; m < kSumsPerThread; ++m) {
          const int v = threadIdx.x + m * kConsumerThreads;
          const int j = v >> 7, l = (v >> 2) & 31, i = v & 3;
          const int row = (l >> 2) + (i >= 2 ? 8 : 0);
          if (j >= group_units || row >= rows) continue;
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kConsumerWarps; ++w) sum += red[((j * kConsumerWarps + w) * 32 + l) * 4 + i];
          const int col = (first + (g0 + j) * ctas) * kTileN + 2 * (l & 3) + (i & 1);
          if (out_kind == kOutBf16) {
            reinterpret_cast<__nv_bfloat16*>(d.out)[row * d.out_stride + col] = __float2bfloat16(sum);
          } else {  // the unit's owner is the only writer of these elements
            __stcg(reinterpret_cast<float*>(d.out) + row * d.out_stride + col, old[m] + sum);
            if (d.out2) __stcg(reinterpret_cast<float*>(d.out2) + row * d.out_stride + col, old[m] + sum);
          }
        }
      }
      SGC_MARK(g, 5);
      if (g0 + kGroupUnits < groups_to) consumer_sync();  // `red` is read before the next group writes it
    }
#if defined(SGC_A_WINDOW) && !defined(SGC_LEAVE_OUT_COMPUTE)
    if (kCluster > 1 && a_lo < 0) a_window(0);  // no unit here: the window still takes this CTA's share of copies
#endif
    rot = (rot + units) % ctas;
    consumer_sync();  // this CTA's outputs of GEMM g are written; the release below is cumulative over them
    SGC_MARK(g, 6);
    if (threadIdx.x == 0) add_release(counter, 1u);
  }
#endif  // SGC_LEAVE_OUT_CONSUMERS
  // in clusters, no CTA leaves while a copy it issued into a partner may still be in flight
  if (kCluster > 1) cluster_sync();
}

}  // namespace

extern "C" {

// Bytes of dynamic shared memory a CTA uses.
int streamed_gemm_chain_smem_bytes() { return kSmemBytes; }

// Threads per CTA.
int streamed_gemm_chain_threads() { return kThreads; }

// CTAs that can be resident at once on the current device (the largest cooperative grid), or -1 on an error.
int streamed_gemm_chain_max_ctas() {
  return resident_ctas(streamed_gemm_chain_kernel, kThreads, kSmemBytes, kCluster);
}

// Zero the counter, then launch the chain on `stream` (both captured when the stream is capturing).
// Returns a cudaError_t (0: success).
int streamed_gemm_chain_launch(const void* descs, int num_gemms, int rows, void* counter, int wait_inputs, int ctas,
                               void* stream) {
  unsigned* count = static_cast<unsigned*>(counter);
  // in clusters the hand-over is what keeps a partner's next window out of a window still being read
  if (kCluster > 1 && (!wait_inputs || ctas % kCluster)) return cudaErrorInvalidValue;
  return launch_chain(streamed_gemm_chain_kernel, ctas, kThreads, kSmemBytes, kCluster, count,
                      static_cast<cudaStream_t>(stream), static_cast<const GemmDesc*>(descs), num_gemms, rows, count,
                      wait_inputs);
}

#ifdef SGC_TRACE
// Measurement only: trace GEMMs [from, from + 64) of the next launches (the buffer zeroed), then read it back as
// (CTA, GEMM, event, {clock64, globaltimer}) u64.
int streamed_gemm_chain_trace_setup(int from) {
  cudaError_t e = cudaMemcpyToSymbol(sgc_trace_from, &from, sizeof(int));
  if (e != cudaSuccess) return e;
  void* p = nullptr;
  e = cudaGetSymbolAddress(&p, sgc_trace);
  if (e != cudaSuccess) return e;
  return cudaMemset(p, 0, sizeof(sgc_trace));
}
int streamed_gemm_chain_trace_read(void* dst) { return cudaMemcpyFromSymbol(dst, sgc_trace, sizeof(sgc_trace)); }
#endif

const char* streamed_gemm_chain_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
