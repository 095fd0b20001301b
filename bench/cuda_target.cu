// The GPU target and session of latentkv-bench (see cuda_target.h). Timing follows the method the
// project uses everywhere: CUDA events; N calls captured into a graph and the replays timed, per
// call = replay / N, median over replays (the GPU-side cost with launch gaps squeezed out); and a
// host loop of calls bracketed by events (what a C++ caller pays, launch included). When one input
// set fits in L2, the calls cycle through enough copies to spill it, so the cache is not what is
// measured; --no-rotate turns that off.
#include "cuda_target.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "baseline_cublas.h"
#include "cuda_check.h"
#include "testing.h"

namespace latentkv::bench {
namespace {

using CallFn = std::function<Status(int set)>;

// Each copy of the inputs is 256-byte aligned, like a cudaMalloc'd tensor.
constexpr size_t kAlign = 256;
// Copies of the inputs when they fit in L2: enough for 3x its size, at most this many.
constexpr size_t kMaxInputSets = 1024;
// Calls per host loop of the back-to-back measurement (at least; rounded to whole input cycles).
constexpr int kLoopCalls = 100;
// Replays per graph measurement are also bounded by this (events are cheap, not free).
constexpr int kMaxReplays = 100000;
// The ceilings: a copy of this size per direction, and a square GEMM of this size (as in design.md).
constexpr size_t kCopyBytes = size_t{256} << 20;
constexpr int64_t kGemmSize = 8192;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Event {
  cudaEvent_t event = nullptr;
  Event() { BENCH_CHECK(cudaEventCreate(&event)); }
  ~Event() { cudaEventDestroy(event); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

float elapsed_ms(const Event& from, const Event& to) {
  float ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&ms, from.event, to.event));
  return ms;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { BENCH_CHECK(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// GPU time of whatever `enqueue` puts on the stream, one at a time from an idle GPU.
double time_once_ms(Stream stream, const std::function<void()>& enqueue) {
  Event start, stop;
  BENCH_CHECK(cudaEventRecord(start.event, stream));
  enqueue();
  BENCH_CHECK(cudaEventRecord(stop.event, stream));
  BENCH_CHECK(cudaStreamSynchronize(stream));
  return elapsed_ms(start, stop);
}

__global__ void empty_kernel() {}

// Uniform values in [-1, 1) from a hash of the index: never zeros (they run faster than real data).
template <typename T>
__global__ void fill_uniform_kernel(T* data, int64_t count, uint32_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    data[i] = T(static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

void fill_uniform(void* data, DType dtype, int64_t count, uint32_t seed, Stream stream) {
  const unsigned blocks = 1024, threads = 256;
  switch (dtype) {
    case DType::kFloat32:
      fill_uniform_kernel<<<blocks, threads, 0, stream>>>(static_cast<float*>(data), count, seed);
      break;
    case DType::kBFloat16:
      fill_uniform_kernel<<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(data),
                                                          count, seed);
      break;
    case DType::kFloat16:
      fill_uniform_kernel<<<blocks, threads, 0, stream>>>(static_cast<__half*>(data), count, seed);
      break;
  }
  BENCH_CHECK_LAUNCH();
}

}  // namespace

std::vector<float> read_device(const void* data, size_t bytes, DType dtype, Stream stream) {
  std::vector<unsigned char> host(bytes);
  BENCH_CHECK(cudaMemcpyAsync(host.data(), data, bytes, cudaMemcpyDeviceToHost, stream));
  BENCH_CHECK(cudaStreamSynchronize(stream));
  return testing::from_bytes(host, dtype);
}

namespace {

// Captures `calls` calls (call i on input set i % sets) into one graph and times its replays:
// per call = replay time / calls. The replay count is sized from the warm-up to fit the budget.
Status time_graph(Stream stream, const TimingConfig& config, int calls, int sets,
                  const CallFn& call, Stats* stats) {
  cudaGraph_t graph = nullptr;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  Status status;
  for (int i = 0; i < calls && status.ok(); ++i) status = call(i % sets);
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!status.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture leaves its error behind; it is reported as `status`
    return status;
  }
  BENCH_CHECK(ended);
  cudaGraphExec_t exec = nullptr;
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CHECK(cudaGraphDestroy(graph));

  const int warm = std::max(1, config.warmup);
  const double warm_ms = time_once_ms(stream, [&] {
    for (int i = 0; i < warm; ++i) BENCH_CHECK(cudaGraphLaunch(exec, stream));
  });
  const double replay_ms = std::max(warm_ms / warm, 1e-6);
  const int budget = static_cast<int>(std::min<double>(config.seconds * 1e3 / replay_ms, kMaxReplays));
  const int replays = std::min(config.iters, std::max(kMinSamples, budget));

  // Replay i runs between events i and i + 1. One untimed replay first keeps the GPU busy while
  // the timed ones queue up behind it, so no host submission gap lands inside a measurement.
  std::vector<Event> events(static_cast<size_t>(replays) + 1);
  BENCH_CHECK(cudaGraphLaunch(exec, stream));
  BENCH_CHECK(cudaEventRecord(events[0].event, stream));
  for (int i = 0; i < replays; ++i) {
    BENCH_CHECK(cudaGraphLaunch(exec, stream));
    BENCH_CHECK(cudaEventRecord(events[i + 1].event, stream));
  }
  BENCH_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> per_call_us;
  for (int i = 0; i < replays; ++i) {
    per_call_us.push_back(1e3 * elapsed_ms(events[i], events[i + 1]) / calls);
  }
  BENCH_CHECK(cudaGraphExecDestroy(exec));
  *stats = summarize(std::move(per_call_us));
  return Status::Ok();
}

// A host loop of `calls` calls bracketed by events, from an idle GPU: per call, launch included.
Status time_loop(Stream stream, const TimingConfig& config, int calls, int sets,
                 const CallFn& call, Stats* stats) {
  Status status;
  Event start, stop;
  *stats = sample_repeatedly(config, [&] {
    BENCH_CHECK(cudaStreamSynchronize(stream));
    BENCH_CHECK(cudaEventRecord(start.event, stream));
    for (int i = 0; i < calls && status.ok(); ++i) status = call(i % sets);
    BENCH_CHECK(cudaEventRecord(stop.event, stream));
    BENCH_CHECK(cudaStreamSynchronize(stream));
    return 1e3 * elapsed_ms(start, stop) / calls;
  });
  if (!status.ok()) *stats = Stats{};
  return status;
}

// Rounds `calls` up to whole cycles through the input sets.
int whole_cycles(int calls, int sets) { return (calls + sets - 1) / sets * sets; }

}  // namespace

int rotation_sets(size_t set_bytes, const GpuInfo& info, const TimingConfig& config) {
  const size_t l2 = static_cast<size_t>(info.l2_bytes);
  if (!config.rotate || set_bytes >= 3 * l2) return 1;
  return static_cast<int>(std::min(kMaxInputSets, (3 * l2 + set_bytes - 1) / set_bytes));
}

int graph_calls(const TimingConfig& config, int sets) {
  return whole_cycles(config.calls_per_graph, sets);
}

Status time_on_gpu(Stream stream, const TimingConfig& config, int sets, const CallFn& call,
                   PathResult* path) {
  Status status = time_graph(stream, config, graph_calls(config, sets), sets, call, &path->time);
  if (!status.ok()) return status;
  const int loop_calls = whole_cycles(std::max(config.calls_per_graph, kLoopCalls), sets);
  return time_loop(stream, config, loop_calls, sets, call, &path->launch);
}

namespace {

class CudaTarget final : public Target {
 public:
  CudaTarget(const Problem& problem, const testing::HostInputs& inputs,
             const TimingConfig& config, const GpuInfo& info, Stream stream)
      : problem_(problem), config_(config), info_(info), stream_(stream),
        baseline_(problem, stream) {
    const int64_t t = problem.tokens(), d = problem.model_dim, r = problem.rank;
    const int64_t n = problem.kv_width();
    const int64_t elements[kTensors] = {t * d, d * r, r * n, r * n, 2 * t * n};
    const size_t elem = static_cast<size_t>(element_size(problem.dtype));
    offset_[0] = 0;
    for (int i = 0; i < kTensors; ++i) {
      bytes_[i] = static_cast<size_t>(elements[i]) * elem;
      offset_[i + 1] = offset_[i] + align_up(bytes_[i]);
    }
    const size_t set_bytes = offset_[kTensors];
    sets_ = rotation_sets(set_bytes, info, config);
    BENCH_CHECK(cudaMalloc(&slab_, set_bytes * static_cast<size_t>(sets_)));
    // Scratch for strategies that materialize the latent (allocated once, like a real caller).
    // Sized for every strategy, so that any of them can be forced.
    Options cuda;
    cuda.backend = Backend::kCuda;
    for (Strategy s : {Strategy::kAuto, Strategy::kCudaGemm, Strategy::kCudaDecode}) {
      cuda.strategy = s;
      workspace_bytes_ = std::max(workspace_bytes_, workspace_size(problem, cuda));
    }
    if (workspace_bytes_ > 0) BENCH_CHECK(cudaMalloc(&workspace_, workspace_bytes_));

    // Everything on stream_, which does not order with the legacy default stream that plain
    // cudaMemcpy uses (a device-to-device cudaMemcpy would not even wait for the host).
    const std::vector<float>* host[] = {&inputs.hidden, &inputs.w_down, &inputs.w_up_k,
                                        &inputs.w_up_v};
    for (int i = 0; i < kOut; ++i) {
      const std::vector<unsigned char> bytes = testing::to_bytes(*host[i], problem.dtype);
      BENCH_CHECK(cudaMemcpyAsync(slab_ + offset_[i], bytes.data(), bytes.size(),
                                 cudaMemcpyHostToDevice, stream_));
      BENCH_CHECK(cudaStreamSynchronize(stream_));  // before `bytes` goes away
    }
    for (int s = 1; s < sets_; ++s) {
      BENCH_CHECK(cudaMemcpyAsync(slab_ + s * set_bytes, slab_, offset_[kOut],
                                 cudaMemcpyDeviceToDevice, stream_));
    }
    BENCH_CHECK(cudaStreamSynchronize(stream_));
  }
  ~CudaTarget() override {
    cudaFree(slab_);
    cudaFree(workspace_);
  }

  int input_sets() const override { return sets_; }
  Args args(int set) override {
    char* base = slab_ + static_cast<size_t>(set) * offset_[kTensors];
    Args a = contiguous_args(problem_, base + offset_[kHidden], base + offset_[kWDown],
                             base + offset_[kWUpK], base + offset_[kWUpV], base + offset_[kOut]);
    a.workspace = workspace_;
    a.workspace_bytes = workspace_bytes_;
    return a;
  }
  Stream stream() const override { return stream_; }

  void poison_output() override {
    // All-ones bytes are NaN in float32, bfloat16 and float16 alike.
    BENCH_CHECK(cudaMemsetAsync(slab_ + offset_[kOut], 0xFF, bytes_[kOut], stream_));
  }
  std::vector<float> read_output() override {
    return read_device(slab_ + offset_[kOut], bytes_[kOut], problem_.dtype, stream_);
  }

  bool has_baseline() const override { return true; }
  void run_baseline(int set) override { baseline_.run(args(set)); }

  Status time(const CallFn& call, PathResult* path) override {
    return time_on_gpu(stream_, config_, sets_, call, path);
  }

  void describe(CaseResult* result) const override {
    result->device = info_.name;
    result->baseline_name = "cublas-3gemm+stack";
    result->calls_per_graph = graph_calls(config_, sets_);
    result->launch_floor_graph_us = info_.empty_graph.median_us;
    result->launch_floor_loop_us = info_.empty_loop.median_us;
    // The floor: the launch of one kernel, the minimum bytes at the measured copy bandwidth, or
    // the FLOPs at the measured cuBLAS rate, whichever is largest.
    Floor floor{info_.empty_graph.median_us, "launch"};
    const double memory_us = problem_.min_bytes() / (info_.copy_gb_per_s * 1e3);
    if (memory_us > floor.us) floor = {memory_us, "memory"};
    const auto rate = info_.gemm_tflop_per_s.find(problem_.dtype);
    if (rate != info_.gemm_tflop_per_s.end()) {
      const double compute_us = problem_.flops() / (rate->second * 1e6);
      if (compute_us > floor.us) floor = {compute_us, "compute"};
    }
    result->floor = floor;
  }

 private:
  enum TensorIndex { kHidden, kWDown, kWUpK, kWUpV, kOut, kTensors };

  Problem problem_;
  TimingConfig config_;
  const GpuInfo& info_;
  Stream stream_;
  CublasBaseline baseline_;
  size_t bytes_[kTensors] = {};
  size_t offset_[kTensors + 1] = {};  // within one input set; offset_[kTensors] = the set's size
  int sets_ = 1;
  char* slab_ = nullptr;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;  // sets_ input sets back to back
};

// Median GPU time of one `enqueue`, a few warm-up runs first: for the ceilings, whose single
// operations are long enough (100s of us) that one-at-a-time event timing is exact enough.
double median_gpu_us(Stream stream, const std::function<void()>& enqueue) {
  TimingConfig few;
  few.warmup = 2;
  few.iters = 10;
  few.seconds = 0.5;
  return sample_repeatedly(few, [&] { return 1e3 * time_once_ms(stream, enqueue); }).median_us;
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
double measure_copy_gb_per_s(Stream stream) {
  DeviceBuffer from(kCopyBytes), to(kCopyBytes);
  BENCH_CHECK(cudaMemsetAsync(from.ptr, 0x5A, kCopyBytes, stream));
  const double us = median_gpu_us(stream, [&] {
    BENCH_CHECK(cudaMemcpyAsync(to.ptr, from.ptr, kCopyBytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * kCopyBytes / (us * 1e3);
}

// cuBLAS rate on a large square GEMM of random data, fp32 accumulation (the rate the fused path's
// arithmetic is compared with).
double measure_gemm_tflop_per_s(DType dtype, Stream stream) {
  const size_t bytes = static_cast<size_t>(kGemmSize * kGemmSize * element_size(dtype));
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  fill_uniform(a.ptr, dtype, kGemmSize * kGemmSize, 1, stream);
  fill_uniform(b.ptr, dtype, kGemmSize * kGemmSize, 2, stream);
  const CublasHandle handle(stream);
  const double us = median_gpu_us(stream, [&] {
    cublas_gemm(handle.get(), dtype, kGemmSize, kGemmSize, kGemmSize, a.ptr, b.ptr, c.ptr);
  });
  return 2.0 * kGemmSize * kGemmSize * kGemmSize / (us * 1e6);
}

}  // namespace

GpuSession::GpuSession(const TimingConfig& config, const std::vector<DType>& dtypes,
                       const ProgressFn& progress)
    : config_(config) {
  BENCH_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  info_.name = prop.name;
  info_.sm_count = prop.multiProcessorCount;
  info_.compute_major = prop.major;
  info_.compute_minor = prop.minor;
  info_.l2_bytes = prop.l2CacheSize;
  // Not the legacy default stream: graph capture needs a stream of its own.
  cudaStream_t stream = nullptr;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;

  progress("launch floor");
  const CallFn empty = [&](int) {
    empty_kernel<<<1, 1, 0, stream_>>>();
    BENCH_CHECK_LAUNCH();
    return Status::Ok();
  };
  // Load the kernel's module (lazy loading) before capture, as the cases' own check runs do.
  empty(0);
  BENCH_CHECK(cudaStreamSynchronize(stream_));
  time_graph(stream_, config_, config_.calls_per_graph, 1, empty, &info_.empty_graph);
  time_loop(stream_, config_, std::max(config_.calls_per_graph, kLoopCalls), 1, empty,
            &info_.empty_loop);
  progress("copy bandwidth");
  info_.copy_gb_per_s = measure_copy_gb_per_s(stream_);
  for (DType dtype : dtypes) {
    if (info_.gemm_tflop_per_s.count(dtype)) continue;
    progress(std::string("GEMM rate, ") + to_string(dtype));
    info_.gemm_tflop_per_s[dtype] = measure_gemm_tflop_per_s(dtype, stream_);
  }
}

GpuSession::~GpuSession() { cudaStreamDestroy(stream_); }

std::unique_ptr<Target> GpuSession::make_target(const Problem& problem,
                                                const testing::HostInputs& inputs) {
  return std::make_unique<CudaTarget>(problem, inputs, config_, info_, stream_);
}

}  // namespace latentkv::bench
