// The bf16 tensor-core product of mma.sync and the bf16 pair packing that feeds it, shared by the CUDA C++ kernels
// (cuda/streamed_gemm_chain.cu, cuda/step_attention.cu).
//
// m16n8k16, row.col, fp32 accumulators; with g = lane / 4 and t = lane % 4 a thread holds
//   A (16 x 16): a[0] = A[g][2t, 2t + 1], a[1] = A[g + 8][2t, 2t + 1], a[2] = A[g][2t + 8, 2t + 9],
//                a[3] = A[g + 8][2t + 8, 2t + 9]
//   B (16 x 8):  b0 = B[2t, 2t + 1][g], b1 = B[2t + 8, 2t + 9][g]
//   C (16 x 8):  c[0], c[1] = C[g][2t, 2t + 1], c[2], c[3] = C[g + 8][2t, 2t + 1]
// (each pair of bf16 in one 32-bit register, the lower index in the low half).

#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

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
