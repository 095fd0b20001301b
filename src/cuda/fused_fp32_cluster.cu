// cuda-fused's cluster configuration (sm_90): one thread-block cluster of C blocks (heuristics.h)
// per tile of tokens, each block fetching one slice of the weights, all its loads issued at kernel
// start. The streaming configuration is a chain of dependent memory round trips (hidden and
// w_down, a reduction, the up weights, a second reduction), each block reading the whole weights;
// here a block reads 1/C of them, in one round trip:
//   block b of a cluster: the hidden tile's columns and w_down's rows of D chunk b (cp.async group
//                         0) and [w_up_k | w_up_v]'s column chunk b (group 1),
//   down:  partial_b[t][r] = sum_{d in chunk b} hidden[t][d] * w_down[d][r]   (while chunk b of
//          the up weights lands)
//   cluster barrier; every block sums the C partials through distributed shared memory (the same
//   order everywhere, so every copy of the latent is the same),
//   up:    out[t][j] = sum_r latent[t][r] * w_up[r][j] for j in column chunk b.
// FFMA with float32 accumulation (error ~1e-7 against float64). 16-byte aligned rows only; the
// other configurations in fused_fp32.cu take everything else. cuda-fused launches it past the
// streaming grid's second wave (heuristics.h). Loads are cp.async, 16 bytes per thread and copy:
// bulk copies (cp.async.bulk on mbarriers) measured slower on these 128-256-byte rows
// (docs/experiments.md).
#include "cuda/fused_fp32_cluster.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common.h"
#include "cuda/cuda_check.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

constexpr int kMaxBlocks = tiles::kFusedClusterMaxBlocks;
constexpr int kThreads = tiles::kFusedClusterThreads;
// Floats added to each hidden and latent row in shared memory: the rows of neighbouring token
// groups, read by one warp, then start in different banks.
constexpr int kRowPad = 4;
static_assert(tiles::kFusedClusterReduceFloats >= 16 * kThreads,
              "a split-K pass holds one 4x4 tile per thread");
static_assert(tiles::kFusedClusterMaxTokens % 4 == 0, "tiles are whole 4-token register tiles");

struct ClusterParams : FusedParamsBase {
  int blocks;       // per cluster (the launch's cluster size), <= kMaxBlocks
  int tile_tokens;  // tokens per cluster, a multiple of 4
  int d_chunk;      // rows of D per block: ceil(D / blocks) rounded up to 4
  int col_chunk;    // columns of [K | V] per block: ceil(2N / blocks) rounded up to 4
  bool out_vec4;    // out 16-byte aligned, Dh and its strides multiples of 4
};

// One block's shared memory, in floats (I = int64_t on the host for the fit check, int in the
// kernel). Every offset and row stride is a multiple of 4 floats, so every access is 16 bytes.
template <typename I>
struct ClusterPlan {
  I hidden_ld, latent_ld;
  I hidden, w_down, w_up, partial, latent, reduce, total;
  __host__ __device__ ClusterPlan(I tile_tokens, I d_chunk, I rank, I col_chunk) {
    hidden_ld = d_chunk + kRowPad;
    latent_ld = rank + kRowPad;
    hidden = 0;                                     // [tile_tokens][hidden_ld]
    w_down = hidden + tile_tokens * hidden_ld;      // [d_chunk][R]
    w_up = w_down + d_chunk * rank;                 // [R][col_chunk]
    partial = w_up + rank * col_chunk;              // [tile_tokens][R]: this block's D chunk
    latent = partial + tile_tokens * rank;          // [tile_tokens][latent_ld]
    reduce = latent + tile_tokens * latent_ld;      // [split][rows][cols]
    total = reduce + tiles::kFusedClusterReduceFloats;
  }
};

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// acc (4 tokens x 4 columns) += A[t0.., k] B[k, c..] over the k-quads slice, slice + split, ...
__device__ __forceinline__ void accumulate_tile(float (&acc)[4][4], const float* a, int lda,
                                                const float* b, int ldb, int quads, int slice,
                                                int split) {
#pragma unroll 2
  for (int q = slice; q < quads; q += split) {
    float4 av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = *reinterpret_cast<const float4*>(a + i * lda + 4 * q);
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = *reinterpret_cast<const float4*>(b + (4 * q + j) * ldb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float ai[4] = {av[i].x, av[i].y, av[i].z, av[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[i][0] = fmaf(ai[j], bv[j].x, acc[i][0]);
        acc[i][1] = fmaf(ai[j], bv[j].y, acc[i][1]);
        acc[i][2] = fmaf(ai[j], bv[j].z, acc[i][2]);
        acc[i][3] = fmaf(ai[j], bv[j].w, acc[i][3]);
      }
    }
  }
}

// C[t][c] = sum_k A[t][k] B[k][c] for a rows x cols tile (rows, cols, K multiples of 4), A
// [rows][lda] and B [K][ldb] in shared memory; store(t, c, float4 of C[t][c..c+3]) takes each
// result. Threads own 4x4 register tiles; where there are fewer tiles than threads, K is split
// `split` ways and the partial tiles meet in `reduce` (<= 16 * kThreads floats). Every argument
// is uniform over the block (the split pass holds a __syncthreads).
template <typename Store>
__device__ __forceinline__ void tile_gemm(const float* A, int lda, const float* B, int ldb,
                                          int rows, int cols, int K, float* reduce, Store store) {
  const int tid = threadIdx.x;
  const int col_groups = cols / 4, items = rows / 4 * col_groups, quads = K / 4;
  if (items == 0) return;
  int split = kThreads / items;
  split = split < quads ? split : quads;
  if (split <= 1) {
    for (int item = tid; item < items; item += kThreads) {
      const int t0 = 4 * (item / col_groups), c = 4 * (item % col_groups);
      float acc[4][4] = {};
      accumulate_tile(acc, A + t0 * lda, lda, B + c, ldb, quads, 0, 1);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        store(t0 + i, c, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
      }
    }
    return;
  }
  if (tid < items * split) {
    const int item = tid % items, slice = tid / items;
    const int t0 = 4 * (item / col_groups), c = 4 * (item % col_groups);
    float acc[4][4] = {};
    accumulate_tile(acc, A + t0 * lda, lda, B + c, ldb, quads, slice, split);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      *reinterpret_cast<float4*>(reduce + (slice * rows + t0 + i) * cols + c) =
          make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
  }
  __syncthreads();
  for (int q = tid; q < rows * col_groups; q += kThreads) {
    const int t = q / col_groups, c = 4 * (q % col_groups);
    float4 sum = *reinterpret_cast<const float4*>(reduce + t * cols + c);
    for (int s = 1; s < split; ++s) {
      sum = add4(sum, *reinterpret_cast<const float4*>(reduce + (s * rows + t) * cols + c));
    }
    store(t, c, sum);
  }
}

// Loads: cp.async, 16 bytes per thread and copy, in two commit groups.
__global__ void __launch_bounds__(kThreads)
    kv_proj_fused_cluster_sm90(const __grid_constant__ ClusterParams p) {
#if LATENTKV_SM90
  start_after_previous_kernel();
  extern __shared__ float4 smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);
  const int R = p.rank, N = p.kv_width, tid = threadIdx.x;
  const ClusterPlan<int> plan(p.tile_tokens, p.d_chunk, R, p.col_chunk);
  float* hidden_s = smem + plan.hidden;    // [tile_tokens][hidden_ld]: this block's D chunk
  float* w_down_s = smem + plan.w_down;    // [d_chunk][R]
  float* w_up_s = smem + plan.w_up;        // [R][col_chunk]
  float* partial_s = smem + plan.partial;  // [tile_tokens][R]
  float* latent_s = smem + plan.latent;    // [tile_tokens][latent_ld]
  float* reduce_s = smem + plan.reduce;

  const uint32_t me = cluster_block_rank();
  const int token0 = (blockIdx.x / p.blocks) * p.tile_tokens;
  const int live = min(p.tile_tokens, p.tokens - token0);  // tokens of this tile below T
  const int rows = (live + 3) / 4 * 4;                      // rows past `live` are zeros
  const int d0 = static_cast<int>(me) * p.d_chunk;
  const int d_live = max(0, min(p.d_chunk, p.model_dim - d0));
  const int c0 = static_cast<int>(me) * p.col_chunk;
  const int c_live = max(0, min(p.col_chunk, 2 * N - c0));

  {
    // Group 0: the hidden tile's D chunk and w_down's rows of it.
    const int quads = d_live / 4;
    for (int i = tid; i < rows * quads; i += kThreads) {
      const int t = i / quads, q = i - t * quads;
      const bool valid = t < live;
      const float* src =
          valid ? p.hidden + token_offset(token0 + t, p.seq, p.hidden_stride_batch,
                                          p.hidden_stride_seq) + d0 + 4 * q
                : p.hidden;
      copy16_async(hidden_s + t * plan.hidden_ld + 4 * q, src, valid);
    }
    const int row_quads = R / 4;
    for (int i = tid; i < d_live * row_quads; i += kThreads) {
      const int k = i / row_quads, q = i - k * row_quads;
      copy16_async(w_down_s + k * R + 4 * q, p.w_down + (d0 + k) * p.w_down_stride + 4 * q, true);
    }
    commit_copies();
    // Group 1: this block's columns of [w_up_k | w_up_v] (N % 4 == 0: a quad lies in one half).
    const int up_quads = c_live / 4;
    for (int i = tid; i < R * up_quads; i += kThreads) {
      const int k = i / up_quads, j = c0 + 4 * (i - k * up_quads);
      const float* src = j < N ? p.w_up_k + k * p.w_up_k_stride + j
                               : p.w_up_v + k * p.w_up_v_stride + (j - N);
      copy16_async(w_up_s + k * p.col_chunk + (j - c0), src, true);
    }
    commit_copies();
    wait_copies<1>();
  }
  __syncthreads();

  tile_gemm(hidden_s, plan.hidden_ld, w_down_s, R, rows, R, d_live, reduce_s,
            [&](int t, int c, float4 v) { *reinterpret_cast<float4*>(partial_s + t * R + c) = v; });
  wait_copies<0>();
  // Every block's partial (and this block's up weights) complete and visible cluster-wide.
  cluster_arrive();
  cluster_wait();

  const int row_quads = R / 4;
  for (int q = tid; q < rows * row_quads; q += kThreads) {
    const int t = q / row_quads, c = 4 * (q - t * row_quads);
    float4 sum = load_cluster_shared(partial_s + t * R + c, 0);
    for (uint32_t b = 1; b < static_cast<uint32_t>(p.blocks); ++b) {
      sum = add4(sum, load_cluster_shared(partial_s + t * R + c, b));
    }
    *reinterpret_cast<float4*>(latent_s + t * plan.latent_ld + c) = sum;
    if (p.latent != nullptr && t < live && static_cast<uint32_t>(q % p.blocks) == me) {
      float* dst = p.latent +
                   token_offset(token0 + t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + c;
      dst[0] = sum.x;
      dst[1] = sum.y;
      dst[2] = sum.z;
      dst[3] = sum.w;
    }
  }
  cluster_arrive();  // this block has read the others' partials; they may exit after the wait
  __syncthreads();

  tile_gemm(latent_s, plan.latent_ld, w_up_s, p.col_chunk, rows, c_live, R, reduce_s,
            [&](int t, int c, float4 v) {
              if (t >= live) return;
              const int j = c0 + c, kv = j >= N, n = j - kv * N;
              float* row = p.out + kv * p.out_stride_kv +
                           token_offset(token0 + t, p.seq, p.out_stride_batch, p.out_stride_seq);
              if (p.out_vec4) {
                *reinterpret_cast<float4*>(row + (n / p.head_dim) * p.out_stride_head +
                                           n % p.head_dim) = v;
              } else {
                const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  row[((n + i) / p.head_dim) * p.out_stride_head + (n + i) % p.head_dim] = e[i];
                }
              }
            });
  cluster_wait();
#endif
}

struct ClusterKernels {
  static Status setup(const DeviceFacts& f) {
    return cuda_status(cudaFuncSetAttribute(kv_proj_fused_cluster_sm90,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(f.smem_optin)),
                       "cudaFuncSetAttribute(kv_proj_fused_cluster_sm90, "
                       "MaxDynamicSharedMemorySize)");
  }
};

int64_t chunk(int64_t extent, int blocks) {
  return round_up<int64_t>(ceil_div<int64_t>(extent, blocks), 4);
}

int64_t plan_bytes(const Problem& p, int64_t tile_tokens, int blocks) {
  const ClusterPlan<int64_t> plan(tile_tokens, chunk(p.model_dim, blocks), p.rank,
                                  chunk(2 * p.kv_width(), blocks));
  return plan.total * static_cast<int64_t>(sizeof(float));
}

}  // namespace

bool fused_cluster_takes(const Problem& p, const Args& a, const DeviceFacts& f) {
  if (f.major < 9 || compiled_arch<kv_proj_fused_cluster_sm90>() < 90) return false;
  if (!fused_rows_16_bytes(p, a)) return false;
  const int blocks = fused_cluster_blocks(p.tokens());
  const int64_t tile = fused_cluster_tile_tokens(p.tokens(), blocks, f.sm_count);
  return plan_bytes(p, tile, blocks) <= static_cast<int64_t>(f.smem_optin);
}

Status run_fused_cluster(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream) {
  return run_fused_cluster(p, a, f, stream, fused_cluster_blocks(p.tokens()));
}

Status run_fused_cluster(const Problem& p, const Args& a, const DeviceFacts& f,
                         Stream stream, int blocks) {
  if (blocks < 1 || blocks > kMaxBlocks) {
    return {StatusCode::kInvalidArgument, "cuda-fused cluster size blocks = " +
                                              std::to_string(blocks) + " is outside 1.." +
                                              std::to_string(kMaxBlocks)};
  }
  if (Status s = prepare<ClusterKernels>(f); !s.ok()) return s;
  ClusterParams k;
  copy_fused_args(p, a, k);
  const int64_t tile = fused_cluster_tile_tokens(p.tokens(), blocks, f.sm_count);
  k.blocks = blocks;
  k.tile_tokens = static_cast<int>(tile);
  k.d_chunk = static_cast<int>(chunk(p.model_dim, blocks));
  k.col_chunk = static_cast<int>(chunk(2 * p.kv_width(), blocks));
  k.out_vec4 = fused_out_16_bytes(p, a);

  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(blocks);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(p.tokens(), tile) * blocks));
  return cuda_status(
      launch_after_previous<kv_proj_fused_cluster_sm90>(
          grid, kThreads, static_cast<size_t>(plan_bytes(p, tile, blocks)), stream, f.major, k,
          &cluster),
      "kv_proj_fused_cluster_sm90 launch");
}

}  // namespace latentkv::detail
