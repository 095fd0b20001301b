// Accuracy check of a full output against the float64 reference. Each output row depends on its
// own token only, so the reference can be computed on a subset of tokens and still check those
// rows exactly; large cases (DeepSeek-V3 prefill is 167 GFLOP) are checked on an even sample of
// tokens instead of paying minutes of float64 on one core. Every element of the whole output must
// still be finite, so an unwritten (NaN-poisoned) element anywhere fails.
#pragma once

#include <cstdint>
#include <vector>

#include "latentkv/latentkv.h"
#include "testing.h"

namespace latentkv::bench {

// Work allowed for the float64 reference of one case (single-threaded, about 1 GFLOP/s): all
// tokens of the small cases, an even sample of the large ones.
constexpr double kReferenceFlops = 1e9;

// The tokens a float64 check covers: all t_all when their reference fits in max_flops (token_flops
// each), else an even sample of at least 16, first and last included, ascending.
std::vector<int64_t> sample_tokens(int64_t t_all, double token_flops, double max_flops);

class ReferenceCheck {
 public:
  // max_flops bounds the work of the float64 reference; all tokens are checked when they fit.
  ReferenceCheck(const Problem& problem, const testing::HostInputs& inputs, double max_flops);

  int64_t checked_tokens() const { return static_cast<int64_t>(tokens_.size()); }

  // ||out - ref|| / ||ref|| over the checked rows of a packed [2, B, S, H, Dh] output; +inf when
  // any element of the whole output is NaN or Inf.
  double error(const std::vector<float>& out) const;

 private:
  Problem problem_;
  std::vector<int64_t> tokens_;  // token indices t = b * S + s, ascending
  std::vector<double> ref_;      // [2, tokens, N]
};

// Tolerance of the fused result: the stated float32 bound, or for bf16/fp16 twice the error of
// the unfused baseline of the same precision on the same inputs (NaN when that is unknown).
double fused_tolerance(DType dtype, double baseline_error);

}  // namespace latentkv::bench
