// Hand-over chain: the dependency mechanism of the streamed GEMM chain (cuda/streamed_gemm_chain.cu) alone, with
// the activation reads that come with it, as a check of its memory ordering and a measure of its cost.
// kernels/flashrt_kernels/handover_chain.py launches it; docs/performance.md has what it measures.
//
// `steps` dependent steps in one cooperative launch of one CTA per SM. Step s:
//   - waits until every CTA has finished step s - 1 (thread 0 spins with an acquire at GPU scope on one counter in
//     global memory until it holds s * CTAs, then a CTA barrier), as the chain's consumers do;
//   - reads the WHOLE output of step s - 1 (`elems` fp32 values, buffer (s - 1) % 2) from L2 (ld.global.cg, up to
//     kBatch 16-byte loads per thread issued before any is used), as each CTA of the chain reads a GEMM's whole A
//     operand, and counts the values that are not what step s - 1 wrote;
//   - writes its share of step s's output (buffer s % 2: the CTA's contiguous 1 / CTAs of the elements, plain
//     stores), then a CTA barrier and one release add of 1 to the counter by thread 0.
// A step's value at element i is value(s, i) below, exact in fp32, so a read that sees a stale or half-written
// buffer is counted. Buffer s % 2 is rewritten two steps after it was written, when every CTA has finished reading
// it (the wait of step s covers every read of step s - 1), the reuse the chain's residual buffers make.
// `wait_inputs = 0` skips the waits (the reads and writes alone; mismatches are then expected and not a failure).

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 16;  // 16-byte loads per thread in flight at once: 64 KB per CTA per round trip
// Dynamic shared memory the kernel asks for and does not use: more than half an SM's, so that no two CTAs share an
// SM and the grid spreads over the SMs as the chain's does.
constexpr int kSmemBytes = 120 * 1024;

__device__ __forceinline__ float value(unsigned step, unsigned i) {
  return static_cast<float>((step * 7919u + i) % 65521u);
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void __launch_bounds__(kThreads, 1)
    handover_chain_kernel(float* buffers, int elems, int steps, unsigned* counter, unsigned* mismatches,
                          int wait_inputs) {
  const int ctas = gridDim.x, cta = blockIdx.x, tid = threadIdx.x;
  const int quads = elems / 4;                          // elems is a multiple of 4
  const int begin = static_cast<int>(static_cast<long long>(elems) * cta / ctas);
  const int end = static_cast<int>(static_cast<long long>(elems) * (cta + 1) / ctas);
  unsigned bad = 0;
  for (int s = 0; s < steps; ++s) {
    if (s > 0) {
      if (wait_inputs) {
        if (tid == 0) {
          const unsigned target = static_cast<unsigned>(s) * static_cast<unsigned>(ctas);
          while (load_acquire(counter) < target) {
          }
        }
        __syncthreads();
      }
      const float4* src = reinterpret_cast<const float4*>(buffers + static_cast<size_t>((s - 1) % 2) * elems);
      for (int base = tid; base < quads; base += kThreads * kBatch) {
        float4 v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int q = base + b * kThreads;
          if (q < quads) v[b] = __ldcg(src + q);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int q = base + b * kThreads;
          if (q < quads) {
            const unsigned i = 4u * static_cast<unsigned>(q), p = static_cast<unsigned>(s - 1);
            bad += (v[b].x != value(p, i)) + (v[b].y != value(p, i + 1)) + (v[b].z != value(p, i + 2)) +
                   (v[b].w != value(p, i + 3));
          }
        }
      }
    }
    float* dst = buffers + static_cast<size_t>(s % 2) * elems;
    for (int i = begin + tid; i < end; i += kThreads) dst[i] = value(static_cast<unsigned>(s), static_cast<unsigned>(i));
    __syncthreads();  // this CTA's share of step s is written (and its reads of step s - 1 are done)
    if (tid == 0) add_release(counter, 1u);
  }
  if (bad) atomicAdd(mismatches, bad);
}

}  // namespace

extern "C" {

int handover_chain_threads() { return kThreads; }

// CTAs that can be resident at once on the current device (the largest cooperative grid), or -1 on an error.
int handover_chain_max_ctas() {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return -1;
  if (cudaFuncSetAttribute(handover_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
      cudaSuccess)
    return -1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, handover_chain_kernel, kThreads, kSmemBytes) !=
      cudaSuccess)
    return -1;
  return sms * per_sm;
}

// Zero the counter, then launch `steps` steps over two buffers of `elems` fp32 values each (`buffers`: 2 x elems)
// on `stream`, mismatches added into *mismatches. Returns a cudaError_t (0: success).
int handover_chain_launch(void* buffers, int elems, int steps, void* counter, void* mismatches, int wait_inputs,
                          int ctas, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaFuncSetAttribute(handover_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
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
  return cudaLaunchKernelEx(&config, handover_chain_kernel, static_cast<float*>(buffers), elems, steps,
                            static_cast<unsigned*>(counter), static_cast<unsigned*>(mismatches), wait_inputs);
}

const char* handover_chain_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
