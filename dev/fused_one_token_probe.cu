// Probe (written for issue 17 on 2026-12-01 and run that day: docs/experiments.md, 17:24 UTC). Its
// kernel became src/cuda/fused_fp32_one_token.cu, which is the one to change; this file keeps the
// variants the probe compared (G, tokens) as the record of that experiment. How fast can the
// founding projection run at one to four tokens with a short chain? cuda-fused's streaming
// configuration takes 4.57 us at T=1 (two blocks; after its one round trip, partials through
// shared memory, barriers, a 16-way and an 8-way sum), while dev/founding_chain_probe.cu reads
// one fresh round trip over the same bytes at 1.33 us. Here G blocks of 256 threads each compute
// the whole latent (w_down is 48 KB: every block reads all of it, from L2 after the first) and
// then 2N / G of the up projection's [K | V] columns:
//   every load at kernel start, into registers: thread d takes hidden[t][d] and w_down row d (12
//   16-byte loads), and its 6..24 rows of its w_up column;
//   down: 48 products per token and thread, summed over the 32 lanes of a warp by a
//   reduce-scatter of shuffles (64 values padded, 62 shuffles, two sums per lane), then over the
//   8 warps through shared memory (one barrier);
//   up: each thread's rows of its column times the latent (shared memory), the 256 / C row
//   slices summed through shared memory (one barrier), one store.
// Founding dims (D=256, R=48, N=128), float32, T = 1 and 4; G = 2, 4, 8, 16; timed like
// latentkv-bench (a CUDA graph of 64 calls over input sets rotated past the L2, median of 21
// replays) and on one set; checked against a float64 reference on set 0.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/fused_one_token_probe.cu \
//        -o fused_one_token_probe
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "probe_timing.h"

namespace {

constexpr int kD = 256, kR = 48, kN = 128, kCols = 2 * kN;  // founding dims; [K | V] columns
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPadded = 64;  // R rounded up to the reduce-scatter's power of two
static_assert(kD == kThreads, "thread d owns row d of w_down");
static_assert(kR % 4 == 0 && kR <= kPadded, "w_down rows as 16-byte vectors");

// One input set: hidden [T][D], w_down [D][R], w_up [R][2N] ([w_up_k | w_up_v] side by side).
struct Set {
  const float* hidden;
  const float* w_down;
  const float* w_up;
};

// One level of the reduce-scatter: lanes that differ in `kBit` swap halves of v[0..2 kHalf),
// each keeping the half its bit selects and adding its partner's copy of it into v[0..kHalf).
template <int kHalf, int kBit>
__device__ __forceinline__ void reduce_scatter_level(float (&v)[kPadded], int lane) {
  const bool upper = lane & kBit;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kBit);
  }
}

// Sums v[0..kPadded) over the warp's lanes; lane l ends with the sums of values 2l and 2l + 1 in
// v[0] and v[1] (62 shuffles).
__device__ __forceinline__ void reduce_scatter(float (&v)[kPadded]) {
  const int lane = threadIdx.x % 32;
  reduce_scatter_level<32, 16>(v, lane);
  reduce_scatter_level<16, 8>(v, lane);
  reduce_scatter_level<8, 4>(v, lane);
  reduce_scatter_level<4, 2>(v, lane);
  reduce_scatter_level<2, 1>(v, lane);
}

// kTokens tokens, kBlockCols [K | V] columns per block (gridDim.x = kCols / kBlockCols).
template <int kTokens, int kBlockCols>
__global__ void __launch_bounds__(kThreads) one_token_kernel(Set s, float* out) {
  constexpr int kSlices = kThreads / kBlockCols;              // row slices of the up projection
  constexpr int kSliceRows = (kR + kSlices - 1) / kSlices;  // rows of w_up per thread
  __shared__ float warp_sums[kTokens][kWarps][kPadded];
  __shared__ float latent[kTokens][kR];
  __shared__ float up_partial[kTokens][kSlices][kBlockCols];
  const int d = threadIdx.x, lane = d % 32, warp = d / 32;
  const int col = blockIdx.x * kBlockCols + d % kBlockCols, slice = d / kBlockCols;

  // Every load first.
  float h[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) h[t] = s.hidden[t * kD + d];
  float4 w[kR / 4];
#pragma unroll
  for (int q = 0; q < kR / 4; ++q) w[q] = reinterpret_cast<const float4*>(s.w_down + d * kR)[q];
  float u[kSliceRows];
#pragma unroll
  for (int i = 0; i < kSliceRows; ++i) {
    const int r = slice * kSliceRows + i;
    u[i] = r < kR ? s.w_up[r * kCols + col] : 0.f;
  }

  // Down: the warp's sums by reduce-scatter, then the 8 warps' through shared memory.
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float v[kPadded];
#pragma unroll
    for (int q = 0; q < kR / 4; ++q) {
      v[4 * q + 0] = h[t] * w[q].x;
      v[4 * q + 1] = h[t] * w[q].y;
      v[4 * q + 2] = h[t] * w[q].z;
      v[4 * q + 3] = h[t] * w[q].w;
    }
#pragma unroll
    for (int i = kR; i < kPadded; ++i) v[i] = 0.f;
    reduce_scatter(v);
    warp_sums[t][warp][2 * lane] = v[0];
    warp_sums[t][warp][2 * lane + 1] = v[1];
  }
  __syncthreads();
  for (int i = d; i < kTokens * kR; i += kThreads) {
    const int t = i / kR, r = i % kR;
    float sum = 0.f;
#pragma unroll
    for (int w8 = 0; w8 < kWarps; ++w8) sum += warp_sums[t][w8][r];
    latent[t][r] = sum;
  }
  __syncthreads();

  // Up: this thread's rows of its column, then the slices' sums.
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kSliceRows; ++i) {
      const int r = slice * kSliceRows + i;
      if (r < kR) acc = fmaf(latent[t][r], u[i], acc);
    }
    up_partial[t][slice][d % kBlockCols] = acc;
  }
  __syncthreads();
  for (int i = d; i < kTokens * kBlockCols; i += kThreads) {
    const int t = i / kBlockCols, c = i % kBlockCols;
    float sum = 0.f;
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl) sum += up_partial[t][sl][c];
    const int j = blockIdx.x * kBlockCols + c;  // [2][T][N]: K then V
    out[(j / kN) * kTokens * kN + t * kN + j % kN] = sum;
  }
}

}  // namespace

int main() {
  constexpr int kSets = 1024, kMaxTokens = 4;
  constexpr size_t kSetFloats = size_t{kMaxTokens} * kD + size_t{kD} * kR + size_t{kR} * kCols;
  std::vector<float> host(size_t{kSets} * kSetFloats);
  std::mt19937 rng(20261201);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  for (float& x : host) x = uni(rng);
  float* sets = nullptr;
  CK(cudaMalloc(&sets, host.size() * sizeof(float)));
  CK(cudaMemcpy(sets, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  float* out = nullptr;
  CK(cudaMalloc(&out, 2 * kMaxTokens * kN * sizeof(float)));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  auto set_at = [&](int i) {
    const float* base = sets + size_t(i) * kSetFloats;
    return Set{base, base + kMaxTokens * kD, base + kMaxTokens * kD + kD * kR};
  };

  // Max relative error on set 0 against float64, then fresh (1024 sets) and one-set times.
  auto report = [&](const char* name, int tokens, auto launch) -> int {
    CK(cudaMemset(out, 0xff, 2 * kMaxTokens * kN * sizeof(float)));  // NaN
    launch(set_at(0));
    std::vector<float> got(2 * tokens * kN);
    CK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const float* h = host.data();
    const float* wd = h + kMaxTokens * kD;
    const float* wu = wd + kD * kR;
    double err = 0, scale = 0;
    for (int t = 0; t < tokens; ++t) {
      double lat[kR] = {};
      for (int r = 0; r < kR; ++r) {
        for (int d = 0; d < kD; ++d) lat[r] += double(h[t * kD + d]) * wd[d * kR + r];
      }
      for (int j = 0; j < kCols; ++j) {
        double ref = 0;
        for (int r = 0; r < kR; ++r) ref += lat[r] * wu[r * kCols + j];
        const double g = got[(j / kN) * tokens * kN + t * kN + j % kN];
        err = std::isnan(g) ? INFINITY : std::fmax(err, std::fabs(g - ref));
        scale = std::fmax(scale, std::fabs(ref));
      }
    }
    float fresh = 0, reused = 0;
    if (graph_us_per_call(stream, 64, [&](int c) { launch(set_at(c % kSets)); }, &fresh)) return 1;
    if (graph_us_per_call(stream, 64, [&](int) { launch(set_at(0)); }, &reused)) return 1;
    CK(cudaGetLastError());
    printf("%-22s T=%d  err %.2e  fresh %6.2f us  one set %6.2f us\n", name, tokens, err / scale,
           fresh, reused);
    return 0;
  };
  auto variant = [&](auto tokens_c, auto cols_c, const char* name) -> int {
    constexpr int kT = decltype(tokens_c)::value, kC = decltype(cols_c)::value;
    return report(name, kT, [&](Set s) {
      one_token_kernel<kT, kC><<<kCols / kC, kThreads, 0, stream>>>(s, out);
    });
  };
  using I1 = std::integral_constant<int, 1>;
  using I4 = std::integral_constant<int, 4>;
  using C128 = std::integral_constant<int, 128>;
  using C64 = std::integral_constant<int, 64>;
  using C32 = std::integral_constant<int, 32>;
  using C16 = std::integral_constant<int, 16>;
  printf("founding dims D=%d R=%d N=%d float32, %d sets rotated against one set\n", kD, kR, kN,
         kSets);
  if (variant(I1{}, C128{}, "2 blocks x 128 cols") || variant(I1{}, C64{}, "4 blocks x 64 cols") ||
      variant(I1{}, C32{}, "8 blocks x 32 cols") || variant(I1{}, C16{}, "16 blocks x 16 cols") ||
      variant(I4{}, C64{}, "4 blocks x 64 cols") || variant(I4{}, C32{}, "8 blocks x 32 cols")) {
    return 1;
  }
  CK(cudaFree(sets));
  CK(cudaFree(out));
  CK(cudaStreamDestroy(stream));
  return 0;
}
