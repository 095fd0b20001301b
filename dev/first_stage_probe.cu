// Probe (not shipped): what one weight stream of the MLA first stage's size costs as a kernel, with
// no math, timed as latentkv-bench times a strategy (graph of calls over input sets rotated past
// the L2, median per call). Question (issue 16): cuda-mla-decode's V3 kv first stage takes 8.5 us
// at T = 1 (K1 then K2) against a 2.0 us floor for its 8.3 MB; how much of that would a plain read
// of the same bytes, in K1's block shape, already take, and what does a dependent second kernel
// (programmatic launch, as K2) add?
//   empty            one empty kernel of 132 blocks
//   ldg U/SM         grid-stride 16-byte ld.global.nc, U loads per thread in flight
//   k1 shape         blocks of 64 rows x `chunk` columns of a [rows, D] bf16 matrix, warp w rows
//                    8w .. 8w + 7, thread (g, q) row g's 16 bytes at 8q + 32j (K1's pattern), one
//                    float per row written to partials [chunk][rows]
//   + dependent      the same, then a 3-block kernel launched programmatically that waits and
//                    reads every partial of 576 rows (K2's shape, no math)
//   + last block     the same in one kernel: each block's partials, a fence and an arrival; the
//                    last block to arrive sums every row's partials (K2's work, no launch)
//   cluster4 + last  chunks in clusters of 4 along D summed through distributed shared memory
//                    first (7 partials per row at c256), then the same arrival
//   + dep. cluster3  the dependent as a cluster of 3 blocks (K2's cluster_norm launch)
//   + dep. reads     the dependent also reads a fresh 1 KB (gamma, angles) before its wait
//   bulk once        blocks of 1 or 2 per SM each copy their contiguous slice into shared
//                    memory by cp.async.bulk in pieces, all issued at once on one mbarrier
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        dev/first_stage_probe.cu -o first_stage_probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/ptx.h"  // the mbarrier helpers
#include "probe_streams.h"
#include "probe_timing.h"

namespace {

constexpr int kThreads = 256;

__global__ void empty_kernel() {}

using probe::fold;
using probe::load_nc16;
using probe::stream_ldg;

// Thread (g, q)'s reads of weight row `row` over [k_begin, k_end) in K1's pattern (16 bytes at
// 8q + 32j, kLoads in flight), folded and combined over the row's four threads.
template <int kLoads>
__device__ __forceinline__ unsigned read_row_chunk(const uint16_t* __restrict__ w, int row,
                                                   int dim, int k_begin, int k_end, int q) {
  unsigned acc = 0;
  const uint16_t* r = w + static_cast<size_t>(row) * dim;
  for (int k0 = k_begin; k0 < k_end; k0 += kLoads * 32) {
    uint4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int k = k0 + j * 32 + 8 * q;
      v[j] = k < k_end ? load_nc16(r + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) acc ^= fold(v[j]);
  }
  acc ^= __shfl_xor_sync(0xffffffffu, acc, 1);
  return acc ^ __shfl_xor_sync(0xffffffffu, acc, 2);
}

// K1's shape: block (row group x, chunk y); kLoads 16-byte loads per thread per step.
template <int kLoads>
__global__ void __launch_bounds__(kThreads, 2)
    k1_shape(const uint16_t* __restrict__ w, int rows, int dim, int chunk, float* partials) {
  asm volatile("griddepcontrol.launch_dependents;\n");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int row = blockIdx.x * 64 + warp * 8 + g;
  const int k_begin = blockIdx.y * chunk, k_end = min(k_begin + chunk, dim);
  if (row < rows) {
    const unsigned acc = read_row_chunk<kLoads>(w, row, dim, k_begin, k_end, q);
    if (q == 0)
      partials[static_cast<size_t>(blockIdx.y) * rows + row] = __uint_as_float(acc & 0xffff);
  }
}

// K2's shape: block s sums rows [256s, 256s + 256) over the chunks after the wait.
__global__ void __launch_bounds__(kThreads) k2_shape(const float* partials, int rows, int chunks,
                                                     float* out) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int row = blockIdx.x * kThreads + threadIdx.x;
  if (row >= rows) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += partials[static_cast<size_t>(c) * rows + row];
  out[row] = s;
}

// K1's shape with the sums in the same kernel: the last block to arrive (a self-resetting
// counter) sums all rows over the chunks. kCluster > 1: blocks (x, y .. y + kCluster) sum their
// partials through distributed shared memory first, rank 0 writing one partial per cluster.
template <int kLoads, int kCluster>
__global__ void __launch_bounds__(kThreads, 2)
    k1_last(const uint16_t* __restrict__ w, int rows, int dim, int chunk, float* partials,
            unsigned* counter, float* out) {
  namespace cg = cooperative_groups;
  __shared__ float rows_sum[64];
  __shared__ bool last;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int row = blockIdx.x * 64 + warp * 8 + g;
  const int k_begin = blockIdx.y * chunk, k_end = min(k_begin + chunk, dim);
  const unsigned acc = row < rows ? read_row_chunk<kLoads>(w, row, dim, k_begin, k_end, q) : 0u;
  const float value = __uint_as_float(acc & 0xffff);
  int plane = blockIdx.y, planes = gridDim.y;
  if constexpr (kCluster > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    if (q == 0) rows_sum[warp * 8 + g] = value;
    cluster.sync();
    const unsigned rank = cluster.block_rank();
    if (rank == 0 && threadIdx.x < 64) {
      float s = 0.f;
      for (int c = 0; c < kCluster; ++c) s += cluster.map_shared_rank(rows_sum, c)[threadIdx.x];
      const int r = blockIdx.x * 64 + threadIdx.x;
      if (r < rows) partials[static_cast<size_t>(blockIdx.y / kCluster) * rows + r] = s;
    }
    cluster.sync();
    if (rank != 0) return;
    plane = blockIdx.y / kCluster;
    planes = gridDim.y / kCluster;
  } else if (row < rows && q == 0) {
    partials[static_cast<size_t>(plane) * rows + row] = value;
  }
  __threadfence();
  __syncthreads();
  const unsigned blocks = gridDim.x * planes;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == blocks - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    float s = 0.f;
    for (int c = 0; c < planes; ++c) s += __ldcg(partials + static_cast<size_t>(c) * rows + r);
    out[r] = s;
  }
  if (threadIdx.x == 0) *counter = 0u;  // every block has arrived: the next call starts at 0
}

// K2's shape with K2's pre-wait reads (gamma, angles: `fresh` floats from rotated inputs).
__global__ void __launch_bounds__(kThreads) k2_reads(const float* partials, int rows, int chunks,
                                                     const float* fresh, float* out) {
  const float f = fresh[threadIdx.x];
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int row = blockIdx.x * kThreads + threadIdx.x;
  if (row >= rows) return;
  float s = f;
  for (int c = 0; c < chunks; ++c) s += partials[static_cast<size_t>(c) * rows + row];
  out[row] = s;
}

// One bulk round trip per block: its slice of `bytes` in pieces of `piece` bytes, all issued
// by thread 0 at the start on one mbarrier; then every thread reads its share.
__global__ void __launch_bounds__(kThreads) bulk_once(const char* __restrict__ src, size_t bytes,
                                                      int piece, unsigned* sink) {
  using namespace latentkv::detail;
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bar;
  const size_t slice = (bytes / gridDim.x + 15) / 16 * 16;
  const size_t begin = slice * blockIdx.x;
  const size_t end = begin + slice < bytes ? begin + slice : bytes;
  const uint32_t n = begin < end ? static_cast<uint32_t>(end - begin) : 0u;
  if (threadIdx.x == 0) {
    init_barrier(&bar);
    publish_barrier_init();
    expect_bytes(&bar, n);
    for (uint32_t off = 0; off < n; off += piece) {
      const uint32_t len = n - off < static_cast<uint32_t>(piece) ? n - off : piece;
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
          "[%3];\n" ::"r"(shared_address(smem + off)),
          "l"(src + begin + off), "r"(len), "r"(shared_address(&bar))
          : "memory");
    }
  }
  __syncthreads();
  wait_barrier(&bar, 0);
  unsigned acc = 0;
  const uint4* v = reinterpret_cast<const uint4*>(smem);
  for (uint32_t i = threadIdx.x; i < n / 16; i += kThreads) acc ^= v[i].x ^ v[i].w;
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

int run_size(const char* label, int rows, int dim, int sms, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(rows) * dim * 2;
  const int sets = static_cast<int>((size_t{240} << 20) / bytes) + 1;
  char* dev = nullptr;
  CK(cudaMalloc(&dev, bytes * sets));
  CK(cudaMemset(dev, 0x3c, bytes * sets));
  float* partials = nullptr;
  CK(cudaMalloc(&partials, size_t{64} << 20));
  unsigned* sink = nullptr;
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(sink, 0, 64));
  auto report = [&](const char* name, auto launch) -> int {
    float fresh = 0, reread = 0;
    if (graph_us_per_call(stream, 64, [&](int c) { launch(dev + (c % sets) * bytes); }, &fresh) ||
        graph_us_per_call(stream, 64, [&](int) { launch(dev); }, &reread))
      return 1;
    CK(cudaGetLastError());
    printf("%-10s %-28s fresh %6.2f us %5.0f GB/s   re-read %6.2f us\n", label, name, fresh,
           bytes / (fresh * 1e3), reread);
    return 0;
  };
  const size_t n = bytes / 16;
  char name[64];
  if (report("-", [&](char*) { empty_kernel<<<sms, kThreads, 0, stream>>>(); })) return 1;
  for (int per_sm : {1, 2, 4}) {
    snprintf(name, sizeof name, "ldg U=8 %d/SM", per_sm);
    if (report(name, [&](char* p) {
          stream_ldg<8><<<per_sm * sms, kThreads, 0, stream>>>(reinterpret_cast<uint4*>(p), n,
                                                               sink);
        }))
      return 1;
  }
  for (int per_sm : {1, 2}) {
    const int grid = per_sm * sms;
    const size_t slice = (bytes / grid + 15) / 16 * 16;
    if (slice > 200 * 1024) continue;
    CK(cudaFuncSetAttribute(bulk_once, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(slice)));
    for (int piece : {4096, 16384, 65536}) {
      snprintf(name, sizeof name, "bulk once %d/SM %d KB", per_sm, piece / 1024);
      if (report(name, [&](char* p) {
            bulk_once<<<grid, kThreads, slice, stream>>>(p, bytes, piece, sink);
          }))
        return 1;
    }
  }
  const int groups = (rows + 63) / 64;
  for (int chunk : {256, 512, 1024}) {
    const int chunks = (dim + chunk - 1) / chunk;
    snprintf(name, sizeof name, "k1 shape %dx%d c%d", groups, chunks, chunk);
    auto k1 = [&](char* p) {
      k1_shape<8><<<dim3(groups, chunks), kThreads, 0, stream>>>(
          reinterpret_cast<uint16_t*>(p), rows, dim, chunk, partials);
    };
    if (report(name, k1)) return 1;
    snprintf(name, sizeof name, "k1 shape c%d + dependent", chunk);
    if (report(name, [&](char* p) {
          k1(p);
          cudaLaunchAttribute attr{};
          attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr.val.programmaticStreamSerializationAllowed = 1;
          cudaLaunchConfig_t config{};
          config.gridDim = dim3((rows + kThreads - 1) / kThreads);
          config.blockDim = dim3(kThreads);
          config.stream = stream;
          config.attrs = &attr;
          config.numAttrs = 1;
          cudaLaunchKernelEx(&config, k2_shape, static_cast<const float*>(partials), rows, chunks,
                             partials + (size_t{32} << 18));
        }))
      return 1;
    auto dependent = [&](char* p, int cluster, bool reads) {
      k1(p);
      cudaLaunchAttribute attr[2] = {};
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      attr[1].id = cudaLaunchAttributeClusterDimension;
      attr[1].val.clusterDim.x = cluster;
      attr[1].val.clusterDim.y = 1;
      attr[1].val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3((rows + kThreads - 1) / kThreads);
      config.blockDim = dim3(kThreads);
      config.stream = stream;
      config.attrs = attr;
      config.numAttrs = cluster > 1 ? 2 : 1;
      cudaLaunchKernelEx(&config, k2_reads, static_cast<const float*>(partials), rows, chunks,
                         reinterpret_cast<const float*>(p + bytes - 4096),
                         partials + (size_t{32} << 18));
    };
    snprintf(name, sizeof name, "c%d + dep. reads", chunk);
    if (report(name, [&](char* p) { dependent(p, 1, true); })) return 1;
    if ((rows + kThreads - 1) / kThreads == 3) {
      snprintf(name, sizeof name, "c%d + dep. cluster3 reads", chunk);
      if (report(name, [&](char* p) { dependent(p, 3, true); })) return 1;
    }
    snprintf(name, sizeof name, "k1 c%d + last block", chunk);
    if (report(name, [&](char* p) {
          k1_last<8, 1><<<dim3(groups, chunks), kThreads, 0, stream>>>(
              reinterpret_cast<uint16_t*>(p), rows, dim, chunk, partials, sink,
              partials + (size_t{32} << 18));
        }))
      return 1;
    if (chunks % 4 == 0) {
      snprintf(name, sizeof name, "k1 c%d cluster4 + last", chunk);
      if (report(name, [&](char* p) {
            cudaLaunchAttribute attr{};
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = 1;
            attr.val.clusterDim.y = 4;
            attr.val.clusterDim.z = 1;
            cudaLaunchConfig_t config{};
            config.gridDim = dim3(groups, chunks);
            config.blockDim = dim3(kThreads);
            config.stream = stream;
            config.attrs = &attr;
            config.numAttrs = 1;
            cudaLaunchKernelEx(&config, k1_last<8, 4>, reinterpret_cast<const uint16_t*>(p), rows,
                               dim, chunk, partials, sink, partials + (size_t{32} << 18));
          }))
        return 1;
    }
  }
  CK(cudaFree(dev));
  CK(cudaFree(partials));
  CK(cudaFree(sink));
  return 0;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  printf("first-stage streams, %d SMs\n", sms);
  if (run_size("V3 kv", 576, 7168, sms, stream)) return 1;
  if (run_size("V3 q_a+kv", 2112, 7168, sms, stream)) return 1;
  if (run_size("V2L kv", 576, 2048, sms, stream)) return 1;
  return 0;
}
