// cuda-fused's one-token configuration (heuristics.h: fused_use_one_token; D <= 256, R <= 64,
// 16-byte w_down rows): at one or two tokens the founding projection is a chain of dependent
// memory round trips and barriers, not work (dev/founding_chain_probe.cu: one fresh round trip
// over its bytes takes 1.3 us, the streaming configuration 4.6). So the chain is cut to one round
// trip and three barriers:
// - every load at kernel start, into registers: thread d takes hidden[t][d] and row d of w_down
//   (16-byte vectors), and its slice of rows of one w_up column;
// - each block computes the whole latent (w_down is read by every block, from L2 after the
//   first): the products of a warp's 32 rows summed by a reduce-scatter of shuffles (lane l ends
//   with latent columns 2l and 2l + 1 of the warp), then over the 8 warps in shared memory;
// - then its kBlockCols of the 2N [K | V] columns: each thread its row slice of one column, the
//   kSlices slices summed in shared memory, one store per output element.
// Float32 FFMA, float32 sums throughout. Block 0 writes the latent output when asked.
#include <cuda_runtime.h>

#include "cuda/common.h"
#include "cuda/cuda_check.h"
#include "cuda/fused_fp32_one_token.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "cuda/warp_reduce.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

constexpr int kThreads = tiles::kFusedOneTokenMaxModelDim;  // D: one w_down row per thread
constexpr int kWarps = kThreads / 32;
constexpr int kPadded = tiles::kFusedOneTokenMaxRank;  // the reduce-scatter's width: R rounded up
constexpr int kBlockCols = tiles::kFusedOneTokenBlockCols;  // [K | V] columns per block
constexpr int kSlices = kThreads / kBlockCols;              // row slices of the up projection
constexpr int kMaxSliceRows = kPadded / kSlices;            // w_up rows per thread
constexpr int kMaxTokens = tiles::kFusedOneTokenMaxTokens;  // instantiated for 1 and 2
static_assert(kPadded == 64, "reduce_scatter's five levels");
static_assert(kMaxTokens == 2, "run_fused_one_token switches over 1 and 2 tokens");
static_assert(kMaxTokens * kBlockCols <= kThreads, "one thread per output of the block");

// v[0 .. 64) summed over the warp's lanes: lane l ends with the sums of values 2l and 2l + 1 in
// v[0] and v[1] (62 shuffles, five levels).
__device__ __forceinline__ void reduce_scatter(float (&v)[kPadded], int lane) {
  reduce_scatter_level<32, 16>(v, lane);
  reduce_scatter_level<16, 8>(v, lane);
  reduce_scatter_level<8, 4>(v, lane);
  reduce_scatter_level<4, 2>(v, lane);
  reduce_scatter_level<2, 1>(v, lane);
}

// Block b: [K | V] columns b * kBlockCols .. + kBlockCols for kTokens tokens (T = kTokens).
template <int kTokens>
__global__ void __launch_bounds__(kThreads, 1)
    kv_proj_fused_one_token(const __grid_constant__ FusedParamsBase p) {
  start_after_previous_kernel();
  __shared__ float warp_sums[kTokens][kWarps][kPadded];
  __shared__ float latent[kTokens][kPadded];
  __shared__ float up_partial[kTokens][kSlices][kBlockCols];
  const int d = threadIdx.x, lane = d % 32, warp = d / 32;
  const int slice = d / kBlockCols;
  const int col = blockIdx.x * kBlockCols + d % kBlockCols;  // of [K | V], 2N wide
  const int n_cols = p.kv_width;
  const bool col_in = col < 2 * n_cols;
  const bool to_v = col >= n_cols;
  const int n = to_v ? col - n_cols : col;
  const int slice_rows = (p.rank + kSlices - 1) / kSlices;

  // Every load first: hidden[t][d], w_down row d, and rows slice * slice_rows + i of column col.
  float h[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    h[t] = d < p.model_dim
               ? p.hidden[token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) + d]
               : 0.f;
  }
  const float4* w_row = reinterpret_cast<const float4*>(p.w_down + int64_t{d} * p.w_down_stride);
  float4 w[kPadded / 4];
#pragma unroll
  for (int q = 0; q < kPadded / 4; ++q) {
    w[q] = d < p.model_dim && 4 * q < p.rank ? w_row[q] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float* up = to_v ? p.w_up_v : p.w_up_k;
  const int64_t up_stride = to_v ? p.w_up_v_stride : p.w_up_k_stride;
  float u[kMaxSliceRows];
#pragma unroll
  for (int i = 0; i < kMaxSliceRows; ++i) {
    const int r = slice * slice_rows + i;
    u[i] = col_in && i < slice_rows && r < p.rank ? up[r * up_stride + n] : 0.f;
  }

  // Down: a warp's column sums by reduce-scatter, then the warps' sums in shared memory.
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float v[kPadded];
#pragma unroll
    for (int q = 0; q < kPadded / 4; ++q) {
      v[4 * q + 0] = h[t] * w[q].x;
      v[4 * q + 1] = h[t] * w[q].y;
      v[4 * q + 2] = h[t] * w[q].z;
      v[4 * q + 3] = h[t] * w[q].w;
    }
    reduce_scatter(v, lane);
    warp_sums[t][warp][2 * lane] = v[0];
    warp_sums[t][warp][2 * lane + 1] = v[1];
  }
  __syncthreads();
  if (d < p.rank) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) sum += warp_sums[t][k][d];
      latent[t][d] = sum;
      if (blockIdx.x == 0 && p.latent != nullptr) {
        p.latent[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + d] = sum;
      }
    }
  }
  __syncthreads();

  // Up: this thread's rows of its column, then the slices' sums, one store per output.
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxSliceRows; ++i) {
      const int r = slice * slice_rows + i;
      if (i < slice_rows && r < p.rank) acc = fmaf(latent[t][r], u[i], acc);
    }
    up_partial[t][slice][d % kBlockCols] = acc;
  }
  __syncthreads();
  if (d >= kTokens * kBlockCols) return;
  const int t = d / kBlockCols, c = d % kBlockCols;
  const int j = blockIdx.x * kBlockCols + c;
  if (j >= 2 * n_cols) return;
  float sum = 0.f;
#pragma unroll
  for (int s = 0; s < kSlices; ++s) sum += up_partial[t][s][c];
  const int kv = j >= n_cols;
  p.out[out_offset(p, kv, t, j - kv * n_cols)] = sum;
}

}  // namespace

bool fused_one_token_takes(const Problem& p, const Args& a) {
  return fused_use_one_token(p.tokens()) && p.model_dim <= kThreads && p.rank <= kPadded &&
         p.rank % 4 == 0 && is_aligned(a.w_down, 16) &&
         a.w_down_stride_row % 4 == 0;
}

Status run_fused_one_token(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream) {
  FusedParamsBase k;
  copy_fused_args(p, a, k);
  const dim3 blocks(static_cast<unsigned>(ceil_div<int64_t>(2 * p.kv_width(), kBlockCols)));
  constexpr auto kOne = kv_proj_fused_one_token<1>, kTwo = kv_proj_fused_one_token<2>;
  const cudaError_t launched =
      p.tokens() == 1 ? launch_after_previous<kOne>(blocks, kThreads, 0, stream, f.major, k)
                      : launch_after_previous<kTwo>(blocks, kThreads, 0, stream, f.major, k);
  return cuda_status(launched, "kv_proj_fused_one_token launch");
}

}  // namespace latentkv::detail
