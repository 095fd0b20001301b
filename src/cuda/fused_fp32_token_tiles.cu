// cuda-fused's token-tile configuration (asked where the streaming grid would pass two blocks per
// SM and the tensor-core configuration does not take the call, heuristics.h; D <= 256, R <= 64,
// sm_80 code): the founding projection for many tokens on mma.sync m16n8k8 in 3xTF32 (ptx.h:
// split_tf32), float32 to ~1e-6, as a GEMM with the tokens as the MMA's M.
//
// The tensor-core configuration (fused_fp32_tensor_core.cu) puts 8 tokens on the MMA's N, one tile
// a block: a latency chain per tile that pays only while the tiles fit the SMs once. Here a block
// tile is 16 x kM tokens (kM = 1 to 4, m_tiles: the smallest whose grid fits the SMs once, past
// that 3 or 4), and the grid is persistent: each block copies w_down and its 256 columns of
// [w_up_k | w_up_v] into shared memory once and walks its tiles, the next tile's hidden rows
// arriving by cp.async during the current tile's up product (the first tile's hidden rows and
// w_down in kKChunks groups along K, so that its down product starts on the first chunk while the
// others are in flight). Blocks of kM = 1, 2 and 4 have 16 warps; kM = 3 has 12 (kBlockThreads),
// so that a warp has the same n-tiles at kM = 3 as at 4 (4 warps an m-tile) and a 48-token tile
// costs an SM three quarters of a 64-token one.
// Per tile:
//   down: latent [16 kM, R] = hidden [16 kM, D] @ w_down [D, R]; of the block's warps, warp w
//         takes m-tile w % kM and the n-tiles (8 latent columns each) w / kM, + warps / kM, ...;
//         no split over D, so the latent goes from the accumulators to shared memory (and to the
//         latent output) once. Where R <= 48 at kM = 3 and 4, warp w instead takes m-tile w % kM,
//         3 n-tiles (of 6) and every other K step, each A split feeding 3 n-tiles instead of 2
//         and no MMA on the columns past 48; the two K halves' sums meet in shared memory;
//   up:   [K | V] [16 kM, 256] = latent @ [w_up_k | w_up_v], the same warp map over the block's
//         32 column n-tiles; the accumulators are stored to K and V (two adjacent columns as one
//         8-byte store where the layout allows).
// The A fragment of a K step (hidden or latent rows) is split once and feeds every n-tile of the
// warp. Shared-memory rows are padded so that no fragment read conflicts: A operands (lane (g, q)
// at row g, column q) have strides of 4 mod 8, B operands (row q, column g) 8 mod 16. Everything
// a fragment reads outside the matrices (rows past T, columns past D or R) is zero-filled.
// The loops over a warp's n-tiles have no branches (the down product always runs 8 n-tiles, 64
// columns zero-filled past R, or 6; the up product all of the block's 256 columns, zero-filled past
// 2N), so ptxas issues a K step's shared-memory loads together: with a warp-uniform branch
// per n-tile each load waited on its own (with 8 warps: 1.3-1.4x the time; experiments.md). Down
// products keep their three 3xTF32 terms in three accumulators (chains a third as long, for the
// few warps of kM = 1); up products have enough independent n-tiles per warp for one.
//
// Column blocks (gridDim.y) cover 2N past 256, each recomputing the latent. Inputs whose rows are
// 16-byte vectors (kernel_args.h: fused_rows_16_bytes) are staged by cp.async; any other layout
// (odd widths, strides or pointers) by element loads stored in place.
#include <cuda_runtime.h>

#include "cuda/common.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/fused_fp32_token_tiles.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

constexpr int kThreads = tiles::kFusedTilesThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxMTiles = tiles::kFusedTilesMaxMTiles;
constexpr int kMaxRank = tiles::kFusedTilesMaxRank;
constexpr int kBlockCols = tiles::kFusedTilesBlockCols;
static_assert(kWarps % kMaxMTiles == 0, "every m-tile gets the same number of warps");
// The block's threads for kM m-tiles: 12 warps at kM = 3, else 16.
template <int kM>
constexpr int kBlockThreads = kM == 3 ? 3 * kThreads / 4 : kThreads;

struct TilesParams : FusedParamsBase {
  int tiles;         // token tiles of 16 kM tokens
  bool pair_stores;  // two adjacent [K | V] columns are one aligned 8-byte word of out
};

// Four floats of a row into shared memory, the first `count` (0..4) from src and the rest zeros:
// one 16-byte cp.async (part of the caller's group) where the rows are vectors (kVectors: count is
// then 0 or 4), else element loads stored in place. `any` is a valid address for an empty copy.
template <bool kVectors>
__device__ __forceinline__ void stage4(float* dst, const float* src, int count, const float* any) {
  if constexpr (kVectors) {
    copy16_async(dst, count > 0 ? src : any, count > 0);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[e] = e < count ? src[e] : 0.f;
  }
}

// The number of the 4 elements from column c that lie before `end` (0 past it).
__device__ __forceinline__ int in_row(int c, int end) { return max(0, min(4, end - c)); }

// Row strides in floats: an A operand's (lane (g, q) reads row g, column q: 4 mod 8 puts the 32
// lanes in 32 banks) and a B operand's (row q, column g: 8 mod 16).
LATENTKV_HD constexpr int a_stride(int cols) { return round_up(cols, 8) + 4; }
LATENTKV_HD constexpr int b_stride(int cols) { return round_up(round_up(cols, 8) + 8, 16) - 8; }

// The dynamic shared memory of a block, in floats: w_down [k_rows][down_ld], the block's columns
// of [w_up_k | w_up_v] [rank_cols][up_ld], the hidden tile [16 kM][hidden_ld], the latent tile
// [16 kM][latent_ld], then the out offsets of the block's columns (int64 [kBlockCols]). The
// hidden tile's row padding (columns k_rows .. k_rows + 3, which no fragment reads) holds the row's
// address in hidden while the row is staged (hidden_rows).
struct TilesPlan {
  int k_rows, rank_cols;  // D and R rounded up to a K step (zeros past them)
  int down_ld, up_ld, hidden_ld, latent_ld;
  int w_up, hidden, latent, col_offsets, total;  // offsets of the regions; size
  __host__ __device__ TilesPlan(int d, int r, int m_tiles) {
    k_rows = round_up(d, 8);
    rank_cols = round_up(r, 8);
    down_ld = b_stride(kMaxRank);
    up_ld = b_stride(kBlockCols);
    hidden_ld = a_stride(k_rows);
    latent_ld = a_stride(kMaxRank);
    w_up = k_rows * down_ld;
    hidden = w_up + rank_cols * up_ld;
    latent = hidden + 16 * m_tiles * hidden_ld;
    col_offsets = round_up(latent + 16 * m_tiles * latent_ld, 2);
    total = col_offsets + 2 * kBlockCols;
  }
  size_t bytes() const { return sizeof(float) * static_cast<size_t>(total); }
};
static_assert(sizeof(const float*) <= 4 * sizeof(float), "a row address fits a row's padding");

// Where row r of the hidden tile keeps its address in hidden: its padding (8-byte aligned: k_rows
// and hidden_ld are multiples of 4 floats from a 16-byte aligned tile).
__device__ __forceinline__ const float** hidden_row_slot(float* hidden, const TilesPlan& plan,
                                                         int r) {
  return reinterpret_cast<const float**>(hidden + r * plan.hidden_ld + plan.k_rows);
}

// One K step of a warp's n-tiles (ptx.h: mma_3xtf32): the A fragment at rows g and g + 8,
// columns q and q + 4 of a_at (stride a_ld; the pointer at row g, the step's column q), split once;
// n-tile i's B at rows q and q + 4 of b_row + 8 kGroups i (stride b_ld); the three terms into sb,
// bs, bb.
template <int kTiles, int kGroups>
__device__ __forceinline__ void mma_k_step(float (&sb)[kTiles][4], float (&bs)[kTiles][4],
                                           float (&bb)[kTiles][4], const float* a_at, int a_ld,
                                           const float* b_row, int b_ld) {
  const float x[4] = {a_at[0], a_at[8 * a_ld], a_at[4], a_at[8 * a_ld + 4]};
  const SplitA a(x);
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int col = 8 * kGroups * i;
    const Split b0 = split_tf32(b_row[col]), b1 = split_tf32(b_row[4 * b_ld + col]);
    mma_3xtf32(sb[i], bs[i], bb[i], a, b0, b1);
  }
}

// Tile `tile`'s rows' addresses in hidden (null past T) into the hidden tile's row padding, for
// stage_hidden: one division per row here instead of two per staged vector there.
template <int kM>
__device__ __forceinline__ void hidden_rows(const TilesParams& p, const TilesPlan& plan,
                                            float* hidden, int tile, int tid) {
  for (int row = tid; row < 16 * kM; row += kBlockThreads<kM>) {
    const int token = tile * 16 * kM + row;
    *hidden_row_slot(hidden, plan, row) =
        token < p.tokens
            ? p.hidden + token_offset(token, p.seq, p.hidden_stride_batch, p.hidden_stride_seq)
            : nullptr;
  }
}

// Columns [c0, c1) (multiples of 4) of a tile's hidden rows (their addresses from hidden_rows)
// into shared memory (part of the caller's cp.async group, or stored in place): rows past T and
// columns past D as zeros. Vector i = tid, tid + threads, ... of the rows' (c1 - c0) / 4 each,
// walked by increments; where the block's threads are whole rows of vectors, each thread keeps
// its column.
template <int kM, bool kVectors>
__device__ __forceinline__ void stage_hidden(const TilesParams& p, const TilesPlan& plan,
                                             float* hidden, int tid, int c0, int c1) {
  constexpr int kStride = kBlockThreads<kM>;
  const int vectors = (c1 - c0) / 4;  // per row
  if (vectors <= 0) return;
  const int row_step = kStride / vectors, c_step = kStride - row_step * vectors;
  int row = tid / vectors, c = tid - row * vectors;
  const auto stage = [&](int r, int col, int count_in_row) {
    const float* src = *hidden_row_slot(hidden, plan, r);
    const int count = src != nullptr ? count_in_row : 0;
    stage4<kVectors>(hidden + r * plan.hidden_ld + col, count > 0 ? src + col : p.hidden, count,
                     p.hidden);
  };
  if (c_step == 0) {
    const int col = c0 + 4 * c, count_in_row = in_row(col, p.model_dim);
    for (; row < 16 * kM; row += row_step) stage(row, col, count_in_row);
    return;
  }
  while (row < 16 * kM) {
    const int col = c0 + 4 * c;
    stage(row, col, in_row(col, p.model_dim));
    row += row_step;
    c += c_step;
    if (c >= vectors) {
      c -= vectors;
      ++row;
    }
  }
}

// The first tile's K chunks: its hidden columns and w_down rows arrive in kKChunks cp.async groups,
// and the down product starts on chunk 0 while the later ones are in flight.
constexpr int kKChunks = 4;

// Waits until chunk c's group (of kKChunks chunk groups and the up columns' group behind them)
// has landed: at most kKChunks - c groups still in flight.
__device__ __forceinline__ void wait_k_chunk(int c) {
  static_assert(kKChunks == 4, "one case per chunk");
  if (c == 0) wait_copies<4>();
  if (c == 1) wait_copies<3>();
  if (c == 2) wait_copies<2>();
  if (c == 3) wait_copies<1>();
}

// kVectors: every input row is whole 16-byte vectors (kernel_args.h: fused_rows_16_bytes).
template <int kM, bool kVectors>
__global__ void __launch_bounds__(kBlockThreads<kM>, 1)
    kv_proj_fused_3xtf32_tiles(const __grid_constant__ TilesParams p) {
  start_after_previous_kernel();
  constexpr int kStride = kBlockThreads<kM>;
  constexpr int kGroups = kStride / 32 / kM;  // warps per m-tile; a warp: every kGroups-th n-tile
  static_assert(kStride / 32 % kM == 0, "every m-tile gets the same number of warps");
  constexpr int kDownTiles = kMaxRank / 8;
  constexpr int kDownPerWarp = kDownTiles > kGroups ? kDownTiles / kGroups : 1;
  constexpr int kUpPerWarp = kBlockCols / 8 / kGroups;
  constexpr int kTriple = 3;  // n-tiles a warp of the R <= 48 down mapping takes
  static_assert(kM < 3 || kGroups == 4, "the R <= 48 mapping: 2 triples x 2 K halves an m-tile");
  static_assert(kDownTiles % kGroups == 0 || kGroups % kDownTiles == 0, "whole n-tiles per warp");
  extern __shared__ float4 smem_tiles[];
  const TilesPlan plan(p.model_dim, p.rank, kM);
  float* w_down_s = reinterpret_cast<float*>(smem_tiles);  // [k_rows][down_ld]
  float* w_up_s = w_down_s + plan.w_up;                    // [rank_cols][up_ld]
  float* hidden_s = w_down_s + plan.hidden;                // [16 kM][hidden_ld]
  float* latent_s = w_down_s + plan.latent;                // [16 kM][latent_ld]
  int64_t* col_offset_s = reinterpret_cast<int64_t*>(w_down_s + plan.col_offsets);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;  // the fragments' row group and column
  const int m = warp % kM, group = warp / kM;
  const int D = p.model_dim, R = p.rank, N = p.kv_width;
  const int column0 = blockIdx.y * kBlockCols;
  const int cols = min(kBlockCols, 2 * N - column0);  // even (2N is; column0 is 256 k)
  const int k_steps = plan.k_rows / 8, r_steps = plan.rank_cols / 8;

  // Groups 0 .. kKChunks - 1: the first tile's hidden columns and w_down rows of K chunk c (8
  // chunk_steps rows each). Group kKChunks: the block's [K | V] columns, in flight during the
  // first down product, and the out offsets of those columns (-1 past 2N).
  const int chunk_steps = (k_steps + kKChunks - 1) / kKChunks;  // K steps per chunk
  hidden_rows<kM>(p, plan, hidden_s, blockIdx.x, tid);
  __syncthreads();
  // A thread's vectors of w_down and of the up columns keep their column (the block's threads are
  // whole rows of vectors), so only the row advances.
  constexpr int kRankVectors = kMaxRank / 4;  // every column a down n-tile reads
  constexpr int kColVectors = kBlockCols / 4;
  static_assert(kStride % kRankVectors == 0 && kStride % kColVectors == 0, "whole rows");
  const int down_c = 4 * (tid % kRankVectors), down_count = in_row(down_c, R);
#pragma unroll 1
  for (int chunk = 0; chunk < kKChunks; ++chunk) {
    const int k0 = min(8 * chunk_steps * chunk, plan.k_rows);
    const int k1 = min(k0 + 8 * chunk_steps, plan.k_rows);
    stage_hidden<kM, kVectors>(p, plan, hidden_s, tid, k0, k1);
    constexpr int kRowStep = kStride / kRankVectors;
    int k = k0 + tid / kRankVectors;
    const float* src = p.w_down + int64_t{k} * p.w_down_stride + down_c;
    float* dst = w_down_s + k * plan.down_ld + down_c;
    for (; k < k1; k += kRowStep) {
      const int count = k < D ? down_count : 0;
      stage4<kVectors>(dst, count > 0 ? src : p.w_down, count, p.w_down);
      src += kRowStep * p.w_down_stride;
      dst += kRowStep * plan.down_ld;
    }
    commit_copies();
  }
  {
    const int c = 4 * (tid % kColVectors), up_count = in_row(c, cols);
    const auto source = [&](int j, int r) {  // column j of [w_up_k | w_up_v], row r
      return j < N ? p.w_up_k + int64_t{r} * p.w_up_k_stride + j
                   : p.w_up_v + int64_t{r} * p.w_up_v_stride + (j - N);
    };
    constexpr int kRowStep = kStride / kColVectors;
    int r = tid / kColVectors;
    float* dst = w_up_s + r * plan.up_ld + c;
    if constexpr (kVectors) {  // N % 4 == 0: a vector lies in K or in V
      const int j = column0 + c;
      const float* src = source(j, r);
      const int64_t src_step = kRowStep * (j < N ? p.w_up_k_stride : p.w_up_v_stride);
      for (; r < plan.rank_cols; r += kRowStep) {
        const int count = r < R ? up_count : 0;
        copy16_async(dst, count > 0 ? src : p.w_up_k, count > 0);
        src += src_step;
        dst += kRowStep * plan.up_ld;
      }
    } else {
      for (; r < plan.rank_cols; r += kRowStep) {
        const int count = r < R ? up_count : 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[e] = e < count ? *source(column0 + c + e, r) : 0.f;
        dst += kRowStep * plan.up_ld;
      }
    }
  }
  commit_copies();
  for (int c = tid; c < kBlockCols; c += kStride) {
    const int j = column0 + c, kv = j >= N, n = j - kv * N;
    const int64_t head = n / p.head_dim;
    col_offset_s[c] =
        c < cols ? kv * p.out_stride_kv + head * p.out_stride_head + n % p.head_dim : -1;
  }

  for (int tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    // The tile's hidden rows: on the first tile chunk by chunk in the down product, else the group
    // the previous tile committed.
    const bool first = tile == static_cast<int>(blockIdx.x);
    if (!first) {
      wait_copies<0>();
      __syncthreads();
    }
    const int row0 = 16 * m + g;                // the warp's rows g and g + 8 of the tile
    const int token0 = tile * 16 * kM + row0;

    // Down, chunk by chunk on the first tile, which waits for K chunk c's copies before its K steps
    // [s0, s1) (block-uniform barriers).
    const auto down_chunks = [&](auto&& steps) {
      if (!first) return steps(0, k_steps);  // later tiles: one loop
#pragma unroll 1
      for (int chunk = 0; chunk < kKChunks; ++chunk) {
        wait_k_chunk(chunk);
        __syncthreads();
        steps(chunk_steps * chunk, min(chunk_steps * (chunk + 1), k_steps));
      }
    };
    // Value pair (v0, v1) of the latent at tile row `row`, columns c and c + 1: into the latent
    // tile (added to what is there with `add`), and with `publish` into the latent output.
    const auto put_latent = [&](int row, int c, float v0, float v1, bool add, bool publish) {
      float* at = latent_s + row * plan.latent_ld + c;
      if (add) {
        v0 += at[0];
        v1 += at[1];
      }
      at[0] = v0;
      at[1] = v1;
      const int t = tile * 16 * kM + row;
      if (publish && p.latent != nullptr && blockIdx.y == 0 && t < p.tokens && c < R) {
        float* dst = p.latent + token_offset(t, p.seq, p.latent_stride_batch,
                                             p.latent_stride_seq) + c;
        dst[0] = v0;
        if (c + 1 < R) dst[1] = v1;
      }
    };
    // With R <= 48 at kM >= 3 (a block-uniform choice): warp (m, group = 2 half + triple) takes
    // n-tiles 3 triple .. + 2 (no n-tile past 48 columns) and the K steps of parity `half` (both
    // halves busy in every chunk), so each A split feeds 3 n-tiles instead of 2; half 0's sums go
    // into the latent tile first, half 1 adds its own after a barrier (a fixed order).
    bool triples = false;
    if constexpr (kM >= 3) triples = R <= 8 * kTriple * 2;
    if (triples) {
      const int triple = group % 2, half = group / 2;
      float bb[kTriple][4] = {}, sb[kTriple][4] = {}, bs[kTriple][4] = {};
      const float* hidden_at = hidden_s + row0 * plan.hidden_ld + q;
      const float* w_down_at = w_down_s + q * plan.down_ld + 8 * kTriple * triple + g;
      down_chunks([&](int s0, int s1) {
#pragma unroll 4
        for (int s = s0 + ((s0 + half) & 1); s < s1; s += 2) {
          mma_k_step<kTriple, 1>(sb, bs, bb, hidden_at + 8 * s, plan.hidden_ld,
                                 w_down_at + 8 * s * plan.down_ld, plan.down_ld);
        }
      });
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) __syncthreads();
        if (half != pass) continue;
#pragma unroll
        for (int i = 0; i < kTriple; ++i) {
          const int c = 8 * (kTriple * triple + i) + 2 * q;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            put_latent(row0 + 8 * h, c, (sb[i][2 * h] + bs[i][2 * h]) + bb[i][2 * h],
                       (sb[i][2 * h + 1] + bs[i][2 * h + 1]) + bb[i][2 * h + 1], pass == 1,
                       pass == 1);
          }
        }
      }
    } else {
      // Latent [16, 8] per n-tile j = group + kGroups i, over every K step of D.
      float bb[kDownPerWarp][4] = {}, sb[kDownPerWarp][4] = {}, bs[kDownPerWarp][4] = {};
      const float* hidden_at = hidden_s + row0 * plan.hidden_ld + q;
      const float* w_down_at = w_down_s + q * plan.down_ld + 8 * group + g;
      down_chunks([&](int s0, int s1) {
        if (group >= kDownTiles) return;
#pragma unroll 4
        for (int s = s0; s < s1; ++s) {
          mma_k_step<kDownPerWarp, kGroups>(sb, bs, bb, hidden_at + 8 * s, plan.hidden_ld,
                                            w_down_at + 8 * s * plan.down_ld, plan.down_ld);
        }
      });
      if (group < kDownTiles) {
        // Accumulator i holds rows g (0, 1) and g + 8 (2, 3) at columns 2q, 2q + 1 of its n-tile.
#pragma unroll
        for (int i = 0; i < kDownPerWarp; ++i) {
          const int c = 8 * (group + kGroups * i) + 2 * q;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            put_latent(row0 + 8 * h, c, (sb[i][2 * h] + bs[i][2 * h]) + bb[i][2 * h],
                       (sb[i][2 * h + 1] + bs[i][2 * h + 1]) + bb[i][2 * h + 1], false, true);
          }
        }
      }
    }
    // The next tile's rows: this tile's hidden rows were issued long ago (no reader left).
    const int next = tile + static_cast<int>(gridDim.x);
    if (next < p.tiles) hidden_rows<kM>(p, plan, hidden_s, next, tid);
    __syncthreads();  // the latent tile and the next rows' addresses written; hidden tile free

    // The next tile's hidden rows, during this tile's up product (an empty group on the last).
    if (next < p.tiles) {
      stage_hidden<kM, kVectors>(p, plan, hidden_s, tid, 0, plan.k_rows);
    }
    commit_copies();
    wait_copies<1>();  // all but the next tile's: the [K | V] columns (done after the first tile)
    __syncthreads();

    // Up: [K | V] [16, 8] per n-tile j = group + kGroups i of the block's columns, over R.
    float acc[kUpPerWarp][4] = {};
    const float* a_at = latent_s + row0 * plan.latent_ld + q;
    const float* b_at = w_up_s + q * plan.up_ld + 8 * group + g;
#pragma unroll
    for (int s = 0; s < kMaxRank / 8; ++s) {
      if (s >= r_steps) break;
      mma_k_step<kUpPerWarp, kGroups>(acc, acc, acc, a_at + 8 * s, plan.latent_ld,
                                      b_at + 8 * s * plan.up_ld, plan.up_ld);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = token0 + 8 * h;
      if (t >= p.tokens) continue;
      float* out_row = p.out + token_offset(t, p.seq, p.out_stride_batch, p.out_stride_seq);
#pragma unroll
      for (int i = 0; i < kUpPerWarp; ++i) {
        const int c = 8 * (group + kGroups * i) + 2 * q;
        if (c >= cols) continue;  // cols is even: c + 1 is in too
        const float v0 = acc[i][2 * h], v1 = acc[i][2 * h + 1];
        if (p.pair_stores) {
          *reinterpret_cast<float2*>(out_row + col_offset_s[c]) = make_float2(v0, v1);
        } else {
          out_row[col_offset_s[c]] = v0;
          out_row[col_offset_s[c + 1]] = v1;
        }
      }
    }
  }
}

template <int kM, bool kVectors>
Status opt_in(const DeviceFacts& f) {
  return cuda_status(cudaFuncSetAttribute(kv_proj_fused_3xtf32_tiles<kM, kVectors>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(f.smem_optin)),
                     "cudaFuncSetAttribute(kv_proj_fused_3xtf32_tiles, "
                     "MaxDynamicSharedMemorySize)");
}

template <bool kVectors>
Status opt_in_all(const DeviceFacts& f) {
  if (Status s = opt_in<1, kVectors>(f); !s.ok()) return s;
  if (Status s = opt_in<2, kVectors>(f); !s.ok()) return s;
  if (Status s = opt_in<3, kVectors>(f); !s.ok()) return s;
  return opt_in<4, kVectors>(f);
}

// The per-device setup (prepared_device): the eight kernels opted in to the device's shared
// memory.
struct TilesKernels {
  static Status setup(const DeviceFacts& f) {
    if (Status s = opt_in_all<true>(f); !s.ok()) return s;
    return opt_in_all<false>(f);
  }
};

int64_t column_blocks(const Problem& p) { return ceil_div<int64_t>(2 * p.kv_width(), kBlockCols); }

// Persistent blocks per column block (launch(): the tiles' grid, at most the SMs).
int64_t blocks_per_column_block(const Problem& p, const DeviceFacts& f) {
  return std::max<int64_t>(1, f.sm_count / column_blocks(p));
}

// m-tiles per block tile: the smallest of 1, 2, 3, 4 whose grid of tiles x column blocks fits the
// SMs once. Where none does (persistent blocks, several tiles each), 3 or 4, whichever leaves the
// busiest block fewer tokens (its tiles x 16 kM; 4 on a tie, the fewer tiles).
int m_tiles(const Problem& p, const DeviceFacts& f) {
  for (int m = 1; m < kMaxMTiles; ++m) {
    if (ceil_div<int64_t>(p.tokens(), 16 * m) * column_blocks(p) <= f.sm_count) return m;
  }
  const auto busiest_tiles = [&](int m) {
    return ceil_div<int64_t>(ceil_div<int64_t>(p.tokens(), 16 * m), blocks_per_column_block(p, f));
  };
  return 3 * busiest_tiles(3) < kMaxMTiles * busiest_tiles(kMaxMTiles) ? 3 : kMaxMTiles;
}

template <int kM, bool kVectors>
cudaError_t launch(const TilesParams& k, dim3 grid, size_t smem, Stream stream, int major) {
  return launch_after_previous<kv_proj_fused_3xtf32_tiles<kM, kVectors>>(
      grid, kBlockThreads<kM>, smem, stream, major, k);
}

}  // namespace

bool fused_token_tiles_takes(const Problem& p, const Args& a, const DeviceFacts& f) {
  if (f.major < 8 || compiled_arch<kv_proj_fused_3xtf32_tiles<1, true>>() < 80) return false;
  if (p.model_dim > tiles::kFusedTilesMaxModelDim || p.rank > kMaxRank) return false;
  if (column_blocks(p) > 65535) return false;
  const TilesPlan plan(static_cast<int>(p.model_dim), static_cast<int>(p.rank), m_tiles(p, f));
  return plan.bytes() <= f.smem_optin;
}

Status run_fused_token_tiles(const Problem& p, const Args& a, const DeviceFacts& f,
                             Stream stream) {
  if (Status s = prepare<TilesKernels>(f); !s.ok()) return s;
  const int m = m_tiles(p, f);
  TilesParams k;
  copy_fused_args(p, a, k);
  k.tiles = static_cast<int>(ceil_div<int64_t>(p.tokens(), 16 * m));
  k.pair_stores = p.head_dim % 2 == 0 && is_aligned(a.out, 8) && a.out_stride_kv % 2 == 0 &&
                  a.out_stride_batch % 2 == 0 && a.out_stride_seq % 2 == 0 &&
                  a.out_stride_head % 2 == 0;
  const size_t smem =
      TilesPlan(static_cast<int>(p.model_dim), static_cast<int>(p.rank), m).bytes();
  // gridDim.x: persistent blocks, each walking tiles x, x + gridDim.x, ...
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(k.tiles, blocks_per_column_block(p, f))),
                  static_cast<unsigned>(column_blocks(p)));
  const bool vectors = fused_rows_16_bytes(p, a);
  const auto kernel = m == 1   ? (vectors ? launch<1, true> : launch<1, false>)
                      : m == 2 ? (vectors ? launch<2, true> : launch<2, false>)
                      : m == 3 ? (vectors ? launch<3, true> : launch<3, false>)
                               : (vectors ? launch<4, true> : launch<4, false>);
  return cuda_status(kernel(k, grid, smem, stream, f.major), "kv_proj_fused_3xtf32_tiles launch");
}

}  // namespace latentkv::detail
