// Shared by the dev/ read-stream probes (stream_probe.cu, first_stage_probe.cu): a 16-byte
// non-coherent global load, a fold of loaded vectors into one word (so the loads are kept), and the
// grid-stride plain read stream both probes time as their baseline.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace probe {

constexpr int kStreamThreads = 256;

__device__ __forceinline__ uint4 load_nc16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ unsigned fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Grid-stride read of src [n] 16-byte vectors, U loads per thread in flight before any is folded;
// blocks of kStreamThreads. sink is written only if the fold hits one value (practically never).
template <int U>
__global__ void __launch_bounds__(kStreamThreads)
    stream_ldg(const uint4* __restrict__ src, size_t n, unsigned* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kStreamThreads;
  unsigned acc = 0;
  for (size_t base = blockIdx.x * static_cast<size_t>(kStreamThreads) + threadIdx.x; base < n;
       base += stride * U) {
    uint4 v[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const size_t i = base + k * stride;
      v[k] = i < n ? load_nc16(src + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) acc ^= fold(v[k]);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// What the fresh-stream probes (stream_probe.cu, carveout_probe.cu) read: kSets copies of V3's
// kv_b ([H * 256, R] bf16, 33.5 MB each; four rotate past the L2), a sink word and a stream.
struct KvBSets {
  static constexpr size_t kBytes = size_t{32768} * 512 * 2;
  static constexpr int kSets = 4;
  char* dev = nullptr;
  unsigned* sink = nullptr;
  cudaStream_t stream = nullptr;
  // The first error of the allocations, or cudaSuccess.
  cudaError_t init() {
    cudaError_t e = cudaMalloc(&dev, kBytes * kSets);
    if (e == cudaSuccess) e = cudaMemset(dev, 0x5a, kBytes * kSets);
    if (e == cudaSuccess) e = cudaMalloc(&sink, 64);
    if (e == cudaSuccess) e = cudaStreamCreate(&stream);
    return e;
  }
  char* set(int i) const { return dev + static_cast<size_t>(i % kSets) * kBytes; }
  ~KvBSets() {
    cudaFree(dev);
    cudaFree(sink);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

}  // namespace probe
