// Shared by the MLA tests (CPU and GPU) and latentkv-bench: random MLA inputs, RoPE tables in both
// forms, a float64 reference of every stage, an emulation of transformers' unfused bf16/fp16
// computation (the error budget of the half-precision kernels: within 2x of its error against the
// same float64 reference), the MLA presets and edge shapes.
//
// Every tensor here is densely packed over its token dimension T = B * S (what the tests scatter
// into strided buffers themselves). Values are float32, already rounded to the problem's dtype
// (rope tables to its rope_dtype), so the reference sees exactly what a kernel sees.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "latentkv/latentkv.h"

namespace latentkv {
inline void PrintTo(const MlaProblem& problem, std::ostream* os) { *os << problem.to_string(); }
}  // namespace latentkv

namespace latentkv::testing {

// Which of the two RoPE forms of MlaArgs a call uses.
enum class RopeForm {
  kPositions,  // vLLM's: positions [T] into cos_sin_cache [max_position, dr]
  kCosSin,     // transformers': cos, sin [T, dr]
};
const char* to_string(RopeForm form);

struct MlaInputs {
  // stage A
  std::vector<float> hidden;            // [T, D]
  std::vector<float> kv_a_weight;       // [R + dr, D]
  std::vector<float> kv_a_norm_weight;  // [R]
  std::vector<float> q_a_weight;        // [Rq, D] (empty when Rq = 0)
  std::vector<float> q_a_norm_weight;   // [Rq]
  // RoPE, both forms of the same angles: token t rotates pair i by angle(positions[t], i), scaled
  // by an attention factor != 1 as YaRN's mscale does (so cos^2 + sin^2 != 1).
  int64_t max_position = 0;
  std::vector<int64_t> positions;     // [T], in [0, max_position)
  std::vector<float> cos_sin_cache;   // [max_position, dr]: dr/2 cosines, then dr/2 sines
  std::vector<float> cos, sin;        // [T, dr], cat(freqs, freqs) as transformers returns them
  // stage B alone: c (normalized) and k_pe (rotated) as stage A would have made them
  std::vector<float> latent;          // [T, R]
  std::vector<float> k_pe;            // [T, dr]
  std::vector<float> kv_b_weight;     // [H * (dn + dv), R]
};

// Fresh random inputs: hidden ~ U(-1, 1), weights ~ U(-1, 1) / sqrt(fan_in), norm weights ~
// U(0.5, 1.5), never zero; positions spread over [0, max_position) (max_position = 2 * T + 3).
MlaInputs random_mla_inputs(const MlaProblem& problem, uint64_t seed);

// What a stage produces, packed: NaN marks what is not produced (k_pe of a position outside the
// cos/sin cache) and empty vectors what the stage does not compute.
struct MlaOutputs {
  std::vector<double> q_a;     // [T, Rq]
  std::vector<double> latent;  // [T, R]: c
  std::vector<double> k_pe;    // [T, dr]
  std::vector<double> k;       // [T, H, dn + dr]
  std::vector<double> v;       // [T, H, dv]
};

// float64 reference of problem.stage: kBoth/kFirst from hidden (RoPE in `form`), kSecond from
// in.latent and in.k_pe. kFirst leaves k and v empty; kSecond leaves q_a, latent and k_pe as the
// inputs it read.
MlaOutputs reference_mla(const MlaProblem& problem, const MlaInputs& in, RopeForm form);

// transformers' DeepseekV3Attention in problem.dtype, unfused, on the same inputs: each GEMM
// accumulated exactly and rounded once to the dtype; RMSNorm statistics in float32 from the
// rounded values, normed.to(dtype) then weight * normed rounded; RoPE as
// apply_rotary_pos_emb_interleave computes it in the dtype (cos/sin cast to the dtype, each
// product and the sum rounded), the same rounding for the other two styles; kv_b's GEMM from the
// rounded c, rounded. For float32 problems it is float32 arithmetic throughout.
MlaOutputs emulate_unfused_mla(const MlaProblem& problem, const MlaInputs& in, RopeForm form);

// ||got - ref||_F / ||ref||_F over the entries where ref is finite; +inf when got and ref disagree
// on which entries are NaN, or got holds an Inf (an unwritten, NaN-poisoned output fails).
double mla_relative_error(const std::vector<float>& got, const std::vector<double>& ref);
double mla_relative_error(const std::vector<double>& got, const std::vector<double>& ref);

// float32 results against float64: accumulations over D and R terms in float32 and the norms'
// float32 statistics land near 1e-7..1e-6 relative for these sizes.
constexpr double kMlaFloat32Tolerance = 1e-5;

// The deinterleave permutation d of dr columns: d[j] = 2j for j < dr/2, 2(j - dr/2) + 1 after.
// With cos/sin equal in both halves (every real table), the three styles relate by it alone:
// interleave(x) == gptj(x)[d] == neox(x[d]), x[d] meaning column j holds x[d[j]].
std::vector<int64_t> deinterleave_permutation(int64_t rope_dim);

// A bf16 MLA problem of the given shape, one token (batch 1, seq 1), interleave RoPE, kBoth.
MlaProblem mla_shape(int64_t d, int64_t q_rank, int64_t r, int64_t dr, int64_t h, int64_t dn,
                     int64_t dv);

// A named shape of the tests' edge tables: B, S and mla_shape's dimensions.
struct MlaEdge {
  const char* name;
  int64_t b, s, d, q_rank, r, dr, h, dn, dv;
};
// mla_shape(d, q_rank, r, dr, h, dn, dv) with batch b and seq s.
MlaProblem mla_edge_problem(const MlaEdge& e);

struct MlaNamedCase {
  std::string name;
  MlaProblem problem;  // batch = seq = 1: callers set the tokens
};
// deepseek-v2-lite-mla, deepseek-v3-mla, kimi-k2-mla.
std::vector<MlaNamedCase> mla_preset_cases();
bool find_mla_preset(const std::string& name, MlaProblem* problem);

// latentkv-bench --sweep-mla-path, bfloat16, interleave RoPE: the MLA issue's whole-path rows
// (DeepSeek-V2-Lite and V3 without q_a, as transformers' KV side runs them; T = 1, 64, 1024, 4096)
// and the first-stage rows of the floor issue (V3 kv only T = 1, 16, 64; V3 q_a + kv T = 1, 16;
// V2-Lite T = 1, 16). Batch 1, seq = T; names "deepseek-v3-mla kv T=64", ... fixed, so numbers
// stay comparable across runs.
std::vector<MlaNamedCase> mla_path_sweep_cases();

// Small shapes covering the edges: T = 1, odd H and R, dr != 64 (32, 16, 2), dn != dv, Rq = 0 and
// > 0, D not a multiple of 8, batch > 1. float32, interleave, kBoth: callers set dtype, stage,
// style.
std::vector<MlaNamedCase> mla_edge_cases();

// "B2_S3_D40_Rq8_R20_dr8_H3_dn6_dv4" (test names).
std::string mla_problem_id(const MlaProblem& problem);

}  // namespace latentkv::testing
