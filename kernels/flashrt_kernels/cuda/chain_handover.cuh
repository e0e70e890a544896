// The hand-over between the steps of a persistent chain (cuda/streamed_gemm_chain.cu, and cuda/handover_chain.cu,
// which checks and times it alone), one protocol for both:
//   - a step ends with a CTA barrier over the threads that wrote its outputs, then one add_release of 1 by one
//     thread to the chain's counter in global memory (the release at GPU scope is cumulative over the writes the
//     barrier ordered before it);
//   - step s begins with one thread spinning on load_acquire of the counter until it holds s x CTAs, then a CTA
//     barrier, after which every thread reads the outputs of step s - 1 from L2 (ld.global.cg: another SM wrote
//     them during this launch, so a line in this SM's L1 could be stale).
// The launch is cooperative (every CTA resident), so the spin cannot deadlock; the counter is zeroed before it.

#pragma once

#include <stdint.h>

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The spin of step `step` (called by one thread; the caller's CTA barrier follows): every CTA has ended step - 1.
__device__ __forceinline__ void wait_for_step(const unsigned* counter, int step, int ctas) {
  const unsigned target = static_cast<unsigned>(step) * static_cast<unsigned>(ctas);
  while (load_acquire(counter) < target) {
  }
}
