// The GPU side of latentkv-bench, behind a plain C++ interface so main.cpp needs no CUDA headers.
// A GpuSession is made once per run, only when a device is present: it owns the stream, measures
// the launch floor (an empty kernel timed exactly as the cases are) and the ceilings the floors of
// the cases come from (copy bandwidth, cuBLAS GEMM rate per dtype), and makes a Target per case.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "target.h"

namespace latentkv::bench {

struct GpuInfo {
  std::string name;
  int sm_count = 0;
  int compute_major = 0, compute_minor = 0;
  int64_t l2_bytes = 0;
  Stats empty_graph;          // an empty kernel, per call, in a graph of calls_per_graph launches
  Stats empty_loop;           // the same launched back to back from a host loop
  double copy_gb_per_s = 0;   // device-to-device copy, bytes read + written
  std::map<DType, double> gemm_tflop_per_s;  // cuBLAS 8192^3 GEMM, fp32 accumulation
};

class GpuSession {
 public:
  // Uses device 0; measures the ceilings of the given dtypes.
  GpuSession(const TimingConfig& config, const std::vector<DType>& dtypes,
             const ProgressFn& progress);
  ~GpuSession();
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;

  const GpuInfo& info() const { return info_; }
  std::unique_ptr<Target> make_target(const Problem& problem, const testing::HostInputs& inputs);

 private:
  TimingConfig config_;
  Stream stream_ = nullptr;
  GpuInfo info_;
};

}  // namespace latentkv::bench
