// The fused float32 strategy (Strategy::kCudaFused): one launch computes the latent, K and V for a
// tile of tokens per block, keeps the latent in shared memory and writes the stacked
// [2, B, S, H, Dh] output (and the latent, when asked) directly.
//
// Why this shape of kernel: at the founding size (T=384, D=256, R=48, N=128) the work is ~19 MFLOP
// and ~0.9 MB, so time is launch latency plus memory round trips, not arithmetic. The kernel
// therefore spreads tokens over many blocks (kTokens = 4 gives ~100 blocks), reads the weights
// straight from L2 with every load of a thread issued before its first use (split-K over threads,
// so each thread has only a handful of loads), and reduces the split-K partials in shared memory.
// For many tokens (T=6144) a larger token tile (kTokens = 16) reuses each weight load over more
// rows, so the kernel moves towards FFMA throughput. Exact FFMA accumulation in float32, so the
// error against float64 stays near 1e-7 (no TF32).
//
// Layout of one block (256 threads):
//   down projection: thread = (group of 4 latent columns, slice of D); 16 x 16
//   up projection:   thread = (group of 4 output columns, slice of R); 64 x 4
// Partials of the slices meet in shared memory; the sum goes to the latent tile / the output.
#include <cuda_runtime.h>

#include <array>
#include <climits>
#include <mutex>
#include <string>

#include "backends.h"
#include "cuda/cuda_check.h"

namespace latentkv::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kDownColGroups = 16;                             // x4 columns = 64 latent columns/pass
constexpr int kDownSlices = kThreads / kDownColGroups;         // 16 slices of D
constexpr int kDownCols = 4 * kDownColGroups;                  // 64
constexpr int kUpColGroups = 64;                               // x4 columns = 256 outputs/pass
constexpr int kUpSlices = kThreads / kUpColGroups;             // 4 slices of R
constexpr int kUpCols = 4 * kUpColGroups;                      // 256
static_assert(kDownColGroups * kDownSlices == kThreads, "down layout must use every thread");
static_assert(kUpColGroups * kUpSlices == kThreads, "up layout must use every thread");

// Everything the kernel needs, shapes in comments, strides in elements.
struct FusedParams {
  const float* hidden;  // [B, S, D]
  int64_t hidden_stride_batch, hidden_stride_seq;
  const float* w_down;  // [D, R]
  int64_t w_down_stride;
  const float* w_up_k;  // [R, N]
  const float* w_up_v;  // [R, N]
  int64_t w_up_k_stride, w_up_v_stride;
  float* out;  // [2, B, S, H, Dh]
  int64_t out_stride_kv, out_stride_batch, out_stride_seq, out_stride_head;
  float* latent;  // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
  int tokens, seq, model_dim, rank, head_dim, kv_width;  // T, S, D, R, Dh, N
  // Uniform per launch: which fast paths the pointers and strides allow.
  bool hidden_vec4;     // hidden rows 16-byte aligned, D % 4 == 0
  bool w_down_vec4;     // w_down rows 16-byte aligned, R % 4 == 0
  bool w_up_vec4;       // w_up_k/v rows 16-byte aligned, N % 4 == 0 (a group never straddles K|V)
  bool heads_packed;    // out_stride_head == Dh: a token's N outputs are contiguous
};

// Shared memory of one block, carved from the dynamic allocation. Tiles are stored transposed
// ([k][token]) so one 16-byte load gives a k-value for 4 tokens.
template <int kTokens>
struct SharedPlan {
  __host__ __device__ static size_t hidden_floats(int d) { return static_cast<size_t>(d) * kTokens; }  // [D][kTokens]
  __host__ __device__ static size_t latent_floats(int r) { return static_cast<size_t>(r) * kTokens; }  // [R][kTokens]
  static constexpr size_t kReduceFloats =  // partials, [slices][kTokens][cols], the larger phase
      (kDownSlices * kDownCols > kUpSlices * kUpCols ? kDownSlices * kDownCols
                                                     : kUpSlices * kUpCols) * kTokens;
  static size_t bytes(int d, int r) {
    return sizeof(float) * (hidden_floats(d) + latent_floats(r) + kReduceFloats);
  }
};

// Four consecutive columns [col, col+4) of a row-major matrix row; columns >= limit read as 0.
__device__ __forceinline__ float4 load_cols4(const float* row, int col, int limit, bool vec4) {
  if (vec4 && col + 4 <= limit) return __ldg(reinterpret_cast<const float4*>(row + col));
  float4 v;
  v.x = col + 0 < limit ? __ldg(row + col + 0) : 0.f;
  v.y = col + 1 < limit ? __ldg(row + col + 1) : 0.f;
  v.z = col + 2 < limit ? __ldg(row + col + 2) : 0.f;
  v.w = col + 3 < limit ? __ldg(row + col + 3) : 0.f;
  return v;
}

// Element j of the concatenated [w_up_k | w_up_v] row k (j < 2N).
__device__ __forceinline__ float load_up(const FusedParams& p, int k, int j) {
  return j < p.kv_width ? __ldg(p.w_up_k + k * p.w_up_k_stride + j)
                        : __ldg(p.w_up_v + k * p.w_up_v_stride + (j - p.kv_width));
}

__device__ __forceinline__ float4 load_up4(const FusedParams& p, int k, int col) {
  const int n2 = 2 * p.kv_width;
  if (p.w_up_vec4 && col + 4 <= n2) {  // N % 4 == 0, so the group lies in one half
    const float* src = col < p.kv_width ? p.w_up_k + k * p.w_up_k_stride + col
                                        : p.w_up_v + k * p.w_up_v_stride + (col - p.kv_width);
    return __ldg(reinterpret_cast<const float4*>(src));
  }
  float4 v;
  v.x = col + 0 < n2 ? load_up(p, k, col + 0) : 0.f;
  v.y = col + 1 < n2 ? load_up(p, k, col + 1) : 0.f;
  v.z = col + 2 < n2 ? load_up(p, k, col + 2) : 0.f;
  v.w = col + 3 < n2 ? load_up(p, k, col + 3) : 0.f;
  return v;
}

// acc[t][0..3] += a[t] * w for the kTokens values a[t] = tile[k * kTokens + t].
template <int kTokens>
__device__ __forceinline__ void fma_tile(float (&acc)[kTokens][4], const float* tile_k,
                                         const float4 w) {
  static_assert(kTokens % 4 == 0, "token tile is read 4 tokens at a time");
#pragma unroll
  for (int t4 = 0; t4 < kTokens; t4 += 4) {
    const float4 a = *reinterpret_cast<const float4*>(tile_k + t4);
    const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[t4 + i][0] = fmaf(av[i], w.x, acc[t4 + i][0]);
      acc[t4 + i][1] = fmaf(av[i], w.y, acc[t4 + i][1]);
      acc[t4 + i][2] = fmaf(av[i], w.z, acc[t4 + i][2]);
      acc[t4 + i][3] = fmaf(av[i], w.w, acc[t4 + i][3]);
    }
  }
}

template <int kTokens>
__device__ __forceinline__ void store_partials(float* reduce, int slice, int cols, int col,
                                               const float (&acc)[kTokens][4]) {
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    *reinterpret_cast<float4*>(reduce + (slice * kTokens + t) * cols + col) =
        make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
  }
}

template <int kTokens>
__global__ void __launch_bounds__(kThreads)
    fused_kv_proj_fp32_kernel(const __grid_constant__ FusedParams p) {
  extern __shared__ float4 smem_raw[];
  float* hidden_t = reinterpret_cast<float*>(smem_raw);                       // [D][kTokens]
  float* latent_t = hidden_t + SharedPlan<kTokens>::hidden_floats(p.model_dim);  // [R][kTokens]
  float* reduce = latent_t + SharedPlan<kTokens>::latent_floats(p.rank);         // partials

  const int tid = threadIdx.x;
  const int token0 = blockIdx.x * kTokens;
  const int D = p.model_dim, R = p.rank, N = p.kv_width;

  // Stage the hidden tile, transposed; tokens past T read as 0 and are never stored.
  for (int t = 0; t < kTokens; ++t) {
    const int token = token0 + t;
    const bool live = token < p.tokens;
    const float* row = p.hidden + (live ? (token / p.seq) * p.hidden_stride_batch +
                                              (token % p.seq) * p.hidden_stride_seq
                                        : 0);
    if (p.hidden_vec4) {
      for (int k = 4 * tid; k < D; k += 4 * kThreads) {
        const float4 v = live ? __ldg(reinterpret_cast<const float4*>(row + k))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
        hidden_t[(k + 0) * kTokens + t] = v.x;
        hidden_t[(k + 1) * kTokens + t] = v.y;
        hidden_t[(k + 2) * kTokens + t] = v.z;
        hidden_t[(k + 3) * kTokens + t] = v.w;
      }
    } else {
      for (int k = tid; k < D; k += kThreads) hidden_t[k * kTokens + t] = live ? __ldg(row + k) : 0.f;
    }
  }
  __syncthreads();

  // Down projection: latent[t][r] = sum_d hidden[t][d] * w_down[d][r], 64 columns per pass.
  {
    const int group = tid % kDownColGroups, slice = tid / kDownColGroups;
    for (int col0 = 0; col0 < R; col0 += kDownCols) {
      const int col = col0 + 4 * group;
      float acc[kTokens][4] = {};
      if (col < R) {
#pragma unroll 8
        for (int k = slice; k < D; k += kDownSlices) {
          const float4 w = load_cols4(p.w_down + static_cast<int64_t>(k) * p.w_down_stride, col, R,
                                      p.w_down_vec4);
          fma_tile<kTokens>(acc, hidden_t + k * kTokens, w);
        }
      }
      store_partials<kTokens>(reduce, slice, kDownCols, 4 * group, acc);
      __syncthreads();
      for (int i = tid; i < kTokens * kDownCols; i += kThreads) {
        const int t = i / kDownCols, c = i % kDownCols;
        if (col0 + c >= R) continue;
        float sum = 0.f;
#pragma unroll
        for (int s = 0; s < kDownSlices; ++s) sum += reduce[(s * kTokens + t) * kDownCols + c];
        latent_t[(col0 + c) * kTokens + t] = sum;
        const int token = token0 + t;
        if (p.latent != nullptr && token < p.tokens) {
          p.latent[(token / p.seq) * p.latent_stride_batch + (token % p.seq) * p.latent_stride_seq +
                   col0 + c] = sum;
        }
      }
      __syncthreads();
    }
  }

  // Up projection: out[kv][t][j] = sum_r latent[t][r] * w_up_kv[r][j], 256 columns per pass over
  // the 2N columns of [K | V].
  {
    const int group = tid % kUpColGroups, slice = tid / kUpColGroups;
    for (int col0 = 0; col0 < 2 * N; col0 += kUpCols) {
      const int col = col0 + 4 * group;
      float acc[kTokens][4] = {};
      if (col < 2 * N) {
#pragma unroll 4
        for (int k = slice; k < R; k += kUpSlices) {
          fma_tile<kTokens>(acc, latent_t + k * kTokens, load_up4(p, k, col));
        }
      }
      store_partials<kTokens>(reduce, slice, kUpCols, 4 * group, acc);
      __syncthreads();
      for (int i = tid; i < kTokens * kUpCols; i += kThreads) {
        const int t = i / kUpCols, c = i % kUpCols;
        const int token = token0 + t, j = col0 + c;
        if (j >= 2 * N || token >= p.tokens) continue;
        float sum = 0.f;
#pragma unroll
        for (int s = 0; s < kUpSlices; ++s) sum += reduce[(s * kTokens + t) * kUpCols + c];
        const int kv = j >= N, n = j - kv * N;
        const int64_t head_offset =
            p.heads_packed ? n : (n / p.head_dim) * p.out_stride_head + n % p.head_dim;
        p.out[kv * p.out_stride_kv + (token / p.seq) * p.out_stride_batch +
              (token % p.seq) * p.out_stride_seq + head_offset] = sum;
      }
      __syncthreads();
    }
  }
}

// Per-device facts, read once: run() must not query attributes on every call. The opt-in to more
// than 48 KB of dynamic shared memory is likewise done once per device and kernel.
struct DeviceFacts {
  int sm_count = 0;
  size_t smem_optin = 0;
  Status status;
};

constexpr int kMaxDevices = 64;

const DeviceFacts& device_facts(int device) {
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<DeviceFacts, kMaxDevices> facts;
  std::call_once(once[device], [device] {
    DeviceFacts& f = facts[device];
    int smem = 0;
    f.status = cuda_status(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount,
                                                  device),
                           "cudaDeviceGetAttribute(MultiProcessorCount)");
    if (f.status.ok()) {
      f.status = cuda_status(
          cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    }
    f.smem_optin = static_cast<size_t>(smem);
    if (f.status.ok()) {
      f.status = cuda_status(cudaFuncSetAttribute(fused_kv_proj_fp32_kernel<4>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                             "cudaFuncSetAttribute(fused_kv_proj_fp32_kernel<4>)");
    }
    if (f.status.ok()) {
      f.status = cuda_status(cudaFuncSetAttribute(fused_kv_proj_fp32_kernel<16>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                             "cudaFuncSetAttribute(fused_kv_proj_fp32_kernel<16>)");
    }
  });
  return facts[device];
}

Status current_device_facts(const DeviceFacts** out) {
  int device = 0;
  LATENTKV_CUDA_RETURN(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) {
    return {StatusCode::kUnsupported,
            "CUDA device " + std::to_string(device) + " is beyond the " +
                std::to_string(kMaxDevices) + " devices latentkv tracks"};
  }
  *out = &device_facts(device);
  return (*out)->status;
}

// The token tile: 16 tokens per block reuse each weight load 4x more than 4 tokens, which pays
// once there are enough tiles to fill every SM; below that, 4 tokens per block spread the latency
// bound work over more SMs. The larger tile also needs its hidden tile to fit in shared memory.
int choose_token_tile(const Problem& p, const DeviceFacts& f) {
  const int64_t tiles16 = (p.tokens() + 15) / 16;
  const bool fits16 = SharedPlan<16>::bytes(static_cast<int>(p.model_dim),
                                            static_cast<int>(p.rank)) <= f.smem_optin;
  return (fits16 && tiles16 >= f.sm_count) ? 16 : 4;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

Status cuda_fused_supports(const Problem& p) {
  if (p.dtype != DType::kFloat32) {
    return {StatusCode::kUnsupported, std::string("problem.dtype = ") + to_string(p.dtype) +
                                          " is not supported by the cuda-fused strategy yet "
                                          "(float32 only)"};
  }
  // The kernel indexes tokens, columns and in-matrix offsets with int32; tensors are addressed
  // with 64-bit strides.
  const struct {
    const char* name;
    int64_t value;
  } limits[] = {{"tokens (batch * seq)", p.tokens()},
                {"model_dim", p.model_dim},
                {"rank", p.rank},
                {"2 * heads * head_dim", 2 * p.kv_width()},
                {"rank * heads * head_dim", p.rank * p.kv_width()},
                {"model_dim * rank", p.model_dim * p.rank}};
  for (const auto& l : limits) {
    if (l.value > INT_MAX) {
      return {StatusCode::kUnsupported, std::string("problem ") + l.name + " = " +
                                            std::to_string(l.value) +
                                            " exceeds the int32 indexing of the cuda-fused "
                                            "kernel"};
    }
  }
  const DeviceFacts* f = nullptr;
  if (Status s = current_device_facts(&f); !s.ok()) return s;
  const size_t need = SharedPlan<4>::bytes(static_cast<int>(p.model_dim), static_cast<int>(p.rank));
  if (need > f->smem_optin) {
    return {StatusCode::kUnsupported,
            "problem.model_dim = " + std::to_string(p.model_dim) + " with problem.rank = " +
                std::to_string(p.rank) + " needs " + std::to_string(need) +
                " bytes of shared memory per block for the cuda-fused kernel; the device has " +
                std::to_string(f->smem_optin)};
  }
  return Status::Ok();
}

Status run_cuda_fused(const Problem& p, const Args& a, Stream stream) {
  const DeviceFacts* f = nullptr;
  if (Status s = current_device_facts(&f); !s.ok()) return s;

  FusedParams k;
  k.hidden = static_cast<const float*>(a.hidden);
  k.hidden_stride_batch = a.hidden_stride_batch;
  k.hidden_stride_seq = a.hidden_stride_seq;
  k.w_down = static_cast<const float*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.w_up_k = static_cast<const float*>(a.w_up_k);
  k.w_up_v = static_cast<const float*>(a.w_up_v);
  k.w_up_k_stride = a.w_up_k_stride_row;
  k.w_up_v_stride = a.w_up_v_stride_row;
  k.out = static_cast<float*>(a.out);
  k.out_stride_kv = a.out_stride_kv;
  k.out_stride_batch = a.out_stride_batch;
  k.out_stride_seq = a.out_stride_seq;
  k.out_stride_head = a.out_stride_head;
  k.latent = static_cast<float*>(a.latent);
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.tokens = static_cast<int>(p.tokens());
  k.seq = static_cast<int>(p.seq);
  k.model_dim = static_cast<int>(p.model_dim);
  k.rank = static_cast<int>(p.rank);
  k.head_dim = static_cast<int>(p.head_dim);
  k.kv_width = static_cast<int>(p.kv_width());
  k.hidden_vec4 = aligned16(a.hidden) && p.model_dim % 4 == 0 && a.hidden_stride_seq % 4 == 0 &&
                  a.hidden_stride_batch % 4 == 0;
  k.w_down_vec4 = aligned16(a.w_down) && p.rank % 4 == 0 && a.w_down_stride_row % 4 == 0;
  k.w_up_vec4 = aligned16(a.w_up_k) && aligned16(a.w_up_v) && p.kv_width() % 4 == 0 &&
                a.w_up_k_stride_row % 4 == 0 && a.w_up_v_stride_row % 4 == 0;
  k.heads_packed = a.out_stride_head == p.head_dim;

  const int tile = choose_token_tile(p, *f);
  const unsigned blocks = static_cast<unsigned>((p.tokens() + tile - 1) / tile);
  if (tile == 16) {
    fused_kv_proj_fp32_kernel<16><<<blocks, kThreads, SharedPlan<16>::bytes(k.model_dim, k.rank),
                                    stream>>>(k);
  } else {
    fused_kv_proj_fp32_kernel<4><<<blocks, kThreads, SharedPlan<4>::bytes(k.model_dim, k.rank),
                                   stream>>>(k);
  }
  return cuda_status(cudaGetLastError(), "fused_kv_proj_fp32_kernel launch");
}

}  // namespace latentkv::detail
