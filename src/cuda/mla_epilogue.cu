// The MLA path's kernels around its GEMMs (declared and described in mla_epilogue.h). One block
// per token: the token's row of the first GEMM's float32 output is read once from memory (the
// second read, after the norms' statistics, hits L1), the two sums of squares are reduced
// together, k_pe is rotated into shared memory once and broadcast from there into every head's K
// columns and the cache row. Indices and offsets are int64 wherever they reach into a tensor;
// positions and slots outside their tables read and write nothing.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/common.h"
#include "cuda/convert.h"
#include "cuda/cuda_check.h"
#include "cuda/mla_epilogue.h"

namespace latentkv::detail {
namespace {

// Enough threads for the widest rows (Rq + R = 2048 on DeepSeek-V3: 8 values a thread) and for
// H * dr K columns per token (8192: 32 a thread); few enough that T = 4096 still fills the GPU.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0, "whole warps: the reduction is per warp, then across warps");

// x as the dtype would hold it, back in float32 (the value written everywhere it goes).
template <typename T>
__device__ __forceinline__ float rounded(float x) {
  return to_float(from_float<T>(x));
}

// The cache row a token writes or reads: row t (dense) or slots[t]; null for padding (slot < 0),
// for slots past the cache and without a cache.
template <typename T>
__device__ __forceinline__ T* cache_row(const MlaCacheRef& cache, int t, int seq) {
  if (cache.rows == nullptr) return nullptr;
  const int64_t slot =
      cache.slots == nullptr
          ? t
          : cache.slots[token_offset(t, seq, cache.slots_stride_batch, cache.slots_stride_seq)];
  if (slot < 0 || slot >= cache.num_slots) return nullptr;
  return static_cast<T*>(cache.rows) + slot * cache.stride;
}

// Token t's K row [H, dn + dr] from its column dn on (k_pe's columns), or null.
template <typename T>
__device__ __forceinline__ T* k_pe_columns(const MlaKRef& k, int t, int seq, int nope_dim) {
  if (k.data == nullptr) return nullptr;
  return static_cast<T*>(k.data) + token_offset(t, seq, k.stride_batch, k.stride_seq) + nope_dim;
}

// RoPE pair i of dr/2 in each layout: inputs ia, ib rotated into outputs oa, ob; in
// transformers' (cos, sin) form, output oa uses cos/sin column ja and ob column jb.
struct RopePair {
  int ia, ib, oa, ob, ja, jb;
};

__device__ __forceinline__ RopePair rope_pair(RopeStyle style, int i, int half) {
  switch (style) {
    case RopeStyle::kInterleave: return {2 * i, 2 * i + 1, i, i + half, i, i + half};
    case RopeStyle::kGptJ: return {2 * i, 2 * i + 1, 2 * i, 2 * i + 1, i, i};
    case RopeStyle::kNeox: break;
  }
  return {i, i + half, i, i + half, i, i + half};
}

template <typename T, typename RopeT>
__global__ void __launch_bounds__(kThreads) mla_stage_a_epilogue_kernel(const MlaEpilogueParams p) {
  extern __shared__ float pe[];  // [dr]: k_pe after RoPE, rounded to T
  __shared__ float partial[kWarps][2];
  const int t = blockIdx.x;
  const float* row = p.ckv + static_cast<int64_t>(t) * p.ckv_ld;  // [Rq + R + dr]
  const int width = p.q_rank + p.kv_rank;

  float sum_q = 0.f, sum_c = 0.f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const float x = row[i];
    if (i < p.q_rank) {
      sum_q = fmaf(x, x, sum_q);
    } else {
      sum_c = fmaf(x, x, sum_c);
    }
  }

  // RoPE. A position outside [0, max_position) reads nothing and makes the token's k_pe NaN.
  const int half = p.rope_dim / 2;
  const float* pe_in = row + width;  // [dr]
  const RopeT* table = nullptr;      // [dr]: the position's cos_sin_cache row
  bool position_ok = true;
  if (p.positions != nullptr) {
    const int64_t pos =
        p.positions[token_offset(t, p.seq, p.positions_stride_batch, p.positions_stride_seq)];
    position_ok = pos >= 0 && pos < p.max_position;
    if (position_ok) {
      table = static_cast<const RopeT*>(p.cos_sin_cache) + pos * p.cos_sin_cache_stride;
    }
  }
  const RopeT* cos = nullptr;  // [dr] each, transformers' form
  const RopeT* sin = nullptr;
  if (p.positions == nullptr) {
    const int64_t offset = token_offset(t, p.seq, p.cos_stride_batch, p.cos_stride_seq);
    cos = static_cast<const RopeT*>(p.cos) + offset;
    sin = static_cast<const RopeT*>(p.sin) + offset;
  }
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const RopePair r = rope_pair(p.style, i, half);
    if (!position_ok) {
      pe[r.oa] = pe[r.ob] = __int_as_float(0x7fc00000);
      continue;
    }
    float ca, sa, cb, sb;
    if (table != nullptr) {
      ca = cb = to_float(table[i]);
      sa = sb = to_float(table[half + i]);
    } else {
      ca = to_float(cos[r.ja]);
      sa = to_float(sin[r.ja]);
      cb = to_float(cos[r.jb]);
      sb = to_float(sin[r.jb]);
    }
    const float x0 = pe_in[r.ia], x1 = pe_in[r.ib];
    pe[r.oa] = rounded<T>(fmaf(x0, ca, -x1 * sa));
    pe[r.ob] = rounded<T>(fmaf(x1, cb, x0 * sb));
  }

  for (int offset = 16; offset > 0; offset /= 2) {
    sum_q += __shfl_xor_sync(0xffffffffu, sum_q, offset);
    sum_c += __shfl_xor_sync(0xffffffffu, sum_c, offset);
  }
  if (threadIdx.x % 32 == 0) {
    partial[threadIdx.x / 32][0] = sum_q;
    partial[threadIdx.x / 32][1] = sum_c;
  }
  __syncthreads();  // partial[] and pe[] complete; neither is written again
  sum_q = sum_c = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    sum_q += partial[w][0];
    sum_c += partial[w][1];
  }
  const float inv_q = p.q_rank > 0 ? rsqrtf(sum_q / static_cast<float>(p.q_rank) + p.eps) : 0.f;
  const float inv_c = rsqrtf(sum_c / static_cast<float>(p.kv_rank) + p.eps);

  if (p.q_a != nullptr) {
    const T* gamma = static_cast<const T*>(p.q_norm);
    T* out = static_cast<T*>(p.q_a) + token_offset(t, p.seq, p.q_a_stride_batch, p.q_a_stride_seq);
    for (int i = threadIdx.x; i < p.q_rank; i += blockDim.x) {
      out[i] = from_float<T>(row[i] * inv_q * to_float(gamma[i]));
    }
  }

  T* cache = cache_row<T>(p.cache, t, p.seq);  // [R + dr] or null
  T* latent = p.latent == nullptr
                  ? nullptr
                  : static_cast<T*>(p.latent) + static_cast<int64_t>(t) * p.kv_rank;
  const T* gamma = static_cast<const T*>(p.kv_norm);
  for (int i = threadIdx.x; i < p.kv_rank; i += blockDim.x) {
    const T c = from_float<T>(row[p.q_rank + i] * inv_c * to_float(gamma[i]));
    if (cache != nullptr) cache[i] = c;
    if (latent != nullptr) latent[i] = c;
  }
  if (cache != nullptr) {
    for (int j = threadIdx.x; j < p.rope_dim; j += blockDim.x) {
      cache[p.kv_rank + j] = from_float<T>(pe[j]);
    }
  }
  if (T* k = k_pe_columns<T>(p.k, t, p.seq, p.nope_dim); k != nullptr) {
    const int columns = p.heads * p.rope_dim;
    for (int idx = threadIdx.x; idx < columns; idx += blockDim.x) {
      const int h = idx / p.rope_dim, j = idx % p.rope_dim;
      k[h * p.k.stride_head + j] = from_float<T>(pe[j]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    mla_stage_b_inputs_kernel(const MlaStageBInputParams p) {
  const int t = blockIdx.x;
  const T* pe = nullptr;  // [dr]; null: a skipped slot, zeros
  const T* c = nullptr;   // [R]
  if (p.k_pe != nullptr) {
    pe = static_cast<const T*>(p.k_pe) +
         token_offset(t, p.seq, p.k_pe_stride_batch, p.k_pe_stride_seq);
  } else if ((c = cache_row<const T>(p.cache, t, p.seq)) != nullptr) {
    pe = c + p.kv_rank;
  }
  const T zero = from_float<T>(0.f);
  if (p.latent != nullptr) {
    T* latent = static_cast<T*>(p.latent) + static_cast<int64_t>(t) * p.kv_rank;
    for (int i = threadIdx.x; i < p.kv_rank; i += blockDim.x) latent[i] = c ? c[i] : zero;
  }
  T* k = k_pe_columns<T>(p.k, t, p.seq, p.nope_dim);
  const int columns = p.heads * p.rope_dim;
  for (int idx = threadIdx.x; idx < columns; idx += blockDim.x) {
    const int h = idx / p.rope_dim, j = idx % p.rope_dim;
    k[h * p.k.stride_head + j] = pe ? pe[j] : zero;
  }
}

template <typename T, typename RopeT>
Status launch_epilogue(const MlaEpilogueParams& p, Stream stream) {
  const size_t smem = static_cast<size_t>(p.rope_dim) * sizeof(float);
  mla_stage_a_epilogue_kernel<T, RopeT><<<p.tokens, kThreads, smem, stream>>>(p);
  return cuda_status(cudaGetLastError(), "mla_stage_a_epilogue_kernel launch");
}

template <typename T>
Status launch_epilogue_rope(const MlaEpilogueParams& p, Stream stream) {
  return p.rope_dtype == DType::kFloat32 ? launch_epilogue<T, float>(p, stream)
                                         : launch_epilogue<T, T>(p, stream);
}

template <typename T>
Status launch_inputs(const MlaStageBInputParams& p, Stream stream) {
  mla_stage_b_inputs_kernel<T><<<p.tokens, kThreads, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "mla_stage_b_inputs_kernel launch");
}

}  // namespace

Status launch_mla_stage_a_epilogue(const MlaEpilogueParams& p, Stream stream) {
  switch (p.dtype) {
    case DType::kFloat32: return launch_epilogue<float, float>(p, stream);
    case DType::kBFloat16: return launch_epilogue_rope<__nv_bfloat16>(p, stream);
    case DType::kFloat16: return launch_epilogue_rope<__half>(p, stream);
  }
  return {StatusCode::kUnsupported, std::string("problem.dtype = ") + to_string(p.dtype)};
}

Status launch_mla_stage_b_inputs(const MlaStageBInputParams& p, Stream stream) {
  switch (p.dtype) {
    case DType::kFloat32: return launch_inputs<float>(p, stream);
    case DType::kBFloat16: return launch_inputs<__nv_bfloat16>(p, stream);
    case DType::kFloat16: return launch_inputs<__half>(p, stream);
  }
  return {StatusCode::kUnsupported, std::string("problem.dtype = ") + to_string(p.dtype)};
}

}  // namespace latentkv::detail
