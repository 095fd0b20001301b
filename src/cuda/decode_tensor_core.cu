// The decode strategy for bfloat16 and float16 (Strategy::kCudaDecode on 16-bit dtypes): few
// tokens (T <= 16) against large weights, as in MLA decoding (DeepSeek-V2-Lite: 6 MB of bf16
// weights per call, V3: 41 MB). The cost is streaming the weights from HBM once, so every SM gets
// a share of them through the bulk tensor copy engine (TMA: no registers or threads held while
// the bytes are in flight), and the multiplications run on tensor cores (mma.sync m16n8k16,
// float32 accumulation) with the tokens as the M side: one MMA covers 16 tokens, so T = 1 and
// T = 16 cost the same instructions. Two launches:
//   1. down_latent   grid (R / 32 column tiles, 8 chunks of D); the 8 chunks of a column tile
//                    form one thread-block cluster. Each block multiplies the hidden rows of its
//                    chunk by its (D / 8) x 32 tile of w_down; the 8 partial tiles are summed
//                    through distributed shared memory, in a fixed order (deterministic), into the
//                    caller's latent output and into stage 2's A operand in the workspace: the
//                    float32 latent as a hi + lo pair of 16-bit values (two MMAs, ~16 mantissa
//                    bits: as good as float32 here, where the unfused baseline rounds the latent
//                    to the dtype), laid out exactly as stage 2's shared memory wants it.
//   2. up_project    persistent, one block per SM, launched with programmatic dependent launch
//                    (PDL): each block walks tiles of 32 or 64 columns of w_up_k, then w_up_v (all
//                    R rows), with up to 4 tiles in flight; its first tiles are requested before
//                    it waits for stage 1, the A operand comes in with one bulk copy, and the
//                    results go straight into the stacked output, any head stride.
// In both stages a block's 8 warps split the tile's columns 4 ways and its rows (K) 2 ways, and
// the two halves are summed in shared memory (deterministic). Float32 is not taken here: its
// decode kernels are in decode_stream.cu (tensor cores would mean TF32).
// Measured on an H200 (docs/perf-notes.md): V2-Lite 8.7-9.4 us for T = 1..16 against 12.0 for
// cuBLAS; V3 20.7-23.7 against 19.6-20.4, which is why kAuto takes it for small weights only.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "backends.h"
#include "cuda/cuda_check.h"
#include "cuda/kernel_args.h"
#include "cuda/pdl.h"

namespace latentkv::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;                 // 8 warps: 4 column tiles x 2 halves of K
constexpr int kDownCols = 32;                 // stage 1: latent columns per block (64-byte rows)
constexpr int kMmaCols = 8;                   // columns per warp (the MMA's N)
constexpr int kKStep = 16;                    // the MMA's K
constexpr int kRowPad = 8;                    // elements of padding per shared row of A: 8
                                              // consecutive rows land in 8 bank groups (ldmatrix)
constexpr int kBoxRows = 64;                  // rows per bulk tensor copy (one 4 KB box)
constexpr int kRowAlign = 4 * kKStep;  // rows per block: multiple of 64, so each K half is a
                                       // multiple of the 32 rows one ldmatrix.x4.trans covers
constexpr int kChunks = 8;             // stage 1: chunks of D per column tile = the cluster size
constexpr int kSumPad = 4;                 // floats of padding per row of a block's result
constexpr int kTokens = 16;                // the MMA's M: tokens per pass, and the limit on T
constexpr int kMaxUpStages = 4;            // stage 2: weight tiles in flight per block, at most
constexpr int kNarrowUpCols = 32;          // stage 2's tile widths (columns of w_up_k / w_up_v)
constexpr int kWideUpCols = 64;
constexpr int kWideTilesPerSm = 2;         // the wide tiles from this many tiles per SM on

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename E>
__device__ __forceinline__ E from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without registers; zeros instead when !valid (nothing is read then).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Four 8x8 16-bit matrices from shared memory; lane l gives the address of row l % 8 of matrix
// l / 8. The .trans form hands each thread a column pair instead of a row pair.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// d[16 x 8] += a[16 x 16] @ b[16 x 8], float32 accumulation.
template <typename E>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename E>
struct Params : ActivationParams<E> {
  CUtensorMap w_down_map;   // w_down [D][R] in 64 x 32 boxes
  CUtensorMap w_up_map[2];  // w_up_k, w_up_v [R][N] in 64 x (stage 2's tile width) boxes
  E* latent_out;  // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
  // Workspace: stage 2's A operand exactly as it sits in its shared memory, [2][16][a_stride]
  // (the latent rounded to E, then the rounding's remainder), zeros past T and R.
  E* latent_operand;
  int chunk_rows;   // stage 1: rows of w_down per block (multiple of kRowAlign)
  int rank_rows;    // R rounded up to kRowAlign: stage 2's rows, stage 1's columns
  int up_stages;    // stage 2: weight tiles in flight per block
  bool hidden_vectors;  // hidden rows may be copied 16 bytes at a time
};

// The weight tiles come through the bulk tensor copy engine (TMA) in 64-row boxes, completing on
// a shared-memory mbarrier; rows and columns outside the matrix arrive as zeros.
__device__ __forceinline__ void init_barrier(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(bar)));
}
__device__ __forceinline__ void publish_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void wait_barrier(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
}

// Rows [row0, row0 + rows) (a multiple of kBoxRows) x columns [col0, col0 + kCols) of the
// matrix behind `map` (boxes of kBoxRows x kCols) into shared w [rows][kCols], dense; one thread
// calls it.
template <int kCols, typename E>
__device__ __forceinline__ void copy_weight_tile(E* w, const CUtensorMap* map, int row0, int rows,
                                                 int col0, uint64_t* bar) {
  expect_bytes(bar, static_cast<uint32_t>(rows * kCols * sizeof(E)));
  for (int r = 0; r < rows; r += kBoxRows) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%2, %3}], [%4];\n" ::"r"(shared_address(w + r * kCols)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col0), "r"(row0 + r), "r"(shared_address(bar))
        : "memory");
  }
}

// `bytes` (a multiple of 16) of contiguous global memory into shared memory; one thread calls it.
__device__ __forceinline__ void copy_bytes(void* dst, const void* src, uint32_t bytes,
                                           uint64_t* bar) {
  expect_bytes(bar, bytes);
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

// Weight tiles [rows][kCols] sit in shared memory as the copy engine's swizzle leaves them (64-
// or 128-byte mode for 32- or 64-column rows): 16-byte chunk c of row r is stored at chunk
// c ^ f(r), so the 8 rows one ldmatrix phase reads fall in 8 different bank groups instead of all
// in one (measured: the unswizzled tiles made the MMA loop shared-memory bound, 13 us of V3).
template <int kCols>
__device__ __forceinline__ int swizzled(int row, int col) {
  static_assert(kCols == 32 || kCols == 64, "64- or 128-byte rows");
  const int f = kCols == 64 ? row % 8 : (row / 2) % 4;
  return row * kCols + (((col / 8) ^ f) * 8) + col % 8;
}

// How a block's 8 warps cover a tile of kCols columns: 4 column groups of kCols / 4 (one or two
// 8-column MMA tiles, sharing each A fragment) times 2 halves of the rows (K).
template <int kCols>
struct WarpLayout {
  static constexpr int kGroups = 4;
  static constexpr int kNTiles = kCols / kGroups / kMmaCols;
  static_assert(kNTiles * kMmaCols * kGroups == kCols, "32 or 64 columns");
};

// acc[j] += A[0 .. 16)[k0 .. k1) @ w[k0 .. k1)[col + 8 j .. col + 8 j + 8) for the warp's kNTiles
// MMA tiles, summed over the kParts row-major A operands a[] (shared, row stride a_stride); w is
// a swizzled [rows][kCols] tile. The two k-steps of each pass and the kParts operands accumulate
// in separate registers, so consecutive MMAs do not wait on each other.
template <int kCols, int kParts, typename E>
__device__ __forceinline__ void warp_mma(float (&acc)[WarpLayout<kCols>::kNTiles][4],
                                         const E* const (&a)[kParts], int a_stride, const E* w,
                                         int col, int k0, int k1, int lane) {
  constexpr int kNTiles = WarpLayout<kCols>::kNTiles;
  float chain[2][kParts][kNTiles][4] = {};
  for (int k = k0; k < k1; k += 2 * kKStep) {
    uint32_t b[kNTiles][4];  // B fragments of k-steps k and k + 16, per MMA tile
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      load_matrices_transposed(b[j], w + swizzled<kCols>(k + lane, col + j * kMmaCols));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        uint32_t frag[4];
        load_matrices(frag, a[part] + (lane % 16) * a_stride + k + h * kKStep + (lane / 16) * 8);
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          mma<E>(chain[h][part][j], frag, b[j][2 * h], b[j][2 * h + 1]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int part = 0; part < kParts; ++part) acc[j][i] += chain[h][part][j][i];
      }
    }
  }
}

// The block's [16][kCols] result in sum (row stride kCols + kSumPad): warps 4-7 (second half of
// the rows) leave theirs, warps 0-3 add their own (a fixed order). Accumulator i of MMA tile j of
// a lane is row lane / 4 + 8 (i / 2), column (warp % 4) kCols / 4 + 8 j + 2 (lane % 4) + i % 2
// (the MMA's C fragment).
template <int kCols>
__device__ __forceinline__ void collect_tile(const float (&acc)[WarpLayout<kCols>::kNTiles][4],
                                             float* sum, int warp, int lane) {
  constexpr int kStride = kCols + kSumPad;
  constexpr int kNTiles = WarpLayout<kCols>::kNTiles;
  const int col = (warp % 4) * (kCols / 4) + (lane % 4) * 2;
  const int row = lane / 4;
  if (warp >= 4) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sum[(row + 8 * (i / 2)) * kStride + col + j * kMmaCols + i % 2] = acc[j][i];
      }
    }
  }
  __syncthreads();
  if (warp < 4) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sum[(row + 8 * (i / 2)) * kStride + col + j * kMmaCols + i % 2] += acc[j][i];
      }
    }
  }
  __syncthreads();
}

// Shared-memory plans, in elements of E, then floats, then barriers; every region 16-byte aligned.
struct DownSmem {
  int rows;
  __host__ __device__ int x_stride() const { return rows + kRowPad; }
  __host__ __device__ int weight_elems() const { return rows * kDownCols; }
  __host__ __device__ int x_elems() const { return kTokens * x_stride(); }
  __host__ __device__ size_t bytes(size_t elem) const {
    return elem * (weight_elems() + x_elems()) +
           sizeof(float) * kTokens * (kDownCols + kSumPad) + sizeof(uint64_t);
  }
};
struct UpSmem {
  int rows, cols, stages;
  __host__ __device__ int a_stride() const { return rows + kRowPad; }
  __host__ __device__ int a_elems() const { return 2 * kTokens * a_stride(); }  // hi and lo
  __host__ __device__ int weight_elems() const { return rows * cols; }  // per stage
  __host__ __device__ size_t bytes(size_t elem) const {
    return elem * (a_elems() + stages * weight_elems()) +
           sizeof(float) * kTokens * (cols + kSumPad) + sizeof(uint64_t) * (stages + 1);
  }
};

// Stage 1. Block (column tile x, chunk y): latent[:, 32 x ..] partial over rows y * chunk_rows ..
template <typename E>
__global__ void __cluster_dims__(1, kChunks, 1) __launch_bounds__(kThreads)
    down_latent(const __grid_constant__ Params<E> p) {
  extern __shared__ __align__(1024) unsigned char smem[];  // swizzled tiles first
  const DownSmem plan{p.chunk_rows};
  E* w = reinterpret_cast<E*>(smem);                            // [rows][kDownCols]
  E* x = w + plan.weight_elems();                               // [kTokens][x_stride]
  float* sum = reinterpret_cast<float*>(x + plan.x_elems());    // [kTokens][kDownCols + pad]
  uint64_t* bar = reinterpret_cast<uint64_t*>(sum + kTokens * (kDownCols + kSumPad));

  const int rows = p.chunk_rows, x_stride = plan.x_stride();
  const int col0 = blockIdx.x * kDownCols, d0 = blockIdx.y * rows;
  if (threadIdx.x == 0) {
    init_barrier(bar);
    publish_barrier_init();
    copy_weight_tile<kDownCols>(w, &p.w_down_map, d0, rows, col0, bar);
  }
  // The chunk's hidden rows; zeros past T and D.
  if (p.hidden_vectors) {
    const int vectors = rows / 8;
    for (int i = threadIdx.x; i < kTokens * vectors; i += kThreads) {
      const int t = i / vectors, d = d0 + (i % vectors) * 8;
      const bool valid = t < p.tokens && d < p.model_dim;
      const E* src = valid ? p.hidden + token_offset(t, p.seq, p.hidden_stride_batch,
                                                     p.hidden_stride_seq) + d
                           : p.hidden;
      copy16_async(x + t * x_stride + d - d0, src, valid);
    }
  } else {
    for (int i = threadIdx.x; i < kTokens * rows; i += kThreads) {
      const int t = i / rows, d = d0 + i % rows;
      x[t * x_stride + d - d0] =
          t < p.tokens && d < p.model_dim
              ? p.hidden[token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) + d]
              : from_float<E>(0.f);
    }
  }
  wait_async_copies();
  __syncthreads();  // also publishes the barrier's initialization
  wait_barrier(bar, 0);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = rows / 2, k0 = (warp / 4) * half;
  float acc[WarpLayout<kDownCols>::kNTiles][4] = {};
  const E* const a[1] = {x};
  warp_mma<kDownCols, 1>(acc, a, x_stride, w, (warp % 4) * (kDownCols / 4), k0, k0 + half, lane);
  collect_tile<kDownCols>(acc, sum, warp, lane);

  // The cluster's 8 chunk sums, read from each block's shared memory in rank order; block q of
  // the cluster finishes 1/8 of the tile: stage 2's operand (every row, zeros included) and the
  // caller's latent output.
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  constexpr int kShare = kTokens * kDownCols / kChunks;
  const int q = static_cast<int>(cluster.block_rank());
  const int a_stride = p.rank_rows + kRowPad;
  for (int i = threadIdx.x; i < kShare; i += kThreads) {
    const int e = q * kShare + i, t = e / kDownCols, r = col0 + e % kDownCols;
    float total = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      total += cluster.map_shared_rank(sum, c)[t * (kDownCols + kSumPad) + e % kDownCols];
    }
    const E hi = from_float<E>(total);
    p.latent_operand[t * a_stride + r] = hi;
    p.latent_operand[(kTokens + t) * a_stride + r] = from_float<E>(total - to_float(hi));
    if (p.latent_out != nullptr && t < p.tokens && r < p.rank) {
      p.latent_out[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + r] = hi;
    }
  }
  allow_dependents();  // stage 2 may launch now (earlier only slowed this stage down: measured)
  cluster.sync();      // no block leaves while another still reads its shared memory
}

// Stage 2. Persistent blocks walk the column tiles (kCols columns of w_up_k, then of w_up_v, all
// R rows) gridDim.x apart, with up_stages tiles in flight: the first ones are requested before the
// wait for stage 1, each next one as soon as its stage is free.
template <typename E, int kCols>
__global__ void __launch_bounds__(kThreads, 1) up_project(const __grid_constant__ Params<E> p) {
  extern __shared__ __align__(1024) unsigned char smem[];  // swizzled tiles first
  const UpSmem plan{p.rank_rows, kCols, p.up_stages};
  E* w = reinterpret_cast<E*>(smem);                            // [stages][rows][kCols]
  E* a_hi = w + plan.stages * plan.weight_elems();              // [kTokens][a_stride]
  E* a_lo = a_hi + kTokens * plan.a_stride();                   // [kTokens][a_stride]
  float* sum = reinterpret_cast<float*>(a_hi + plan.a_elems());
  uint64_t* a_bar = reinterpret_cast<uint64_t*>(sum + kTokens * (kCols + kSumPad));
  uint64_t* w_bar = a_bar + 1;                                  // [stages]

  const int rows = p.rank_rows, a_stride = plan.a_stride();
  const int tiles_per_half = (p.kv_width + kCols - 1) / kCols;
  const int tiles = 2 * tiles_per_half;
  auto request = [&](int tile, int stage) {
    const int kv = tile / tiles_per_half, col0 = (tile % tiles_per_half) * kCols;
    copy_weight_tile<kCols>(w + stage * plan.weight_elems(), &p.w_up_map[kv], 0, rows, col0,
                            w_bar + stage);
  };
  if (threadIdx.x == 0) {
    init_barrier(a_bar);
    for (int s = 0; s < plan.stages; ++s) init_barrier(w_bar + s);
    publish_barrier_init();
    for (int s = 0; s < plan.stages; ++s) {
      const int tile = blockIdx.x + s * gridDim.x;
      if (tile < tiles) request(tile, s);
    }
  }
  wait_for_previous_stage();
  if (threadIdx.x == 0) {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");  // stage 1 wrote it with stores
    copy_bytes(a_hi, p.latent_operand, static_cast<uint32_t>(plan.a_elems() * sizeof(E)), a_bar);
  }
  __syncthreads();  // publishes the barriers' initialization
  wait_barrier(a_bar, 0);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = rows / 2, k0 = (warp / 4) * half;
  const E* const a[2] = {a_hi, a_lo};
  for (int i = 0, tile = blockIdx.x; tile < tiles; ++i, tile += gridDim.x) {
    const int stage = i % plan.stages;
    wait_barrier(w_bar + stage, (i / plan.stages) & 1);
    float acc[WarpLayout<kCols>::kNTiles][4] = {};
    warp_mma<kCols, 2>(acc, a, a_stride, w + stage * plan.weight_elems(), (warp % 4) * (kCols / 4),
                       k0, k0 + half, lane);
    collect_tile<kCols>(acc, sum, warp, lane);  // every warp is done with the stage after this
    const int next = tile + plan.stages * gridDim.x;
    if (threadIdx.x == 0 && next < tiles) request(next, stage);

    const int kv = tile / tiles_per_half, col0 = (tile % tiles_per_half) * kCols;
    for (int j = threadIdx.x; j < p.tokens * kCols; j += kThreads) {
      const int t = j / kCols, n = col0 + j % kCols;
      if (n >= p.kv_width) continue;
      p.out[kv * p.out_stride_kv + token_offset(t, p.seq, p.out_stride_batch, p.out_stride_seq) +
            (n / p.head_dim) * p.out_stride_head + n % p.head_dim] =
          from_float<E>(sum[t * (kCols + kSumPad) + j % kCols]);
    }
    __syncthreads();  // sum is rewritten by the next tile
  }
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

int rank_rows(const Problem& p) { return static_cast<int>(round_up(p.rank, kRowAlign)); }
DownSmem down_smem(const Problem& p) {
  return {static_cast<int>(round_up((p.model_dim + kChunks - 1) / kChunks, kRowAlign))};
}
int up_tiles(const Problem& p, int cols) {
  return static_cast<int>(2 * ((p.kv_width() + cols - 1) / cols));
}

// Per device, read once (run() is on the hot path): SMs and the opt-in shared-memory limit
// (227 KB on Hopper), to which the kernels are opted in at the same time.
struct DeviceFacts {
  int sm_count = 0;
  size_t smem_optin = 0;
  Status status;
};

template <typename E>
cudaError_t opt_in(int bytes) {
  cudaError_t err = cudaFuncSetAttribute(down_latent<E>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(up_project<E, kNarrowUpCols>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  }
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(up_project<E, kWideUpCols>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

Status current_device_facts(const DeviceFacts** out) {
  static std::array<std::once_flag, kMaxTrackedDevices> once;
  static std::array<DeviceFacts, kMaxTrackedDevices> facts;
  int device = 0;
  if (Status tracked = current_tracked_device(&device); !tracked.ok()) return tracked;
  std::call_once(once[device], [device] {
    const RelaxedCaptureScope relaxed;
    DeviceFacts& f = facts[device];
    int optin = 0;
    cudaError_t err = cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    if (err == cudaSuccess) err = opt_in<__nv_bfloat16>(optin);
    if (err == cudaSuccess) err = opt_in<__half>(optin);
    f.status = cuda_status(err, "cuda-decode: device attributes and shared-memory opt-in");
    f.smem_optin = static_cast<size_t>(optin);
  });
  *out = &facts[device];
  return (*out)->status;
}

// Hopper's opt-in limit, for the device-free size check (the launch checks the device's own).
constexpr size_t kHopperSmemBytes = 227 * 1024;

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

// cuTensorMapEncodeTiled, looked up once through the runtime (no link against the driver library).
using TensorMapEncoder = PFN_cuTensorMapEncodeTiled_v12000;
Status tensor_map_encoder(TensorMapEncoder* out) {
  static std::once_flag once;
  static TensorMapEncoder encoder = nullptr;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      encoder = reinterpret_cast<TensorMapEncoder>(fn);
    }
  });
  *out = encoder;
  if (encoder == nullptr) {
    return {StatusCode::kCudaError,
            "cuda-decode: the driver does not provide cuTensorMapEncodeTiled (CUDA 12+ needed)"};
  }
  return Status::Ok();
}

// A row-major [rows][cols] matrix (row stride ld elements) in kBoxRows x box_cols boxes.
template <typename E>
Status encode_weight_map(CUtensorMap* map, TensorMapEncoder encode, const void* matrix,
                         int64_t rows, int64_t cols, int64_t ld, int box_cols) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(E)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), kBoxRows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(
      map, std::is_same_v<E, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      2, const_cast<void*>(matrix), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      box_cols * sizeof(E) == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return {StatusCode::kCudaError,
            "cuda-decode: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(r)};
  }
  return Status::Ok();
}

template <typename E, int kUpCols>
Status launch(const Problem& p, const Args& a, Stream stream, const DeviceFacts& facts) {
  Params<E> k;
  copy_activation_args<E>(p, a, k);
  k.latent_out = static_cast<E*>(a.latent);
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.latent_operand = static_cast<E*>(a.workspace);
  const DownSmem down = down_smem(p);
  k.chunk_rows = down.rows;
  k.rank_rows = rank_rows(p);
  k.hidden_vectors = aligned(a.hidden, 16) && a.hidden_stride_batch % 8 == 0 &&
                     a.hidden_stride_seq % 8 == 0 && p.model_dim % 8 == 0;

  TensorMapEncoder encode = nullptr;
  if (Status found = tensor_map_encoder(&encode); !found.ok()) return found;
  const Status mapped[] = {
      encode_weight_map<E>(&k.w_down_map, encode, a.w_down, p.model_dim, p.rank,
                           a.w_down_stride_row, kDownCols),
      encode_weight_map<E>(&k.w_up_map[0], encode, a.w_up_k, p.rank, p.kv_width(),
                           a.w_up_k_stride_row, kUpCols),
      encode_weight_map<E>(&k.w_up_map[1], encode, a.w_up_v, p.rank, p.kv_width(),
                           a.w_up_v_stride_row, kUpCols)};
  for (const Status& m : mapped) {
    if (!m.ok()) return m;
  }

  // Stage 2: one persistent block per SM (or per tile, when fewer), as many tiles in flight as
  // its shared memory holds (up to kMaxUpStages) and it has tiles to walk.
  const int tiles = up_tiles(p, kUpCols);
  const int up_grid = std::min(tiles, facts.sm_count);
  UpSmem up{k.rank_rows, kUpCols, std::min(kMaxUpStages, (tiles + up_grid - 1) / up_grid)};
  while (up.stages > 1 && up.bytes(sizeof(E)) > facts.smem_optin) --up.stages;
  k.up_stages = up.stages;
  const size_t down_bytes = down.bytes(sizeof(E)), up_bytes = up.bytes(sizeof(E));
  if (down_bytes > facts.smem_optin || up_bytes > facts.smem_optin) {
    return {StatusCode::kUnsupported,
            "cuda-decode: needs " + std::to_string(std::max(down_bytes, up_bytes)) +
                " bytes of shared memory per block; the device allows " +
                std::to_string(facts.smem_optin)};
  }

  const dim3 down_grid(static_cast<unsigned>(k.rank_rows / kDownCols), kChunks);
  down_latent<E><<<down_grid, kThreads, down_bytes, stream>>>(k);
  LATENTKV_CUDA_RETURN(cudaGetLastError());

  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(up_grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = up_bytes;
  config.stream = stream;
  config.attrs = pdl;
  config.numAttrs = 1;
  LATENTKV_CUDA_RETURN(cudaLaunchKernelEx(&config, up_project<E, kUpCols>, k));
  return Status::Ok();
}

// Stage 2's tile width: 64 columns (128-byte weight rows, no split of R) once there are enough
// tiles for several per SM (DeepSeek-V3: 512); 32 columns otherwise (V2-Lite: 128 tiles, one per
// SM).
template <typename E>
Status launch_for_width(const Problem& p, const Args& a, Stream stream) {
  const DeviceFacts* facts = nullptr;
  if (Status queried = current_device_facts(&facts); !queried.ok()) return queried;
  if (up_tiles(p, kWideUpCols) >= kWideTilesPerSm * facts->sm_count) {
    return launch<E, kWideUpCols>(p, a, stream, *facts);
  }
  return launch<E, kNarrowUpCols>(p, a, stream, *facts);
}

Status refuse(const std::string& why) {
  return {StatusCode::kUnsupported, "cuda-decode: " + why};
}

}  // namespace

int64_t cuda_decode_tc_workspace_size(const Problem& p) {
  if (p.tokens() > kTokens || p.dtype == DType::kFloat32) return 0;
  return element_size(p.dtype) * 2 * kTokens * (rank_rows(p) + kRowPad);
}

Status cuda_decode_tc_fits(const Problem& p) {
  if (p.dtype == DType::kFloat32) return refuse("float32 takes the FFMA decode kernels");
  if (p.tokens() > kTokens) {
    return refuse("problem tokens (batch * seq) = " + std::to_string(p.tokens()) +
                  " exceeds the " + std::to_string(kTokens) + " it is built for");
  }
  if (p.model_dim > INT_MAX / 2 || 2 * p.kv_width() > INT_MAX / 2 || p.rank > INT_MAX / 4) {
    return refuse("problem.model_dim, rank or heads * head_dim exceeds its int32 indexing");
  }
  if (p.rank % 8 != 0 || p.kv_width() % 8 != 0) {
    return refuse("needs problem.rank = " + std::to_string(p.rank) +
                  " and heads * head_dim = " + std::to_string(p.kv_width()) +
                  " to be multiples of 8 (16-byte weight rows)");
  }
  const size_t down = down_smem(p).bytes(2), up = UpSmem{rank_rows(p), kWideUpCols, 1}.bytes(2);
  if (down > kHopperSmemBytes || up > kHopperSmemBytes) {
    return refuse("problem.model_dim = " + std::to_string(p.model_dim) + " and rank = " +
                  std::to_string(p.rank) + " need " + std::to_string(std::max(down, up)) +
                  " bytes of shared memory per block, over the " +
                  std::to_string(kHopperSmemBytes) + " available");
  }
  return Status::Ok();
}

// Measured on an H200, bf16, against cuda-gemm (docs/perf-notes.md, 2026-11-29): DeepSeek-V2-Lite
// (6.3 MB of weights) 8.7 / 8.8 / 8.8 / 9.0 / 9.4 us for T = 1 / 2 / 4 / 8 / 16 against
// 11.9-12.1; DeepSeek-V3 (41 MB) 20.7 / 20.7 / 20.9 / 21.8 / 23.7 against 19.6-20.4. With large
// weights the MMA loop (the A operand re-read from shared memory per tile) no longer hides under
// the weight stream, and cuBLAS's GEMV-shaped kernels stream them as fast, so the crossover lies
// between the two; 16 MB is the bound measured on the small side.
bool cuda_decode_tc_preferred(const Problem& p) {
  constexpr int64_t kSmallWeightBytes = int64_t{16} << 20;
  if (!cuda_decode_tc_fits(p).ok()) return false;  // also bounds the sizes multiplied below
  return weight_bytes(p) <= kSmallWeightBytes;
}

Status run_cuda_decode_tc(const Problem& p, const Args& a, Stream stream) {
  if (p.dtype == DType::kBFloat16) return launch_for_width<__nv_bfloat16>(p, a, stream);
  if (p.dtype == DType::kFloat16) return launch_for_width<__half>(p, a, stream);
  return refuse("float32 takes the FFMA decode kernels");
}

}  // namespace latentkv::detail
