// Helpers every CUDA source of latentkv shares, on the host and in kernels: integer rounding,
// pointer alignment, and the element offset of token t = b * S + s in a [B, S, ...] tensor.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LATENTKV_HD __host__ __device__ __forceinline__
#else
#define LATENTKV_HD inline
#endif

namespace latentkv::detail {

template <typename I>
LATENTKV_HD constexpr I ceil_div(I x, I y) {
  return (x + y - 1) / y;
}

template <typename I>
LATENTKV_HD constexpr I round_up(I x, I to) {
  return ceil_div(x, to) * to;
}

inline bool is_aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

// 32-bit token and S where the kernels index with int (the division is cheaper), 64-bit elsewhere.
LATENTKV_HD int64_t token_offset(int token, int seq, int64_t stride_batch, int64_t stride_seq) {
  return (token / seq) * stride_batch + (token % seq) * stride_seq;
}
LATENTKV_HD int64_t token_offset(int64_t token, int64_t seq, int64_t stride_batch,
                                 int64_t stride_seq) {
  return (token / seq) * stride_batch + (token % seq) * stride_seq;
}

}  // namespace latentkv::detail
