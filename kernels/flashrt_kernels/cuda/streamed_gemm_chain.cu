// Streamed GEMM chain: a sequence of dependent small-row GEMMs (the action expert's four per layer, every layer of
// every denoising step) as ONE persistent kernel whose weights stream into shared memory ahead of their
// dependencies. kernels/flashrt_kernels/streamed_gemm_chain.py packs the weights, builds the chain and holds the
// PyTorch reference; docs/performance.md has what it measures on an H200.
//
//     for g in 0 .. G-1:   Y_g = A_g(inputs) @ W_g^T        A_g: (rows <= 16, K_g), W_g: (N_g, K_g) bf16
//
// A GEMM's A operand is read from global memory in one of three forms (`kInBf16`: a bf16 matrix; `kInF32`: an fp32
// matrix rounded to bf16; `kInGeglu`: gelu_tanh(gate) * up of a bf16 (rows, 2K) matrix, rounded to bf16), and its
// fp32 result is written as bf16 (`kOutBf16`) or added into an fp32 matrix (`kOutAddF32`, the residual stream).
//
// Work: GEMM g's output columns come in units of 8 (one mma n-tile); a unit's weight is (8, K_g), stored by
// pack_weight() in chunks of 8 x 1024 (16 KiB) laid out in mma fragment order, so a warp reads its B fragments
// with one conflict-free 16-byte shared load per lane per 32 of K. Unit u of GEMM g belongs to CTA
// (u + rot_g) % CTAs, rot_g being the units of GEMMs 0 .. g-1 modulo CTAs, so the bytes spread evenly over a layer.
// Each CTA has one producer warp and 8 consumer warps:
//   - the producer walks the CTA's chunks of the whole chain in order and copies each into a ring of kStages
//     16-KiB slots with the bulk copy engine (cp.async.bulk, completion counted on the slot's `full` mbarrier). It
//     never waits for activations, only for a free slot (`empty` mbarrier), so the weights of the next GEMMs stream
//     while the consumers wait for this one's inputs;
//   - the consumers wait until every CTA has finished GEMM g-1 (one counter in global memory: each CTA adds 1 per
//     GEMM with a release at GPU scope after a CTA barrier; a GEMM's consumers spin with an acquire until it holds
//     g * CTAs), load their A fragments (warp w covers K offsets [128 w, 128 w + 128) of each 1024-chunk), run
//     mma.sync m16n8k16 (bf16, fp32 accumulate) on the slot, free it, and sum the 8 warps' partial tiles through
//     shared memory; 128 threads write the unit's (rows, 8) outputs.
// The launch is cooperative (every CTA resident, one per SM), so the spin cannot deadlock. The counter is zeroed by
// a memset before each launch (inside a captured graph too).
// `wait_inputs = 0` skips the wait on the counter: the result is then wrong, and the time is the weight stream and
// the compute alone (a measurement of the design's ceiling, never a product path).

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kChunkK = 1024;                          // reduction length of one weight chunk
constexpr int kTileN = 8;                              // output columns of one unit (one mma n-tile)
constexpr int kChunkBytes = kTileN * kChunkK * 2;      // 16 KiB of bf16
constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 32;        // + the producer warp
constexpr int kStages = 13;                            // ring slots: 208 KiB
constexpr int kWarpK = kChunkK / kConsumerWarps;       // 128: a consumer warp's share of a chunk
constexpr int kSteps = kWarpK / 16;                    // 8 mma k-steps per warp per chunk
constexpr int kRedFloats = kConsumerWarps * 32 * 4;    // one unit's partial tiles, one per warp
constexpr int kSmemBytes = kStages * kChunkBytes + 2 * kRedFloats * 4 + 2 * kStages * 8;

enum InKind { kInBf16 = 0, kInF32 = 1, kInGeglu = 2 };
enum OutKind { kOutBf16 = 0, kOutAddF32 = 1 };

// One GEMM of the chain: eight int64 fields, in the order streamed_gemm_chain.py writes them.
struct GemmDesc {
  long long w;            // packed weight: (N / 8) units x (K / 1024) chunks x 16 KiB
  long long in;           // A's source matrix (bf16 or fp32, by in_kind)
  long long out;          // the output matrix (bf16 or fp32, by out_kind)
  long long n, k;         // N (a multiple of 8), K (a multiple of 1024)
  long long kinds;        // in_kind | out_kind << 8
  long long in_stride;    // elements between two rows of the source
  long long out_stride;   // elements between two rows of the output
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

// 16 KiB from global memory into a ring slot on the bulk copy engine; completion counted on `bar`.
__device__ __forceinline__ void bulk_copy_chunk(void* dst, const void* src, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(kChunkBytes), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
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

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// A[row, k], A[row, k + 1] as one packed bf16 pair (0 past the last row). Loads go to L2 (.cg): the activations
// are written by other CTAs during this launch, so a line in this SM's L1 could be stale.
__device__ __forceinline__ uint32_t load_a_pair(const GemmDesc& d, int in_kind, int rows, int row, int k) {
  if (row >= rows) return 0u;
  if (in_kind == kInBf16) {
    const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(d.in) + row * d.in_stride + k;
    return __ldcg(reinterpret_cast<const unsigned*>(p));
  }
  if (in_kind == kInF32) {
    const float* p = reinterpret_cast<const float*>(d.in) + row * d.in_stride + k;
    const float2 v = __ldcg(reinterpret_cast<const float2*>(p));
    return pack_bf16(v.x, v.y);
  }
  const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(d.in) + row * d.in_stride + k;
  unsigned g = __ldcg(reinterpret_cast<const unsigned*>(p));
  unsigned u = __ldcg(reinterpret_cast<const unsigned*>(p + d.k));
  const float2 gate = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&g));
  const float2 up = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u));
  return pack_bf16(gelu_tanh(gate.x) * up.x, gelu_tanh(gate.y) * up.y);
}

// This warp's A fragments of K offsets [k0, k0 + 128): kSteps m16k16 tiles (rows >= `rows` are zero).
__device__ __forceinline__ void load_a(uint32_t (&a)[kSteps][4], const GemmDesc& d, int in_kind, int rows, int k0,
                                       int group, int quad) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int k = k0 + 16 * s + 2 * quad;
    a[s][0] = load_a_pair(d, in_kind, rows, group, k);
    a[s][1] = load_a_pair(d, in_kind, rows, group + 8, k);
    a[s][2] = load_a_pair(d, in_kind, rows, group, k + 8);
    a[s][3] = load_a_pair(d, in_kind, rows, group + 8, k + 8);
  }
}

__device__ __forceinline__ void store_out(const GemmDesc& d, int out_kind, int row, int col, float v) {
  if (out_kind == kOutBf16) {
    reinterpret_cast<__nv_bfloat16*>(d.out)[row * d.out_stride + col] = __float2bfloat16(v);
  } else {
    float* p = reinterpret_cast<float*>(d.out) + row * d.out_stride + col;
    __stcg(p, __ldcg(p) + v);
  }
}

__device__ __forceinline__ int first_unit(int cta, int rot, int ctas) { return (cta - rot + ctas) % ctas; }

__global__ void __launch_bounds__(kThreads, 1)
    streamed_gemm_chain_kernel(const GemmDesc* __restrict__ descs, int num_gemms, int rows, unsigned* counter,
                               int wait_inputs) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  float* red = reinterpret_cast<float*>(smem + kStages * kChunkBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(red + 2 * kRedFloats);
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
      for (int g = 0; g < num_gemms; ++g) {
        const GemmDesc d = descs[g];
        const int units = static_cast<int>(d.n / kTileN), chunks = static_cast<int>(d.k / kChunkK);
        const uint8_t* w = reinterpret_cast<const uint8_t*>(d.w);
        for (int u = first_unit(cta, rot, ctas); u < units; u += ctas) {
          for (int c = 0; c < chunks; ++c) {
            mbar_wait(&empty[stage], phase ^ 1u);
            mbar_arrive_expect_tx(&full[stage], kChunkBytes);
            bulk_copy_chunk(ring + stage * kChunkBytes, w + (static_cast<size_t>(u) * chunks + c) * kChunkBytes,
                            &full[stage]);
            if (++stage == kStages) { stage = 0; phase ^= 1u; }
          }
        }
        rot = (rot + units) % ctas;
      }
    }
    return;
  }

  const int group = lane >> 2, quad = lane & 3;
  int stage = 0, rot = 0, buf = 0;
  uint32_t phase = 0;
  for (int g = 0; g < num_gemms; ++g) {
    const GemmDesc d = descs[g];
    const int units = static_cast<int>(d.n / kTileN), chunks = static_cast<int>(d.k / kChunkK);
    const int in_kind = static_cast<int>(d.kinds & 0xff), out_kind = static_cast<int>((d.kinds >> 8) & 0xff);
    if (g > 0 && wait_inputs) {  // every CTA has written its part of GEMM g-1
      if (threadIdx.x == 0) {
        const unsigned target = static_cast<unsigned>(g) * static_cast<unsigned>(ctas);
        while (load_acquire(counter) < target) {
        }
      }
      consumer_sync();
    }
    uint32_t a[kSteps][4];
    int a_chunk = -1;
    for (int u = first_unit(cta, rot, ctas); u < units; u += ctas) {
      float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      for (int c = 0; c < chunks; ++c) {
        if (c != a_chunk) {
          load_a(a, d, in_kind, rows, c * kChunkK + warp * kWarpK, group, quad);
          a_chunk = c;
        }
        mbar_wait(&full[stage], phase);
        const uint4* src = reinterpret_cast<const uint4*>(ring + stage * kChunkBytes + warp * (kChunkBytes / 8)) + lane;
        uint4 b[kSteps / 2];
#pragma unroll
        for (int j = 0; j < kSteps / 2; ++j) b[j] = src[j * 32];
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[stage]);
#pragma unroll
        for (int j = 0; j < kSteps / 2; ++j) {
          mma_bf16(acc[0], a[2 * j], b[j].x, b[j].y);
          mma_bf16(acc[1], a[2 * j + 1], b[j].z, b[j].w);
        }
        if (++stage == kStages) { stage = 0; phase ^= 1u; }
      }
      float* r = red + buf * kRedFloats;
      reinterpret_cast<float4*>(r)[warp * 32 + lane] =
          make_float4(acc[0][0] + acc[1][0], acc[0][1] + acc[1][1], acc[0][2] + acc[1][2], acc[0][3] + acc[1][3]);
      consumer_sync();
      if (threadIdx.x < 128) {  // one (lane, register) of the m16n8 tile each
        const int l = threadIdx.x >> 2, i = threadIdx.x & 3;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kConsumerWarps; ++w) s += r[(w * 32 + l) * 4 + i];
        const int row = (l >> 2) + (i >= 2 ? 8 : 0), col = u * kTileN + 2 * (l & 3) + (i & 1);
        if (row < rows) store_out(d, out_kind, row, col, s);
      }
      buf ^= 1;
    }
    rot = (rot + units) % ctas;
    consumer_sync();  // this CTA's outputs of GEMM g are written
    if (threadIdx.x == 0) {
      __threadfence();
      add_release(counter, 1u);
    }
  }
}

}  // namespace

extern "C" {

// Bytes of dynamic shared memory a CTA uses.
int streamed_gemm_chain_smem_bytes() { return kSmemBytes; }

// Threads per CTA.
int streamed_gemm_chain_threads() { return kThreads; }

// CTAs that can be resident at once on the current device (the largest cooperative grid), or -1 on an error.
int streamed_gemm_chain_max_ctas() {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return -1;
  if (cudaFuncSetAttribute(streamed_gemm_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
      cudaSuccess)
    return -1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, streamed_gemm_chain_kernel, kThreads, kSmemBytes) !=
      cudaSuccess)
    return -1;
  return sms * per_sm;
}

// Zero the counter, then launch the chain on `stream` (both captured when the stream is capturing).
// Returns a cudaError_t (0: success).
int streamed_gemm_chain_launch(const void* descs, int num_gemms, int rows, void* counter, int wait_inputs, int ctas,
                               void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e =
      cudaFuncSetAttribute(streamed_gemm_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(counter, 0, sizeof(unsigned), s);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = s;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, streamed_gemm_chain_kernel, static_cast<const GemmDesc*>(descs), num_gemms,
                            rows, static_cast<unsigned*>(counter), wait_inputs);
}

const char* streamed_gemm_chain_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
