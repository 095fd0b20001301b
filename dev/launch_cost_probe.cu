// Host cost of one latentkv::run() on the GPU machine's host, against the launch of an empty kernel,
// to say what a call from Python can at best cost there. Each step is timed per call (the stream
// drained between calls, so no launch waits on a full queue) and back to back (per call over a
// loop, one sync at the end). Record only: not part of the library or its tests.
// Build and run: dev/launch_cost_probe.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "latentkv/latentkv.h"

namespace {

#define PROBE_CHECK(call)                                                              \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(err_));               \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

__global__ void empty_kernel() {}

struct WideParams {  // about the size of the fused kernel's parameter block
  const void* pointers[8];
  long long strides[16];
  int ints[8];
};
__global__ void wide_empty_kernel(WideParams) {}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median host time of one call with the stream drained before each.
double per_call_us(const std::function<void()>& fn, cudaStream_t stream, int calls) {
  std::vector<double> t(calls);
  for (int i = 0; i < calls; ++i) {
    cudaStreamSynchronize(stream);
    const double start = now_us();
    fn();
    t[i] = now_us() - start;
  }
  cudaStreamSynchronize(stream);
  std::nth_element(t.begin(), t.begin() + calls / 2, t.end());
  return t[calls / 2];
}

// Per call over calls back-to-back calls and one sync, median of 5 loops.
double back_to_back_us(const std::function<void()>& fn, cudaStream_t stream, int calls) {
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    cudaStreamSynchronize(stream);
    const double start = now_us();
    for (int i = 0; i < calls; ++i) fn();
    cudaStreamSynchronize(stream);
    t.push_back((now_us() - start) / calls);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

}  // namespace

int main() {
  cudaStream_t stream;
  PROBE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct Case {
    const char* name;
    latentkv::Problem p;
  };
  const Case cases[] = {
      {"founding fp32", {4, 96, 256, 48, 4, 32, latentkv::DType::kFloat32}},
      {"host fp32 (1,1,64,16,1,16)", {1, 1, 64, 16, 1, 16, latentkv::DType::kFloat32}},
  };
  const int calls = 2000;
  std::printf("%-44s %12s %12s\n", "step", "per call us", "b2b us");
  auto row = [&](const char* name, const std::function<void()>& fn) {
    fn();
    const double one = per_call_us(fn, stream, calls);
    const double b2b = back_to_back_us(fn, stream, calls);
    std::printf("%-44s %12.2f %12.2f\n", name, one, b2b);
  };
  int device = 0;
  row("cudaGetDevice", [&] { cudaGetDevice(&device); });
  row("cudaGetLastError", [&] { (void)cudaGetLastError(); });
  row("empty kernel <<<1, 1>>>", [&] { empty_kernel<<<1, 1, 0, stream>>>(); });
  WideParams wide{};
  row("empty kernel, 200-byte parameters, <<<32, 256>>>",
      [&] { wide_empty_kernel<<<32, 256, 0, stream>>>(wide); });

  for (const Case& c : cases) {
    const latentkv::Problem& p = c.p;
    const size_t in = p.batch * p.seq * p.model_dim, wd = p.model_dim * p.rank,
                 wu = p.rank * p.heads * p.head_dim, out = 2 * p.batch * p.seq * p.heads * p.head_dim;
    float *d_in, *d_wd, *d_wk, *d_wv, *d_out;
    PROBE_CHECK(cudaMalloc(&d_in, in * 4));
    PROBE_CHECK(cudaMalloc(&d_wd, wd * 4));
    PROBE_CHECK(cudaMalloc(&d_wk, wu * 4));
    PROBE_CHECK(cudaMalloc(&d_wv, wu * 4));
    PROBE_CHECK(cudaMalloc(&d_out, out * 4));
    PROBE_CHECK(cudaMemset(d_in, 0, in * 4));
    PROBE_CHECK(cudaMemset(d_wd, 0, wd * 4));
    PROBE_CHECK(cudaMemset(d_wk, 0, wu * 4));
    PROBE_CHECK(cudaMemset(d_wv, 0, wu * 4));
    const latentkv::Args a = latentkv::contiguous_args(p, d_in, d_wd, d_wk, d_wv, d_out);
    latentkv::Options o;
    o.backend = latentkv::Backend::kCuda;
    o.stream = stream;
    latentkv::Strategy s;
    if (!latentkv::select_strategy(p, a, o, &s).ok()) return 1;
    std::printf("-- %s: %s\n", c.name, latentkv::to_string(s));
    row("  latentkv::check", [&] { (void)latentkv::check(p, a, o); });
    row("  latentkv::select_strategy", [&] { (void)latentkv::select_strategy(p, a, o, &s); });
    row("  latentkv::run", [&] { (void)latentkv::run(p, a, o); });
    for (float* ptr : {d_in, d_wd, d_wk, d_wv, d_out}) PROBE_CHECK(cudaFree(ptr));
  }
  PROBE_CHECK(cudaStreamDestroy(stream));
  return 0;
}
