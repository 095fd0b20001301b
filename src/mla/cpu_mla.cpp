// The MLA path's CPU backend (Strategy::kCpuMla): every stage, float32, bfloat16 and float16, the
// library's reference. Float32 accumulation, norm and RoPE in float32, each output rounded once to
// the dtype, c entering stage B rounded (mla.h), as the CUDA strategies compute it.
//
// A call runs in phases, each spread over the CPU backend's thread pool (cpu/thread_pool.h), the
// pool's return the barrier between them:
//   stage A's GEMM       ckv | q_a = hidden @ [kv_a_weight; q_a_weight]^T into a float32 scratch
//                        [T, R + dr (+ Rq)], work items of 64 tokens x 48 weight rows;
//   stage A's epilogue   per token: RMSNorm of c (and q_a), RoPE of k_pe, each rounded to the
//                        dtype in place; the cache row and q_a written;
//   K's k_pe columns     per token, every head (stage B);
//   stage B's GEMM       kv = c @ kv_b_weight^T, written straight into K's first dn columns and V.
// Splitting the weight rows across items, not only the tokens, keeps every thread busy at one
// token (decode). The weights are nn.Linear [out, in], so every product is a dot product along a
// contiguous row. Per 512 columns of the inner dimension, an item copies its hidden (or c) rows
// into a float32 panel (converting bf16 / fp16), reads float32 weight rows in place (bf16 / fp16
// ones converted into a second panel), and register tiles of 4 tokens x 3 weight rows accumulate
// eight lanes of partial sums per pair in ymm registers, summed at the end of the panel in a fixed
// order: results do not depend on the number of threads. A weight row comes from memory once per
// 64 tokens; the token group's rows stay in L1 while the item's weight rows stream from L2. On
// CPUs with AVX512-BF16, bf16 products skip the panels: both rows are read in place by vdpbf16ps
// dot products (cpu/bf16_dot.h; kBoth's c rows, float32 holding bf16 values, copied to bf16 once),
// as torch's own bf16 CPU GEMMs compute (docs/perf.md, cpu-mla: 1.7-2x the widening kernels at
// 16-512 tokens, ~4x at one).
//
// Scratch: the caller's thread keeps the [T, width] stage-A rows and the row tables, each worker
// its panels, grown to the largest call seen and kept (no allocation per call after that).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "cpu/bf16_dot.h"
#include "cpu/elements.h"
#include "cpu/thread_pool.h"
#include "heuristics.h"
#include "mla/mla_backends.h"

namespace latentkv::detail {
namespace {

constexpr int kItemTokens = 64;   // tokens per work item (Mt)
constexpr int kItemRows = 48;     // weight rows per work item (Nt): a multiple of every tile's C
constexpr int64_t kPanel = 512;   // columns of the inner dimension per packed panel (Kc)
constexpr int kEpilogueTokens = 16;
constexpr double kFmasPerThread = kCpuFmasPerThread;  // heuristics.h

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[i][j] = x[i][0:k] . w[j][0:k] for i < kR, j < kC: eight lanes per pair in ymm registers,
// then the lanes and the k % 8 tail summed in a fixed order.
template <int kR, int kC>
inline void dot_tile(const float* const* x, const float* const* w, int64_t k,
                     float (&out)[kR][kC]) {
  __m256 acc[kR][kC];
  for (int i = 0; i < kR; ++i) {
    for (int j = 0; j < kC; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int64_t k8 = k / 8 * 8;
  for (int64_t d = 0; d < k8; d += 8) {
    __m256 wv[kC];
    for (int j = 0; j < kC; ++j) wv[j] = _mm256_loadu_ps(w[j] + d);
    for (int i = 0; i < kR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x[i] + d);
      for (int j = 0; j < kC; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < kR; ++i) {
    for (int j = 0; j < kC; ++j) {
      float tail = 0.0f;
      for (int64_t d = k8; d < k; ++d) tail += x[i][d] * w[j][d];
      out[i][j] = hsum(acc[i][j]) + tail;
    }
  }
}

// One panel's register tiles for token rows [i0, i0 + kR) of the item, every weight row group
// (w holds kItemRows rows, those past nt repeating the last: their sums are dropped), added into
// the item's sums.
template <int kR, int kC>
void panel_rows(const float* const* x, const float* const* w, int i0, int nt, int64_t k,
                bool first, float* sums) {
  static_assert(kItemRows % kC == 0, "a weight row group never crosses the item");
  for (int j0 = 0; j0 < nt; j0 += kC) {
    float out[kR][kC];
    dot_tile<kR, kC>(x + i0, w + j0, k, out);
    for (int i = 0; i < kR; ++i) {
      float* row = sums + (i0 + i) * kItemRows + j0;
      for (int j = 0; j < kC && j0 + j < nt; ++j) row[j] = first ? out[i][j] : row[j] + out[i][j];
    }
  }
}

// One worker's sums and float32 panels (the item's token rows copied or converted, its bf16 /
// fp16 weight rows converted), kept between calls; the panels are sized on the worker's first
// item that needs them (the bf16 dot products read the rows in place).
struct Panels {
  std::vector<float> x, w, sums;
  Panels() : sums(static_cast<size_t>(kItemTokens * kItemRows)) {}
  void size_float_panels() {
    if (!x.empty()) return;
    x.resize(static_cast<size_t>(kItemTokens * kPanel));
    w.resize(static_cast<size_t>(kItemRows * kPanel));
  }
};

Panels& thread_panels() {
  thread_local Panels panels;  // allocated on a thread's first item
  return panels;
}

// The weight side of a GEMM: rows [0, split) of `first`, then rows of `second` (q_a_weight after
// kv_a_weight in stage A).
struct WeightRows {
  const void* first;
  int64_t first_stride;
  int64_t split;
  const void* second;
  int64_t second_stride;
  int64_t eb;  // bytes per element
  const char* row(int64_t n) const {
    return n < split ? static_cast<const char*>(first) + n * first_stride * eb
                     : static_cast<const char*>(second) + (n - split) * second_stride * eb;
  }
};

// out(m, n) = x row m . w row n over k columns, for m < m_count, n < n_count.
struct Gemm {
  int64_t m_count, n_count, k;
  const void* const* x_rows;  // m_count row pointers
  DType x_dtype;
  WeightRows w;
  DType w_dtype;
  int64_t m_items() const { return (m_count + kItemTokens - 1) / kItemTokens; }
  int64_t items() const { return m_items() * ((n_count + kItemRows - 1) / kItemRows); }
};

// Columns [k0, k0 + kc) of row `src` (dtype) as float32: copied (converted) into `panel_row`, or
// the row itself where `in_place` (float32 rows only).
inline const float* panel_row(const void* src, DType dtype, int64_t k0, int64_t kc,
                              float* panel_row, bool in_place) {
  if (in_place && dtype == DType::kFloat32) return static_cast<const float*>(src) + k0;
  to_float(static_cast<const char*>(src) + k0 * element_size(dtype), dtype, kc, panel_row);
  return panel_row;
}

// Item `item` of g (consecutive items share their weight rows, so threads that run them at once
// read those rows from memory once): store(m, n0, values, count) for each of its tokens, values
// the sums of weight rows [n0, n0 + count).
template <class Store>
void gemm_item(const Gemm& g, int64_t item, const Store& store) {
  const int64_t m0 = item % g.m_items() * kItemTokens, n0 = item / g.m_items() * kItemRows;
  const int mt = static_cast<int>(std::min<int64_t>(kItemTokens, g.m_count - m0));
  const int nt = static_cast<int>(std::min<int64_t>(kItemRows, g.n_count - n0));
  Panels& p = thread_panels();
  if (g.x_dtype == DType::kBFloat16 && g.w_dtype == DType::kBFloat16 &&
      bf16_dot_takes(DType::kBFloat16)) {
    // Both operands bf16 on AVX512-BF16: the rows read in place, dot products of pairs (bf16_dot.h).
    const uint16_t* xb[kItemTokens];
    const uint16_t* wb[kItemRows];
    for (int i = 0; i < mt; ++i) xb[i] = static_cast<const uint16_t*>(g.x_rows[m0 + i]);
    for (int j = 0; j < nt; ++j) wb[j] = reinterpret_cast<const uint16_t*>(g.w.row(n0 + j));
    dot_rows_bf16(xb, mt, wb, nt, g.k, false, p.sums.data(), kItemRows);
    for (int i = 0; i < mt; ++i) store(m0 + i, n0, p.sums.data() + i * kItemRows, nt);
    return;
  }
  p.size_float_panels();
  const float* x[kItemTokens];
  const float* w[kItemRows];
  for (int64_t k0 = 0; k0 < g.k; k0 += kPanel) {
    const int64_t kc = std::min(kPanel, g.k - k0);
    for (int i = 0; i < mt; ++i) {
      x[i] = panel_row(g.x_rows[m0 + i], g.x_dtype, k0, kc, p.x.data() + i * kPanel, false);
    }
    for (int j = 0; j < nt; ++j) {
      w[j] = panel_row(g.w.row(n0 + j), g.w_dtype, k0, kc, p.w.data() + j * kPanel, true);
    }
    for (int j = nt; j < kItemRows; ++j) w[j] = w[nt - 1];  // a partial group's dropped rows
    const bool first = k0 == 0;
    float* sums = p.sums.data();
    int i0 = 0;
    for (; i0 + 4 <= mt; i0 += 4) panel_rows<4, 3>(x, w, i0, nt, kc, first, sums);
    switch (mt - i0) {
      case 3: panel_rows<3, 4>(x, w, i0, nt, kc, first, sums); break;
      case 2: panel_rows<2, 6>(x, w, i0, nt, kc, first, sums); break;
      case 1: panel_rows<1, 8>(x, w, i0, nt, kc, first, sums); break;
      default: break;
    }
  }
  for (int i = 0; i < mt; ++i) store(m0 + i, n0, p.sums.data() + i * kItemRows, nt);
}

// Runs every item of g on `threads` threads; false when a worker could not allocate its panels.
template <class Store>
bool run_gemm(const Gemm& g, int threads, const Store& store) {
  std::atomic<bool> failed{false};
  parallel_for(g.items(), threads, [&](int64_t item) {
    try {
      gemm_item(g, item, store);
    } catch (const std::bad_alloc&) {
      failed = true;
    }
  });
  return !failed;
}

// x[0:n] = round(gamma * (x * rsqrt(mean(x^2) + eps))), statistics in float32 as transformers'
// RMSNorm.
void rmsnorm(float* x, const void* gamma, int64_t n, float eps, DType dtype) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  constexpr int64_t kChunk = 64;  // gamma widened a chunk at a time, the products rounded per row
  float g[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t count = std::min(kChunk, n - i0);
    to_float(static_cast<const char*>(gamma) + i0 * element_size(dtype), dtype, count, g);
    for (int64_t i = 0; i < count; ++i) x[i0 + i] = g[i] * (x[i0 + i] * scale);
  }
  round_row(x, n, dtype, nullptr);
}

// One pair of RoPE: inputs (in0, in1) go to outputs (out0, out1) with the outputs' cos and sin.
struct RopePair {
  int64_t in0, in1, out0, out1;
};

RopePair rope_pair(RopeStyle style, int64_t i, int64_t half) {
  switch (style) {
    case RopeStyle::kInterleave: return {2 * i, 2 * i + 1, i, i + half};
    case RopeStyle::kGptJ: return {2 * i, 2 * i + 1, 2 * i, 2 * i + 1};
    case RopeStyle::kNeox: break;
  }
  return {i, i + half, i, i + half};
}

// out[0:dr] = rope(in[0:dr]) for token (b, s), per mla.h, rounded to the dtype; NaN when its
// position is outside the cos/sin cache (nothing read there).
void rope(const MlaProblem& p, const MlaArgs& a, int64_t b, int64_t s, const float* in,
          float* out) {
  const int64_t half = p.rope_dim / 2;
  const DType rd = p.rope_dtype;
  const void* table = nullptr;  // the vLLM form: row[i], row[half + i] for pair i
  int64_t row = 0;              // element offset of the token's row (either form)
  if (a.positions != nullptr) {
    const int64_t pos = a.positions[b * a.positions_stride_batch + s * a.positions_stride_seq];
    if (pos < 0 || pos >= a.max_position) {
      std::fill(out, out + p.rope_dim, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    table = a.cos_sin_cache;
    row = pos * a.cos_sin_cache_stride_row;
  } else {
    row = b * a.cos_stride_batch + s * a.cos_stride_seq;  // transformers' form: per column
  }
  for (int64_t i = 0; i < half; ++i) {
    const RopePair q = rope_pair(p.rope_style, i, half);
    float c0, s0, c1, s1;
    if (table != nullptr) {
      c0 = c1 = load_element(table, row + i, rd);
      s0 = s1 = load_element(table, row + half + i, rd);
    } else if (p.rope_style == RopeStyle::kGptJ) {
      c0 = c1 = load_element(a.cos, row + i, rd);
      s0 = s1 = load_element(a.sin, row + i, rd);
    } else {
      c0 = load_element(a.cos, row + q.out0, rd);
      s0 = load_element(a.sin, row + q.out0, rd);
      c1 = load_element(a.cos, row + q.out1, rd);
      s1 = load_element(a.sin, row + q.out1, rd);
    }
    // Fused multiply-adds written out, as the CUDA kernels compute them (mla_rope.h): the same
    // bits whatever contraction the compiler would choose for a * b + c * d.
    const float x0 = in[q.in0], x1 = in[q.in1];
    out[q.out0] = round_to(std::fma(x0, c0, -x1 * s0), p.dtype);
    out[q.out1] = round_to(std::fma(x1, c1, x0 * s1), p.dtype);
  }
}

// The cache row token (b, s) maps to, or -1 for none (padding, or a slot past the cache).
int64_t cache_slot(const MlaArgs& a, int64_t b, int64_t s, int64_t t) {
  if (a.slot_mapping == nullptr) return t;
  const int64_t slot =
      a.slot_mapping[b * a.slot_mapping_stride_batch + s * a.slot_mapping_stride_seq];
  return slot >= 0 && slot < a.num_slots ? slot : -1;
}

// The caller's scratch, kept between calls.
struct CallScratch {
  std::vector<float> rows;              // [T, R + dr (+ Rq) + dr]: stage A's sums, then outputs
  std::vector<const void*> x_rows;      // the GEMM's input rows
  std::vector<const void*> pe_rows;     // stage B: each row's k_pe (pe_dtype)
  std::vector<int64_t> tokens;          // stage B: each row's token
  std::vector<uint16_t> c_bf16;         // stage B of kBoth on the bf16 dot products: c [T, R]
  std::vector<unsigned char> k_pe;      // stage B of kBoth: k_pe rows [T, dr] in the dtype
};

CallScratch& call_scratch() {
  thread_local CallScratch scratch;
  return scratch;
}

template <class T>
void grow(std::vector<T>* v, int64_t n) {
  if (static_cast<int64_t>(v->size()) < n) v->resize(static_cast<size_t>(n));
}

struct Call {
  const MlaProblem& p;
  const MlaArgs& a;
  int threads;
  int64_t eb;
  // (b, s) of token t
  int64_t batch_of(int64_t t) const { return t / p.seq; }
  int64_t seq_of(int64_t t) const { return t % p.seq; }
};

// Stage A: the GEMM into rows [T, width] (each row `stride` floats: dr more, for RoPE's output),
// then each token's norms, RoPE and cache row; the normalized c and the rotated k_pe stay in rows
// (rounded to the dtype) for stage B.
bool stage_a(const Call& c, CallScratch* s, int64_t width, int64_t stride) {
  const MlaProblem& p = c.p;
  const MlaArgs& a = c.a;
  const int64_t T = p.tokens(), cw = p.cache_width();
  const bool want_q = width > cw;
  for (int64_t t = 0; t < T; ++t) {
    s->x_rows[t] = static_cast<const char*>(a.hidden) +
                   (c.batch_of(t) * a.hidden_stride_batch + c.seq_of(t) * a.hidden_stride_seq) * c.eb;
  }
  const Gemm g{T, width, p.model_dim, s->x_rows.data(), p.dtype,
               WeightRows{a.kv_a_weight, a.kv_a_weight_stride_row, cw, a.q_a_weight,
                          a.q_a_weight_stride_row, c.eb},
               p.dtype};
  float* rows = s->rows.data();
  const auto store = [&](int64_t m, int64_t n0, const float* values, int count) {
    std::copy(values, values + count, rows + m * stride + n0);
  };
  if (!run_gemm(g, c.threads, store)) {
    return false;
  }
  const int64_t epilogue_items = (T + kEpilogueTokens - 1) / kEpilogueTokens;
  parallel_for(epilogue_items, c.threads, [&](int64_t item) {
    for (int64_t t = item * kEpilogueTokens; t < std::min(T, (item + 1) * kEpilogueTokens); ++t) {
      const int64_t b = c.batch_of(t), sq = c.seq_of(t);
      float* row = rows + t * stride;
      float* rotated = row + width;
      rmsnorm(row, a.kv_a_norm_weight, p.kv_rank, p.eps, p.dtype);
      rope(p, a, b, sq, row + p.kv_rank, rotated);
      std::copy(rotated, rotated + p.rope_dim, row + p.kv_rank);
      if (want_q) {
        float* q = row + cw;
        rmsnorm(q, a.q_a_norm_weight, p.q_rank, p.eps, p.dtype);
        const int64_t base = b * a.q_a_stride_batch + sq * a.q_a_stride_seq;
        store_elements(a.q_a, base, p.dtype, q, p.q_rank);
      }
      if (a.kv_cache != nullptr) {
        const int64_t slot = cache_slot(a, b, sq, t);
        if (slot >= 0) {
          const int64_t base = slot * a.kv_cache_stride_slot;
          store_elements(a.kv_cache, base, p.dtype, row, cw);
        }
      }
    }
  });
  return true;
}

// Token (b, s)'s K and V rows, every head, as zeros: stage B's output for a token whose slot has
// no cache row.
void write_zero_rows(const MlaProblem& p, const MlaArgs& a, int64_t b, int64_t s, int64_t eb) {
  char* k = static_cast<char*>(a.k) + (b * a.k_stride_batch + s * a.k_stride_seq) * eb;
  char* v = static_cast<char*>(a.v) + (b * a.v_stride_batch + s * a.v_stride_seq) * eb;
  for (int64_t h = 0; h < p.heads; ++h) {
    std::memset(k + h * a.k_stride_head * eb, 0, static_cast<size_t>(p.k_width() * eb));
    std::memset(v + h * a.v_stride_head * eb, 0, static_cast<size_t>(p.v_dim * eb));
  }
}

// Stage B: K's k_pe columns, then the GEMM into K's first dn columns and V. Its rows are stage A's
// (kBoth: float32 rows, already rounded), the latent and k_pe inputs, or the cache rows by slot.
bool stage_b(const Call& c, CallScratch* s, int64_t stride) {
  const MlaProblem& p = c.p;
  const MlaArgs& a = c.a;
  const int64_t T = p.tokens();
  DType x_dtype = p.dtype;
  int64_t m = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = c.batch_of(t), sq = c.seq_of(t);
    const void* x = nullptr;
    const void* pe = nullptr;
    if (p.stage == MlaStage::kBoth) {
      x = s->rows.data() + t * stride;
      pe = s->rows.data() + t * stride + p.kv_rank;
      x_dtype = DType::kFloat32;
    } else if (a.latent != nullptr) {
      x = static_cast<const char*>(a.latent) +
          (b * a.latent_stride_batch + sq * a.latent_stride_seq) * c.eb;
      pe = static_cast<const char*>(a.k_pe) +
           (b * a.k_pe_stride_batch + sq * a.k_pe_stride_seq) * c.eb;
    } else {
      const int64_t slot = cache_slot(a, b, sq, t);
      if (slot < 0) {  // nothing read; K and V rows written as zeros (mla.h)
        write_zero_rows(p, a, b, sq, c.eb);
        continue;
      }
      x = static_cast<const char*>(a.kv_cache) + slot * a.kv_cache_stride_slot * c.eb;
      pe = static_cast<const char*>(x) + p.kv_rank * c.eb;
    }
    s->x_rows[m] = x;
    s->pe_rows[m] = pe;
    s->tokens[m++] = t;
  }
  if (m == 0) return true;
  const int64_t head_width = p.nope_dim + p.v_dim;
  const int64_t* tokens = s->tokens.data();
  const auto k_row = [&](int64_t t) {
    return c.batch_of(t) * a.k_stride_batch + c.seq_of(t) * a.k_stride_seq;
  };
  const auto v_row = [&](int64_t t) {
    return c.batch_of(t) * a.v_stride_batch + c.seq_of(t) * a.v_stride_seq;
  };
  const DType pe_dtype = x_dtype;
  // kBoth's c rows hold bf16 values (stage A rounded them): for the bf16 dot products they are
  // copied to bf16 (exactly) in the same pass over the rows as K's k_pe columns.
  uint16_t* c_bf16 =
      x_dtype == DType::kFloat32 && bf16_dot_takes(p.dtype) ? s->c_bf16.data() : nullptr;
  // K's k_pe columns: the row in the dtype (rounded once where it is stage A's float32 row),
  // then copied into every head.
  const int64_t pe_bytes = p.rope_dim * c.eb;
  parallel_for((m + kEpilogueTokens - 1) / kEpilogueTokens, c.threads, [&](int64_t item) {
    for (int64_t r = item * kEpilogueTokens; r < std::min(m, (item + 1) * kEpilogueTokens); ++r) {
      const void* pe = s->pe_rows[r];
      if (pe_dtype != p.dtype) {  // stage A's float32 row
        unsigned char* rounded = s->k_pe.data() + r * pe_bytes;
        store_elements(rounded, 0, p.dtype, static_cast<const float*>(pe), p.rope_dim);
        pe = rounded;
      }
      char* k_pe_columns = static_cast<char*>(a.k) + (k_row(tokens[r]) + p.nope_dim) * c.eb;
      for (int64_t h = 0; h < p.heads; ++h) {
        std::memcpy(k_pe_columns + h * a.k_stride_head * c.eb, pe, static_cast<size_t>(pe_bytes));
      }
      if (c_bf16 != nullptr) {
        store_elements(c_bf16, r * p.kv_rank, DType::kBFloat16,
                       static_cast<const float*>(s->x_rows[r]), p.kv_rank);
        s->x_rows[r] = c_bf16 + r * p.kv_rank;
      }
    }
  });
  if (c_bf16 != nullptr) x_dtype = DType::kBFloat16;
  const Gemm g{m, p.kv_b_rows(), p.kv_rank, s->x_rows.data(), x_dtype,
               WeightRows{a.kv_b_weight, a.kv_b_weight_stride_row, p.kv_b_rows(), nullptr, 0,
                          c.eb},
               p.dtype};
  // Weight row n is head n / (dn + dv)'s column e = n % (dn + dv): K's e < dn, else V's e - dn.
  return run_gemm(g, c.threads, [&](int64_t r, int64_t n0, const float* values, int count) {
    const int64_t k0 = k_row(tokens[r]), v0 = v_row(tokens[r]);
    int64_t h = n0 / head_width, e = n0 % head_width;
    for (int j = 0; j < count;) {
      const bool in_k = e < p.nope_dim;
      const int64_t run = std::min<int64_t>(count - j, (in_k ? p.nope_dim : head_width) - e);
      void* out = in_k ? a.k : a.v;
      const int64_t at = in_k ? k0 + h * a.k_stride_head + e
                              : v0 + h * a.v_stride_head + (e - p.nope_dim);
      store_elements(out, at, p.dtype, values + j, run);
      j += static_cast<int>(run);
      e += run;
      if (e == head_width) {
        e = 0;
        ++h;
      }
    }
  });
}

}  // namespace

Status mla_cpu_takes(const MlaProblem&, const MlaArgs&) { return Status::Ok(); }

Status run_mla_cpu(const MlaProblem& p, const MlaArgs& a) {
  const int64_t T = p.tokens();
  const bool want_q = p.stage != MlaStage::kSecond && p.q_rank > 0 && a.q_a != nullptr;
  const int64_t width = p.cache_width() + (want_q ? p.q_rank : 0);
  const int64_t stride = width + p.rope_dim;
  double fmas_per_token = 0.0;
  if (p.stage != MlaStage::kSecond) fmas_per_token += static_cast<double>(p.model_dim) * width;
  if (p.stage != MlaStage::kFirst) fmas_per_token += static_cast<double>(p.kv_rank) * p.kv_b_rows();
  const double fmas = fmas_per_token * static_cast<double>(T);
  const int threads =
      fmas < 2 * kFmasPerThread
          ? 1
          : static_cast<int>(std::min<double>(cpu_threads_available(), fmas / kFmasPerThread));
  const Call call{p, a, threads, element_size(p.dtype)};
  bool ok = true;
  try {
    CallScratch& s = call_scratch();
    if (p.stage != MlaStage::kSecond) grow(&s.rows, T * stride);
    grow(&s.x_rows, T);
    grow(&s.pe_rows, T);
    grow(&s.tokens, T);
    if (p.stage == MlaStage::kBoth && bf16_dot_takes(p.dtype)) grow(&s.c_bf16, T * p.kv_rank);
    if (p.stage == MlaStage::kBoth) grow(&s.k_pe, T * p.rope_dim * call.eb);
    if (p.stage != MlaStage::kSecond) ok = stage_a(call, &s, width, stride);
    if (ok && p.stage != MlaStage::kFirst) ok = stage_b(call, &s, stride);
  } catch (const std::bad_alloc&) {
    ok = false;
  }
  if (!ok) {
    return {StatusCode::kUnsupported, "cpu-mla could not allocate its scratch for " + p.to_string()};
  }
  return Status::Ok();
}

}  // namespace latentkv::detail
