// Probe (issue 17, written 2026-12-04 for the next device session; not yet run): how fast can one
// SM take in a block's weights? cuda-fused's register-tile configuration (session 19) reads
// ~4.2-4.6 us at 3 tokens whether one block takes ~100 KB or eight blocks take ~58 KB each, and
// the founding case ~6 us with 96 blocks of ~100 KB: the inference is an intake of ~30 GB/s of
// fresh lines per SM. This times, like latentkv-bench (a CUDA graph over sets rotated past the
// L2, median of 21 replays; and one set reused), G blocks of 256 threads that each take in the
// same S bytes (as every block of a founding call takes the same weights) and fold them:
//   ldg      every thread's 16-byte loads issued at once into registers (the one-token kernel)
//   cpasync  16-byte cp.async into shared memory, one wait (the register-tile kernel's w_down)
//   bulk     one thread's cp.async.bulk copies of 4 KB pieces on one mbarrier (the TMA path)
// for S = 12, 24, 48, 96 KB and G = 1, 8, 96. If bulk copies take 96 KB in well under the
// others' time at G = 1 and 8, the register-tile kernel's staging should move to them (and its
// padded rows to a swizzle); if every path is near 30 GB/s a block, only fewer bytes per SM move
// the few-token calls. Each fold is checked on sets of ones (a missed byte reads a wrong sum).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/sm_intake_probe.cu \
//        -o sm_intake_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_timing.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBytes = 96 * 1024;
constexpr int kSetFloats = kMaxBytes / 4;
constexpr int kPiece = 4096;  // bytes per bulk copy

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Every thread folds what it read into one float; thread 0 of block 0 checks nothing: the host
// compares out against the expected sums.
template <int kVectors>
__global__ void __launch_bounds__(kThreads) ldg_kernel(const float4* set, float* out) {
  float4 v[kVectors];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) v[i] = __ldg(set + i * kThreads + threadIdx.x);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) acc += v[i].x + v[i].y + v[i].z + v[i].w;
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

template <int kVectors>
__global__ void __launch_bounds__(kThreads) cpasync_kernel(const float4* set, float* out) {
  extern __shared__ float4 staged[];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int j = i * kThreads + threadIdx.x;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(staged + j)),
                 "l"(set + j)
                 : "memory");
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const float4 v = staged[i * kThreads + (threadIdx.x + 1) % kThreads];  // another thread's
    acc += v.x + v.y + v.z + v.w;
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

template <int kVectors>
__global__ void __launch_bounds__(kThreads) bulk_kernel(const float4* set, float* out) {
  extern __shared__ float4 staged[];
  __shared__ uint64_t bar;
  constexpr uint32_t kBytes = kVectors * kThreads * 16;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_address(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     smem_address(&bar)),
                 "r"(kBytes)
                 : "memory");
    for (uint32_t off = 0; off < kBytes; off += kPiece) {
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
          "[%3];\n" ::"r"(smem_address(reinterpret_cast<char*>(staged) + off)),
          "l"(reinterpret_cast<const char*>(set) + off), "r"(kPiece), "r"(smem_address(&bar))
          : "memory");
    }
  }
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(&bar))
        : "memory");
  }
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const float4 v = staged[i * kThreads + threadIdx.x];
    acc += v.x + v.y + v.z + v.w;
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

template <int kVectors>
int run_size(cudaStream_t stream, const float4* sets, int n_sets, float* out) {
  constexpr int kBytes = kVectors * kThreads * 16;
  static_assert(kBytes <= kMaxBytes && kBytes % kPiece == 0, "whole pieces within a set");
  CK(cudaFuncSetAttribute(cpasync_kernel<kVectors>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kBytes));
  CK(cudaFuncSetAttribute(bulk_kernel<kVectors>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kBytes));
  for (int blocks : {1, 8, 96}) {
    const char* names[3] = {"ldg", "cpasync", "bulk"};
    for (int variant = 0; variant < 3; ++variant) {
      auto launch = [&](const float4* s) {
        if (variant == 0) ldg_kernel<kVectors><<<blocks, kThreads, 0, stream>>>(s, out);
        if (variant == 1) cpasync_kernel<kVectors><<<blocks, kThreads, kBytes, stream>>>(s, out);
        if (variant == 2) bulk_kernel<kVectors><<<blocks, kThreads, kBytes, stream>>>(s, out);
      };
      float fresh = 0, reused = 0;
      if (graph_us_per_call(stream, n_sets, [&](int c) {
            launch(sets + size_t(c) * (kSetFloats / 4));
          }, &fresh) ||
          graph_us_per_call(stream, 64, [&](int) { launch(sets); }, &reused)) {
        return 1;
      }
      CK(cudaStreamSynchronize(stream));
      std::vector<float> host(size_t(blocks) * kThreads);
      CK(cudaMemcpy(host.data(), out, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
      bool ok = true;
      for (float x : host) ok = ok && x == 4.f * kVectors;
      printf("%3d KB  G=%2d  %-8s fresh %6.2f us  one set %6.2f us  (%5.1f GB/s a block fresh)%s\n",
             kBytes / 1024, blocks, names[variant], fresh, reused, kBytes / (fresh * 1e3),
             ok ? "" : "  WRONG FOLD");
    }
  }
  return 0;
}

}  // namespace

int main() {
  constexpr int kSets = 1024;  // 96 MB of sets: past the 60 MiB L2
  float* sets = nullptr;
  CK(cudaMalloc(&sets, size_t{kSets} * kSetFloats * sizeof(float)));
  std::vector<float> ones(size_t{kSets} * kSetFloats, 1.f);
  CK(cudaMemcpy(sets, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
  float* out = nullptr;
  CK(cudaMalloc(&out, 96 * kThreads * sizeof(float)));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  const float4* s = reinterpret_cast<const float4*>(sets);
  printf("per-SM intake: G blocks of %d threads each taking the same S bytes, %d sets rotated\n",
         kThreads, kSets);
  if (run_size<3>(stream, s, kSets, out) || run_size<6>(stream, s, kSets, out) ||
      run_size<12>(stream, s, kSets, out) || run_size<24>(stream, s, kSets, out)) {
    return 1;
  }
  CK(cudaFree(sets));
  CK(cudaFree(out));
  return 0;
}
