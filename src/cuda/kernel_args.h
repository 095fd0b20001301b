// Copies Args and Problem into a kernel's parameter struct. Every CUDA kernel's parameters name
// these fields the same way (hidden, out and their element strides, the weights and their row
// strides, the problem's sizes as int), so the copy is written once here; each strategy adds its
// own fields (latent output, workspace, tiling) after it.
#pragma once

#include "latentkv/latentkv.h"

namespace latentkv::detail {

// hidden [B, S, D] and out [2, B, S, H, Dh] with their strides, and T, S, D, R, Dh, N.
template <typename T, typename KernelParams>
void copy_activation_args(const Problem& p, const Args& a, KernelParams& k) {
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

// w_down [D, R], w_up_k and w_up_v [R, N], with their row strides.
template <typename T, typename KernelParams>
void copy_weight_args(const Args& a, KernelParams& k) {
  k.w_down = static_cast<const T*>(a.w_down);
  k.w_down_stride = a.w_down_stride_row;
  k.w_up_k = static_cast<const T*>(a.w_up_k);
  k.w_up_v = static_cast<const T*>(a.w_up_v);
  k.w_up_k_stride = a.w_up_k_stride_row;
  k.w_up_v_stride = a.w_up_v_stride_row;
}

}  // namespace latentkv::detail
