// MEASURED 2026-12-05 01:47 UTC (H200; experiments.md, session 22): every variant correct (1-3e-6;
// memcheck 0 errors, racecheck 0 hazards) and no faster than the library anywhere (best: cl4s_c32,
// 6.35 / 7.10 / 7.20 / 7.32 us at T = 1 / 384 / 733 / 1024 against 3.15 / 6.22 / 7.17 / 7.45; the
// one-block variants 1.6-4.2x the library): each block stages and splits all of its weights, a
// fixed cost per 64-token tile. Kept for the record; not shipped.
// Probe (issue 17, the founding widths at every T): cuda-fused's projection on Hopper's wgmma in
// 3xTF32, against the library's kAuto in the same run (at these widths: the register tiles to
// ~500 tokens, the tensor-core configuration to ~1000, the token tiles on mma.sync past that).
//
// Why: ncu of the token tiles at T=6144 (docs/perf.md) reads 3,280 warp instructions per warp at an
// issued IPC of 2.09 with the HMMA pipe at 10.7%: each warp splits its own A and B fragments into
// TF32 halves for every m16n8k8 MMA, so the splits and fragment loads are the kernel. Here the
// weights are split once per block into shared memory (big and small halves, K-major core
// matrices, the layout wgmma reads B from), and each warpgroup splits only its own A fragments in
// registers (wgmma's register-A form): a K step of the down product is 3 wgmma instructions for a
// 64-token x 48 (or 24) tile instead of 16 warps x 30 instructions.
//
// The one-block kernel (founding widths only: D=256, R=48, H*Dh=128, float32, dense rows; T any):
//   block = 2 warpgroups, one 64-token tile, columns [col0, col0 + 2 kWgCols) of [K | V];
//   prologue: w_down^T and the block's columns of [w_up_k | w_up_v]^T, split, into shared memory
//     (core matrices of 8 rows x 16 bytes; LBO = 128 B along K, SBO between 8-row groups); the
//     down warpgroups' hidden fragments (rows g, g+8 of each warp's 16) into registers by 16-byte
//     loads;
//   down: latent [64, 48] = hidden @ w_down; kDownWgs warpgroups, each 48 / kDownWgs columns (or,
//     kSplitDepth, each half of D's K pairs over all 48 columns, the partial tiles added by up), K
//     permuted within each 16 so a lane's four hidden values per 16 are one float4 (the weights
//     are stored in the same permuted order); the accumulators go to shared memory;
//   up: each warpgroup [64, kWgCols] = latent @ its columns, A from the latent tile (K permuted
//     within each 8 so a lane's values are one float2), stores straight from the accumulators.
// The cluster kernels (few tokens) split a tile's work over a cluster of 4 or 8 such blocks, each
// fetching a quarter or an eighth of the weights and of hidden, the partial latents exchanged
// through distributed shared memory (their own comment below).
// 3xTF32: x = big + small, big = x with the low 13 bits cleared; small*big, big*small, big*big
// into one float32 accumulator (small terms first).
// Variants (the table's names): wg2_c128 / wg1_c128 / wg2_c64 / wg2_c32 (down by both warpgroups
// or one; 2 x 128, 64 or 32 columns a block), ks_c128 / ks_c32 (the depth split), cl4_c32 (a
// cluster of 4, a slot per warpgroup: the library patch's), cl4s_c32 / cl8s_c16 (clusters of 4
// and 8 whose blocks sum their warpgroups' partials first), wg2_c128_swap (LBO and SBO swapped: a
// guard on the descriptor reading, exactly one of it and wg2_c128 can be right).
//
// Output: per T, max |err| / max |ref| against float64 for the library and each variant (outputs
// poisoned with NaN first), then the per-call time by graph replay with the inputs rotated over
// 3x L2 as latentkv-bench does, us. Arguments: token counts (default a sweep), --check for the
// errors alone (compute-sanitizer, ncu). The index algebra (layouts, permutations, fragments) is
// emulated on the CPU by dev/fused_wgmma_3xtf32_emulate.py. Build and run (GPU machine):
//   bash dev/fused_wgmma_run.sh
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/ptx.h"  // split_tf32, shared_address, the cluster barrier
#include "latentkv/latentkv.h"
#include "probe_timing.h"

namespace {

using latentkv::detail::cluster_arrive;
using latentkv::detail::cluster_wait;
using latentkv::detail::shared_address;
using latentkv::detail::Split;
using latentkv::detail::split_tf32;

constexpr int kD = 256, kR = 48, kN = 128, kHeads = 4, kHeadDim = 32;  // the founding widths
constexpr int kCols = 2 * kN;          // [K | V] columns
constexpr int kTileTokens = 64;        // wgmma's M
constexpr int kThreads = 256;          // two warpgroups
constexpr int kLatentLd = 56;          // latent tile row stride (floats): float2 reads conflict-free
constexpr int kDownSbo = (kD / 4) * 128;  // bytes between 8-row groups of w_down^T [48][256]
constexpr int kUpSbo = (kR / 4) * 128;    // of [w_up_k | w_up_v]^T [cols][48]

template <int N>
struct WgmmaTf32;
template <>
struct WgmmaTf32<16> {
  static __device__ __forceinline__ void run(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
  }
};
template <>
struct WgmmaTf32<24> {
  static __device__ __forceinline__ void run(float (&d)[12], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n24k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, %16, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
  }
};
template <>
struct WgmmaTf32<32> {
  static __device__ __forceinline__ void run(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
  }
};
template <>
struct WgmmaTf32<48> {
  static __device__ __forceinline__ void run(float (&d)[24], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
  }
};
template <>
struct WgmmaTf32<64> {
  static __device__ __forceinline__ void run(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
  }
};
template <>
struct WgmmaTf32<128> {
  static __device__ __forceinline__ void run(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
  }
};


__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Tells the compiler the registers change here (the accumulators, written by wgmma asynchronously).
template <int kSize>
__device__ __forceinline__ void fence_registers(float (&r)[kSize]) {
#pragma unroll
  for (int i = 0; i < kSize; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Writes by ordinary stores to shared memory, made visible to wgmma's operand reads.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// An 8-byte store of two floats (p 8-byte aligned).
__device__ __forceinline__ void store2(float* p, float x, float y) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
}

// A shared-memory matrix descriptor, no swizzle: start, LBO (between core matrices along K), SBO
// (between 8-row groups), all in bytes.
__device__ __forceinline__ uint64_t smem_desc(uint32_t address, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32);
}

// The descriptor of B at `address` in the layout above (core matrices 128 B apart along K, `sbo`
// apart between 8-row groups). kSwapOffsets puts the two offsets in each other's fields: the
// probe's guard against reading PTX's LBO/SBO the wrong way round for K-major no-swizzle layouts
// (exactly one of the two variants can be right).
template <bool kSwapOffsets>
__device__ __forceinline__ uint64_t desc(uint32_t address, uint32_t sbo) {
  return kSwapOffsets ? smem_desc(address, sbo, 128) : smem_desc(address, 128, sbo);
}


// Four values into big and small halves.
__device__ __forceinline__ void split4(const float (&x)[4], uint32_t (&big)[4],
                                       uint32_t (&small)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const Split h = split_tf32(x[i]);
    big[i] = h.big;
    small[i] = h.small;
  }
}

// The A fragments of a K pair from a lane's float4s of rows g (r0) and g + 8 (r1): step e = 0
// takes (x, y), e = 1 (z, w) (the permuted K order above), split.
__device__ __forceinline__ void split_pair(const float4& r0, const float4& r1,
                                           uint32_t (&big)[2][4], uint32_t (&small)[2][4]) {
  const float x0[4] = {r0.x, r1.x, r0.y, r1.y};
  const float x1[4] = {r0.z, r1.z, r0.w, r1.w};
  split4(x0, big[0], small[0]);
  split4(x1, big[1], small[1]);
}

// One K step in 3xTF32: small(a) big(b), big(a) small(b), big(a) big(b) into acc.
template <int N>
__device__ __forceinline__ void step_3xtf32(float (&acc)[N / 2], const uint32_t (&a_big)[4],
                                            const uint32_t (&a_small)[4], uint64_t b_big,
                                            uint64_t b_small) {
  WgmmaTf32<N>::run(acc, a_small, b_big);
  WgmmaTf32<N>::run(acc, a_big, b_small);
  WgmmaTf32<N>::run(acc, a_big, b_big);
}

// K steps `step` and `step` + 1 (a K pair: 2 core matrices of 128 B per step along K) of B at
// b_big / b_small (SBO `sbo`), A from split_pair.
template <int N, bool kSwapOffsets>
__device__ __forceinline__ void pair_3xtf32(float (&acc)[N / 2], const uint32_t (&a_big)[2][4],
                                            const uint32_t (&a_small)[2][4], uint32_t b_big,
                                            uint32_t b_small, int step, uint32_t sbo) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const uint32_t at = (step + e) * 256;
    step_3xtf32<N>(acc, a_big[e], a_small[e], desc<kSwapOffsets>(b_big + at, sbo),
                   desc<kSwapOffsets>(b_small + at, sbo));
  }
}

// A warpgroup's up product and its stores: A is the sum of kTiles latent tiles (64 x kLatentLd
// each, back to back from `tiles`) at latent columns 8 j + 2 q, + 1 of rows row0, row0 + 8; B its
// kColsWg columns at b_big / b_small (SBO kUpSbo); out columns first_col + 8 j + 2 q, + 1 of
// tokens t0 and t0 + 8 (those below T).
template <int kColsWg, int kTiles, bool kSwapOffsets>
__device__ __forceinline__ void up_and_store(const float* tiles, uint32_t b_big, uint32_t b_small,
                                             int first_col, int row0, int q, int t0, int tokens,
                                             float* __restrict__ out) {
  float acc[kColsWg / 2];
#pragma unroll
  for (int i = 0; i < kColsWg / 2; ++i) acc[i] = 0.f;
  uint32_t a_big[kR / 8][4], a_small[kR / 8][4];
#pragma unroll
  for (int j = 0; j < kR / 8; ++j) {
    float2 l0 = make_float2(0.f, 0.f), l1 = make_float2(0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kTiles; ++s) {
      const float* tile = tiles + s * kTileTokens * kLatentLd;
      const float2 m0 = *reinterpret_cast<const float2*>(tile + row0 * kLatentLd + 8 * j + 2 * q);
      const float2 m1 =
          *reinterpret_cast<const float2*>(tile + (row0 + 8) * kLatentLd + 8 * j + 2 * q);
      l0 = make_float2(l0.x + m0.x, l0.y + m0.y);
      l1 = make_float2(l1.x + m1.x, l1.y + m1.y);
    }
    const float x[4] = {l0.x, l1.x, l0.y, l1.y};
    split4(x, a_big[j], a_small[j]);
  }
  fence_registers(acc);
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < kR / 8; ++j) {
    const uint32_t at = j * 256;
    step_3xtf32<kColsWg>(acc, a_big[j], a_small[j], desc<kSwapOffsets>(b_big + at, kUpSbo),
                         desc<kSwapOffsets>(b_small + at, kUpSbo));
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(acc);
  // Accumulator 4 j + {0, 1}: row row0, columns 8 j + 2 q + {0, 1}; 4 j + {2, 3}: row row0 + 8.
#pragma unroll
  for (int j = 0; j < kColsWg / 8; ++j) {
    const int c = first_col + 8 * j + 2 * q;
    const int kv = c / kN, n = c % kN;
    float* base = out + static_cast<int64_t>(kv) * tokens * kN + n;
    if (t0 < tokens) store2(base + static_cast<int64_t>(t0) * kN, acc[4 * j], acc[4 * j + 1]);
    if (t0 + 8 < tokens) {
      store2(base + static_cast<int64_t>(t0 + 8) * kN, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
}

// A chunk of 4 K-consecutive values, split, as one 16-byte store into each half (word `at`).
__device__ __forceinline__ void store_split_chunk(const float (&x)[4], uint32_t* big_out,
                                                  uint32_t* small_out, int at) {
  uint32_t big[4], small[4];
  split4(x, big, small);
  *reinterpret_cast<uint4*>(big_out + at) = make_uint4(big[0], big[1], big[2], big[3]);
  *reinterpret_cast<uint4*>(small_out + at) = make_uint4(small[0], small[1], small[2], small[3]);
}

// w_down^T for D rows [k0, k0 + kDepth), split, into big and small [48][kDepth] (core matrices,
// SBO = kDepth / 4 x 128 bytes): chunk (n, kq) = 4 consecutive logical K positions of latent
// column n; logical k of step s = 2 u + e at position kappa is D row k0 + 16 u + 4 (kappa % 4) +
// 2 e + kappa / 4, so chunk kq holds rows k0 + 16 (kq / 4) + kq % 4 + 4 i, i = 0..3. Lanes take
// consecutive n: coalesced loads, and 16-byte stores whose 8-lane phases cover one core matrix row
// each (no bank conflicts). Every load of a thread is issued before its first store.
template <int kDepth>
__device__ __forceinline__ void stage_down_rows(const float* __restrict__ w_down, int k0,
                                                uint32_t* big_out, uint32_t* small_out, int tid) {
  constexpr int kTotal = kR * (kDepth / 4);  // chunks
  constexpr int kChunks = (kTotal + kThreads - 1) / kThreads;
  constexpr int kSbo = (kDepth / 4) * 128;
  float w[kChunks][4];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = c * kThreads + tid, n = i % kR, kq = i / kR;
    const int p = k0 + 16 * (kq / 4) + kq % 4;
#pragma unroll
    for (int e = 0; e < 4; ++e) w[c][e] = i < kTotal ? __ldg(w_down + (p + 4 * e) * kR + n) : 0.f;
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = c * kThreads + tid, n = i % kR, kq = i / kR;
    if (i < kTotal) {
      store_split_chunk(w[c], big_out, small_out, (n / 8) * (kSbo / 4) + kq * 32 + (n % 8) * 4);
    }
  }
}

// Columns [col0, col0 + kCount) of [w_up_k | w_up_v], transposed and split, into big and small
// [kCount][48] (SBO kUpSbo): logical k of up step j at position kappa is latent row
// 8 j + 2 (kappa % 4) + kappa / 4, so chunk kq = 2 j + h holds rows 8 j + 2 i + h.
template <int kCount>
__device__ __forceinline__ void stage_up_columns(const float* __restrict__ w_up_k,
                                                 const float* __restrict__ w_up_v, int col0,
                                                 uint32_t* big_out, uint32_t* small_out, int tid) {
  constexpr int kTotal = kCount * (kR / 4);  // chunks
  constexpr int kChunks = (kTotal + kThreads - 1) / kThreads;
  float v[kChunks][4];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = c * kThreads + tid, n = i % kCount, kq = i / kCount;
    const int j = kq / 2, h = kq % 2;
    const int col = col0 + n;
    const float* src = col < kN ? w_up_k + col : w_up_v + (col - kN);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[c][e] = i < kTotal ? __ldg(src + (8 * j + 2 * e + h) * kN) : 0.f;
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = c * kThreads + tid, n = i % kCount, kq = i / kCount;
    if (i < kTotal) {
      store_split_chunk(v[c], big_out, small_out, (n / 8) * (kUpSbo / 4) + kq * 32 + (n % 8) * 4);
    }
  }
}

// kSplitDepth (with kDownWgs = 2): the warpgroups split the down product's K (D) instead of its
// columns, each over all 48 columns and half of D's K pairs (half the hidden loads and half the
// dependent wgmma chain a warpgroup), into two partial latent tiles that the up product adds.
template <int kDownWgs, int kWgCols, bool kSwapOffsets, bool kSplitDepth = false>
__global__ void __launch_bounds__(kThreads, 1)
    fused_wgmma_3xtf32(const float* __restrict__ hidden, const float* __restrict__ w_down,
                       const float* __restrict__ w_up_k, const float* __restrict__ w_up_v,
                       float* __restrict__ out, int tokens) {
  constexpr int kBlockCols = 2 * kWgCols;
  static_assert(!kSplitDepth || kDownWgs == 2, "the depth split takes both warpgroups");
  constexpr int kDownCols = kSplitDepth ? kR : kR / kDownWgs;
  constexpr int kPairs = kSplitDepth ? kD / 32 : kD / 16;  // K pairs a down warpgroup takes
  extern __shared__ __align__(128) unsigned char smem[];
  uint32_t* down_big = reinterpret_cast<uint32_t*>(smem);  // w_down^T [48][256], core matrices
  uint32_t* down_small = down_big + kR * kD;
  uint32_t* up_big = down_small + kR * kD;  // the block's [w_up_k | w_up_v]^T [kBlockCols][48]
  uint32_t* up_small = up_big + kBlockCols * kR;
  float* latent = reinterpret_cast<float*>(up_small + kBlockCols * kR);  // [64][kLatentLd]
  // kSplitDepth: warpgroup 1's partial latent tile follows warpgroup 0's.

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;
  const int col0 = blockIdx.y * kBlockCols;
  const int row0 = 16 * warp + g;  // the lane's rows row0 and row0 + 8 of the tile
  const int t0 = blockIdx.x * kTileTokens + row0, t1 = t0 + 8;
  const bool down_wg = wg < kDownWgs;
  const int u0 = kSplitDepth ? wg * kPairs : 0;  // the warpgroup's first K pair

  // The weights, split, into shared memory (each helper issues all of a thread's loads before it
  // stores any), then the hidden fragments.
  stage_down_rows<kD>(w_down, 0, down_big, down_small, tid);
  stage_up_columns<kBlockCols>(w_up_k, w_up_v, col0, up_big, up_small, tid);

  // The lane's hidden values: columns 16 (u0 + u) + 4 q .. + 3 of rows t0 and t1 (zeros past T).
  float4 h0[kPairs], h1[kPairs];
  if (down_wg) {
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
      const int c = 16 * (u0 + u) + 4 * q;
      h0[u] = t0 < tokens ? __ldg(reinterpret_cast<const float4*>(
                                hidden + static_cast<int64_t>(t0) * kD + c))
                          : zero;
      h1[u] = t1 < tokens ? __ldg(reinterpret_cast<const float4*>(
                                hidden + static_cast<int64_t>(t1) * kD + c))
                          : zero;
    }
  }

  fence_async_shared();
  __syncthreads();

  // Down: step s = 2 u + e takes the lane's (x, y) of h[u] for e = 0, (z, w) for e = 1.
  if (down_wg) {
    float acc[kDownCols / 2];
#pragma unroll
    for (int i = 0; i < kDownCols / 2; ++i) acc[i] = 0.f;
    const int n0 = kSplitDepth ? 0 : wg * kDownCols;  // the warpgroup's first latent column
    const uint32_t b_big = shared_address(down_big) + (n0 / 8) * kDownSbo;
    const uint32_t b_small = shared_address(down_small) + (n0 / 8) * kDownSbo;
    uint32_t a_big[2][2][4], a_small[2][2][4];  // [register set][e][fragment]
    fence_registers(acc);
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      const int set = u % 2;
      if (u >= 2) wgmma_wait<1>();  // the group that read this set (u - 2) is done
      split_pair(h0[u], h1[u], a_big[set], a_small[set]);
      wgmma_fence();
      pair_3xtf32<kDownCols, kSwapOffsets>(acc, a_big[set], a_small[set], b_big, b_small,
                                           2 * (u0 + u), kDownSbo);
      wgmma_commit();
    }
    wgmma_wait<0>();
    fence_registers(acc);
    // Accumulator 4 j + {0, 1} is row row0, columns 8 j + 2 q + {0, 1}; 4 j + {2, 3} row row0 + 8.
    float* tile = latent + (kSplitDepth ? wg * kTileTokens * kLatentLd : 0);
#pragma unroll
    for (int j = 0; j < kDownCols / 8; ++j) {
      const int c = n0 + 8 * j + 2 * q;
      *reinterpret_cast<float2*>(tile + row0 * kLatentLd + c) =
          make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(tile + (row0 + 8) * kLatentLd + c) =
          make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  __syncthreads();

  // Up: the warpgroup's kWgCols columns; A is the latent tile (the two partial tiles' sum with
  // kSplitDepth).
  const uint32_t b_big = shared_address(up_big) + (wg * kWgCols / 8) * kUpSbo;
  const uint32_t b_small = shared_address(up_small) + (wg * kWgCols / 8) * kUpSbo;
  up_and_store<kWgCols, kSplitDepth ? 2 : 1, kSwapOffsets>(latent, b_big, b_small,
                                                           col0 + wg * kWgCols, row0, q, t0,
                                                           tokens, out);
}

template <int kWgCols, bool kSplitDepth = false>
constexpr size_t smem_bytes() {
  return sizeof(uint32_t) * (2 * kR * kD + 2 * 2 * kWgCols * kR) +
         sizeof(float) * (kSplitDepth ? 2 : 1) * kTileTokens * kLatentLd;
}

template <int kDownWgs, int kWgCols, bool kSwapOffsets = false, bool kSplitDepth = false>
cudaError_t launch(const float* hidden, const float* w_down, const float* w_up_k,
                   const float* w_up_v, float* out, int tokens, cudaStream_t stream) {
  const dim3 grid((tokens + kTileTokens - 1) / kTileTokens, kCols / (2 * kWgCols));
  fused_wgmma_3xtf32<kDownWgs, kWgCols, kSwapOffsets, kSplitDepth>
      <<<grid, kThreads, smem_bytes<kWgCols, kSplitDepth>(), stream>>>(hidden, w_down, w_up_k,
                                                                       w_up_v, out, tokens);
  return cudaGetLastError();
}

template <int kDownWgs, int kWgCols, bool kSwapOffsets = false, bool kSplitDepth = false>
cudaError_t opt_in() {
  return cudaFuncSetAttribute(fused_wgmma_3xtf32<kDownWgs, kWgCols, kSwapOffsets, kSplitDepth>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem_bytes<kWgCols, kSplitDepth>()));
}

// ---- The cluster variants (few tokens) ----
// A cluster of kBlocks = 4 or 8 blocks per 64-token tile splits the work so that each block
// fetches 1 / kBlocks of everything: block r takes D columns [r D / kBlocks, (r + 1) D / kBlocks)
// of the down product (its share of hidden and of w_down's rows, split between the warpgroups by
// K pairs, all 48 latent columns each) and [K | V] columns [r 256 / kBlocks, ...) of the up one
// (half of them a warpgroup). The partial latent tiles meet in every block's shared memory:
//   !kLocalSum: each warpgroup's partial goes straight from its accumulators into slot
//     2 r + w of every block (st.shared::cluster, 2 kBlocks slots);
//   kLocalSum: warpgroup 1's partial is added to warpgroup 0's through a local tile first, and
//     the block's sum goes to slot r of every block in 16-byte pieces (kBlocks slots: half the
//     remote stores and half the slot reads of the up product, for one more barrier);
// one cluster barrier, and each block's up product sums the slots into its A fragments. At
// kBlocks = 4 a block fetches 12 + 12 KB of weights and 16 KB of hidden (the one-block variants:
// 48 + 12..48 + 64 KB), at 8 half that.
template <int kBlocks, bool kLocalSum>
struct ClusterShape {
  static constexpr int kDepth = kD / kBlocks;      // D columns a block
  static constexpr int kColsBlock = kCols / kBlocks;  // [K | V] columns a block
  static constexpr int kPairsWg = kDepth / 32;     // K pairs a warpgroup
  static constexpr int kDownSbo = (kDepth / 4) * 128;
  static constexpr int kSlots = kLocalSum ? kBlocks : 2 * kBlocks;
  static constexpr int kTiles = kSlots + (kLocalSum ? 1 : 0);  // the local sum's tile last
  static constexpr size_t kSmemBytes =
      sizeof(uint32_t) * (2 * kR * kDepth + 2 * kColsBlock * kR) +
      sizeof(float) * kTiles * kTileTokens * kLatentLd;
  static_assert(kPairsWg >= 1, "a K pair a warpgroup at least");
};

// Two floats (four) into block `rank`'s shared memory at the address `local` has in this block.
__device__ __forceinline__ uint32_t cluster_address(const float* local, uint32_t rank) {
  uint32_t remote = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(shared_address(local)), "r"(rank));
  return remote;
}
__device__ __forceinline__ void store_cluster_shared2(float* local, uint32_t rank, float x,
                                                      float y) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(cluster_address(local, rank)),
               "f"(x), "f"(y)
               : "memory");
}
__device__ __forceinline__ void store_cluster_shared4(float* local, uint32_t rank, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   cluster_address(local, rank)),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// A warpgroup's accumulators [64, 48] (wgmma's layout) into `tile` rows row0, row0 + 8; with
// kAdd, added to what the tile holds.
template <bool kAdd>
__device__ __forceinline__ void accumulators_to_tile(const float (&acc)[kR / 2], float* tile,
                                                     int row0, int q) {
#pragma unroll
  for (int j = 0; j < kR / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float2* at = reinterpret_cast<float2*>(tile + (row0 + 8 * h) * kLatentLd + 8 * j + 2 * q);
      float2 v = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      if constexpr (kAdd) v = make_float2(v.x + at->x, v.y + at->y);
      *at = v;
    }
  }
}

template <int kBlocks, bool kLocalSum>
__global__ void __launch_bounds__(kThreads, 1)
    fused_wgmma_3xtf32_cluster(const float* __restrict__ hidden, const float* __restrict__ w_down,
                               const float* __restrict__ w_up_k, const float* __restrict__ w_up_v,
                               float* __restrict__ out, int tokens) {
  using Shape = ClusterShape<kBlocks, kLocalSum>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint32_t* down_big = reinterpret_cast<uint32_t*>(smem);  // w_down^T [48][kDepth]
  uint32_t* down_small = down_big + kR * Shape::kDepth;
  uint32_t* up_big = down_small + kR * Shape::kDepth;      // [kColsBlock][48]
  uint32_t* up_small = up_big + Shape::kColsBlock * kR;
  float* slots = reinterpret_cast<float*>(up_small + Shape::kColsBlock * kR);  // [kTiles][64][ld]
  constexpr int kTileFloats = kTileTokens * kLatentLd;

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;
  const int rank = blockIdx.y;  // the cluster spans gridDim.y = kBlocks: its rank is blockIdx.y
  const int k0 = rank * Shape::kDepth, col0 = rank * Shape::kColsBlock;
  const int row0 = 16 * warp + g;
  const int t0 = blockIdx.x * kTileTokens + row0, t1 = t0 + 8;
  cluster_arrive();  // this block has started: the others may write into its slots

  stage_down_rows<Shape::kDepth>(w_down, k0, down_big, down_small, tid);
  stage_up_columns<Shape::kColsBlock>(w_up_k, w_up_v, col0, up_big, up_small, tid);

  // The warpgroup's K pairs: D columns k0 + 16 (kPairsWg wg + u) + 4 q .. + 3.
  float4 h0[Shape::kPairsWg], h1[Shape::kPairsWg];
#pragma unroll
  for (int u = 0; u < Shape::kPairsWg; ++u) {
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    const int c = k0 + 16 * (Shape::kPairsWg * wg + u) + 4 * q;
    h0[u] = t0 < tokens
                ? __ldg(reinterpret_cast<const float4*>(hidden + static_cast<int64_t>(t0) * kD + c))
                : zero;
    h1[u] = t1 < tokens
                ? __ldg(reinterpret_cast<const float4*>(hidden + static_cast<int64_t>(t1) * kD + c))
                : zero;
  }
  fence_async_shared();
  __syncthreads();

  // Down: the warpgroup's partial latent [64, 48] over its K pairs (the block's local K steps
  // 2 (kPairsWg wg + u) + e).
  float part[kR / 2];
#pragma unroll
  for (int i = 0; i < kR / 2; ++i) part[i] = 0.f;
  {
    uint32_t a_big[Shape::kPairsWg][2][4], a_small[Shape::kPairsWg][2][4];
#pragma unroll
    for (int u = 0; u < Shape::kPairsWg; ++u) split_pair(h0[u], h1[u], a_big[u], a_small[u]);
    const uint32_t b_big = shared_address(down_big);
    const uint32_t b_small = shared_address(down_small);
    fence_registers(part);
    wgmma_fence();
#pragma unroll
    for (int u = 0; u < Shape::kPairsWg; ++u) {
      pair_3xtf32<kR, false>(part, a_big[u], a_small[u], b_big, b_small,
                             2 * (Shape::kPairsWg * wg + u), Shape::kDownSbo);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(part);
  }

  if constexpr (kLocalSum) {
    // Warpgroup 1's partial into the local tile, warpgroup 0's added to it, then the block's sum
    // into slot `rank` of every block, 16 bytes a store.
    float* local = slots + Shape::kSlots * kTileFloats;
    if (wg == 1) accumulators_to_tile<false>(part, local, row0, q);
    __syncthreads();
    if (wg == 0) accumulators_to_tile<true>(part, local, row0, q);
    __syncthreads();
    cluster_wait();  // every block of the cluster has started
    float* slot = slots + rank * kTileFloats;
    for (int i = tid; i < kTileTokens * (kR / 4); i += kThreads) {
      const int row = i / (kR / 4), c = 4 * (i % (kR / 4));
      const float4 v = *reinterpret_cast<const float4*>(local + row * kLatentLd + c);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) store_cluster_shared4(slot + row * kLatentLd + c, b, v);
    }
  } else {
    // Each warpgroup's partial into slot 2 rank + wg of every block (this one included).
    cluster_wait();  // every block of the cluster has started
    float* slot = slots + (2 * rank + wg) * kTileFloats;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
      for (int j = 0; j < kR / 8; ++j) {
        const int c = 8 * j + 2 * q;
        store_cluster_shared2(slot + row0 * kLatentLd + c, b, part[4 * j], part[4 * j + 1]);
        store_cluster_shared2(slot + (row0 + 8) * kLatentLd + c, b, part[4 * j + 2],
                              part[4 * j + 3]);
      }
    }
  }
  cluster_arrive();
  cluster_wait();  // every slot is written

  // Up: the warpgroup's half of the block's columns; A is the slots' sum.
  constexpr int kColsWg = Shape::kColsBlock / 2;
  const uint32_t b_big = shared_address(up_big) + (wg * kColsWg / 8) * kUpSbo;
  const uint32_t b_small = shared_address(up_small) + (wg * kColsWg / 8) * kUpSbo;
  up_and_store<kColsWg, Shape::kSlots, false>(slots, b_big, b_small, col0 + kColsWg * wg, row0, q,
                                              t0, tokens, out);
}

// The launch of `tiles` clusters of kBlocks blocks; `attribute` holds the cluster's shape.
template <int kBlocks, bool kLocalSum>
cudaLaunchConfig_t cluster_config(int tiles, cudaStream_t stream, cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(tiles, kBlocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = ClusterShape<kBlocks, kLocalSum>::kSmemBytes;
  config.stream = stream;
  *attribute = cudaLaunchAttribute{};
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = 1;
  attribute->val.clusterDim.y = kBlocks;
  attribute->val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

template <int kBlocks, bool kLocalSum>
cudaError_t launch_cluster(const float* hidden, const float* w_down, const float* w_up_k,
                           const float* w_up_v, float* out, int tokens, cudaStream_t stream) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_config<kBlocks, kLocalSum>(
      (tokens + kTileTokens - 1) / kTileTokens, stream, &attribute);
  return cudaLaunchKernelEx(&config, fused_wgmma_3xtf32_cluster<kBlocks, kLocalSum>, hidden,
                            w_down, w_up_k, w_up_v, out, tokens);
}

template <int kBlocks, bool kLocalSum>
cudaError_t opt_in_cluster() {
  return cudaFuncSetAttribute(fused_wgmma_3xtf32_cluster<kBlocks, kLocalSum>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(ClusterShape<kBlocks, kLocalSum>::kSmemBytes));
}

// How many clusters of the variant an H200 holds at once (the dispatch's "4 x tiles <= SMs"
// assumes SMs / 4; GPCs whose SM count is not a multiple of 4 leave some out).
template <int kBlocks, bool kLocalSum>
int print_resident_clusters(const char* name) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_config<kBlocks, kLocalSum>(132, nullptr, &attribute);
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, fused_wgmma_3xtf32_cluster<kBlocks, kLocalSum>,
                                    &config));
  printf("%s: %d clusters of %d blocks (%zu bytes of shared memory each) resident at once\n", name,
         clusters, kBlocks, ClusterShape<kBlocks, kLocalSum>::kSmemBytes);
  return 0;
}

using LaunchFn = cudaError_t (*)(const float*, const float*, const float*, const float*, float*,
                                 int, cudaStream_t);
using OptInFn = cudaError_t (*)();
struct Variant {
  const char* name;
  OptInFn opt_in;
  LaunchFn launch;
};
const Variant kVariants[] = {
    {"wg2_c128", opt_in<2, 128>, launch<2, 128>},  // both warpgroups split the down product
    {"wg1_c128", opt_in<1, 128>, launch<1, 128>},  // warpgroup 0 alone runs it
    {"wg2_c64", opt_in<2, 64>, launch<2, 64>},     // two column blocks per tile
    {"wg2_c32", opt_in<2, 32>, launch<2, 32>},     // four
    {"ks_c128", opt_in<2, 128, false, true>, launch<2, 128, false, true>},  // split over D
    {"ks_c32", opt_in<2, 32, false, true>, launch<2, 32, false, true>},
    {"cl4_c32", opt_in_cluster<4, false>, launch_cluster<4, false>},  // 4 blocks a tile
    {"cl4s_c32", opt_in_cluster<4, true>, launch_cluster<4, true>},   // the block sums first
    {"cl8s_c16", opt_in_cluster<8, true>, launch_cluster<8, true>},   // 8 blocks a tile
    {"wg2_c128_swap", opt_in<2, 128, true>, launch<2, 128, true>},  // LBO and SBO swapped
};

// One copy of the inputs and the output, [2, T, H, Dh].
struct Set {
  float *hidden, *w_down, *w_up_k, *w_up_v, *out;
};

double max_ref(const std::vector<double>& ref) {
  double m = 0;
  for (double r : ref) m = std::max(m, std::fabs(r));
  return m;
}

// max |out - ref| / max |ref|; infinity where an element is NaN (unwritten: the output is
// poisoned before the call).
double error_of(const std::vector<float>& got, const std::vector<double>& ref) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(got[i] - ref[i]));
  }
  return worst / max_ref(ref);
}

// check_only: correctness alone (for compute-sanitizer), no timing.
int run_case(int tokens, size_t l2_bytes, bool check_only, cudaStream_t stream) {
  const size_t n_hidden = size_t(tokens) * kD, n_down = size_t(kD) * kR, n_up = size_t(kR) * kN,
               n_out = size_t(2) * tokens * kN;
  const size_t set_floats = n_hidden + n_down + 2 * n_up + n_out;
  const size_t set_bytes = set_floats * sizeof(float);
  const int sets = check_only ? 1
                              : static_cast<int>(std::max<size_t>(
                                    1, std::min<size_t>(1024, (3 * l2_bytes + set_bytes - 1) /
                                                                  set_bytes)));
  float* slab = nullptr;
  CK(cudaMalloc(&slab, set_bytes * sets));
  std::vector<Set> all(sets);
  for (int s = 0; s < sets; ++s) {
    float* p = slab + set_floats * s;
    all[s] = {p, p + n_hidden, p + n_hidden + n_down, p + n_hidden + n_down + n_up,
              p + n_hidden + n_down + 2 * n_up};
  }
  // Fresh inputs (uniform, weights scaled so the outputs stay O(1)); every set the same values.
  std::mt19937 rng(1234567u + tokens);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::vector<float> host(set_floats);
  for (size_t i = 0; i < set_floats - n_out; ++i) host[i] = unit(rng);
  for (size_t i = n_hidden; i < n_hidden + n_down; ++i) host[i] *= 1.f / 16.f;
  for (size_t i = n_hidden + n_down; i < n_hidden + n_down + 2 * n_up; ++i) host[i] *= 0.15f;
  for (int s = 0; s < sets; ++s) {
    CK(cudaMemcpy(all[s].hidden, host.data(), (set_floats - n_out) * sizeof(float),
                  cudaMemcpyHostToDevice));
  }
  // float64 reference.
  std::vector<double> latent(size_t(tokens) * kR, 0.0), ref(n_out, 0.0);
  const float* hh = host.data();
  const float* wd = hh + n_hidden;
  const float* wk = wd + n_down;
  const float* wv = wk + n_up;
  for (int t = 0; t < tokens; ++t) {
    for (int k = 0; k < kD; ++k) {
      const double x = hh[size_t(t) * kD + k];
      for (int r = 0; r < kR; ++r) latent[size_t(t) * kR + r] += x * wd[k * kR + r];
    }
    for (int r = 0; r < kR; ++r) {
      const double l = latent[size_t(t) * kR + r];
      for (int n = 0; n < kN; ++n) {
        ref[size_t(t) * kN + n] += l * wk[r * kN + n];
        ref[(size_t(tokens) + t) * kN + n] += l * wv[r * kN + n];
      }
    }
  }

  // The library, kAuto (its workspace sized for it).
  latentkv::Problem problem;
  problem.batch = 1;
  problem.seq = tokens;
  problem.model_dim = kD;
  problem.rank = kR;
  problem.heads = kHeads;
  problem.head_dim = kHeadDim;
  latentkv::Options options;
  options.backend = latentkv::Backend::kCuda;
  options.stream = stream;
  const int64_t workspace_bytes = latentkv::workspace_size(problem, options);
  void* workspace = nullptr;
  if (workspace_bytes > 0) CK(cudaMalloc(&workspace, workspace_bytes));
  latentkv::Strategy strategy = latentkv::Strategy::kAuto;
  // Graph capture passes call indices past the sets (calls = a multiple of sets, >= 64): each
  // call takes set s % sets.
  const auto library_call = [&](int c) {
    const int s = c % sets;
    latentkv::Args args = latentkv::contiguous_args(problem, all[s].hidden, all[s].w_down,
                                                    all[s].w_up_k, all[s].w_up_v, all[s].out);
    args.workspace = workspace;
    args.workspace_bytes = workspace_bytes;
    const latentkv::Status st = latentkv::run(problem, args, options);
    if (!st.ok()) printf("library: %s\n", st.message().c_str());
  };
  {
    latentkv::Args args = latentkv::contiguous_args(problem, all[0].hidden, all[0].w_down,
                                                    all[0].w_up_k, all[0].w_up_v, all[0].out);
    args.workspace = workspace;
    args.workspace_bytes = workspace_bytes;
    latentkv::select_strategy(problem, args, options, &strategy);
  }

  std::vector<float> got(n_out);
  const auto check = [&](auto call, double* err) -> int {
    CK(cudaMemset(all[0].out, 0xFF, n_out * sizeof(float)));  // NaN
    call(0);
    CK(cudaStreamSynchronize(stream));
    CK(cudaGetLastError());
    CK(cudaMemcpy(got.data(), all[0].out, n_out * sizeof(float), cudaMemcpyDeviceToHost));
    *err = error_of(got, ref);
    return 0;
  };
  const int calls = (std::max(64, sets) + sets - 1) / sets * sets;
  double err = 0;
  float us = 0;
  if (check(library_call, &err)) return 1;
  if (!check_only && graph_us_per_call(stream, calls, library_call, &us)) return 1;
  printf("T=%-6d sets=%-4d %-10s %-18s err %.2e  %8.2f us\n", tokens, sets, "library",
         latentkv::to_string(strategy), err, us);
  for (const Variant& v : kVariants) {
    const auto call = [&](int c) {
      const int s = c % sets;
      const cudaError_t e = v.launch(all[s].hidden, all[s].w_down, all[s].w_up_k, all[s].w_up_v,
                                     all[s].out, tokens, stream);
      if (e != cudaSuccess) printf("%s: %s\n", v.name, cudaGetErrorString(e));
    };
    if (check(call, &err)) return 1;
    if (!check_only && graph_us_per_call(stream, calls, call, &us)) return 1;
    printf("T=%-6d sets=%-4d %-10s %-18s err %.2e  %8.2f us%s\n", tokens, sets, v.name,
           "wgmma-3xTF32", err, us, err <= 1e-5 ? "" : "  FAIL (bound 1e-5)");
  }
  if (workspace != nullptr) CK(cudaFree(workspace));
  CK(cudaFree(slab));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  for (const Variant& v : kVariants) CK(v.opt_in());
  if (print_resident_clusters<4, false>("cl4_c32") != 0 ||
      print_resident_clusters<4, true>("cl4s_c32") != 0 ||
      print_resident_clusters<8, true>("cl8s_c16") != 0) {
    return 1;
  }
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<int> tokens = {1, 100, 384, 733, 1024, 2048, 4096, 6143, 6144, 16384};
  bool check_only = false;
  std::vector<int> given;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--check") {
      check_only = true;
    } else {
      given.push_back(atoi(argv[i]));
    }
  }
  if (!given.empty()) tokens = given;
  for (int t : tokens) {
    if (run_case(t, static_cast<size_t>(prop.l2CacheSize), check_only, stream)) return 1;
  }
  CK(cudaStreamDestroy(stream));
  return 0;
}
