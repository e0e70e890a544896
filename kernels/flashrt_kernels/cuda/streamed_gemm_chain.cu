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
// The launch is cooperative (every CTA resident, one per SM), so the spin cannot deadlock. The counter is zeroed by
// a memset before each launch (inside a captured graph too).
// Measurement switches (the result is then wrong; never a product path): `wait_inputs = 0` skips the wait on the
// counter (the weight stream and the compute alone: the design's ceiling); built with -DSGC_LEAVE_OUT_COPY the
// producer signals each slot without copying into it (no weight stream), with -DSGC_LEAVE_OUT_COMPUTE the consumers
// skip the A loads and the products (the stream, the hand-overs and the sums alone), with -DSGC_LEAVE_OUT_PRODUCTS
// they load A as the kernel does but skip the products (what the A loads cost: each CTA reads every GEMM's whole A,
// ~200 KB per layer at 10 rows).

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
constexpr int kStages = 12;                            // ring slots: 192 KiB
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
constexpr int kSmemBytes =
    kStages * kChunkBytes + (kRedFloats + kNormRedFloats + kActWords) * 4 + 2 * kStages * 8;

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

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
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
    const float s0 = rsqrtf(t0 / static_cast<float>(d.k) + kRmsEps);
    const float s1 = rsqrtf(t1 / static_cast<float>(d.k) + kRmsEps);
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

__device__ __forceinline__ int first_unit(int cta, int rot, int ctas) { return (cta - rot + ctas) % ctas; }

// How many of a GEMM's `units` the CTA whose first unit is `first` owns (first, first + ctas, ...): the producer
// and the consumers walk the same units by it.
__device__ __forceinline__ int units_owned(int first, int units, int ctas) {
  return first < units ? (units - first + ctas - 1) / ctas : 0;
}

__global__ void __launch_bounds__(kThreads, 1)
    streamed_gemm_chain_kernel(const GemmDesc* __restrict__ descs, int num_gemms, int rows, unsigned* counter,
                               int wait_inputs) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  float* red = reinterpret_cast<float*>(smem + kStages * kChunkBytes);
  float* norm_red = red + kRedFloats;
  uint32_t* act_s = reinterpret_cast<uint32_t*>(norm_red + kNormRedFloats);  // kOutGegluDown: 16 x 32 bf16
  uint64_t* full = reinterpret_cast<uint64_t*>(act_s + kActWords);
  uint64_t* empty = full + kStages;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ctas = gridDim.x, cta = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

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
    return;
  }

  const int group = lane >> 2, quad = lane & 3;
  int stage = 0, rot = 0;
  uint32_t phase = 0;
  for (int g = 0; g < num_gemms; ++g) {
    const GemmDesc d = descs[g];
    const int units = static_cast<int>(d.n / kTileN), chunks = static_cast<int>(d.k / kChunkK);
    const int in_kind = static_cast<int>(d.kinds & 0xff), out_kind = static_cast<int>((d.kinds >> 8) & 0xff);
    if (g > 0 && wait_inputs) {  // every CTA has written its part of GEMM g-1
      if (threadIdx.x == 0) wait_for_step(counter, g, ctas);
      consumer_sync();
    }
    const int first = first_unit(cta, rot, ctas);
    const int mine = units_owned(first, units, ctas);
    // A of chunk 0, loaded once per GEMM: a GEMM of one chunk (QKV and gate/up, K = 1024, the RMS-normed ones)
    // keeps it for all its groups; a longer one (O, down) prefetches each next chunk's A into `a_next` while the
    // products of the current chunk run, and the next group's chunk 0 during its last chunk
    uint32_t a[kSteps][4], a_next[kSteps][4];
#ifndef SGC_LEAVE_OUT_COMPUTE
    if (mine > 0) load_a(a, d, in_kind, rows, warp * kWarpK, warp, group, quad, norm_red);
#endif
    for (int g0 = 0; g0 < mine; g0 += kGroupUnits) {  // up to kGroupUnits units summed across warps at once
      const int group_units = min(kGroupUnits, mine - g0);
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
        const bool prefetch = chunks > 1 && (c + 1 < chunks || g0 + kGroupUnits < mine);
#ifndef SGC_LEAVE_OUT_COMPUTE
        if (prefetch) {
          load_a(a_next, d, in_kind, rows, (c + 1 < chunks ? c + 1 : 0) * kChunkK + warp * kWarpK, warp, group, quad,
                 norm_red);
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
            if (++stage == kStages) { stage = 0; phase ^= 1u; }
          }
        }
        if (prefetch) {
#pragma unroll
          for (int s = 0; s < kSteps; ++s) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[s][i] = a_next[s][i];
          }
        }
      }
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
          float* out = reinterpret_cast<float*>(d.out);
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
      if (g0 + kGroupUnits < mine) consumer_sync();  // `red` is read before the next group writes it
    }
    rot = (rot + units) % ctas;
    consumer_sync();  // this CTA's outputs of GEMM g are written; the release below is cumulative over them
    if (threadIdx.x == 0) add_release(counter, 1u);
  }
}

}  // namespace

extern "C" {

// Bytes of dynamic shared memory a CTA uses.
int streamed_gemm_chain_smem_bytes() { return kSmemBytes; }

// Threads per CTA.
int streamed_gemm_chain_threads() { return kThreads; }

// CTAs that can be resident at once on the current device (the largest cooperative grid), or -1 on an error.
int streamed_gemm_chain_max_ctas() { return resident_ctas(streamed_gemm_chain_kernel, kThreads, kSmemBytes); }

// Zero the counter, then launch the chain on `stream` (both captured when the stream is capturing).
// Returns a cudaError_t (0: success).
int streamed_gemm_chain_launch(const void* descs, int num_gemms, int rows, void* counter, int wait_inputs, int ctas,
                               void* stream) {
  unsigned* count = static_cast<unsigned*>(counter);
  return launch_chain(streamed_gemm_chain_kernel, ctas, kThreads, kSmemBytes, 1, count,
                      static_cast<cudaStream_t>(stream), static_cast<const GemmDesc*>(descs), num_gemms, rows, count,
                      wait_inputs);
}

const char* streamed_gemm_chain_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
