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
  Stream stream() const { return stream_; }
  std::unique_ptr<Target> make_target(const Problem& problem, const testing::HostInputs& inputs);

 private:
  TimingConfig config_;
  Stream stream_ = nullptr;
  GpuInfo info_;
};

// The pieces every GPU target shares (the MLA cases' target too).
// A device tensor of `bytes` bytes in dtype, waited for on stream and read back as float.
std::vector<float> read_device(const void* data, size_t bytes, DType dtype, Stream stream);
// How many copies of an input set of set_bytes the timed calls cycle through: with config.rotate
// enough to hold 3x the L2 cache when one set fits in it, else 1.
int rotation_sets(size_t set_bytes, const GpuInfo& info, const TimingConfig& config);
// Calls captured per graph: config.calls_per_graph rounded up to whole cycles through the sets.
int graph_calls(const TimingConfig& config, int sets);
// Times `call` (one call on input set `set`) the way every case is timed: path->time from graph
// replay, path->launch back to back from a host loop. A failing call stops it; its status returns.
Status time_on_gpu(Stream stream, const TimingConfig& config, int sets,
                   const std::function<Status(int set)>& call, PathResult* path);

}  // namespace latentkv::bench
