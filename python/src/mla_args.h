// python/src/mla_args.h: the latentkv::MlaProblem and MlaArgs of one MLA KV call (mla.h), built
// from a framework's view of its tensors, as args_builder.h builds the projection's. The torch ops
// (torch_ops.cpp) build every mla_kv* call here. Only what must come before an MlaProblem exists,
// or what check() cannot see, is checked here: ranks, the shapes that define the problem (each
// refusal names the tensor and its shape), the dtypes (one for the data, int64 for the indices, a
// floating type for the RoPE tables), one device, contiguous last dimensions, cos and sin sharing a
// layout; strides, overlaps, which pointers a stage takes and everything else is check()'s, inside
// run(). The outputs K, V and q_a are the caller's to allocate, packed; build_mla() sets their
// strides.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "args_builder.h"
#include "latentkv/mla.h"

namespace latentkv::bind {

// One MLA call. Absent views (ndim < 0) are the optional arguments not given.
struct MlaCall {
  MlaStage stage = MlaStage::kBoth;
  TensorView hidden;            // [B, S, D]                        stage A
  TensorView kv_a_weight;       // [R + dr, D]                      stage A
  TensorView kv_a_norm_weight;  // [R]                              stage A
  TensorView q_a_weight;        // [Rq, D], optional                stage A
  TensorView q_a_norm_weight;   // [Rq], with q_a_weight            stage A
  TensorView cos, sin;          // [B, S, dr]: transformers' form   stage A
  TensorView positions;         // [B, S] int64: vLLM's form        stage A
  TensorView cos_sin_cache;     // [max_position, dr]               stage A
  TensorView kv_cache;          // [num_slots, R + dr]: written by stage A, read by stage B alone
  TensorView slot_mapping;      // [B, S] int64, optional
  TensorView latent;            // [B, S, R]                        stage B alone
  TensorView k_pe;              // [B, S, dr]                       stage B alone
  TensorView kv_b_weight;       // [H * (dn + dv), R]               stage B
  int64_t num_heads = 0;
  int64_t nope_dim = 0;
  int64_t v_dim = 0;
  std::string_view rope_style = "interleave";
  double eps = 1e-6;
};

struct MlaBuilt {
  MlaProblem problem;
  MlaArgs args;           // k, v, q_a pointers null: the caller allocates them packed
  Backend backend = Backend::kCpu;
  int32_t device_id = 0;  // the CUDA device of every tensor
};

namespace detail {

constexpr ElemType kInt64{kDlInt, 64};

inline bool to_rope_style(std::string_view name, RopeStyle* style) {
  if (name == "interleave") *style = RopeStyle::kInterleave;
  else if (name == "gptj") *style = RopeStyle::kGptJ;
  else if (name == "neox") *style = RopeStyle::kNeox;
  else return false;
  return true;
}

inline Refusal expect_shape(const TensorView& v, const int64_t* sizes, int ndim,
                            const std::string& layout) {
  bool same = v.ndim == ndim;
  for (int i = 0; same && i < ndim; ++i) same = v.sizes[i] == sizes[i];
  if (same) return {};
  std::string expected = "(";
  for (int i = 0; i < ndim; ++i) expected += (i ? ", " : "") + std::to_string(sizes[i]);
  return shape_error(v, layout + " = " + expected + (ndim == 1 ? ",)" : ")"));
}

}  // namespace detail

// The MlaProblem and MlaArgs of the call, or the refusal. Normalizes the strides in call.
inline Refusal build_mla(MlaCall& call, MlaBuilt* built) {
  using detail::check_rank;
  using detail::expect_shape;
  using detail::shape_error;
  using detail::type_error;
  using detail::value_error;
  MlaProblem& p = built->problem;
  MlaArgs& a = built->args;
  p.stage = call.stage;
  const bool first = call.stage != MlaStage::kSecond;
  const bool second = call.stage != MlaStage::kFirst;

  if (!detail::to_rope_style(call.rope_style, &p.rope_style)) {
    return value_error("rope_style = '" + std::string(call.rope_style) +
                       "': expected 'interleave', 'gptj' or 'neox'");
  }
  p.eps = static_cast<float>(call.eps);

  // Ranks first: every shape below is read by index.
  struct Ranked {
    TensorView* view;
    int rank;
    const char* layout;
  };
  const Ranked ranked[] = {
      {&call.hidden, 3, "(B, S, D)"},          {&call.kv_a_weight, 2, "(R + dr, D)"},
      {&call.kv_a_norm_weight, 1, "(R,)"},     {&call.q_a_weight, 2, "(Rq, D)"},
      {&call.q_a_norm_weight, 1, "(Rq,)"},     {&call.cos, 3, "(B, S, dr)"},
      {&call.sin, 3, "(B, S, dr)"},            {&call.positions, 2, "(B, S)"},
      {&call.cos_sin_cache, 2, "(max_position, dr)"},
      {&call.kv_cache, 2, "(num_slots, R + dr)"},
      {&call.slot_mapping, 2, "(B, S)"},       {&call.latent, 3, "(B, S, R)"},
      {&call.k_pe, 3, "(B, S, dr)"},           {&call.kv_b_weight, 2, "(H * (dn + dv), R)"},
  };
  for (const Ranked& t : ranked) {
    if (!t.view->present()) continue;
    if (Refusal r = check_rank(*t.view, t.rank, t.layout)) return r;
  }
  if (call.q_a_weight.present() != call.q_a_norm_weight.present()) {
    return value_error(call.q_a_weight.present() ? "q_a_weight is given without q_a_norm_weight"
                                                 : "q_a_norm_weight is given without q_a_weight");
  }
  if (call.cos.present() != call.sin.present()) {
    return value_error(call.cos.present() ? "cos is given without sin"
                                          : "sin is given without cos");
  }
  if (call.positions.present() != call.cos_sin_cache.present()) {
    return value_error(call.positions.present() ? "positions is given without cos_sin_cache"
                                                : "cos_sin_cache is given without positions");
  }
  if (second) {
    if (call.num_heads <= 0 || call.nope_dim <= 0 || call.v_dim <= 0) {
      return value_error("num_heads = " + std::to_string(call.num_heads) +
                         ", qk_nope_head_dim = " + std::to_string(call.nope_dim) +
                         ", v_head_dim = " + std::to_string(call.v_dim) +
                         ": all must be positive");
    }
  }

  // One data dtype, int64 indices, RoPE tables in a floating type; one device.
  const TensorView& lead = first ? call.hidden : call.kv_b_weight;
  if (!detail::to_dtype(lead.dtype, &p.dtype)) {
    return type_error(std::string(lead.name) + " has dtype " + dtype_name(lead.dtype) +
                      "; latentkv takes float32, bfloat16 or float16");
  }
  TensorView* data[] = {&call.hidden,   &call.kv_a_weight, &call.kv_a_norm_weight,
                        &call.q_a_weight, &call.q_a_norm_weight, &call.kv_cache,
                        &call.latent,   &call.k_pe,        &call.kv_b_weight};
  for (TensorView* t : data) {
    if (t->present() && !(t->dtype == lead.dtype)) {
      return type_error(std::string(t->name) + " has dtype " + dtype_name(t->dtype) + " but " +
                        lead.name + " has " + dtype_name(lead.dtype));
    }
  }
  for (TensorView* t : {&call.positions, &call.slot_mapping}) {
    if (t->present() && !(t->dtype == detail::kInt64)) {
      return type_error(std::string(t->name) + " has dtype " + dtype_name(t->dtype) +
                        "; expected int64");
    }
  }
  TensorView& table = call.cos.present() ? call.cos : call.cos_sin_cache;
  if (table.present()) {
    if (!detail::to_dtype(table.dtype, &p.rope_dtype)) {
      return type_error(std::string(table.name) + " has dtype " + dtype_name(table.dtype) +
                        "; RoPE tables are float32 or the dtype of " + lead.name);
    }
    if (call.sin.present() && !(call.sin.dtype == call.cos.dtype)) {
      return type_error("sin has dtype " + dtype_name(call.sin.dtype) + " but cos has " +
                        dtype_name(call.cos.dtype));
    }
  }
  TensorView* all[] = {&call.hidden, &call.kv_a_weight, &call.kv_a_norm_weight,
                       &call.q_a_weight, &call.q_a_norm_weight, &call.cos, &call.sin,
                       &call.positions, &call.cos_sin_cache, &call.kv_cache,
                       &call.slot_mapping, &call.latent, &call.k_pe, &call.kv_b_weight};
  for (TensorView* t : all) {
    if (t->present() && (t->device_type != lead.device_type || t->device_id != lead.device_id)) {
      return value_error(std::string(t->name) + " is on " +
                         device_name(t->device_type, t->device_id) + " but " + lead.name +
                         " is on " + device_name(lead.device_type, lead.device_id) +
                         "; all tensors must be on one device");
    }
  }
  if (lead.device_type == kDlCpu) {
    built->backend = Backend::kCpu;
  } else if (lead.device_type == kDlCuda) {
    built->backend = Backend::kCuda;
  } else {
    return value_error(std::string(lead.name) + " is on " +
                       device_name(lead.device_type, lead.device_id) +
                       "; latentkv runs on cpu and cuda");
  }
  built->device_id = lead.device_id;

  // The shapes that define the problem: stage A's from hidden and the kv_a weights, stage B
  // alone's from kv_b_weight and c/k_pe or the cache and its slots.
  if (first) {
    p.batch = call.hidden.sizes[0];
    p.seq = call.hidden.sizes[1];
    p.model_dim = call.hidden.sizes[2];
    p.kv_rank = call.kv_a_norm_weight.sizes[0];
    p.rope_dim = call.kv_a_weight.sizes[0] - p.kv_rank;
    if (call.kv_a_weight.sizes[1] != p.model_dim) {
      return shape_error(call.kv_a_weight, "(R + dr, D) with D = " +
                                               std::to_string(p.model_dim) + " from hidden");
    }
    if (call.q_a_weight.present()) {
      p.q_rank = call.q_a_weight.sizes[0];
      if (call.q_a_weight.sizes[1] != p.model_dim) {
        return shape_error(call.q_a_weight, "(Rq, D) with D = " + std::to_string(p.model_dim) +
                                                " from hidden");
      }
      const int64_t rq[] = {p.q_rank};
      if (Refusal r = expect_shape(call.q_a_norm_weight, rq, 1, "(Rq,) from q_a_weight")) {
        return r;
      }
    }
  } else {
    p.kv_rank = call.kv_b_weight.sizes[1];
    // Stage B reads neither hidden nor the first GEMM; check() still asks for a positive D.
    p.model_dim = 1;
    if (call.latent.present()) {
      p.batch = call.latent.sizes[0];
      p.seq = call.latent.sizes[1];
      if (!call.k_pe.present()) return value_error("latent is given without k_pe");
      p.rope_dim = call.k_pe.sizes[2];
      const int64_t c[] = {p.batch, p.seq, p.kv_rank};
      if (Refusal r = expect_shape(call.latent, c, 3, "(B, S, R) with R from kv_b_weight")) {
        return r;
      }
      if (call.k_pe.sizes[0] != p.batch || call.k_pe.sizes[1] != p.seq) {
        return shape_error(call.k_pe, "(B, S, dr) with (B, S) = (" + std::to_string(p.batch) +
                                          ", " + std::to_string(p.seq) + ") from latent");
      }
    } else if (call.k_pe.present()) {
      return value_error("k_pe is given without latent");
    } else if (call.kv_cache.present() && call.slot_mapping.present()) {
      p.batch = call.slot_mapping.sizes[0];
      p.seq = call.slot_mapping.sizes[1];
      p.rope_dim = call.kv_cache.sizes[1] - p.kv_rank;
    } else {
      return value_error(
          "the second stage reads c and k_pe from latent + k_pe or from kv_cache + slot_mapping; "
          "got neither pair");
    }
  }
  if (second) {
    p.heads = call.num_heads;
    p.nope_dim = call.nope_dim;
    p.v_dim = call.v_dim;
    const int64_t kvb[] = {p.kv_b_rows(), p.kv_rank};
    if (Refusal r = expect_shape(call.kv_b_weight, kvb, 2, "(H * (dn + dv), R)")) return r;
  } else {
    // Stage A alone computes no K or V; check() still asks for the layer's head dimensions.
    p.heads = p.nope_dim = p.v_dim = 1;
  }
  const int64_t bs[] = {p.batch, p.seq};
  const int64_t bsr[] = {p.batch, p.seq, p.rope_dim};
  if (call.cos.present()) {
    if (Refusal r = expect_shape(call.cos, bsr, 3, "(B, S, dr)")) return r;
    if (Refusal r = expect_shape(call.sin, bsr, 3, "(B, S, dr)")) return r;
  }
  if (call.positions.present()) {
    if (Refusal r = expect_shape(call.positions, bs, 2, "(B, S)")) return r;
    if (call.cos_sin_cache.sizes[1] != p.rope_dim) {
      return shape_error(call.cos_sin_cache, "(max_position, dr) with dr = " +
                                                 std::to_string(p.rope_dim));
    }
  }
  if (call.slot_mapping.present()) {
    if (Refusal r = expect_shape(call.slot_mapping, bs, 2, "(B, S)")) return r;
  }
  if (call.kv_cache.present() && call.kv_cache.sizes[1] != p.cache_width()) {
    return shape_error(call.kv_cache, "(num_slots, R + dr) with R + dr = " +
                                          std::to_string(p.cache_width()));
  }
  for (TensorView* t : all) {
    if (!t->present()) continue;
    if (Refusal r = detail::normalize_strides(t)) return r;
  }
  if (call.cos.present() &&
      (call.sin.strides[0] != call.cos.strides[0] || call.sin.strides[1] != call.cos.strides[1])) {
    return value_error("sin has strides (" + std::to_string(call.sin.strides[0]) + ", " +
                       std::to_string(call.sin.strides[1]) + ", 1) but cos has (" +
                       std::to_string(call.cos.strides[0]) + ", " +
                       std::to_string(call.cos.strides[1]) + ", 1); they must share a layout");
  }

  if (first) {
    a.hidden = call.hidden.data;
    a.hidden_stride_batch = call.hidden.strides[0];
    a.hidden_stride_seq = call.hidden.strides[1];
    a.kv_a_weight = call.kv_a_weight.data;
    a.kv_a_weight_stride_row = call.kv_a_weight.strides[0];
    a.kv_a_norm_weight = call.kv_a_norm_weight.data;
    if (p.q_rank > 0) {
      a.q_a_weight = call.q_a_weight.data;
      a.q_a_weight_stride_row = call.q_a_weight.strides[0];
      a.q_a_norm_weight = call.q_a_norm_weight.data;
      a.q_a_stride_seq = p.q_rank;
      a.q_a_stride_batch = p.seq * p.q_rank;
    }
  }
  if (call.cos.present()) {
    a.cos = call.cos.data;
    a.sin = call.sin.data;
    a.cos_stride_batch = call.cos.strides[0];
    a.cos_stride_seq = call.cos.strides[1];
  }
  if (call.positions.present()) {
    a.positions = static_cast<const int64_t*>(call.positions.data);
    a.positions_stride_batch = call.positions.strides[0];
    a.positions_stride_seq = call.positions.strides[1];
    a.cos_sin_cache = call.cos_sin_cache.data;
    a.cos_sin_cache_stride_row = call.cos_sin_cache.strides[0];
    a.max_position = call.cos_sin_cache.sizes[0];
  }
  if (call.kv_cache.present()) {
    a.kv_cache = call.kv_cache.data;
    a.kv_cache_stride_slot = call.kv_cache.strides[0];
    a.num_slots = call.kv_cache.sizes[0];
  }
  if (call.slot_mapping.present()) {
    a.slot_mapping = static_cast<const int64_t*>(call.slot_mapping.data);
    a.slot_mapping_stride_batch = call.slot_mapping.strides[0];
    a.slot_mapping_stride_seq = call.slot_mapping.strides[1];
  }
  if (call.latent.present()) {
    a.latent = call.latent.data;
    a.latent_stride_batch = call.latent.strides[0];
    a.latent_stride_seq = call.latent.strides[1];
    a.k_pe = call.k_pe.data;
    a.k_pe_stride_batch = call.k_pe.strides[0];
    a.k_pe_stride_seq = call.k_pe.strides[1];
  }
  if (second) {
    a.kv_b_weight = call.kv_b_weight.data;
    a.kv_b_weight_stride_row = call.kv_b_weight.strides[0];
    // K [B, S, H, dn + dr] and V [B, S, H, dv], packed.
    a.k_stride_head = p.k_width();
    a.k_stride_seq = p.heads * p.k_width();
    a.k_stride_batch = p.seq * a.k_stride_seq;
    a.v_stride_head = p.v_dim;
    a.v_stride_seq = p.heads * p.v_dim;
    a.v_stride_batch = p.seq * a.v_stride_seq;
  }
  return {};
}

}  // namespace latentkv::bind
