// The CPU backend of the projection (Strategy::kCpuBlocked): the fused KV projection on host
// memory, float32, bfloat16 and float16.
//
// Why this shape: the latent of a tile of tokens is small (24 tokens x 256 ranks = 24 KB), so it
// stays on the stack, in L1/L2, between the down projection that makes it and the two up
// projections that use it; it reaches memory only when the caller asks for it. K and V go straight
// to their places in the stacked [2, B, S, H, Dh] output: no temporaries, no stack copy.
//
// Every product is C[rows, n] (+)= A[rows, k] @ W[k, n] with W row-major. A register tile of up
// to 6 tokens x 16 columns accumulates in float; per k it loads a row of W's contiguous columns and
// does one broadcast FMA per token into it, written with GCC vector types so the accumulators stay
// in ymm registers (plain loops auto-vectorized by g++ 12 spilled them to the stack: 2x slower).
// The down projection is blocked over D (kDBlock rows of w_down per pass, so the panel a register
// tile streams stays in cache) and the latent over R (kRBlock), so the stack buffer has a fixed
// size for any rank: a second R block adds its part to the K and V already written. Token tiles
// are independent; a small persistent thread pool takes them when the problem is big enough to pay
// for waking it. At a register tile's worth of tokens or fewer (decode; a token tile's for bf16 on
// AVX512-BF16) the pool splits the weights' columns instead (run_split), so one token's call uses
// every core and each weight is read once across the threads.
//
// bf16 / fp16 (run_tile_half): the same micro-kernels read the weights in place, widening eight
// elements at a time as they load them; a tile's hidden rows are widened one D block at a time; the
// latent row is summed whole in float32 and rounded to the dtype once, as the unfused computation
// holds it between its GEMMs (cuda-gemm does the same), into a scratch of [T, R] floats the
// caller's thread keeps (grown to the largest call, allocated before anything is written); K and V
// are summed over all of R in float32 column panels and each element rounded once into out. On a
// CPU with AVX512-BF16, bf16's products go to cpu/bf16_dot.cpp instead (product): the hidden
// rows read in place and the rounded latent kept as bf16 bits, the same tiles and panels around it.
#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "backends.h"
#include "cpu/bf16_dot.h"
#include "cpu/elements.h"
#include "cpu/thread_pool.h"
#include "cuda/common.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

// Register tiles: up to kRows rows x vecs_for_rows(rows) Vec8s of columns. 6 x 2 Vec8s (16
// columns) = 12 accumulators, plus 2 loads of W and a broadcast, is 15 of the 16 ymm registers;
// on the founding case against 4x16, 4x24, 5x16 and 3x32, 6x16 was the fastest. The rows left
// over (tokens % 6: the whole tile when T < 6) get a tile of their own, widened to >= 8
// accumulators, enough independent FMA chains to hide the FMA latency: a 6-row tile running one
// live row would do 6x the work. The sizes, with their reasons, are in tile_sizes.h.
constexpr int kRows = tiles::kCpuRows;
constexpr int kTileTokens = tiles::kCpuTileTokens;
constexpr int64_t kDBlock = tiles::kCpuDBlock;
constexpr int64_t kRBlock = tiles::kCpuRBlock;
constexpr int64_t kUpPanel = tiles::kCpuUpPanel;
constexpr int64_t kStreamK = tiles::kCpuStreamK;

// Vec8s per row of the register tile for `rows` rows (1..kRows).
constexpr int vecs_for_rows(int rows) { return rows == 1 ? 8 : rows <= 3 ? 4 : rows == 4 ? 3 : 2; }

// The output side of a product: one row pointer per token; a row's n columns lie in segments of
// `seg` contiguous floats placed `seg_stride` apart (the heads of out; a single segment when
// seg == seg_stride, as for the latent).
struct OutRows {
  float* row[kTileTokens];
  int64_t seg;
  int64_t seg_stride;
};

// Copies `count` floats between vals and columns [col, col + count) of output row i (into the row
// when kStore). A compile-time kCount > 0 fixes count, so a contiguous row moves with a few vector
// loads or stores instead of a memcpy call.
template <bool kStore, int kCount>
inline void move_columns(const OutRows& c, int i, int64_t col, float* vals, int cols) {
  const int count = kCount > 0 ? kCount : cols;
  auto copy = [](float* row, float* v, int len) {
    for (int j = 0; j < len; ++j) {
      if constexpr (kStore) {
        row[j] = v[j];
      } else {
        v[j] = row[j];
      }
    }
  };
  if (c.seg == c.seg_stride) {
    copy(c.row[i] + col, vals, count);
    return;
  }
  int64_t s = col / c.seg, e = col % c.seg;
  for (int j = 0; j < count;) {
    const int len = static_cast<int>(std::min<int64_t>(count - j, c.seg - e));
    copy(c.row[i] + s * c.seg_stride + e, vals + j, len);
    j += len;
    ++s;
    e = 0;
  }
}

// Eight floats, one ymm register under -march=x86-64-v3 (a GCC/Clang vector extension: the
// compiler emits the vector code, narrower registers on older targets). Loads and stores go through
// memcpy, so rows need no alignment.
typedef float Vec8 __attribute__((vector_size(32)));

inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof v); }

// The weights' element types: float32, and bf16 / fp16 bit patterns (distinct types, so that the
// micro-kernels below are instantiated once per dtype), read as float32.
struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};
inline Vec8 load8(const Bf16* p) { return (Vec8)load8_bf16(&p->bits); }
inline Vec8 load8(const Fp16* p) { return (Vec8)load8_fp16(&p->bits); }
inline float value_of(float x) { return x; }
inline float value_of(Bf16 x) { return bf16_to_float(x.bits); }
inline float value_of(Fp16 x) { return fp16_to_float(x.bits); }

// tile[i][j] += sum_k a[i][a_col + k] * w[k * ldw + j] for i < kR, j < 8 * kV: per k, kV loads of
// w, kR broadcasts and kR * kV FMAs on accumulators that stay in registers.
template <typename W, int kR, int kV>
inline void fma_tile(const float* const* a, int64_t a_col, int64_t k_len, const W* w,
                     int64_t ldw, float (&tile)[kR][8 * kV]) {
  Vec8 acc[kR][kV];
  for (int i = 0; i < kR; ++i) {
    for (int v = 0; v < kV; ++v) acc[i][v] = load8(&tile[i][8 * v]);
  }
  for (int64_t k = 0; k < k_len; ++k) {
    Vec8 wk[kV];  // W row k, columns [0, 8 * kV)
    for (int v = 0; v < kV; ++v) wk[v] = load8(w + k * ldw + 8 * v);
    for (int i = 0; i < kR; ++i) {
      const float x = a[i][a_col + k];
      for (int v = 0; v < kV; ++v) acc[i][v] += x * wk[v];
    }
  }
  for (int i = 0; i < kR; ++i) {
    for (int v = 0; v < kV; ++v) store8(&tile[i][8 * v], acc[i][v]);
  }
}

// The same for the last cols < 8 * kV columns of a row: a runtime width, vectorized by g++ where it
// can, accumulating in memory. Only the tail of each product takes it.
template <typename W, int kR, int kV>
inline void fma_tile_tail(const float* const* a, int64_t a_col, int64_t k_len, const W* w,
                          int64_t ldw, int cols, float (&tile)[kR][8 * kV]) {
  for (int64_t k = 0; k < k_len; ++k) {
    const W* wk = w + k * ldw;
    for (int i = 0; i < kR; ++i) {
      const float x = a[i][a_col + k];
      for (int j = 0; j < cols; ++j) tile[i][j] += x * value_of(wk[j]);
    }
  }
}

// c[i0 : i0 + kR, n0 : n0 + 8 * kV] (+)= a[i0 : i0 + kR, a_col : a_col + k_len] @ w[0:k_len, same
// columns], kV = vecs_for_rows(kR), clipped at column n.
template <typename W, int kR>
void register_tile(const float* const* a, int64_t a_col, int i0, int64_t k_len, const W* w,
                   int64_t ldw, int64_t n0, int64_t n, const OutRows& c, bool accumulate) {
  constexpr int kV = vecs_for_rows(kR);
  constexpr int kCols = 8 * kV;
  const int cols = static_cast<int>(std::min<int64_t>(kCols, n - n0));
  float tile[kR][kCols] = {};
  if (cols == kCols) {
    if (accumulate) {
      for (int i = 0; i < kR; ++i) move_columns<false, kCols>(c, i0 + i, n0, tile[i], cols);
    }
    fma_tile<W, kR, kV>(a + i0, a_col, k_len, w + n0, ldw, tile);
    for (int i = 0; i < kR; ++i) move_columns<true, kCols>(c, i0 + i, n0, tile[i], cols);
  } else {
    if (accumulate) {
      for (int i = 0; i < kR; ++i) move_columns<false, 0>(c, i0 + i, n0, tile[i], cols);
    }
    fma_tile_tail<W, kR, kV>(a + i0, a_col, k_len, w + n0, ldw, cols, tile);
    for (int i = 0; i < kR; ++i) move_columns<true, 0>(c, i0 + i, n0, tile[i], cols);
  }
}

// Rows [i0, i0 + kR) of the product below, column tile by column tile.
template <typename W, int kR>
void gemm_rows(const float* const* a, int64_t a_col, int i0, int64_t k_len, const W* w,
               int64_t ldw, int64_t n_begin, int64_t n, const OutRows& c, bool accumulate) {
  for (int64_t n0 = n_begin; n0 < n; n0 += 8 * vecs_for_rows(kR)) {
    register_tile<W, kR>(a, a_col, i0, k_len, w, ldw, n0, n, c, accumulate);
  }
}

// c[0:rows, n_begin:n] = (accumulate ? c : 0) + a[0:rows, a_col : a_col + k_len] @
// w[0:k_len, n_begin:n], all of k. The whole kRows groups run inside each column panel, so a panel
// of w comes from memory once per token tile and from cache for the other groups (streaming w per
// group instead made the weight-bound deepseek-v3 case 2x slower); the rows left over take one
// narrower tile after.
template <typename W>
void all_columns(const float* const* a, int64_t a_col, int rows, int64_t k_len, const W* w,
                 int64_t ldw, int64_t n_begin, int64_t n, const OutRows& c, bool accumulate) {
  const int whole = rows / kRows * kRows;
  if (whole > 0) {
    for (int64_t n0 = n_begin; n0 < n; n0 += 8 * vecs_for_rows(kRows)) {
      for (int i0 = 0; i0 < whole; i0 += kRows) {
        register_tile<W, kRows>(a, a_col, i0, k_len, w, ldw, n0, n, c, accumulate);
      }
    }
  }
  switch (rows - whole) {
    case 1: gemm_rows<W, 1>(a, a_col, whole, k_len, w, ldw, n_begin, n, c, accumulate); break;
    case 2: gemm_rows<W, 2>(a, a_col, whole, k_len, w, ldw, n_begin, n, c, accumulate); break;
    case 3: gemm_rows<W, 3>(a, a_col, whole, k_len, w, ldw, n_begin, n, c, accumulate); break;
    case 4: gemm_rows<W, 4>(a, a_col, whole, k_len, w, ldw, n_begin, n, c, accumulate); break;
    case 5: gemm_rows<W, 5>(a, a_col, whole, k_len, w, ldw, n_begin, n, c, accumulate); break;
    default: break;
  }
  static_assert(kRows == 6, "the switch above covers 1..kRows-1 leftover rows");
}

// The same product. At most one register tile of rows (few tokens: each weight byte is used by
// at most kRows tokens, so w streams from memory), w goes in blocks of kCpuStreamK rows, each
// block across all n columns, instead of column tiles that each walk all of k (reading a few
// dozen bytes from every row far apart): each row's columns are then read in one sweep, which the
// hardware prefetchers follow. More rows over more than kCpuBlockCols columns (the up products of
// a token tile) go in blocks of kCpuBlockCols columns x kCpuBlockK rows of w, so that the column
// tiles that the row groups share walk at most kCpuBlockK rows. The accumulators pass through c as
// float32 between blocks, so the sums and their order are the whole-k tiles': same bits.
template <typename W>
void gemm_tile(const float* const* a, int64_t a_col, int rows, int64_t k_len, const W* w,
               int64_t ldw, int64_t n, const OutRows& c, bool accumulate) {
  const bool stream = rows <= kRows;
  const bool blocked = !stream && n > tiles::kCpuBlockCols;
  const int64_t block_cols = blocked ? tiles::kCpuBlockCols : n;
  const int64_t block_k =
      stream ? kStreamK : blocked ? tiles::kCpuBlockK : std::max<int64_t>(k_len, 1);
  for (int64_t n0 = 0; n0 < n; n0 += block_cols) {
    for (int64_t k0 = 0; k0 == 0 || k0 < k_len; k0 += block_k) {  // once at k_len = 0: c = 0
      all_columns(a, a_col + k0, rows, std::min(block_k, k_len - k0), w + k0 * ldw, ldw, n0,
                  std::min(n, n0 + block_cols), c, accumulate || k0 > 0);
    }
  }
}

// Tokens [t0, t0 + rows): latent tile, then K and V, one R block at a time.
void run_tile(const Problem& p, const Args& a, int64_t t0, int rows) {
  const float* hidden = static_cast<const float*>(a.hidden);  // [B, S, D]
  const float* w_down = static_cast<const float*>(a.w_down);  // [D, R]
  const float* w_up_k = static_cast<const float*>(a.w_up_k);  // [R, N]
  const float* w_up_v = static_cast<const float*>(a.w_up_v);  // [R, N]
  float* out = static_cast<float*>(a.out);                    // [2, B, S, H, Dh]
  float* latent = static_cast<float*>(a.latent);              // [B, S, R] or null

  alignas(64) float tile[kTileTokens * kRBlock];  // [rows, kRBlock]: one R block of the latent
  const float* hidden_rows[kTileTokens];
  float* latent_rows[kTileTokens];
  OutRows tile_out{{}, kRBlock, kRBlock};
  OutRows k_out{{}, p.head_dim, a.out_stride_head};
  OutRows v_out{{}, p.head_dim, a.out_stride_head};
  for (int i = 0; i < rows; ++i) {
    const int64_t t = t0 + i;
    const int64_t b = t / p.seq, s = t % p.seq;
    hidden_rows[i] = hidden + b * a.hidden_stride_batch + s * a.hidden_stride_seq;
    tile_out.row[i] = tile + i * kRBlock;
    k_out.row[i] = out + b * a.out_stride_batch + s * a.out_stride_seq;
    v_out.row[i] = k_out.row[i] + a.out_stride_kv;
    latent_rows[i] =
        latent ? latent + b * a.latent_stride_batch + s * a.latent_stride_seq : nullptr;
  }

  const int64_t n = p.kv_width();
  for (int64_t r0 = 0; r0 < p.rank; r0 += kRBlock) {
    const int64_t rb = std::min(kRBlock, p.rank - r0);
    for (int64_t d0 = 0; d0 < p.model_dim; d0 += kDBlock) {
      gemm_tile(hidden_rows, d0, rows, std::min(kDBlock, p.model_dim - d0),
                w_down + d0 * a.w_down_stride_row + r0, a.w_down_stride_row, rb, tile_out, d0 > 0);
    }
    if (latent) {
      for (int i = 0; i < rows; ++i) {
        std::memcpy(latent_rows[i] + r0, tile_out.row[i], rb * sizeof(float));
      }
    }
    gemm_tile(tile_out.row, 0, rows, rb, w_up_k + r0 * a.w_up_k_stride_row, a.w_up_k_stride_row, n,
              k_out, r0 > 0);
    gemm_tile(tile_out.row, 0, rows, rb, w_up_v + r0 * a.w_up_v_stride_row, a.w_up_v_stride_row, n,
              v_out, r0 > 0);
  }
}

// Columns [r0, r0 + count) of the latent of tokens [t0, t0 + rows), summed in float32 (cols[i]
// points at token i's column r0): rounded to the dtype (the unfused computation's latent; float32
// unchanged), kept as bf16 bits too when bits is given (bits[i] at token i's column r0; exact, the
// rounded values being bf16's), and, when asked, written to the latent output.
void finish_latent(const Problem& p, const Args& a, int64_t t0, int rows, float* const* cols,
                   int64_t r0, int64_t count, uint16_t* const* bits) {
  for (int i = 0; i < rows; ++i) {
    float* row = cols[i];
    round_row(row, count, p.dtype, bits != nullptr ? bits[i] : nullptr);
    if (a.latent != nullptr) {
      store_elements(a.latent,
                     token_offset(t0 + i, p.seq, a.latent_stride_batch, a.latent_stride_seq) + r0,
                     p.dtype, row, count);
    }
  }
}

// c[0:rows, 0:n] (+)= a[0:rows, 0:k_len] @ w[0:k_len, 0:n]: on the bf16 rows a_bits through
// AVX512-BF16 when they are given (bf16 weights only; c contiguous rows), else on the float32 rows
// a_float through the FMA micro-kernels (widening half-type weights as they load).
template <typename W>
void product(const float* const* a_float, const uint16_t* const* a_bits, int rows, int64_t k_len,
             const W* w, int64_t ldw, int64_t n, const OutRows& c, bool accumulate) {
  if constexpr (std::is_same_v<W, Bf16>) {
    if (a_bits != nullptr) {
      gemm_bf16_dot(a_bits, rows, k_len, &w->bits, ldw, n, c.row, accumulate);
      return;
    }
  }
  gemm_tile(a_float, 0, rows, k_len, w, ldw, n, c, accumulate);
}

// Columns [n0, n0 + count) (count <= panel.seg) of K (kv = 0) or V of tokens [t0, t0 + rows):
// the latent rows (float32, or bf16 bits where given) times w_up's columns into the float32
// panel, then each element rounded once into out, head by head.
template <typename W>
void up_columns(const Problem& p, const Args& a, int64_t t0, int rows,
                const float* const* latent_rows, const uint16_t* const* latent_bits, int kv,
                int64_t n0, int64_t count, const OutRows& panel) {
  const W* w_up = static_cast<const W*>(kv == 0 ? a.w_up_k : a.w_up_v);  // [R, N]
  const int64_t ld = kv == 0 ? a.w_up_k_stride_row : a.w_up_v_stride_row;
  product(latent_rows, latent_bits, rows, p.rank, w_up + n0, ld, count, panel, false);
  for (int i = 0; i < rows; ++i) {
    const int64_t row = kv * a.out_stride_kv +
                        token_offset(t0 + i, p.seq, a.out_stride_batch, a.out_stride_seq);
    for (int64_t c = n0; c < n0 + count;) {
      const int64_t h = c / p.head_dim, e = c % p.head_dim;
      const int64_t len = std::min(p.head_dim - e, n0 + count - c);
      store_elements(a.out, row + h * a.out_stride_head + e, p.dtype, panel.row[i] + (c - n0),
                     len);
      c += len;
    }
  }
}

// Tokens [t0, t0 + rows) of a bf16 / fp16 call (header): latent holds the tile's [rows, R] floats;
// latent_bits, given on the AVX512-BF16 path only, its [rows, R] bf16 copy.
template <typename W>
void run_tile_half(const Problem& p, const Args& a, int64_t t0, int rows, float* latent,
                   uint16_t* latent_bits) {
  const auto* hidden = static_cast<const uint16_t*>(a.hidden);  // [B, S, D]
  const W* w_down = static_cast<const W*>(a.w_down);             // [D, R]

  alignas(64) float hidden_block[kTileTokens * kDBlock];  // [rows, kDBlock] as float32
  alignas(64) float panel[kTileTokens * kUpPanel];        // [rows, kUpPanel]: K or V columns
  const bool dot = latent_bits != nullptr;
  const uint16_t* hidden_rows[kTileTokens];
  const uint16_t* block_bits[kTileTokens];  // the AVX512-BF16 path's D block: hidden in place
  const float* block_rows[kTileTokens];
  uint16_t* bits_rows[kTileTokens];
  OutRows latent_out{{}, p.rank, p.rank};
  OutRows panel_out{{}, kUpPanel, kUpPanel};
  for (int i = 0; i < rows; ++i) {
    hidden_rows[i] =
        hidden + token_offset(t0 + i, p.seq, a.hidden_stride_batch, a.hidden_stride_seq);
    block_rows[i] = hidden_block + i * kDBlock;
    bits_rows[i] = dot ? latent_bits + i * p.rank : nullptr;
    latent_out.row[i] = latent + i * p.rank;
    panel_out.row[i] = panel + i * kUpPanel;
  }
  uint16_t* const* latent_bit_rows = dot ? bits_rows : nullptr;

  for (int64_t d0 = 0; d0 < p.model_dim; d0 += kDBlock) {
    const int64_t db = std::min(kDBlock, p.model_dim - d0);
    for (int i = 0; i < rows; ++i) {
      if (dot) {
        block_bits[i] = hidden_rows[i] + d0;
      } else {
        to_float(hidden_rows[i] + d0, p.dtype, db, hidden_block + i * kDBlock);
      }
    }
    product(block_rows, dot ? block_bits : nullptr, rows, db, w_down + d0 * a.w_down_stride_row,
            a.w_down_stride_row, p.rank, latent_out, d0 > 0);
  }
  finish_latent(p, a, t0, rows, latent_out.row, 0, p.rank, latent_bit_rows);
  for (int kv = 0; kv < 2; ++kv) {
    for (int64_t n0 = 0; n0 < p.kv_width(); n0 += kUpPanel) {
      up_columns<W>(p, a, t0, rows, latent_out.row, latent_bit_rows, kv, n0,
                    std::min(kUpPanel, p.kv_width() - n0), panel_out);
    }
  }
}

struct TileWork {
  const Problem* problem;
  const Args* args;
  int64_t tile_tokens;
  float* latent;          // bf16 / fp16: [T, R] float32 scratch
  uint16_t* latent_bits;  // bf16 on AVX512-BF16: [T, R] bf16 scratch, else null
};

void run_tile_item(const void* ctx, int64_t item) {
  const TileWork& w = *static_cast<const TileWork*>(ctx);
  const Problem& p = *w.problem;
  const int64_t t0 = item * w.tile_tokens;
  const int rows = static_cast<int>(std::min(w.tile_tokens, p.tokens() - t0));
  switch (p.dtype) {
    case DType::kFloat32: run_tile(p, *w.args, t0, rows); break;
    case DType::kBFloat16:
      run_tile_half<Bf16>(p, *w.args, t0, rows, w.latent + t0 * p.rank,
                          w.latent_bits != nullptr ? w.latent_bits + t0 * p.rank : nullptr);
      break;
    case DType::kFloat16:
      run_tile_half<Fp16>(p, *w.args, t0, rows, w.latent + t0 * p.rank, nullptr);
      break;
  }
}

// Few tokens (heuristics.h cpu_blocked_split_tokens: at most one register tile, or one token tile
// for bf16 on AVX512-BF16) on more than one thread: token tiles would spread badly or give every
// thread its own read of all the weights, so the call runs in two phases over the weights' columns
// instead, each item all T tokens x a block of columns: the latent [T, R] in one block of
// latent_cols a thread (rounded to the dtype for bf16 / fp16; written to the latent output when
// asked), then [K | V] in blocks of kv_cols (both heuristics.h).
// The sums run in the same order as run_tile's (k ascending in one register lane), so the results
// are the same bits as one thread's.
struct SplitWork {
  const Problem* problem;
  const Args* args;
  const float* hidden_rows[kTileTokens];     // float32 rows: hidden in place, or widened
  const uint16_t* hidden_bits[kTileTokens];  // bf16 on AVX512-BF16: hidden in place (else unused)
  float* latent;                             // [T, R] float32
  uint16_t* latent_bits;                     // bf16 on AVX512-BF16: [T, R] bf16, else null
  int64_t latent_cols;                       // latent columns per item of the first phase
  int64_t kv_cols;                           // [K | V] columns per item of the second phase
};

template <typename W>
void split_latent_item(const SplitWork& w, int64_t item) {
  const Problem& p = *w.problem;
  const int rows = static_cast<int>(p.tokens());
  const int64_t r0 = item * w.latent_cols, count = std::min(w.latent_cols, p.rank - r0);
  const bool dot = w.latent_bits != nullptr;
  OutRows cols{{}, p.rank, p.rank};
  uint16_t* bits[kTileTokens] = {};
  for (int i = 0; i < rows; ++i) {
    cols.row[i] = w.latent + i * p.rank + r0;
    if (dot) bits[i] = w.latent_bits + i * p.rank + r0;
  }
  product(w.hidden_rows, dot ? w.hidden_bits : nullptr, rows, p.model_dim,
          static_cast<const W*>(w.args->w_down) + r0, w.args->w_down_stride_row, count, cols,
          false);
  finish_latent(p, *w.args, 0, rows, cols.row, r0, count, dot ? bits : nullptr);
}

template <typename W>
void split_kv_item(const SplitWork& w, int64_t item) {
  const Problem& p = *w.problem;
  const int rows = static_cast<int>(p.tokens());
  const int64_t blocks = ceil_div(p.kv_width(), w.kv_cols);
  const int64_t n0 = item % blocks * w.kv_cols;
  alignas(64) float panel[tiles::kCpuSplitPanelFloats];  // [rows, kv_cols]
  const float* latent_rows[kTileTokens] = {};
  const uint16_t* bits_rows[kTileTokens] = {};
  OutRows panel_out{{}, w.kv_cols, w.kv_cols};
  for (int i = 0; i < rows; ++i) {
    latent_rows[i] = w.latent + i * p.rank;
    if (w.latent_bits != nullptr) bits_rows[i] = w.latent_bits + i * p.rank;
    panel_out.row[i] = panel + i * w.kv_cols;
  }
  up_columns<W>(p, *w.args, 0, rows, latent_rows, w.latent_bits != nullptr ? bits_rows : nullptr,
                static_cast<int>(item / blocks), n0, std::min(w.kv_cols, p.kv_width() - n0),
                panel_out);
}

template <typename W>
void run_split(const SplitWork& work, int threads) {
  const Problem& p = *work.problem;
  parallel_for(ceil_div(p.rank, work.latent_cols), threads,
               [&](int64_t item) { split_latent_item<W>(work, item); });
  parallel_for(2 * ceil_div(p.kv_width(), work.kv_cols), threads,
               [&](int64_t item) { split_kv_item<W>(work, item); });
}

}  // namespace

Status run_cpu_blocked(const Problem& problem, const Args& args) {
  const int64_t t = problem.tokens();
  const double fmas =
      static_cast<double>(t) * (static_cast<double>(problem.model_dim) * problem.rank +
                                2.0 * static_cast<double>(problem.rank) * problem.kv_width());
  const int threads = cpu_blocked_threads(fmas, cpu_threads_available());
  const bool half = problem.dtype != DType::kFloat32;
  const bool dot = bf16_dot_takes(problem.dtype);
  const bool split = t <= cpu_blocked_split_tokens(dot) && threads > 1;
  // Scratch kept by the caller's thread (grown to the largest call): the latent [T, R] in float32
  // for bf16 / fp16 or the split; its bf16 copy [T, R] on the AVX512-BF16 path, else the split's
  // widened hidden rows [T, D] for bf16 / fp16.
  float* latent = nullptr;
  float* widened = nullptr;
  uint16_t* latent_bits = nullptr;
  if (half || split) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<uint16_t> scratch_bits;
    const int64_t latent_floats = t * problem.rank;
    const int64_t hidden_floats = split && half && !dot ? t * problem.model_dim : 0;
    try {
      const auto floats = static_cast<size_t>(latent_floats + hidden_floats);
      if (scratch.size() < floats) scratch.resize(floats);
      const auto bits = static_cast<size_t>(dot ? latent_floats : 0);
      if (scratch_bits.size() < bits) scratch_bits.resize(bits);
    } catch (const std::bad_alloc&) {
      return {StatusCode::kUnsupported,
              "cpu-blocked could not allocate its scratch for " + problem.to_string()};
    }
    latent = scratch.data();
    if (dot) latent_bits = scratch_bits.data();
    widened = scratch.data() + latent_floats;
  }

  if (split) {
    SplitWork work{&problem,
                   &args,
                   {},
                   {},
                   latent,
                   latent_bits,
                   cpu_blocked_split_latent_cols(problem.rank, threads),
                   cpu_blocked_split_kv_cols(problem.kv_width(), threads, t)};
    for (int i = 0; i < static_cast<int>(t); ++i) {
      const int64_t x = token_offset(int64_t{i}, problem.seq, args.hidden_stride_batch,
                                     args.hidden_stride_seq);
      if (dot) {
        work.hidden_bits[i] = static_cast<const uint16_t*>(args.hidden) + x;
      } else if (half) {
        to_float(static_cast<const uint16_t*>(args.hidden) + x, problem.dtype, problem.model_dim,
                 widened + i * problem.model_dim);
        work.hidden_rows[i] = widened + i * problem.model_dim;
      } else {
        work.hidden_rows[i] = static_cast<const float*>(args.hidden) + x;
      }
    }
    switch (problem.dtype) {
      case DType::kFloat32: run_split<float>(work, threads); break;
      case DType::kBFloat16: run_split<Bf16>(work, threads); break;
      case DType::kFloat16: run_split<Fp16>(work, threads); break;
    }
    return Status::Ok();
  }
  const int64_t tile_tokens = cpu_blocked_tile_tokens(t, threads);
  const TileWork work{&problem, &args, tile_tokens, latent, latent_bits};
  parallel_items((t + tile_tokens - 1) / tile_tokens, threads, run_tile_item, &work);
  return Status::Ok();
}

}  // namespace latentkv::detail
