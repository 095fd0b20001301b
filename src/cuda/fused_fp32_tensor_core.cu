// cuda-fused's tensor-core configuration (heuristics.h: fused_use_tensor_core; D <= 256, R <= 64,
// 16-byte rows, sm_80 code): the founding projection on mma.sync m16n8k8 in 3xTF32, float32 to
// ~1e-6.
//
// The FFMA configurations are instruction-bound chains (ncu: ~1,400 warp instructions per warp at
// ~8 cycles each, FFMA 14% of them). Here each MMA does 1,024 multiply-adds, and the operands come
// from shared memory at immediate offsets, so a warp's chain is a few hundred instructions. It
// pays where ~70-132 token tiles cover the SMs once (inside the cluster configuration's region):
// with fewer tiles, every block's copy of all of w_down bounds it, and each further tile per
// block adds its whole chain (~3 us), where the cluster and resident FFMA configurations are
// faster:
// - the block stages its inputs with cp.async at kernel start, in two groups: the token tile's
//   hidden rows and w_down whole (the down product's), then its columns of [w_up_k | w_up_v] (the
//   up product's, in flight during the down product); rows are padded so every fragment read is
//   free of bank conflicts, and everything outside the matrices is zero-filled;
// - the product runs transposed, tokens as the MMA's N (8 per tile): latent^T[R][8] = w_down^T @
//   hidden^T, then [K | V]^T[2N][8] = [w_up_k | w_up_v]^T @ latent^T, the weights the A operand;
// - each of the 16 warps takes rows [16 w, 16 w + 16) of w_down (its K slice of the down product,
//   all of R) and one 16-column tile of the block's [K | V] columns (the up product, all of R);
// - the warps' down partials meet in shared memory (one barrier), are summed into the latent tile
//   (a second barrier), and feed the up product, whose accumulators are stored to K and V.
// 3xTF32: each float32 x is big (x truncated to tf32) plus small (x - big), and a * b is taken as
// small(a) big(b) + big(a) small(b) + big(a) big(b) (the small * small term is below float32's
// rounding), accumulated in float32 by the tensor cores. Fragment column c of K step s is row
// 8 s + c of the warp's slice (the kernel's comments give each lane's reads).
//
// A block takes one token tile (blockIdx.x; the heuristics keep the grid within one wave) and
// gridDim.y of them share its up product (up_tiles_per_block of the 16-column tiles each,
// heuristics.h), each recomputing the tile's latent.
#include <cuda_runtime.h>

#include "cuda/common.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/fused_fp32_tensor_core.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

constexpr int kThreads = tiles::kFusedTcThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kTokens = tiles::kFusedTcTokens;                 // the MMA's N
constexpr int kWarpRows = tiles::kFusedTcMaxModelDim / kWarps;  // w_down rows per warp: 16
constexpr int kDownSteps = kWarpRows / 8;                       // K steps of 8 per warp: 2
constexpr int kMaxRank = tiles::kFusedTcMaxRank;
constexpr int kDownTiles = kMaxRank / 16;  // latent rows in 16-row MMA tiles: at most 4
constexpr int kUpSteps = kMaxRank / 8;     // K steps of the up product: at most 8
// Row strides of the staged tiles, in floats. An A fragment read puts lane (g, q) at row q,
// column g (plus constants), so a stride of 8 or 24 mod 32 spreads the 32 lanes over the 32
// banks; the B reads put it at row g, column q, so those strides are 4 mod 32.
constexpr int kLatentStride = kMaxRank + 4;
// The static shared memory: the partials and the latent tile.
constexpr int kStaticSmemBytes =
    static_cast<int>(sizeof(float)) * (kWarps * kTokens * kMaxRank + kTokens * kLatentStride);
static_assert(kTokens == 8 && kWarpRows == 16, "the fragment maps assume m16n8k8 and 16 rows");
static_assert(tiles::kFusedTcMaxUpTilesPerBlock == kWarps, "a block's up tiles: one per warp");
static_assert(kLatentStride % 32 == 4, "B reads of the latent tile conflict-free");

struct TcParams : FusedParamsBase {
  int up_tiles;            // ceil(2N / 16): the 16-column tiles of [K | V]
  int up_tiles_per_block;  // of them, per block (gridDim.y = ceil(up_tiles / this))
};

// The dynamic shared memory of a block, in floats: w_down [round_up(D, 16)][rank_stride], the
// block's [K | V] columns [round_up(R, 8)][column_stride], the hidden tile [8][hidden_stride].
// Everything a fragment reads outside the matrices is zero-filled.
struct TcPlan {
  int down_rows, rank_cols, rank_stride;  // w_down rows staged (zeros past D), columns (past R)
  int up_rows, up_cols, column_stride;    // [K | V] rows staged (zeros past R), columns per block
  int hidden_cols, hidden_stride;         // hidden columns staged (zeros past D)
  int w_up, hidden, total;                // offsets of the second and third tiles; size
  __host__ __device__ TcPlan(int d, int r, int up_tiles_per_block) {
    down_rows = round_up(d, 16);
    rank_cols = round_up(r, 16);
    rank_stride = rank_cols + 8;  // a multiple of 16 plus 8: 8 or 24 mod 32
    up_rows = round_up(r, 8);
    up_cols = 16 * up_tiles_per_block;
    column_stride = up_cols + 8;
    hidden_cols = down_rows;
    hidden_stride = round_up(d, 32) + 4;
    w_up = down_rows * rank_stride;
    hidden = w_up + up_rows * column_stride;
    total = hidden + kTokens * hidden_stride;
  }
  size_t bytes() const { return sizeof(float) * static_cast<size_t>(total); }
};

// acc += a @ b in 3xTF32 for one 16 x 8 x 8 step (ptx.h), one accumulator.
__device__ __forceinline__ void mma_3xtf32(float (&acc)[4], const float (&a)[4], Split b0,
                                           Split b1) {
  mma_3xtf32(acc, acc, acc, SplitA(a), b0, b1);
}

// The token tile's hidden rows into shared memory (part of the caller's cp.async group): rows past
// T and columns past D as zeros. Two warps a row, 16 bytes a lane.
__device__ __forceinline__ void stage_hidden(const TcParams& p, const TcPlan& plan, float* hidden,
                                             int token0, int warp, int lane) {
  for (int t = warp / 2; t < kTokens; t += kWarps / 2) {
    const int token = token0 + t;
    const bool live = token < p.tokens;
    const float* row =
        p.hidden +
        (live ? token_offset(token, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) : 0);
    for (int c = 4 * (lane + 32 * (warp % 2)); c < plan.hidden_cols; c += 256) {
      const bool valid = live && c < p.model_dim;
      copy16_async(hidden + t * plan.hidden_stride + c, valid ? row + c : p.hidden, valid);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    kv_proj_fused_3xtf32(const __grid_constant__ TcParams p) {
  start_after_previous_kernel();
  __shared__ float partial[kWarps][kTokens][kMaxRank];  // the warps' down partials [token][r]
  __shared__ float latent[kTokens][kLatentStride];      // the tile's latent [token][r]
  extern __shared__ float4 smem_tc[];
  const TcPlan plan(p.model_dim, p.rank, p.up_tiles_per_block);
  float* w_down_s = reinterpret_cast<float*>(smem_tc);  // [down_rows][rank_stride]
  float* w_up_s = w_down_s + plan.w_up;                 // [up_rows][column_stride]
  float* hidden_s = w_down_s + plan.hidden;             // [kTokens][hidden_stride]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // the MMA fragments' row group and column
  const int D = p.model_dim, R = p.rank, N = p.kv_width;
  const int down_tiles = (R + 15) / 16, up_steps = (R + 7) / 8;
  const bool warp_has_rows = warp * kWarpRows < D;
  const int live_warps = (D + kWarpRows - 1) / kWarpRows;
  const int column0 = blockIdx.y * plan.up_cols;  // the block's first column of [K | V]

  // Group 0: the tile's hidden rows and w_down (two rows a warp, 16 bytes a lane).
  const int token0 = blockIdx.x * kTokens;
  stage_hidden(p, plan, hidden_s, token0, warp, lane);
  for (int k = 2 * warp + lane / 16; k < plan.down_rows; k += 2 * kWarps) {
    const int c = 4 * (lane % 16);
    if (c >= plan.rank_cols) continue;
    const bool valid = k < D && c < R;
    copy16_async(w_down_s + k * plan.rank_stride + c,
                 valid ? p.w_down + k * p.w_down_stride + c : p.w_down, valid);
  }
  commit_copies();
  // Group 1: the block's columns of [w_up_k | w_up_v] (a row a warp), in flight during the down
  // product.
  for (int r = warp; r < plan.up_rows; r += kWarps) {
    for (int c = 4 * lane; c < plan.up_cols; c += 128) {
      const int j = column0 + c;
      const bool valid = r < R && j < 2 * N;  // N % 4 == 0: a vector lies in K or in V
      const float* src = j < N ? p.w_up_k + r * p.w_up_k_stride + j
                               : p.w_up_v + r * p.w_up_v_stride + (j - N);
      copy16_async(w_up_s + r * plan.column_stride + c, valid ? src : p.w_up_k, valid);
    }
  }
  commit_copies();

  // Where this warp's up accumulators go: out's offset of column j = column0 + 16 warp + g (+ 8),
  // -1 past 2N or for a warp without a tile.
  const bool up_live = warp < p.up_tiles_per_block && column0 / 16 + warp < p.up_tiles;
  int64_t column_offset[2];
#pragma unroll
  for (int low = 0; low < 2; ++low) {
    const int j = column0 + 16 * warp + gid + 8 * low;
    const int kv = j >= N, n = j - kv * N;
    column_offset[low] =
        up_live && j < 2 * N
            ? kv * p.out_stride_kv + int64_t{n / p.head_dim} * p.out_stride_head + n % p.head_dim
            : -1;
  }
  wait_copies<1>();
  __syncthreads();

  // Down: latent^T[r][token] over this warp's 16 rows of D. Step s, fragment column c is row
  // 16 warp + 8 s + c: lane (g, q) reads A (w_down^T) at rows q, q + 4 and latent rows g, g + 8
  // of each 16-row tile t, and B (hidden^T) at token g.
  if (warp_has_rows) {
    float down[kDownTiles][4] = {};
    const float* a_rows = w_down_s + (kWarpRows * warp + tig) * plan.rank_stride + gid;
    const float* b_row = hidden_s + gid * plan.hidden_stride + kWarpRows * warp + tig;
#pragma unroll
    for (int s = 0; s < kDownSteps; ++s) {
      const Split b0 = split_tf32(b_row[8 * s]), b1 = split_tf32(b_row[8 * s + 4]);
      const float* row0 = a_rows + 8 * s * plan.rank_stride;
      const float* row4 = row0 + 4 * plan.rank_stride;
#pragma unroll
      for (int t = 0; t < kDownTiles; ++t) {
        if (t >= down_tiles) continue;
        const float a[4] = {row0[16 * t], row0[16 * t + 8], row4[16 * t], row4[16 * t + 8]};
        mma_3xtf32(down[t], a, b0, b1);
      }
    }
#pragma unroll
    for (int t = 0; t < kDownTiles; ++t) {
      if (t >= down_tiles) continue;
      const int r = 16 * t + gid;
      partial[warp][2 * tig][r] = down[t][0];
      partial[warp][2 * tig + 1][r] = down[t][1];
      partial[warp][2 * tig][r + 8] = down[t][2];
      partial[warp][2 * tig + 1][r + 8] = down[t][3];
    }
  }
  wait_copies<0>();  // the [K | V] columns
  __syncthreads();

  // The latent tile: the live warps' partials summed; rows past R are zeros for the up product.
  for (int i = tid; i < kTokens * 8 * up_steps; i += kThreads) {
    const int token = i / (8 * up_steps), r = i % (8 * up_steps);
    float sum = 0.f;
    if (r < R) {
      for (int w = 0; w < live_warps; ++w) sum += partial[w][token][r];
    }
    latent[token][r] = sum;
    const int t = token0 + token;
    if (p.latent != nullptr && blockIdx.y == 0 && r < R && t < p.tokens) {
      p.latent[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + r] = sum;
    }
  }
  __syncthreads();

  // Up: [K | V]^T[j][token] for this warp's 16 columns. Step s, fragment column c is latent
  // row 8 s + c: lane (g, q) reads A at rows q, q + 4 and columns g, g + 8 of the warp's tile,
  // and B (the latent tile) at token g.
  if (!up_live) return;
  float up[4] = {};
  const float* u_rows = w_up_s + tig * plan.column_stride + kWarpRows * warp + gid;
#pragma unroll
  for (int s = 0; s < kUpSteps; ++s) {
    if (s >= up_steps) continue;
    const Split b0 = split_tf32(latent[gid][8 * s + tig]);
    const Split b1 = split_tf32(latent[gid][8 * s + tig + 4]);
    const float* row0 = u_rows + 8 * s * plan.column_stride;
    const float* row4 = row0 + 4 * plan.column_stride;
    const float a[4] = {row0[0], row0[8], row4[0], row4[8]};
    mma_3xtf32(up, a, b0, b1);
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int t = token0 + 2 * tig + c;
    if (t >= p.tokens) continue;
    const int64_t token = token_offset(t, p.seq, p.out_stride_batch, p.out_stride_seq);
    if (column_offset[0] >= 0) p.out[token + column_offset[0]] = up[c];
    if (column_offset[1] >= 0) p.out[token + column_offset[1]] = up[2 + c];
  }
}

// The per-device setup (prepared_device): the kernel opted in to the device's shared memory.
struct TcKernels {
  static Status setup(const DeviceFacts& f) {
    return cuda_status(
        cudaFuncSetAttribute(kv_proj_fused_3xtf32, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(f.smem_optin) - kStaticSmemBytes),
        "cudaFuncSetAttribute(kv_proj_fused_3xtf32, MaxDynamicSharedMemorySize)");
  }
};

int64_t token_tiles(const Problem& p) { return ceil_div<int64_t>(p.tokens(), kTokens); }
int64_t up_tiles(const Problem& p) { return ceil_div<int64_t>(2 * p.kv_width(), 16); }
int up_tiles_per_block(const Problem& p, const DeviceFacts& f) {
  return fused_tc_up_tiles_per_block(token_tiles(p), up_tiles(p), f.sm_count);
}

}  // namespace

bool fused_tensor_core_takes(const Problem& p, const Args& a, const DeviceFacts& f) {
  if (f.major < 8 || compiled_arch<kv_proj_fused_3xtf32>() < 80) return false;
  if (p.model_dim > tiles::kFusedTcMaxModelDim || p.rank > kMaxRank) return false;
  if (!fused_rows_16_bytes(p, a)) return false;
  const int per_block = up_tiles_per_block(p, f);
  if (!fused_use_tensor_core(token_tiles(p) * ceil_div<int64_t>(up_tiles(p), per_block),
                             f.sm_count)) {
    return false;
  }
  const TcPlan plan(static_cast<int>(p.model_dim), static_cast<int>(p.rank), per_block);
  return plan.bytes() + kStaticSmemBytes <= f.smem_optin;
}

Status run_fused_tensor_core(const Problem& p, const Args& a, const DeviceFacts& f,
                             Stream stream) {
  if (Status s = prepare<TcKernels>(f); !s.ok()) return s;
  TcParams k;
  copy_fused_args(p, a, k);
  k.up_tiles = static_cast<int>(up_tiles(p));  // within the grid's one wave: int
  k.up_tiles_per_block = up_tiles_per_block(p, f);
  const TcPlan plan(static_cast<int>(p.model_dim), static_cast<int>(p.rank),
                    k.up_tiles_per_block);
  const dim3 grid(static_cast<unsigned>(token_tiles(p)),
                  static_cast<unsigned>(ceil_div(k.up_tiles, k.up_tiles_per_block)));
  return cuda_status(
      launch_after_previous<kv_proj_fused_3xtf32>(grid, kThreads, plan.bytes(), stream, f.major, k),
      "kv_proj_fused_3xtf32 launch");
}

}  // namespace latentkv::detail
