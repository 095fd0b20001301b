// Sample statistics and the repeat-until-budget loop shared by the CPU and GPU timers.
#include "bench_case.h"

#include <algorithm>
#include <chrono>

namespace latentkv::bench {

Stats summarize(std::vector<double> samples_us) {
  Stats s;
  if (samples_us.empty()) return s;
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  s.samples = static_cast<int>(n);
  s.min_us = samples_us.front();
  // Median of an even count: the mean of the middle two.
  s.median_us = n % 2 ? samples_us[n / 2] : 0.5 * (samples_us[n / 2 - 1] + samples_us[n / 2]);
  s.p90_us = samples_us[std::min(n - 1, static_cast<size_t>(0.9 * static_cast<double>(n)))];
  return s;
}

Stats sample_repeatedly(const TimingConfig& config, const std::function<double()>& sample) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // Warm-up gets at most half the budget: a 400 ms call must not spend 4 s warming up.
  const Clock::time_point warm_start = Clock::now();
  for (int i = 0; i < config.warmup && seconds_since(warm_start) < 0.5 * config.seconds; ++i) {
    sample();
  }
  std::vector<double> samples;
  const Clock::time_point start = Clock::now();
  while (static_cast<int>(samples.size()) < config.iters &&
         (static_cast<int>(samples.size()) < kMinSamples || seconds_since(start) < config.seconds)) {
    samples.push_back(sample());
  }
  return summarize(std::move(samples));
}

std::string BenchCase::to_string() const {
  if (!mla) return problem.to_string();
  return mla_problem.to_string() + " rope_form=" + testing::to_string(rope_form);
}

const char* to_string(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass: return "pass";
    case Outcome::kFail: return "fail";
    case Outcome::kRefused: return "refused";
    case Outcome::kSkipped: return "skipped";
    case Outcome::kError: return "error";
  }
  return "unknown";
}

}  // namespace latentkv::bench
