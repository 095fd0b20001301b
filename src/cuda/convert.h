// Element conversions in kernels: every element type (float, bfloat16, float16) to float for
// arithmetic, and back with round-to-nearest-even (one element, or two adjacent 16-bit ones as one
// 32-bit word).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace latentkv::detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename E>
__device__ __forceinline__ E from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// (a, b) rounded to two adjacent 16-bit elements, a at the lower address.
template <typename E>
__device__ __forceinline__ unsigned pair_from_floats(float a, float b);
template <>
__device__ __forceinline__ unsigned pair_from_floats<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&v);
}
template <>
__device__ __forceinline__ unsigned pair_from_floats<__half>(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&v);
}

}  // namespace latentkv::detail
