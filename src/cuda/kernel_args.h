// The parameters every CUDA kernel of latentkv shares, and their copy from Args and Problem. Each
// strategy's parameter struct derives from ActivationParams (hidden, out, the problem's sizes) and,
// where it reads the weights through plain pointers, WeightParams; it adds its own fields (latent
// output, workspace, tiling) and copies them after copy_activation_args / copy_weight_args.
#pragma once

#include <cstdint>

#include "cuda/common.h"
#include "latentkv/latentkv.h"

namespace latentkv::detail {

// Strides in elements; the innermost dimension of every tensor is contiguous.
template <typename T>
struct ActivationParams {
  const T* hidden;  // [B, S, D], strides (hidden_stride_batch, hidden_stride_seq, 1)
  int64_t hidden_stride_batch, hidden_stride_seq;
  T* out;  // [2, B, S, H, Dh]
  int64_t out_stride_kv, out_stride_batch, out_stride_seq, out_stride_head;
  int tokens, seq, model_dim, rank, head_dim, kv_width;  // T, S, D, R, Dh, N
};

// out's element offset of token t's column n of K (kv = 0) or V (kv = 1), n < N: head n / Dh,
// element n % Dh.
template <typename T>
LATENTKV_HD int64_t out_offset(const ActivationParams<T>& p, int kv, int t, int n) {
  return kv * p.out_stride_kv + token_offset(t, p.seq, p.out_stride_batch, p.out_stride_seq) +
         int64_t{n / p.head_dim} * p.out_stride_head + n % p.head_dim;
}

template <typename T>
struct WeightParams {
  const T* w_down;  // [D, R], row stride w_down_stride
  int64_t w_down_stride;
  const T* w_up_k;  // [R, N]
  const T* w_up_v;  // [R, N]
  int64_t w_up_k_stride, w_up_v_stride;
};

template <typename T>
void copy_activation_args(const Problem& p, const Args& a, ActivationParams<T>& k) {
  k.hidden = static_cast<const T*>(a.hidden);
  k.hidden_stride_batch = a.hidden_stride_batch;
  k.hidden_stride_seq = a.hidden_stride_seq;
  k.out = static_cast<T*>(a.out);
  k.out_stride_kv = a.out_stride_kv;
  k.out_stride_batch = a.out_stride_batch;
  k.out_stride_seq = a.out_stride_seq;
  k.out_stride_head = a.out_stride_head;
  k.tokens = static_cast<int>(p.tokens());
  k.seq = static_cast<int>(p.seq);
  k.model_dim = static_cast<int>(p.model_dim);
  k.rank = static_cast<int>(p.rank);
  k.head_dim = static_cast<int>(p.head_dim);
  k.kv_width = static_cast<int>(p.kv_width());
}

template <typename T>
void copy_weight_args(const Args& a, WeightParams<T>& k) {
  k.w_down = static_cast<const T*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.w_up_k = static_cast<const T*>(a.w_up_k);
  k.w_up_v = static_cast<const T*>(a.w_up_v);
  k.w_up_k_stride = a.w_up_k_stride_row;
  k.w_up_v_stride = a.w_up_v_stride_row;
}

// What every cuda-fused kernel's parameters hold beyond the shared ones: the optional latent
// output.
struct FusedParamsBase : ActivationParams<float>, WeightParams<float> {
  float* latent;  // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
};

// Whether every float32 input of a cuda-fused call copies in 16-byte pieces (the cluster and
// tensor-core configurations' cp.async rows): D, R and N multiples of 4, each matrix's first row
// 16-byte aligned and its row strides multiples of 4 floats.
inline bool fused_rows_16_bytes(const Problem& p, const Args& a) {
  const auto rows = [](const void* ptr, int64_t stride) {
    return is_aligned(ptr, 16) && stride % 4 == 0;
  };
  return p.model_dim % 4 == 0 && p.rank % 4 == 0 && p.kv_width() % 4 == 0 &&
         rows(a.hidden, a.hidden_stride_seq) && a.hidden_stride_batch % 4 == 0 &&
         rows(a.w_down, a.w_down_stride_row) && rows(a.w_up_k, a.w_up_k_stride_row) &&
         rows(a.w_up_v, a.w_up_v_stride_row);
}

// Whether cuda-fused's output takes 16-byte stores of 4 columns: Dh a multiple of 4 (4 columns
// stay in one head), out 16-byte aligned and its strides multiples of 4 floats.
inline bool fused_out_16_bytes(const Problem& p, const Args& a) {
  return is_aligned(a.out, 16) && p.head_dim % 4 == 0 && a.out_stride_kv % 4 == 0 &&
         a.out_stride_batch % 4 == 0 && a.out_stride_seq % 4 == 0 && a.out_stride_head % 4 == 0;
}

inline void copy_fused_args(const Problem& p, const Args& a, FusedParamsBase& k) {
  copy_activation_args<float>(p, a, k);
  copy_weight_args<float>(a, k);
  k.latent = static_cast<float*>(a.latent);
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
}

}  // namespace latentkv::detail
