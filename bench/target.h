// A backend as the case driver sees it. The driver's steps are the same on the CPU and the GPU
// (random inputs, float64 reference, check the fused call and the baseline on poisoned outputs,
// then time both); what differs is where the buffers live and how a call is timed, and that is all
// a Target holds. run_case() is the driver.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "bench_case.h"
#include "testing.h"

namespace latentkv::bench {

class Target {
 public:
  virtual ~Target() = default;

  // Copies of the inputs the timed calls cycle through (each with its own output); all hold the
  // same values, so a check on set 0 holds for every set.
  virtual int input_sets() const = 0;
  // Contiguous arguments of one input set, on the backend's side (host or device pointers).
  virtual Args args(int set) = 0;
  // The stream that run() and the baseline enqueue on (CPU: none).
  virtual Stream stream() const = 0;

  // Fills set 0's output with NaN, so that an element a call does not write fails the check.
  virtual void poison_output() = 0;
  // Waits for pending work and returns set 0's output, converted to float.
  virtual std::vector<float> read_output() = 0;

  // Whether the baseline can run this problem (the CPU one is float32 only).
  virtual bool has_baseline() const = 0;
  virtual void run_baseline(int set) = 0;
  // Times `call` (one call on input set `set`): fills path->time and, where the backend measures
  // it, path->launch. A failing call stops the timing and its status comes back.
  virtual Status time(const std::function<Status(int set)>& call, PathResult* path) = 0;

  // Fills the target's part of a result: device, baseline name, floor, launch floor, graph size.
  virtual void describe(CaseResult* result) const = 0;
};

using TargetFactory =
    std::function<std::unique_ptr<Target>(const Problem&, const testing::HostInputs&)>;

// Wall time per call of `call` on input set 0 (the CPU's timing, path->time only). A failing call
// stops it; its status returns.
Status time_on_cpu(const TimingConfig& config, const std::function<Status(int set)>& call,
                   PathResult* path);

// inputs must outlive the target (the CPU computes on them in place).
std::unique_ptr<Target> make_cpu_target(const Problem& problem,
                                        const testing::HostInputs& inputs,
                                        const TimingConfig& config);

// Checks and times one case. backend is resolved (kCpu or kCuda); strategy may be kAuto.
CaseResult run_case(const BenchCase& bench_case, Backend backend, Strategy strategy,
                    const TimingConfig& config, const TargetFactory& make_target,
                    const ProgressFn& progress);

}  // namespace latentkv::bench
