// A problem with a zero dimension on the CPU (float32): what the unfused matmuls give. An empty
// sum is 0, so out is zeros where R or D is 0 and the latent zeros where D is 0; where only
// N = H * Dh is 0 the latent is still hidden @ w_down; where T is 0 there is nothing to write.
// Rare and small-or-empty by construction, so plain loops.
#include <cstdint>

#include "backends.h"

namespace latentkv::detail {

Status run_cpu_zero_size(const Problem& p, const Args& a) {
  const int64_t tokens = p.tokens(), n = p.kv_width();
  const float* hidden = static_cast<const float*>(a.hidden);  // [B, S, D]
  const float* w_down = static_cast<const float*>(a.w_down);  // [D, R]
  float* out = static_cast<float*>(a.out);                    // [2, B, S, H, Dh]
  float* latent = static_cast<float*>(a.latent);              // [B, S, R] or null
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t b = t / p.seq, s = t % p.seq;
    if (latent != nullptr) {
      float* row = latent + b * a.latent_stride_batch + s * a.latent_stride_seq;
      const float* x = hidden + b * a.hidden_stride_batch + s * a.hidden_stride_seq;
      for (int64_t r = 0; r < p.rank; ++r) {
        double sum = 0.0;
        for (int64_t d = 0; d < p.model_dim; ++d) {
          sum += double{x[d]} * w_down[d * a.w_down_stride_row + r];
        }
        row[r] = static_cast<float>(sum);
      }
    }
    if (n == 0) continue;
    for (int64_t kv = 0; kv < 2; ++kv) {
      float* row = out + kv * a.out_stride_kv + b * a.out_stride_batch + s * a.out_stride_seq;
      for (int64_t h = 0; h < p.heads; ++h) {
        for (int64_t e = 0; e < p.head_dim; ++e) row[h * a.out_stride_head + e] = 0.f;
      }
    }
  }
  return Status::Ok();
}

}  // namespace latentkv::detail
