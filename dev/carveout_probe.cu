// MEASURED 2026-12-07 ~10:35 UTC (session 42, H100; data/h100_session42_2026-12-07.txt): flat, 12.1-12.6 us in every configuration.
// Probe (not shipped): does the L1 left beside shared memory bound a weight stream's loads in
// flight? Session 41 (docs/experiments.md) saw the fused stage A's 30 MB stream go from 15.0 to
// 19.5 us when its kernel preferred the largest shared-memory carveout (L1 ~28 KB), and a kv_b
// stream staged in shared memory by cp.async lose 3.5 us, while a carveout of 32 KB instead of
// 65.5 KB changed nothing. This times a fresh read of V3's kv_b (33.5 MB, 4 sets rotated past the
// L2, graph replay as latentkv-bench) at 2 and 4 blocks of 256 threads per SM while each block
// holds `pad` KB of dynamic shared memory it never touches (the launch asks for the carveout
// percentage that holds exactly those blocks, so the pad sets the L1 the SM keeps):
//   ldg U=..: every thread issues U 16-byte ld.global.nc loads before folding any (the decode
//             kernels' register streams);
//   cp.async U=..: every thread copies U 16-byte vectors into its own slots of the block's
//             shared memory (U x 4 KB a block, beside the pad), waits, and folds them (the staged
//             ring of dev/mla_stage_b_staged_ring.patch, without its MMAs).
// Each line gives the per-block shared memory, the carveout asked for (percent of the SM's
// shared memory), the blocks per SM the occupancy calculator allows at the largest carveout, and
// the time (ncu's "Shared Memory Configuration Size" would confirm the configuration taken). Prediction: ldg flat down to some L1 (the bytes in flight, 2-4 blocks x 256 x U
// x 16 B: 32-256 KB), then slower as the L1 shrinks below them; cp.async likewise, with its
// staging counted twice (the slots and the lines in flight).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        dev/carveout_probe.cu -o carveout_probe && ./carveout_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "cuda/ptx.h"  // copy16_async, wait_async_copies
#include "probe_streams.h"
#include "probe_timing.h"

namespace {

constexpr int kThreads = probe::kStreamThreads;

// The grid-stride stream of probe::stream_ldg with U vectors per thread staged through shared
// memory by cp.async: slot (k, thread) = stage[k * kThreads + threadIdx.x].
template <int U>
__global__ void __launch_bounds__(kThreads)
    stream_cp_async(const uint4* __restrict__ src, size_t n, unsigned* sink) {
  extern __shared__ __align__(16) uint4 stage[];
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  unsigned acc = 0;
  for (size_t base = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; base < n;
       base += stride * U) {
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const size_t i = base + k * stride;
      latentkv::detail::copy16_async(stage + k * kThreads + threadIdx.x, i < n ? src + i : src,
                                     i < n);
    }
    latentkv::detail::wait_async_copies();
#pragma unroll
    for (int k = 0; k < U; ++k) acc ^= probe::fold(stage[k * kThreads + threadIdx.x]);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The launch: `grid` blocks, `smem` bytes of dynamic shared memory, asking for `percent` of the
// SM's shared memory as its carveout.
template <typename Kernel>
cudaError_t launch(Kernel kernel, int grid, size_t smem, unsigned percent, cudaStream_t stream,
                   const uint4* src, size_t n, unsigned* sink) {
  cudaLaunchAttribute carveout{};
  carveout.id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  carveout.val.sharedMemCarveout = percent;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &carveout;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, src, n, sink);
}

}  // namespace

int main() {
  int sms = 0, per_sm_smem = 0, reserved = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&per_sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  CK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0));
  probe::KvBSets data;
  CK(data.init());
  const size_t bytes = probe::KvBSets::kBytes;
  unsigned* sink = data.sink;
  cudaStream_t stream = data.stream;
  const size_t n = bytes / 16;
  printf("fresh reads of %.1f MB, %d SMs, %d KB of shared memory an SM, %d B reserved a block\n",
         bytes / 1e6, sms, per_sm_smem / 1024, reserved);
  printf("%-16s %6s %8s %8s %7s %9s %9s\n", "variant", "per/SM", "smem KB", "carve %", "fit/SM",
         "us", "GB/s");
  auto run = [&](const char* name, auto kernel, int per_sm, size_t smem) -> int {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    int fit = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, smem));
    if (fit < per_sm) return 0;  // the pad does not fit this many blocks: nothing to time
    const size_t need = static_cast<size_t>(per_sm) * (smem + reserved);
    const unsigned percent = static_cast<unsigned>(
        std::min<size_t>(100, (need * 100 + per_sm_smem - 1) / per_sm_smem));
    float us = 0;
    const int grid = per_sm * sms;
    if (graph_us_per_call(stream, 64, [&](int c) {
          (void)launch(kernel, grid, smem, percent, stream,
                       reinterpret_cast<const uint4*>(data.set(c)), n, sink);
        }, &us))
      return 1;
    CK(cudaGetLastError());
    printf("%-16s %6d %8.1f %8u %7d %9.2f %9.0f\n", name, per_sm, smem / 1024.0, percent, fit, us,
           bytes / (us * 1e3));
    return 0;
  };
  const int pads_kb[] = {0, 8, 24, 40, 56, 72, 88, 104};
  for (int per_sm : {2, 4}) {
    for (int pad : pads_kb) {
      const size_t smem = size_t{1024} * pad;
      if (run("ldg U=4", probe::stream_ldg<4>, per_sm, smem) ||
          run("ldg U=16", probe::stream_ldg<16>, per_sm, smem))
        return 1;
    }
    for (int pad : pads_kb) {
      if (run("cp.async U=4", stream_cp_async<4>, per_sm, size_t{1024} * pad + 4 * 4096) ||
          run("cp.async U=12", stream_cp_async<12>, per_sm, size_t{1024} * pad + 12 * 4096))
        return 1;
    }
  }
  return 0;
}
