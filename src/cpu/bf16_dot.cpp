// cpu-blocked's bf16 products on AVX512-BF16 (bf16_dot.h says why and how they round).
//
// A register tile is up to 6 token rows x 64 columns: 24 zmm accumulators of 16 float32 lanes. Per
// pair of k it loads 16 columns of W's rows k and k + 1 for each of its 4 column vectors and
// interleaves them into (w[k][j], w[k+1][j]) pairs (one vpermt2w), broadcasts each row's
// (a[k], a[k+1]) pair, and issues one vdpbf16ps per row and vector: 28 of the 32 zmm registers
// live. An odd k_len ends with a pair whose second half is zero. Column tails use masked loads
// and stores, so nothing outside a row is read or written. The functions carry the ISA as a target
// attribute (not per-file flags), so no inline function of a shared header is compiled here for a
// CPU the rest of the library does not require.
#include "cpu/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "cuda/tile_sizes.h"

#define LATENTKV_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace latentkv::detail {
namespace {

constexpr int kRows = tiles::kCpuRows;  // token rows of a register tile (cpu_blocked.cpp's too)
constexpr int kVecs = 4;   // 16-column vectors of a register tile
constexpr int kCols = 16 * kVecs;
constexpr int kStreamMaxRows = tiles::kCpuStreamDotMaxRows;  // a streamed product's rows
constexpr int64_t kStreamK = tiles::kCpuStreamK;               // w's rows per block there
// Products that read at least this much of w prefetch each 64-column panel's successor as they
// walk it (V2-Lite T=64 bf16 with its weights from memory 1800-2270 -> 1480-1500 us on 2 threads);
// the founding case's small products (<= 24 KB) lost 11% with them (162 -> 181 us).
constexpr int64_t kPrefetchMinBytes = int64_t{64} << 10;

// Lane 2j of the result takes element j of the first operand (row k's column j), lane 2j + 1
// element j of the second (index 32 + j: row k + 1's column j).
alignas(64) constexpr uint16_t kInterleave[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                  37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                  11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

// 16 bf16 elements from p (kFull), or those of mask with zeros elsewhere (nothing else read).
template <bool kFull>
LATENTKV_AVX512_BF16 inline __m256i load_row(const uint16_t* p, __mmask16 mask) {
  if constexpr (kFull) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    return _mm256_maskz_loadu_epi16(mask, p);
  }
}

// (row0[j], row1[j]) pairs for j < 16, as vdpbf16ps reads its operands (one vpermt2w; it reads
// only the low halves of the widened operands, whose upper halves are left undefined).
LATENTKV_AVX512_BF16 inline __m512i pair_rows(__m512i interleave, __m256i row0, __m256i row1) {
  return _mm512_permutex2var_epi16(_mm512_castsi256_si512(row0), interleave,
                                   _mm512_castsi256_si512(row1));
}

// Columns [n0, n0 + cols) (cols <= kCols; kFull: cols == kCols) of rows [0, kR) of the product.
// next_lines (0-2): 64-byte lines of the next tile's columns to prefetch from each of w's rows as
// this tile reads them (only lines inside the product's n columns).
template <int kR, bool kFull>
LATENTKV_AVX512_BF16 void register_tile(const uint16_t* const* a, int64_t k_len,
                                        const uint16_t* w, int64_t ldw, int64_t n0, int cols,
                                        int next_lines, float* const* c, bool accumulate) {
  __mmask16 mask[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    const int left = std::clamp(cols - 16 * v, 0, 16);
    mask[v] = static_cast<__mmask16>((1u << left) - 1u);
  }
  __m512 acc[kR][kVecs];
  for (int i = 0; i < kR; ++i) {
    for (int v = 0; v < kVecs; ++v) {
      const float* src = c[i] + n0 + 16 * v;
      acc[i][v] = !accumulate ? _mm512_setzero_ps()
                  : kFull     ? _mm512_loadu_ps(src)
                              : _mm512_maskz_loadu_ps(mask[v], src);
    }
  }
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const uint16_t* wn = w + n0;
  int64_t k = 0;
  for (; k + 2 <= k_len; k += 2) {
    for (int line = 0; line < next_lines; ++line) {
      const uint16_t* next = wn + k * ldw + kCols + 32 * line;
      _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(next + ldw), _MM_HINT_T0);
    }
    __m512i wk[kVecs];  // (w[k][j], w[k + 1][j]) for the vector's 16 columns j
    for (int v = 0; v < kVecs; ++v) {
      const uint16_t* row = wn + k * ldw + 16 * v;
      wk[v] = pair_rows(interleave, load_row<kFull>(row, mask[v]),
                        load_row<kFull>(row + ldw, mask[v]));
    }
    for (int i = 0; i < kR; ++i) {
      uint32_t pair;  // (a[i][k], a[i][k + 1])
      std::memcpy(&pair, a[i] + k, sizeof pair);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], x, (__m512bh)wk[v]);
    }
  }
  if (k < k_len) {  // the last k of an odd k_len, paired with zeros
    __m512i wk[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      wk[v] = pair_rows(interleave, load_row<kFull>(wn + k * ldw + 16 * v, mask[v]),
                        _mm256_setzero_si256());
    }
    for (int i = 0; i < kR; ++i) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i][k]));
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], x, (__m512bh)wk[v]);
    }
  }
  for (int i = 0; i < kR; ++i) {
    for (int v = 0; v < kVecs; ++v) {
      float* dst = c[i] + n0 + 16 * v;
      if constexpr (kFull) {
        _mm512_storeu_ps(dst, acc[i][v]);
      } else {
        _mm512_mask_storeu_ps(dst, mask[v], acc[i][v]);
      }
    }
  }
}

// prefetch: whether this tile prefetches the next tile's columns (products whose w is large).
template <int kR>
LATENTKV_AVX512_BF16 void tile_columns(const uint16_t* const* a, int64_t k_len, const uint16_t* w,
                                       int64_t ldw, int64_t n0, int64_t n, bool prefetch,
                                       float* const* c, bool accumulate) {
  const int64_t next = prefetch ? n - (n0 + kCols) : 0;  // columns past this tile
  const int next_lines = next > 32 ? 2 : next > 0 ? 1 : 0;
  if (n - n0 >= kCols) {
    register_tile<kR, true>(a, k_len, w, ldw, n0, kCols, next_lines, c, accumulate);
  } else {
    register_tile<kR, false>(a, k_len, w, ldw, n0, static_cast<int>(n - n0), 0, c, accumulate);
  }
}

// Each 64-column panel of w runs every whole group of kRows rows before the next panel (the panel
// comes from memory once and from cache for the other groups, as in cpu_blocked.cpp), then the
// rows left over as one narrower tile. With prefetch every row group prefetches the next panel
// from the rows it reads (the first group alone, or L2 hints instead of L1, gained nothing
// measurable on the development VM; why is not known: a panel of 512 rows is 64 KB, twice L1).
void all_columns(const uint16_t* const* a, int rows, int64_t k_len, const uint16_t* w, int64_t ldw,
                 int64_t n, bool prefetch, float* const* c, bool accumulate) {
  const int whole = rows / kRows * kRows;
  for (int64_t n0 = 0; n0 < n; n0 += kCols) {
    for (int i0 = 0; i0 < whole; i0 += kRows) {
      tile_columns<kRows>(a + i0, k_len, w, ldw, n0, n, prefetch, c + i0, accumulate);
    }
    const uint16_t* const* a_left = a + whole;
    float* const* c_left = c + whole;
    switch (rows - whole) {
      case 1: tile_columns<1>(a_left, k_len, w, ldw, n0, n, prefetch, c_left, accumulate); break;
      case 2: tile_columns<2>(a_left, k_len, w, ldw, n0, n, prefetch, c_left, accumulate); break;
      case 3: tile_columns<3>(a_left, k_len, w, ldw, n0, n, prefetch, c_left, accumulate); break;
      case 4: tile_columns<4>(a_left, k_len, w, ldw, n0, n, prefetch, c_left, accumulate); break;
      case 5: tile_columns<5>(a_left, k_len, w, ldw, n0, n, prefetch, c_left, accumulate); break;
      default: break;
    }
  }
  static_assert(kRows == 6, "the switch above covers 1..kRows-1 leftover rows");
}

// The four accumulators' sums of their 16 lanes, each in one fixed order (halves, quarters,
// pairs, lanes), added into (accumulate) or stored to out[0, cols) (cols <= 4). The first two
// steps take two accumulators' halves (then quarters) in one vector: 13 shuffles and adds where
// four separate reductions take 32, each add the one a single reduction would do (same bits).
// Masked 512-bit forms throughout: _mm512_reduce_add_ps and the 512-to-256-bit casts expand to
// gcc 12 builtins with undefined operands that -Wmaybe-uninitialized reports.
LATENTKV_AVX512_BF16 inline void lane_sums4(__m512 a, __m512 b, __m512 c, __m512 d, int cols,
                                            bool accumulate, float* out) {
  constexpr __mmask16 kAll = 0xFFFF;
  // [a's 8 half sums | b's 8]: lanes 0-7 a.lo + a.hi, 8-15 b.lo + b.hi.
  const __m512 ab = _mm512_add_ps(_mm512_mask_shuffle_f32x4(a, kAll, a, b, 0x44),
                                  _mm512_mask_shuffle_f32x4(a, kAll, a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_mask_shuffle_f32x4(c, kAll, c, d, 0x44),
                                  _mm512_mask_shuffle_f32x4(c, kAll, c, d, 0xEE));
  // 128-bit lane q: accumulator q's 4 quarter sums (its first quarter plus its second).
  __m512 v = _mm512_add_ps(_mm512_mask_shuffle_f32x4(ab, kAll, ab, cd, 0x88),
                           _mm512_mask_shuffle_f32x4(ab, kAll, ab, cd, 0xDD));
  v = _mm512_add_ps(v, _mm512_mask_permute_ps(v, kAll, v, 0x4E));  // 64-bit pairs
  v = _mm512_add_ps(v, _mm512_mask_permute_ps(v, kAll, v, 0xB1));  // lanes
  const __m512i first_lanes = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512 sums = _mm512_mask_permutexvar_ps(v, kAll, first_lanes, v);  // in lanes 0-3
  const __mmask16 mask = static_cast<__mmask16>((1u << std::min(cols, 4)) - 1u);
  const __m512 result =
      accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), sums) : sums;
  _mm512_mask_storeu_ps(out, mask, result);
}

// Rows [0, kR) of a against rows [0, kC) of b (b's pointers past the caller's columns repeat its
// last row; only [0, cols) is stored): per 32 k one zmm of each row and kR x kC vdpbf16ps, the k
// tail by masked loads (nothing past a row is read), then each row's accumulators' lanes summed.
template <int kR, int kC>
LATENTKV_AVX512_BF16 void dot_rows_tile(const uint16_t* const* a, const uint16_t* const* b,
                                        int cols, int64_t k_len, bool accumulate, float* sums,
                                        int64_t ld) {
  static_assert(kC == 4, "lane_sums4 reduces a row's four accumulators");
  __m512 acc[kR][kC];
  for (int i = 0; i < kR; ++i) {
    for (int j = 0; j < kC; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int64_t k32 = k_len / 32 * 32;
  for (int64_t k = 0; k < k32; k += 32) {
    __m512i bv[kC];
    for (int j = 0; j < kC; ++j) bv[j] = _mm512_loadu_si512(b[j] + k);
    for (int i = 0; i < kR; ++i) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a[i] + k);
      for (int j = 0; j < kC; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, (__m512bh)bv[j]);
    }
  }
  if (k32 < k_len) {
    const __mmask32 tail = _cvtu32_mask32((1u << (k_len - k32)) - 1u);
    __m512i bv[kC];
    for (int j = 0; j < kC; ++j) bv[j] = _mm512_maskz_loadu_epi16(tail, b[j] + k32);
    for (int i = 0; i < kR; ++i) {
      const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(tail, a[i] + k32);
      for (int j = 0; j < kC; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, (__m512bh)bv[j]);
    }
  }
  for (int i = 0; i < kR; ++i) {
    lane_sums4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], cols, accumulate, sums + i * ld);
  }
}

}  // namespace

bool bf16_dot_enabled() {
  static const bool enabled = [] {
    const char* isa = std::getenv("LATENTKV_CPU_ISA");
    if (isa != nullptr && std::string_view(isa) == "avx2") return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return enabled;
}

// At most kStreamMaxRows rows (decode: each weight byte used once or twice, so w streams from
// memory), w goes in blocks of kStreamK rows, each block across all n columns, instead of 64-column
// tiles that each walk all of k (128 bytes from every row, far apart): each row's columns are read
// in one sweep, which the hardware prefetchers follow. The blocks start at even k and the
// accumulators pass through c as float32, so the sums and their order are the whole-k tiles':
// same bits.
void gemm_bf16_dot(const uint16_t* const* a, int rows, int64_t k_len, const uint16_t* w,
                   int64_t ldw, int64_t n, float* const* c, bool accumulate) {
  const bool prefetch = k_len * n * int64_t{sizeof(uint16_t)} >= kPrefetchMinBytes;
  if (rows > kStreamMaxRows) {
    all_columns(a, rows, k_len, w, ldw, n, prefetch, c, accumulate);
    return;
  }
  const uint16_t* a_block[kStreamMaxRows] = {};
  for (int64_t k0 = 0; k0 < k_len; k0 += kStreamK) {
    for (int i = 0; i < rows; ++i) a_block[i] = a[i] + k0;
    all_columns(a_block, rows, std::min(kStreamK, k_len - k0), w + k0 * ldw, ldw, n, prefetch, c,
                accumulate || k0 > 0);
  }
}

// Register tiles of 4 rows of a x 4 rows of b (16 zmm accumulators), the last 1-3 rows of a in a
// narrower tile; b's rows in groups of 4 in the inner loop, so a tile's a rows stay in L1.
void dot_rows_bf16(const uint16_t* const* a, int rows, const uint16_t* const* b, int cols,
                   int64_t k_len, bool accumulate, float* sums, int64_t ld) {
  constexpr int kC = 4;
  for (int i0 = 0; i0 < rows; i0 += 4) {
    const int tile_rows = std::min(4, rows - i0);
    for (int j0 = 0; j0 < cols; j0 += kC) {
      const uint16_t* b_tile[kC];
      for (int j = 0; j < kC; ++j) b_tile[j] = b[std::min(j0 + j, cols - 1)];
      float* out = sums + i0 * ld + j0;
      const int n = cols - j0;
      switch (tile_rows) {
        case 4: dot_rows_tile<4, kC>(a + i0, b_tile, n, k_len, accumulate, out, ld); break;
        case 3: dot_rows_tile<3, kC>(a + i0, b_tile, n, k_len, accumulate, out, ld); break;
        case 2: dot_rows_tile<2, kC>(a + i0, b_tile, n, k_len, accumulate, out, ld); break;
        default: dot_rows_tile<1, kC>(a + i0, b_tile, n, k_len, accumulate, out, ld); break;
      }
    }
  }
}

}  // namespace latentkv::detail
