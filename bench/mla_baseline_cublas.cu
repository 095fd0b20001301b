// cuBLAS GEMMs plus one simple kernel per step: the unfused MLA baseline (see
// mla_baseline_cublas.h). Each kernel is what an eager engine launches for its step: one block per
// token for the norms, RoPE, the cache scatter and gather; a grid-stride copy for the concat/split.
// Every value is rounded to the dtype where torch's unfused code rounds it.
#include "mla_baseline_cublas.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda/convert.h"
#include "cuda_check.h"

namespace latentkv::bench {
namespace {

constexpr int kNormThreads = 256;  // a block reduces one row of R = 512 or Rq = 1536
constexpr int kRowThreads = 128;   // RoPE, the cache scatter and gather: one token per block
constexpr int kCopyThreads = 256;
constexpr int64_t kMaxCopyBlocks = 65535;

using detail::from_float;  // the library's conversions (src/cuda/convert.h)
using detail::to_float;

// x rounded to T, as a torch op on T tensors leaves it.
template <typename T>
__device__ inline float round_to(float x) { return to_float(from_float<T>(x)); }

// y[t, :n] = round(gamma * round(x[t, :n] * rsqrt(mean(x[t]^2) + eps))), statistics in float32:
// transformers' DeepseekV3RMSNorm (normed.to(dtype), then weight * normed). One block per token.
template <typename T>
__global__ void rmsnorm_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ gamma,
                               T* __restrict__ y, int64_t ldy, int n, float eps) {
  const T* row = x + blockIdx.x * ldx;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_float(row[i]);
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kNormThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w];
  const float rstd = rsqrtf(total / static_cast<float>(n) + eps);
  T* out = y + blockIdx.x * ldy;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    out[i] = from_float<T>(to_float(gamma[i]) * round_to<T>(to_float(row[i]) * rstd));
  }
}

struct RopeTables {
  const int64_t* positions;  // [T] (positions form), or null
  const void* cos_sin_cache;  // [max_position, dr]: dr/2 cosines, then dr/2 sines
  int64_t cache_ld, max_position;
  const void* cos;  // [T, dr] (cos/sin form)
  const void* sin;
  int64_t cos_ld;
};

// k_pe[t, :dr] = rope(k_pe[t]) in place, one block per token: the row is read whole before any
// column is written (the interleave style moves columns). cos and sin are cast to the dtype and
// each product and sum rounded, as transformers' apply_rotary_pos_emb_interleave (and a vLLM-style
// kernel on T) compute it. A position outside the table makes the row NaN and reads nothing.
template <typename T, typename Rope>
__global__ void rope_kernel(T* __restrict__ k_pe, int64_t ld, RopeTables tables, RopeStyle style,
                            int dr) {
  extern __shared__ float row_in[];  // [dr]
  T* row = k_pe + blockIdx.x * ld;
  for (int j = threadIdx.x; j < dr; j += blockDim.x) row_in[j] = to_float(row[j]);
  __syncthreads();
  const int half = dr / 2;
  const Rope* table = nullptr;  // positions form: the token's row of cos_sin_cache
  if (tables.positions != nullptr) {
    const int64_t pos = tables.positions[blockIdx.x];
    if (pos >= 0 && pos < tables.max_position) {
      table = static_cast<const Rope*>(tables.cos_sin_cache) + pos * tables.cache_ld;
    }
  }
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    int in0 = 2 * i, in1 = 2 * i + 1, out0 = i, out1 = i + half;  // interleave
    if (style == RopeStyle::kGptJ) {
      out0 = 2 * i;
      out1 = 2 * i + 1;
    } else if (style == RopeStyle::kNeox) {
      in0 = i;
      in1 = i + half;
    }
    float cos0, sin0, cos1, sin1;
    if (tables.positions != nullptr) {
      if (table == nullptr) {
        row[out0] = row[out1] = from_float<T>(nanf(""));
        continue;
      }
      cos0 = cos1 = to_float(table[i]);
      sin0 = sin1 = to_float(table[half + i]);
    } else {
      // transformers' form: output column j uses cos[j], sin[j]; gptj's pair i uses column i.
      const Rope* cos = static_cast<const Rope*>(tables.cos) + blockIdx.x * tables.cos_ld;
      const Rope* sin = static_cast<const Rope*>(tables.sin) + blockIdx.x * tables.cos_ld;
      const int c0 = style == RopeStyle::kGptJ ? i : out0;
      const int c1 = style == RopeStyle::kGptJ ? i : out1;
      cos0 = to_float(cos[c0]);
      sin0 = to_float(sin[c0]);
      cos1 = to_float(cos[c1]);
      sin1 = to_float(sin[c1]);
    }
    cos0 = round_to<T>(cos0);
    sin0 = round_to<T>(sin0);
    cos1 = round_to<T>(cos1);
    sin1 = round_to<T>(sin1);
    const float x0 = row_in[in0], x1 = row_in[in1];
    row[out0] = from_float<T>(round_to<T>(x0 * cos0) - round_to<T>(x1 * sin0));
    row[out1] = from_float<T>(round_to<T>(x1 * cos1) + round_to<T>(x0 * sin1));
  }
}

// The token's cache slot: by slot_mapping, or row t of a dense cache; -1 where it is skipped.
__device__ inline int64_t slot_of(const int64_t* slots, int64_t num_slots) {
  const int64_t slot = slots != nullptr ? slots[blockIdx.x] : static_cast<int64_t>(blockIdx.x);
  return slot >= 0 && slot < num_slots ? slot : -1;
}

// cache[slot[t]] = [c[t] | k_pe[t]], one block per token; skipped slots are left untouched.
template <typename T>
__global__ void cache_write_kernel(const T* __restrict__ c, int r, const T* __restrict__ k_pe,
                                   int64_t k_pe_ld, int dr, const int64_t* __restrict__ slots,
                                   T* __restrict__ cache, int64_t cache_ld, int64_t num_slots) {
  const int64_t slot = slot_of(slots, num_slots);
  if (slot < 0) return;
  T* dst = cache + slot * cache_ld;
  const T* c_row = c + blockIdx.x * static_cast<int64_t>(r);
  const T* pe_row = k_pe + blockIdx.x * k_pe_ld;
  for (int j = threadIdx.x; j < r + dr; j += blockDim.x) dst[j] = j < r ? c_row[j] : pe_row[j - r];
}

// c[t] = cache[slot[t], :R], k_pe[t] = cache[slot[t], R:], one block per token; zeros for a
// skipped slot (so its K and V rows come out zero, as mla.h says).
template <typename T>
__global__ void cache_gather_kernel(const T* __restrict__ cache, int64_t cache_ld,
                                    int64_t num_slots, const int64_t* __restrict__ slots,
                                    T* __restrict__ c, int r, T* __restrict__ k_pe, int dr) {
  const int64_t slot = slot_of(slots, num_slots);
  T* c_row = c + blockIdx.x * static_cast<int64_t>(r);
  T* pe_row = k_pe + blockIdx.x * static_cast<int64_t>(dr);
  for (int j = threadIdx.x; j < r + dr; j += blockDim.x) {
    const T v = slot < 0 ? from_float<T>(0.0f) : cache[slot * cache_ld + j];
    if (j < r) {
      c_row[j] = v;
    } else {
      pe_row[j - r] = v;
    }
  }
}

// Sizes in Units (16 bytes where every row and column block allows it, else one element).
struct SplitShape {
  int64_t rows;     // T * H
  int64_t heads;    // H
  int64_t dn, dr, dv;  // column blocks
  int64_t kv_ld;    // kv's row per (token, head): dn + dv
  int64_t k_pe_ld;  // per token
  int64_t k_head, k_seq, v_head, v_seq;  // output strides
};

// K[t, h] = [kv[t, h, :dn] | k_pe[t]], V[t, h] = kv[t, h, dn:]: the torch.cat of the K side and the
// split of V into the caller's layout, one grid-stride launch over every output element.
template <typename Unit>
__global__ void kv_split_kernel(const Unit* __restrict__ kv, const Unit* __restrict__ k_pe,
                                Unit* __restrict__ k, Unit* __restrict__ v, SplitShape s) {
  const int64_t row_units = s.dn + s.dr + s.dv;
  const int64_t total = s.rows * row_units;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / row_units, col = i % row_units;
    const int64_t t = row / s.heads, h = row % s.heads;
    const Unit* kv_row = kv + row * s.kv_ld;
    if (col < s.dn) {
      k[t * s.k_seq + h * s.k_head + col] = kv_row[col];
    } else if (col < s.dn + s.dr) {
      k[t * s.k_seq + h * s.k_head + col] = k_pe[t * s.k_pe_ld + col - s.dn];
    } else {
      v[t * s.v_seq + h * s.v_head + col - s.dn - s.dr] = kv_row[col - s.dr];
    }
  }
}

template <typename Unit>
void launch_kv_split(const void* kv, const void* k_pe, void* k, void* v, SplitShape s,
                     int64_t elements_per_unit, Stream stream) {
  int64_t* fields[] = {&s.dn, &s.dr, &s.dv, &s.kv_ld, &s.k_pe_ld,
                       &s.k_head, &s.k_seq, &s.v_head, &s.v_seq};
  for (int64_t* f : fields) *f /= elements_per_unit;
  const int64_t total = s.rows * (s.dn + s.dr + s.dv);
  const int64_t blocks = std::clamp<int64_t>((total + kCopyThreads - 1) / kCopyThreads, 1,
                                             kMaxCopyBlocks);
  kv_split_kernel<Unit><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
      static_cast<const Unit*>(kv), static_cast<const Unit*>(k_pe), static_cast<Unit*>(k),
      static_cast<Unit*>(v), s);
  BENCH_CHECK_LAUNCH();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

MlaCublasBaseline::MlaCublasBaseline(const MlaProblem& problem, Stream stream)
    : problem_(problem), stream_(stream), handle_(stream) {
  const size_t elem = static_cast<size_t>(element_size(problem.dtype));
  const size_t t = static_cast<size_t>(problem.tokens());
  const size_t ckv = static_cast<size_t>(problem.q_rank + problem.cache_width());
  BENCH_CHECK(cudaMalloc(&ckv_, elem * t * ckv));
  BENCH_CHECK(cudaMalloc(&c_, elem * t * static_cast<size_t>(problem.kv_rank)));
  BENCH_CHECK(cudaMalloc(&k_pe_, elem * t * static_cast<size_t>(problem.rope_dim)));
  BENCH_CHECK(cudaMalloc(&kv_, elem * t * static_cast<size_t>(problem.kv_b_rows())));
}

MlaCublasBaseline::~MlaCublasBaseline() {
  // Teardown errors would only hide the first one; the bench exits right after a failure anyway.
  cudaFree(kv_);
  cudaFree(k_pe_);
  cudaFree(c_);
  cudaFree(ckv_);
}

void MlaCublasBaseline::run(const MlaArgs& args) {
  const bool rope_float = problem_.rope_dtype == DType::kFloat32;
  switch (problem_.dtype) {
    case DType::kFloat32: return run_typed<float, float>(args);
    case DType::kBFloat16:
      return rope_float ? run_typed<__nv_bfloat16, float>(args)
                        : run_typed<__nv_bfloat16, __nv_bfloat16>(args);
    case DType::kFloat16:
      return rope_float ? run_typed<__half, float>(args) : run_typed<__half, __half>(args);
  }
}

template <typename T, typename Rope>
void MlaCublasBaseline::run_typed(const MlaArgs& a) {
  const MlaProblem& p = problem_;
  const cudaStream_t stream = stream_;
  const int64_t t = p.tokens(), d = p.model_dim, r = p.kv_rank, dr = p.rope_dim;
  const int64_t q = p.q_rank, ckv_ld = q + r + dr;
  const unsigned tokens = static_cast<unsigned>(t);
  const int64_t eb = static_cast<int64_t>(sizeof(T));
  T* ckv = static_cast<T*>(ckv_);
  T* c = static_cast<T*>(c_);
  const T* k_pe = nullptr;  // [T, dr] rows of stage B's k_pe
  int64_t k_pe_ld = dr;

  if (p.stage != MlaStage::kSecond) {
    // One GEMM where q_a's rows run straight into kv_a's (engines' fused_qkv_a_proj), else two
    // into the same temporary's columns.
    const char* q_rows = static_cast<const char*>(a.q_a_weight);
    const bool merged = q == 0 || q_rows + q * a.q_a_weight_stride_row * eb ==
                                      static_cast<const char*>(a.kv_a_weight);
    if (merged) {
      cublas_gemm_nt(handle_.get(), p.dtype, t, ckv_ld, d, a.hidden, a.hidden_stride_seq,
                     q > 0 ? a.q_a_weight : a.kv_a_weight, a.kv_a_weight_stride_row, ckv, ckv_ld);
    } else {
      cublas_gemm_nt(handle_.get(), p.dtype, t, q, d, a.hidden, a.hidden_stride_seq, a.q_a_weight,
                     a.q_a_weight_stride_row, ckv, ckv_ld);
      cublas_gemm_nt(handle_.get(), p.dtype, t, r + dr, d, a.hidden, a.hidden_stride_seq,
                     a.kv_a_weight, a.kv_a_weight_stride_row, ckv + q, ckv_ld);
    }
    if (q > 0 && a.q_a != nullptr) {
      rmsnorm_kernel<T><<<tokens, kNormThreads, 0, stream>>>(
          ckv, ckv_ld, static_cast<const T*>(a.q_a_norm_weight), static_cast<T*>(a.q_a),
          a.q_a_stride_seq, static_cast<int>(q), p.eps);
      BENCH_CHECK_LAUNCH();
    }
    rmsnorm_kernel<T><<<tokens, kNormThreads, 0, stream>>>(
        ckv + q, ckv_ld, static_cast<const T*>(a.kv_a_norm_weight), c, r, static_cast<int>(r),
        p.eps);
    BENCH_CHECK_LAUNCH();
    const RopeTables tables{a.positions, a.cos_sin_cache, a.cos_sin_cache_stride_row,
                            a.max_position, a.cos, a.sin, a.cos_stride_seq};
    rope_kernel<T, Rope><<<tokens, kRowThreads, static_cast<size_t>(dr) * sizeof(float), stream>>>(
        ckv + q + r, ckv_ld, tables, p.rope_style, static_cast<int>(dr));
    BENCH_CHECK_LAUNCH();
    if (a.kv_cache != nullptr) {
      cache_write_kernel<T><<<tokens, kRowThreads, 0, stream>>>(
          c, static_cast<int>(r), ckv + q + r, ckv_ld, static_cast<int>(dr), a.slot_mapping,
          static_cast<T*>(a.kv_cache), a.kv_cache_stride_slot, a.num_slots);
      BENCH_CHECK_LAUNCH();
    }
    if (p.stage == MlaStage::kFirst) return;
    k_pe = ckv + q + r;
    k_pe_ld = ckv_ld;
  } else {
    T* gathered = static_cast<T*>(k_pe_);
    cache_gather_kernel<T><<<tokens, kRowThreads, 0, stream>>>(
        static_cast<const T*>(a.kv_cache), a.kv_cache_stride_slot, a.num_slots, a.slot_mapping,
        c, static_cast<int>(r), gathered, static_cast<int>(dr));
    BENCH_CHECK_LAUNCH();
    k_pe = gathered;
  }

  const int64_t head = p.nope_dim + p.v_dim;
  cublas_gemm_nt(handle_.get(), p.dtype, t, p.kv_b_rows(), r, c, r, a.kv_b_weight,
                 a.kv_b_weight_stride_row, kv_, p.kv_b_rows());
  const SplitShape shape{t * p.heads, p.heads, p.nope_dim, dr, p.v_dim, head, k_pe_ld,
                         a.k_stride_head, a.k_stride_seq, a.v_stride_head, a.v_stride_seq};
  // 16-byte units where every block and stride is a whole number of them.
  const int64_t wide = 16 / eb;
  bool vector = aligned16(k_pe) && aligned16(a.k) && aligned16(a.v);
  for (int64_t n : {shape.dn, shape.dr, shape.dv, shape.kv_ld, shape.k_pe_ld, shape.k_head,
                    shape.k_seq, shape.v_head, shape.v_seq}) {
    vector = vector && n % wide == 0;
  }
  if (vector) {
    launch_kv_split<uint4>(kv_, k_pe, a.k, a.v, shape, wide, stream);
  } else if (eb == 2) {
    launch_kv_split<uint16_t>(kv_, k_pe, a.k, a.v, shape, 1, stream);
  } else {
    launch_kv_split<uint32_t>(kv_, k_pe, a.k, a.v, shape, 1, stream);
  }
}

}  // namespace latentkv::bench
