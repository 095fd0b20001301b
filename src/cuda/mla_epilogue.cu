// The MLA path's kernels around its GEMMs (declared and described in mla_epilogue.h). A group of
// G warps per token (G = 1, 2, 4 or 8: enough warps that T * G reaches kTargetWarps), 8 warps a
// block, so that a prefill's tokens are resident at once and every token's loads are in flight
// together (one 256-thread block per token waited on several dependent memory round trips per
// token, four waves deep at T = 4096; one warp per token at T = 1024 left 8 warps an SM). A token's
// RoPE angles are loaded first; its row of the first GEMM's float32 output is read once from
// memory for the sums of squares (the second read, for the writes, hits L1); k_pe is rotated into
// shared memory and broadcast from there into every head's K columns with 16-byte stores where
// K's row and head stride allow (each lane packs one vector and stores it to every head it owns:
// V3 writes 16 KB of k_pe columns per token) and into the cache row. Indices and offsets are
// int64 wherever they reach into a tensor; positions and slots outside their tables read and
// write nothing.
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

// Eight warps a block (kMlaEpilogueWarps); 8 / G tokens a block.
constexpr int kWarps = static_cast<int>(kMlaEpilogueWarps);
constexpr int kThreads = kWarps * 32;
constexpr int kVectorBytes = 16;
// Warps the whole launch should have: 4096 is what one warp per token gives at T = 4096 (measured
// there: 512 blocks, about 4 an SM on an H200), half of the 132 x 64 warps an H200 keeps resident.
constexpr int64_t kTargetWarps = 4096;
static_assert(kMlaEpilogueMaxRopeDim * kWarps * sizeof(float) + kWarps * 2 * sizeof(float) <=
                  48 * 1024,
              "the tokens' k_pe and the partial sums fit the default shared memory");

// Warps per token for `tokens` tokens: a power of two dividing kWarps.
int group_warps(int tokens) {
  int g = 1;
  while (g < kWarps && static_cast<int64_t>(tokens) * g < kTargetWarps) g *= 2;
  return g;
}

// The warp's place in its token's group.
struct Group {
  int warps;    // G
  int slot;     // the block's token it works on, < kWarps / G
  int rank;     // its warp within the group, < G
  int thread;   // rank * 32 + lane, < G * 32
  int threads;  // G * 32
};

__device__ __forceinline__ Group group_of(int warps) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  return {warps, warp / warps, warp % warps, (warp % warps) * 32 + lane, warps * 32};
}

// k_pe [dr] (shared memory, float32, each value already rounded to T) written into K's columns
// dn .. dn + dr of every head of token row `k` ([H, dn + dr] from column dn, head stride
// `stride_head`) by one warp group, each warp taking every G-th pass of heads. Where dr splits
// into 16-byte vectors whose count divides 32 and K's row and head stride are 16-byte aligned,
// each lane packs one vector once and stores it to every head it owns; else one element per
// thread and store.
template <typename T>
__device__ __forceinline__ void broadcast_k_pe(T* k, int64_t stride_head, int heads,
                                               int rope_dim, const float* pe, const Group& g) {
  constexpr int kPerVector = kVectorBytes / static_cast<int>(sizeof(T));
  const int vectors = rope_dim / kPerVector;  // per head
  const bool vectorized = rope_dim % kPerVector == 0 && vectors > 0 && 32 % vectors == 0 &&
                          reinterpret_cast<uintptr_t>(k) % kVectorBytes == 0 &&
                          (stride_head * static_cast<int64_t>(sizeof(T))) % kVectorBytes == 0;
  if (vectorized) {
    struct alignas(kVectorBytes) Vector {
      T e[kPerVector];
    } v;
    const int lane = threadIdx.x % 32;
    const int q = lane % vectors;
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) v.e[e] = from_float<T>(pe[q * kPerVector + e]);
    const int heads_per_pass = 32 / vectors;  // per warp
    for (int h = g.rank * heads_per_pass + lane / vectors; h < heads;
         h += heads_per_pass * g.warps) {
      *reinterpret_cast<Vector*>(k + h * stride_head + q * kPerVector) = v;
    }
    return;
  }
  const int columns = heads * rope_dim;
  for (int idx = g.thread; idx < columns; idx += g.threads) {
    const int h = idx / rope_dim, j = idx % rope_dim;
    k[h * stride_head + j] = from_float<T>(pe[j]);
  }
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <typename T, typename RopeT>
__global__ void __launch_bounds__(kThreads)
    mla_stage_a_epilogue_kernel(const MlaEpilogueParams p, int warps_per_token) {
  extern __shared__ float pe_all[];  // [kWarps / G][dr]: each token's k_pe after RoPE, rounded
  __shared__ float partial[kWarps][2];  // each warp's sums of squares (q_a, c)
  const Group g = group_of(warps_per_token);
  const int t = blockIdx.x * (kWarps / g.warps) + g.slot;
  const bool active = t < p.tokens;  // every thread reaches the barrier below
  float* pe = pe_all + g.slot * p.rope_dim;
  float* row = p.ckv + static_cast<int64_t>(active ? t : 0) * p.ckv_ld;  // [Rq + R + dr]
  const int width = p.q_rank + p.kv_rank;
  if (p.ckv_splits > 1) {
    // The slices' partial products summed in slice order into the first plane; the barrier makes
    // them visible to the group's other threads.
    if (active) {
      for (int i = g.thread; i < width + p.rope_dim; i += g.threads) {
        float x = row[i];
        for (int s = 1; s < p.ckv_splits; ++s) x += row[s * p.ckv_split_stride + i];
        row[i] = x;
      }
    }
    __syncthreads();
  }

  float sum_q = 0.f, sum_c = 0.f;
  if (active) {
    // RoPE (mla_rope.h): the angles first, the loads that do not depend on the GEMM's output. A
    // position outside [0, max_position) reads nothing: the token's k_pe NaN.
    const int half = p.rope_dim / 2;
    const RopeAngles<RopeT> angles = rope_angles<RopeT>(p, t);
    const float* pe_in = row + width;  // [dr]
    for (int i = g.thread; i < half; i += g.threads) {
      rope_rotate_pair<T, RopeT>(p.style, angles, i, half, pe_in, pe);
    }
#pragma unroll 4
    for (int i = g.thread; i < p.q_rank; i += g.threads) sum_q = fmaf(row[i], row[i], sum_q);
#pragma unroll 4
    for (int i = p.q_rank + g.thread; i < width; i += g.threads) {
      sum_c = fmaf(row[i], row[i], sum_c);
    }
  }
  sum_q = warp_sum(sum_q);
  sum_c = warp_sum(sum_c);
  if (threadIdx.x % 32 == 0) {
    partial[threadIdx.x / 32][0] = sum_q;
    partial[threadIdx.x / 32][1] = sum_c;
  }
  __syncthreads();  // partial[] and pe[] complete; neither is written again
  if (!active) return;
  sum_q = sum_c = 0.f;
  for (int w = g.slot * g.warps; w < (g.slot + 1) * g.warps; ++w) {
    sum_q += partial[w][0];
    sum_c += partial[w][1];
  }
  const float inv_q = p.q_rank > 0 ? rsqrtf(sum_q / static_cast<float>(p.q_rank) + p.eps) : 0.f;
  const float inv_c = rsqrtf(sum_c / static_cast<float>(p.kv_rank) + p.eps);

  if (T* k = mla_k_pe_columns<T>(p.k, t, p.seq, p.nope_dim); k != nullptr) {
    broadcast_k_pe<T>(k, p.k.stride_head, p.heads, p.rope_dim, pe, g);
  }
  if (p.q_a != nullptr) {
    const T* gamma = static_cast<const T*>(p.q_norm);
    T* out = static_cast<T*>(p.q_a) + token_offset(t, p.seq, p.q_a_stride_batch, p.q_a_stride_seq);
    for (int i = g.thread; i < p.q_rank; i += g.threads) {
      out[i] = from_float<T>(row[i] * inv_q * to_float(gamma[i]));
    }
  }
  T* cache = mla_cache_row<T>(p.cache, t, p.seq);  // [R + dr] or null
  T* latent = p.latent == nullptr
                  ? nullptr
                  : static_cast<T*>(p.latent) + static_cast<int64_t>(t) * p.kv_rank;
  const T* gamma = static_cast<const T*>(p.kv_norm);
  for (int i = g.thread; i < p.kv_rank; i += g.threads) {
    const T c = from_float<T>(row[p.q_rank + i] * inv_c * to_float(gamma[i]));
    if (cache != nullptr) cache[i] = c;
    if (latent != nullptr) latent[i] = c;
  }
  if (cache != nullptr) {
    for (int j = g.thread; j < p.rope_dim; j += g.threads) {
      cache[p.kv_rank + j] = from_float<T>(pe[j]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    mla_stage_b_inputs_kernel(const MlaStageBInputParams p, int warps_per_token) {
  extern __shared__ float pe_all[];  // [kWarps][dr]: each warp's own copy of its token's k_pe
  const Group g = group_of(warps_per_token);
  const int t = blockIdx.x * (kWarps / g.warps) + g.slot;
  if (t >= p.tokens) return;  // no block-wide barrier below: each warp fills its own copy
  float* pe_row = pe_all + (threadIdx.x / 32) * p.rope_dim;
  const T* pe = nullptr;  // [dr]; null: a skipped slot, zeros
  const T* c = nullptr;   // [R]
  if (p.k_pe != nullptr) {
    pe = static_cast<const T*>(p.k_pe) +
         token_offset(t, p.seq, p.k_pe_stride_batch, p.k_pe_stride_seq);
  } else if ((c = mla_cache_row<const T>(p.cache, t, p.seq)) != nullptr) {
    pe = c + p.kv_rank;
  }
  for (int j = threadIdx.x % 32; j < p.rope_dim; j += 32) pe_row[j] = pe ? to_float(pe[j]) : 0.f;
  const T zero = from_float<T>(0.f);
  if (p.latent != nullptr) {
    T* latent = static_cast<T*>(p.latent) + static_cast<int64_t>(t) * p.kv_rank;
    for (int i = g.thread; i < p.kv_rank; i += g.threads) latent[i] = c ? c[i] : zero;
  }
  __syncwarp();  // pe_row complete
  if (T* k = mla_k_pe_columns<T>(p.k, t, p.seq, p.nope_dim); k != nullptr) {
    broadcast_k_pe<T>(k, p.k.stride_head, p.heads, p.rope_dim, pe_row, g);
  }
}

unsigned blocks(int tokens, int warps_per_token) {
  return static_cast<unsigned>(ceil_div<int64_t>(tokens, kWarps / warps_per_token));
}

template <typename T, typename RopeT>
Status launch_epilogue(const MlaEpilogueParams& p, Stream stream) {
  const int g = group_warps(p.tokens);
  const size_t smem = static_cast<size_t>(kWarps / g) * p.rope_dim * sizeof(float);
  mla_stage_a_epilogue_kernel<T, RopeT><<<blocks(p.tokens, g), kThreads, smem, stream>>>(p, g);
  return cuda_status(cudaGetLastError(), "mla_stage_a_epilogue_kernel launch");
}

template <typename T>
Status launch_epilogue_rope(const MlaEpilogueParams& p, Stream stream) {
  return p.rope_dtype == DType::kFloat32 ? launch_epilogue<T, float>(p, stream)
                                         : launch_epilogue<T, T>(p, stream);
}

template <typename T>
Status launch_inputs(const MlaStageBInputParams& p, Stream stream) {
  const int g = group_warps(p.tokens);
  const size_t smem = static_cast<size_t>(kWarps) * p.rope_dim * sizeof(float);
  mla_stage_b_inputs_kernel<T><<<blocks(p.tokens, g), kThreads, smem, stream>>>(p, g);
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
  e.ckv_splits = 1;
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
