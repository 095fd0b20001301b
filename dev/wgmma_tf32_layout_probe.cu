// Probe (issue 17): the readings of wgmma's tf32 operands that dev/fused_wgmma_3xtf32_probe.cu and
// dev/fused_wgmma_configuration.patch rest on, checked one instruction at a time, so that a wrong
// one is named instead of showing as a wrong projection:
//   A from registers: lane (g, q) of warp w holds A[16 w + g][q], A[16 w + g + 8][q],
//     A[16 w + g][q + 4], A[16 w + g + 8][q + 4] (CuTe's ALayout_64x8);
//   D: d[4 j + 2 h + i] is D[16 w + g + 8 h][8 j + 2 q + i] (CLayout_64xN);
//   B from shared memory, K-major, no swizzle: element (n, k) at (n / 8) SBO + (k / 4) LBO +
//     (n % 8) 16 + (k % 4) 4 bytes, LBO the offset between core matrices along K (here 128: they
//     are adjacent), SBO between 8-row groups of N;
//   the tf32 inputs read as their top 19 bits (the low 13 ignored, as by mma.sync), so that
//   3xTF32 with unrounded small halves reaches ~1e-6.
// Cases, one m64n24k8 (three 8-row groups of N, two core matrices along K) each:
//   exact: small integers (exact in tf32), the descriptor as read and with LBO and SBO swapped;
//     the error of each (0 where the reading is right);
//   one-hot: B = 1 at a single (k, n), A[m][k] = 8 m + k (exact in tf32, and naming m and k): for
//     each of a few (k, n) the output columns the 1 lands in and D's rows 0, 9 and 17 there, as a
//     map of the layout when the exact case fails;
//   3xtf32: random floats, x = big + small (big = x & 0xffffe000, small = x - big unrounded), three
//     wgmma into one accumulator, against float64: ~1e-6 when the low bits are ignored.
// Build and run (GPU machine): part of dev/fused_wgmma_run.sh, or
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/wgmma_tf32_layout_probe.cu \
//     -o /tmp/wgmma_layout && /tmp/wgmma_layout
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "probe_timing.h"

namespace {

constexpr int kM = 64, kN = 24, kK = 8;

__device__ __forceinline__ void wgmma_m64n24k8(float (&d)[12], const uint32_t (&a)[4],
                                               uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n24k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, %16, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32);
}

// d = sum over kTerms of a_t @ b_t: a [kTerms][64][8] and b [kTerms][8][24] as float bit
// patterns, B stored in the layout above, read with the given offsets; d [64][24] by the D reading
// above. The terms are a compile-time count so that every A fragment is in registers before the
// one wgmma.fence (PTX: registers a wgmma reads must be written before the fence).
template <int kTerms>
__global__ void one_wgmma(const uint32_t* a, const uint32_t* b, uint32_t lbo, uint32_t sbo,
                          float* d) {
  __shared__ __align__(128) uint32_t b_smem[kTerms][kN * kK];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    for (int i = tid; i < kN * kK; i += 128) {
      const int n = i / kK, k = i % kK;
      // The layout in bytes, with the probe's fixed geometry: core matrices adjacent along K
      // (128 B apart) and 8-row groups 256 B apart; the descriptor's fields say how it is read.
      b_smem[t][(n / 8) * 64 + (k / 4) * 32 + (n % 8) * 4 + k % 4] = b[(t * kK + k) * kN + n];
    }
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = 0.f;
  uint32_t frag[kTerms][4];
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    const uint32_t* at = a + t * kM * kK;
    const int r = 16 * warp + g;
    frag[t][0] = at[r * kK + q];
    frag[t][1] = at[(r + 8) * kK + q];
    frag[t][2] = at[r * kK + q + 4];
    frag[t][3] = at[(r + 8) * kK + q + 4];
  }
  for (int i = 0; i < 12; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(b_smem[t]));
    wgmma_m64n24k8(acc, frag[t], descriptor(address, lbo, sbo));
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  for (int i = 0; i < 12; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  for (int j = 0; j < kN / 8; ++j) {
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 2; ++i) {
        d[(16 * warp + g + 8 * h) * kN + 8 * j + 2 * q + i] = acc[4 * j + 2 * h + i];
      }
    }
  }
}

uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
float value(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// Runs one_wgmma on host a and b (kTerms of each) and returns d.
template <int kTerms>
int run(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, uint32_t lbo, uint32_t sbo,
        std::vector<float>* d) {
  uint32_t *da = nullptr, *db = nullptr;
  float* dd = nullptr;
  CK(cudaMalloc(&da, a.size() * 4));
  CK(cudaMalloc(&db, b.size() * 4));
  CK(cudaMalloc(&dd, kM * kN * 4));
  CK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dd, 0xFF, kM * kN * 4));
  one_wgmma<kTerms><<<1, 128>>>(da, db, lbo, sbo, dd);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  d->resize(kM * kN);
  CK(cudaMemcpy(d->data(), dd, kM * kN * 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dd));
  return 0;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  // exact: small integers.
  std::vector<uint32_t> a(kM * kK), b(kK * kN);
  std::vector<double> ref(kM * kN, 0.0);
  std::uniform_int_distribution<int> small_int(-8, 8);
  std::vector<float> af(kM * kK), bf(kK * kN);
  for (int i = 0; i < kM * kK; ++i) a[i] = bits(af[i] = static_cast<float>(small_int(rng)));
  for (int i = 0; i < kK * kN; ++i) b[i] = bits(bf[i] = static_cast<float>(small_int(rng)));
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      for (int k = 0; k < kK; ++k) ref[m * kN + n] += double(af[m * kK + k]) * bf[k * kN + n];
    }
  }
  std::vector<float> d;
  for (int swap = 0; swap < 2; ++swap) {
    const uint32_t lbo = swap ? 256 : 128, sbo = swap ? 128 : 256;
    if (run<1>(a, b, lbo, sbo, &d)) return 1;
    double worst = 0;
    int nans = 0;
    for (int i = 0; i < kM * kN; ++i) {
      if (std::isnan(d[i])) ++nans;
      else worst = std::max(worst, std::fabs(d[i] - ref[i]));
    }
    printf("exact    LBO=%3u SBO=%3u  max |err| %.3g  unwritten %d  %s\n", lbo, sbo, worst, nans,
           worst == 0 && nans == 0 ? "RIGHT" : "wrong");
  }
  // one-hot: where B's single 1 lands.
  for (const auto& kn : {std::pair<int, int>{0, 0}, {1, 0}, {4, 0}, {5, 3}, {0, 8}, {7, 17}}) {
    std::vector<uint32_t> a1(kM * kK), b1(kK * kN, bits(0.f));
    for (int m = 0; m < kM; ++m) {
      for (int k = 0; k < kK; ++k) a1[m * kK + k] = bits(static_cast<float>(8 * m + k));
    }
    b1[kn.first * kN + kn.second] = bits(1.f);
    if (run<1>(a1, b1, 128, 256, &d)) return 1;
    printf("one-hot  B[k=%d][n=%2d] = 1:", kn.first, kn.second);
    int shown = 0;
    for (int n = 0; n < kN && shown < 3; ++n) {
      if (d[0 * kN + n] != 0.f || d[9 * kN + n] != 0.f) {
        printf("  column %d: D[0] %.0f D[9] %.0f D[17] %.0f", n, d[n], d[9 * kN + n],
               d[17 * kN + n]);
        ++shown;
      }
    }
    printf("%s   (expected column %d: %d %d %d)\n", shown ? "" : "  nothing", kn.second,
           kn.first, 72 + kn.first, 136 + kn.first);
  }
  // 3xTF32 on random floats.
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::vector<uint32_t> a3(3 * kM * kK), b3(3 * kK * kN);
  std::fill(ref.begin(), ref.end(), 0.0);
  for (int i = 0; i < kM * kK; ++i) af[i] = unit(rng);
  for (int i = 0; i < kK * kN; ++i) bf[i] = unit(rng);
  const auto big = [](float x) { return bits(x) & 0xffffe000u; };
  const auto small = [&](float x) { return bits(x - value(big(x))); };
  for (int i = 0; i < kM * kK; ++i) {  // terms: small(a) big(b), big(a) small(b), big(a) big(b)
    a3[i] = small(af[i]);
    a3[kM * kK + i] = big(af[i]);
    a3[2 * kM * kK + i] = big(af[i]);
  }
  for (int i = 0; i < kK * kN; ++i) {
    b3[i] = big(bf[i]);
    b3[kK * kN + i] = small(bf[i]);
    b3[2 * kK * kN + i] = big(bf[i]);
  }
  double scale = 0;
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      for (int k = 0; k < kK; ++k) ref[m * kN + n] += double(af[m * kK + k]) * bf[k * kN + n];
      scale = std::max(scale, std::fabs(ref[m * kN + n]));
    }
  }
  if (run<3>(a3, b3, 128, 256, &d)) return 1;
  double worst = 0;
  for (int i = 0; i < kM * kN; ++i) worst = std::max(worst, std::fabs(d[i] - ref[i]));
  printf("3xtf32   max |err| / max |ref| %.2e  (1xTF32 would be ~1e-3; the kernels need <= 1e-5)\n",
         worst / scale);
  return 0;
}
