// The MLA KV path's cases in latentkv-bench (mla.h): what a case's inputs are (mla_reference's
// random inputs plus a paged cache with shuffled pages, as engines allocate it), its tensors as one
// list both targets lay out, the float64 check of every output on a sample of tokens, the target
// interface (host or device buffers, the unfused baseline, timing) and the driver. The steps are
// the projection's (run_case): random inputs, the fused call checked on NaN-poisoned outputs, the
// baseline checked the same way (its error per output sets the bf16/fp16 tolerance), both timed on
// the same inputs in the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_case.h"
#include "cuda_target.h"
#include "mla_reference.h"

namespace latentkv::bench {

// Slots per page of the paged latent cache (FlashMLA's and vLLM's MLA block size).
constexpr int64_t kMlaPageSlots = 64;

// One case's host inputs: the random MLA inputs and where each token's cache row lives. Each
// sequence gets its own pages, the pages of all sequences in shuffled order, one spare page: slots
// that no token maps stay untouched, and the check sees it.
struct MlaHostInputs {
  testing::MlaInputs in;
  int64_t num_slots = 0;
  std::vector<int64_t> slot_mapping;  // [B, S]
};
MlaHostInputs make_mla_inputs(const MlaProblem& problem, uint64_t seed);

// The tensors of one call. The q_a rows and the kv_a rows are one weight [Rq + R + dr, D], q_a
// first (engines' fused_qkv_a_proj), passed as q_a_weight and kv_a_weight = its row Rq.
enum MlaTensorId {
  kMlaHidden,       // [B, S, D]
  kMlaWeightA,      // [Rq + R + dr, D]
  kMlaKvANorm,      // [R]
  kMlaQANorm,       // [Rq]
  kMlaPositions,    // [B, S] int64 (positions form)
  kMlaCosSinCache,  // [max_position, dr] rope_dtype (positions form)
  kMlaCos,          // [B, S, dr] rope_dtype (cos/sin form)
  kMlaSin,          // [B, S, dr] rope_dtype (cos/sin form)
  kMlaSlots,        // [B, S] int64
  kMlaKvB,          // [H * (dn + dv), R]
  kMlaQa,           // [B, S, Rq] out
  kMlaCache,        // [num_slots, R + dr]: out of stage A, in of stage B alone
  kMlaK,            // [B, S, H, dn + dr] out
  kMlaV,            // [B, S, H, dv] out
  kMlaTensors
};

enum class MlaKind { kData, kRope, kIndex };  // the problem's dtype, rope_dtype, int64

struct MlaTensor {
  MlaKind kind = MlaKind::kData;
  bool output = false;   // poisoned with NaN before a checked call
  int64_t count = 0;     // elements; 0: the call does not use it (null pointer)
  std::vector<float> values;      // an input of kData/kRope: its values (rounded to its dtype)
  std::vector<int64_t> indices;   // an input of kIndex
};
int64_t element_bytes(const MlaTensor& tensor, const MlaProblem& problem);

// Every tensor of the case's call: sizes, and the values of the inputs. stage B alone reads c and
// k_pe from the cache, whose unmapped slots hold NaN (a read of one shows in K and V).
std::vector<MlaTensor> mla_tensors(const BenchCase& c, const MlaHostInputs& in);
// The call's arguments with ptr[i] the buffer of tensor i (null where count is 0).
MlaArgs mla_args(const BenchCase& c, const MlaHostInputs& in, void* const* ptr);

// What a call wrote, as float (empty where the stage writes nothing); the cache in full.
struct MlaHostOutputs {
  std::vector<float> q_a, cache, k, v;
};

// The outputs checked, in the order of MlaHostOutputs.
enum MlaOutput { kOutQa, kOutCache, kOutK, kOutV, kMlaOutputs };
const char* mla_output_name(int output);
struct MlaErrors {
  double error[kMlaOutputs] = {kNaN, kNaN, kNaN, kNaN};  // NaN: not an output of this call
};

// The float64 reference of an even sample of tokens (all of them when affordable): each output row
// depends on its own token only, so the sample is an exact check of its rows. Every element of
// q_a, K and V and every mapped cache row must be finite, and every unmapped cache row untouched.
class MlaReferenceCheck {
 public:
  MlaReferenceCheck(const BenchCase& c, const MlaHostInputs& in, double max_flops);
  int64_t checked_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  MlaErrors errors(const MlaHostOutputs& out) const;

 private:
  MlaProblem problem_;
  const MlaHostInputs& in_;
  std::vector<int64_t> tokens_;  // ascending
  testing::MlaOutputs ref_;      // of the sampled tokens, packed
};

// A backend as the MLA driver sees it (the projection's Target, with MlaArgs and four outputs).
class MlaTarget {
 public:
  virtual ~MlaTarget() = default;
  virtual int input_sets() const = 0;
  virtual MlaArgs args(int set) = 0;
  virtual Stream stream() const = 0;
  // NaN into set 0's outputs (the cache too when stage A writes it).
  virtual void poison_outputs() = 0;
  virtual MlaHostOutputs read_outputs() = 0;
  virtual bool has_baseline() const = 0;
  virtual void run_baseline(int set) = 0;
  virtual Status time(const std::function<Status(int set)>& call, PathResult* path) = 0;
  virtual void describe(CaseResult* result) const = 0;
};

// in must outlive the targets.
std::unique_ptr<MlaTarget> make_mla_cpu_target(const BenchCase& c, const MlaHostInputs& in,
                                               const TimingConfig& config);
std::unique_ptr<MlaTarget> make_mla_cuda_target(const BenchCase& c, const MlaHostInputs& in,
                                                const TimingConfig& config, const GpuInfo& info,
                                                Stream stream);

// Checks and times one MLA case on the CPU (gpu null) or in the GPU session.
CaseResult run_mla_case(const BenchCase& c, Backend backend, Strategy strategy,
                        const TimingConfig& config, GpuSession* gpu, const ProgressFn& progress);

}  // namespace latentkv::bench
