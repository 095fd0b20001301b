// The steps the projection's driver (run_case.cpp) and the MLA path's (mla_case.cpp) share, over
// either kind of target: the fused call's options, the strategy's choice (recording a refusal),
// and timing both paths once they are checked.
#pragma once

#include <string>

#include "bench_case.h"

namespace latentkv::bench {

// The fused call's options: the backend and strategy asked for, on the target's stream.
inline Options fused_options(Backend backend, Strategy strategy, Stream stream) {
  Options options;
  options.backend = backend;
  options.strategy = strategy;
  options.stream = stream;
  return options;
}

// A library call that did not succeed: a CUDA failure is an error, anything else a refusal.
inline void record_refusal(const Status& status, CaseResult* result) {
  result->outcome =
      status.code() == StatusCode::kCudaError ? Outcome::kError : Outcome::kRefused;
  result->refusal = status.code();
  result->message = status.message();
}

// The target's description into the result, then the strategy the fused call would run; a
// refusal is recorded. Returns the choice's status (the case stops when it is refused and the
// target has no baseline to time).
template <typename TargetT, typename ProblemT>
Status choose_strategy(TargetT& target, const ProblemT& problem, const Options& options,
                       CaseResult* result) {
  target.describe(result);
  result->input_sets = target.input_sets();
  const Status chosen = select_strategy(problem, target.args(0), options, &result->strategy);
  if (!chosen.ok()) record_refusal(chosen, result);
  return chosen;
}

// Times the fused call and then the baseline, each where its check ran, on the same inputs.
template <typename TargetT, typename ProblemT>
void time_paths(TargetT& target, const ProblemT& problem, const Options& options,
                const ProgressFn& progress, CaseResult* result) {
  if (result->fused.ran) {
    progress("fused: timing");
    const Status status = target.time(
        [&](int set) { return run(problem, target.args(set), options); }, &result->fused);
    if (!status.ok()) {
      result->outcome = Outcome::kError;
      result->message = std::string("timing the fused call: ") + to_string(status.code()) +
                        ": " + status.message();
    }
  }
  if (result->baseline.ran) {
    progress("baseline: timing");
    target.time(
        [&](int set) {
          target.run_baseline(set);
          return Status::Ok();
        },
        &result->baseline);
  }
}

}  // namespace latentkv::bench
