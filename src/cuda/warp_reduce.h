// Sums over the lanes of a warp by shuffles, shared by the kernels that reduce register tiles
// without shared memory (cuda-fused's one-token and register-tile configurations).
#pragma once

#include <cuda_runtime.h>

namespace latentkv::detail {

// One level of a reduce-scatter: lanes that differ in kBit swap halves of v[0 .. 2 kHalf), each
// keeping the half its bit selects plus its partner's copy of it, in v[0 .. kHalf). After levels
// on bits b1 > b2 > ..., lane l holds the sums of the values whose index is the sum of the halves
// its set bits selected (a fixed order: every lane's sums are deterministic).
template <int kHalf, int kBit, int kCount>
__device__ __forceinline__ void reduce_scatter_level(float (&v)[kCount], int lane) {
  static_assert(2 * kHalf <= kCount, "the level's halves lie inside v");
  const bool upper = lane & kBit;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kBit);
  }
}

}  // namespace latentkv::detail
