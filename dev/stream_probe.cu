// Probe (not shipped): how fast can one kernel read a weight matrix that the previous calls did
// not read (DeepSeek-V3's kv_b, 33.5 MB), as every weight is read between the layers of a model?
// cuda-mla-decode's stage B and cuBLAS's GEMV both read such a fresh 33.5 MB at ~2.0 TB/s and a
// re-read one at ~2.9 TB/s (docs/perf.md); issue 16's floors assume 4.2 TB/s. This times plain
// read streams with no math, as latentkv-bench times a strategy (a CUDA graph of calls over input
// sets rotated past the L2, replays timed with events, median per call):
//   ldg U=..: every thread issues U 16-byte ld.global.nc loads before folding any (grid-stride),
//             at 1, 2 or 4 blocks of 256 threads per SM;
//   bulk S x KB: one block per SM streams its contiguous slice by cp.async.bulk into a ring of S
//             shared-memory stages (mbarrier per stage), every thread folding each stage.
//   tile frag / line U=..: warps over 8-row x 1 KB tiles in the decode kernels' mma.sync fragment
//             load pattern (8 rows x 64 B per instruction) or 4 rows x 128 B, optionally ("pf")
//             with prefetch.global.L2 of the rest of the tile and of the next tile (stage B's old
//             prefetches: they cost 1.3-9 us of a 9 us fresh stream).
// "fresh" rotates 4 sets (134 MB against a 60 MiB L2), "re-read" uses one set.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        dev/stream_probe.cu -o stream_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/ptx.h"  // the mbarrier helpers
#include "probe_streams.h"
#include "probe_timing.h"

namespace {

using latentkv::detail::expect_bytes;
using latentkv::detail::init_barrier;
using latentkv::detail::publish_barrier_init;
using latentkv::detail::shared_address;
using latentkv::detail::wait_barrier;

constexpr int kThreads = 256;

using probe::load_nc16;
using probe::stream_ldg;

// Warps over 8-row tiles of a [rows, 512] bf16 matrix (1 KB rows, 8 KB per tile), as the decode
// kernels' weight tiles: warp w takes tiles w, w + 8 * gridDim.x, ...; U of a tile's 16 loads per
// thread in flight before any is folded. kLines = false: the mma.sync fragment pattern (thread
// (g = lane / 4, q = lane % 4) reads row g at bytes 16q + 64j: 8 rows x 64 bytes per instruction,
// half of each 128-byte line); true: 8 threads per row (4 rows x 128 bytes per instruction).
// kPrefetch: before a tile's loads, its remaining 128-byte lines (past the first U loads' 64U
// bytes of each row) and the next tile's whole rows go to L2 by prefetch.global.L2, as the
// decode kernels' stage B does.
template <int U, bool kLines, bool kPrefetch = false>
__global__ void __launch_bounds__(kThreads) stream_tile(const char* __restrict__ src, int tiles,
                                                        unsigned* sink) {
  const int lane = threadIdx.x % 32;
  const int stride = gridDim.x * (kThreads / 32);
  unsigned acc = 0;
  for (int tile = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; tile < tiles; tile += stride) {
    const char* base = src + static_cast<size_t>(tile) * 8 * 1024;
    if (kPrefetch) {
      constexpr int kFirstLine = U * 64 / 128, kLeft = 8 - kFirstLine > 0 ? 8 - kFirstLine : 1;
      for (int i = lane; kFirstLine < 8 && i < 8 * kLeft; i += 32) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(base + (i / kLeft) * 1024 +
                                                        (kFirstLine + i % kLeft) * 128));
      }
      if (tile + stride < tiles) {
        const char* next = src + static_cast<size_t>(tile + stride) * 8 * 1024;
        for (int i = lane; i < 64; i += 32) {
          asm volatile("prefetch.global.L2 [%0];\n" ::"l"(next + i * 128));
        }
      }
    }
    for (int j0 = 0; j0 < 16; j0 += U) {
      uint4 v[U];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int j = j0 + k;
        const int off = kLines ? ((lane / 8) + 4 * (j % 2)) * 1024 + 16 * (lane % 8) + 128 * (j / 2)
                               : (lane / 4) * 1024 + 16 * (lane % 4) + 64 * j;
        v[k] = load_nc16(base + off);
      }
#pragma unroll
      for (int k = 0; k < U; ++k) acc ^= probe::fold(v[k]);
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// One block per SM; its slice [slice * b, slice * (b + 1)) of `bytes` (multiples of 16) streamed
// through `stages` buffers of `stage_bytes`.
__global__ void __launch_bounds__(kThreads) stream_bulk(const char* __restrict__ src,
                                                        size_t bytes, int stage_bytes,
                                                        int stages, unsigned* sink) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);  // [stages]
  char* ring = smem + 128;
  const size_t slice = (bytes / gridDim.x + 15) / 16 * 16;
  const size_t begin = slice * blockIdx.x;
  const size_t end = begin + slice < bytes ? begin + slice : bytes;
  const int chunks = begin < end ? static_cast<int>((end - begin + stage_bytes - 1) / stage_bytes)
                                 : 0;
  auto issue = [&](int c) {
    const int s = c % stages;
    const size_t off = begin + static_cast<size_t>(c) * stage_bytes;
    const uint32_t n = static_cast<uint32_t>(end - off < stage_bytes ? end - off : stage_bytes);
    expect_bytes(&bars[s], n);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n" ::"r"(shared_address(ring + static_cast<size_t>(s) * stage_bytes)),
        "l"(src + off), "r"(n), "r"(shared_address(&bars[s]))
        : "memory");
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) init_barrier(&bars[s]);
    publish_barrier_init();
    for (int c = 0; c < stages && c < chunks; ++c) issue(c);
  }
  __syncthreads();
  unsigned acc = 0;
  for (int c = 0; c < chunks; ++c) {
    const int s = c % stages;
    wait_barrier(&bars[s], (c / stages) & 1);
    const uint4* stage = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(s) * stage_bytes);
    const size_t off = begin + static_cast<size_t>(c) * stage_bytes;
    const int vecs = static_cast<int>((end - off < stage_bytes ? end - off : stage_bytes) / 16);
    for (int i = threadIdx.x; i < vecs; i += kThreads) {
      const uint4 v = stage[i];
      acc ^= probe::fold(v);
    }
    __syncthreads();  // every thread is done with stage s before it is refilled
    if (threadIdx.x == 0 && c + stages < chunks) issue(c + stages);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  probe::KvBSets data;
  CK(data.init());
  const size_t bytes = probe::KvBSets::kBytes;
  constexpr int kSets = probe::KvBSets::kSets;
  unsigned* sink = data.sink;
  cudaStream_t stream = data.stream;
  // Median per-call time (us) of a graph of 64 launches over `sets` sets, 21 replays.
  auto time_variant = [&](auto launch, int sets, float* us) -> int {
    return graph_us_per_call(stream, 64, [&](int c) { launch(data.set(c % sets)); }, us);
  };
  auto report = [&](const char* name, auto launch) -> int {
    float fresh = 0, reread = 0;
    if (time_variant(launch, kSets, &fresh) || time_variant(launch, 1, &reread)) return 1;
    CK(cudaGetLastError());
    printf("%-22s fresh %7.2f us %6.0f GB/s   re-read %7.2f us %6.0f GB/s\n", name, fresh,
           bytes / (fresh * 1e3), reread, bytes / (reread * 1e3));
    return 0;
  };
  printf("read streams of %.1f MB, %d SMs\n", bytes / 1e6, sms);
  const size_t n = bytes / 16;
  char name[64];
  for (int per_sm : {1, 2, 4}) {
    const int grid = per_sm * sms;
    snprintf(name, sizeof name, "ldg U=4  %d/SM", per_sm);
    if (report(name, [&](char* p) {
          stream_ldg<4><<<grid, kThreads, 0, stream>>>(reinterpret_cast<uint4*>(p), n, sink);
        }))
      return 1;
    snprintf(name, sizeof name, "ldg U=8  %d/SM", per_sm);
    if (report(name, [&](char* p) {
          stream_ldg<8><<<grid, kThreads, 0, stream>>>(reinterpret_cast<uint4*>(p), n, sink);
        }))
      return 1;
    snprintf(name, sizeof name, "ldg U=16 %d/SM", per_sm);
    if (report(name, [&](char* p) {
          stream_ldg<16><<<grid, kThreads, 0, stream>>>(reinterpret_cast<uint4*>(p), n, sink);
        }))
      return 1;
  }
  const int tiles = static_cast<int>(bytes / (8 * 1024));
  for (int per_sm : {2, 4}) {
    const int grid = per_sm * sms;
    snprintf(name, sizeof name, "tile frag U=4  %d/SM", per_sm);
    if (report(name, [&](char* p) { stream_tile<4, false><<<grid, kThreads, 0, stream>>>(p, tiles, sink); }))
      return 1;
    snprintf(name, sizeof name, "tile frag U=16 %d/SM", per_sm);
    if (report(name, [&](char* p) { stream_tile<16, false><<<grid, kThreads, 0, stream>>>(p, tiles, sink); }))
      return 1;
    snprintf(name, sizeof name, "tile line U=4  %d/SM", per_sm);
    if (report(name, [&](char* p) { stream_tile<4, true><<<grid, kThreads, 0, stream>>>(p, tiles, sink); }))
      return 1;
    snprintf(name, sizeof name, "tile line U=16 %d/SM", per_sm);
    if (report(name, [&](char* p) { stream_tile<16, true><<<grid, kThreads, 0, stream>>>(p, tiles, sink); }))
      return 1;
  }
  for (int per_sm : {2, 4}) {
    const int grid = per_sm * sms;
    snprintf(name, sizeof name, "tile frag U=4 pf %d/SM", per_sm);
    if (report(name, [&](char* p) { stream_tile<4, false, true><<<grid, kThreads, 0, stream>>>(p, tiles, sink); }))
      return 1;
    snprintf(name, sizeof name, "tile frag U=16 pf %d/SM", per_sm);
    if (report(name, [&](char* p) { stream_tile<16, false, true><<<grid, kThreads, 0, stream>>>(p, tiles, sink); }))
      return 1;
  }
  CK(cudaFuncSetAttribute(stream_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  for (int stage_kb : {16, 32}) {
    for (int stages : {4, 6}) {
      const int smem = 128 + stages * stage_kb * 1024;
      if (smem > 200 * 1024) continue;
      snprintf(name, sizeof name, "bulk %d x %d KB", stages, stage_kb);
      if (report(name, [&](char* p) {
            stream_bulk<<<sms, kThreads, smem, stream>>>(p, bytes, stage_kb * 1024, stages,
                                                         sink);
          }))
        return 1;
    }
  }
  return 0;
}
