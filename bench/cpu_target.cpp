// The CPU target: host buffers, the single-threaded unfused baseline, and wall-clock timing
// (std::chrono, warm-up, median of many). One input set: a CPU case is timed warm, as a CPU
// framework would run it back to back.
#include <chrono>
#include <limits>

#include "baseline_cpu.h"
#include "target.h"

namespace latentkv::bench {
namespace {

class CpuTarget final : public Target {
 public:
  CpuTarget(const Problem& problem, const testing::HostInputs& inputs, const TimingConfig& config)
      : problem_(problem),
        config_(config),
        inputs_(inputs),
        out_(static_cast<size_t>(2 * problem.tokens() * problem.kv_width())),
        baseline_(problem) {}

  int input_sets() const override { return 1; }
  Args args(int) override {
    return contiguous_args(problem_, inputs_.hidden.data(), inputs_.w_down.data(),
                           inputs_.w_up_k.data(), inputs_.w_up_v.data(), out_.data());
  }
  Stream stream() const override { return nullptr; }

  void poison_output() override {
    out_.assign(out_.size(), std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<float> read_output() override { return out_; }

  bool has_baseline() const override { return problem_.dtype == DType::kFloat32; }
  void run_baseline(int set) override { baseline_.run(args(set)); }

  Status time(const std::function<Status(int set)>& call, PathResult* path) override {
    return time_on_cpu(config_, call, path);
  }

  void describe(CaseResult* result) const override {
    result->device = "cpu";
    result->baseline_name = "cpu-3gemm+stack";
  }

 private:
  Problem problem_;
  TimingConfig config_;
  const testing::HostInputs& inputs_;
  std::vector<float> out_;  // [2, B, S, H, Dh]
  CpuBaseline baseline_;
};

}  // namespace

Status time_on_cpu(const TimingConfig& config, const std::function<Status(int set)>& call,
                   PathResult* path) {
  Status status;
  path->time = sample_repeatedly(config, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    if (status.ok()) status = call(0);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
        .count();
  });
  if (!status.ok()) path->time = Stats{};
  return status;
}

std::unique_ptr<Target> make_cpu_target(const Problem& problem,
                                        const testing::HostInputs& inputs,
                                        const TimingConfig& config) {
  return std::make_unique<CpuTarget>(problem, inputs, config);
}

}  // namespace latentkv::bench
