// Latency and throughput of mma.sync on the running GPU: one block of 1, 4 or 8 warps on one SM,
// clock64 around 256 MMAs per warp, m16n8k8 tf32 and m16n8k16 bf16, dependent (one accumulator)
// and independent (8 chains). Asked whether cuda-fused's 3xTF32 experiment
// (dev/fused_3xtf32_experiment.patch) was bound by its MMA chains (H200, 2026-12-02: no; 24
// cycles dependent, 7.6 per MMA over 8 chains, in both types; docs/experiments.md, session 9).
// Build: nvcc -O3 -arch=sm_90a -o /tmp/tf32_mma_probe dev/tf32_mma_probe.cu
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

template <bool kTf32>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (kTf32) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool kTf32, int kChains>
__global__ void chain(float* out, long long* cycles, uint32_t seed) {
  constexpr int kSteps = 256;
  uint32_t a[4] = {seed, seed + 1, seed + 2, seed + 3};
  float d[kChains][4] = {};
  __syncwarp();
  const long long t0 = clock64();
  for (int s = 0; s < kSteps / kChains; ++s) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) mma<kTf32>(d[c], a, seed + c, seed - c);
  }
  __syncwarp();
  const long long t1 = clock64();
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) sum += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[threadIdx.x] = sum;
  if (threadIdx.x == 0) *cycles = t1 - t0;
}

template <bool kTf32, int kChains>
void measure(const char* name, int warps) {
  float* out;
  long long* cycles;
  cudaMalloc(&out, 4096 * sizeof(float));
  cudaMalloc(&cycles, sizeof(long long));
  chain<kTf32, kChains><<<1, 32 * warps>>>(out, cycles, 0x3f800000u);
  chain<kTf32, kChains><<<1, 32 * warps>>>(out, cycles, 0x3f800000u);
  long long c = 0;
  cudaMemcpy(&c, cycles, sizeof c, cudaMemcpyDeviceToHost);
  printf("%-6s chains=%d warps=%d: %.1f cycles per mma per warp (256 mma)\n", name, kChains, warps,
         c / 256.0);
  cudaFree(out);
  cudaFree(cycles);
}

int main() {
  measure<true, 1>("tf32", 1);
  measure<true, 8>("tf32", 1);
  measure<true, 8>("tf32", 4);
  measure<true, 8>("tf32", 8);
  measure<false, 1>("bf16", 1);
  measure<false, 8>("bf16", 1);
  measure<false, 8>("bf16", 8);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
