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
#include "cuda/mla_rope.h"

namespace latentkv::detail {
namespace {

// Enough threads for the widest rows (Rq + R = 2048 on DeepSeek-V3: 8 values a thread) and for
// H * dr K columns per token (8192: 32 a thread); few enough that T = 4096 still fills the GPU.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0, "whole warps: the reduction is per warp, then across warps");

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

  // RoPE (mla_rope.h). A position outside [0, max_position) reads nothing: the token's k_pe NaN.
  const int half = p.rope_dim / 2;
  const float* pe_in = row + width;  // [dr]
  const RopeAngles<RopeT> angles = rope_angles<RopeT>(p, t);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    rope_rotate_pair<T, RopeT>(p.style, angles, i, half, pe_in, pe);
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

  T* cache = mla_cache_row<T>(p.cache, t, p.seq);  // [R + dr] or null
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
  if (T* k = mla_k_pe_columns<T>(p.k, t, p.seq, p.nope_dim); k != nullptr) {
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
  } else if ((c = mla_cache_row<const T>(p.cache, t, p.seq)) != nullptr) {
    pe = c + p.kv_rank;
  }
  const T zero = from_float<T>(0.f);
  if (p.latent != nullptr) {
    T* latent = static_cast<T*>(p.latent) + static_cast<int64_t>(t) * p.kv_rank;
    for (int i = threadIdx.x; i < p.kv_rank; i += blockDim.x) latent[i] = c ? c[i] : zero;
  }
  T* k = mla_k_pe_columns<T>(p.k, t, p.seq, p.nope_dim);
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

Status mla_elements_aligned(const MlaArgs& a, int64_t eb, int64_t rope_eb) {
  const struct {
    const char* name;
    const void* ptr;
    int64_t bytes;
  } pointers[] = {{"args.hidden", a.hidden, eb},
                  {"args.kv_a_weight", a.kv_a_weight, eb},
                  {"args.kv_a_norm_weight", a.kv_a_norm_weight, eb},
                  {"args.q_a_weight", a.q_a_weight, eb},
                  {"args.q_a_norm_weight", a.q_a_norm_weight, eb},
                  {"args.positions", a.positions, 8},
                  {"args.cos_sin_cache", a.cos_sin_cache, rope_eb},
                  {"args.cos", a.cos, rope_eb},
                  {"args.sin", a.sin, rope_eb},
                  {"args.q_a", a.q_a, eb},
                  {"args.kv_cache", a.kv_cache, eb},
                  {"args.slot_mapping", a.slot_mapping, 8},
                  {"args.latent", a.latent, eb},
                  {"args.k_pe", a.k_pe, eb},
                  {"args.kv_b_weight", a.kv_b_weight, eb},
                  {"args.k", a.k, eb},
                  {"args.v", a.v, eb}};
  for (const auto& ptr : pointers) {
    if (ptr.ptr != nullptr && !is_aligned(ptr.ptr, ptr.bytes)) {
      return {StatusCode::kInvalidArgument,
              std::string(ptr.name) + " = " + std::to_string(reinterpret_cast<uintptr_t>(ptr.ptr)) +
                  " is not aligned to its " + std::to_string(ptr.bytes) + "-byte elements"};
    }
  }
  return Status::Ok();
}

MlaEpilogueParams mla_epilogue_params(const MlaProblem& p, const MlaArgs& a, int64_t q_rank) {
  MlaEpilogueParams e{};
  e.tokens = static_cast<int>(p.tokens());
  e.seq = static_cast<int>(p.seq);
  e.q_rank = static_cast<int>(q_rank);
  e.kv_rank = static_cast<int>(p.kv_rank);
  e.rope_dim = static_cast<int>(p.rope_dim);
  e.heads = static_cast<int>(p.heads);
  e.nope_dim = static_cast<int>(p.nope_dim);
  e.eps = p.eps;
  e.dtype = p.dtype;
  e.rope_dtype = p.rope_dtype;
  e.style = p.rope_style;
  e.q_norm = q_rank > 0 ? a.q_a_norm_weight : nullptr;
  e.kv_norm = a.kv_a_norm_weight;
  e.positions = a.positions;
  e.positions_stride_batch = a.positions_stride_batch;
  e.positions_stride_seq = a.positions_stride_seq;
  e.cos_sin_cache = a.cos_sin_cache;
  e.cos_sin_cache_stride = a.cos_sin_cache_stride_row;
  e.max_position = a.max_position;
  e.cos = a.cos;
  e.sin = a.sin;
  e.cos_stride_batch = a.cos_stride_batch;
  e.cos_stride_seq = a.cos_stride_seq;
  e.q_a = q_rank > 0 ? a.q_a : nullptr;
  e.q_a_stride_batch = a.q_a_stride_batch;
  e.q_a_stride_seq = a.q_a_stride_seq;
  e.cache = {a.kv_cache,     a.kv_cache_stride_slot,      a.num_slots,
             a.slot_mapping, a.slot_mapping_stride_batch, a.slot_mapping_stride_seq};
  return e;
}

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
