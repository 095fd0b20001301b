// Shared by the tests and latentkv-bench: the float64 reference, random inputs, the error metric
// and the case lists (derived from the kernels' tile sizes), so both exercise the same shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "latentkv/latentkv.h"

namespace latentkv::testing {

// Host inputs of one problem, densely packed, float32 values (for bf16/fp16 problems the values
// are already rounded to that dtype so the reference sees exactly what the kernel sees).
struct HostInputs {
  std::vector<float> hidden;  // [B, S, D]
  std::vector<float> w_down;  // [D, R]
  std::vector<float> w_up_k;  // [R, N]
  std::vector<float> w_up_v;  // [R, N]
};

// Fresh random inputs: hidden ~ U(-1, 1), weights ~ U(-1, 1) / sqrt(fan_in), so outputs are O(1)
// at every size. Never zeros.
HostInputs random_inputs(const Problem& problem, uint64_t seed);

// float64 reference on packed inputs. out: [2, B, S, H, Dh] packed; latent: [B, S, R] packed (may
// be null).
void reference_kv_proj(const Problem& problem, const HostInputs& in, std::vector<double>* out,
                       std::vector<double>* latent);

// ||got - ref||_F / ||ref||_F; +inf when got holds a NaN or Inf (so an unwritten, NaN-poisoned
// element always fails).
double relative_error(const float* got, const std::vector<double>& ref);

// Tolerance for float32 results: the fp32 path must stay within 1e-5 relative Frobenius error of
// float64 (accumulation over D and R terms in fp32 lands near 1e-7..1e-6 for these sizes).
constexpr double kFloat32Tolerance = 1e-5;

// Named cases (the founding case and the presets of latentkv-bench).
struct NamedCase {
  std::string name;
  Problem problem;
};
std::vector<NamedCase> preset_cases();  // "seed", "deepseek-v2-lite", "deepseek-v3", ...
bool find_preset(const std::string& name, Problem* problem);

// Edge shapes: one token, tile tails (one tile minus one, a tile plus one), odd D/R/Dh, R=1, H=1.
std::vector<Problem> edge_shapes();
// count random shapes, small enough for the float64 reference to be quick.
std::vector<Problem> random_shapes(int count, uint64_t seed);

}  // namespace latentkv::testing
