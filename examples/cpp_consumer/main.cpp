// One KV projection on latentkv's CPU backend through the installed package, checked against a
// plain float64 loop: what an engine linking latentkv::latentkv would do first. Exits non-zero
// when the library refuses the call or the result is off.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "latentkv/latentkv.h"

int main() {
  latentkv::Problem p;
  p.batch = 2, p.seq = 5, p.model_dim = 24, p.rank = 8, p.heads = 3, p.head_dim = 4;
  const int64_t t = p.tokens(), d = p.model_dim, r = p.rank, n = p.kv_width();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> hidden(t * d), w_down(d * r), w_up_k(r * n), w_up_v(r * n);  // row-major
  for (auto* v : {&hidden, &w_down, &w_up_k, &w_up_v}) {
    for (float& x : *v) x = u(rng);
  }
  // [2, B, S, H, Dh], NaN so an element the library leaves unwritten fails the check
  std::vector<float> out(2 * t * n, std::numeric_limits<float>::quiet_NaN());
  const latentkv::Args args = latentkv::contiguous_args(p, hidden.data(), w_down.data(),
                                                        w_up_k.data(), w_up_v.data(), out.data());
  latentkv::Options options;
  options.backend = latentkv::Backend::kCpu;
  const latentkv::Status status = latentkv::run(p, args, options);
  if (!status.ok()) {
    std::fprintf(stderr, "latentkv::run refused %s: %s\n", p.to_string().c_str(),
                 status.message().c_str());
    return 1;
  }
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < t; ++i) {
    std::vector<double> latent(r, 0.0);
    for (int64_t k = 0; k < r; ++k) {
      for (int64_t j = 0; j < d; ++j) latent[k] += double(hidden[i * d + j]) * w_down[j * r + k];
    }
    for (int64_t half = 0; half < 2; ++half) {
      const std::vector<float>& w = half == 0 ? w_up_k : w_up_v;
      for (int64_t c = 0; c < n; ++c) {
        double ref = 0;
        for (int64_t k = 0; k < r; ++k) ref += latent[k] * w[k * n + c];
        const double got = out[(half * t + i) * n + c];
        err2 += (got - ref) * (got - ref);  // NaN propagates and fails below
        ref2 += ref * ref;
      }
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("latentkv %s on the cpu backend: relative error %.2e against float64\n",
              p.to_string().c_str(), rel);
  return rel <= 1e-5 ? 0 : 1;
}
