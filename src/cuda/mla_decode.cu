// cuda-mla-decode: the MLA path (mla.h) for few tokens, bf16 and fp16. At T <= 64 both stages are
// weight streams (DeepSeek-V3: [q_a; kv_a] 30 MB, kv_b 33.5 MB), so every SM streams its slice of
// the weights with 16-byte loads (all of a step's loads issued before any is used) into
// mma.sync m16n8k16 with the tokens as the M side: 1, 2 or 4 token tiles of 16 (a template
// argument; T = 1 and T = 16 cost the same instructions, rows past T are zeros), each weight
// fragment feeding every tile, and a weight row per n column. On small weights (heuristics.h) a
// call past 16 tokens runs windows instead (K1's blockIdx.z, K3's blockIdx.y: of 16 tokens, 32
// past 48 tokens): more blocks, each window reading the weights from L2 again.
// A K-block of 32 columns is one 16-byte load per thread: thread (g = lane / 4, q = lane % 4)
// holds elements 8q .. 8q + 7 of row g, which the two k16 MMAs of the block read as their k pairs
// {2q, 2q + 1, 2q + 8, 2q + 9} (any fixed permutation of k works when A and B use the same one).
// Three launches, chained by programmatic dependent launch (sm_90; below it plain stream order),
// K1 itself a programmatic dependent of the kernel before the call on small weights (heuristics.h):
//   K1 mla_decode_stage_a      block = 64 weight rows of [q_a_weight; kv_a_weight] (a warp per
//                              8) x one chunk of D (chunks so that <= 2 blocks per SM; 1 where K3
//                              follows and stage A's weights are small, so a K3 block fits
//                              beside it, and with K3 planned beside it a shared-memory
//                              carveout that holds K3's blocks; steps of 256 columns, 8 loads
//                              in flight per thread, double-buffered; 128 and 4 with four
//                              token tiles); the hidden chunk [T, chunk] staged in shared
//                              memory (chunks narrow as T grows: under 48 KB); partial dot
//                              products to the workspace [chunk][T][rows] float32.
//   K2 mla_decode_stage_a_epilogue  block = (slice of 256 rows, token; at least 16 token rows,
//                              those past T only waiting for K1): sums its rows over the
//                              chunks (fixed order), then per norm group (q_a, c) the slices'
//                              squares summed in slice order: on sm_90 a token's slices (at most
//                              16) are one cluster and each slice reads the others' sums from
//                              their shared memory and normalizes its own rows; else the block
//                              that finishes last (an arrival counter per token and group,
//                              zeroed by K1) normalizes the whole row. Either writes q_a, the
//                              cache row's c and c for stage B; the k_pe slice
//                              rotates (mla_rope.h: every style and form, NaN past the table)
//                              into the cache row and stage B's k_pe. Without q_a, where the
//                              row fits a block and its partials are at most 4 round trips of 8
//                              chunks, one block per token does the whole [c | k_pe] row instead
//                              (no counters: the row epilogue).
//                              At one token through both stages K2 is not launched where K3
//                              holds whole tiles: every K3 block runs the row epilogue itself
//                              (heuristics.h: the fold).
//   K3 mla_decode_stage_b      persistent warps over 8-row tiles of kv_b_weight (all R columns):
//                              the first tile's weights are loaded into registers BEFORE
//                              waiting for K2, so kv_b's stream overlaps stage A (at one token
//                              tile with more tiles than the held plan's warps, heuristics.h: a
//                              ring of 4 K-blocks in registers, 4 blocks per SM); no L2
//                              prefetches (they slowed a fresh stream: docs/perf.md); then
//                              c [T, R] (dtype) and k_pe go into shared memory by cp.async
//                              where the rows are whole vectors (opted in past 48 KB
//                              from 17 tokens), K[t, h, :dn] and V[t, h, :] are written straight
//                              from the accumulators (rounded once; two adjacent columns as one
//                              32-bit store where the strides allow) and K's k_pe columns from
//                              k_pe.
//   KA mla_decode_fused_stage_a  K1 and K2 as one cooperative kernel where heuristics.h prefers
//                              it (q_a merged, or up to 4 tokens through the first stage alone
//                              on large weights): blocks of 16 rows x a chunk of D (at most 2 per
//                              SM, so the grid is resident), the warps taking runs of the chunk's
//                              K-blocks, hidden's A fragments read from L2, the warps' sums joined
//                              in shared memory, a few chunk partials per row, one grid-wide
//                              barrier, then block t runs the row epilogue of token t and block
//                              T + t normalizes its q_a. K3 follows it as it follows K2.
// kFirst runs K1 + K2 (or KA); kSecond runs K3 alone, gathering c and k_pe from args.latent and
// args.k_pe or the cache by slot (a skipped slot gives zero rows of K and V); kBoth runs all
// three. Results are deterministic (every sum in a fixed order).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "backends.h"
#include "cuda/common.h"
#include "cuda/convert.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/mla_decode.h"
#include "cuda/mla_epilogue.h"
#include "cuda/mla_rope.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"
#include "validation.h"

namespace latentkv::detail {
namespace {

constexpr int kThreads = 256;  // every kernel: 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMTile = tiles::kMlaDecodeTokenTile;  // tokens per MMA tile: the MMA's M side
constexpr int kMaxMTiles = tiles::kMlaDecodeMaxTokenTiles;  // 1, 2 or 4 per call (instantiations)
constexpr int kMaxTokens = kMTile * kMaxMTiles;
constexpr int kTileRows = 8;    // weight rows per warp tile: the MMA's N side
constexpr int kKBlock = 32;     // columns per 16-byte load of 4 threads: two k16 MMAs
// K-blocks per step of stage A: 8 loads in flight per thread (256 columns); four token tiles' 16
// accumulators and fragments leave room for 4 within the 128 registers of two blocks per SM.
template <int kM>
constexpr int kStageALoads = kM == 4 ? 4 : 8;
template <int kM>
constexpr int kStageAStep = kStageALoads<kM> * kKBlock;
// K1's hidden chunk [T, smem_ld(chunk)] in shared memory stays under the 48 KB of a plain launch
// (max_chunk(T): 1472 columns at T = 16, 320 at T = 64), and at most kMaxChunk columns.
constexpr int kHiddenSmemBytes = 48 * 1024;
constexpr int kMaxChunk = 2048;
constexpr int kMinChunk = 256;   // smaller chunks cost more in partials than they spread (V2-Lite)
// K-blocks of stage B held at once: 512 columns of kv_b (256 with four token tiles: registers),
// or the one-token-tile ring's 4 (stage_b_ring: 60 registers in all, under the 64 of 4 blocks per
// SM; 8 K-blocks spilled there).
template <int kM, bool kRing>
constexpr int kStageBLoads = kRing ? 4 : kM == 4 ? 8 : 16;
template <int kM, bool kRing>
constexpr int kStageBStep = kStageBLoads<kM, kRing> * kKBlock;
// Token tiles up to which each stage's mma_step runs without its branch at `end` (past them the
// registers of the fragment loads issued ahead spill: stage A's at two tiles, either at four).
constexpr int kStageANoBreakTiles = 1;
constexpr int kStageBNoBreakTiles = 2;
constexpr int kMaxRank = 1024;     // c [16, R + pad] in shared memory beside k_pe (< 48 KB)
constexpr int kSlice = kThreads;   // K2: one row per thread
constexpr int kMaxClusterSlices = 16;  // K2's slices per token as one cluster (non-portable: sm_90)
constexpr int kMaxRopeDim = kThreads;  // K2's k_pe slice is one block
constexpr int kBlocksPerSm = 2;    // K1's and K3's target (launch bounds allow two)
// K3's blocks per SM (launch bounds and grid): the ring's 4, so that a fresh kv_b stream has the
// warps per SM it needs (dev/stream_probe.cu: 2.8 / 3.6 / 3.8 TB/s at 1 / 2 / 4 blocks per SM,
// nearly independent of the loads per thread), else kBlocksPerSm.
template <bool kRing>
constexpr int kStageBBlocksPerSm = kRing ? 4 : kBlocksPerSm;
// K1's target with stage B behind it and small stage-A weights (heuristics.h): one block per SM
// leaves room for K3 blocks beside it (104 + 112 registers x 256 threads of 64K; two ring blocks
// of 64), which issue their first kv_b tiles while K1 runs.
constexpr int kStageABlocksBeforeB = 1;
// Shared-memory rows padded to 64 bytes past a 128-byte multiple: the 8 rows an A fragment load
// reads at one offset fall in different banks.
constexpr int kRowPad = 32;  // elements (16-bit)
static_assert(kMTile == 16, "the m16n8k16 MMA's M side");
static_assert(kMaxMTiles == 4, "launch_tiles() switches over 1, 2 and 4 token tiles");
static_assert(kMinChunk % kKBlock == 0 && kMaxChunk % kKBlock == 0, "chunks of whole K-blocks");

// One token tile leaves one accumulator chain of 2 MMAs per K-block; in K3 (32 per tile) a second
// chain (even and odd K-blocks) halves the dependent MMA latency a tile waits on. More tiles are
// chains already. K1 keeps one: its 6 more registers would cost K2 its place beside two K1 blocks.
template <int kM>
constexpr int kStageBChains = kM == 1 ? 2 : 1;
static_assert(kSlice % 32 == 0, "K2 reduces per warp");

// Row stride in elements of a shared-memory operand of `width` columns.
LATENTKV_HD constexpr int smem_ld(int width) { return round_up(width, 64) + kRowPad; }

// K1's widest chunk at T tokens: smem_ld(chunk) * T * 2 B <= kHiddenSmemBytes, whole 64-column
// groups (smem_ld's rounding), at most kMaxChunk.
LATENTKV_HD constexpr int max_chunk(int tokens) {
  const int width = (kHiddenSmemBytes / (2 * tokens) - kRowPad) / 64 * 64;
  return width < kMaxChunk ? width : kMaxChunk;
}
static_assert(max_chunk(kMaxTokens) >= kMinChunk && max_chunk(kMaxTokens) % kKBlock == 0,
              "every T keeps chunks of whole K-blocks of at least kMinChunk");
static_assert(2 * kMaxTokens * smem_ld(max_chunk(kMaxTokens)) <= kHiddenSmemBytes,
              "K1's hidden chunk fits a plain launch at the most tokens");

struct DecodeParams {
  int tokens, seq;       // T, S
  int window;            // tokens per block window of K1 and K3: T, or their token tiles
  int model_dim;         // D
  int q_rows, a_rows;    // Rq run (0 without q_a), Rq run + R + dr
  int rows_ld;           // a_rows rounded up to whole tiles
  int chunk, chunks;     // K1's D chunk and their count
  bool prefetch_weights_l2;  // K1 asks L2 for its weight rows before its wait (programmatic)
  int q_slices, c_slices, slices;  // K2's slices: q_a, c, then one for k_pe
  int kv_rank, rope_dim, heads, nope_dim, v_dim, b_rows;  // R, dr, H, dn, dv, H * (dn + dv)

  // Stage A.
  const void* hidden;  // [B, S, D]
  int64_t hidden_stride_batch, hidden_stride_seq;
  const void* q_weight;  // [Rq, D] or null
  int64_t q_weight_ld;
  const void* kv_weight;  // [R + dr, D]
  int64_t kv_weight_ld;
  float* partials;        // [chunks, T, rows_ld]
  float* ckv;             // [T, rows_ld]: the sums (q_a and c rows)
  float* sumsq;           // [T, slices]
  unsigned* arrivals;     // [T, 2]: q_a and c slices done
  MlaEpilogueParams e;    // norms, RoPE, q_a, cache; e.latent: c [T, R] for stage B or null
  void* pe_out;           // [T, dr]: k_pe for stage B (rounded), or null

  // Stage B.
  bool whole_rows;       // K2 is the whole-row epilogue, one block per token
  bool cluster_norm;     // K2's slices of a token are one thread-block cluster (sm_90)
  bool fold;             // K3 runs it itself (mla_decode_fold_epilogue): no K2 launch
  bool pair_stores;      // K3 stores two adjacent outputs as one 32-bit word (store_kv_pair)
  bool from_stage_a;     // c and k_pe from e.latent / pe_out, else:
  bool c_vectors, pe_vectors;  // every token's c (k_pe) source row is whole 16-byte vectors
  const void* latent;    // [B, S, R] (args.latent) or null: from the cache by slot (e.cache)
  int64_t latent_stride_batch, latent_stride_seq;
  const void* k_pe;      // [B, S, dr] with latent
  int64_t k_pe_stride_batch, k_pe_stride_seq;
  const void* kv_b;      // [H * (dn + dv), R]
  int64_t kv_b_ld;
  MlaKRef k;             // [B, S, H, dn + dr]
  void* v;               // [B, S, H, dv]
  int64_t v_stride_batch, v_stride_seq, v_stride_head;
};

template <typename T>
__device__ __forceinline__ uint4 load_or_zero(const T* p, bool valid) {
  return valid ? load_vector(p) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ uint4 shared_vector(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// The tokens [begin, begin + count) of window `index` (K1's blockIdx.z, K3's blockIdx.y): all T in
// one window, or the kernel's token tiles each where the launcher runs windows over T > 16.
struct TokenWindow {
  int begin, count;
};

__device__ __forceinline__ TokenWindow token_window(const DecodeParams& p, int window, int index) {
  const int begin = index * window;
  return {begin, min(window, p.tokens - begin)};
}

// acc += A [16 tokens, K-block kb] @ W [kb, 8 rows]: x0 holds A row g's 8 columns at 8q, x1 row
// g + 8's, w the weight row's (load layout in the header).
template <typename T>
__device__ __forceinline__ void mma_block(float (&acc)[4], const uint4& x0, const uint4& x1,
                                          const uint4& w) {
  const uint32_t lo[4] = {x0.x, x1.x, x0.y, x1.y};
  const uint32_t hi[4] = {x0.z, x1.z, x0.w, x1.w};
  mma<T>(acc, lo, w.x, w.y);
  mma<T>(acc, hi, w.z, w.w);
}

// K-blocks [k0, k0 + kLoads * 32) of one weight row (null: zeros), this thread's 16 bytes of each;
// columns at or past `end` read nothing.
template <typename T, int kLoads>
__device__ __forceinline__ void load_row_step(const T* row, int k0, int end, int q,
                                              uint4 (&w)[kLoads]) {
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int k = k0 + j * kKBlock + 8 * q;
    w[j] = load_or_zero(row + k, row != nullptr && k < end);
  }
}

// Accumulators of kM token tiles (tile m: tokens 16m + g and 16m + g + 8, rows 2q and 2q + 1 of
// the weight tile) in kC chains that are summed at the end.
template <int kM, int kC>
struct Acc {
  float c[kC][kM][4];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int h = 0; h < kC; ++h)
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[h][m][i] = 0.f;
  }
  // Token tile m's four values, the chains summed.
  __device__ __forceinline__ float value(int m, int i) const {
    float v = 0.f;
#pragma unroll
    for (int h = 0; h < kC; ++h) v += c[h][m][i];
    return v;
  }
};

// The MMAs of one step against A [T, ...] in shared memory (row stride ld, column 0 = k_base):
// A rows past T and columns past `end` are zeros, not read. Up to kMaxTilesNoBreak token tiles
// (kStageANoBreakTiles, kStageBNoBreakTiles), no branch at `end`: K-blocks past it multiply zeros
// (w is zero there too), so the fragment loads of every K-block may issue ahead of the MMAs
// before them.
template <typename T, int kLoads, int kM, int kMaxTilesNoBreak, int kC>
__device__ __forceinline__ void mma_step(Acc<kM, kC>& acc, const T* a, int ld, int tokens, int k0,
                                         int k_base, int end, int g, int q,
                                         const uint4 (&w)[kLoads]) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    if constexpr (kM > kMaxTilesNoBreak) {
      if (k0 + j * kKBlock >= end) break;  // warp-uniform
    }
    const int k = k0 + j * kKBlock + 8 * q;
    const T* col = a + (k - k_base);
    const bool in = k < end;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int t0 = m * kMTile + g, t1 = t0 + 8;
      const uint4 x0 = in && t0 < tokens ? shared_vector(col + t0 * ld) : zero;
      const uint4 x1 = in && t1 < tokens ? shared_vector(col + t1 * ld) : zero;
      mma_block<T>(acc.c[j % kC][m], x0, x1, w[j]);
    }
  }
}

// Row n of [q_a_weight; kv_a_weight], or null past the last.
template <typename T>
__device__ __forceinline__ const T* stage_a_row(const DecodeParams& p, int n) {
  if (n < p.q_rows) return static_cast<const T*>(p.q_weight) + n * p.q_weight_ld;
  if (n < p.a_rows) return static_cast<const T*>(p.kv_weight) + (n - p.q_rows) * p.kv_weight_ld;
  return nullptr;
}

// K1. Block (row group x, chunk y); warp w takes rows (8x + w) * 8 .. + 8; kM token tiles.
template <typename T, int kM>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    mla_decode_stage_a(const __grid_constant__ DecodeParams p) {
  extern __shared__ uint4 smem_a[];
  T* x = reinterpret_cast<T*>(smem_a);  // [window, ld]: hidden[window, k_begin .. k_end)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int tile = blockIdx.x * kWarps + warp;
  const T* row = stage_a_row<T>(p, tile * kTileRows + g);
  const int k_begin = blockIdx.y * p.chunk;
  const int k_end = min(k_begin + p.chunk, p.model_dim);
  if (p.prefetch_weights_l2 && row != nullptr && blockIdx.z == 0) {
    // The block's weight rows into L2 while the kernel before runs (the lanes of a row take
    // every fourth 128-byte line of its chunk); the loads after the wait then come from L2.
    constexpr int kLine = 128 / sizeof(T);
    for (int k = k_begin + q * kLine; k < k_end; k += 4 * kLine) prefetch_l2(row + k);
  }
  start_after_previous_kernel();  // returns at once behind a plain launch
  const TokenWindow win = token_window(p, p.window, blockIdx.z);
  const int ld = smem_ld(p.chunk);

  uint4 wa[kStageALoads<kM>], wb[kStageALoads<kM>];
  load_row_step<T, kStageALoads<kM>>(row, k_begin, k_end, q, wa);

  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x < 2 * p.tokens) {
    p.arrivals[threadIdx.x] = 0u;  // K2 counts its slices from here
  }
  // The hidden chunk by cp.async: every vector in flight at once (T = 64: 8 per thread), none
  // through registers. takes() checked hidden's 16-byte rows; D % 8 == 0.
  const int vectors = (k_end - k_begin) / 8;  // per token row
  const T* hidden = static_cast<const T*>(p.hidden);
  for (int i = threadIdx.x; i < win.count * vectors; i += kThreads) {
    const int t = i / vectors, v = i % vectors;
    const T* src = hidden +
                   token_offset(win.begin + t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) +
                   k_begin;
    copy16_async(x + t * ld + 8 * v, src + 8 * v, true);
  }
  wait_async_copies();
  __syncthreads();

  Acc<kM, 1> acc;
  acc.zero();
  for (int k0 = k_begin; k0 < k_end; k0 += 2 * kStageAStep<kM>) {
    const int k1 = k0 + kStageAStep<kM>;
    if (k1 < k_end) load_row_step<T, kStageALoads<kM>>(row, k1, k_end, q, wb);
    mma_step<T, kStageALoads<kM>, kM, kStageANoBreakTiles>(acc, x, ld, win.count, k0, k_begin,
                                                           k_end, g, q, wa);
    if (k1 >= k_end) break;
    if (k1 + kStageAStep<kM> < k_end) {
      load_row_step<T, kStageALoads<kM>>(row, k1 + kStageAStep<kM>, k_end, q, wa);
    }
    mma_step<T, kStageALoads<kM>, kM, kStageANoBreakTiles>(acc, x, ld, win.count, k1, k_begin,
                                                           k_end, g, q, wb);
  }

  if (tile * kTileRows >= p.rows_ld) return;
  // Tile m: tokens 16m + g (values 0, 1) and 16m + g + 8 (2, 3) x rows 2q, 2q + 1 of the tile.
  float* out = p.partials +
               (static_cast<int64_t>(blockIdx.y) * p.tokens + win.begin) * p.rows_ld +
               tile * kTileRows + 2 * q;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int t0 = m * kMTile + g, t1 = t0 + 8;
    if (t0 < win.count) {
      *reinterpret_cast<float2*>(out + static_cast<int64_t>(t0) * p.rows_ld) =
          make_float2(acc.value(m, 0), acc.value(m, 1));
    }
    if (t1 < win.count) {
      *reinterpret_cast<float2*>(out + static_cast<int64_t>(t1) * p.rows_ld) =
          make_float2(acc.value(m, 2), acc.value(m, 3));
    }
  }
}

// K2's slice s of a token: rows [begin, end) of group 0 (q_a), 1 (c) or 2 (k_pe).
struct Slice {
  int group, begin, end, first, count;  // first / count: the group's slices
};

__device__ __forceinline__ Slice slice_of(const DecodeParams& p, int s) {
  if (s < p.q_slices) {
    return {0, s * kSlice, min((s + 1) * kSlice, p.q_rows), 0, p.q_slices};
  }
  if (s < p.q_slices + p.c_slices) {
    const int i = s - p.q_slices;
    return {1, p.q_rows + i * kSlice, p.q_rows + min((i + 1) * kSlice, p.kv_rank), p.q_slices,
            p.c_slices};
  }
  const int begin = p.q_rows + p.kv_rank;
  return {2, begin, begin + p.rope_dim, s, 1};
}

// Sum over the block (every thread gets it); red [kWarps] is reused after a barrier.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // red's previous use is over
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += red[w];
  return sum;
}

// Partials a K2 thread loads at once: V3's 28 chunks of D (kMinChunk) in one round trip (two
// batches of 16 measured 1.0 us slower on V3's first stage at T = 1; 48 registers either way).
constexpr int kPartialBatch = 32;
// K2's registers (<= 48) leave room for one of its blocks beside two of K1 (2 x 256 x 102 of the
// 64K registers), so it is resident and has read gamma and cos/sin before K1 ends.
constexpr int kEpilogueBlocksPerSm = 5;

// Gamma values a K2 thread holds from before its wait (rows threadIdx.x + j * kSlice of its norm
// group); the rest of a wider group is read after it.
constexpr int kHeldGamma = 8;

// A norm group's output rows of token t, indexed within the group: q_a's row (group 0), or the
// cache row (null: none) and stage B's c (null: none) for group 1.
template <typename T>
struct NormOutputs {
  T* out;
  T* latent;
};
template <typename T>
__device__ __forceinline__ NormOutputs<T> norm_outputs(const DecodeParams& p, bool q_group, int t,
                                                       T* cache) {
  if (q_group) {
    return {static_cast<T*>(p.e.q_a) +
                token_offset(t, p.e.seq, p.e.q_a_stride_batch, p.e.q_a_stride_seq),
            nullptr};
  }
  return {cache, p.e.latent == nullptr
                     ? nullptr
                     : static_cast<T*>(p.e.latent) + static_cast<int64_t>(t) * p.kv_rank};
}

// The last slice of a norm group to finish: rows [gbegin, gbegin + width) of token t normalized
// with gamma (gamma_held: this thread's first kHeldGamma values) and written to q_a (group 0) or
// the cache row (null: none) and stage B's c (group 1).
template <typename T>
__device__ __forceinline__ void normalize_group(const DecodeParams& p, const Slice& sl, int t,
                                const float (&gamma_held)[kHeldGamma], T* cache) {
  float total = 0.f;
  for (int s = 0; s < sl.count; ++s) total += __ldcg(p.sumsq + t * p.slices + sl.first + s);
  const bool q_group = sl.group == 0;
  const int gbegin = q_group ? 0 : p.q_rows;
  const int width = q_group ? p.q_rows : p.kv_rank;
  const float inv = rsqrtf(total / static_cast<float>(width) + p.e.eps);
  const T* gamma = static_cast<const T*>(q_group ? p.e.q_norm : p.e.kv_norm);
  const float* sums = p.ckv + static_cast<int64_t>(t) * p.rows_ld + gbegin;
  const NormOutputs<T> rows = norm_outputs<T>(p, q_group, t, cache);
  T* out = rows.out;
  T* latent = rows.latent;
  float x[kHeldGamma];  // all loads issued before the first store (the outputs may alias, to
                       // the compiler)
#pragma unroll
  for (int j = 0; j < kHeldGamma; ++j) {
    const int i = threadIdx.x + j * kSlice;
    x[j] = i < width ? __ldcg(sums + i) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kHeldGamma; ++j) {
    const int i = threadIdx.x + j * kSlice;
    if (i >= width) break;
    const T y = from_float<T>(x[j] * inv * gamma_held[j]);
    if (out != nullptr) out[i] = y;
    if (latent != nullptr) latent[i] = y;
  }
  for (int i = threadIdx.x + kHeldGamma * kSlice; i < width; i += kSlice) {
    const T y = from_float<T>(__ldcg(sums + i) * inv * to_float(gamma[i]));
    if (out != nullptr) out[i] = y;
    if (latent != nullptr) latent[i] = y;
  }
}

// The whole-row epilogue: one block sums all chunk partials of token t's [c | k_pe] row (in chunk
// order, as the sliced K2 does), normalizes c and rotates k_pe, with no arrival counters: K2 runs
// it as one block per token where there is no q_a and the row fits (mla_decode_whole_rows), and
// K3 folds it in at one token (mla_decode_fold_epilogue; then K2 is not launched).
constexpr int kRowEpilogueRows = 3;  // rows of [c | k_pe] per thread: R + dr <= 3 * kThreads
// Chunk partials per row in flight: 8, one L2 round trip at V2-Lite's 8 chunks (24 loads a thread
// within K2's 48 registers: sum_chunk_partials' loads take immediate offsets).
constexpr int kRowEpilogueBatch = 8;
// The whole-row K2's static shared memory (red, pe), for K1's carveout beside it.
constexpr int64_t kRowEpilogueStaticSmem = (kWarps + 2 * kMaxRopeDim) * sizeof(float);
static_assert(kRowEpilogueBatch <= kPartialBatch, "no more in flight than K2 holds");

// What the row epilogue reads before its wait (stage A writes none of it): this thread's gamma
// values and, for threads under dr / 2, its RoPE pair's angles (the table's dtype at run time:
// float32 or T).
struct RowEpilogueInputs {
  float gamma[kRowEpilogueRows];
  PairAngles angles;
  bool position_ok;
};

template <typename T, typename RopeT>
__device__ __forceinline__ void row_epilogue_angles(const DecodeParams& p, int t, int64_t position,
                                                    RowEpilogueInputs& f) {
  const RopeAngles<RopeT> a = rope_angles_at<RopeT>(p.e, t, position);
  f.position_ok = a.ok;
  const int half = p.rope_dim / 2;
  if (threadIdx.x < half) {
    f.angles = rope_pair_angles(a, rope_pair(p.e.style, threadIdx.x, half), threadIdx.x, half);
  }
}

template <typename T>
__device__ __forceinline__ void row_epilogue_gamma(const DecodeParams& p, RowEpilogueInputs& f) {
  const T* gamma = static_cast<const T*>(p.e.kv_norm);
#pragma unroll
  for (int j = 0; j < kRowEpilogueRows; ++j) {
    const int n = threadIdx.x + j * kThreads;
    f.gamma[j] = n < p.kv_rank ? to_float(gamma[n]) : 0.f;
  }
}

// The angles of token t at `position` (rope_position: a load the caller may issue earlier).
template <typename T>
__device__ __forceinline__ void row_epilogue_rope(const DecodeParams& p, int t, int64_t position,
                                                  RowEpilogueInputs& f) {
  if (p.e.rope_dtype == DType::kFloat32) {
    row_epilogue_angles<T, float>(p, t, position, f);
  } else {
    row_epilogue_angles<T, T>(p, t, position, f);
  }
}

template <typename T>
__device__ __forceinline__ RowEpilogueInputs row_epilogue_inputs(const DecodeParams& p, int t) {
  RowEpilogueInputs f{};
  row_epilogue_gamma<T>(p, f);
  row_epilogue_rope<T>(p, t, rope_position(p.e, t), f);
  return f;
}

// Token t's rows [first, first + width) summed over the chunk partials: x[j] holds row first +
// threadIdx.x + j * kThreads (zero past width), kBatch chunks' loads in flight at a time, the sum
// in chunk order.
template <int kRows, int kBatch>
__device__ __forceinline__ void sum_chunk_partials(const DecodeParams& p, int t, int first,
                                                   int width, float (&x)[kRows]) {
  const int64_t plane = static_cast<int64_t>(p.tokens) * p.rows_ld;
  // This thread's row of chunk 0; each chunk one plane further (a running pointer: the loads take
  // immediate offsets, not a 64-bit multiply each).
  const float* chunk = p.partials + static_cast<int64_t>(t) * p.rows_ld + first + threadIdx.x;
  bool row_live[kRows];
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    x[j] = 0.f;
    row_live[j] = threadIdx.x + j * kThreads < width;
  }
  for (int c0 = 0; c0 < p.chunks; c0 += kBatch) {
    float part[kRows][kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const bool live = c0 + b < p.chunks;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        part[j][b] = live && row_live[j] ? __ldcg(chunk + j * kThreads) : 0.f;
      }
      chunk += plane;
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j)
#pragma unroll
      for (int b = 0; b < kBatch; ++b) x[j] += part[j][b];
  }
}

// Token t's c into c [R] and k_pe into pe [dr] (shared or global memory, rounded to T), and both
// into the cache row (null: none), from the chunk partials of its [c | k_pe] rows (after q_a's
// q_rows, which only the fused stage A has here); x_pe [2 dr] and red [kWarps] are shared scratch.
template <typename T, int kBatch>
__device__ __forceinline__ void row_epilogue(const DecodeParams& p, const RowEpilogueInputs& f,
                                             int t, T* c, T* pe, T* cache, float* x_pe,
                                             float* red) {
  const int width = p.kv_rank + p.rope_dim;
  float x[kRowEpilogueRows];
  sum_chunk_partials<kRowEpilogueRows, kBatch>(p, t, p.q_rows, width, x);
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kRowEpilogueRows; ++j) {
    if (threadIdx.x + j * kThreads < p.kv_rank) ss += x[j] * x[j];
  }
  const float inv = rsqrtf(block_sum(ss, red) / static_cast<float>(p.kv_rank) + p.e.eps);
#pragma unroll
  for (int j = 0; j < kRowEpilogueRows; ++j) {
    const int n = threadIdx.x + j * kThreads;
    if (n < p.kv_rank) {
      const T y = from_float<T>(x[j] * inv * f.gamma[j]);
      if (c != nullptr) c[n] = y;
      if (cache != nullptr) cache[n] = y;
    } else if (n < width) {
      x_pe[n - p.kv_rank] = x[j];
    }
  }
  __syncthreads();
  const int half = p.rope_dim / 2;
  if (threadIdx.x < half) {
    rope_apply<T>(rope_pair(p.e.style, threadIdx.x, half), f.angles, f.position_ok, x_pe,
                  x_pe + p.rope_dim);
  }
  __syncthreads();
  if (threadIdx.x < p.rope_dim) {
    const T y = from_float<T>(x_pe[p.rope_dim + threadIdx.x]);
    if (pe != nullptr) pe[threadIdx.x] = y;
    if (cache != nullptr) cache[p.kv_rank + threadIdx.x] = y;
  }
}

// K2. Block (slice x, token y; rows past T wait and exit). Everything K1 does not write (gamma,
// the slot, the position and its cos/sin) is read before the wait, so the chain after K1 is the
// partials and the norm. With cluster_norm (sm_90: a token's slices are one cluster) every slice
// takes its group's sums of squares from the others' shared memory after a cluster barrier and
// normalizes its own rows from registers; else the group's last slice to arrive (an arrival
// counter) normalizes all its rows from the workspace. Both sum the squares in slice order: the
// same values.
template <typename T, typename RopeT>
__global__ void __launch_bounds__(kThreads, kEpilogueBlocksPerSm)
    mla_decode_stage_a_epilogue(const __grid_constant__ DecodeParams p) {
  __shared__ float red[kWarps];
  __shared__ float pe_in[kMaxRopeDim], pe[kMaxRopeDim];
  __shared__ float4 slice_sumsq;  // cluster_norm: this slice's sum of squares (.x)
  __shared__ bool last;
  allow_dependents();
  const int t = blockIdx.y;
  if (t >= p.tokens) {  // a padding row (kMlaDecodeEpilogueMinTokenRows)
    wait_for_previous_stage();
    return;
  }
  const Slice sl = slice_of(p, blockIdx.x);
  T* cache = mla_cache_row<T>(p.e.cache, t, p.e.seq);  // [R + dr] or null
  float gamma_held[kHeldGamma];
  const int half = p.rope_dim / 2;
  const int n = sl.begin + threadIdx.x;
  PairAngles angles{};
  bool position_ok = true;
  float gamma_own = 0.f;  // cluster_norm: gamma of this thread's row
  if (sl.group == 2) {
    const RopeAngles<RopeT> a = rope_angles<RopeT>(p.e, t);
    position_ok = a.ok;
    if (threadIdx.x < half) {
      angles = rope_pair_angles(a, rope_pair(p.e.style, threadIdx.x, half), threadIdx.x, half);
    }
  } else {
    const T* gamma = static_cast<const T*>(sl.group == 0 ? p.e.q_norm : p.e.kv_norm);
    const int gbegin = sl.group == 0 ? 0 : p.q_rows;
    if (p.cluster_norm) {
      if (n < sl.end) gamma_own = to_float(gamma[n - gbegin]);
    } else {
      const int width = sl.group == 0 ? p.q_rows : p.kv_rank;
#pragma unroll
      for (int j = 0; j < kHeldGamma; ++j) {
        const int i = threadIdx.x + j * kSlice;
        gamma_held[j] = i < width ? to_float(gamma[i]) : 0.f;
      }
    }
  }
  wait_for_previous_stage();

  // Row n summed over the chunks in chunk order (zero past the slice), kPartialBatch chunks' loads
  // in flight at a time: one L2 round trip up to 32 chunks.
  float sum[1];
  sum_chunk_partials<1, kPartialBatch>(p, t, sl.begin, sl.end - sl.begin, sum);
  const float v = sum[0];

  if (sl.group == 2) {  // k_pe: RoPE, then the cache row and stage B's copy
    pe_in[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x < half) {
      rope_apply<T>(rope_pair(p.e.style, threadIdx.x, half), angles, position_ok, pe_in, pe);
    }
    __syncthreads();
    if (threadIdx.x < p.rope_dim) {
      const T y = from_float<T>(pe[threadIdx.x]);
      if (cache != nullptr) cache[p.kv_rank + threadIdx.x] = y;
      if (p.pe_out != nullptr) static_cast<T*>(p.pe_out)[t * p.rope_dim + threadIdx.x] = y;
    }
    if (p.cluster_norm) {  // every block of the cluster meets both barriers
      cluster_arrive();
      cluster_wait();
      cluster_arrive();
      cluster_wait();
    }
    return;
  }

  const float ss = block_sum(v * v, red);
  if (p.cluster_norm) {
    if (threadIdx.x == 0) slice_sumsq.x = ss;
    cluster_arrive();  // this slice's sum, released to the cluster
    cluster_wait();
    float total = 0.f;
    for (int s = 0; s < sl.count; ++s) {
      total += load_cluster_shared(&slice_sumsq.x, static_cast<uint32_t>(sl.first + s)).x;
    }
    cluster_arrive();  // read the others' sums: they may exit once everyone has
    const bool q_group = sl.group == 0;
    const int width = q_group ? p.q_rows : p.kv_rank;
    const float inv = rsqrtf(total / static_cast<float>(width) + p.e.eps);
    if (n < sl.end) {
      const T y = from_float<T>(v * inv * gamma_own);
      const NormOutputs<T> rows = norm_outputs<T>(p, q_group, t, cache);
      const int i = n - (q_group ? 0 : p.q_rows);
      if (rows.out != nullptr) rows.out[i] = y;
      if (rows.latent != nullptr) rows.latent[i] = y;
    }
    cluster_wait();
    return;
  }
  if (n < sl.end) p.ckv[static_cast<int64_t>(t) * p.rows_ld + n] = v;
  if (threadIdx.x == 0) p.sumsq[t * p.slices + blockIdx.x] = ss;
  __threadfence();  // this block's sums and squares before its arrival
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(p.arrivals + 2 * t + sl.group, 1u) == static_cast<unsigned>(sl.count - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other slices' writes, seen through their arrivals
  normalize_group<T>(p, sl, t, gamma_held, cache);
}

// K2 as one block per token (mla_decode_whole_rows): block y runs the whole-row epilogue for token
// y and writes the cache row and stage B's c and k_pe. Gamma, the angles and the cache slot are
// read before the wait, as in the sliced K2 (the slot after it put a DRAM trip on the chain).
template <typename T>
__global__ void __launch_bounds__(kThreads, kEpilogueBlocksPerSm)
    mla_decode_stage_a_row_epilogue(const __grid_constant__ DecodeParams p) {
  __shared__ float red[kWarps];
  __shared__ float pe[2 * kMaxRopeDim];  // k_pe before and after RoPE
  allow_dependents();
  const int t = blockIdx.y;
  const RowEpilogueInputs f = row_epilogue_inputs<T>(p, t);
  T* const cache = mla_cache_row<T>(p.e.cache, t, p.e.seq);  // [R + dr] or null
  wait_for_previous_stage();
  T* latent = p.e.latent == nullptr
                  ? nullptr
                  : static_cast<T*>(p.e.latent) + static_cast<int64_t>(t) * p.kv_rank;
  T* pe_row = p.pe_out == nullptr ? nullptr : static_cast<T*>(p.pe_out) + t * p.rope_dim;
  row_epilogue<T, kRowEpilogueBatch>(p, f, t, latent, pe_row, cache, pe, red);
}

// The fused stage A (K1 and K2 as one cooperative kernel, mla_decode_fused_stage_a): block (row
// group x, chunk y) takes kFusedTiles weight tiles (16 rows) of [q_a_weight; kv_a_weight] over
// one chunk of D, its warps taking runs of the chunk's K-blocks (so a row's partials are the few
// chunks, not the warps); A fragments are read straight from hidden (no reuse inside a block to
// stage for). The warps' sums meet in shared memory (warp order), each chunk's partial goes to
// the workspace, one grid-wide barrier, then block t < T runs the row epilogue of token t and
// block T + t (with q_a) normalizes token t's q_a: the chain after the weight stream is one
// barrier and one L2 round trip instead of a kernel boundary and the sliced K2's three trips.
constexpr int kFusedTiles = 2;                      // weight tiles per block
constexpr int kFusedRows = kFusedTiles * kTileRows;  // 16 rows
constexpr int kFusedLoads = 4;   // K-blocks per warp in flight: 8 weight + 8 hidden vectors
constexpr int kFusedBlocksPerSm = 2;  // the grid is co-resident at this many blocks per SM
constexpr int kFusedBatch = 8;   // chunk partials per row in flight in the epilogue: one trip
constexpr int kFusedQHeld = 8;   // q_a values per thread: q_rows <= kFusedQHeld * kThreads
static_assert(kFusedTiles * kMTile * kTileRows == kThreads, "the warp reduction: a value a thread");
// Its static shared memory (the warps' sums, the epilogue's scratch): with the launch bounds'
// register cap, kFusedBlocksPerSm blocks fit every sm_80+ SM (164 KB or more), so the plan's grid
// is co-resident on a whole device without an occupancy query.
constexpr size_t kFusedStaticSmem =
    sizeof(float) * (kWarps * kFusedTiles * kMTile * kTileRows + kWarps + 2 * kMaxRopeDim);
static_assert(kFusedBlocksPerSm * kFusedStaticSmem <= 100 * 1024,
              "the fused stage A's blocks per SM fit every sm_80+ SM's shared memory");

template <typename T>
__global__ void __launch_bounds__(kThreads, kFusedBlocksPerSm)
    mla_decode_fused_stage_a(const __grid_constant__ DecodeParams p) {
  __shared__ float sums[kWarps][kFusedTiles][kMTile * kTileRows];  // [warp][tile][token][row]
  __shared__ float red[kWarps];
  __shared__ float pe[2 * kMaxRopeDim];
  allow_dependents();  // stage B's blocks may start their kv_b stream beside this grid
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int block = blockIdx.y * gridDim.x + blockIdx.x;
  const bool row_block = block < p.tokens;
  const bool q_block = !row_block && p.q_rows > 0 && block < 2 * p.tokens;

  // The epilogue's inputs that stage A does not write: gamma, the position and the cache slot
  // issued before the stream, and what depends on a loaded value (the position's table row, the
  // slot's cache row) after it, so that no block waits on them before its share of the stream.
  RowEpilogueInputs f{};
  int64_t position = 0, slot = 0;
  if (row_block) {
    row_epilogue_gamma<T>(p, f);
    position = rope_position(p.e, block);
    slot = mla_cache_slot(p.e.cache, block, p.e.seq);
  }
  float q_gamma[kFusedQHeld];
  if (q_block) {
    const T* gamma = static_cast<const T*>(p.e.q_norm);
#pragma unroll
    for (int j = 0; j < kFusedQHeld; ++j) {
      const int n = threadIdx.x + j * kThreads;
      q_gamma[j] = n < p.q_rows ? to_float(gamma[n]) : 0.f;
    }
  }

  // Rows g and 8 + g of the block's tiles; tokens g and g + 8 (A rows past T are zeros).
  const int row0 = blockIdx.x * kFusedRows;
  const T* rows[kFusedTiles];
#pragma unroll
  for (int i = 0; i < kFusedTiles; ++i) rows[i] = stage_a_row<T>(p, row0 + i * kTileRows + g);
  const T* hidden = static_cast<const T*>(p.hidden);
  const T* x_rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = g + h * kTileRows;
    x_rows[h] = t < p.tokens
                    ? hidden + token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq)
                    : nullptr;
  }
  const int k_begin = blockIdx.y * p.chunk;
  const int k_end = min(k_begin + p.chunk, p.model_dim);
  // Warp w's run of the chunk's K-blocks (contiguous runs: 0.3 us faster than K-blocks dealt
  // round-robin at V3 q_a + kv T=16, the same at T=1).
  const int per_warp = ceil_div(ceil_div(k_end - k_begin, kKBlock), kWarps);
  const int w_begin = k_begin + warp * per_warp * kKBlock;
  const int w_end = min(k_end, w_begin + per_warp * kKBlock);

  float acc[kFusedTiles][4] = {};
  for (int k0 = w_begin; k0 < w_end; k0 += kFusedLoads * kKBlock) {
    uint4 w[kFusedLoads][kFusedTiles], x[kFusedLoads][2];
#pragma unroll
    for (int j = 0; j < kFusedLoads; ++j) {
      const int k = k0 + j * kKBlock + 8 * q;
      const bool in = k < w_end;  // w_end and k are multiples of 8
#pragma unroll
      for (int i = 0; i < kFusedTiles; ++i) w[j][i] = load_or_zero(rows[i] + k, in && rows[i]);
#pragma unroll
      for (int h = 0; h < 2; ++h) x[j][h] = load_or_zero(x_rows[h] + k, in && x_rows[h]);
    }
#pragma unroll
    for (int j = 0; j < kFusedLoads; ++j) {
      if (k0 + j * kKBlock >= w_end) break;  // warp-uniform
#pragma unroll
      for (int i = 0; i < kFusedTiles; ++i) mma_block<T>(acc[i], x[j][0], x[j][1], w[j][i]);
    }
  }

  T* cache = nullptr;
  if (row_block) {
    row_epilogue_rope<T>(p, block, position, f);
    cache = mla_cache_row_at<T>(p.e.cache, slot);
  }

  // acc[i]: tokens g (values 0, 1) and g + 8 (2, 3) x rows 2q, 2q + 1 of tile i.
#pragma unroll
  for (int i = 0; i < kFusedTiles; ++i) {
    float* s = sums[warp][i];
    *reinterpret_cast<float2*>(s + g * kTileRows + 2 * q) = make_float2(acc[i][0], acc[i][1]);
    *reinterpret_cast<float2*>(s + (g + 8) * kTileRows + 2 * q) =
        make_float2(acc[i][2], acc[i][3]);
  }
  __syncthreads();
  {
    const int tile = threadIdx.x / (kMTile * kTileRows);
    const int t = threadIdx.x / kTileRows % kMTile, r = threadIdx.x % kTileRows;
    const int n = row0 + tile * kTileRows + r;
    if (t < p.tokens && n < p.rows_ld) {
      float v = 0.f;
#pragma unroll
      for (int w8 = 0; w8 < kWarps; ++w8) v += sums[w8][tile][t * kTileRows + r];
      p.partials[(static_cast<int64_t>(blockIdx.y) * p.tokens + t) * p.rows_ld + n] = v;
    }
  }
  cooperative_groups::this_grid().sync();  // every chunk's partials written and visible

  if (row_block) {
    const int t = block;
    T* latent = p.e.latent == nullptr
                    ? nullptr
                    : static_cast<T*>(p.e.latent) + static_cast<int64_t>(t) * p.kv_rank;
    T* pe_row = p.pe_out == nullptr ? nullptr : static_cast<T*>(p.pe_out) + t * p.rope_dim;
    row_epilogue<T, kFusedBatch>(p, f, t, latent, pe_row, cache, pe, red);
  } else if (q_block) {
    const int t = block - p.tokens;
    float x[kFusedQHeld];
    sum_chunk_partials<kFusedQHeld, kFusedBatch>(p, t, 0, p.q_rows, x);
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kFusedQHeld; ++j) ss += x[j] * x[j];  // zeros past q_rows
    const float inv = rsqrtf(block_sum(ss, red) / static_cast<float>(p.q_rows) + p.e.eps);
    T* out = norm_outputs<T>(p, true, t, nullptr).out;
#pragma unroll
    for (int j = 0; j < kFusedQHeld; ++j) {
      const int n = threadIdx.x + j * kThreads;
      if (n < p.q_rows) out[n] = from_float<T>(x[j] * inv * q_gamma[j]);
    }
  }
}

// K3's A operand row t (c, rounded to T) and k_pe row, from stage A's workspace, the caller's
// latent and k_pe, or the cache row by slot (null for a skipped slot: zeros).
template <typename T>
__device__ __forceinline__ void stage_b_sources(const DecodeParams& p, int t, const T** c,
                                                const T** pe) {
  if (p.from_stage_a) {
    *c = static_cast<const T*>(p.e.latent) + static_cast<int64_t>(t) * p.kv_rank;
    *pe = static_cast<const T*>(p.pe_out) + t * p.rope_dim;
  } else if (p.latent != nullptr) {
    *c = static_cast<const T*>(p.latent) +
         token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq);
    *pe = static_cast<const T*>(p.k_pe) +
          token_offset(t, p.seq, p.k_pe_stride_batch, p.k_pe_stride_seq);
  } else {
    *c = mla_cache_row<const T>(p.e.cache, t, p.seq);
    *pe = *c == nullptr ? nullptr : *c + p.kv_rank;
  }
}

// Rows [T, width] from per-token sources (src[t], null: zeros) into shared memory rows of stride
// ld: by 16-byte cp.async where every source row is whole vectors (then the caller waits), else
// element loads kStageBatch at a time, all of a batch issued before its stores.
constexpr int kStageBatch = 8;
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, int ld, const T* const* src, int tokens,
                                           int width, bool vectors) {
  if (vectors) {
    const int per_row = width / 8;
    for (int i = threadIdx.x; i < tokens * per_row; i += kThreads) {
      const int t = i / per_row, v = i % per_row;
      const T* row = src[t];
      T* to = dst + t * ld + 8 * v;
      if (row != nullptr) {
        copy16_async(to, row + 8 * v, true);
      } else {
        *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
      }
    }
    return;
  }
  const int n = tokens * width;
  const T zero = from_float<T>(0.f);
  for (int i0 = threadIdx.x; i0 < n; i0 += kStageBatch * kThreads) {
    T v[kStageBatch];
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j) {
      const int i = i0 + j * kThreads;
      const T* row = i < n ? src[i / width] : nullptr;
      v[j] = row != nullptr ? row[i % width] : zero;
    }
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j) {
      const int i = i0 + j * kThreads;
      if (i < n) dst[(i / width) * ld + i % width] = v[j];
    }
  }
}

// K3's output rows: the element offset of each token's K and V row (token_offset of their
// strides), in shared memory once per block, so that no store divides by S.
struct OutRows {
  const int64_t* k;  // [window]
  const int64_t* v;  // [window]
  int count;         // the window's tokens
};

// Where row n of kv_b lands in a token's outputs: K's column j of head h (j < dn), else V's
// column j - dn; past the last row nowhere. Found once per tile column, not per store.
struct OutColumn {
  int64_t offset;  // within the token's K or V row
  bool to_k, valid;
};

// kv_b row n as head h's column j (j < dn: K's k_nope, else V).
__device__ __forceinline__ OutColumn out_column_at(const DecodeParams& p, int n, int h, int j) {
  if (n >= p.b_rows) return {0, false, false};
  if (j < p.nope_dim) return {h * p.k.stride_head + j, true, true};
  return {h * p.v_stride_head + (j - p.nope_dim), false, true};
}

// The columns of kv_b rows n and n + 1 with one integer division: row n + 1 is the next column
// of n's head, or the next head's first.
__device__ __forceinline__ void out_column_pair(const DecodeParams& p, int n, OutColumn& c0,
                                                OutColumn& c1) {
  const int width = p.nope_dim + p.v_dim;
  const int h = n / width, j = n - h * width;
  const bool wraps = j + 1 == width;
  c0 = out_column_at(p, n, h, j);
  c1 = out_column_at(p, n + 1, wraps ? h + 1 : h, wraps ? 0 : j + 1);
}

// One output of stage B: token t at column c, rounded once.
template <typename T>
__device__ __forceinline__ void store_kv(const DecodeParams& p, const OutRows& rows, int t,
                                         const OutColumn& c, float value) {
  if (t >= rows.count || !c.valid) return;
  if (c.to_k) {
    static_cast<T*>(p.k.data)[rows.k[t] + c.offset] = from_float<T>(value);
  } else {
    static_cast<T*>(p.v)[rows.v[t] + c.offset] = from_float<T>(value);
  }
}

// Token t's outputs at kv_b rows n (even) and n + 1: one 32-bit store where the launcher found
// every K and V row and head offset even and both bases 4-byte aligned (p.pair_stores: then the
// pair never straddles K and V, dn and dv being even), else two.
template <typename T>
__device__ __forceinline__ void store_kv_pair(const DecodeParams& p, const OutRows& rows, int t,
                                              const OutColumn& c0, const OutColumn& c1, float v0,
                                              float v1) {
  if (!p.pair_stores) {
    store_kv<T>(p, rows, t, c0, v0);
    store_kv<T>(p, rows, t, c1, v1);
    return;
  }
  if (t >= rows.count || !c0.valid) return;
  T* dst = c0.to_k ? static_cast<T*>(p.k.data) + rows.k[t] + c0.offset
                   : static_cast<T*>(p.v) + rows.v[t] + c0.offset;
  *reinterpret_cast<unsigned*>(dst) = pair_from_floats<T>(v0, v1);
}

// K3's loop at one token tile with the ring: the warp's (tile, step of kLoads K-blocks) positions
// in order, w holding the current one's weights. Each K-block's MMAs are followed (in source
// order) by the load of the next position's same K-block into its registers: the same tile's
// next step, else the next tile's first, so the loads never wait for a tile's end.
template <typename T, int kLoads>
__device__ __forceinline__ void stage_b_ring(const DecodeParams& p, const OutRows& rows, const T* a,
                                             int ld, int first, int stride, int tiles, int lane,
                                             uint4 (&w)[kLoads]) {
  constexpr int kStep = kLoads * kKBlock;
  static_assert(kStep % (2 * kKBlock) == 0, "a step keeps the chains on K-block parity");
  const int g = lane / 4, q = lane % 4;
  const T* kv_b = static_cast<const T*>(p.kv_b);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // This thread's A rows g and g + 8 at its 8 columns of a K-block; rows past T are zeros.
  const T* a0 = a + g * ld + 8 * q;
  const T* a1 = a0 + 8 * ld;
  const bool t0_in = g < rows.count, t1_in = g + 8 < rows.count;
  Acc<1, kStageBChains<1>> acc;
  for (int tile = first, k0 = 0; tile < tiles;) {
    int next_tile = tile, next_k0 = k0 + kStep;
    if (next_k0 >= p.kv_rank) {
      next_tile = tile + stride;
      next_k0 = 0;
    }
    const int next_n = next_tile * kTileRows + g;
    // The next position's row from this thread's first column, and the columns left in it.
    const T* next_src = next_tile < tiles && next_n < p.b_rows
                            ? kv_b + next_n * p.kv_b_ld + next_k0 + 8 * q
                            : nullptr;
    const int next_left = p.kv_rank - next_k0 - 8 * q;
    const int left = p.kv_rank - k0 - 8 * q;
    if (k0 == 0) acc.zero();
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      // No branch at R: K-blocks past it multiply zeros (A here, w where it was loaded), so the
      // fragment loads may issue ahead of the MMAs before them.
      const bool in = j * kKBlock < left;
      const uint4 x0 = in && t0_in ? shared_vector(a0 + k0 + j * kKBlock) : zero;
      const uint4 x1 = in && t1_in ? shared_vector(a1 + k0 + j * kKBlock) : zero;
      mma_block<T>(acc.c[j % kStageBChains<1>][0], x0, x1, w[j]);
      w[j] = load_or_zero(next_src + j * kKBlock, next_src != nullptr && j * kKBlock < next_left);
    }
    if (next_k0 == 0) {  // the tile's last step: its outputs (token g: 0, 1; g + 8: 2, 3)
      const int n = tile * kTileRows + 2 * q;
      OutColumn c0, c1;
      out_column_pair(p, n, c0, c1);
      store_kv_pair<T>(p, rows, g, c0, c1, acc.value(0, 0), acc.value(0, 1));
      store_kv_pair<T>(p, rows, g + 8, c0, c1, acc.value(0, 2), acc.value(0, 3));
    }
    tile = next_tile;
    k0 = next_k0;
  }
}

// K3. Warp w of block b walks the tiles b * 8 + w, + 8 * gridDim.x, ...; kM token tiles, one tile
// of registers (kRing, one token tile only: one step of 4 K-blocks, each reloaded for the next
// step or tile after its MMAs).
template <typename T, int kM, bool kRing>
__global__ void __launch_bounds__(kThreads, kStageBBlocksPerSm<kRing>)
    mla_decode_stage_b(const __grid_constant__ DecodeParams p) {
  static_assert(!kRing || kM == 1, "the ring is the one-token-tile loop");
  extern __shared__ uint4 smem_b[];
  const int ld = smem_ld(p.kv_rank);
  const TokenWindow win = token_window(p, p.window, blockIdx.y);
  T* a = reinterpret_cast<T*>(smem_b);  // [window, ld]: c
  T* pe = a + win.count * ld;           // [window, dr]: k_pe
  allow_dependents();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int tiles = ceil_div(p.b_rows, kTileRows);
  const int stride = gridDim.x * kWarps;
  const int first = blockIdx.x * kWarps + warp;
  const T* kv_b = static_cast<const T*>(p.kv_b);
  auto row_of = [&](int tile) -> const T* {
    const int n = tile * kTileRows + g;
    return n < p.b_rows ? kv_b + n * p.kv_b_ld : nullptr;
  };

  // Before the wait: kv_b is not written by stage A, nor the fold's gamma and angles.
  uint4 w[kStageBLoads<kM, kRing>];
  load_row_step<T, kStageBLoads<kM, kRing>>(row_of(first), 0, p.kv_rank, q, w);
  // The fold runs only in the held-tile kernels (the launcher's k.fold): the ring's 64 registers
  // keep none of its inputs across the wait.
  constexpr bool kCanFold = !kRing;
  const bool fold = kCanFold && p.fold;
  RowEpilogueInputs fold_in{};
  T* fold_cache = nullptr;  // the fold's cache row: block (0, 0) writes it
  if constexpr (kCanFold) {
    if (fold) {
      fold_in = row_epilogue_inputs<T>(p, 0);
      if (blockIdx.x == 0 && blockIdx.y == 0) fold_cache = mla_cache_row<T>(p.e.cache, 0, p.e.seq);
    }
  }
  // Every token's sources (a cache slot is a load) and output rows, also before the wait: stage A
  // writes none of them (its c and k_pe go to fixed workspace rows), and the divisions behind
  // the row offsets leave the chain after stage A.
  __shared__ const T* c_src[kMaxTokens];
  __shared__ const T* pe_src[kMaxTokens];
  __shared__ int64_t k_rows[kMaxTokens], v_rows[kMaxTokens];
  __shared__ float fold_pe[2 * kMaxRopeDim], fold_red[kWarps];  // the fold's scratch
  for (int t = threadIdx.x; t < win.count; t += kThreads) {
    if (!fold) stage_b_sources<T>(p, win.begin + t, &c_src[t], &pe_src[t]);
    k_rows[t] = token_offset(win.begin + t, p.seq, p.k.stride_batch, p.k.stride_seq);
    v_rows[t] = token_offset(win.begin + t, p.seq, p.v_stride_batch, p.v_stride_seq);
  }
  const OutRows rows{k_rows, v_rows, win.count};
  __syncthreads();
  wait_for_previous_stage();

  // Then all rows' loads in flight at once.
  if (fold) {
    row_epilogue<T, kRowEpilogueBatch>(p, fold_in, 0, a, pe, fold_cache, fold_pe, fold_red);
  } else {
    stage_rows<T>(a, ld, c_src, win.count, p.kv_rank, p.c_vectors);
    stage_rows<T>(pe, p.rope_dim, pe_src, win.count, p.rope_dim, p.pe_vectors);
    wait_async_copies();
  }
  __syncthreads();

  // K's k_pe columns: a warp per (token, head) row over the grid, its lanes along the row.
  for (int r = blockIdx.x * kWarps + warp; r < win.count * p.heads; r += gridDim.x * kWarps) {
    const int t = r / p.heads, h = r - t * p.heads;
    T* dst = static_cast<T*>(p.k.data) + k_rows[t] + h * p.k.stride_head + p.nope_dim;
    for (int j = lane; j < p.rope_dim; j += 32) dst[j] = pe[t * p.rope_dim + j];
  }

  if constexpr (kRing) {
    stage_b_ring<T, kStageBLoads<kM, kRing>>(p, rows, a, ld, first, stride, tiles, lane, w);
  } else {
    for (int tile = first; tile < tiles; tile += stride) {
      const T* row = row_of(tile);
      Acc<kM, kStageBChains<kM>> acc;
      acc.zero();
      for (int k0 = 0; k0 < p.kv_rank; k0 += kStageBStep<kM, kRing>) {
        if (tile != first || k0 != 0) {
          load_row_step<T, kStageBLoads<kM, kRing>>(row, k0, p.kv_rank, q, w);
        }
        mma_step<T, kStageBLoads<kM, kRing>, kM, kStageBNoBreakTiles>(acc, a, ld, win.count, k0, 0,
                                                                      p.kv_rank, g, q, w);
      }
      const int n = tile * kTileRows + 2 * q;
      OutColumn c0, c1;
      out_column_pair(p, n, c0, c1);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        const int t0 = m * kMTile + g, t1 = t0 + 8;
        store_kv_pair<T>(p, rows, t0, c0, c1, acc.value(m, 0), acc.value(m, 1));
        store_kv_pair<T>(p, rows, t1, c0, c1, acc.value(m, 2), acc.value(m, 3));
      }
    }
  }
}

// ---- host side ----

bool runs_first(const MlaProblem& p) { return p.stage != MlaStage::kSecond; }
bool runs_second(const MlaProblem& p) { return p.stage != MlaStage::kFirst; }

int q_rows_run(const MlaProblem& p, const MlaArgs& a) {
  return a.q_a != nullptr ? static_cast<int>(p.q_rank) : 0;
}

bool in_windows(const MlaProblem& p) {
  return p.tokens() > kMTile && mla_decode_token_windows(p);
}

// Token tiles of K1's and K3's instantiation: 1, 2 or 4 (3 runs as 4) for all T in one window;
// where the call runs in windows (mla_decode_token_windows, heuristics.h), those of one window
// (mla_decode_window_tiles).
int token_tiles(const MlaProblem& p) {
  if (in_windows(p)) return mla_decode_window_tiles(p.tokens());
  const int64_t tiles = ceil_div<int64_t>(p.tokens(), kMTile);
  return tiles <= 1 ? 1 : tiles == 2 ? 2 : 4;
}

// The tokens of one block's window at `tiles` token tiles: T, or those tiles' where the call runs
// in windows.
int64_t window_tokens(const MlaProblem& p, int tiles) {
  return in_windows(p) ? std::min<int64_t>(p.tokens(), int64_t{kMTile} * tiles) : p.tokens();
}

// K1's cut of D: at most blocks_per_sm blocks on every SM over the row groups and `windows` token
// windows (chunks of whole K-blocks, the last step of a chunk may be partial), at least one
// chunk, chunks of at least kMinChunk and at most max_chunk(window) columns.
struct StageAPlan {
  int rows_ld, row_groups, chunk, chunks;
};

StageAPlan stage_a_plan(int64_t model_dim, int64_t rows, int sm_count, int window, int windows,
                        int blocks_per_sm) {
  StageAPlan s;
  const int64_t tiles = ceil_div<int64_t>(rows, kTileRows);
  s.rows_ld = static_cast<int>(tiles * kTileRows);
  s.row_groups = static_cast<int>(ceil_div<int64_t>(tiles, kWarps));
  const int64_t max_chunks = ceil_div<int64_t>(model_dim, kMinChunk);
  const int64_t wanted =  // rounded down: no block past the planned blocks per SM
      int64_t{blocks_per_sm} * sm_count / (int64_t{s.row_groups} * windows);
  const int64_t chunks = std::clamp<int64_t>(wanted, 1, max_chunks);
  s.chunk = static_cast<int>(std::min<int64_t>(
      round_up<int64_t>(ceil_div<int64_t>(model_dim, chunks), kKBlock), max_chunk(window)));
  s.chunks = static_cast<int>(ceil_div<int64_t>(model_dim, s.chunk));
  return s;
}

// The fused stage A's cut (mla_decode_fused_stage_a): row groups of kFusedRows, chunks of D so
// that the grid stays within kFusedBlocksPerSm blocks per SM (a cooperative launch's residency),
// at most the workspace's ceil(D / kMinChunk) partial planes. Usable where that grid holds the
// epilogue's 2T blocks and the epilogue's rows fit its threads.
struct FusedPlan {
  int row_groups, chunk, chunks;
  bool usable;
};

FusedPlan fused_plan(const MlaProblem& p, int q_rows, int a_rows, int sm_count) {
  FusedPlan s{};
  const int64_t capacity = int64_t{kFusedBlocksPerSm} * sm_count;
  s.row_groups = ceil_div(a_rows, kFusedRows);
  const int64_t wanted = std::clamp<int64_t>(capacity / s.row_groups, 1,
                                             ceil_div<int64_t>(p.model_dim, kMinChunk));
  s.chunk = static_cast<int>(round_up<int64_t>(ceil_div<int64_t>(p.model_dim, wanted), kKBlock));
  s.chunks = static_cast<int>(ceil_div<int64_t>(p.model_dim, s.chunk));
  const int64_t blocks = int64_t{s.row_groups} * s.chunks;
  s.usable = blocks <= capacity && blocks >= 2 * p.tokens() && p.tokens() <= kMTile &&
             q_rows <= kFusedQHeld * kThreads &&
             p.cache_width() <= kRowEpilogueRows * kThreads;
  return s;
}

constexpr int64_t kRegionAlignment = 256;
constexpr int64_t kMaxGridY = 65535;  // gridDim.y's limit: K1's chunks of D

// The workspace's regions (bytes from its first 256-byte boundary), for the largest call of the
// problem (q_a on, the most chunks).
struct WorkspaceLayout {
  int64_t partials, ckv, sumsq, arrivals, latent, pe, end;
};

WorkspaceLayout workspace_layout(const MlaProblem& p) {
  const int64_t T = p.tokens(), eb = element_size(p.dtype);
  const int64_t rows_ld = round_up<int64_t>(p.q_rank + p.cache_width(), kTileRows);
  const int64_t max_chunks = ceil_div<int64_t>(p.model_dim, kMinChunk);
  const int64_t slices =
      ceil_div<int64_t>(p.q_rank, kSlice) + ceil_div<int64_t>(p.kv_rank, kSlice) + 1;
  WorkspaceLayout w{};
  int64_t at = 0;
  auto region = [&](int64_t bytes) {
    const int64_t start = at;
    at += round_up<int64_t>(bytes, kRegionAlignment);
    return start;
  };
  w.partials = region(max_chunks * T * rows_ld * 4);
  w.ckv = region(T * rows_ld * 4);
  w.sumsq = region(T * slices * 4);
  w.arrivals = region(T * 2 * 4);
  w.latent = region(T * p.kv_rank * eb);
  w.pe = region(T * p.rope_dim * eb);
  w.end = at;
  return w;
}

char* aligned_workspace(void* workspace) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  return reinterpret_cast<char*>(round_up<uintptr_t>(base, kRegionAlignment));
}

Status refuse(const std::string& why) {
  return {StatusCode::kUnsupported, "cuda-mla-decode: " + why};
}

// A weight or hidden tensor read with 16-byte vectors: aligned base, row strides in whole vectors.
Status vector_rows(const char* name, const void* base, int64_t stride, const char* stride_name,
                   int64_t eb) {
  if (base == nullptr) return Status::Ok();
  if (!is_aligned(base, 16)) {
    return refuse(std::string("args.") + name + " = " +
                  std::to_string(reinterpret_cast<uintptr_t>(base)) +
                  " is not 16-byte aligned (it reads 16-byte vectors)");
  }
  if ((stride * eb) % 16 != 0) {
    return refuse(std::string(stride_name) + " = " + std::to_string(stride) +
                  " is not a multiple of 16 bytes (16-byte vectors per row)");
  }
  return Status::Ok();
}

// K3's c and k_pe [16 kM, smem_ld(R) + dr] in shared memory: past 48 KB from two token tiles on
// (64 x (544 + 64) x 2 B = 76 KB at T = 64, R = 512), so those variants opt in.
template <typename T, int kM>
constexpr int stage_b_max_smem() {
  return static_cast<int>(sizeof(T)) * kMTile * kM * (smem_ld(kMaxRank) + kMaxRopeDim);
}
static_assert(stage_b_max_smem<__nv_bfloat16, kMaxMTiles>() <= 227 * 1024,
              "K3's largest shared-memory plan fits Hopper's opt-in limit");
// K3's dynamic shared memory for a window of `tokens`: c [tokens, smem_ld(R)] and k_pe
// [tokens, dr].
int64_t stage_b_smem(const MlaProblem& p, int64_t tokens, int64_t eb) {
  return eb * tokens * (smem_ld(static_cast<int>(p.kv_rank)) + p.rope_dim);
}

// K3's static shared memory (the per-token source pointers and output rows, the fold's scratch),
// which the opt-in limit includes.
constexpr int64_t kStageBStaticSmem = 2 * kMaxTokens * (sizeof(const void*) + sizeof(int64_t)) +
                                      (2 * kMaxRopeDim + kWarps) * sizeof(float);
static_assert(stage_b_max_smem<__nv_bfloat16, 1>() + kStageBStaticSmem <= 48 * 1024,
              "K3's one-tile variants (held and ring) need no opt-in: only the 2- and 4-tile "
              "ones are opted in");

template <typename T, int kM>
cudaError_t opt_in_stage_b(size_t device_limit) {
  const size_t bytes =
      std::min<size_t>(device_limit - kStageBStaticSmem, stage_b_max_smem<T, kM>());
  return cudaFuncSetAttribute(mla_decode_stage_b<T, kM, false>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

// K2's clusters past the portable 8 blocks (every sm_90 device runs 16), for both RoPE table types
// of T, where K2 runs sm_90 code.
template <typename T>
cudaError_t allow_wide_epilogue_clusters(int major) {
  if (!programmatic_launch_allowed<mla_decode_stage_a_epilogue<T, float>>(major)) {
    return cudaSuccess;
  }
  cudaError_t err = cudaFuncSetAttribute(mla_decode_stage_a_epilogue<T, float>,
                                         cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(mla_decode_stage_a_epilogue<T, T>,
                              cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

// The per-device setup (prepared_device): K3's two- and four-tile variants opted in to their
// largest plan or the device's limit (takes() refuses a plan past that limit), K2 to clusters of
// kMaxClusterSlices.
struct DecodeKernels {
  static Status setup(const DeviceFacts& f) {
    cudaError_t err = opt_in_stage_b<__nv_bfloat16, 2>(f.smem_optin);
    if (err == cudaSuccess) err = opt_in_stage_b<__nv_bfloat16, 4>(f.smem_optin);
    if (err == cudaSuccess) err = opt_in_stage_b<__half, 2>(f.smem_optin);
    if (err == cudaSuccess) err = opt_in_stage_b<__half, 4>(f.smem_optin);
    if (err != cudaSuccess) return cuda_status(err, "cuda-mla-decode: shared-memory opt-in");
    err = allow_wide_epilogue_clusters<__nv_bfloat16>(f.major);
    if (err == cudaSuccess) err = allow_wide_epilogue_clusters<__half>(f.major);
    return cuda_status(err, "cuda-mla-decode: K2's cluster size");
  }
};

// kStageBBlocksPerSm of the K3 variant the launcher picked.
int64_t stage_b_blocks_per_sm(bool ring) {
  return ring ? kStageBBlocksPerSm<true> : kStageBBlocksPerSm<false>;
}

// K3's blocks per token window: a persistent grid over `tiles` kv_b tiles of at most
// kStageBBlocksPerSm blocks per SM.
int64_t stage_b_blocks(int64_t tiles, bool ring, int sm_count) {
  return std::min<int64_t>(ceil_div<int64_t>(tiles, kWarps),
                           stage_b_blocks_per_sm(ring) * sm_count);
}

// Shared memory the SM reserves for each resident block (sm_80 and later), beside what the block
// asks for.
constexpr int64_t kSmemReservedPerBlock = 1024;

// K1's launch attribute where K3 is planned beside it: the shared-memory carveout that holds
// K1's block (k1_smem), a K2 block and K3's blocks (a window of `window` tokens) per SM
// (mla_decode_stage_a_carveout).
cudaLaunchAttribute stage_a_carveout(const MlaProblem& p, int window, size_t k1_smem, bool ring,
                                     const DeviceFacts* facts) {
  const int64_t k1_block = static_cast<int64_t>(k1_smem) + kSmemReservedPerBlock;
  const int64_t k2_block = kRowEpilogueStaticSmem + kSmemReservedPerBlock;
  const int64_t k3_block =
      stage_b_smem(p, window, element_size(p.dtype)) + kStageBStaticSmem + kSmemReservedPerBlock;
  const int64_t per_sm = k1_block + k2_block + stage_b_blocks_per_sm(ring) * k3_block;
  cudaLaunchAttribute carveout{};
  carveout.id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  carveout.val.sharedMemCarveout =
      mla_decode_stage_a_carveout(per_sm, static_cast<int64_t>(facts->smem_per_sm));
  return carveout;
}

// Does K3 run at one token tile with the ring (mla_decode_stage_b_ring)?
bool stage_b_ring(int k_tiles, int64_t tiles, int sm_count) {
  return k_tiles == 1 &&
         mla_decode_stage_b_ring(tiles, int64_t{kBlocksPerSm} * kWarps * sm_count);
}

// K3 over `tiles` kv_b tiles (stage_b_blocks x windows). Stage B alone waits for nothing of ours:
// a plain launch (its wait returns at once). Holding whole tiles on at most one block per SM, it
// asks for the largest L1 (mla_decode_stage_b_spread: its blocks then land one per SM).
template <typename T, int kM, bool kRing>
Status launch_stage_b(const DecodeParams& k, int64_t tiles, int windows, int64_t smem,
                      const DeviceFacts* facts, bool after_stage_a,
                      const cudaLaunchConfig_t& config) {
  const int64_t blocks = stage_b_blocks(tiles, kRing, facts->sm_count);
  const bool programmatic =
      after_stage_a && programmatic_launch_allowed<mla_decode_stage_b<T, kM, kRing>>(facts->major);
  cudaLaunchAttribute spread{};
  spread.id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  spread.val.sharedMemCarveout = cudaSharedmemCarveoutMaxL1;
  const bool spread_out = !kRing && mla_decode_stage_b_spread(blocks * windows, facts->sm_count);
  LaunchAttributes attributes(programmatic, spread_out ? &spread : nullptr);
  cudaLaunchConfig_t launch = attributes.on(config);
  launch.gridDim = dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(windows));
  launch.dynamicSmemBytes = static_cast<size_t>(smem);
  LATENTKV_CUDA_RETURN(cudaLaunchKernelEx(&launch, mla_decode_stage_b<T, kM, kRing>, k));
  return Status::Ok();
}

// DecodeParams' tensors (k.q_rows set): the inputs; with the first stage, stage A's workspace
// regions; stage B's sources (stage A's workspace, the caller's latent and k_pe, or the cache rows)
// and whether they are whole 16-byte vectors; the outputs and whether their pairs of columns take
// 32-bit stores.
void bind_tensors(const MlaProblem& p, const MlaArgs& a, DecodeParams& k) {
  const int64_t eb = element_size(p.dtype);
  k.hidden = a.hidden;
  k.hidden_stride_batch = a.hidden_stride_batch;
  k.hidden_stride_seq = a.hidden_stride_seq;
  k.q_weight = k.q_rows > 0 ? a.q_a_weight : nullptr;
  k.q_weight_ld = a.q_a_weight_stride_row;
  k.kv_weight = a.kv_a_weight;
  k.kv_weight_ld = a.kv_a_weight_stride_row;

  k.e = mla_epilogue_params(p, a, k.q_rows);
  if (runs_first(p)) {
    const WorkspaceLayout w = workspace_layout(p);
    char* base = aligned_workspace(a.workspace);
    k.partials = reinterpret_cast<float*>(base + w.partials);
    k.ckv = reinterpret_cast<float*>(base + w.ckv);
    k.sumsq = reinterpret_cast<float*>(base + w.sumsq);
    k.arrivals = reinterpret_cast<unsigned*>(base + w.arrivals);
    if (runs_second(p)) {
      k.e.latent = base + w.latent;
      k.pe_out = base + w.pe;
      k.from_stage_a = true;
    }
  }
  k.latent = a.latent;
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.k_pe = a.k_pe;
  k.k_pe_stride_batch = a.k_pe_stride_batch;
  k.k_pe_stride_seq = a.k_pe_stride_seq;
  k.kv_b = a.kv_b_weight;
  k.kv_b_ld = a.kv_b_weight_stride_row;
  // K3's sources as whole 16-byte vectors (cp.async): stage A's workspace rows always (R % 8 == 0,
  // 256-byte regions); the caller's latent / k_pe or cache rows where base and strides allow.
  auto vector_rows_ok = [&](const void* base, int64_t width, int64_t s_batch, int64_t s_seq) {
    return is_aligned(base, 16) && (width * eb) % 16 == 0 &&
           (p.seq <= 1 || (s_seq * eb) % 16 == 0) && (p.batch <= 1 || (s_batch * eb) % 16 == 0);
  };
  if (k.from_stage_a) {
    k.c_vectors = true;
    k.pe_vectors = (p.rope_dim * eb) % 16 == 0;
  } else if (a.latent != nullptr) {
    k.c_vectors = vector_rows_ok(a.latent, p.kv_rank, a.latent_stride_batch, a.latent_stride_seq);
    k.pe_vectors = vector_rows_ok(a.k_pe, p.rope_dim, a.k_pe_stride_batch, a.k_pe_stride_seq);
  } else {
    // Rows at any slot: the cache's row stride stands for both strides.
    const bool rows_ok = vector_rows_ok(k.e.cache.rows, p.kv_rank, k.e.cache.stride,
                                        k.e.cache.stride) &&
                         (k.e.cache.stride * eb) % 16 == 0;
    k.c_vectors = rows_ok;
    k.pe_vectors = rows_ok && (p.rope_dim * eb) % 16 == 0;
  }
  k.k = {a.k, a.k_stride_batch, a.k_stride_seq, a.k_stride_head};
  k.v = a.v;
  k.v_stride_batch = a.v_stride_batch;
  k.v_stride_seq = a.v_stride_seq;
  k.v_stride_head = a.v_stride_head;
  auto even = [](int64_t stride) { return stride % 2 == 0; };
  k.pair_stores = is_aligned(a.k, 4) && is_aligned(a.v, 4) && p.nope_dim % 2 == 0 &&
                  p.v_dim % 2 == 0 && even(a.k_stride_head) && even(a.v_stride_head) &&
                  (p.seq <= 1 || (even(a.k_stride_seq) && even(a.v_stride_seq))) &&
                  (p.batch <= 1 || (even(a.k_stride_batch) && even(a.v_stride_batch)));
}

// allow_fused: false after the fused stage A's cooperative launch was refused as too large (fewer
// SMs usable than the device has, e.g. under MPS): the call runs K1 and K2 instead.
template <typename T, typename RopeT, int kM>
Status launch(const MlaProblem& p, const MlaArgs& a, Stream stream, bool allow_fused = true) {
  const DeviceFacts* facts = nullptr;
  LATENTKV_RETURN_IF_ERROR(prepared_device<DecodeKernels>(&facts));
  DecodeParams k{};
  k.tokens = static_cast<int>(p.tokens());
  k.seq = static_cast<int>(p.seq);
  k.model_dim = static_cast<int>(p.model_dim);
  k.kv_rank = static_cast<int>(p.kv_rank);
  k.rope_dim = static_cast<int>(p.rope_dim);
  k.heads = static_cast<int>(p.heads);
  k.nope_dim = static_cast<int>(p.nope_dim);
  k.v_dim = static_cast<int>(p.v_dim);
  k.b_rows = static_cast<int>(p.kv_b_rows());
  k.q_rows = runs_first(p) ? q_rows_run(p, a) : 0;
  k.a_rows = k.q_rows + k.kv_rank + k.rope_dim;
  // Windows of kM token tiles over T > 16 tokens where the call runs in windows (K1's blockIdx.z,
  // K3's .y), else one window of all T.
  k.window = static_cast<int>(window_tokens(p, kM));
  const int windows = std::max(1, ceil_div(k.tokens, std::max(k.window, 1)));
  const int64_t eb = element_size(p.dtype);
  const bool overlap = runs_second(p) && mla_decode_overlap_stage_b(
                                             int64_t{k.a_rows} * p.model_dim * eb,
                                             p.kv_b_rows() * p.kv_rank * eb);
  const StageAPlan plan = stage_a_plan(p.model_dim, k.a_rows, facts->sm_count, k.window,
                                       windows, overlap ? kStageABlocksBeforeB : kBlocksPerSm);
  const FusedPlan fused_cut = fused_plan(p, k.q_rows, k.a_rows, facts->sm_count);
  const bool fused = allow_fused && runs_first(p) && fused_cut.usable &&
                     facts->cooperative_launch &&
                     mla_decode_fused_stage_a_preferred(
                         p.tokens(), k.q_rows > 0, !runs_second(p),
                         int64_t{k.a_rows} * p.model_dim * eb);
  k.rows_ld = plan.rows_ld;
  k.chunk = fused ? fused_cut.chunk : plan.chunk;
  k.chunks = fused ? fused_cut.chunks : plan.chunks;
  k.q_slices = ceil_div(k.q_rows, kSlice);
  k.c_slices = ceil_div(k.kv_rank, kSlice);
  k.slices = k.q_slices + k.c_slices + 1;
  // K2 as sm_90 code on an sm_90 device: a programmatic dependent, and a cluster where it fits.
  const bool epilogue_sm90 =
      programmatic_launch_allowed<mla_decode_stage_a_epilogue<T, RopeT>>(facts->major);
  k.cluster_norm = k.slices <= kMaxClusterSlices && epilogue_sm90;
  const int64_t tiles = ceil_div<int64_t>(k.b_rows, kTileRows);
  const bool ring = stage_b_ring(kM, tiles, facts->sm_count);
  const bool whole_row_fits = k.q_rows == 0 && k.a_rows <= kRowEpilogueRows * kThreads;
  k.fold = !fused && runs_first(p) && runs_second(p) && whole_row_fits && k.tokens == 1 && !ring &&
           mla_decode_fold_epilogue(stage_b_blocks(tiles, ring, facts->sm_count) * k.chunks *
                                    k.rows_ld * int64_t{sizeof(float)});
  k.whole_rows = !k.fold && whole_row_fits &&
                 mla_decode_whole_rows(ceil_div(k.chunks, kRowEpilogueBatch));

  bind_tensors(p, a, k);

  const cudaLaunchConfig_t config = plain_launch_config(kThreads, stream);

  if (fused) {
    // A plain cooperative launch: the grid-wide barrier needs every block resident, and KA
    // touches memory from its first instruction (it has no wait for the kernel before it).
    cudaLaunchAttribute cooperative{};
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    LaunchAttributes fused_attributes(false, &cooperative);
    cudaLaunchConfig_t fused_config = fused_attributes.on(config);
    fused_config.gridDim = dim3(static_cast<unsigned>(fused_cut.row_groups),
                                static_cast<unsigned>(fused_cut.chunks));
    const cudaError_t launched = cudaLaunchKernelEx(&fused_config, mla_decode_fused_stage_a<T>, k);
    if (launched == cudaErrorCooperativeLaunchTooLarge) {
      (void)cudaGetLastError();  // nothing was launched: clear it and run K1 and K2
      return launch<T, RopeT, kM>(p, a, stream, false);
    }
    LATENTKV_RETURN_IF_ERROR(
        cuda_status(launched, "cudaLaunchKernelEx(mla_decode_fused_stage_a, cooperative)"));
  } else if (runs_first(p)) {
    // K1 waits for the kernel before it (the caller's, or the previous call's last) before it
    // touches memory (the arrivals it zeroes, the partials it overwrites, the inputs); launched
    // as its programmatic dependent where mla_decode_stage_a_programmatic, else a plain launch.
    const bool k1_programmatic =
        mla_decode_stage_a_programmatic(p.tokens(), int64_t{k.a_rows} * p.model_dim * eb) &&
        programmatic_launch_allowed<mla_decode_stage_a<T, kM>>(facts->major);
    const size_t k1_smem = sizeof(T) * k.window * smem_ld(k.chunk);
    const cudaLaunchAttribute carveout =
        overlap ? stage_a_carveout(p, k.window, k1_smem, ring, facts) : cudaLaunchAttribute{};
    k.prefetch_weights_l2 =
        k1_programmatic && mla_decode_stage_a_prefetch_l2(p.tokens(), runs_second(p));
    LaunchAttributes k1_attributes(k1_programmatic, overlap ? &carveout : nullptr);
    cudaLaunchConfig_t k1 = k1_attributes.on(config);
    k1.gridDim = dim3(plan.row_groups, plan.chunks, windows);
    k1.dynamicSmemBytes = k1_smem;
    LATENTKV_CUDA_RETURN(cudaLaunchKernelEx(&k1, mla_decode_stage_a<T, kM>, k));
    if (k.whole_rows) {
      LATENTKV_CUDA_RETURN(launch_after_previous<mla_decode_stage_a_row_epilogue<T>>(
          dim3(1, k.tokens), kThreads, 0, stream, facts->major, k));
    } else if (!k.fold) {
      // Programmatic on sm_90 code, and with cluster_norm one cluster of the token's slices.
      cudaLaunchAttribute cluster{};
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = static_cast<unsigned>(k.slices);
      cluster.val.clusterDim.y = 1;
      cluster.val.clusterDim.z = 1;
      const cudaError_t launched = launch_after_previous<mla_decode_stage_a_epilogue<T, RopeT>>(
          dim3(k.slices, std::max(k.tokens, kMlaDecodeEpilogueMinTokenRows)), kThreads, 0, stream,
          facts->major, k, k.cluster_norm ? &cluster : nullptr);
      LATENTKV_RETURN_IF_ERROR(
          cuda_status(launched, "cudaLaunchKernelEx(mla_decode_stage_a_epilogue)"));
    }
  }
  if (!runs_second(p)) return Status::Ok();
  const int64_t smem_b = stage_b_smem(p, k.window, sizeof(T));
  if constexpr (kM == 1) {
    if (ring) {
      return launch_stage_b<T, kM, true>(k, tiles, windows, smem_b, facts, runs_first(p), config);
    }
  }
  return launch_stage_b<T, kM, false>(k, tiles, windows, smem_b, facts, runs_first(p), config);
}

// The one switch point: dtype (caller), RoPE table type and token tiles (K1's and K3's) to
// template arguments.
template <typename T, typename RopeT>
Status launch_tiles(const MlaProblem& p, const MlaArgs& a, Stream stream) {
  switch (token_tiles(p)) {
    case 1: return launch<T, RopeT, 1>(p, a, stream);
    case 2: return launch<T, RopeT, 2>(p, a, stream);
    default: return launch<T, RopeT, 4>(p, a, stream);
  }
}

template <typename T>
Status launch_rope(const MlaProblem& p, const MlaArgs& a, Stream stream) {
  return p.rope_dtype == DType::kFloat32 ? launch_tiles<T, float>(p, a, stream)
                                         : launch_tiles<T, T>(p, a, stream);
}

}  // namespace

int64_t mla_cuda_decode_workspace_size(const MlaProblem& p) {
  if (!runs_first(p) || p.tokens() > kMaxTokens) return 0;
  return kRegionAlignment + workspace_layout(p).end;
}

Status mla_cuda_decode_takes(const MlaProblem& p, const MlaArgs& a) {
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) {
    return refuse(std::string("problem.dtype = ") + to_string(p.dtype) +
                  ": the kernels are bf16/fp16 tensor-core GEMVs");
  }
  if (p.tokens() > kMaxTokens) {
    return refuse("problem.batch * problem.seq (tokens) = " + std::to_string(p.tokens()) +
                  " exceeds the " + std::to_string(kMaxTokens) + " tokens of its " +
                  std::to_string(kMaxMTiles) + " MMA tiles (cuda-mla-gemm takes more)");
  }
  LATENTKV_RETURN_IF_ERROR(cuda_require_compute_capability(8, "cuda-mla-decode"));
  // mma.sync exists only in code compiled for sm_80 or newer (ptx.h's stand-ins below it).
  if (const int arch = compiled_arch<mla_decode_stage_a<__nv_bfloat16, 1>>(); arch < 80) {
    return refuse("this build has no sm_80+ code for its kernels (compiled for compute_" +
                  std::to_string(arch) + ")");
  }
  const int64_t eb = element_size(p.dtype);
  if (p.model_dim > INT_MAX / 2 || p.q_rank + p.cache_width() > INT_MAX / 2 ||
      p.kv_b_rows() > INT_MAX / 2 || p.heads * p.k_width() > INT_MAX / 2) {
    return refuse("problem.model_dim, q_rank + kv_rank + rope_dim or heads * (nope_dim + "
                  "v_dim) exceeds its int32 indexing");
  }
  const int64_t widest = max_chunk(static_cast<int>(std::max<int64_t>(p.tokens(), 1)));
  if (runs_first(p) && p.model_dim > kMaxGridY * widest) {
    return refuse("problem.model_dim = " + std::to_string(p.model_dim) + " exceeds " +
                  std::to_string(kMaxGridY * widest) + " (stage A's grid holds at most " +
                  std::to_string(kMaxGridY) + " chunks of " + std::to_string(widest) +
                  " columns at " + std::to_string(p.tokens()) + " tokens)");
  }
  if (runs_second(p) && p.tokens() * p.heads * p.rope_dim > INT_MAX / 2) {
    return refuse("problem.batch * seq * heads * rope_dim = " +
                  std::to_string(p.tokens() * p.heads * p.rope_dim) +
                  " exceeds the int32 indexing of K's k_pe columns");
  }
  if (p.kv_rank % 8 != 0 || p.kv_rank > kMaxRank) {
    return refuse("problem.kv_rank = " + std::to_string(p.kv_rank) + " must be a multiple of 8 "
                  "and at most " + std::to_string(kMaxRank) + " (16-byte rows of kv_b, c in "
                  "shared memory)");
  }
  if (p.rope_dim > kMaxRopeDim) {
    return refuse("problem.rope_dim = " + std::to_string(p.rope_dim) + " exceeds the " +
                  std::to_string(kMaxRopeDim) + " columns of its RoPE block");
  }
  if (runs_first(p)) {
    if (p.model_dim % 8 != 0) {
      return refuse("problem.model_dim = " + std::to_string(p.model_dim) +
                    " is not a multiple of 8 (16-byte weight and hidden vectors)");
    }
    if (a.q_a != nullptr && p.q_rank % 8 != 0) {
      return refuse("problem.q_rank = " + std::to_string(p.q_rank) +
                    " is not a multiple of 8 (q_a's rows end inside a weight tile)");
    }
    LATENTKV_RETURN_IF_ERROR(vector_rows("kv_a_weight", a.kv_a_weight, a.kv_a_weight_stride_row,
                                         "args.kv_a_weight_stride_row", eb));
    if (a.q_a != nullptr) {
      LATENTKV_RETURN_IF_ERROR(vector_rows("q_a_weight", a.q_a_weight, a.q_a_weight_stride_row,
                                           "args.q_a_weight_stride_row", eb));
    }
    LATENTKV_RETURN_IF_ERROR(vector_rows("hidden", a.hidden,
                                         p.seq > 1 ? a.hidden_stride_seq : 0,
                                         "args.hidden_stride_seq", eb));
    LATENTKV_RETURN_IF_ERROR(vector_rows("hidden", a.hidden,
                                         p.batch > 1 ? a.hidden_stride_batch : 0,
                                         "args.hidden_stride_batch", eb));
    const int64_t need = mla_cuda_decode_workspace_size(p);
    const int64_t pad = a.workspace == nullptr
                            ? 0
                            : aligned_workspace(a.workspace) - static_cast<char*>(a.workspace);
    if (a.workspace == nullptr || a.workspace_bytes < pad + workspace_layout(p).end) {
      return {StatusCode::kInvalidArgument,
              "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                  (a.workspace == nullptr ? " with args.workspace = null" : "") +
                  ": cuda-mla-decode needs " + std::to_string(need) + " bytes of workspace"};
    }
  }
  if (runs_second(p)) {
    const DeviceFacts* facts = nullptr;
    LATENTKV_RETURN_IF_ERROR(current_device_facts(&facts));
    const int64_t smem = stage_b_smem(p, window_tokens(p, token_tiles(p)), eb);
    if (smem > 48 * 1024 &&
        smem + kStageBStaticSmem > static_cast<int64_t>(facts->smem_optin)) {
      return refuse("problem.batch * seq (tokens) = " + std::to_string(p.tokens()) +
                    " with kv_rank = " + std::to_string(p.kv_rank) + " needs " +
                    std::to_string(smem) + " bytes of shared memory for stage B; the device "
                    "allows " + std::to_string(facts->smem_optin));
    }
    LATENTKV_RETURN_IF_ERROR(vector_rows("kv_b_weight", a.kv_b_weight, a.kv_b_weight_stride_row,
                                         "args.kv_b_weight_stride_row", eb));
  }
  return mla_elements_aligned(a, eb, element_size(p.rope_dtype));
}

Status run_mla_cuda_decode(const MlaProblem& p, const MlaArgs& a, Stream stream) {
  if (p.dtype == DType::kBFloat16) return launch_rope<__nv_bfloat16>(p, a, stream);
  if (p.dtype == DType::kFloat16) return launch_rope<__half>(p, a, stream);
  return refuse(std::string("problem.dtype = ") + to_string(p.dtype) +
                ": the kernels are bf16/fp16 tensor-core GEMVs");
}

}  // namespace latentkv::detail
