// The GPU target of the MLA cases: every tensor of the call in one slab per input set (each
// 256-byte aligned, like a cudaMalloc'd tensor), as many sets as it takes to spill L2 (the weights
// then come from HBM, as in a model whose layers stream through), the unfused cuBLAS baseline, and
// the timing every GPU case uses. The floor of a case is the launch of one kernel, its bytes at
// 4.2 TB/s or its FLOPs at 670 TFLOP/s (float32: 51), whichever is largest: the H200 ceilings the
// MLA issues' targets state (design.md), so a row's floor is the number in their brackets.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "cuda_check.h"
#include "mla_baseline_cublas.h"
#include "mla_case.h"
#include "testing.h"

namespace latentkv::bench {
namespace {

constexpr size_t kAlign = 256;
constexpr double kCopyGbPerS = 4200.0;         // copy bandwidth, bytes read + written
constexpr double kHalfGemmTflopPerS = 670.0;   // cuBLAS bf16/fp16 8192^3
constexpr double kFloatGemmTflopPerS = 51.0;   // cuBLAS fp32 SGEMM (no TF32)

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class MlaCudaTarget final : public MlaTarget {
 public:
  MlaCudaTarget(const BenchCase& c, const MlaHostInputs& in, const TimingConfig& config,
                const GpuInfo& info, Stream stream)
      : case_(c), in_(in), config_(config), info_(info), stream_(stream),
        baseline_(c.mla_problem, stream) {
    const MlaProblem& p = c.mla_problem;
    std::vector<MlaTensor> tensors = mla_tensors(c, in);
    for (int i = 0; i < kMlaTensors; ++i) {
      const MlaTensor& t = tensors[static_cast<size_t>(i)];
      bytes_[i] = static_cast<size_t>(t.count * element_bytes(t, p));
      offset_[i + 1] = offset_[i] + align_up(bytes_[i]);
      output_[i] = t.output;
    }
    const size_t set_bytes = offset_[kMlaTensors];
    sets_ = rotation_sets(set_bytes, info, config);
    BENCH_CHECK(cudaMalloc(&slab_, set_bytes * static_cast<size_t>(sets_)));
    // Scratch for the strategies that need it, sized for every one so any can be forced.
    Options cuda;
    cuda.backend = Backend::kCuda;
    for (Strategy s : {Strategy::kAuto, Strategy::kCudaMlaGemm}) {
      cuda.strategy = s;
      workspace_bytes_ = std::max(workspace_bytes_, workspace_size(p, cuda));
    }
    if (workspace_bytes_ > 0) BENCH_CHECK(cudaMalloc(&workspace_, workspace_bytes_));

    // Set 0 from the host on stream_ (not the legacy default stream), then copied to the others.
    for (int i = 0; i < kMlaTensors; ++i) {
      const MlaTensor& t = tensors[static_cast<size_t>(i)];
      if (t.output || t.count == 0) continue;
      std::vector<unsigned char> bytes;
      if (t.kind == MlaKind::kIndex) {
        bytes.resize(bytes_[i]);
        std::memcpy(bytes.data(), t.indices.data(), bytes_[i]);
      } else {
        bytes = testing::to_bytes(t.values, t.kind == MlaKind::kData ? p.dtype : p.rope_dtype);
      }
      BENCH_CHECK(cudaMemcpyAsync(slab_ + offset_[i], bytes.data(), bytes.size(),
                                 cudaMemcpyHostToDevice, stream_));
      BENCH_CHECK(cudaStreamSynchronize(stream_));  // before `bytes` goes away
    }
    for (int s = 1; s < sets_; ++s) {
      BENCH_CHECK(cudaMemcpyAsync(slab_ + s * set_bytes, slab_, set_bytes,
                                 cudaMemcpyDeviceToDevice, stream_));
    }
    BENCH_CHECK(cudaStreamSynchronize(stream_));
  }
  ~MlaCudaTarget() override {
    cudaFree(slab_);
    cudaFree(workspace_);
  }

  int input_sets() const override { return sets_; }
  MlaArgs args(int set) override {
    char* base = slab_ + static_cast<size_t>(set) * offset_[kMlaTensors];
    void* ptr[kMlaTensors];
    for (int i = 0; i < kMlaTensors; ++i) ptr[i] = bytes_[i] > 0 ? base + offset_[i] : nullptr;
    MlaArgs a = mla_args(case_, in_, ptr);
    a.workspace = workspace_;
    a.workspace_bytes = workspace_bytes_;
    return a;
  }
  Stream stream() const override { return stream_; }

  void poison_outputs() override {
    // All-ones bytes are NaN in float32, bfloat16 and float16 alike.
    for (int i = 0; i < kMlaTensors; ++i) {
      if (output_[i] && bytes_[i] > 0) {
        BENCH_CHECK(cudaMemsetAsync(slab_ + offset_[i], 0xFF, bytes_[i], stream_));
      }
    }
  }
  MlaHostOutputs read_outputs() override {
    return {read(kMlaQa), read(kMlaCache), read(kMlaK), read(kMlaV)};
  }

  bool has_baseline() const override { return true; }
  void run_baseline(int set) override { baseline_.run(args(set)); }
  Status time(const std::function<Status(int set)>& call, PathResult* path) override {
    return time_on_gpu(stream_, config_, sets_, call, path);
  }

  void describe(CaseResult* result) const override {
    const MlaProblem& p = case_.mla_problem;
    result->device = info_.name;
    result->baseline_name = "cublas+norm,rope,cache,concat";
    result->calls_per_graph = graph_calls(config_, sets_);
    result->launch_floor_graph_us = info_.empty_graph.median_us;
    result->launch_floor_loop_us = info_.empty_loop.median_us;
    Floor floor{info_.empty_graph.median_us, "launch"};
    const double memory_us = p.min_bytes() / (kCopyGbPerS * 1e3);
    if (!(floor.us >= memory_us)) floor = {memory_us, "memory"};
    const double rate = p.dtype == DType::kFloat32 ? kFloatGemmTflopPerS : kHalfGemmTflopPerS;
    const double compute_us = p.flops() / (rate * 1e6);
    if (compute_us > floor.us) floor = {compute_us, "compute"};
    result->floor = floor;
  }

 private:
  // Tensor i of set 0 as float (empty when the call does not use it).
  std::vector<float> read(int i) {
    if (bytes_[i] == 0) return {};
    return read_device(slab_ + offset_[i], bytes_[i], case_.mla_problem.dtype, stream_);
  }

  BenchCase case_;
  const MlaHostInputs& in_;
  TimingConfig config_;
  const GpuInfo& info_;
  Stream stream_;
  MlaCublasBaseline baseline_;
  size_t bytes_[kMlaTensors] = {};
  size_t offset_[kMlaTensors + 1] = {};  // within one set; offset_[kMlaTensors] = the set's size
  bool output_[kMlaTensors] = {};
  int sets_ = 1;
  char* slab_ = nullptr;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
};

}  // namespace

std::unique_ptr<MlaTarget> make_mla_cuda_target(const BenchCase& c, const MlaHostInputs& in,
                                                const TimingConfig& config, const GpuInfo& info,
                                                Stream stream) {
  return std::make_unique<MlaCudaTarget>(c, in, config, info, stream);
}

}  // namespace latentkv::bench
