// The CPU target of the MLA cases: the case's tensors as host vectors (float32 cases only: main.cpp
// skips the half types on the CPU, so the values are used as they are), timed warm by wall clock
// like the projection's CPU cases. No unfused CPU baseline: the float32 tolerance does not need
// one, and the baseline that matters for the speedups is the GPU's.
#include <limits>

#include "mla_case.h"

namespace latentkv::bench {
namespace {

class MlaCpuTarget final : public MlaTarget {
 public:
  MlaCpuTarget(const BenchCase& c, const MlaHostInputs& in, const TimingConfig& config)
      : case_(c), in_(in), config_(config), tensors_(mla_tensors(c, in)) {
    for (MlaTensor& t : tensors_) {
      if (t.output) t.values.assign(static_cast<size_t>(t.count), 0.0f);
    }
    for (int i = 0; i < kMlaTensors; ++i) {
      MlaTensor& t = tensors_[static_cast<size_t>(i)];
      ptr_[i] = t.count == 0                  ? nullptr
                : t.kind == MlaKind::kIndex ? static_cast<void*>(t.indices.data())
                                              : static_cast<void*>(t.values.data());
    }
  }

  int input_sets() const override { return 1; }
  MlaArgs args(int) override { return mla_args(case_, in_, ptr_); }
  Stream stream() const override { return nullptr; }

  void poison_outputs() override {
    for (MlaTensor& t : tensors_) {
      if (t.output) t.values.assign(t.values.size(), std::numeric_limits<float>::quiet_NaN());
    }
  }
  MlaHostOutputs read_outputs() override {
    return {tensors_[kMlaQa].values, tensors_[kMlaCache].values, tensors_[kMlaK].values,
            tensors_[kMlaV].values};
  }

  bool has_baseline() const override { return false; }
  void run_baseline(int) override {}
  Status time(const std::function<Status(int set)>& call, PathResult* path) override {
    return time_on_cpu(config_, call, path);
  }
  void describe(CaseResult* result) const override {
    result->device = "cpu";
    result->baseline_name = "none on the cpu";
  }

 private:
  BenchCase case_;
  const MlaHostInputs& in_;
  TimingConfig config_;
  std::vector<MlaTensor> tensors_;
  void* ptr_[kMlaTensors] = {};
};

}  // namespace

std::unique_ptr<MlaTarget> make_mla_cpu_target(const BenchCase& c, const MlaHostInputs& in,
                                               const TimingConfig& config) {
  return std::make_unique<MlaCpuTarget>(c, in, config);
}

}  // namespace latentkv::bench
