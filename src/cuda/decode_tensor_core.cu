// The decode strategy for bfloat16 and float16 (Strategy::kCudaDecode on 16-bit dtypes): few
// tokens (T <= 64) against large weights, as in MLA decoding (DeepSeek-V2-Lite: 6 MB of bf16
// weights per call for one token, V3: 41 MB). The cost is streaming the weights from HBM once, so
// every SM gets an equal share of them, copied into shared memory with cp.async (the whole share
// in flight at once, no registers held), and the multiplications run on tensor cores (mma.sync
// m16n8k16, float32 accumulation) with the tokens as the M side: one MMA covers 16 tokens, so
// T = 1 and T = 16 cost the same instructions. Two launches:
//   1. down_latent   grid (ceil(R / 32) column tiles, 8 chunks of D); the 8 chunks of a column
//                    tile form one thread-block cluster. Each block multiplies the hidden rows of
//                    its chunk by its (D / 8) x 32 tile of w_down; the 8 partial tiles are summed
//                    through distributed shared memory, in a fixed order (deterministic), into the
//                    float32 latent [T][R] (workspace) and the caller's latent output.
//   2. up_project    one block per 32 columns of w_up_k, then of w_up_v, launched with
//                    programmatic dependent launch (PDL): its whole R x 32 weight tile is requested
//                    *before* it waits for stage 1, so the up-projection weights stream while the
//                    down projection runs. The float32 latent enters the MMAs as a hi + lo pair of
//                    16-bit values (two MMAs, ~16 mantissa bits: as good as float32 here, where the
//                    unfused baseline rounds the latent to the dtype), and the results go straight
//                    into the stacked output, any head stride.
// Each block splits its rows (the K dimension) between two groups of 4 warps, one 8-column MMA
// tile per warp, and sums the two halves in shared memory (deterministic). Float32 is not taken
// here: its decode kernels are in decode_stream.cu (tensor cores would mean TF32).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>

#include "backends.h"
#include "cuda/cuda_check.h"

namespace latentkv::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;                 // 8 warps: 4 column tiles x 2 halves of K
constexpr int kTileCols = 32;                 // weight columns per block (64 bytes per row)
constexpr int kMmaCols = 8;                   // columns per warp (the MMA's N)
constexpr int kKStep = 16;                    // the MMA's K
constexpr int kRowPad = 8;                    // elements of padding per shared row (see below)
constexpr int kWeightRow = kTileCols + kRowPad;  // 40 elements = 80 bytes: 8 consecutive rows
                                                 // land in 8 different bank groups (ldmatrix)
constexpr int kRowAlign = 4 * kKStep;  // rows per block: multiple of 64, so each K half is a
                                       // multiple of the 32 rows one ldmatrix.x4.trans covers
constexpr int kChunks = 8;             // stage 1: chunks of D per column tile = the cluster size
constexpr int kSumStride = kTileCols + 4;  // floats per row of the block's summed tile
constexpr int kMaxMTiles = 4;              // 16-token MMA tiles: T <= 64
constexpr int kMaxTokens = 16 * kMaxMTiles;
constexpr int kMaxDevices = 64;

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

// PDL: let the next kernel in the stream start / wait until the previous one's memory is visible.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
__device__ __forceinline__ void wait_for_previous_stage() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

template <typename E>
struct Params {
  const E* hidden;  // [B, S, D], strides (hidden_stride_batch, hidden_stride_seq, 1)
  int64_t hidden_stride_batch, hidden_stride_seq;
  const E* w_down;  // [D, R], row stride w_down_stride
  int64_t w_down_stride;
  const E* w_up_k;  // [R, N]
  const E* w_up_v;  // [R, N]
  int64_t w_up_k_stride, w_up_v_stride;
  E* out;  // [2, B, S, H, Dh]
  int64_t out_stride_kv, out_stride_batch, out_stride_seq, out_stride_head;
  E* latent_out;  // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
  float* latent;  // [T, R] workspace, float32
  int tokens, seq, model_dim, rank, head_dim, kv_width;
  int chunk_rows;       // stage 1: rows of w_down per block (multiple of kRowAlign)
  int rank_rows;        // stage 2: R rounded up to kRowAlign (the padding rows are zeros)
  bool hidden_vectors;  // hidden rows may be copied 16 bytes at a time
};

__device__ __forceinline__ int64_t token_offset(int token, int seq, int64_t stride_batch,
                                                int64_t stride_seq) {
  return (token / seq) * stride_batch + (token % seq) * stride_seq;
}

// Copies rows [row0, row0 + rows) x columns [col0, col0 + 32) of a row-major matrix
// [matrix_rows][matrix_cols] (row stride ld) into shared w [rows][kWeightRow]; what lies outside
// the matrix becomes zeros (and is not read).
template <typename E>
__device__ __forceinline__ void copy_weight_tile(E* w, const E* matrix, int64_t ld, int row0,
                                                 int rows, int matrix_rows, int col0,
                                                 int matrix_cols) {
  constexpr int kVectors = kTileCols * sizeof(E) / 16;  // per row
  for (int i = threadIdx.x; i < rows * kVectors; i += kThreads) {
    const int r = row0 + i / kVectors, col = col0 + (i % kVectors) * (16 / sizeof(E));
    const bool valid = r < matrix_rows && col < matrix_cols;
    copy16_async(w + (r - row0) * kWeightRow + col - col0, valid ? matrix + r * ld + col : matrix,
                 valid);
  }
}

// acc[m] += A[16 m .. 16 m + 16)[k0 .. k1) @ w[k0 .. k1)[col .. col + 8) for each of the warp's
// M tiles, summed over the kParts row-major A operands a[] (shared, row stride a_stride).
template <typename E, int kMTiles, int kParts>
__device__ __forceinline__ void warp_mma(float (&acc)[kMTiles][4], const E* const (&a)[kParts],
                                         int a_stride, const E* w, int col, int k0, int k1,
                                         int lane) {
  for (int k = k0; k < k1; k += 2 * kKStep) {
    uint32_t b[4];  // B fragments of k-steps k and k + 16
    load_matrices_transposed(b, w + (k + lane) * kWeightRow + col);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          uint32_t frag[4];
          load_matrices(frag, a[part] + (16 * m + lane % 16) * a_stride + k + h * kKStep +
                                  (lane / 16) * 8);
          mma<E>(acc[m], frag, b[2 * h], b[2 * h + 1]);
        }
      }
    }
  }
}

// The block's [16 kMTiles][32] result: warps 4-7 (second K half) leave theirs in sum, warps 0-3
// add theirs. An element (token row, column) of a warp's accumulators: acc[m][i] is row
// 16 m + lane / 4 + 8 (i / 2), column 8 (warp % 4) + 2 (lane % 4) + i % 2.
template <int kMTiles>
__device__ __forceinline__ void sum_k_halves(const float (&acc)[kMTiles][4], float* sum, int warp,
                                             int lane) {
  const int col = (warp % 4) * kMmaCols + (lane % 4) * 2;
  const int row = lane / 4;
  if (warp >= 4) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int i = 0; i < 4; ++i) sum[(16 * m + row + 8 * (i / 2)) * kSumStride + col + i % 2] = acc[m][i];
    }
  }
  __syncthreads();
  if (warp < 4) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int i = 0; i < 4; ++i) sum[(16 * m + row + 8 * (i / 2)) * kSumStride + col + i % 2] += acc[m][i];
    }
  }
  __syncthreads();
}

// Shared-memory plans, in elements of E then floats; every region starts 16-byte aligned.
struct DownSmem {
  int rows, kMTiles;
  __host__ __device__ int x_stride() const { return rows + kRowPad; }
  __host__ __device__ int weight_elems() const { return rows * kWeightRow; }
  __host__ __device__ int x_elems() const { return 16 * kMTiles * x_stride(); }
  __host__ __device__ size_t bytes(size_t elem) const {
    return elem * (weight_elems() + x_elems()) + sizeof(float) * 16 * kMTiles * kSumStride;
  }
};
struct UpSmem {
  int rows, kMTiles;
  __host__ __device__ int a_stride() const { return rows + kRowPad; }
  __host__ __device__ int weight_elems() const { return rows * kWeightRow; }
  __host__ __device__ int a_elems() const { return 16 * kMTiles * a_stride(); }
  __host__ __device__ size_t bytes(size_t elem) const {
    return elem * (weight_elems() + 2 * a_elems()) + sizeof(float) * 16 * kMTiles * kSumStride;
  }
};

// Stage 1. Block (column tile x, chunk y): latent[:, 32 x ..] partial over rows y * chunk_rows ..
template <typename E, int kMTiles>
__global__ void __cluster_dims__(1, kChunks, 1) __launch_bounds__(kThreads)
    down_latent(const __grid_constant__ Params<E> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const DownSmem plan{p.chunk_rows, kMTiles};
  E* w = reinterpret_cast<E*>(smem);                                      // [rows][kWeightRow]
  E* x = w + plan.weight_elems();                                         // [16 kMTiles][x_stride]
  float* sum = reinterpret_cast<float*>(x + plan.x_elems());              // [16 kMTiles][kSumStride]
  allow_dependents();  // stage 2 may start requesting its weights now

  const int rows = p.chunk_rows, x_stride = plan.x_stride();
  const int col0 = blockIdx.x * kTileCols, d0 = blockIdx.y * rows;
  copy_weight_tile(w, p.w_down, p.w_down_stride, d0, rows, p.model_dim, col0, p.rank);
  // The chunk's hidden rows; zeros past T and D.
  if (p.hidden_vectors) {
    const int vectors = rows / 8;
    for (int i = threadIdx.x; i < 16 * kMTiles * vectors; i += kThreads) {
      const int t = i / vectors, d = d0 + (i % vectors) * 8;
      const bool valid = t < p.tokens && d < p.model_dim;
      const E* src = valid ? p.hidden + token_offset(t, p.seq, p.hidden_stride_batch,
                                                     p.hidden_stride_seq) + d
                           : p.hidden;
      copy16_async(x + t * x_stride + d - d0, src, valid);
    }
  } else {
    for (int i = threadIdx.x; i < 16 * kMTiles * rows; i += kThreads) {
      const int t = i / rows, d = d0 + i % rows;
      x[t * x_stride + d - d0] =
          t < p.tokens && d < p.model_dim
              ? p.hidden[token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) + d]
              : from_float<E>(0.f);
    }
  }
  wait_async_copies();
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = rows / 2, k0 = (warp / 4) * half;
  float acc[kMTiles][4] = {};
  const E* const a[1] = {x};
  warp_mma<E, kMTiles, 1>(acc, a, x_stride, w, (warp % 4) * kMmaCols, k0, k0 + half, lane);
  sum_k_halves<kMTiles>(acc, sum, warp, lane);

  // The cluster's 8 chunk sums, read from each block's shared memory in rank order; block q of
  // the cluster finishes 1/8 of the tile's elements.
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  constexpr int kShare = 16 * kMTiles * kTileCols / kChunks;
  const int q = static_cast<int>(cluster.block_rank());
  for (int i = threadIdx.x; i < kShare; i += kThreads) {
    const int e = q * kShare + i, t = e / kTileCols, r = col0 + e % kTileCols;
    if (t >= p.tokens || r >= p.rank) continue;
    float total = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      total += cluster.map_shared_rank(sum, c)[t * kSumStride + e % kTileCols];
    }
    p.latent[t * p.rank + r] = total;
    if (p.latent_out != nullptr) {
      p.latent_out[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + r] =
          from_float<E>(total);
    }
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
}

// Stage 2. Block x: columns 32 (x % tiles) .. of w_up_k (x < tiles) or w_up_v, all R rows.
template <typename E, int kMTiles>
__global__ void __launch_bounds__(kThreads) up_project(const __grid_constant__ Params<E> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const UpSmem plan{p.rank_rows, kMTiles};
  E* w = reinterpret_cast<E*>(smem);            // [rows][kWeightRow]
  E* a_hi = w + plan.weight_elems();            // [16 kMTiles][a_stride]: latent rounded
  E* a_lo = a_hi + plan.a_elems();              // [16 kMTiles][a_stride]: latent - a_hi, rounded
  float* sum = reinterpret_cast<float*>(a_lo + plan.a_elems());  // [16 kMTiles][kSumStride]

  const int rows = p.rank_rows, a_stride = plan.a_stride();
  const int tiles = (p.kv_width + kTileCols - 1) / kTileCols;
  const int kv = blockIdx.x / tiles, col0 = (blockIdx.x % tiles) * kTileCols;
  copy_weight_tile(w, kv == 0 ? p.w_up_k : p.w_up_v, kv == 0 ? p.w_up_k_stride : p.w_up_v_stride,
                   0, rows, p.rank, col0, p.kv_width);

  wait_for_previous_stage();
  // The float32 latent as hi + lo, 4 at a time (R is a multiple of 8); zeros past T and R.
  for (int i = threadIdx.x; i < 16 * kMTiles * rows / 4; i += kThreads) {
    const int t = i / (rows / 4), r = (i % (rows / 4)) * 4;
    const float4 v = t < p.tokens && r < p.rank
                         ? *reinterpret_cast<const float4*>(p.latent + t * p.rank + r)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
    const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const E hi = from_float<E>(f[j]);
      a_hi[t * a_stride + r + j] = hi;
      a_lo[t * a_stride + r + j] = from_float<E>(f[j] - to_float(hi));
    }
  }
  wait_async_copies();
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = rows / 2, k0 = (warp / 4) * half;
  float acc[kMTiles][4] = {};
  const E* const a[2] = {a_hi, a_lo};
  warp_mma<E, kMTiles, 2>(acc, a, a_stride, w, (warp % 4) * kMmaCols, k0, k0 + half, lane);
  sum_k_halves<kMTiles>(acc, sum, warp, lane);

  for (int i = threadIdx.x; i < p.tokens * kTileCols; i += kThreads) {
    const int t = i / kTileCols, n = col0 + i % kTileCols;
    if (n >= p.kv_width) continue;
    p.out[kv * p.out_stride_kv + token_offset(t, p.seq, p.out_stride_batch, p.out_stride_seq) +
          (n / p.head_dim) * p.out_stride_head + n % p.head_dim] =
        from_float<E>(sum[t * kSumStride + i % kTileCols]);
  }
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

int m_tiles(const Problem& p) { return p.tokens() <= 16 ? 1 : p.tokens() <= 32 ? 2 : 4; }

DownSmem down_smem(const Problem& p) {
  return {static_cast<int>(round_up((p.model_dim + kChunks - 1) / kChunks, kRowAlign)),
          m_tiles(p)};
}
UpSmem up_smem(const Problem& p) {
  return {static_cast<int>(round_up(p.rank, kRowAlign)), m_tiles(p)};
}

// The opt-in shared-memory limit of a device (227 KB on Hopper), read once per device; the
// kernels' own opt-in to it is done at the same time.
template <typename E, int kMTiles>
cudaError_t opt_in(int bytes) {
  cudaError_t err = cudaFuncSetAttribute(down_latent<E, kMTiles>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(up_project<E, kMTiles>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
}

struct SmemLimit {
  size_t bytes = 0;
  Status status;
};

Status shared_memory_limit(size_t* bytes) {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<SmemLimit, kMaxDevices> limits;
  int device = 0;
  LATENTKV_CUDA_RETURN(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) {
    return {StatusCode::kUnsupported, "CUDA device " + std::to_string(device) +
                                          " is beyond the " + std::to_string(kMaxDevices) +
                                          " devices latentkv tracks"};
  }
  std::call_once(once[device], [device] {
    const RelaxedCaptureScope relaxed;
    SmemLimit& l = limits[device];
    int optin = 0;
    cudaError_t err =
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess) err = opt_in<__nv_bfloat16, 1>(optin);
    if (err == cudaSuccess) err = opt_in<__nv_bfloat16, 2>(optin);
    if (err == cudaSuccess) err = opt_in<__nv_bfloat16, 4>(optin);
    if (err == cudaSuccess) err = opt_in<__half, 1>(optin);
    if (err == cudaSuccess) err = opt_in<__half, 2>(optin);
    if (err == cudaSuccess) err = opt_in<__half, 4>(optin);
    l.status = cuda_status(err, "cuda-decode: shared-memory opt-in");
    l.bytes = static_cast<size_t>(optin);
  });
  *bytes = limits[device].bytes;
  return limits[device].status;
}

// Hopper's opt-in limit, for the device-free size check (the launch checks the device's own).
constexpr size_t kHopperSmemBytes = 227 * 1024;

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

template <typename E, int kMTiles>
Status launch(const Problem& p, const Args& a, Stream stream) {
  Params<E> k;
  k.hidden = static_cast<const E*>(a.hidden);
  k.hidden_stride_batch = a.hidden_stride_batch;
  k.hidden_stride_seq = a.hidden_stride_seq;
  k.w_down = static_cast<const E*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.w_up_k = static_cast<const E*>(a.w_up_k);
  k.w_up_v = static_cast<const E*>(a.w_up_v);
  k.w_up_k_stride = a.w_up_k_stride_row;
  k.w_up_v_stride = a.w_up_v_stride_row;
  k.out = static_cast<E*>(a.out);
  k.out_stride_kv = a.out_stride_kv;
  k.out_stride_batch = a.out_stride_batch;
  k.out_stride_seq = a.out_stride_seq;
  k.out_stride_head = a.out_stride_head;
  k.latent_out = static_cast<E*>(a.latent);
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.latent = static_cast<float*>(a.workspace);
  k.tokens = static_cast<int>(p.tokens());
  k.seq = static_cast<int>(p.seq);
  k.model_dim = static_cast<int>(p.model_dim);
  k.rank = static_cast<int>(p.rank);
  k.head_dim = static_cast<int>(p.head_dim);
  k.kv_width = static_cast<int>(p.kv_width());
  const DownSmem down = down_smem(p);
  const UpSmem up = up_smem(p);
  k.chunk_rows = down.rows;
  k.rank_rows = up.rows;
  k.hidden_vectors = aligned(a.hidden, 16) && a.hidden_stride_batch % 8 == 0 &&
                     a.hidden_stride_seq % 8 == 0 && p.model_dim % 8 == 0;

  size_t limit = 0;
  if (Status queried = shared_memory_limit(&limit); !queried.ok()) return queried;
  const size_t down_bytes = down.bytes(sizeof(E)), up_bytes = up.bytes(sizeof(E));
  if (down_bytes > limit || up_bytes > limit) {
    return {StatusCode::kUnsupported,
            "cuda-decode: needs " + std::to_string(std::max(down_bytes, up_bytes)) +
                " bytes of shared memory per block; the device allows " + std::to_string(limit)};
  }

  const dim3 down_grid(static_cast<unsigned>((k.rank + kTileCols - 1) / kTileCols), kChunks);
  down_latent<E, kMTiles><<<down_grid, kThreads, down_bytes, stream>>>(k);
  LATENTKV_CUDA_RETURN(cudaGetLastError());

  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(2 * ((k.kv_width + kTileCols - 1) / kTileCols)));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = up_bytes;
  config.stream = stream;
  config.attrs = pdl;
  config.numAttrs = 1;
  LATENTKV_CUDA_RETURN(cudaLaunchKernelEx(&config, up_project<E, kMTiles>, k));
  return Status::Ok();
}

template <typename E>
Status launch_for_tokens(const Problem& p, const Args& a, Stream stream) {
  switch (m_tiles(p)) {
    case 1: return launch<E, 1>(p, a, stream);
    case 2: return launch<E, 2>(p, a, stream);
    default: return launch<E, kMaxMTiles>(p, a, stream);
  }
}

Status refuse(const std::string& why) {
  return {StatusCode::kUnsupported, "cuda-decode: " + why};
}

}  // namespace

int64_t cuda_decode_tc_workspace_size(const Problem& p) {
  if (p.tokens() > kMaxTokens) return 0;
  return static_cast<int64_t>(sizeof(float)) * p.tokens() * p.rank;
}

Status cuda_decode_tc_fits(const Problem& p) {
  if (p.dtype == DType::kFloat32) return refuse("float32 takes the FFMA decode kernels");
  if (p.tokens() > kMaxTokens) {
    return refuse("problem tokens (batch * seq) = " + std::to_string(p.tokens()) +
                  " exceeds the " + std::to_string(kMaxTokens) + " it is built for");
  }
  if (p.model_dim > INT_MAX / 2 || 2 * p.kv_width() > INT_MAX / 2 ||
      p.tokens() * p.rank > INT_MAX / 2) {
    return refuse("problem.model_dim, rank or heads * head_dim exceeds its int32 indexing");
  }
  if (p.rank % 8 != 0 || p.kv_width() % 8 != 0) {
    return refuse("needs problem.rank = " + std::to_string(p.rank) +
                  " and heads * head_dim = " + std::to_string(p.kv_width()) +
                  " to be multiples of 8 (16-byte weight vectors)");
  }
  const size_t down = down_smem(p).bytes(2), up = up_smem(p).bytes(2);
  if (down > kHopperSmemBytes || up > kHopperSmemBytes) {
    return refuse("problem.model_dim = " + std::to_string(p.model_dim) + " and rank = " +
                  std::to_string(p.rank) + " at " + std::to_string(p.tokens()) +
                  " tokens need " + std::to_string(std::max(down, up)) +
                  " bytes of shared memory per block, over the " +
                  std::to_string(kHopperSmemBytes) + " available");
  }
  return Status::Ok();
}

Status cuda_decode_tc_supports(const Problem& p, const Args& a) {
  if (Status fits = cuda_decode_tc_fits(p); !fits.ok()) return fits;
  if (a.w_down_stride_row % 8 != 0 || a.w_up_k_stride_row % 8 != 0 ||
      a.w_up_v_stride_row % 8 != 0 || !aligned(a.w_down, 16) || !aligned(a.w_up_k, 16) ||
      !aligned(a.w_up_v, 16)) {
    return refuse("needs the weight row strides to be multiples of 8 elements and the weights "
                  "16-byte aligned");
  }
  const int64_t need = cuda_decode_tc_workspace_size(p);
  if (a.workspace == nullptr || a.workspace_bytes < need || !aligned(a.workspace, 16)) {
    return {StatusCode::kInvalidArgument,
            "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                ": cuda-decode needs a 16-byte aligned workspace of " + std::to_string(need) +
                " bytes"};
  }
  return Status::Ok();
}

bool cuda_decode_tc_preferred(const Problem& p) {
  return cuda_decode_tc_fits(p).ok();
}

Status run_cuda_decode_tc(const Problem& p, const Args& a, Stream stream) {
  if (p.dtype == DType::kBFloat16) return launch_for_tokens<__nv_bfloat16>(p, a, stream);
  if (p.dtype == DType::kFloat16) return launch_for_tokens<__half>(p, a, stream);
  return refuse("float32 takes the FFMA decode kernels");
}

}  // namespace latentkv::detail
