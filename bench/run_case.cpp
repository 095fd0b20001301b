// The case driver: the same steps on every backend. Fresh random inputs, the float64 reference,
// the fused call checked on a NaN-poisoned output, the baseline checked the same way (its error
// sets the bf16/fp16 tolerance), then both timed on the same inputs in the same run. A refused
// fused call is reported with the library's message and the baseline is still timed.
#include <string>

#include "target.h"
#include "verify.h"

namespace latentkv::bench {
namespace {

// Work allowed for the float64 reference of one case (single-threaded, about 1 GFLOP/s): all
// tokens of the small cases, an even sample of the large ones.
constexpr double kReferenceFlops = 1e9;

}  // namespace

CaseResult run_case(const BenchCase& bench_case, Backend backend, Strategy strategy,
                    const TimingConfig& config, const TargetFactory& make_target,
                    const ProgressFn& progress) {
  const Problem& p = bench_case.problem;
  CaseResult result;
  result.bench_case = bench_case;
  result.backend = backend;

  progress("random inputs");
  const testing::HostInputs inputs = testing::random_inputs(p, config.seed);
  progress("placing inputs");
  const std::unique_ptr<Target> target = make_target(p, inputs);
  target->describe(&result);
  result.input_sets = target->input_sets();

  Options options;
  options.backend = backend;
  options.strategy = strategy;
  options.stream = target->stream();
  const Status chosen = select_strategy(p, target->args(0), options, &result.strategy);
  if (!chosen.ok()) {
    result.outcome = Outcome::kRefused;
    result.refusal = chosen.code();
    result.message = chosen.message();
    if (!target->has_baseline()) return result;
  }

  progress("float64 reference");
  const ReferenceCheck check(p, inputs, kReferenceFlops);
  result.checked_tokens = check.checked_tokens();
  Status status = chosen;
  if (status.ok()) {
    progress("fused: check");
    target->poison_output();
    status = run(p, target->args(0), options);
    if (status.ok()) {
      result.fused.error = check.error(target->read_output());
      result.fused.ran = true;
    } else {
      result.outcome = status.code() == StatusCode::kCudaError ? Outcome::kError
                                                                : Outcome::kRefused;
      result.refusal = status.code();
      result.message = status.message();
    }
  }

  progress("baseline: check");
  target->poison_output();
  target->run_baseline(0);
  result.baseline.error = check.error(target->read_output());
  result.baseline.ran = true;
  result.tolerance = fused_tolerance(p.dtype, result.baseline.error);

  if (result.fused.ran) {
    // NaN error or tolerance (an unknown baseline error) compares false: a fail, as it must.
    result.outcome = result.fused.error <= result.tolerance ? Outcome::kPass : Outcome::kFail;
    progress("fused: timing");
    status = target->time([&](int set) { return run(p, target->args(set), options); },
                          &result.fused);
    if (!status.ok()) {
      result.outcome = Outcome::kError;
      result.message = std::string("timing the fused call: ") + to_string(status.code()) + ": " +
                       status.message();
    }
  }
  progress("baseline: timing");
  target->time(
      [&](int set) {
        target->run_baseline(set);
        return Status::Ok();
      },
      &result.baseline);
  return result;
}

}  // namespace latentkv::bench
