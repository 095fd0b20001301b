// The MLA path's CPU backend (Strategy::kCpuMla): float32, every stage, the library's reference.
//
// Work goes by tiles of kTileTokens tokens. Stage A's GEMM writes the tile's [c | k_pe] rows (and
// q_a's) into a per-thread scratch tile; RMSNorm and RoPE run on those rows in place; the rows go
// to the cache and stay in the scratch for stage B, whose GEMM writes K's first dn columns and V
// straight into their places (K's last dr columns get k_pe). No K- or V-sized temporary.
//
// The weights are nn.Linear [out, in], so every product is a dot product along a contiguous row:
// a register tile of kTileRows tokens x kTileCols weight rows accumulates eight lanes of partial
// sums per pair (GCC vector types, so the accumulators stay in ymm registers), summed at the end
// in a fixed order. Tiles are independent; threads take them when the call is big enough to pay
// for starting them.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include "mla/mla_backends.h"

namespace latentkv::detail {
namespace {

constexpr int kTileRows = 4;      // token rows per register tile
constexpr int kTileCols = 2;      // weight rows per register tile: 8 accumulators + 6 loads
constexpr int kTileTokens = 16;   // tokens per work item: a weight row pair serves 4 register tiles
constexpr double kFmasPerThread = 4e6;  // below this, starting a thread costs more than it saves
constexpr unsigned kMaxThreads = 32;
static_assert(kTileTokens % kTileRows == 0, "a work item is a whole number of register tiles");

typedef float Vec8 __attribute__((vector_size(32)));

inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float sum8(Vec8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// out[i][j] = x[i][0:k] . w[j][0:k] for i < kTileRows, j < kTileCols.
void dot_tile(const float* const* x, const float* const* w, int64_t k,
              float (&out)[kTileRows][kTileCols]) {
  Vec8 acc[kTileRows][kTileCols] = {};
  int64_t d = 0;
  for (; d + 8 <= k; d += 8) {
    Vec8 wv[kTileCols];
    for (int j = 0; j < kTileCols; ++j) wv[j] = load8(w[j] + d);
    for (int i = 0; i < kTileRows; ++i) {
      const Vec8 xv = load8(x[i] + d);
      for (int j = 0; j < kTileCols; ++j) acc[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < kTileRows; ++i) {
    for (int j = 0; j < kTileCols; ++j) {
      float tail = 0.0f;
      for (int64_t e = d; e < k; ++e) tail += x[i][e] * w[j][e];
      out[i][j] = sum8(acc[i][j]) + tail;
    }
  }
}

// store(i, j, x[i] . w[j]) for i < rows (<= kTileTokens), j < n, w's rows ldw apart. A partial
// register tile repeats its last row or column (computed, not stored).
template <class Store>
void gemm_nt(const float* const* x, int rows, const float* w, int64_t ldw, int64_t n, int64_t k,
             Store&& store) {
  for (int64_t j0 = 0; j0 < n; j0 += kTileCols) {
    const float* wr[kTileCols];
    for (int j = 0; j < kTileCols; ++j) wr[j] = w + std::min<int64_t>(j0 + j, n - 1) * ldw;
    for (int i0 = 0; i0 < rows; i0 += kTileRows) {
      const float* xr[kTileRows];
      for (int i = 0; i < kTileRows; ++i) xr[i] = x[std::min(i0 + i, rows - 1)];
      float out[kTileRows][kTileCols];
      dot_tile(xr, wr, k, out);
      for (int i = 0; i < kTileRows && i0 + i < rows; ++i) {
        for (int j = 0; j < kTileCols && j0 + j < n; ++j) store(i0 + i, j0 + j, out[i][j]);
      }
    }
  }
}

// x[0:n] = gamma * (x * rsqrt(mean(x^2) + eps)), statistics in float32 as transformers' RMSNorm.
void rmsnorm(float* x, const float* gamma, int64_t n, float eps) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = gamma[i] * (x[i] * scale);
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

// out[0:dr] = rope(in[0:dr]) for token (b, s), per mla.h; NaN when its position is outside the
// cos/sin cache (nothing read there).
void rope(const MlaProblem& p, const MlaArgs& a, int64_t b, int64_t s, const float* in,
          float* out) {
  const int64_t half = p.rope_dim / 2;
  const float* cos_row = nullptr;  // the vLLM form: cos_row[i], cos_row[half + i] for pair i
  const float* cos = nullptr;      // transformers' form: per output column
  const float* sin = nullptr;
  if (a.positions != nullptr) {
    const int64_t pos = a.positions[b * a.positions_stride_batch + s * a.positions_stride_seq];
    if (pos < 0 || pos >= a.max_position) {
      std::fill(out, out + p.rope_dim, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    cos_row = static_cast<const float*>(a.cos_sin_cache) + pos * a.cos_sin_cache_stride_row;
  } else {
    const int64_t offset = b * a.cos_stride_batch + s * a.cos_stride_seq;
    cos = static_cast<const float*>(a.cos) + offset;
    sin = static_cast<const float*>(a.sin) + offset;
  }
  for (int64_t i = 0; i < half; ++i) {
    const RopePair q = rope_pair(p.rope_style, i, half);
    float c0, s0, c1, s1;
    if (cos_row != nullptr) {
      c0 = c1 = cos_row[i];
      s0 = s1 = cos_row[half + i];
    } else if (p.rope_style == RopeStyle::kGptJ) {
      c0 = c1 = cos[i];
      s0 = s1 = sin[i];
    } else {
      c0 = cos[q.out0];
      s0 = sin[q.out0];
      c1 = cos[q.out1];
      s1 = sin[q.out1];
    }
    const float x0 = in[q.in0], x1 = in[q.in1];
    out[q.out0] = x0 * c0 - x1 * s0;
    out[q.out1] = x1 * c1 + x0 * s1;
  }
}

// The cache row token (b, s) maps to, or -1 for none (padding, or a slot past the cache).
int64_t cache_slot(const MlaArgs& a, int64_t b, int64_t s, int64_t t) {
  if (a.slot_mapping == nullptr) return t;
  const int64_t slot =
      a.slot_mapping[b * a.slot_mapping_stride_batch + s * a.slot_mapping_stride_seq];
  return slot >= 0 && slot < a.num_slots ? slot : -1;
}

// Token (b, s)'s K and V rows, every head, as zeros: stage B's output for a token whose slot has
// no cache row.
void write_zero_rows(const MlaProblem& p, const MlaArgs& a, int64_t b, int64_t s) {
  float* k = static_cast<float*>(a.k) + b * a.k_stride_batch + s * a.k_stride_seq;
  float* v = static_cast<float*>(a.v) + b * a.v_stride_batch + s * a.v_stride_seq;
  for (int64_t h = 0; h < p.heads; ++h) {
    std::fill(k + h * a.k_stride_head, k + h * a.k_stride_head + p.k_width(), 0.0f);
    std::fill(v + h * a.v_stride_head, v + h * a.v_stride_head + p.v_dim, 0.0f);
  }
}

// One thread's scratch: a tile's [c | k_pe] rows and q_a rows, and RoPE's output row.
struct Scratch {
  std::vector<float> ckv, qa, rotated;
  explicit Scratch(const MlaProblem& p)
      : ckv(static_cast<size_t>(kTileTokens * p.cache_width())),
        qa(static_cast<size_t>(kTileTokens * p.q_rank)),
        rotated(static_cast<size_t>(p.rope_dim)) {}
};

// Tokens [t0, t0 + rows): stage A into the scratch (and the cache, q_a), then stage B.
void run_tile(const MlaProblem& p, const MlaArgs& a, int64_t t0, int rows, Scratch* scratch) {
  const int64_t width = p.cache_width();
  int64_t bs[kTileTokens][2];  // (b, s) of each token
  for (int i = 0; i < rows; ++i) {
    bs[i][0] = (t0 + i) / p.seq;
    bs[i][1] = (t0 + i) % p.seq;
  }
  const float* c_rows[kTileTokens];   // stage B's c rows
  const float* pe_rows[kTileTokens];  // and k_pe rows
  int tokens[kTileTokens];            // tile index of each stage B row
  int b_rows = 0;

  if (p.stage != MlaStage::kSecond) {
    const float* x[kTileTokens];  // hidden rows
    for (int i = 0; i < rows; ++i) {
      x[i] = static_cast<const float*>(a.hidden) + bs[i][0] * a.hidden_stride_batch +
             bs[i][1] * a.hidden_stride_seq;
    }
    float* ckv = scratch->ckv.data();  // [kTileTokens, R + dr]
    gemm_nt(x, rows, static_cast<const float*>(a.kv_a_weight), a.kv_a_weight_stride_row, width,
            p.model_dim, [&](int i, int64_t j, float v) { ckv[i * width + j] = v; });
    const bool want_q = p.q_rank > 0 && a.q_a != nullptr;
    float* qa = scratch->qa.data();  // [kTileTokens, Rq]
    if (want_q) {
      gemm_nt(x, rows, static_cast<const float*>(a.q_a_weight), a.q_a_weight_stride_row,
              p.q_rank, p.model_dim, [&](int i, int64_t j, float v) { qa[i * p.q_rank + j] = v; });
    }
    for (int i = 0; i < rows; ++i) {
      float* row = ckv + i * width;
      rmsnorm(row, static_cast<const float*>(a.kv_a_norm_weight), p.kv_rank, p.eps);
      rope(p, a, bs[i][0], bs[i][1], row + p.kv_rank, scratch->rotated.data());
      std::copy(scratch->rotated.begin(), scratch->rotated.end(), row + p.kv_rank);
      if (want_q) {
        float* q = qa + i * p.q_rank;
        rmsnorm(q, static_cast<const float*>(a.q_a_norm_weight), p.q_rank, p.eps);
        float* dst = static_cast<float*>(a.q_a) + bs[i][0] * a.q_a_stride_batch +
                     bs[i][1] * a.q_a_stride_seq;
        std::copy(q, q + p.q_rank, dst);
      }
      if (a.kv_cache != nullptr) {
        const int64_t slot = cache_slot(a, bs[i][0], bs[i][1], t0 + i);
        if (slot >= 0) {
          std::copy(row, row + width, static_cast<float*>(a.kv_cache) + slot * a.kv_cache_stride_slot);
        }
      }
      c_rows[b_rows] = row;
      pe_rows[b_rows] = row + p.kv_rank;
      tokens[b_rows++] = i;
    }
    if (p.stage == MlaStage::kFirst) return;
  } else {
    for (int i = 0; i < rows; ++i) {
      const float* c = nullptr;
      const float* pe = nullptr;
      if (a.latent != nullptr) {
        c = static_cast<const float*>(a.latent) + bs[i][0] * a.latent_stride_batch +
            bs[i][1] * a.latent_stride_seq;
        pe = static_cast<const float*>(a.k_pe) + bs[i][0] * a.k_pe_stride_batch +
             bs[i][1] * a.k_pe_stride_seq;
      } else {
        const int64_t slot = cache_slot(a, bs[i][0], bs[i][1], t0 + i);
        if (slot < 0) {  // nothing read; K and V rows written as zeros (mla.h)
          write_zero_rows(p, a, bs[i][0], bs[i][1]);
          continue;
        }
        c = static_cast<const float*>(a.kv_cache) + slot * a.kv_cache_stride_slot;
        pe = c + p.kv_rank;
      }
      c_rows[b_rows] = c;
      pe_rows[b_rows] = pe;
      tokens[b_rows++] = i;
    }
    if (b_rows == 0) return;
  }

  float* k = static_cast<float*>(a.k);
  float* v = static_cast<float*>(a.v);
  const int64_t head_width = p.nope_dim + p.v_dim;
  int64_t k_row[kTileTokens], v_row[kTileTokens];  // offsets of each stage B row's token
  for (int r = 0; r < b_rows; ++r) {
    const int64_t* t = bs[tokens[r]];
    k_row[r] = t[0] * a.k_stride_batch + t[1] * a.k_stride_seq;
    v_row[r] = t[0] * a.v_stride_batch + t[1] * a.v_stride_seq;
  }
  gemm_nt(c_rows, b_rows, static_cast<const float*>(a.kv_b_weight), a.kv_b_weight_stride_row,
          p.kv_b_rows(), p.kv_rank, [&](int r, int64_t n, float value) {
            const int64_t h = n / head_width, e = n % head_width;
            if (e < p.nope_dim) {
              k[k_row[r] + h * a.k_stride_head + e] = value;
            } else {
              v[v_row[r] + h * a.v_stride_head + (e - p.nope_dim)] = value;
            }
          });
  for (int r = 0; r < b_rows; ++r) {
    for (int64_t h = 0; h < p.heads; ++h) {
      std::copy(pe_rows[r], pe_rows[r] + p.rope_dim, k + k_row[r] + h * a.k_stride_head + p.nope_dim);
    }
  }
}

}  // namespace

Status mla_cpu_takes(const MlaProblem&, const MlaArgs&) { return Status::Ok(); }

Status run_mla_cpu(const MlaProblem& p, const MlaArgs& a) {
  const int64_t tiles = (p.tokens() + kTileTokens - 1) / kTileTokens;
  double fmas_per_token = 0.0;
  if (p.stage != MlaStage::kSecond) {
    fmas_per_token += static_cast<double>(p.model_dim) * (p.cache_width() + p.q_rank);
  }
  if (p.stage != MlaStage::kFirst) fmas_per_token += static_cast<double>(p.kv_rank) * p.kv_b_rows();
  const double fmas = fmas_per_token * static_cast<double>(p.tokens());
  // Asked once: glibc reads /sys for it on every call (~10 us of syscalls at small shapes).
  static const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const unsigned threads = static_cast<unsigned>(std::min<double>(
      {static_cast<double>(std::min(hardware, kMaxThreads)), static_cast<double>(tiles),
       std::max(1.0, fmas / kFmasPerThread)}));

  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&]() {
    try {
      Scratch scratch(p);
      for (int64_t tile = next++; tile < tiles; tile = next++) {
        const int64_t t0 = tile * kTileTokens;
        const int rows = static_cast<int>(std::min<int64_t>(kTileTokens, p.tokens() - t0));
        run_tile(p, a, t0, rows, &scratch);
      }
    } catch (const std::exception&) {
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads: the calling thread and those started take the tiles
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  if (failed) {
    return {StatusCode::kUnsupported,
            "cpu-mla could not allocate its per-thread scratch for " + p.to_string()};
  }
  return Status::Ok();
}

}  // namespace latentkv::detail
