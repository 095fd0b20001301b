// EXPERIMENT (not shipped): the split-K decode strategy as it was tried (commit
// "cuda-splitk" in the history, wired as Strategy::kCudaSplitK). Correct on every GPU test
// (errors 1.6e-3 vs cuBLAS's 2.3e-3 for bf16) but slower than cuda-gemm on one H200 at every
// DeepSeek decode size (numbers and what to look at next: docs/experiments.md). Kept to build
// on, not compiled.
//
// The split-K decode strategy (Strategy::kCudaSplitK): for a few tokens (T <= 8) and large weights
// (DeepSeek decode), the cost is streaming the weights once, so the work is cut into pieces that
// put every SM on the weight stream:
//   1. down_partials: block c takes rows [c*16, c*16+16) of w_down and writes the partial latent
//      of those rows, partials[c][t][r] (float32, workspace);
//   2. reduce_latent: sums the partials into latent[t][r] (float32, workspace; also the caller's
//      latent output, rounded to the dtype);
//   3. up_project: block b takes 64 of the 2N columns of [w_up_k | w_up_v] over all of R, the
//      latent staged in shared memory, and writes them into the stacked output.
// Three launches on the caller's stream (no host synchronization, graph-capturable); float32
// accumulation for every dtype, and the latent stays float32 between the stages (the unfused
// baseline rounds it to the dtype, so this is at least as accurate).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "backends.h"
#include "cuda/cuda_check.h"

namespace latentkv::detail {
namespace {

constexpr int kMaxTokens = 8;           // acc registers per thread: kMaxTokens x 4
constexpr int kThreads = 256;
constexpr int kDownRows = 16;           // w_down rows per block of stage 1
constexpr int kDownColsPerPass = 4 * kThreads;  // 4 latent columns per thread
constexpr int kReduceCols = 32;         // latent columns per block of stage 2 (one per lane)
constexpr int kUpColGroups = 16;        // x4 = 64 output columns per block of stage 3
constexpr int kUpCols = 4 * kUpColGroups;
constexpr int kUpSlices = kThreads / kUpColGroups;  // 16 slices of R
constexpr int kUpBatch = 16;            // weight loads in flight per thread in stage 3

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

// Four consecutive elements as floats, one 8- or 16-byte load (the caller checked alignment).
template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return __ldg(reinterpret_cast<const float4*>(p));
  } else {
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(p));
    const T* v = reinterpret_cast<const T*>(&raw);
    return make_float4(to_float(v[0]), to_float(v[1]), to_float(v[2]), to_float(v[3]));
  }
}

template <typename T>
struct DecodeParams {
  const T* hidden;  // [B, S, D]
  int64_t hidden_stride_batch, hidden_stride_seq;
  const T* w_down;  // [D, R]
  int64_t w_down_stride;
  const T* w_up_k;  // [R, N]
  const T* w_up_v;  // [R, N]
  int64_t w_up_k_stride, w_up_v_stride;
  T* out;  // [2, B, S, H, Dh]
  int64_t out_stride_kv, out_stride_batch, out_stride_seq, out_stride_head;
  T* latent_out;  // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
  float* partials;  // [chunks][T][R], workspace
  float* latent;    // [T][R], workspace
  int tokens, seq, model_dim, rank, head_dim, kv_width, chunks;
};

__device__ __forceinline__ int64_t token_offset(int token, int seq, int64_t stride_batch,
                                                int64_t stride_seq) {
  return (token / seq) * stride_batch + (token % seq) * stride_seq;
}

// Stage 1: partials[c][t][r] = sum over this block's 16 rows d of hidden[t][d] * w_down[d][r].
template <typename T>
__global__ void __launch_bounds__(kThreads) down_partials(const __grid_constant__ DecodeParams<T> p) {
  __shared__ float x[kMaxTokens][kDownRows];  // [T][rows of this chunk]
  const int d0 = blockIdx.x * kDownRows;
  const int rows = min(kDownRows, p.model_dim - d0);
  for (int i = threadIdx.x; i < p.tokens * kDownRows; i += kThreads) {
    const int t = i / kDownRows, r = i % kDownRows;
    x[t][r] = r < rows ? to_float(p.hidden[token_offset(t, p.seq, p.hidden_stride_batch,
                                                           p.hidden_stride_seq) + d0 + r])
                       : 0.f;
  }
  __syncthreads();
  for (int col = 4 * threadIdx.x; col < p.rank; col += kDownColsPerPass) {
    float4 w[kDownRows];
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) {
      w[r] = r < rows ? load4(p.w_down + (d0 + r) * p.w_down_stride + col)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int t = 0; t < p.tokens; ++t) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int r = 0; r < kDownRows; ++r) {
        acc.x = fmaf(x[t][r], w[r].x, acc.x);
        acc.y = fmaf(x[t][r], w[r].y, acc.y);
        acc.z = fmaf(x[t][r], w[r].z, acc.z);
        acc.w = fmaf(x[t][r], w[r].w, acc.w);
      }
      *reinterpret_cast<float4*>(p.partials + (int64_t{blockIdx.x} * p.tokens + t) * p.rank +
                                 col) = acc;
    }
  }
}

// Stage 2: latent[t][r] = sum_c partials[c][t][r]; each warp sums every 8th chunk for 32 columns.
template <typename T>
__global__ void __launch_bounds__(kThreads) reduce_latent(const __grid_constant__ DecodeParams<T> p) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float part[kWarps][kMaxTokens][kReduceCols];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r = blockIdx.x * kReduceCols + lane;
  float acc[kMaxTokens] = {};
  if (r < p.rank) {
#pragma unroll 4
    for (int c = warp; c < p.chunks; c += kWarps) {
#pragma unroll
      for (int t = 0; t < kMaxTokens; ++t) {
        if (t < p.tokens) acc[t] += p.partials[(int64_t{c} * p.tokens + t) * p.rank + r];
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) part[warp][t][lane] = acc[t];
  __syncthreads();
  for (int i = threadIdx.x; i < p.tokens * kReduceCols; i += kThreads) {
    const int t = i / kReduceCols, c = i % kReduceCols, rr = blockIdx.x * kReduceCols + c;
    if (rr >= p.rank) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += part[w][t][c];
    p.latent[t * p.rank + rr] = sum;
    if (p.latent_out != nullptr) {
      p.latent_out[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + rr] =
          from_float<T>(sum);
    }
  }
}

// Stage 3: out[kv][t][j] = sum_r latent[t][r] * w_up_kv[r][j] for this block's 64 columns of
// [K | V]; thread = (4 columns, slice of R), the slices meet in shared memory.
template <typename T>
__global__ void __launch_bounds__(kThreads) up_project(const __grid_constant__ DecodeParams<T> p) {
  extern __shared__ float4 smem_raw[];
  float* latent = reinterpret_cast<float*>(smem_raw);  // [R][kMaxTokens]
  float* reduce = latent + p.rank * kMaxTokens;        // [kUpSlices][kMaxTokens][kUpCols]
  for (int i = threadIdx.x; i < p.rank * kMaxTokens; i += kThreads) {
    const int r = i / kMaxTokens, t = i % kMaxTokens;
    latent[i] = t < p.tokens ? p.latent[t * p.rank + r] : 0.f;
  }
  __syncthreads();
  const int group = threadIdx.x % kUpColGroups, slice = threadIdx.x / kUpColGroups;
  const int col = blockIdx.x * kUpCols + 4 * group;  // in [0, 2N); N % 4 == 0
  const int N = p.kv_width;
  float acc[kMaxTokens][4] = {};
  if (col < 2 * N) {
    const T* w = col < N ? p.w_up_k + col : p.w_up_v + (col - N);
    const int64_t ld = col < N ? p.w_up_k_stride : p.w_up_v_stride;
    for (int k0 = slice; k0 < p.rank; k0 += kUpSlices * kUpBatch) {
      float4 wv[kUpBatch];
#pragma unroll
      for (int b = 0; b < kUpBatch; ++b) {
        const int k = k0 + b * kUpSlices;
        wv[b] = k < p.rank ? load4(w + k * ld) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int b = 0; b < kUpBatch; ++b) {
        const int k = k0 + b * kUpSlices;
        if (k >= p.rank) break;
#pragma unroll
        for (int t4 = 0; t4 < kMaxTokens; t4 += 4) {
          const float4 a = *reinterpret_cast<const float4*>(latent + k * kMaxTokens + t4);
          const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[t4 + i][0] = fmaf(av[i], wv[b].x, acc[t4 + i][0]);
            acc[t4 + i][1] = fmaf(av[i], wv[b].y, acc[t4 + i][1]);
            acc[t4 + i][2] = fmaf(av[i], wv[b].z, acc[t4 + i][2]);
            acc[t4 + i][3] = fmaf(av[i], wv[b].w, acc[t4 + i][3]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    *reinterpret_cast<float4*>(reduce + (slice * kMaxTokens + t) * kUpCols + 4 * group) =
        make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < p.tokens * kUpCols; i += kThreads) {
    const int t = i / kUpCols, c = i % kUpCols, j = blockIdx.x * kUpCols + c;
    if (j >= 2 * N) continue;
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < kUpSlices; ++s) sum += reduce[(s * kMaxTokens + t) * kUpCols + c];
    const int kv = j >= N, n = j - kv * N;
    p.out[kv * p.out_stride_kv +
          token_offset(t, p.seq, p.out_stride_batch, p.out_stride_seq) +
          (n / p.head_dim) * p.out_stride_head + n % p.head_dim] = from_float<T>(sum);
  }
}

size_t up_smem_bytes(int rank) {
  return sizeof(float) * (static_cast<size_t>(rank) * kMaxTokens + kUpSlices * kMaxTokens * kUpCols);
}

int64_t chunks_of(const Problem& p) { return (p.model_dim + kDownRows - 1) / kDownRows; }

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

template <typename T>
Status launch(const Problem& p, const Args& a, Stream stream) {
  DecodeParams<T> k;
  k.hidden = static_cast<const T*>(a.hidden);
  k.hidden_stride_batch = a.hidden_stride_batch;
  k.hidden_stride_seq = a.hidden_stride_seq;
  k.w_down = static_cast<const T*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.w_up_k = static_cast<const T*>(a.w_up_k);
  k.w_up_v = static_cast<const T*>(a.w_up_v);
  k.w_up_k_stride = a.w_up_k_stride_row;
  k.w_up_v_stride = a.w_up_v_stride_row;
  k.out = static_cast<T*>(a.out);
  k.out_stride_kv = a.out_stride_kv;
  k.out_stride_batch = a.out_stride_batch;
  k.out_stride_seq = a.out_stride_seq;
  k.out_stride_head = a.out_stride_head;
  k.latent_out = static_cast<T*>(a.latent);
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.tokens = static_cast<int>(p.tokens());
  k.seq = static_cast<int>(p.seq);
  k.model_dim = static_cast<int>(p.model_dim);
  k.rank = static_cast<int>(p.rank);
  k.head_dim = static_cast<int>(p.head_dim);
  k.kv_width = static_cast<int>(p.kv_width());
  k.chunks = static_cast<int>(chunks_of(p));
  k.partials = static_cast<float*>(a.workspace);
  k.latent = k.partials + chunks_of(p) * p.tokens() * p.rank;

  down_partials<T><<<k.chunks, kThreads, 0, stream>>>(k);
  LATENTKV_CUDA_RETURN(cudaGetLastError());
  reduce_latent<T><<<(k.rank + kReduceCols - 1) / kReduceCols, kThreads, 0, stream>>>(k);
  LATENTKV_CUDA_RETURN(cudaGetLastError());
  const int up_blocks = (2 * k.kv_width + kUpCols - 1) / kUpCols;
  up_project<T><<<up_blocks, kThreads, up_smem_bytes(k.rank), stream>>>(k);
  return cuda_status(cudaGetLastError(), "up_project launch");
}

}  // namespace

int64_t cuda_splitk_workspace_size(const Problem& p) {
  if (p.tokens() > kMaxTokens) return 0;  // not a problem this strategy takes
  return static_cast<int64_t>(sizeof(float)) * (chunks_of(p) + 1) * p.tokens() * p.rank;
}

Status cuda_splitk_supports(const Problem& p, const Args& a) {
  const auto refuse = [](const std::string& why) {
    return Status{StatusCode::kUnsupported, "cuda-splitk: " + why};
  };
  if (p.tokens() > kMaxTokens) {
    return refuse("problem tokens (batch * seq) = " + std::to_string(p.tokens()) +
                  " exceeds the " + std::to_string(kMaxTokens) + " it is built for");
  }
  if (up_smem_bytes(static_cast<int>(std::min<int64_t>(p.rank, INT_MAX / 64))) > 48 * 1024) {
    return refuse("problem.rank = " + std::to_string(p.rank) +
                  " needs more than 48 KB of shared memory");
  }
  if (2 * p.kv_width() > INT_MAX / 2 || p.model_dim > INT_MAX / 2) {
    return refuse("sizes exceed its int32 indexing");
  }
  // Every weight row is read 4 elements at a time.
  const int64_t vec = 4 * element_size(p.dtype);
  if (p.rank % 4 != 0 || p.kv_width() % 4 != 0 || a.w_down_stride_row % 4 != 0 ||
      a.w_up_k_stride_row % 4 != 0 || a.w_up_v_stride_row % 4 != 0 || !aligned(a.w_down, vec) ||
      !aligned(a.w_up_k, vec) || !aligned(a.w_up_v, vec)) {
    return refuse("needs rank, heads * head_dim and the weight row strides to be multiples of 4 "
                  "and the weights aligned to " + std::to_string(vec) + " bytes");
  }
  if (a.workspace == nullptr || a.workspace_bytes < cuda_splitk_workspace_size(p) ||
      !aligned(a.workspace, 16)) {
    return {StatusCode::kInvalidArgument,
            "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                ": cuda-splitk needs a 16-byte aligned workspace of " +
                std::to_string(cuda_splitk_workspace_size(p)) + " bytes"};
  }
  return Status::Ok();
}

Status run_cuda_splitk(const Problem& p, const Args& a, Stream stream) {
  switch (p.dtype) {
    case DType::kFloat32: return launch<float>(p, a, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, a, stream);
    case DType::kFloat16: return launch<__half>(p, a, stream);
  }
  return {StatusCode::kUnsupported, "cuda-splitk: unknown dtype"};
}

}  // namespace latentkv::detail
