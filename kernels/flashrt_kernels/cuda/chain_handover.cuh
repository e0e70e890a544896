// The hand-over between the steps of a persistent chain (cuda/streamed_gemm_chain.cu, and cuda/handover_chain.cu,
// which checks and times it alone), one protocol for both:
//   - a step ends with a CTA barrier over the threads that wrote its outputs, then one add_release of 1 by one
//     thread to the chain's counter in global memory (the release at GPU scope is cumulative over the writes the
//     barrier ordered before it);
//   - step s begins with one thread spinning on load_acquire of the counter until it holds s x CTAs, then a CTA
//     barrier, after which every thread reads the outputs of step s - 1 from L2 (ld.global.cg: another SM wrote
//     them during this launch, so a line in this SM's L1 could be stale).
// The launch is cooperative (every CTA resident), so the spin cannot deadlock; the counter is zeroed before it
// (resident_ctas and launch_chain below, on the host). The header also holds what both kernels use in clusters.

#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One thread spins with an acquire until the counter holds at least `target`.
__device__ __forceinline__ void wait_until(const unsigned* counter, unsigned target) {
  while (load_acquire(counter) < target) {
  }
}

// The spin of step `step` (called by one thread; the caller's CTA barrier follows): every CTA has ended step - 1.
__device__ __forceinline__ void wait_for_step(const unsigned* counter, int step, int ctas) {
  wait_until(counter, static_cast<unsigned>(step) * static_cast<unsigned>(ctas));
}

// This CTA's rank in its cluster (0 without clusters).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster: the shared-memory writes before it are visible to the loads after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The address in the shared memory of cluster CTA `rank` of what `local` (this CTA's shared memory) is in this one.
__device__ __forceinline__ uint32_t cluster_addr(const void* local, unsigned rank) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}

// Host: the largest cooperative grid of `kernel` with `threads` per CTA and `smem_bytes` of dynamic shared memory
// (the CTAs resident at once on the current device), in clusters of `cluster` CTAs when above 1 (how many such
// clusters fit at once, times their size), or -1 on an error.
template <typename Kernel>
inline int resident_ctas(Kernel kernel, int threads, int smem_bytes, int cluster = 1) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return -1;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess) return -1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes) != cudaSuccess) return -1;
  const int resident = sms * per_sm;
  if (resident < 1 || cluster <= 1) return resident;
  cudaLaunchAttribute shape;  // the cluster shape alone: how many such clusters fit on the device at once
  shape.id = cudaLaunchAttributeClusterDimension;
  shape.val.clusterDim.x = static_cast<unsigned>(cluster);
  shape.val.clusterDim.y = 1;
  shape.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(resident - resident % cluster);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.attrs = &shape;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) return -1;
  return clusters * cluster;
}

// Host: zero the chain's counter, then launch `kernel(args...)` on `stream` as `ctas` cooperative CTAs (in clusters
// of `cluster` when above 1); both go into a CUDA graph when the stream is capturing. Returns the first error.
template <typename... Params, typename... Args>
inline cudaError_t launch_chain(void (*kernel)(Params...), int ctas, int threads, int smem_bytes, int cluster,
                               unsigned* counter, cudaStream_t stream, Args... args) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(counter, 0, sizeof(unsigned), stream);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = cluster > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}
