// Probe (not shipped, written for issue 17 on 2026-12-01; run in session 8, experiments.md; the
// rt-copy and -pdl variants added on 2026-12-05, session 25, not yet run): what does it cost
// to get the founding case's weights into every block, before any math? cuda-fused's streaming
// grid at the founding case (T=384: 96 token tiles x 2 column halves = 192 blocks) reads the 96 KB
// of weights (w_down [256, 48], [w_up_k | w_up_v] [48, 256], float32) from L2 in every block, all
// blocks in the same order at the same time; copying them into shared memory at kernel start
// instead was slower (6.92 against 6.09 us), and one block per 4-token tile staging all 96 KB took
// 8.8 us (experiments.md). Candidates: the L2 slices serving one line to ~100 SMs at once (same
// address, same moment), which a per-block starting offset would spread, or the bytes per SM, which
// only sharing across a cluster (TMA multicast) reduces. Each variant does no math: it loads what a
// founding call's block needs (its hidden tile and the weights), folds the values into one float
// per thread and writes the block's output tile [tokens, 256] (the call's stores), timed like
// latentkv-bench (a CUDA graph over input sets rotated past the L2, median of 21 replays):
//   empty         the launch floor, G blocks of 256 threads
//   l2            weights from L2 into registers, every block in the same order (the streaming
//                 kernel's traffic without its load batches and reductions)
//   l2-stagger    the same, each block starting its walk at its own offset
//   smem          weights copied into shared memory by cp.async, same order (the prefetch path)
//   smem-stagger  the same, staggered
//   multicast-C   clusters of C blocks; block r bulk-copies its 1/C of the weights into the
//                 shared memory of all C (cp.async.bulk .multicast::cluster, one mbarrier a
//                 block): each weight byte leaves L2 once per cluster
//   rt-copy       the register-tile kernel's own loads (w_down and the hidden tile by cp.async into
//                 its padded layout, its w_up slice into registers, which ptxas issues after the
//                 copies' wait as in that kernel), so that its copy is timed by this harness beside
//                 smem: latentkv-bench read that kernel's loads at 4.1 us past the launch (session
//                 23), ~2 us more than smem here. Unsound (session 27): this variant's fold reads
//                 w_down row tid at stride 52 floats, 4-way bank conflicts on 48 loads a thread,
//                 which the kernel (lanes on rows 32 i + lane, 16-byte reads) does not pay
//   rt-copy-pinned  the same with the w_up loads kept before the wait
//   rt-copy-no-up the same without the w_up registers (what session 23's load probe timed)
//   empty-pdl, rt-copy-pinned-pdl  the empty kernel and rt-copy-pinned launched as programmatic
//                 dependents of the kernel before them (wait, then trigger, at their start; the
//                 form of dev/programmatic_calls.patch): what a call's launch costs when it can
//                 hide behind the call before
// for G = 96, 128, 192 blocks (4, 3, 2 tokens each). Every variant's fold is checked on constant
// inputs (each value 1): a block that missed a byte reads a wrong sum.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/founding_broadcast_probe.cu \
//        -o founding_broadcast_probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_timing.h"

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kTokens = 384;   // the founding case: B=4, S=96
constexpr int kDim = 256;      // D, and also 2N (the output row)
constexpr int kWeightFloats = 256 * 48 + 48 * 256;  // w_down, then [w_up_k | w_up_v]
constexpr int kWeightVectors = kWeightFloats / 4;
constexpr int kWeightBytes = kWeightFloats * 4;     // 96 KB
constexpr int kHiddenFloats = kTokens * kDim;
constexpr int kSetFloats = kWeightFloats + kHiddenFloats;  // weights first, then hidden [T, D]

enum class Walk { kSame, kStagger };

// Weight vector j of a block's walk: the same order everywhere, or rotated by a per-block offset
// (a prime stride, so neighbouring blocks start on different lines and L2 slices).
template <Walk kWalk>
__device__ __forceinline__ int walk(int j) {
  return kWalk == Walk::kSame ? j : (j + static_cast<int>(blockIdx.x) * 97) % kWeightVectors;
}

// The block's hidden tile [tokens, D] folded into acc, then its output tile [tokens, 2N] written.
__device__ __forceinline__ float fold_hidden(const float* set, int tokens, float acc) {
  const float* hidden = set + kWeightFloats + static_cast<int64_t>(blockIdx.x) * tokens * kDim;
  for (int i = threadIdx.x; i < tokens * kDim; i += kThreads) acc += hidden[i];
  return acc;
}
__device__ __forceinline__ void write_tile(float* out, int tokens, float acc) {
  float* tile = out + static_cast<int64_t>(blockIdx.x) * tokens * kDim;
  for (int i = threadIdx.x; i < tokens * kDim; i += kThreads) tile[i] = acc;
}

__global__ void empty_kernel() {}

// Programmatic dependent launch (the -pdl variants below): wait for the previous kernel before
// touching memory, then let the next one launch (dev/programmatic_calls.patch's order).
__device__ __forceinline__ void start_after_previous_kernel() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__global__ void empty_programmatic_kernel() { start_after_previous_kernel(); }

template <Walk kWalk>
__global__ void __launch_bounds__(kThreads) l2_kernel(const float* set, float* out, int tokens) {
  constexpr int kPer = (kWeightVectors + kThreads - 1) / kThreads;  // 24
  const float4* w = reinterpret_cast<const float4*>(set);
  float4 v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = threadIdx.x + k * kThreads;
    v[k] = j < kWeightVectors ? w[walk<kWalk>(j)] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float acc = fold_hidden(set, tokens, 0.f);
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc += v[k].x + v[k].y + v[k].z + v[k].w;
  write_tile(out, tokens, acc);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <Walk kWalk>
__global__ void __launch_bounds__(kThreads) smem_kernel(const float* set, float* out, int tokens) {
  extern __shared__ float4 staged[];  // [kWeightVectors]
  const float4* w = reinterpret_cast<const float4*>(set);
  for (int j = threadIdx.x; j < kWeightVectors; j += kThreads) {
    const int i = walk<kWalk>(j);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(staged + i)),
                 "l"(w + i));
  }
  asm volatile("cp.async.commit_group;\n" ::);
  float acc = fold_hidden(set, tokens, 0.f);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  for (int j = threadIdx.x; j < kWeightVectors; j += kThreads) {
    const float4 x = staged[j];
    acc += x.x + x.y + x.z + x.w;
  }
  write_tile(out, tokens, acc);
}

// The register-tile kernel's loads (src/cuda/fused_fp32_register_tiles.cu at the founding case,
// 256 columns a block): w_down [256, 48] copied by cp.async into shared rows of stride 52, the
// block's hidden tile by cp.async, and (kUp) the lane's 12 rows of its 4-column group of
// [w_up_k | w_up_v] [48, 256] loaded into registers before the wait, as that kernel means to.
// Thread t then folds w_down row t, its hidden values and its w_up registers (48 + 48 + tokens).
// kUp: kNone (no w_up loads), kAsWritten (ptxas moves the LDGs below the copies' wait, as in the
// shipped kernel), kPinned (a use under a condition that never holds keeps them before it, as
// dev/fused_register_tiles_w_up_early.patch does).
// kProgrammatic: launched as a programmatic dependent of the kernel before it
// (dev/programmatic_calls.patch's form), everything after start_after_previous_kernel().
enum class UpLoads { kNone, kAsWritten, kPinned };
template <UpLoads kUp, bool kProgrammatic = false>
__global__ void __launch_bounds__(kThreads) rt_copy_kernel(const float* set, float* out,
                                                           int tokens) {
  if constexpr (kProgrammatic) start_after_previous_kernel();
  constexpr int kRank = 48, kStride = 52, kPieces = kRank / 4, kUpRows = 12;
  extern __shared__ float4 rt_staged[];
  float* w_down = reinterpret_cast<float*>(rt_staged);  // [kDim][kStride]
  float* hidden = w_down + kDim * kStride;                // [tokens][kDim]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float* hidden_g = set + kWeightFloats + static_cast<int64_t>(blockIdx.x) * tokens * kDim;
  for (int i = tid; i < tokens * kDim / 4; i += kThreads) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(hidden + 4 * i)),
                 "l"(hidden_g + 4 * i));
  }
  for (int i = tid; i < kDim * kPieces; i += kThreads) {
    const int row = i / kPieces, piece = i % kPieces;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                     smem_address(w_down + row * kStride + 4 * piece)),
                 "l"(set + row * kRank + 4 * piece));
  }
  asm volatile("cp.async.commit_group;\n" ::);
  float4 u[kUpRows];
  if constexpr (kUp != UpLoads::kNone) {
    const float* w_up = set + kDim * kRank;  // [kRank][256]
    const int group = warp * 8 + lane / 4, slice = lane % 4;
#pragma unroll
    for (int i = 0; i < kUpRows; ++i) {
      u[i] = *reinterpret_cast<const float4*>(w_up + (slice * kUpRows + i) * kDim + 4 * group);
    }
    if (kUp == UpLoads::kPinned && tokens < 0) {
      float any = 0.f;
#pragma unroll
      for (int i = 0; i < kUpRows; ++i) any += u[i].x + u[i].y + u[i].z + u[i].w;
      out[0] = any;
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  float acc = 0.f;
  for (int c = 0; c < kRank; ++c) acc += w_down[tid * kStride + c];
  for (int i = tid; i < tokens * kDim; i += kThreads) acc += hidden[i];
  if constexpr (kUp != UpLoads::kNone) {
#pragma unroll
    for (int i = 0; i < kUpRows; ++i) acc += u[i].x + u[i].y + u[i].z + u[i].w;
  }
  write_tile(out, tokens, acc);
}
constexpr int kRtCopyBytes = (kDim * 52 + kTokens / 96 * kDim) * 4;  // at most 4 tokens a block

// Clusters of kCluster blocks along x. Block r copies bytes [r, r + 1) / kCluster of the weights
// into the same offset of every block's shared memory; each block's mbarrier expects all 96 KB.
template <int kCluster>
__global__ void __launch_bounds__(kThreads)
    multicast_kernel(const float* set, float* out, int tokens) {
  extern __shared__ __align__(128) float4 staged_mc[];  // [kWeightVectors]
  __shared__ __align__(8) uint64_t bar;
  cg::cluster_group cluster = cg::this_cluster();
  const uint32_t bar_addr = smem_address(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster.sync();  // every block's barrier initialized before any copy signals it
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar_addr),
                 "r"(kWeightBytes));
    constexpr int kShare = kWeightBytes / kCluster;  // bytes this block fetches
    constexpr int kChunk = 8192;                     // per bulk copy
    static_assert(kShare % 16 == 0, "whole 16-byte units");
    const uint16_t mask = static_cast<uint16_t>((1u << kCluster) - 1);
    const int begin = static_cast<int>(cluster.block_rank()) * kShare;
    const char* src = reinterpret_cast<const char*>(set);
    const char* dst = reinterpret_cast<const char*>(staged_mc);
    for (int off = begin; off < begin + kShare; off += kChunk) {
      const int bytes = min(kChunk, begin + kShare - off);
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
          " [%0], [%1], %2, [%3], %4;\n" ::"r"(smem_address(dst + off)),
          "l"(src + off), "r"(bytes), "r"(bar_addr), "h"(mask)
          : "memory");
    }
  }
  float acc = fold_hidden(set, tokens, 0.f);
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
      " @!p bra WAIT;\n}\n" ::"r"(bar_addr)
      : "memory");
  for (int j = threadIdx.x; j < kWeightVectors; j += kThreads) {
    const float4 x = staged_mc[j];
    acc += x.x + x.y + x.z + x.w;
  }
  write_tile(out, tokens, acc);
  cluster.sync();  // no block leaves while a copy it issued may still be landing in another
}

__global__ void fill_ones(float* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = 1.f;
  }
}

}  // namespace

int main() {
  // Sets rotated past the L2 (60 MiB on an H200): 3x the L2 of 480 KB sets.
  constexpr int kSets = 384;
  const size_t set_floats = kSetFloats;
  float* sets = nullptr;
  CK(cudaMalloc(&sets, kSets * set_floats * sizeof(float)));
  fill_ones<<<1024, 256>>>(sets, static_cast<int64_t>(kSets * set_floats));
  float* out = nullptr;
  CK(cudaMalloc(&out, size_t{kTokens} * kDim * sizeof(float)));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  CK(cudaFuncSetAttribute(smem_kernel<Walk::kSame>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kWeightBytes));
  CK(cudaFuncSetAttribute(smem_kernel<Walk::kStagger>,
                          cudaFuncAttributeMaxDynamicSharedMemorySize, kWeightBytes));
  for (auto kernel : {rt_copy_kernel<UpLoads::kNone>, rt_copy_kernel<UpLoads::kAsWritten>,
                      rt_copy_kernel<UpLoads::kPinned>, rt_copy_kernel<UpLoads::kPinned, true>}) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRtCopyBytes));
  }
  CK(cudaFuncSetAttribute(multicast_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kWeightBytes));
  CK(cudaFuncSetAttribute(multicast_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kWeightBytes));
  CK(cudaFuncSetAttribute(multicast_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kWeightBytes));
  CK(cudaDeviceSynchronize());

  // Every input value is 1, so every output element of the grid must equal its thread's count.
  // weights: the weight values each thread folds (96 but for rt-copy-no-up's 48).
  auto check = [&](const char* name, int blocks, int tokens, int weights) -> int {
    std::vector<float> host(static_cast<size_t>(kTokens) * kDim);
    CK(cudaMemcpy(host.data(), out, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    // Thread t of a block folded kWeightFloats / kThreads weights (24 vectors: 96 floats) and
    // tokens * kDim / kThreads hidden values, and wrote that sum to tokens * kDim / kThreads
    // elements; so every output element equals 96 + tokens (kDim = kThreads).
    const float expect = static_cast<float>(weights + tokens * kDim / kThreads);
    for (int b = 0; b < blocks; ++b) {
      for (int i = 0; i < tokens * kDim; ++i) {
        const float got = host[static_cast<size_t>(b) * tokens * kDim + i];
        if (got != expect) {
          printf("%s G=%d: block %d element %d = %g, expected %g\n", name, blocks, b, i, got,
                 expect);
          return 1;
        }
      }
    }
    return 0;
  };
  auto measure = [&](const char* name, int blocks, int tokens, auto launch,
                     int weights = kWeightFloats / kThreads) -> int {
    launch(sets);  // one call on set 0, checked
    CK(cudaStreamSynchronize(stream));
    CK(cudaGetLastError());
    if (name[0] != 'e' && check(name, blocks, tokens, weights)) return 1;
    float fresh = 0, reused = 0;
    if (graph_us_per_call(stream, kSets, [&](int c) { launch(sets + size_t(c) * set_floats); },
                          &fresh) ||
        graph_us_per_call(stream, 64, [&](int) { launch(sets); }, &reused)) {
      return 1;
    }
    printf("G=%3d %-14s fresh %6.2f us   one set %6.2f us\n", blocks, name, fresh, reused);
    return 0;
  };

  printf("founding T=%d: %d KB of weights and %d KB of hidden a set, %d sets\n", kTokens,
         kWeightBytes / 1024, kHiddenFloats * 4 / 1024, kSets);
  for (int blocks : {96, 128, 192}) {
    const int tokens = kTokens / blocks;
    auto empty = [&](const float*) { empty_kernel<<<blocks, kThreads, 0, stream>>>(); };
    auto l2 = [&](const float* s) {
      l2_kernel<Walk::kSame><<<blocks, kThreads, 0, stream>>>(s, out, tokens);
    };
    auto l2s = [&](const float* s) {
      l2_kernel<Walk::kStagger><<<blocks, kThreads, 0, stream>>>(s, out, tokens);
    };
    auto sm = [&](const float* s) {
      smem_kernel<Walk::kSame><<<blocks, kThreads, kWeightBytes, stream>>>(s, out, tokens);
    };
    auto sms = [&](const float* s) {
      smem_kernel<Walk::kStagger><<<blocks, kThreads, kWeightBytes, stream>>>(s, out, tokens);
    };
    if (measure("empty", blocks, tokens, empty) || measure("l2", blocks, tokens, l2) ||
        measure("l2-stagger", blocks, tokens, l2s) || measure("smem", blocks, tokens, sm) ||
        measure("smem-stagger", blocks, tokens, sms)) {
      return 1;
    }
    auto rt = [&](auto kernel) {
      return [&, kernel](const float* s) {
        kernel<<<blocks, kThreads, kRtCopyBytes, stream>>>(s, out, tokens);
      };
    };
    if (measure("rt-copy", blocks, tokens, rt(rt_copy_kernel<UpLoads::kAsWritten>)) ||
        measure("rt-copy-pinned", blocks, tokens, rt(rt_copy_kernel<UpLoads::kPinned>)) ||
        measure("rt-copy-no-up", blocks, tokens, rt(rt_copy_kernel<UpLoads::kNone>), 48)) {
      return 1;
    }
    // The same launched as programmatic dependents of the kernel before (each graph node of the
    // previous call's kernel, which triggers at its start).
    const auto programmatic = [&](size_t smem) {  // 0: the empty kernel
      return [&, smem](const float* s) {
        cudaLaunchAttribute attribute{};
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(kThreads);
        config.dynamicSmemBytes = smem;
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = 1;
        if (smem == 0) {
          cudaLaunchKernelEx(&config, empty_programmatic_kernel);
        } else {
          cudaLaunchKernelEx(&config, rt_copy_kernel<UpLoads::kPinned, true>, s, out, tokens);
        }
      };
    };
    if (measure("empty-pdl", blocks, tokens, programmatic(0)) ||
        measure("rt-copy-pinned-pdl", blocks, tokens, programmatic(kRtCopyBytes))) {
      return 1;
    }
    // Cluster sizes that divide the grid, launched with a cluster attribute.
    auto multicast = [&](auto kernel, int cluster) {
      return [&, kernel, cluster](const float* s) {
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(kThreads);
        config.dynamicSmemBytes = kWeightBytes;
        config.stream = stream;
        cudaLaunchAttribute attribute;
        attribute.id = cudaLaunchAttributeClusterDimension;
        attribute.val.clusterDim.x = cluster;
        attribute.val.clusterDim.y = 1;
        attribute.val.clusterDim.z = 1;
        config.attrs = &attribute;
        config.numAttrs = 1;
        cudaLaunchKernelEx(&config, kernel, s, out, tokens);
      };
    };
    if (measure("multicast-2", blocks, tokens, multicast(multicast_kernel<2>, 2)) ||
        measure("multicast-4", blocks, tokens, multicast(multicast_kernel<4>, 4)) ||
        (blocks % 8 == 0 &&
         measure("multicast-8", blocks, tokens, multicast(multicast_kernel<8>, 8)))) {
      return 1;
    }
  }
  CK(cudaFree(sets));
  CK(cudaFree(out));
  return 0;
}
