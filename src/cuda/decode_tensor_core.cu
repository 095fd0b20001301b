// The decode strategy for bfloat16 and float16 (Strategy::kCudaDecode on 16-bit dtypes): few
// tokens (T <= 16) against large weights, as in MLA decoding (DeepSeek-V2-Lite: 6 MB of bf16
// weights per call, V3: 41 MB). The cost is streaming the weights from HBM once, and the down
// projection has to finish over all of D before the up projection can start. One cooperative
// kernel, kv_proj_decode_tc_sm90 (TMA and mbarriers: sm_90 only; its row refuses older devices),
// does both, one block per SM:
//   t = 0      every block requests its first tiles of w_up_k / w_up_v through the bulk tensor
//              copy engine (TMA: no registers or threads held while the bytes are in flight), as
//              many as its shared memory holds, and its share of w_down and hidden (cp.async).
//   down       block i < items takes an 8-column tile of w_down times one chunk of D (R / 8 tiles
//              x 1-8 chunks, about 128 items) and stores its partial latent [T][8] (float32) in
//              the workspace.
//   barrier    one grid-wide barrier (cooperative launch: cheaper than the extra kernel boundary
//              of a two-launch version).
//   up         every block sums the partials over the chunks in a fixed order (deterministic, and
//              every block gets the same latent), keeps it as the MMA's A operand (a hi + lo pair
//              of 16-bit values: ~16 mantissa bits, as good as float32 here, where the unfused
//              baseline rounds the latent to the dtype), and walks its column tiles of w_up_k,
//              then w_up_v (32 or 64 columns, all R rows) gridDim.x apart, refilling each tile's
//              buffer as soon as it is used; results go straight into the stacked output, any head
//              stride. Token row t of the caller's latent is written by block t.
// The multiplications run on tensor cores (mma.sync m16n8k16, float32 accumulation) with the
// tokens as the M side: T = 1 and T = 16 cost the same instructions; A rows past T read a shared
// row of zeros. Float32 is not taken here: its decode kernels are in decode_stream.cu (tensor
// cores would mean TF32). Measured numbers are in docs/perf.md.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "backends.h"
#include "cuda/common.h"
#include "cuda/convert.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

namespace cg = cooperative_groups;

// The tile plan (tile_sizes.h, with the reasons), then the constants no shape depends on.
constexpr int kThreads = tiles::kDecodeTcThreads;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMmaCols = tiles::kDecodeTcMmaCols;
constexpr int kKStep = tiles::kDecodeTcKStep;
constexpr int kTokens = tiles::kDecodeTcTokens;
constexpr int kBoxRows = tiles::kDecodeTcBoxRows;
constexpr int kUpRowAlign = tiles::kDecodeTcUpRowAlign;
constexpr int kDownRowAlign = tiles::kDecodeTcDownRowAlign;
constexpr int kNarrowUpCols = tiles::kDecodeTcNarrowUpCols;
constexpr int kWideUpCols = tiles::kDecodeTcWideUpCols;
static_assert(kUpRowAlign % (2 * kKStep) == 0 && kDownRowAlign % (kWarps * 2 * kKStep) == 0,
              "every warp's share of the rows is whole pairs of MMA k-steps");
constexpr int kRowPad = 8;                 // elements of padding per shared row of an A operand:
                                           // 8 consecutive rows land in 8 bank groups (ldmatrix)
constexpr int kTargetDownItems = 128;      // down: (8-column tiles) x (chunks of D), about one per
                                           // SM of an H100/H200
constexpr int kMaxChunks = 8;              // down: chunks of D at most (partials to sum per block)
constexpr int kSumPad = 4;                 // floats of padding per row of a block's result
constexpr int kMaxUpStages = 4;            // up: weight tiles in flight per block, at most

template <typename E>
struct Params : ActivationParams<E> {
  CUtensorMap w_up_map[2];  // w_up_k, w_up_v [R][N] in 64 x (tile width) boxes
  const E* w_down;          // [D][R], row stride w_down_stride (16-byte rows)
  int64_t w_down_stride;
  E* latent_out;            // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
  float* partials;          // workspace [chunks][T][R]: the down items' partial latents
  int chunk_rows;           // down: rows of D per chunk (multiple of kDownRowAlign)
  int down_col_tiles;       // down: R / 8
  int down_items;           // down: down_col_tiles x chunks
  int rank_rows;            // up: R rounded up to kUpRowAlign (the weight tiles' rows)
  int up_stages;            // up: weight tiles in flight per block
  bool hidden_vectors;      // hidden rows may be copied 16 bytes at a time
};

// Rows [row0, row0 + rows) (a multiple of kBoxRows) x columns [col0, col0 + kCols) of the
// matrix behind `map` (boxes of kBoxRows x kCols, through the bulk tensor copy engine: rows and
// columns outside the matrix arrive as zeros) into shared w [rows][kCols], dense, completing on
// the mbarrier `bar`; one thread calls it.
template <int kCols, typename E>
__device__ __forceinline__ void copy_weight_tile(E* w, const CUtensorMap* map, int row0, int rows,
                                                 int col0, uint64_t* bar) {
  expect_bytes(bar, static_cast<uint32_t>(rows * kCols * sizeof(E)));
  for (int r = 0; r < rows; r += kBoxRows) {
    bulk_tensor_copy_2d(w + r * kCols, map, col0, row0 + r, bar);
  }
}

// Weight tiles [rows][kCols] sit in shared memory as the copy engine's swizzle leaves them (64-
// or 128-byte mode for 32- or 64-column rows): 16-byte chunk c of row r is stored at chunk
// c ^ f(r), so the 8 rows one ldmatrix phase reads fall in 8 different bank groups instead of all
// in one (unswizzled, the MMA loop was bound by shared-memory bank conflicts).
template <int kCols>
__device__ __forceinline__ int swizzled(int row, int col) {
  static_assert(kCols == 32 || kCols == 64, "64- or 128-byte rows");
  const int f = kCols == 64 ? row % 8 : (row / 2) % 4;
  return row * kCols + (((col / 8) ^ f) * 8) + col % 8;
}

// How a block's 8 warps cover a tile of kCols columns: 4 column groups of kCols / 4 (one or two
// 8-column MMA tiles, sharing each A fragment) times 2 halves of the rows (K).
template <int kCols>
struct WarpLayout {
  static constexpr int kGroups = 4;
  static constexpr int kNTiles = kCols / kGroups / kMmaCols;
  static_assert(kNTiles * kMmaCols * kGroups == kCols, "32 or 64 columns");
};

// The A operand (tokens x K, 16-bit, row-major in shared memory) as one lane of ldmatrix sees
// it: lane l reads row l % 16 from column (l / 16) * 8 of each 16-wide k-step; rows at or past T
// read 8 zeros instead, at every k, so only T rows need to be in shared memory.
template <typename E>
struct OperandLane {
  const E* base;
  int step;  // 1, or 0 on the zero row
  __device__ OperandLane(const E* a, int stride, int tokens, const E* zeros, int lane) {
    const int row = lane % 16;
    base = row < tokens ? a + row * stride + (lane / 16) * 8 : zeros;
    step = row < tokens ? 1 : 0;
  }
  __device__ const E* at(int k) const { return base + step * k; }
};

// acc[j] += A[0 .. 16)[k0 .. k1) @ w[k0 .. k1)[col + 8 j .. col + 8 j + 8) for the warp's kNTiles
// MMA tiles, summed over the kParts A operands; w is a swizzled [rows][kCols] tile. The two
// k-steps of each pass and the kParts operands accumulate in separate registers, so consecutive
// MMAs do not wait on each other.
template <int kCols, int kParts, typename E>
__device__ __forceinline__ void warp_mma(float (&acc)[WarpLayout<kCols>::kNTiles][4],
                                         const OperandLane<E> (&a)[kParts], const E* w, int col,
                                         int k0, int k1, int lane) {
  constexpr int kNTiles = WarpLayout<kCols>::kNTiles;
  float chain[2][kParts][kNTiles][4] = {};
  for (int k = k0; k < k1; k += 2 * kKStep) {
    uint32_t b[kNTiles][4];  // B fragments of k-steps k and k + 16, per MMA tile
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      load_matrices_transposed(b[j], w + swizzled<kCols>(k + lane, col + j * kMmaCols));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        uint32_t frag[4];
        load_matrices(frag, a[part].at(k + h * kKStep));
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          mma<E>(chain[h][part][j], frag, b[j][2 * h], b[j][2 * h + 1]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int part = 0; part < kParts; ++part) acc[j][i] += chain[h][part][j][i];
      }
    }
  }
}

// The block's [16][kCols] result in sum (row stride kCols + kSumPad): warps 4-7 (second half of
// the rows) leave theirs, warps 0-3 add their own (a fixed order). Accumulator i of MMA tile j of
// a lane is row lane / 4 + 8 (i / 2), column (warp % 4) kCols / 4 + 8 j + 2 (lane % 4) + i % 2
// (the MMA's C fragment).
template <int kCols>
__device__ __forceinline__ void collect_tile(const float (&acc)[WarpLayout<kCols>::kNTiles][4],
                                             float* sum, int warp, int lane) {
  constexpr int kStride = kCols + kSumPad;
  constexpr int kNTiles = WarpLayout<kCols>::kNTiles;
  const int col = (warp % 4) * (kCols / 4) + (lane % 4) * 2;
  const int row = lane / 4;
  if (warp >= 4) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sum[(row + 8 * (i / 2)) * kStride + col + j * kMmaCols + i % 2] = acc[j][i];
      }
    }
  }
  __syncthreads();
  if (warp < 4) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sum[(row + 8 * (i / 2)) * kStride + col + j * kMmaCols + i % 2] += acc[j][i];
      }
    }
  }
  __syncthreads();
}

// The down projection's split: R / 8 column tiles times chunks of D, about kTargetDownItems
// items, at most kMaxChunks chunks (every block sums chunks x T x R partials after the barrier).
__host__ __device__ constexpr int larger(int a, int b) { return a > b ? a : b; }

struct DownPlan {
  int col_tiles, chunks, chunk_rows;
  __host__ __device__ int items() const { return col_tiles * chunks; }
};

// Shared memory, in 16-bit elements, then floats, then barriers; every region 16-byte aligned
// and the weight tiles first (1024-byte aligned, for the swizzle). The down step's w_down tile
// and hidden rows and the up step's A operand and staged partials are never live together, so
// they share one region.
struct Smem {
  int up_rows, cols, stages, tokens, chunk_rows, chunks, rank;
  __host__ __device__ int a_stride() const { return up_rows + kRowPad; }
  __host__ __device__ int x_stride() const { return chunk_rows + kRowPad; }
  __host__ __device__ int stage_elems() const { return up_rows * cols; }
  __host__ __device__ int down_tile_elems() const { return chunk_rows * kMmaCols; }
  __host__ __device__ int a_elems() const { return 2 * tokens * a_stride(); }  // hi and lo
  __host__ __device__ int staged_floats() const { return chunks * tokens * rank; }
  __host__ __device__ int shared_elems() const {
    const int down = down_tile_elems() + tokens * x_stride();  // w_down tile, hidden rows
    const int up = a_elems() + 2 * staged_floats();            // A operand, partials
    return (larger(down, up) + 7) / 8 * 8;
  }
  __host__ __device__ int sum_floats() const {
    return larger(kWarps * kTokens * kMmaCols, kTokens * (cols + kSumPad));
  }
  __host__ __device__ size_t bytes() const {
    return 2 * (stages * stage_elems() + shared_elems() + kMmaCols) +  // + the zero row
           sizeof(float) * sum_floats() + sizeof(uint64_t) * stages;
  }
};

// Down item (column tile c, chunk q): partials[q][t][8 c .. 8 c + 8) = hidden[t][chunk q] @
// w_down[chunk q][8 c .. 8 c + 8). request_down_item starts the copies of its w_down rows (16 bytes
// each) and hidden rows, zeros past D; finish_down_item waits for them, the 8 warps split the
// chunk's rows, and their [16][8] results are summed in shared memory in warp order
// (deterministic).
template <typename E>
__device__ __forceinline__ void request_down_item(const Params<E>& p, const Smem& plan, int item,
                                                  E* w_tile, E* x) {
  const int col0 = (item % p.down_col_tiles) * kMmaCols;
  const int d0 = (item / p.down_col_tiles) * plan.chunk_rows, x_stride = plan.x_stride();
  for (int i = threadIdx.x; i < plan.chunk_rows; i += kThreads) {
    const int d = d0 + i;
    const bool valid = d < p.model_dim;
    copy16_async(w_tile + i * kMmaCols,
                 valid ? p.w_down + static_cast<int64_t>(d) * p.w_down_stride + col0 : p.w_down,
                 valid);
  }
  if (p.hidden_vectors) {
    const int vectors = plan.chunk_rows / 8;
    for (int i = threadIdx.x; i < p.tokens * vectors; i += kThreads) {
      const int t = i / vectors, d = d0 + (i % vectors) * 8;
      const bool valid = d < p.model_dim;
      copy16_async(x + t * x_stride + d - d0,
                   valid ? p.hidden + token_offset(t, p.seq, p.hidden_stride_batch,
                                                   p.hidden_stride_seq) + d
                         : p.hidden,
                   valid);
    }
  } else {
    for (int i = threadIdx.x; i < p.tokens * plan.chunk_rows; i += kThreads) {
      const int t = i / plan.chunk_rows, d = d0 + i % plan.chunk_rows;
      x[t * x_stride + d - d0] =
          d < p.model_dim
              ? p.hidden[token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) + d]
              : from_float<E>(0.f);
    }
  }
}

template <typename E>
__device__ __forceinline__ void finish_down_item(const Params<E>& p, const Smem& plan, int item,
                                                 const E* w_tile, const E* x, float* sum,
                                                 const E* zeros) {
  wait_async_copies();
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int rows = plan.chunk_rows / kWarps, k0 = warp * rows;
  const OperandLane<E> a(x, plan.x_stride(), p.tokens, zeros, lane);
  float chain[2][4] = {};
  for (int k = k0; k < k0 + rows; k += 2 * kKStep) {
    uint32_t b[4];  // k-steps k and k + 16 of the 8 columns
    load_matrices_transposed(b, w_tile + (k + lane) * kMmaCols);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t frag[4];
      load_matrices(frag, a.at(k + h * kKStep));
      mma<E>(chain[h], frag, b[2 * h], b[2 * h + 1]);
    }
  }
  // Accumulator i of a lane: row lane / 4 + 8 (i / 2), column 2 (lane % 4) + i % 2.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum[(warp * kTokens + lane / 4 + 8 * (i / 2)) * kMmaCols + 2 * (lane % 4) + i % 2] =
        chain[0][i] + chain[1][i];
  }
  __syncthreads();
  if (threadIdx.x < p.tokens * kMmaCols) {
    const int t = threadIdx.x / kMmaCols, j = threadIdx.x % kMmaCols;
    const int q = item / p.down_col_tiles, col = (item % p.down_col_tiles) * kMmaCols + j;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sum[(w * kTokens + t) * kMmaCols + j];
    p.partials[(static_cast<int64_t>(q) * p.tokens + t) * p.rank + col] = total;
  }
  __syncthreads();  // the tiles and sum are reused by the next item
}

// The latent [T][R]: the chunks' partials, staged in shared memory by one sweep of copies (one
// L2 round trip whatever T), summed in chunk order into the up step's A operand: a_hi = the
// latent rounded to E, a_lo = the rounding's remainder; zeros in the columns past R (the weight
// tiles' zero rows meet them). The caller's latent gets a_hi.
template <typename E>
__device__ __forceinline__ void gather_latent(const Params<E>& p, const Smem& plan, E* a_hi,
                                              E* a_lo, float* staged) {
  for (int i = threadIdx.x; i < plan.staged_floats() / 4; i += kThreads) {
    copy16_async(staged + 4 * i, p.partials + 4 * i, true);  // L2, not L1: written by other SMs
  }
  wait_async_copies();
  __syncthreads();
  // Eight columns per thread and step (R % 8 == 0: all of them or none past R); token row t of
  // the caller's latent is written by block t % gridDim.x, spreading that work over the blocks.
  const int a_stride = plan.a_stride(), octets = plan.up_rows / 8;
  for (int i = threadIdx.x; i < p.tokens * octets; i += kThreads) {
    const int t = i / octets, r = (i % octets) * 8;
    float total[8] = {};
    if (r < p.rank) {
      for (int q = 0; q < plan.chunks; ++q) {
        const float4* src =
            reinterpret_cast<const float4*>(staged + (q * p.tokens + t) * p.rank + r);
        const float4 lo4 = src[0], hi4 = src[1];
        const float v[8] = {lo4.x, lo4.y, lo4.z, lo4.w, hi4.x, hi4.y, hi4.z, hi4.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) total[e] += v[e];
      }
    }
    alignas(16) E hi[8], lo[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      hi[e] = from_float<E>(total[e]);
      lo[e] = from_float<E>(total[e] - to_float(hi[e]));
    }
    *reinterpret_cast<uint4*>(a_hi + t * a_stride + r) = *reinterpret_cast<const uint4*>(hi);
    *reinterpret_cast<uint4*>(a_lo + t * a_stride + r) = *reinterpret_cast<const uint4*>(lo);
    if (p.latent_out != nullptr && t % gridDim.x == blockIdx.x && r < p.rank) {
      E* row = p.latent_out + token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq);
#pragma unroll
      for (int e = 0; e < 8; ++e) row[r + e] = hi[e];
    }
  }
}

// Compiled for sm_90 only (below it the body is empty: the row never launches it there).
template <typename E, int kCols>
__global__ void __launch_bounds__(kThreads, 1)
    kv_proj_decode_tc_sm90(const __grid_constant__ Params<E> p) {
#if LATENTKV_SM90
  extern __shared__ __align__(1024) unsigned char smem[];  // swizzled tiles first
  static_assert(sizeof(E) == 2, "16-bit elements (the shared-memory plan counts in them)");
  const int chunks = p.down_items / p.down_col_tiles;
  const Smem plan{p.rank_rows, kCols, p.up_stages, p.tokens, p.chunk_rows, chunks, p.rank};
  E* w_up = reinterpret_cast<E*>(smem);                       // [stages][rank_rows][kCols]
  E* shared = w_up + plan.stages * plan.stage_elems();
  E* w_tile = shared;                                         // down: [chunk_rows][8]
  E* x = shared + plan.down_tile_elems();                     // down: [T][x_stride]
  E* a_hi = shared;                                           // up: [T][a_stride]
  E* a_lo = shared + p.tokens * plan.a_stride();              // up: [T][a_stride]
  float* staged = reinterpret_cast<float*>(shared + plan.a_elems());  // up: [chunks][T][R]
  E* zeros = shared + plan.shared_elems();                    // [8]
  float* sum = reinterpret_cast<float*>(zeros + kMmaCols);
  uint64_t* w_bar = reinterpret_cast<uint64_t*>(sum + plan.sum_floats());  // [stages]

  const int rows = p.rank_rows;
  const int tiles_per_half = (p.kv_width + kCols - 1) / kCols;
  const int tiles = 2 * tiles_per_half;
  auto request = [&](int tile, int stage) {
    const int kv = tile / tiles_per_half, col0 = (tile % tiles_per_half) * kCols;
    copy_weight_tile<kCols>(w_up + stage * plan.stage_elems(), &p.w_up_map[kv], 0, rows, col0,
                            w_bar + stage);
  };
  // w_down and hidden first: the barrier waits on them, the up tiles are needed after it.
  if (blockIdx.x < p.down_items) request_down_item(p, plan, blockIdx.x, w_tile, x);
  if (threadIdx.x == 0) {
    for (int s = 0; s < plan.stages; ++s) init_barrier(w_bar + s);
    publish_barrier_init();
    for (int s = 0; s < plan.stages; ++s) {
      const int tile = blockIdx.x + s * gridDim.x;
      if (tile < tiles) request(tile, s);
    }
  }
  if (threadIdx.x < kMmaCols) zeros[threadIdx.x] = from_float<E>(0.f);
  // The barriers' initialization and the zero row are published by the first __syncthreads of
  // finish_down_item, or by the grid barrier in a block without a down item.

  for (int item = blockIdx.x; item < p.down_items; item += gridDim.x) {
    if (item != blockIdx.x) request_down_item(p, plan, item, w_tile, x);
    finish_down_item(p, plan, item, w_tile, x, sum, zeros);
  }
  cg::this_grid().sync();  // every partial is written and visible
  gather_latent(p, plan, a_hi, a_lo, staged);
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = rows / 2, k0 = (warp / 4) * half;
  const OperandLane<E> a[2] = {OperandLane<E>(a_hi, plan.a_stride(), p.tokens, zeros, lane),
                               OperandLane<E>(a_lo, plan.a_stride(), p.tokens, zeros, lane)};
  for (int i = 0, tile = blockIdx.x; tile < tiles; ++i, tile += gridDim.x) {
    const int stage = i % plan.stages;
    wait_barrier(w_bar + stage, (i / plan.stages) & 1);
    float acc[WarpLayout<kCols>::kNTiles][4] = {};
    warp_mma<kCols, 2>(acc, a, w_up + stage * plan.stage_elems(), (warp % 4) * (kCols / 4), k0,
                       k0 + half, lane);
    collect_tile<kCols>(acc, sum, warp, lane);  // every warp is done with the stage after this
    const int next = tile + plan.stages * gridDim.x;
    if (threadIdx.x == 0 && next < tiles) request(next, stage);

    const int kv = tile / tiles_per_half, col0 = (tile % tiles_per_half) * kCols;
    for (int j = threadIdx.x; j < p.tokens * kCols; j += kThreads) {
      const int t = j / kCols, n = col0 + j % kCols;
      if (n >= p.kv_width) continue;
      p.out[out_offset(p, kv, t, n)] = from_float<E>(sum[t * (kCols + kSumPad) + j % kCols]);
    }
    __syncthreads();  // sum is rewritten by the next tile
  }
#endif
}

int rank_rows(const Problem& p) { return static_cast<int>(round_up<int64_t>(p.rank, kUpRowAlign)); }
// Worked out in int64 with no divisor below 1, so that no problem divides by zero; the int fields
// hold the values for the problems cuda_decode_tc_fits bounds (and saturate above them).
DownPlan down_plan(const Problem& p) {
  const auto to_int = [](int64_t v) { return static_cast<int>(std::min<int64_t>(v, INT_MAX)); };
  const int64_t col_tiles = std::max<int64_t>(p.rank / kMmaCols, 1);
  const int64_t want = std::clamp<int64_t>(kTargetDownItems / col_tiles, 1, kMaxChunks);
  const int64_t chunk_rows =
      std::max<int64_t>(round_up<int64_t>(ceil_div<int64_t>(p.model_dim, want), kDownRowAlign),
                        kDownRowAlign);
  DownPlan d;
  d.col_tiles = to_int(col_tiles);
  d.chunk_rows = to_int(chunk_rows);
  d.chunks = to_int(ceil_div<int64_t>(p.model_dim, chunk_rows));
  return d;
}
int up_tiles(const Problem& p, int cols) {
  return static_cast<int>(2 * ceil_div<int64_t>(p.kv_width(), cols));
}
Smem smem_plan(const Problem& p, int cols, int stages) {
  const DownPlan down = down_plan(p);
  return {rank_rows(p), cols, stages, static_cast<int>(p.tokens()), down.chunk_rows, down.chunks,
          static_cast<int>(p.rank)};
}

template <typename E>
cudaError_t opt_in(int bytes) {
  cudaError_t err = cudaFuncSetAttribute(kv_proj_decode_tc_sm90<E, kNarrowUpCols>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(kv_proj_decode_tc_sm90<E, kWideUpCols>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// The per-device setup (prepared_device): cooperative launches supported, every variant opted in
// to the device's shared-memory limit.
struct DecodeKernels {
  static Status setup(const DeviceFacts& f) {
    const int bytes = static_cast<int>(f.smem_optin);
    cudaError_t err = opt_in<__nv_bfloat16>(bytes);
    if (err == cudaSuccess) err = opt_in<__half>(bytes);
    if (err != cudaSuccess) return cuda_status(err, "cuda-decode: shared-memory opt-in");
    if (!f.cooperative_launch) {
      return {StatusCode::kUnsupported,
              "cuda-decode: the device does not support cooperative launches"};
    }
    return Status::Ok();
  }
};

// Hopper's opt-in limit, for the device-free size check (the launch checks the device's own).
constexpr size_t kHopperSmemBytes = 227 * 1024;

// cuTensorMapEncodeTiled, looked up once through the runtime (no link against the driver library).
using TensorMapEncoder = PFN_cuTensorMapEncodeTiled_v12000;
Status tensor_map_encoder(TensorMapEncoder* out) {
  static std::once_flag once;
  static TensorMapEncoder encoder = nullptr;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      encoder = reinterpret_cast<TensorMapEncoder>(fn);
    }
  });
  *out = encoder;
  if (encoder == nullptr) {
    return {StatusCode::kCudaError,
            "cuda-decode: the driver does not provide cuTensorMapEncodeTiled (CUDA 12+ needed)"};
  }
  return Status::Ok();
}

// A row-major [rows][cols] matrix (row stride ld elements) in kBoxRows x box_cols boxes.
template <typename E>
Status encode_weight_map(CUtensorMap* map, TensorMapEncoder encode, const void* matrix,
                         int64_t rows, int64_t cols, int64_t ld, int box_cols) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(E)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), kBoxRows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(
      map, std::is_same_v<E, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      2, const_cast<void*>(matrix), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      box_cols * sizeof(E) == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return {StatusCode::kCudaError,
            "cuda-decode: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(r)};
  }
  return Status::Ok();
}

template <typename E, int kUpCols>
Status launch(const Problem& p, const Args& a, Stream stream, const DeviceFacts& facts) {
  Params<E> k;
  copy_activation_args<E>(p, a, k);
  k.w_down = static_cast<const E*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.latent_out = static_cast<E*>(a.latent);
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.partials = static_cast<float*>(a.workspace);
  const DownPlan down = down_plan(p);
  k.chunk_rows = down.chunk_rows;
  k.down_col_tiles = down.col_tiles;
  k.down_items = down.items();
  k.rank_rows = rank_rows(p);
  k.hidden_vectors = is_aligned(a.hidden, 16) && a.hidden_stride_batch % 8 == 0 &&
                     a.hidden_stride_seq % 8 == 0 && p.model_dim % 8 == 0;

  TensorMapEncoder encode = nullptr;
  if (Status found = tensor_map_encoder(&encode); !found.ok()) return found;
  const Status mapped[] = {encode_weight_map<E>(&k.w_up_map[0], encode, a.w_up_k, p.rank,
                                                p.kv_width(), a.w_up_k_stride_row, kUpCols),
                           encode_weight_map<E>(&k.w_up_map[1], encode, a.w_up_v, p.rank,
                                                p.kv_width(), a.w_up_v_stride_row, kUpCols)};
  for (const Status& m : mapped) {
    if (!m.ok()) return m;
  }

  // One block per SM (fewer when there is less work): every block must be resident at once for
  // the grid-wide barrier, which the cooperative launch checks. Each walks its up tiles with as
  // many in flight as its shared memory holds (up to kMaxUpStages).
  const int tiles = up_tiles(p, kUpCols);
  const int grid = std::min(facts.sm_count, std::max(down.items(), tiles));
  Smem plan = smem_plan(p, kUpCols, std::min<int>(kMaxUpStages, ceil_div(tiles, grid)));
  while (plan.stages > 1 && plan.bytes() > facts.smem_optin) --plan.stages;
  k.up_stages = plan.stages;
  const size_t bytes = plan.bytes();
  if (bytes > facts.smem_optin) {
    return {StatusCode::kUnsupported, "cuda-decode: needs " + std::to_string(bytes) +
                                          " bytes of shared memory per block; the device allows " +
                                          std::to_string(facts.smem_optin)};
  }

  cudaLaunchAttribute cooperative[1];
  cooperative[0].id = cudaLaunchAttributeCooperative;
  cooperative[0].val.cooperative = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = bytes;
  config.stream = stream;
  config.attrs = cooperative;
  config.numAttrs = 1;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kv_proj_decode_tc_sm90<E, kUpCols>, k);
  if (launched == cudaErrorCooperativeLaunchTooLarge) {
    cudaGetLastError();  // not sticky, and nothing was enqueued: clear it for the caller
    return {StatusCode::kUnsupported,
            "cuda-decode: the cooperative launch of " + std::to_string(grid) +
                " blocks was refused: fewer SMs can hold a block at once than the device "
                "reports (an MPS active-thread limit, a green context, or other kernels' shared "
                "memory)"};
  }
  return cuda_status(launched, "cudaLaunchKernelEx(kv_proj_decode_tc_sm90, cooperative)");
}

// The up tiles' width (heuristics.h): 64 columns (128-byte weight rows) once there are enough
// tiles for several per SM (DeepSeek-V3: 512) and one fits beside the down step's share; 32
// columns otherwise (V2-Lite: 128 tiles, one per SM).
template <typename E>
Status launch_for_width(const Problem& p, const Args& a, Stream stream) {
  const DeviceFacts* facts = nullptr;
  if (Status queried = prepared_device<DecodeKernels>(&facts); !queried.ok()) return queried;
  if (decode_tc_use_wide_tiles(up_tiles(p, kWideUpCols),
                               smem_plan(p, kWideUpCols, 1).bytes() <= facts->smem_optin,
                               facts->sm_count)) {
    return launch<E, kWideUpCols>(p, a, stream, *facts);
  }
  return launch<E, kNarrowUpCols>(p, a, stream, *facts);
}

Status refuse(const std::string& why) {
  return {StatusCode::kUnsupported, "cuda-decode: " + why};
}

}  // namespace

// The down items' partial latents, [chunks][T][R] float32.
int64_t cuda_decode_tc_workspace_size(const Problem& p) {
  return static_cast<int64_t>(sizeof(float)) * down_plan(p).chunks * p.tokens() * p.rank;
}

Status cuda_decode_tc_fits(const Problem& p) {
  if (p.dtype == DType::kFloat32) return refuse("float32 takes the FFMA decode kernels");
  if (p.tokens() > kTokens) {
    return refuse("problem tokens (batch * seq) = " + std::to_string(p.tokens()) +
                  " exceeds the " + std::to_string(kTokens) + " it is built for");
  }
  if (p.model_dim > INT_MAX / 2 || 2 * p.kv_width() > INT_MAX / 2 || p.rank > INT_MAX / 4) {
    return refuse("problem.model_dim, rank or heads * head_dim exceeds its int32 indexing");
  }
  if (p.rank % 8 != 0 || p.kv_width() % 8 != 0) {
    return refuse("needs problem.rank = " + std::to_string(p.rank) +
                  " and heads * head_dim = " + std::to_string(p.kv_width()) +
                  " to be multiples of 8 (16-byte weight rows)");
  }
  // Past these no plan fits in shared memory (the A operand alone takes 4 R bytes, a down item
  // 16 x D / 8 bytes), and the plan's int arithmetic stays far from overflow below them.
  constexpr int64_t kMaxRank = int64_t{1} << 16, kMaxModelDim = int64_t{1} << 24;
  const bool huge = p.rank > kMaxRank || p.model_dim > kMaxModelDim;
  const size_t bytes = huge ? SIZE_MAX : smem_plan(p, kNarrowUpCols, 1).bytes();
  if (bytes > kHopperSmemBytes) {
    return refuse("problem.model_dim = " + std::to_string(p.model_dim) + ", rank = " +
                  std::to_string(p.rank) + " and tokens = " + std::to_string(p.tokens()) +
                  " need " + (huge ? std::string("more") : std::to_string(bytes)) +
                  " bytes of shared memory per block, over the " +
                  std::to_string(kHopperSmemBytes) + " available");
  }
  return Status::Ok();
}

// The kernel's body exists only in code compiled for sm_90 (ptx.h); a build without it (e.g.
// CMAKE_CUDA_ARCHITECTURES=80 run on Hopper) refuses, and kAuto runs cuda-gemm.
Status cuda_decode_tc_compiled() {
  const int arch = compiled_arch<kv_proj_decode_tc_sm90<__nv_bfloat16, kNarrowUpCols>>();
  if (arch >= 90) return Status::Ok();
  return refuse("this build has no sm_90 code for kv_proj_decode_tc_sm90 (compiled for compute_" +
                std::to_string(arch) + "); build with CMAKE_CUDA_ARCHITECTURES=90a");
}

Status run_cuda_decode_tc(const Problem& p, const Args& a, Stream stream) {
  if (p.dtype == DType::kBFloat16) return launch_for_width<__nv_bfloat16>(p, a, stream);
  if (p.dtype == DType::kFloat16) return launch_for_width<__half>(p, a, stream);
  return refuse("float32 takes the FFMA decode kernels");
}

}  // namespace latentkv::detail
