// The float64 reference on all tokens or an even sample of them; see verify.h for why a sample
// is an exact check of the rows it covers.
#include "verify.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace latentkv::bench {
namespace {

// Fewest tokens a sampled check covers, so that tile tails and the first and last rows are in.
constexpr int64_t kMinCheckedTokens = 16;

}  // namespace

std::vector<int64_t> sample_tokens(int64_t t_all, double token_flops, double max_flops) {
  const int64_t affordable = static_cast<int64_t>(max_flops / token_flops);
  const int64_t count = std::min(t_all, std::max(kMinCheckedTokens, affordable));
  // Evenly spread, first and last included; strictly increasing since count <= t_all.
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < count; ++i) {
    tokens.push_back(count == 1 ? 0 : i * (t_all - 1) / (count - 1));
  }
  return tokens;
}

ReferenceCheck::ReferenceCheck(const Problem& problem, const testing::HostInputs& inputs,
                               double max_flops)
    : problem_(problem) {
  const int64_t t_all = problem.tokens();
  Problem one = problem;
  one.batch = 1;
  one.seq = 1;
  tokens_ = sample_tokens(t_all, one.flops(), max_flops);
  const int64_t count = checked_tokens();

  if (count == t_all) {
    testing::reference_kv_proj(problem, inputs, &ref_, nullptr);
    return;
  }
  // The sampled tokens as a problem of their own: batch 1, seq = count, the same weights.
  Problem sub = problem;
  sub.batch = 1;
  sub.seq = count;
  testing::HostInputs picked;
  picked.w_down = inputs.w_down;
  picked.w_up_k = inputs.w_up_k;
  picked.w_up_v = inputs.w_up_v;
  const int64_t d = problem.model_dim;
  picked.hidden.reserve(static_cast<size_t>(count * d));
  for (int64_t t : tokens_) {
    const float* row = inputs.hidden.data() + t * d;
    picked.hidden.insert(picked.hidden.end(), row, row + d);
  }
  testing::reference_kv_proj(sub, picked, &ref_, nullptr);
}

double ReferenceCheck::error(const std::vector<float>& out) const {
  for (float v : out) {
    if (!std::isfinite(v)) return std::numeric_limits<double>::infinity();
  }
  const int64_t t_all = problem_.tokens();
  const int64_t n = problem_.kv_width();
  if (checked_tokens() == t_all) return testing::relative_error(out.data(), ref_);
  std::vector<float> rows;
  rows.reserve(ref_.size());
  for (int64_t kv = 0; kv < 2; ++kv) {
    for (int64_t t : tokens_) {
      const float* row = out.data() + (kv * t_all + t) * n;
      rows.insert(rows.end(), row, row + n);
    }
  }
  return testing::relative_error(rows.data(), ref_);
}

double fused_tolerance(DType dtype, double baseline_error) {
  if (dtype == DType::kFloat32) return testing::kFloat32Tolerance;
  return 2.0 * baseline_error;
}

}  // namespace latentkv::bench
