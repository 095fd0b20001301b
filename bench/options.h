// Command line of latentkv-bench: the options, their checks and the list of cases they select.
// Every bad option is caught here, before any device is touched, with a message that names it.
#pragma once

#include <vector>

#include "bench_case.h"

namespace latentkv::bench {

struct BenchOptions {
  Backend backend = Backend::kAuto;     // as asked; main resolves kAuto
  Strategy strategy = Strategy::kAuto;  // forced strategy, or kAuto
  bool json = false;
  bool sweep = false;
  bool quiet = false;  // no progress lines on stderr
  TimingConfig timing;
  std::vector<BenchCase> cases;
};

// Parses the command line into *options. Returns -1 to go on, or the exit code to stop with (0 after
// --help, 2 after a bad option, its message already on stderr).
int parse_options(int argc, char** argv, BenchOptions* options);

}  // namespace latentkv::bench
