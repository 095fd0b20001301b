// latentkv-bench, the project's main job: checks the fused KV projection (and the MLA KV path,
// mla_case.h) against float64 and times it against the unfused baseline (three GEMMs + the stack
// copy, what PyTorch eager runs; for MLA cuBLAS GEMMs plus separate norm, RoPE, cache and concat
// kernels) in the same run, on the GPU when one is present, else on the CPU. See --help.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cuda_target.h"
#include "mla_case.h"
#include "options.h"
#include "report.h"
#include "target.h"

namespace latentkv::bench {
namespace {

// A CPU sweep skips cases above this much work per call: the unfused baseline runs on one core at
// about 80 GFLOP/s, so a prefill-sized case (50-170 GFLOP) would take a minute for a handful of
// samples. DeepSeek-V3 decode with 128 tokens (5 GFLOP) still runs.
constexpr double kCpuSweepMaxFlops = 1e10;

// Progress on stderr: a run of several cases prints a line per case as it finishes ("[3/12]
// T=733: PASS, fused 41.2 us, speedup 1.93x (8 s)"); on a terminal, a case that takes more than a
// second also shows what it is doing in one line rewritten in place. --quiet: nothing.
class Progress {
 public:
  Progress(int total, bool quiet)
      : total_(total), quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}

  void start_case(int index, const std::string& name) {
    index_ = index;
    name_ = name;
  }
  void phase(const std::string& what) {
    if (quiet_ || !tty_ || elapsed() < 1.0) return;
    std::fprintf(stderr, "\r\033[K%s%s%s%s (%.0f s)", where().c_str(), name_.c_str(),
                 name_.empty() ? "" : ": ", what.c_str(), elapsed());
    std::fflush(stderr);
    shown_ = true;
  }
  void finish_case(const CaseResult& result) {
    clear();
    if (quiet_ || total_ < 2) return;
    std::fprintf(stderr, "%s%s: %s (%.0f s)\n", where().c_str(), name_.c_str(),
                 case_summary(result).c_str(), elapsed());
    std::fflush(stderr);
  }
  // Clears the line before results are printed to the same terminal.
  void clear() {
    if (!shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  std::string where() const {
    if (total_ < 2 || name_.empty()) return "";
    return "[" + std::to_string(index_ + 1) + "/" + std::to_string(total_) + "] ";
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int total_;
  bool quiet_;
  bool tty_;
  int index_ = 0;
  std::string name_;
  bool shown_ = false;
};

// Why the CPU backend does not run a case (`sweep`: in a sweep), or empty. Cases in bf16/fp16 are
// never run there: their error budget is twice an unfused baseline's error, and the CPU target has
// no baseline in those types (tests/cpu/test_cpu.cpp and test_mla.cpp check the CPU backend's half
// types against the unfused computation's error instead).
std::string cpu_skip(const BenchCase& c, bool sweep) {
  if (c.dtype() != DType::kFloat32) {
    return std::string("the cpu target checks ") + (c.mla ? "the MLA path" : "the projection") +
           " in float32 only (no unfused cpu baseline for a " + to_string(c.dtype()) +
           " error budget); pass --dtype float32";
  }
  if (!sweep) return "";
  if (c.flops() > kCpuSweepMaxFlops) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "%.3g GFLOP per call is too much for the cpu sweep (limit %.3g); run it alone "
                  "with --preset to time it anyway",
                  c.flops() * 1e-9, kCpuSweepMaxFlops * 1e-9);
    return buf;
  }
  return "";
}

int exit_code(const std::vector<CaseResult>& results) {
  bool refused = false;
  for (const CaseResult& r : results) {
    if (r.outcome == Outcome::kFail || r.outcome == Outcome::kError) return 1;
    refused = refused || r.outcome == Outcome::kRefused;
  }
  return refused ? 2 : 0;
}

int bench_main(int argc, char** argv) {
  BenchOptions options;
  const int parsed = parse_options(argc, argv, &options);
  if (parsed >= 0) return parsed;

  RunInfo run;
  run.timing = options.timing;
  if (options.backend == Backend::kCuda && !backend_available(Backend::kCuda)) {
    std::fprintf(stderr,
                 "latentkv-bench: --backend cuda%s asks for the GPU, but no CUDA device is "
                 "present; use --backend cpu or auto\n",
                 options.strategy == Strategy::kCudaFused ? " (through --strategy cuda-fused)"
                                                          : "");
    return 2;
  }
  run.backend = resolve_backend(options.backend);
  if (options.backend != Backend::kAuto) {
    run.why = "asked for";
  } else {
    run.why = run.backend == Backend::kCuda ? "a CUDA device is present" : "no CUDA device found";
  }

  // With --json, stdout carries only the JSON lines; everything for people goes to stderr.
  FILE* human = options.json ? stderr : stdout;
  const int total = static_cast<int>(options.cases.size());
  Progress progress(total, options.quiet);
  const ProgressFn phase = [&](const std::string& what) { progress.phase(what); };

  std::unique_ptr<GpuSession> gpu;
  TargetFactory make_target;
  if (run.backend == Backend::kCuda) {
    std::set<DType> dtypes;
    for (const BenchCase& c : options.cases) dtypes.insert(c.dtype());
    gpu = std::make_unique<GpuSession>(options.timing,
                                       std::vector<DType>(dtypes.begin(), dtypes.end()), phase);
    run.gpu = &gpu->info();
    make_target = [&](const Problem& p, const testing::HostInputs& in) {
      return gpu->make_target(p, in);
    };
  } else {
    make_target = [&](const Problem& p, const testing::HostInputs& in) {
      return make_cpu_target(p, in, options.timing);
    };
  }
  progress.clear();
  print_header(human, run);

  std::vector<CaseResult> results;
  for (int i = 0; i < total; ++i) {
    const BenchCase& c = options.cases[static_cast<size_t>(i)];
    progress.start_case(i, c.name);
    const std::string skip = run.backend == Backend::kCpu ? cpu_skip(c, options.sweep) : "";
    CaseResult result;
    if (skip.empty() && c.mla) {
      result = run_mla_case(c, run.backend, options.strategy, options.timing, gpu.get(), phase);
    } else if (skip.empty()) {
      result = run_case(c, run.backend, options.strategy, options.timing, make_target, phase);
    } else {
      result.bench_case = c;
      result.backend = run.backend;
      result.outcome = Outcome::kSkipped;
      result.message = skip;
    }
    progress.clear();
    print_case(human, result);
    progress.finish_case(result);
    if (options.json) std::printf("%s\n", case_json(result).c_str());
    std::fflush(stdout);
    results.push_back(std::move(result));
  }
  print_table(human, results);
  return exit_code(results);
}

}  // namespace
}  // namespace latentkv::bench

int main(int argc, char** argv) { return latentkv::bench::bench_main(argc, argv); }
