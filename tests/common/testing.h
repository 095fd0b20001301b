// Shared by the tests and latentkv-bench: the float64 reference, random inputs, the error metric
// and strided-layout helpers. The case lists (derived from the kernels' tile sizes) are in
// cases.h, included here, so both exercise the same shapes.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cases.h"
#include "latentkv/latentkv.h"

namespace latentkv {
// GoogleTest prints test parameters with these (found by argument-dependent lookup).
inline void PrintTo(const Problem& problem, std::ostream* os) { *os << problem.to_string(); }
inline void PrintTo(DType dtype, std::ostream* os) { *os << to_string(dtype); }
inline void PrintTo(Strategy strategy, std::ostream* os) { *os << to_string(strategy); }
}  // namespace latentkv

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

// Tolerances of a problem's out and latent against the float64 reference (reference_kv_proj's
// out_ref and latent_ref): float32 kFloat32Tolerance; bf16 / fp16 2x the error of the unfused
// computation in that dtype (the latent and each output rounded to it, sums exact: what eager
// PyTorch does) against the same reference, and at least kFloat32Tolerance (tiny shapes whose
// unfused result happens to round exactly).
struct Tolerances {
  double out = kFloat32Tolerance;
  double latent = kFloat32Tolerance;
};
Tolerances unfused_tolerances(const Problem& problem, const HostInputs& in,
                              const std::vector<double>& out_ref,
                              const std::vector<double>& latent_ref);

// The shape as an identifier, "B4_S96_D256_R48_H4_Dh32" (test names).
std::string problem_id(const Problem& problem);

// value rounded to the nearest value of dtype (round to nearest even); float32 values unchanged.
float round_to_dtype(float value, DType dtype);

// float values (already rounded to dtype; NaN stays NaN) as the dtype's bytes, and back (the CUDA
// toolkit's host conversions).
std::vector<unsigned char> to_bytes(const std::vector<float>& values, DType dtype);
std::vector<float> from_bytes(const std::vector<unsigned char>& bytes, DType dtype);

// Strided layouts, so tests cover padded (non-contiguous) tensors.
enum class Tensor { kHidden, kWDown, kWUpK, kWUpV, kOut, kLatent };

// Strides that pad every outer dimension of every tensor by `pad` extra elements (inner dimensions
// stay contiguous); pointers null. pad = 0 gives contiguous_args' strides.
Args padded_args(const Problem& problem, int64_t pad);
// Element offset under args' strides of each element of `tensor`, in packed row-major order
// (out: [2, B, S, H, Dh], latent: [B, S, R]).
std::vector<int64_t> element_offsets(const Problem& problem, const Args& args, Tensor tensor);
// Elements a buffer must hold for `tensor` under args' strides (its largest offset + 1).
int64_t span_elements(const Problem& problem, const Args& args, Tensor tensor);
// A buffer of `span` elements filled with `fill`, holding packed[i] at offsets[i].
std::vector<float> scatter(const std::vector<float>& packed, const std::vector<int64_t>& offsets,
                           int64_t span, float fill);
// base[offsets[i]] for every i: a strided tensor read back in packed order.
std::vector<float> gather(const float* base, const std::vector<int64_t>& offsets);

// Host buffers of one call laid out under some strides: the inputs in place, the outputs and every
// padding element NaN (a read of padding or an unwritten output then shows as a non-finite
// error). args points into the vectors, so the struct moves but does not copy.
struct StridedBuffers {
  std::vector<float> hidden, w_down, w_up_k, w_up_v, out, latent;  // latent empty without it
  std::vector<int64_t> out_offsets;     // out's elements in packed [2, B, S, H, Dh] order
  std::vector<int64_t> latent_offsets;  // latent's elements in packed [B, S, R] order
  Args args;

  StridedBuffers() = default;
  StridedBuffers(StridedBuffers&&) = default;
  StridedBuffers& operator=(StridedBuffers&&) = default;
  StridedBuffers(const StridedBuffers&) = delete;
  StridedBuffers& operator=(const StridedBuffers&) = delete;
};
StridedBuffers strided_buffers(const Problem& problem, const HostInputs& in, const Args& strides,
                               bool with_latent);
// Elements of buffer that are not NaN: after a correct run on a NaN-poisoned buffer, exactly the
// tensor's own elements (so a larger count means padding was written).
int64_t count_not_nan(const std::vector<float>& buffer);

}  // namespace latentkv::testing
