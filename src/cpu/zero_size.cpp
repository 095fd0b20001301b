// A problem with a zero dimension on the CPU (every dtype): what the unfused matmuls give. An empty
// sum is 0, so out is zeros where R or D is 0 and the latent zeros where D is 0; where only
// N = H * Dh is 0 the latent is still hidden @ w_down, summed in float32 by fused multiply-adds in
// ascending d and rounded once to the dtype: the same arithmetic, so the same bits, as the CUDA
// backend's zero-size kernel (cuda/zero_size.cu). Where T is 0 there is nothing to write. Rare and
// small-or-empty by construction, so plain loops over elements (cpu/elements.h).
#include <cmath>
#include <cstdint>

#include "backends.h"
#include "cpu/elements.h"
#include "cuda/common.h"

namespace latentkv::detail {

Status run_cpu_zero_size(const Problem& p, const Args& a) {
  const int64_t tokens = p.tokens(), n = p.kv_width();
  const DType dt = p.dtype;
  // Element offsets: hidden [B, S, D], w_down [D, R], out [2, B, S, H, Dh], latent [B, S, R].
  for (int64_t t = 0; t < tokens; ++t) {
    if (a.latent != nullptr) {
      const int64_t row = token_offset(t, p.seq, a.latent_stride_batch, a.latent_stride_seq);
      const int64_t x = token_offset(t, p.seq, a.hidden_stride_batch, a.hidden_stride_seq);
      for (int64_t r = 0; r < p.rank; ++r) {
        float sum = 0.f;
        for (int64_t d = 0; d < p.model_dim; ++d) {
          sum = std::fma(load_element(a.hidden, x + d, dt),
                         load_element(a.w_down, d * a.w_down_stride_row + r, dt), sum);
        }
        store_element(a.latent, row + r, dt, sum);
      }
    }
    if (n == 0) continue;
    for (int64_t kv = 0; kv < 2; ++kv) {
      const int64_t row =
          kv * a.out_stride_kv + token_offset(t, p.seq, a.out_stride_batch, a.out_stride_seq);
      for (int64_t h = 0; h < p.heads; ++h) {
        for (int64_t e = 0; e < p.head_dim; ++e) {
          store_element(a.out, row + h * a.out_stride_head + e, dt, 0.f);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace latentkv::detail
