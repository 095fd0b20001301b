// EXPERIMENT, not built or shipped (numbers in docs/experiments.md,
// "split-K down projection"): a cluster split-K kernel for cuda-gemm's down GEMM at T <= 32. It
// was slower than cuBLAS at every DeepSeek size measured. Kept for the record; to try it again,
// move it into src/cuda/ with the device helpers of decode_tensor_core.cu (copy16_async,
// load_matrices, mma, from_float) in a shared header, plus cp.async commit/wait_group and an
// ldmatrix.x2.trans wrapper, and call run_down_projection from gemm_cublas.cu.
//
// The down projection for few tokens, latent [T, R] = hidden [T, D] @ w_down [D, R] in bf16/fp16
// (T <= 32), as one split-K kernel over the whole GPU. cuda-gemm runs it in place of cuBLAS's
// GEMM there: cuBLAS covers an M = 1..32, N = 512 GEMM with 8-32 CTAs (0.06-0.25 waves on an
// H200), so at DeepSeek sizes the 2 MB (V2-Lite) or 7 MB (V3) of w_down stream through a few SMs
// at 0.4-1 TB/s, 5.3-7 us per call whichever cuBLASLt algorithm runs (dev/cublaslt_probe.cu,
// docs/experiments.md).
//
// Grid: (R / 32 column tiles) x (up to 8 splits of D), each cluster of CTAs one column tile over
// all of D. A CTA requests all of its rows of w_down [rows, 32] and the matching columns of hidden
// [T, rows] at once (an 8-stage cp.async pipeline of 128-row steps: V3's 896 rows per split are 7),
// multiplies them on tensor cores as they land (mma.sync m16n8k16, float32 accumulation; the
// tokens are the M side, rows past T are zeros; 8 warps = 4 column tiles x 2 row halves of each
// step), and leaves its float32 partial [T, 32] in shared memory. The cluster then sums the
// partials in a fixed order through distributed shared memory (deterministic, no workspace, no
// atomics), each CTA a slice of the elements, and rounds once to the dtype, as cuBLAS does.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "backends.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/kernel_args.h"

namespace latentkv::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kColWarps = 4;    // warps across a CTA's columns, one 8-column MMA tile each
constexpr int kRowWarps = 2;    // warps across each stage's rows (alternate 16-row MMA steps)
constexpr int kThreads = 32 * kColWarps * kRowWarps;
constexpr int kCols = 8 * kColWarps;  // latent columns per CTA
constexpr int kStepRows = 128;  // rows of D per pipeline stage
constexpr int kStages = 8;      // pipeline stages: DeepSeek-V3's split (7 steps) all in flight
constexpr int kMaxSplits = 8;   // CTAs along D per cluster (the portable cluster size)
constexpr int kMaxTokenTiles = 2;  // 16-token MMA tiles: T <= 32
constexpr int kMaxTokens = 16 * kMaxTokenTiles;
constexpr int kVector = 8;      // elements per 16-byte copy
constexpr int kHiddenLd = kStepRows + kVector;  // padded shared rows: the 8 rows one ldmatrix
constexpr int kWeightLd = kCols + kVector;      // phase reads fall in 8 different bank groups
constexpr int kSumLd = kCols + 4;               // float32 partial [T][kCols], padded

template <typename E>
struct DownParams {
  const E* hidden;  // [B, S, D]
  int64_t hidden_stride_batch, hidden_stride_seq;
  const E* w_down;  // [D, R]
  int64_t w_down_stride;
  E* latent;  // [B, S, R]
  int64_t latent_stride_batch, latent_stride_seq;
  int tokens, seq, model_dim, rank;
  int split_rows;   // rows of D per split (a multiple of kStepRows)
  int token_rows;   // T rounded up to 16 (the MMA's M)
};

__host__ __device__ inline int stage_elements(int token_rows) {
  return token_rows * kHiddenLd + kStepRows * kWeightLd;
}

// The pipeline's stages, which the float32 partial sums [token_rows][kSumLd] reuse at the end.
size_t shared_bytes(int token_rows) {
  const size_t pipeline = size_t{kStages} * stage_elements(token_rows) * 2;
  const size_t sums = size_t{1} * token_rows * kSumLd * sizeof(float);
  return std::max(pipeline, sums);
}

template <typename E>
__global__ void __launch_bounds__(kThreads) down_projection_kernel(const DownParams<E> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int64_t token_base[kMaxTokens];  // hidden's element offset of token t
  E* const stages = reinterpret_cast<E*>(smem);
  const int stage_elems = stage_elements(p.token_rows);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col_warp = warp % kColWarps, row_warp = warp / kColWarps;
  const int col0 = blockIdx.x * kCols;
  const int row_begin = blockIdx.y * p.split_rows;
  const int row_end = min(p.model_dim, row_begin + p.split_rows);
  const int steps = (row_end - row_begin + kStepRows - 1) / kStepRows;

  for (int t = threadIdx.x; t < p.tokens; t += kThreads) {
    token_base[t] = token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq);
  }
  // Token rows past T stay zero in every stage (the copies below never write them).
  constexpr int kRowVectors = kStepRows / kVector;
  for (int stage = 0; stage < kStages; ++stage) {
    E* rows = stages + stage * stage_elems + p.tokens * kHiddenLd;
    for (int i = threadIdx.x; i < (p.token_rows - p.tokens) * kRowVectors; i += kThreads) {
      *reinterpret_cast<uint4*>(rows + (i / kRowVectors) * kHiddenLd + (i % kRowVectors) * kVector) =
          uint4{0, 0, 0, 0};
    }
  }
  __syncthreads();

  // Stage `buf` <- hidden [T][kStepRows] and w_down [kStepRows][kCols] of step `step`; zeros
  // past this split's rows and past R.
  auto load_stage = [&](int buf, int step) {
    E* hidden = stages + buf * stage_elems;
    E* weight = hidden + p.token_rows * kHiddenLd;
    const int r0 = row_begin + step * kStepRows;
    for (int i = threadIdx.x; i < p.tokens * kRowVectors; i += kThreads) {
      const int t = i / kRowVectors, c = (i % kRowVectors) * kVector;
      const bool valid = r0 + c < row_end;
      copy16_async(hidden + t * kHiddenLd + c, valid ? p.hidden + token_base[t] + r0 + c : p.hidden,
                   valid);
    }
    constexpr int kColVectors = kCols / kVector;
    for (int i = threadIdx.x; i < kStepRows * kColVectors; i += kThreads) {
      const int r = i / kColVectors, c = (i % kColVectors) * kVector;
      const bool valid = r0 + r < row_end && col0 + c < p.rank;
      const E* src = valid ? p.w_down + static_cast<int64_t>(r0 + r) * p.w_down_stride + col0 + c
                           : p.w_down;
      copy16_async(weight + r * kWeightLd + c, src, valid);
    }
  };

  float acc[kMaxTokenTiles][4] = {};  // [token tile][m16n8 fragment]
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_stage(s, s);
    commit_async_copies();
  }
  for (int step = 0; step < steps; ++step) {
    wait_async_copies_but<kStages - 2>();
    __syncthreads();  // stage `step` visible to all; stage `step - 1` free to refill
    const int next = step + kStages - 1;
    if (next < steps) load_stage(next % kStages, next);
    commit_async_copies();
    const E* hidden = stages + (step % kStages) * stage_elems;
    const E* weight = hidden + p.token_rows * kHiddenLd;
#pragma unroll
    for (int k = row_warp * 16; k < kStepRows; k += 16 * kRowWarps) {
      uint32_t b[2];
      load_matrix_pair_transposed(b, weight + (k + lane % 16) * kWeightLd + col_warp * 8);
#pragma unroll
      for (int mt = 0; mt < kMaxTokenTiles; ++mt) {
        if (mt * 16 >= p.token_rows) break;
        uint32_t a[4];
        load_matrices(a, hidden + (mt * 16 + lane % 16) * kHiddenLd + k + (lane / 16) * 8);
        mma<E>(acc[mt], a, b[0], b[1]);
      }
    }
  }
  wait_async_copies();
  __syncthreads();  // every warp done with the pipeline: its memory becomes the partial sums

  // The CTA's partial [token_rows][kCols]: the first row group of warps stores, the others add.
  float* sums = reinterpret_cast<float*>(smem);
  for (int group = 0; group < kRowWarps; ++group) {
    if (row_warp == group) {
#pragma unroll
      for (int mt = 0; mt < kMaxTokenTiles; ++mt) {
        if (mt * 16 >= p.token_rows) break;
        const int row = mt * 16 + lane / 4, col = col_warp * 8 + 2 * (lane % 4);
        float* at[4] = {&sums[row * kSumLd + col], &sums[row * kSumLd + col + 1],
                        &sums[(row + 8) * kSumLd + col], &sums[(row + 8) * kSumLd + col + 1]};
#pragma unroll
        for (int i = 0; i < 4; ++i) *at[i] = group == 0 ? acc[mt][i] : *at[i] + acc[mt][i];
      }
    }
    __syncthreads();
  }

  // Sum over the cluster's splits in rank order; CTA q of the cluster writes elements q, q + n, ...
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int splits = static_cast<int>(cluster.num_blocks());
  const int rank_in_cluster = static_cast<int>(cluster.block_rank());
  for (int e = rank_in_cluster * kThreads + threadIdx.x; e < p.tokens * kCols;
       e += splits * kThreads) {
    const int t = e / kCols, c = e % kCols;
    if (col0 + c >= p.rank) continue;
    float total = 0.f;
    for (int q = 0; q < splits; ++q) total += cluster.map_shared_rank(sums, q)[t * kSumLd + c];
    p.latent[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + col0 + c] =
        from_float<E>(total);
  }
  cluster.sync();  // no CTA leaves while another still reads its partials
}

// Once per device: both instantiations may use the largest pipeline (T = 32).
struct DownProjectionKernels {
  static Status setup(const DeviceFacts& f) {
    const size_t bytes = shared_bytes(kMaxTokens);
    if (bytes > f.smem_optin) {
      return {StatusCode::kUnsupported, "the down projection kernel needs " +
                                            std::to_string(bytes) + " bytes of shared memory, " +
                                            std::to_string(f.smem_optin) + " available"};
    }
    cudaError_t err = cudaFuncSetAttribute(down_projection_kernel<__nv_bfloat16>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes));
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(down_projection_kernel<__half>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes));
    }
    return cuda_status(err, "cudaFuncSetAttribute(down_projection_kernel)");
  }
};

bool vectors(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename E>
Status launch(const Problem& p, const Args& a, void* latent, int64_t latent_stride_batch,
              int64_t latent_stride_seq, Stream stream) {
  const DeviceFacts* facts = nullptr;
  if (Status queried = prepared_device<DownProjectionKernels>(&facts); !queried.ok()) {
    return queried;
  }
  DownParams<E> k;
  k.hidden = static_cast<const E*>(a.hidden);
  k.hidden_stride_batch = a.hidden_stride_batch;
  k.hidden_stride_seq = a.hidden_stride_seq;
  k.w_down = static_cast<const E*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.latent = static_cast<E*>(latent);
  k.latent_stride_batch = latent_stride_batch;
  k.latent_stride_seq = latent_stride_seq;
  k.tokens = static_cast<int>(p.tokens());
  k.seq = static_cast<int>(p.seq);
  k.model_dim = static_cast<int>(p.model_dim);
  k.rank = static_cast<int>(p.rank);
  k.token_rows = (k.tokens + 15) / 16 * 16;
  const int steps = (k.model_dim + kStepRows - 1) / kStepRows;
  const int steps_per_split = (steps + kMaxSplits - 1) / kMaxSplits;
  k.split_rows = steps_per_split * kStepRows;
  const int splits = (steps + steps_per_split - 1) / steps_per_split;

  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = 1;
  cluster[0].val.clusterDim.y = static_cast<unsigned>(splits);
  cluster[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((k.rank + kCols - 1) / kCols),
                        static_cast<unsigned>(splits));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes(k.token_rows);
  config.stream = stream;
  config.attrs = cluster;
  config.numAttrs = 1;
  return cuda_status(cudaLaunchKernelEx(&config, down_projection_kernel<E>, k),
                     "cudaLaunchKernelEx(down_projection_kernel)");
}

}  // namespace

bool down_projection_fits(const Problem& p, const Args& a) {
  return p.dtype != DType::kFloat32 && p.tokens() <= kMaxTokens &&
         p.model_dim % kVector == 0 && p.rank % kVector == 0 && p.model_dim <= INT_MAX / 2 &&
         p.rank <= INT_MAX / 2 && vectors(a.hidden) && vectors(a.w_down) &&
         a.hidden_stride_seq % kVector == 0 && a.hidden_stride_batch % kVector == 0 &&
         a.w_down_stride_row % kVector == 0;
}

Status run_down_projection(const Problem& p, const Args& a, void* latent,
                           int64_t latent_stride_batch, int64_t latent_stride_seq, Stream stream) {
  if (p.dtype == DType::kBFloat16) {
    return launch<__nv_bfloat16>(p, a, latent, latent_stride_batch, latent_stride_seq, stream);
  }
  return launch<__half>(p, a, latent, latent_stride_batch, latent_stride_seq, stream);
}

}  // namespace latentkv::detail
