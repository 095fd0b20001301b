// What latentkv-bench prints: a header (backend, device, launch floor, ceilings, how it times), a
// block per case as it finishes, the compact table last with the geometric mean of the speedups
// (as DeepGEMM's tables give it), with --json one JSON object per case, and for the progress of a
// long run one line per finished case.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "bench_case.h"
#include "cuda_target.h"

namespace latentkv::bench {

struct RunInfo {
  Backend backend = Backend::kCpu;  // resolved
  std::string why;                  // why this backend: "asked for", "no CUDA device found", ...
  const GpuInfo* gpu = nullptr;     // null on the CPU
  TimingConfig timing;
};

void print_header(FILE* to, const RunInfo& run);
void print_case(FILE* to, const CaseResult& result);
void print_table(FILE* to, const std::vector<CaseResult>& results);
// Geometric mean of the speedups over the timed cases (graph replay on the GPU, or back to back
// from C++ with back_to_back), NaN when none was timed; *count: how many it is over.
double geomean_speedup(const std::vector<CaseResult>& results, bool back_to_back, int* count);
// "PASS, fused 12.3 us, speedup 1.85x": a finished case in a few words, for the progress line.
std::string case_summary(const CaseResult& result);
// One line, no trailing newline.
std::string case_json(const CaseResult& result);

}  // namespace latentkv::bench
