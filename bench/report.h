// What latentkv-bench prints: a header (backend, device, launch floor, ceilings, how it times), a
// block per case as it finishes, the compact table last, and with --json one JSON object per case.
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
// One line, no trailing newline.
std::string case_json(const CaseResult& result);

}  // namespace latentkv::bench
