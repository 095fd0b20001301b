// Probe (not shipped): can a cooperative launch carry thread-block clusters on this device and
// driver, can it be captured in a CUDA graph, and what does one grid-wide barrier cost at one
// block per SM? Answers decide the shape of the single-kernel decode (docs/experiments.md).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/grid_sync_probe.cu -o probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) printf("  %s -> %s\n", #x, cudaGetErrorString(e));          \
  } while (0)

__global__ void syncs(int n, int* sink) {
  extern __shared__ int smem[];
  cg::grid_group grid = cg::this_grid();
  for (int i = 0; i < n; ++i) grid.sync();
  if (threadIdx.x == 0 && sink) smem[0] = blockIdx.x, sink[blockIdx.x] = smem[0];
}

__global__ void __cluster_dims__(1, 8, 1) cluster_syncs(int n, int* sink) {
  extern __shared__ int smem[];
  cg::grid_group grid = cg::this_grid();
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  for (int i = 0; i < n; ++i) grid.sync();
  if (threadIdx.x == 0 && sink) smem[0] = blockIdx.x, sink[blockIdx.x + blockIdx.y * gridDim.x] = smem[0];
}

template <typename K>
cudaError_t launch(K kernel, dim3 grid, size_t smem, bool coop, int n, int* sink, cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t c = {};
  c.gridDim = grid;
  c.blockDim = dim3(256);
  c.dynamicSmemBytes = smem;
  c.stream = s;
  c.attrs = attr;
  c.numAttrs = coop ? 1 : 0;
  return cudaLaunchKernelEx(&c, kernel, n, sink);
}

template <typename K>
float graph_time(K kernel, dim3 grid, size_t smem, bool coop, int n, int* sink, cudaStream_t s) {
  const int calls = 20;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) CHECK(launch(kernel, grid, smem, coop, n, sink, s));
  CHECK(cudaStreamEndCapture(s, &g));
  if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
    printf("  instantiate failed\n");
    return -1;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int r = 0; r < 60; ++r) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (r >= 10) t.push_back(ms * 1000 / calls);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  cudaStream_t s;
  cudaStreamCreate(&s);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int* sink;
  cudaMalloc(&sink, 4096 * sizeof(int));
  const size_t smem = 120 * 1024;  // one block per SM
  CHECK(cudaFuncSetAttribute(syncs, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(cluster_syncs, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  printf("SMs %d\n", sms);
  for (int n : {0, 1, 2, 4}) {
    printf("plain grid %d, %d grid.sync: %.2f us/call (graph)\n", sms, n,
           graph_time(syncs, dim3(sms), smem, true, n, sink, s));
  }
  printf("plain grid %d non-cooperative no sync: %.2f us/call\n", sms,
         graph_time(syncs, dim3(sms), smem, false, 0, sink, s));
  // Clusters of 8 along y: 16 x 8 = 128 blocks.
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(16, 8);
  c.blockDim = dim3(256);
  c.dynamicSmemBytes = smem;
  int clusters = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&clusters, cluster_syncs, &c));
  printf("max active clusters of 8 at %zu B smem: %d\n", smem, clusters);
  cudaError_t e = launch(cluster_syncs, dim3(16, 8), smem, true, 1, sink, s);
  printf("cooperative + cluster launch: %s\n", cudaGetErrorString(e));
  e = cudaStreamSynchronize(s);
  printf("  sync: %s\n", cudaGetErrorString(e));
  if (e == cudaSuccess) {
    for (int n : {0, 1, 2}) {
      printf("cluster grid 128, %d grid.sync: %.2f us/call (graph)\n", n,
             graph_time(cluster_syncs, dim3(16, 8), smem, true, n, sink, s));
    }
  }
  printf("cluster non-cooperative, no sync: %.2f us/call\n",
         graph_time(cluster_syncs, dim3(16, 8), smem, false, 0, sink, s));
  return 0;
}
