// The vocabulary of latentkv-bench: a case to run, how to time it, and what came out (accuracy,
// timings of the fused path and of the unfused baseline, the floor). The CPU and CUDA runners fill
// a CaseResult; the report prints it. Plain C++ so every part of the bench can include it.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "latentkv/latentkv.h"
#include "mla_reference.h"

namespace latentkv::bench {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct BenchCase {
  std::string name;  // "seed", "T=733", "deepseek-v3-mla kv T=64", ...
  Problem problem;   // a case of the projection (latentkv.h)
  // A case of the MLA KV path (mla.h) instead: mla_problem, its RoPE in rope_form, the latent
  // cache paged through a shuffled slot_mapping.
  bool mla = false;
  MlaProblem mla_problem;
  testing::RopeForm rope_form = testing::RopeForm::kPositions;

  // Of whichever problem the case runs.
  DType dtype() const { return mla ? mla_problem.dtype : problem.dtype; }
  double flops() const { return mla ? mla_problem.flops() : problem.flops(); }
  double min_bytes() const { return mla ? mla_problem.min_bytes() : problem.min_bytes(); }
  int64_t tokens() const { return mla ? mla_problem.tokens() : problem.tokens(); }
  std::string to_string() const;  // the problem, with the RoPE form of an MLA case
};

// How to time. A measurement stops after `iters` samples or once `seconds` are spent, whichever
// comes first, but never with fewer than kMinSamples: large cases must not take minutes.
struct TimingConfig {
  int warmup = 10;
  int iters = 100;
  double seconds = 1.0;
  int calls_per_graph = 20;  // CUDA: calls captured in one graph; a replay's time / calls = per call
  bool rotate = true;        // CUDA: cycle through enough input sets to spill the L2 cache
  uint64_t seed = 1;         // random inputs
};
constexpr int kMinSamples = 5;

// Microseconds per call over repeated samples.
struct Stats {
  double median_us = kNaN;
  double min_us = kNaN;
  double p90_us = kNaN;
  int samples = 0;
  bool valid() const { return samples > 0; }
};
Stats summarize(std::vector<double> samples_us);

// Runs `sample` (which returns one sample in microseconds) `warmup` times unmeasured, then
// repeatedly within config's iteration count and time budget.
Stats sample_repeatedly(const TimingConfig& config, const std::function<double()>& sample);

// One path (the fused library call or the baseline). On the GPU `time` is GPU time per call from
// CUDA-graph replay and `launch` is per call back to back from a host loop (launch included); on
// the CPU `time` is wall time per call and `launch` is not measured.
struct PathResult {
  bool ran = false;              // produced an output that was checked
  double error = kNaN;           // relative Frobenius error against float64
  Stats time;
  Stats launch;
};

enum class Outcome {
  kPass,     // the fused result is within tolerance
  kFail,     // the fused result is outside tolerance (or not finite)
  kRefused,  // the library refused the fused call (Status in `message`)
  kSkipped,  // the bench chose not to run the case (reason in `message`)
  kError,    // a failure other than accuracy (message says what)
};
const char* to_string(Outcome outcome);

// Where a case ran and the floor its time is compared with.
struct Floor {
  double us = kNaN;      // max of the three terms below
  const char* bound = "";  // which term gives it: "launch", "memory" or "compute"
};

struct CaseResult {
  BenchCase bench_case;
  Backend backend = Backend::kCpu;
  Strategy strategy = Strategy::kAuto;  // as select_strategy resolved it
  std::string baseline_name;            // "cpu-3gemm+stack", "cublas-3gemm+stack"
  std::string device;                   // "cpu" or the GPU's name
  Outcome outcome = Outcome::kError;
  StatusCode refusal = StatusCode::kOk;  // with kRefused: the library's code
  std::string message;

  double tolerance = kNaN;
  std::string error_detail;  // MLA: each output's error and tolerance ("k 2.1e-3 <= 4.4e-3, ...")
  int64_t checked_tokens = 0;  // tokens whose rows were compared with the float64 reference
  int input_sets = 1;          // distinct buffers the timed calls cycle through
  int calls_per_graph = 0;     // CUDA only
  PathResult fused;
  PathResult baseline;
  Floor floor;
  double launch_floor_graph_us = kNaN;  // CUDA: an empty kernel timed the same two ways
  double launch_floor_loop_us = kNaN;

  double speedup() const { return baseline.time.median_us / fused.time.median_us; }
  double speedup_launch() const { return baseline.launch.median_us / fused.launch.median_us; }
  double gb_per_s() const { return bench_case.min_bytes() / fused.time.median_us * 1e-3; }
  double tflop_per_s() const { return bench_case.flops() / fused.time.median_us * 1e-6; }
  double pct_of_floor() const { return 100.0 * floor.us / fused.time.median_us; }
};

// Reports what a case is doing, for the progress line of long runs.
using ProgressFn = std::function<void(const std::string& phase)>;

}  // namespace latentkv::bench
