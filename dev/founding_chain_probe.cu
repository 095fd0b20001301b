// Probe (not shipped, written for issue 17; not yet run on a GPU): where do the ~4.5 us of a
// one-token founding call go past the ~0.6 us launch? cuda-fused at T=1 takes 5.2 us with inputs
// rotated and 4.1 on one input set, whatever its number of memory round trips or bytes per block
// (docs/experiments.md, issue 17). This times, like latentkv-bench (a CUDA graph of 64 calls over
// input sets rotated past the L2, median of 21 replays), kernels that do no math on the founding
// case's bytes at T=1: hidden [256] + w_down [256, 48] + w_up [48, 128] float32, 97 KB a set:
//   empty      8 blocks of 256 threads, nothing (the launch floor)
//   one trip   8 blocks; every thread issues all of its 16-byte loads at once, folds them and
//              stores one float: the launch, one memory round trip and the stores' drain
//   two trips  the same, but the w_up half is loaded at an offset that depends on the first
//              half's values (always 0): two dependent round trips
//   cluster    one trip in a cluster of 8 blocks, then a cluster barrier and one distributed
//              shared-memory read per thread (the cluster configuration's exchange)
// "fresh" rotates 1024 sets (~100 MB against a 60 MiB L2), "one set" reuses set 0. If fresh one
// trip is already ~4 us, the cold first touch (HBM latency and address translation) is what a
// rotated T=1 call pays, and no kernel structure removes it.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/founding_chain_probe.cu \
//        -o founding_chain_probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "probe_timing.h"

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kBlocks = 8;
constexpr int kSetFloats = 256 + 256 * 48 + 48 * 128;  // hidden, w_down, w_up
constexpr int kSetVectors = kSetFloats / 4;            // 16-byte vectors per set
constexpr int kFirstVectors = (256 + 256 * 48) / 4;    // hidden and w_down
static_assert(kSetFloats % 4 == 0 && (256 + 256 * 48) % 4 == 0, "whole vectors");

__global__ void empty_kernel() {}

// Every thread's vectors of the set, strided over the grid, all loads issued before any is used;
// kTwoTrips loads the w_up part at an offset taken from the first part's fold (0 for the probe's
// data, which the compiler cannot know), so those loads wait for the first round trip.
template <bool kTwoTrips>
__global__ void __launch_bounds__(kThreads) trips_kernel(const float4* set, float* out) {
  constexpr int kPerThread = (kSetVectors + kBlocks * kThreads - 1) / (kBlocks * kThreads);
  const int stride = gridDim.x * kThreads;
  const int first = blockIdx.x * kThreads + threadIdx.x;
  float4 v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {  // hidden and w_down (and w_up in one trip)
    const int i = first + j * stride;
    const bool now = i < (kTwoTrips ? kFirstVectors : kSetVectors);
    v[j] = now ? set[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float acc = 0.f;
  if (kTwoTrips) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) acc += v[j].x + v[j].y + v[j].z + v[j].w;
    const int offset = acc == 12345.f ? 1 : 0;  // 0, but only known once the loads are back
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {  // w_up
      const int i = first + j * stride;
      v[j] = i >= kFirstVectors && i < kSetVectors ? set[i + offset]
                                                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) acc += v[j].x + v[j].y + v[j].z + v[j].w;
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

// One trip, then the cluster's exchange: each block's partial into shared memory, a cluster
// barrier, one read of the next block's partial.
__global__ void __cluster_dims__(kBlocks, 1, 1) __launch_bounds__(kThreads)
    cluster_kernel(const float4* set, float* out) {
  __shared__ float partial[kThreads];
  const int stride = gridDim.x * kThreads;
  float acc = 0.f;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < kSetVectors; i += stride) {
    const float4 v = set[i];
    acc += v.x + v.y + v.z + v.w;
  }
  partial[threadIdx.x] = acc;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const float* next =
      cluster.map_shared_rank(partial, (cluster.block_rank() + 1) % cluster.num_blocks());
  out[blockIdx.x * kThreads + threadIdx.x] = acc + next[threadIdx.x];
  cluster.sync();  // no block leaves while another reads its shared memory
}

}  // namespace

int main() {
  constexpr int kSets = 1024;
  float4* sets = nullptr;
  CK(cudaMalloc(&sets, size_t{kSets} * kSetVectors * sizeof(float4)));
  CK(cudaMemset(sets, 0, size_t{kSets} * kSetVectors * sizeof(float4)));
  float* out = nullptr;
  CK(cudaMalloc(&out, kBlocks * kThreads * sizeof(float)));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  // Median per-call time (us) of a graph of launches over `rotate` sets (one launch per set, past
  // the L2 when rotating; 64 launches on one set), 21 replays.
  auto time_variant = [&](auto launch, int rotate, float* us) -> int {
    const int calls = rotate > 1 ? rotate : 64;
    return graph_us_per_call(
        stream, calls, [&](int c) { launch(sets + size_t(c % rotate) * kSetVectors); }, us);
  };
  auto report = [&](const char* name, auto launch) -> int {
    float fresh = 0, reused = 0;
    if (time_variant(launch, kSets, &fresh) || time_variant(launch, 1, &reused)) return 1;
    CK(cudaGetLastError());
    printf("%-10s fresh %6.2f us   one set %6.2f us\n", name, fresh, reused);
    return 0;
  };
  printf("founding T=1 bytes (%d KB a set), %d sets, %d blocks of %d threads\n",
         kSetFloats * 4 / 1024, kSets, kBlocks, kThreads);
  auto empty = [&](const float4*) { empty_kernel<<<kBlocks, kThreads, 0, stream>>>(); };
  auto one_trip = [&](const float4* s) {
    trips_kernel<false><<<kBlocks, kThreads, 0, stream>>>(s, out);
  };
  auto two_trips = [&](const float4* s) {
    trips_kernel<true><<<kBlocks, kThreads, 0, stream>>>(s, out);
  };
  auto cluster = [&](const float4* s) {
    cluster_kernel<<<kBlocks, kThreads, 0, stream>>>(s, out);
  };
  if (report("empty", empty) || report("one trip", one_trip) || report("two trips", two_trips) ||
      report("cluster", cluster)) {
    return 1;
  }
  CK(cudaFree(sets));
  CK(cudaFree(out));
  return 0;
}
