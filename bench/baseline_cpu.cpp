// A reasonable single-threaded float32 GEMM (register-blocked, vectorized, no intrinsics)
// used three times, then the stack copy: the fair unfused CPU baseline for the blocked CPU backend.
#include "baseline_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace latentkv::bench {
namespace {

// Eight floats, one AVX register on x86-64-v3 (a GCC/Clang vector extension: the same portable
// source compiles to vmovups/vfmadd231ps without intrinsics).
typedef float Vec8 __attribute__((vector_size(32)));

// A tile of C is 4 rows x 16 columns: the 8 vector accumulators, two vectors of B and a broadcast
// fit in the 16 AVX registers, and each loaded vector of B feeds 4 rows.
constexpr int64_t kTileRows = 4;
constexpr int64_t kTileCols = 16;

inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// c = a @ b, row-major: a [m, k], b [k, n], c [m, n]. Column strips outermost, so a strip of b
// (k x 16) stays in cache while every row tile of a passes over it. A strip narrower than 16 at
// the right edge is first copied, zero-padded, into `edge`, so every tile runs the same full-width
// code without reading past b.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float* c, int64_t ldc, std::vector<float>* edge) {
  for (int64_t j0 = 0; j0 < n; j0 += kTileCols) {
    const int64_t cols = std::min(kTileCols, n - j0);
    const float* strip = b + j0;
    int64_t strip_stride = ldb;
    if (cols < kTileCols) {
      edge->assign(static_cast<size_t>(k * kTileCols), 0.0f);
      for (int64_t p = 0; p < k; ++p) {
        std::memcpy(edge->data() + p * kTileCols, b + p * ldb + j0, sizeof(float) * cols);
      }
      strip = edge->data();
      strip_stride = kTileCols;
    }
    for (int64_t i0 = 0; i0 < m; i0 += kTileRows) {
      const int64_t rows = std::min(kTileRows, m - i0);
      // A bottom-edge tile recomputes its last row in the missing slots and stores only its own.
      const float* a_rows[kTileRows];
      for (int64_t r = 0; r < kTileRows; ++r) a_rows[r] = a + (i0 + std::min(r, rows - 1)) * lda;
      Vec8 acc[kTileRows][2] = {};
      for (int64_t p = 0; p < k; ++p) {
        const Vec8 b0 = load8(strip + p * strip_stride);
        const Vec8 b1 = load8(strip + p * strip_stride + 8);
        for (int64_t r = 0; r < kTileRows; ++r) {
          acc[r][0] += a_rows[r][p] * b0;
          acc[r][1] += a_rows[r][p] * b1;
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(c + (i0 + r) * ldc + j0, acc[r], sizeof(float) * cols);
      }
    }
  }
}

}  // namespace

CpuBaseline::CpuBaseline(const Problem& problem)
    : problem_(problem),
      latent_(static_cast<size_t>(problem.tokens() * problem.rank)),
      k_(static_cast<size_t>(problem.tokens() * problem.kv_width())),
      v_(k_.size()) {}

void CpuBaseline::run(const Args& args) {
  const int64_t t = problem_.tokens(), d = problem_.model_dim, r = problem_.rank;
  const int64_t n = problem_.kv_width();
  const auto* hidden = static_cast<const float*>(args.hidden);
  gemm(t, r, d, hidden, d, static_cast<const float*>(args.w_down), r, latent_.data(), r, &edge_);
  gemm(t, n, r, latent_.data(), r, static_cast<const float*>(args.w_up_k), n, k_.data(), n, &edge_);
  gemm(t, n, r, latent_.data(), r, static_cast<const float*>(args.w_up_v), n, v_.data(), n, &edge_);
  // torch.stack([k, v]): one more pass over both halves.
  auto* out = static_cast<float*>(args.out);
  std::memcpy(out, k_.data(), sizeof(float) * k_.size());
  std::memcpy(out + args.out_stride_kv, v_.data(), sizeof(float) * v_.size());
}

}  // namespace latentkv::bench
