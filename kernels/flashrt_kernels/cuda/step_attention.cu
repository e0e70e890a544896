// A denoising step's attention in one launch: the step's suffix tokens attend the prefix's KV cache and their own
// keys (one KV head that every query head shares), the key splits of each block of 16 query rows summed across a
// cluster of 8 CTAs over distributed shared memory, where the Triton form (kernels/flashrt_kernels/attention.py,
// decoder_attention) stores its splits' partial sums to global memory and merges them in a second launch.
//
//   query row r: token t = r / heads, head r % heads; q[r] = bf16(RoPE(qkv[t, head], pos[t]) * q_scale)
//   key j < P:   k = k_cache[j], v = v_cache[j], the score plus bias[j] (0 or -inf: a padded prefix slot)
//   key j >= P:  token u = j - P: k = bf16(RoPE(qkv[u, heads], pos[u])), v = qkv[u, heads + 1], seen by row r
//                only where u < visible[t]
//   out[r] = softmax_j(q[r] . k[j]) @ v       (fp32 scores, softmax and sums; bf16 probabilities in the P @ V
//                                             product, as every flash kernel; bf16 out)
// RoPE is the split-half form: y[d] = x[d] cos - x[d + D/2] sin, y[d + D/2] = x[d + D/2] cos + x[d] sin (d < D/2),
// cos / sin read from fp32 tables (position, D/2). That is decoder_attention_reference's contract
// (kernels/flashrt_kernels/attention.py), which the GPU test checks this kernel against.
//
// Grid (8, ceil(rows / 16)), clusters of 8 along x: CTA c of a cluster takes the keys [c B, min((c + 1) B, L)) of
// L = P + tokens, B = 16 ceil(L / 128) (L <= 1024). Before the PDL wait it starts copying its prefix keys' K and V
// rows into shared memory (cp.async: the prefix phase wrote them); after the wait it loads the 16 query rows and
// its suffix keys from the QKV GEMM's output with RoPE applied. Four warps compute the block's scores on mma.sync,
// the rows' maxima and sums of exp, and the unnormalized output (16 x 256, fp32) into the CTA's shared memory;
// after a cluster barrier CTA c merges rows 2c and 2c + 1 of the 8 CTAs' (max, sum, output) and writes them.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "chain_handover.cuh"
#include "mma_bf16.cuh"

namespace {

constexpr int kD = 256;                       // head dim
constexpr int kHalf = kD / 2;
constexpr int kRows = 16;                     // query rows per CTA: one m16 tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kCluster = 8;                   // CTAs per row block: its key splits
constexpr int kMaxKeys = 128;                 // keys per CTA: L <= kCluster * kMaxKeys
constexpr int kPad = 8;                       // bf16 of padding per shared row (16 B: rows start on other banks)
constexpr int kRowH = kD + kPad;              // a K / V / q row in shared memory, in bf16
constexpr int kPRowH = kMaxKeys + kPad;       // a row of probabilities in shared memory, in bf16
constexpr int kRowsPerRank = kRows / kCluster;  // output rows each CTA of a cluster merges: 2
constexpr int kSmemBytes = (2 * kMaxKeys * kRowH + kRows * kRowH + kRows * kPRowH) * 2 +
                           (kRows * kD + 2 * kWarps * kRows + 2 * kRows) * 4;

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void wait_for_inputs() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}

__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ float bf16_at(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// Eight consecutive values of a bf16 row starting at `src`, as floats (one 16-byte load).
__device__ __forceinline__ void load8(const __nv_bfloat16* src, float (&x)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void store8(__nv_bfloat16* dst, const float (&y)[8]) {
  uint4 raw;
  raw.x = pack_bf16(y[0], y[1]);
  raw.y = pack_bf16(y[2], y[3]);
  raw.z = pack_bf16(y[4], y[5]);
  raw.w = pack_bf16(y[6], y[7]);
  *reinterpret_cast<uint4*>(dst) = raw;
}

// Dims [d0, d0 + 8) and [d0 + D/2, d0 + D/2 + 8) of a row with RoPE at position p, times `scale`, into `dst` (bf16).
__device__ __forceinline__ void rope8(const __nv_bfloat16* src, __nv_bfloat16* dst, int d0, long long p,
                                      const float* cos_t, const float* sin_t, float scale) {
  float lo[8], hi[8], ylo[8], yhi[8], c[8], sn[8];
  load8(src + d0, lo);
  load8(src + d0 + kHalf, hi);
  const float4* cp = reinterpret_cast<const float4*>(cos_t + p * kHalf + d0);
  const float4* sp = reinterpret_cast<const float4*>(sin_t + p * kHalf + d0);
  *reinterpret_cast<float4*>(c) = cp[0];
  *reinterpret_cast<float4*>(c + 4) = cp[1];
  *reinterpret_cast<float4*>(sn) = sp[0];
  *reinterpret_cast<float4*>(sn + 4) = sp[1];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    ylo[i] = (lo[i] * c[i] - hi[i] * sn[i]) * scale;
    yhi[i] = (hi[i] * c[i] + lo[i] * sn[i]) * scale;
  }
  store8(dst + d0, ylo);
  store8(dst + d0 + kHalf, yhi);
}

#ifdef STEP_ATTN_LEAVE_OUT_CLUSTER
#define STEP_ATTN_CLUSTER_DIMS
#else
#define STEP_ATTN_CLUSTER_DIMS __cluster_dims__(kCluster, 1, 1)
#endif

__global__ void STEP_ATTN_CLUSTER_DIMS __launch_bounds__(kThreads, 1)
    step_attention_kernel(const __nv_bfloat16* __restrict__ qkv, long long qkv_stride,
                          const __nv_bfloat16* __restrict__ k_cache, const __nv_bfloat16* __restrict__ v_cache,
                          long long cache_stride, const long long* __restrict__ pos, const float* __restrict__ cos_t,
                          const float* __restrict__ sin_t, const float* __restrict__ bias, int prefix_len,
                          const int* __restrict__ visible, int tokens, int heads, float q_scale,
                          __nv_bfloat16* __restrict__ out, long long out_stride, int early_trigger) {
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem);              // [kMaxKeys][kRowH]
  __nv_bfloat16* vs = ks + kMaxKeys * kRowH;                                // [kMaxKeys][kRowH]
  __nv_bfloat16* qs = vs + kMaxKeys * kRowH;                                // [kRows][kRowH]
  __nv_bfloat16* ps = qs + kRows * kRowH;                                   // [kRows][kPRowH]
  float* acc_s = reinterpret_cast<float*>(ps + kRows * kPRowH);             // [kRows][kD]
  float* red_max = acc_s + kRows * kD;                                      // [kWarps][kRows]
  float* red_sum = red_max + kWarps * kRows;                                // [kWarps][kRows]
  float* ml_s = red_sum + kWarps * kRows;                                   // [kRows][2]: max, sum

  if (early_trigger) launch_dependents();  // the kernel after this one may launch now (EARLY_TRIGGER)
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const unsigned rank = cluster_rank();
  const int L = prefix_len + tokens, rows = tokens * heads;
  const int block = ((L + kCluster * 16 - 1) / (kCluster * 16)) * 16;      // keys per CTA, a multiple of 16
  const int k_lo = static_cast<int>(rank) * block, k_hi = min(k_lo + block, L);
  const int nkeys = max(k_hi - k_lo, 0);
  const int row0 = blockIdx.y * kRows;

  // the block's prefix keys: K and V rows copied before the wait; rows past the block zeroed (their probabilities
  // are 0, and 0 x a stale NaN would not be)
  const int n_prefix = max(min(k_hi, prefix_len) - k_lo, 0);
#ifndef STEP_ATTN_LEAVE_OUT_KV
  for (int i = tid; i < block * (kD / 8); i += kThreads) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    if (r < n_prefix) {
      cp_async16(ks + r * kRowH + c, k_cache + (k_lo + r) * cache_stride + c);
      cp_async16(vs + r * kRowH + c, v_cache + (k_lo + r) * cache_stride + c);
    } else if (r >= nkeys) {
      *reinterpret_cast<uint4*>(ks + r * kRowH + c) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(vs + r * kRowH + c) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
#endif

  wait_for_inputs();  // the QKV GEMM ahead has written qkv
  if (!early_trigger) launch_dependents();

  // the 16 query rows (RoPE, q scale; rows past `rows` as zeros) and the block's suffix keys (RoPE) and values
  for (int i = tid; i < kRows * (kHalf / 8); i += kThreads) {
    const int r = i / (kHalf / 8), d0 = (i % (kHalf / 8)) * 8;
    const int row = row0 + r;
    if (row < rows) {
      const int tok = row / heads, head = row % heads;
      rope8(qkv + tok * qkv_stride + head * kD, qs + r * kRowH, d0, pos[tok], cos_t, sin_t, q_scale);
    } else {
      *reinterpret_cast<uint4*>(qs + r * kRowH + d0) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(qs + r * kRowH + d0 + kHalf) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  for (int i = tid; i < (nkeys - n_prefix) * (kHalf / 8); i += kThreads) {
    const int r = n_prefix + i / (kHalf / 8), d0 = (i % (kHalf / 8)) * 8;
    const int u = k_lo + r - prefix_len;                                    // the suffix token of key k_lo + r
    const __nv_bfloat16* src = qkv + u * qkv_stride + heads * kD;
    rope8(src, ks + r * kRowH, d0, pos[u], cos_t, sin_t, 1.0f);
    *reinterpret_cast<uint4*>(vs + r * kRowH + d0) = *reinterpret_cast<const uint4*>(src + kD + d0);
    *reinterpret_cast<uint4*>(vs + r * kRowH + d0 + kHalf) = *reinterpret_cast<const uint4*>(src + kD + d0 + kHalf);
  }
  cp_async_wait_all();
  __syncthreads();

  // scores: warp w takes the key n-tiles w, w + 4, ... of the block (each k-step's A fragment loaded once)
  constexpr int kTilesPerWarp = kMaxKeys / 8 / kWarps;
  const int ntiles = block / 8;
  float s[kTilesPerWarp][4];
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
  for (int kk = 0; kk < kD / 16; ++kk) {
    const int c = kk * 16 + 2 * t4;
    uint32_t a[4];
    a[0] = *reinterpret_cast<const uint32_t*>(qs + g * kRowH + c);
    a[1] = *reinterpret_cast<const uint32_t*>(qs + (g + 8) * kRowH + c);
    a[2] = *reinterpret_cast<const uint32_t*>(qs + g * kRowH + c + 8);
    a[3] = *reinterpret_cast<const uint32_t*>(qs + (g + 8) * kRowH + c + 8);
#pragma unroll
    for (int j = 0; j < kTilesPerWarp; ++j) {
      const int nt = warp + j * kWarps;
      if (nt < ntiles) {
        const __nv_bfloat16* krow = ks + (nt * 8 + g) * kRowH + c;
        mma_bf16(s[j], a, *reinterpret_cast<const uint32_t*>(krow), *reinterpret_cast<const uint32_t*>(krow + 8));
      }
    }
  }
  // the masks: past the block, a padded prefix slot, a suffix key the row's token does not see
  const int vis_g = row0 + g < rows ? visible[(row0 + g) / heads] : 0;
  const int vis_g8 = row0 + g + 8 < rows ? visible[(row0 + g + 8) / heads] : 0;
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) {
    const int nt = warp + j * kWarps;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k_lo + nt * 8 + 2 * t4 + (e & 1);
      const int vis = e < 2 ? vis_g : vis_g8;
      bool ok = nt < ntiles && key < k_hi;
      if (ok && key < prefix_len) {
        s[j][e] += bias[key];
      } else if (ok) {
        ok = key - prefix_len < vis;
      }
      if (!ok) s[j][e] = -INFINITY;
    }
  }

  // each row's maximum and sum of exp over the block: a quad of lanes, then the four warps
  float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) {
    m0 = fmaxf(m0, fmaxf(s[j][0], s[j][1]));
    m1 = fmaxf(m1, fmaxf(s[j][2], s[j][3]));
  }
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
  }
  if (t4 == 0) {
    red_max[warp * kRows + g] = m0;
    red_max[warp * kRows + g + 8] = m1;
  }
  __syncthreads();
  m0 = m1 = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    m0 = fmaxf(m0, red_max[w * kRows + g]);
    m1 = fmaxf(m1, red_max[w * kRows + g + 8]);
  }
  const float safe0 = m0 == -INFINITY ? 0.f : m0, safe1 = m1 == -INFINITY ? 0.f : m1;
  float l0 = 0.f, l1 = 0.f;
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) {
    const int nt = warp + j * kWarps;
    if (nt < ntiles) {
      const float p0 = expf(s[j][0] - safe0), p1 = expf(s[j][1] - safe0);
      const float p2 = expf(s[j][2] - safe1), p3 = expf(s[j][3] - safe1);
      l0 += p0 + p1;
      l1 += p2 + p3;
      *reinterpret_cast<uint32_t*>(ps + g * kPRowH + nt * 8 + 2 * t4) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(ps + (g + 8) * kPRowH + nt * 8 + 2 * t4) = pack_bf16(p2, p3);
    }
  }
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  if (t4 == 0) {
    red_sum[warp * kRows + g] = l0;
    red_sum[warp * kRows + g + 8] = l1;
  }
  __syncthreads();
  if (warp == 0 && t4 == 0) {
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      sum0 += red_sum[w * kRows + g];
      sum1 += red_sum[w * kRows + g + 8];
    }
    ml_s[2 * g] = m0;
    ml_s[2 * g + 1] = sum0;
    ml_s[2 * (g + 8)] = m1;
    ml_s[2 * (g + 8) + 1] = sum1;
  }

  // the unnormalized output P @ V: warp w takes the head dims [64 w, 64 w + 64), eight n-tiles
  float acc[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  for (int kk = 0; kk < block / 16; ++kk) {
    const int c = kk * 16 + 2 * t4;
    uint32_t a[4];
    a[0] = *reinterpret_cast<const uint32_t*>(ps + g * kPRowH + c);
    a[1] = *reinterpret_cast<const uint32_t*>(ps + (g + 8) * kPRowH + c);
    a[2] = *reinterpret_cast<const uint32_t*>(ps + g * kPRowH + c + 8);
    a[3] = *reinterpret_cast<const uint32_t*>(ps + (g + 8) * kPRowH + c + 8);
    const __nv_bfloat16* v0 = vs + c * kRowH;                               // key rows c, c + 1, c + 8, c + 9
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int n = warp * 64 + i * 8 + g;
      const uint32_t b0 = pack_bf16(bf16_at(v0 + n), bf16_at(v0 + kRowH + n));
      const uint32_t b1 = pack_bf16(bf16_at(v0 + 8 * kRowH + n), bf16_at(v0 + 9 * kRowH + n));
      mma_bf16(acc[i], a, b0, b1);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int n = warp * 64 + i * 8 + 2 * t4;
    *reinterpret_cast<float2*>(acc_s + g * kD + n) = make_float2(acc[i][0], acc[i][1]);
    *reinterpret_cast<float2*>(acc_s + (g + 8) * kD + n) = make_float2(acc[i][2], acc[i][3]);
  }
#ifndef STEP_ATTN_LEAVE_OUT_MERGE
  cluster_sync();  // every CTA's (max, sum, output) of its key block is in its shared memory

  // CTA `rank` merges rows 2 rank and 2 rank + 1: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c
  {
    const int r = static_cast<int>(rank) * kRowsPerRank + tid / (kThreads / kRowsPerRank);
    const int col = (tid % (kThreads / kRowsPerRank)) * 4;
    float mc[kCluster], lc[kCluster];
    float M = -INFINITY;
#pragma unroll
    for (int c = 0; c < kCluster; ++c) {
      mc[c] = ld_cluster_f32(cluster_addr(ml_s + 2 * r, c));
      lc[c] = ld_cluster_f32(cluster_addr(ml_s + 2 * r + 1, c));
      M = fmaxf(M, mc[c]);
    }
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    float denom = 0.f;
#pragma unroll
    for (int c = 0; c < kCluster; ++c) {
      const float w = mc[c] == -INFINITY ? 0.f : expf(mc[c] - M);
      const float4 a = ld_cluster_f32x4(cluster_addr(acc_s + r * kD + col, c));
      o.x += w * a.x;
      o.y += w * a.y;
      o.z += w * a.z;
      o.w += w * a.w;
      denom += w * lc[c];
    }
    const float inv = 1.f / fmaxf(denom, 1e-30f);
    if (row0 + r < rows) {
      uint2 packed;
      packed.x = pack_bf16(o.x * inv, o.y * inv);
      packed.y = pack_bf16(o.z * inv, o.w * inv);
      *reinterpret_cast<uint2*>(out + (row0 + r) * out_stride + col) = packed;
    }
  }
  cluster_sync();  // no CTA leaves while another still reads its shared memory
#else
  __syncthreads();
  if (row0 + static_cast<int>(rank) * kRowsPerRank < rows) {
    const int r = static_cast<int>(rank) * kRowsPerRank + tid / (kThreads / kRowsPerRank);
    const int col = (tid % (kThreads / kRowsPerRank)) * 4;
    out[(row0 + r) * out_stride + col] = __float2bfloat16(acc_s[r * kD + col]);
  }
#endif
}

}  // namespace

extern "C" {

// The keys one launch serves: P + tokens <= step_attention_max_keys().
int step_attention_max_keys() { return kCluster * kMaxKeys; }

// out (tokens * heads, 256) bf16 = the step attention of the contract above, on `stream`; pdl 1 or 2: launched as
// a programmatic dependent of the kernel before it on the stream (its griddepcontrol.wait then orders the reads of
// qkv), letting the kernel after it launch after that wait (1) or at its start (2, EARLY_TRIGGER). pos int64, visible int32, cos / sin (positions, 128) fp32, bias (>= prefix_len) fp32; the caches' rows and
// qkv's and out's rows 16-byte aligned. Returns a cudaError_t (cudaErrorInvalidValue for shapes out of range).
int step_attention(const void* qkv, long long qkv_stride, const void* k_cache, const void* v_cache,
                   long long cache_stride, const long long* pos, const float* cos_t, const float* sin_t,
                   const float* bias, int prefix_len, const int* visible, int tokens, int heads, float q_scale,
                   void* out, long long out_stride, int pdl, void* stream) {
  if (prefix_len < 1 || tokens < 1 || heads < 1 || prefix_len + tokens > kCluster * kMaxKeys) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaError_t e = cudaFuncSetAttribute(step_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSmemBytes);
  if (e != cudaSuccess) return static_cast<int>(e);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kCluster, (tokens * heads + kRows - 1) / kRows);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = static_cast<cudaStream_t>(stream);
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  e = cudaLaunchKernelEx(&config, step_attention_kernel, static_cast<const __nv_bfloat16*>(qkv), qkv_stride,
                         static_cast<const __nv_bfloat16*>(k_cache), static_cast<const __nv_bfloat16*>(v_cache),
                         cache_stride, pos, cos_t, sin_t, bias, prefix_len, visible, tokens, heads, q_scale,
                         static_cast<__nv_bfloat16*>(out), out_stride, pdl == 2 ? 1 : 0);
  return static_cast<int>(e);
}

}  // extern "C"
