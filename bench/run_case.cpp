// The case driver: the same steps on every backend. Fresh random inputs, the float64 reference,
// the fused call checked on a NaN-poisoned output, the baseline checked the same way (its error
// sets the bf16/fp16 tolerance), then both timed on the same inputs in the same run. A refused
// fused call is reported with the library's message and the baseline is still timed.
#include <string>

#include "case_steps.h"
#include "target.h"
#include "verify.h"

namespace latentkv::bench {

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
  const Options options = fused_options(backend, strategy, target->stream());
  const Status chosen = choose_strategy(*target, p, options, &result);
  if (!chosen.ok() && !target->has_baseline()) return result;

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
      record_refusal(status, &result);
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
  }
  time_paths(*target, p, options, progress, &result);
  return result;
}

}  // namespace latentkv::bench
