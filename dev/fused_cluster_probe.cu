// Dev probe (not shipped): cuda-fused's cluster configuration at each cluster size (1, 2, 4, 8),
// at the founding dims for a few T (the bulk-copy load path it also compared is gone from src/:
// docs/experiments.md has its numbers): each variant checked against a float64 reference on one input set, then timed as latentkv-bench does (a graph of
// calls over input sets rotated past 3x the L2, replays timed with events, median per call).
//   build: cmake --build build-founding --target latentkv, then
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
//     dev/fused_cluster_probe.cu build-founding/src/liblatentkv.a -lcublas -lcublasLt -o probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "cuda/device_facts.h"
#include "cuda/fused_fp32_cluster.h"
#include "latentkv/latentkv.h"
#include "probe_timing.h"

namespace lk = latentkv;

// Median per-call time of `calls` calls captured in `exec`, over 20 replays after 5 warm-ups.
float median_replay_us(cudaGraphExec_t exec, cudaStream_t stream, int calls) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> per_call;
  for (int rep = 0; rep < 25; ++rep) {
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep >= 5) per_call.push_back(1000.f * ms / calls);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

int probe(int64_t T) {
  const lk::Problem p{1, T, 256, 48, 4, 32, lk::DType::kFloat32};
  const int64_t D = p.model_dim, R = p.rank, N = p.kv_width();
  const int64_t set_floats = T * D + D * R + 2 * R * N + 2 * T * N;
  const int sets = static_cast<int>(std::min<int64_t>(1024, 180'000'000 / (4 * set_floats) + 1));
  std::mt19937 rng(static_cast<unsigned>(T));
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> host(static_cast<size_t>(set_floats * sets));
  for (float& v : host) v = u(rng);
  float* dev = nullptr;
  CK(cudaMalloc(&dev, host.size() * 4));
  CK(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  auto args_of = [&](int s) {
    float* base = dev + s * set_floats;
    lk::Args a;
    a.hidden = base;
    a.w_down = base + T * D;
    a.w_up_k = base + T * D + D * R;
    a.w_up_v = base + T * D + D * R + R * N;
    a.out = base + T * D + D * R + 2 * R * N;
    a.hidden_stride_seq = D;
    a.hidden_stride_batch = T * D;
    a.w_down_stride_row = R;
    a.w_up_k_stride_row = a.w_up_v_stride_row = N;
    a.out_stride_head = p.head_dim;
    a.out_stride_seq = N;
    a.out_stride_batch = T * N;
    a.out_stride_kv = T * N;
    return a;
  };
  // float64 reference of set 0.
  const float* h = host.data();
  const float *wd = h + T * D, *wk = wd + D * R, *wv = wk + R * N;
  std::vector<double> ref(static_cast<size_t>(2 * T * N));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> lat(static_cast<size_t>(R), 0.0);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t r = 0; r < R; ++r) lat[r] += double(h[t * D + d]) * wd[d * R + r];
    for (int64_t j = 0; j < N; ++j) {
      double k = 0, v = 0;
      for (int64_t r = 0; r < R; ++r) k += lat[r] * wk[r * N + j], v += lat[r] * wv[r * N + j];
      ref[t * N + j] = k;
      ref[T * N + t * N + j] = v;
    }
  }
  const lk::detail::DeviceFacts* f = nullptr;
  if (!lk::detail::current_device_facts(&f).ok()) return 1;
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  for (int blocks : {1, 2, 4, 8}) {
    std::vector<float> out(static_cast<size_t>(2 * T * N));
    const lk::Args a0 = args_of(0);
    CK(cudaMemset(a0.out, 0xFF, out.size() * 4));
    lk::Status s = lk::detail::run_fused_cluster(p, a0, *f, stream, blocks);
    if (!s.ok()) {
      printf("T=%lld C=%d: %s\n", (long long)T, blocks, s.message().c_str());
      continue;
    }
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(out.data(), a0.out, out.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double diff = std::isfinite(out[i]) ? out[i] - ref[i] : 1e30;
      num += diff * diff;
      den += ref[i] * ref[i];
    }
    const int calls = std::max(sets, 64) / sets * sets;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < calls; ++c) {
      (void)lk::detail::run_fused_cluster(p, args_of(c % sets), *f, stream, blocks);
    }
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    printf("T=%-5lld C=%d err %.2e  %.2f us/call (%d calls, %d sets)\n", (long long)T,
           blocks, std::sqrt(num / den),
           median_replay_us(exec, stream, calls), calls, sets);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }
  CK(cudaFree(dev));
  return 0;
}

__global__ void empty_kernel() {}

// An empty kernel of `blocks` blocks per graph node, plain or as one cluster of `cluster` blocks:
// what a cluster launch itself costs.
int empty_launch(int blocks, int cluster) {
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(256);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster;
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = cluster > 0 ? 1 : 0;
  constexpr int kCalls = 256;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < kCalls; ++c) CK(cudaLaunchKernelEx(&config, empty_kernel));
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  printf("empty kernel, %d blocks, cluster %d: %.3f us/call\n", blocks, cluster,
         median_replay_us(exec, stream, kCalls));
  return 0;
}

int main() {
  for (const auto& [blocks, cluster] : {std::pair{8, 0}, {8, 8}, {128, 0}, {128, 8}}) {
    if (empty_launch(blocks, cluster) != 0) return 1;
  }
  for (int64_t T : {1, 64, 384, 733, 6144}) {
    if (probe(T) != 0) return 1;
  }
  return 0;
}
