// The CPU backends' bf16 products on CPUs with AVX512-BF16 (vdpbf16ps: 32 bf16 products summed
// into 16 float32 lanes per instruction, where the widening path does 8 FMAs after two widening
// instructions): cpu-blocked's [k, n] weights and cpu-mla's nn.Linear rows. Why: torch's bf16 CPU
// GEMMs use these instructions, and the widening micro-kernels ran at 0.4-0.7x of them from ~10
// MFLOP up.
//
// Numerics: a product of two bf16 values is exact in float32; vdpbf16ps adds the pair (k, k + 1)
// into the float32 accumulator with round to nearest even, and treats bf16 subnormal inputs and
// float32 subnormal results as zero (as oneDNN's bf16 kernels, torch's CPU path, do). The order of
// the sums depends only on k, so a token tile and the few-token column split give the same bits.
#pragma once

#include <cstdint>

#include "latentkv/latentkv.h"

namespace latentkv::detail {

// Whether cpu-blocked takes the bf16 products below: the CPU runs AVX512-BF16 (checked once) and
// the environment does not cap the instruction set (LATENTKV_CPU_ISA=avx2 selects the widening
// micro-kernels, which every x86-64-v3 CPU runs; the tests use it to cover both paths; other
// values leave the choice to the CPU). Read once, at the first bf16 call.
bool bf16_dot_enabled();
// Whether a cpu-blocked call in `dtype` runs its products on the dot products below.
inline bool bf16_dot_takes(DType dtype) {
  return dtype == DType::kBFloat16 && bf16_dot_enabled();
}

// c[i][0:n] = (accumulate ? c[i][0:n] : 0) + sum_k a[i][k] * w[k * ldw + j]   (i < rows, j < n)
// a: rows bf16 rows of k_len elements (any alignment); w: [k_len, n] bf16, row stride ldw;
// c: rows float32 rows of n contiguous elements. Call only where bf16_dot_enabled().
void gemm_bf16_dot(const uint16_t* const* a, int rows, int64_t k_len, const uint16_t* w,
                   int64_t ldw, int64_t n, float* const* c, bool accumulate);

// sums[i * ld + j] = (accumulate ? sums[i * ld + j] : 0) + sum_k a[i][k] * b[j][k] for i < rows,
// j < cols: both operands rows of k_len bf16 elements contiguous along k (nn.Linear's weights:
// cpu-mla's products), any alignment. Each (i, j) sums its pairs in 16 float32 lanes in k order,
// then the lanes in a fixed order, so its bits depend on k_len and the values only (not on rows,
// cols or the caller's split). Call only where bf16_dot_enabled().
void dot_rows_bf16(const uint16_t* const* a, int rows, const uint16_t* const* b, int cols,
                   int64_t k_len, bool accumulate, float* sums, int64_t ld);

}  // namespace latentkv::detail
