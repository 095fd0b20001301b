// The MLA path's kernels around its GEMMs (declared and described in mla_epilogue.h). A group of
// G warps per token (G = 1, 2, 4 or 8: enough warps that T * G reaches its target, more where a
// block's tokens would not fit its shared memory), 8 warps a block, so that a prefill's tokens
// are resident at once and every token's loads are in flight together. The stage-A epilogue
// issues all of a token's global reads before it waits on any (its ckv row's planes copied into
// shared memory by cp.async, its cache slot, its RoPE angles, the norm weights), so that it
// waits on about two memory round trips (position, then angles) before its stores. k_pe is
// rotated into shared memory and broadcast from there into every head's K columns with 16-byte
// stores where K's row and head stride allow (each lane packs one vector and stores it to every
// head it owns: V3 writes 16 KB of k_pe columns per token) and into the cache row. Indices and
// offsets are int64 wherever they reach into a tensor; positions and slots outside their tables
// read and write nothing.
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
#include "cuda/ptx.h"

namespace latentkv::detail {
namespace {

// Eight warps a block (kMlaEpilogueWarps); 8 / G tokens a block.
constexpr int kWarps = static_cast<int>(kMlaEpilogueWarps);
constexpr int kThreads = kWarps * 32;
constexpr int kVectorBytes = 16;
// Warps the whole launch should have. Stage B's inputs: 4096, what one warp per token gives at
// T = 4096 (measured there: 512 blocks, about 4 an SM on an H200), half of the 132 x 64 warps an
// H200 keeps resident. The stage-A epilogue, whose warps each run a fixed cost of ~950
// instructions (its three phases), 2048: G = 2 at T = 1024 (G = 4 read 0.4 us slower there on
// V2-Lite, G = 8 4 us; docs/experiments.md).
constexpr int64_t kTargetWarps = 4096;
constexpr int64_t kEpilogueTargetWarps = 2048;
static_assert(kMlaEpilogueMaxRopeDim * kWarps * sizeof(float) <= 48 * 1024,
              "stage B inputs' per-warp k_pe fits the default shared memory");

// Warps per token for `tokens` tokens: a power of two dividing kWarps.
int group_warps(int tokens, int64_t target_warps) {
  int g = 1;
  while (g < kWarps && static_cast<int64_t>(tokens) * g < target_warps) g *= 2;
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
#pragma unroll 1
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

// The stage-A epilogue's shared memory, in float32 elements: the norm weights [Rq + R] once per
// block, then a slot per token of the block: its ckv row's planes [splits][ckv_ld] (copied in by
// cp.async), k_pe after RoPE [dr] and its RoPE pairs' angles [dr / 2] x 4. Every region starts at
// 16 bytes.
struct EpilogueSharedLayout {
  int64_t gamma, planes, pe, angles;  // floats: the weights; and per token slot
  LATENTKV_HD int64_t token() const { return planes + pe + angles; }
  LATENTKV_HD int64_t bytes(int64_t tokens_per_block) const {
    return (gamma + tokens_per_block * token()) * static_cast<int64_t>(sizeof(float));
  }
};

LATENTKV_HD EpilogueSharedLayout epilogue_shared_layout(int64_t q_rank, int64_t kv_rank,
                                                        int64_t rope_dim, int64_t ckv_ld,
                                                        int64_t splits) {
  return {round_up<int64_t>(q_rank + kv_rank, 4), splits * ckv_ld, round_up<int64_t>(rope_dim, 4),
          2 * rope_dim};
}

// One token's epilogue per group of G warps, in three phases with two barriers between them:
//  1. every global read the token needs issued together: its ckv row's planes into shared memory
//     by cp.async, its cache slot, its RoPE angles (position, then table) and the norm weights;
//  2. the planes summed in slice order (in place into the first), the sums of squares, k_pe
//     rotated into shared memory;
//  3. the group's sums combined and every output written from shared memory.
template <typename T, typename RopeT>
__global__ void __launch_bounds__(kThreads)
    mla_stage_a_epilogue_kernel(const MlaEpilogueParams p, int warps_per_token) {
  extern __shared__ float4 shared_vectors[];
  __shared__ float partial[kWarps][2];  // each warp's sums of squares (q_a, c)
  static_assert(sizeof(partial) + kMlaEpilogueSharedBytes == 48 * 1024,
                "the dynamic and static shared memory fill the 48 KB a launch gets");
  float* shared = reinterpret_cast<float*>(shared_vectors);
  const EpilogueSharedLayout layout = epilogue_shared_layout(p.q_rank, p.kv_rank, p.rope_dim,
                                                             p.ckv_ld, p.ckv_splits);
  const Group g = group_of(warps_per_token);
  const int t = blockIdx.x * (kWarps / g.warps) + g.slot;
  const bool active = t < p.tokens;  // every thread reaches the barriers below
  const int width = p.q_rank + p.kv_rank;
  const int half = p.rope_dim / 2;
  const int ld = static_cast<int>(p.ckv_ld);
  float* gamma = shared;  // [Rq + R]: q_norm's then kv_norm's values
  float* planes = shared + layout.gamma + g.slot * layout.token();  // [splits][ld]
  float* pe = planes + layout.planes;                                // [dr]
  float* angles = pe + layout.pe;                                    // [dr / 2][4]

  // Phase 1. A position outside [0, max_position) reads no angles: the token's k_pe NaN.
  T* cache = nullptr;  // [R + dr] or null
  bool position_ok = false;
  if (active) {
    const float* row = p.ckv + static_cast<int64_t>(t) * p.ckv_ld;  // plane 0's [Rq + R + dr]
    for (int s = 0; s < p.ckv_splits; ++s) {
#pragma unroll 1
      for (int i = 4 * g.thread; i < ld; i += 4 * g.threads) {
        copy16_async(planes + s * ld + i, row + s * p.ckv_split_stride + i, true);
      }
    }
    cache = mla_cache_row<T>(p.cache, t, p.seq);
    const RopeAngles<RopeT> a = rope_angles<RopeT>(p, t);
    position_ok = a.ok;
    for (int i = g.thread; i < half; i += g.threads) {
      const PairAngles c = rope_pair_angles(a, rope_pair(p.style, i, half), i, half);
      reinterpret_cast<float4*>(angles)[i] = make_float4(c.ca, c.sa, c.cb, c.sb);
    }
  }
  const T* q_norm = static_cast<const T*>(p.q_norm);
  const T* kv_norm = static_cast<const T*>(p.kv_norm);
  for (int i = threadIdx.x; i < width; i += kThreads) {
    gamma[i] = to_float(i < p.q_rank ? q_norm[i] : kv_norm[i - p.q_rank]);
  }
  wait_async_copies();
  __syncthreads();

  // Phase 2. Each thread sums, squares and later writes the same columns.
  float sum_q = 0.f, sum_c = 0.f;
  if (active) {
    auto column = [&](int i) {  // column i summed over the planes in slice order
      float x = planes[i];
      for (int s = 1; s < p.ckv_splits; ++s) x += planes[s * ld + i];
      return x;
    };
#pragma unroll 1
    for (int i = g.thread; i < p.q_rank; i += g.threads) {
      const float x = column(i);
      planes[i] = x;
      sum_q = fmaf(x, x, sum_q);
    }
#pragma unroll 1
    for (int i = p.q_rank + g.thread; i < width; i += g.threads) {
      const float x = column(i);
      planes[i] = x;
      sum_c = fmaf(x, x, sum_c);
    }
#pragma unroll 1
    for (int i = g.thread; i < half; i += g.threads) {
      const RopePair r = rope_pair(p.style, i, half);
      const float4 c = reinterpret_cast<const float4*>(angles)[i];
      rope_apply<T>(r, {c.x, c.y, c.z, c.w}, position_ok, column(width + r.ia),
                    column(width + r.ib), pe);
    }
  }
  sum_q = warp_sum(sum_q);
  sum_c = warp_sum(sum_c);
  if (threadIdx.x % 32 == 0) {
    partial[threadIdx.x / 32][0] = sum_q;
    partial[threadIdx.x / 32][1] = sum_c;
  }
  __syncthreads();  // partial[] and pe[] complete; neither is written again

  // Phase 3.
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
    T* out = static_cast<T*>(p.q_a) + token_offset(t, p.seq, p.q_a_stride_batch, p.q_a_stride_seq);
#pragma unroll 1
    for (int i = g.thread; i < p.q_rank; i += g.threads) {
      out[i] = from_float<T>(planes[i] * inv_q * gamma[i]);
    }
  }
  T* latent = p.latent == nullptr
                  ? nullptr
                  : static_cast<T*>(p.latent) + static_cast<int64_t>(t) * p.kv_rank;
#pragma unroll 1
  for (int i = g.thread; i < p.kv_rank; i += g.threads) {
    const T c = from_float<T>(planes[p.q_rank + i] * inv_c * gamma[p.q_rank + i]);
    if (cache != nullptr) cache[i] = c;
    if (latent != nullptr) latent[i] = c;
  }
  if (cache != nullptr) {
#pragma unroll 1
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
  const EpilogueSharedLayout layout =
      epilogue_shared_layout(p.q_rank, p.kv_rank, p.rope_dim, p.ckv_ld, p.ckv_splits);
  // Fewer tokens a block (more warps each) where the block's slots would not fit.
  int g = group_warps(p.tokens, kEpilogueTargetWarps);
  while (g < kWarps && layout.bytes(kWarps / g) > kMlaEpilogueSharedBytes) g *= 2;
  const int64_t smem = layout.bytes(kWarps / g);
  if (smem > kMlaEpilogueSharedBytes) {
    return {StatusCode::kUnsupported, "mla_stage_a_epilogue_kernel: " + std::to_string(smem) +
                                          " bytes of shared memory for one token exceed " +
                                          std::to_string(kMlaEpilogueSharedBytes)};
  }
  mla_stage_a_epilogue_kernel<T, RopeT>
      <<<blocks(p.tokens, g), kThreads, static_cast<size_t>(smem), stream>>>(p, g);
  return cuda_status(cudaGetLastError(), "mla_stage_a_epilogue_kernel launch");
}

template <typename T>
Status launch_epilogue_rope(const MlaEpilogueParams& p, Stream stream) {
  return p.rope_dtype == DType::kFloat32 ? launch_epilogue<T, float>(p, stream)
                                         : launch_epilogue<T, T>(p, stream);
}

template <typename T>
Status launch_inputs(const MlaStageBInputParams& p, Stream stream) {
  const int g = group_warps(p.tokens, kTargetWarps);
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

int64_t mla_epilogue_token_shared_bytes(int64_t q_rank, int64_t kv_rank, int64_t rope_dim,
                                        int64_t ckv_ld, int64_t splits) {
  return epilogue_shared_layout(q_rank, kv_rank, rope_dim, ckv_ld, splits).bytes(1);
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
