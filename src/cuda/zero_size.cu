// A problem with a zero dimension on CUDA: run_cpu_zero_size's result (cpu/zero_size.cpp; the same
// float32 fused multiply-adds, so the same bits), written on the caller's stream by one small
// grid-stride kernel. out is zeros where R or D is 0 (empty sums); the latent, when asked for, is
// hidden @ w_down (zeros where D is 0). Rare, and either empty or as large as the latent alone, so
// no tiling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backends.h"
#include "cuda/common.h"
#include "cuda/convert.h"
#include "cuda/cuda_check.h"

namespace latentkv::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

template <typename E>
struct ZeroSizeParams {
  const E* hidden;  // [B, S, D]
  int64_t hidden_stride_batch, hidden_stride_seq;
  const E* w_down;  // [D, R]
  int64_t w_down_stride;
  E* out;  // [2, B, S, H, Dh]; written only when write_out
  int64_t out_stride_kv, out_stride_batch, out_stride_seq, out_stride_head;
  E* latent;  // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
  int64_t seq, model_dim, rank, heads, head_dim, tokens;
  bool write_out;
};

template <typename E>
__global__ void __launch_bounds__(kThreads)
    kv_proj_zero_size(const __grid_constant__ ZeroSizeParams<E> p) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (p.latent != nullptr) {
    for (int64_t i = first; i < p.tokens * p.rank; i += stride) {
      const int64_t t = i / p.rank, r = i % p.rank;
      const E* x = p.hidden + token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq);
      float sum = 0.f;
      for (int64_t d = 0; d < p.model_dim; ++d) {
        sum = fmaf(to_float(x[d]), to_float(p.w_down[d * p.w_down_stride + r]), sum);
      }
      p.latent[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + r] =
          from_float<E>(sum);
    }
  }
  if (!p.write_out) return;
  const int64_t n = p.heads * p.head_dim;
  for (int64_t i = first; i < 2 * p.tokens * n; i += stride) {
    const int64_t kv = i / (p.tokens * n), t = i / n % p.tokens, j = i % n;
    p.out[kv * p.out_stride_kv + token_offset(t, p.seq, p.out_stride_batch, p.out_stride_seq) +
          (j / p.head_dim) * p.out_stride_head + j % p.head_dim] = from_float<E>(0.f);
  }
}

template <typename E>
Status launch(const Problem& p, const Args& a, Stream stream) {
  ZeroSizeParams<E> k;
  k.hidden = static_cast<const E*>(a.hidden);
  k.hidden_stride_batch = a.hidden_stride_batch;
  k.hidden_stride_seq = a.hidden_stride_seq;
  k.w_down = static_cast<const E*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.out = static_cast<E*>(a.out);
  k.out_stride_kv = a.out_stride_kv;
  k.out_stride_batch = a.out_stride_batch;
  k.out_stride_seq = a.out_stride_seq;
  k.out_stride_head = a.out_stride_head;
  k.latent = p.rank > 0 ? static_cast<E*>(a.latent) : nullptr;
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.seq = p.seq;
  k.model_dim = p.model_dim;
  k.rank = p.rank;
  k.heads = p.heads;
  k.head_dim = p.head_dim;
  k.tokens = p.tokens();
  k.write_out = p.kv_width() > 0;
  const int64_t work = std::max(k.latent != nullptr ? k.tokens * k.rank : 0,
                                k.write_out ? 2 * k.tokens * p.kv_width() : 0);
  if (work == 0) return Status::Ok();
  const int64_t blocks = std::min(ceil_div(work, int64_t{kThreads}), kMaxBlocks);
  kv_proj_zero_size<E><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(k);
  return cuda_status(cudaGetLastError(), "kv_proj_zero_size launch");
}

}  // namespace

Status run_cuda_zero_size(const Problem& p, const Args& a, Stream stream) {
  if (p.tokens() == 0) return Status::Ok();
  switch (p.dtype) {
    case DType::kFloat32: return launch<float>(p, a, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, a, stream);
    case DType::kFloat16: return launch<__half>(p, a, stream);
  }
  return {StatusCode::kUnsupported, "problem.dtype is not a DType"};
}

}  // namespace latentkv::detail
