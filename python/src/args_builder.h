// python/src/args_builder.h: the latentkv::Problem and Args of one kv_proj call, built from a
// framework's view of its tensors (sizes, element strides, data pointer, dtype, device). The numpy
// binding (binding.cpp) and the torch ops (torch_ops.cpp) both build their calls here, so they
// refuse the same calls with the same words. Only the checks that must come before a Problem
// exists, or that check() cannot see, are made here: ranks, the shapes that define the Problem,
// one dtype and one device for all tensors, the contiguous last dimension (Args has no stride for
// it); everything else (strides, overlaps, sizes, what a backend takes) is latentkv::check()'s,
// which run() calls. Framework-free and header-only: each caller turns a Refusal into its own
// exception (TypeError for dtypes, ValueError for the rest).
#pragma once

#include <cstdint>
#include <string>

#include "latentkv/latentkv.h"

namespace latentkv::bind {

// Element types and devices in DLPack's codes, which both callers speak (numpy through DLPack;
// torch's dtypes map one to one).
constexpr uint8_t kDlInt = 0, kDlUInt = 1, kDlFloat = 2, kDlBfloat = 4, kDlComplex = 5,
                  kDlBool = 6;
constexpr int32_t kDlCpu = 1, kDlCuda = 2;

struct ElemType {
  uint8_t code = 0;
  uint8_t bits = 0;
  uint16_t lanes = 1;
  const char* name = nullptr;  // the framework's own name where DLPack has no code for it
};

inline bool operator==(const ElemType& a, const ElemType& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes && a.name == b.name;
}

// One tensor argument as the framework describes it. ndim < 0: the argument is absent.
struct TensorView {
  static constexpr int kMaxDims = 8;  // sizes kept for messages; latentkv's tensors have <= 5
  const char* name = nullptr;
  int ndim = -1;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
  void* data = nullptr;
  ElemType dtype;
  int32_t device_type = kDlCpu;
  int32_t device_id = 0;

  bool present() const { return ndim >= 0; }
};

// One kv_proj call. out absent: the caller allocates a packed (2, B, S, H, Dh) output after
// build() with H = num_heads, and sets args.out; out given: H and Dh come from its shape.
struct Call {
  TensorView hidden;     // [B, S, D]
  TensorView w_down;     // [D, R]
  TensorView w_up_k;     // [R, H*Dh]
  TensorView w_up_v;     // [R, H*Dh]
  TensorView out;        // [2, B, S, H, Dh], optional
  TensorView latent;     // [B, S, R], optional (latent_out)
  TensorView workspace;  // [bytes / element size], optional
  int64_t num_heads = 0;  // used when out is absent
};

struct Refusal {
  enum Kind { kNone, kType, kValue };
  Kind kind = kNone;
  std::string message;
  explicit operator bool() const { return kind != kNone; }
};

struct Built {
  Problem problem;
  Args args;              // args.out is null when the call had no out
  Backend backend = Backend::kCpu;
  int32_t device_id = 0;  // the CUDA device of every tensor
};

inline std::string dtype_name(const ElemType& t) {
  if (t.name != nullptr) return t.name;
  std::string base;
  switch (t.code) {
    case kDlInt: base = "int"; break;
    case kDlUInt: base = "uint"; break;
    case kDlFloat: base = "float"; break;
    case kDlBfloat: base = "bfloat"; break;
    case kDlComplex: base = "complex"; break;
    case kDlBool: return "bool";
    default: base = "dtype_code" + std::to_string(t.code) + "_"; break;
  }
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

inline std::string device_name(int32_t type, int32_t id) {
  switch (type) {
    case kDlCpu: return "cpu";
    case kDlCuda: return "cuda:" + std::to_string(id);
    default: return "DLPack device type " + std::to_string(type) + ":" + std::to_string(id);
  }
}

inline std::string shape_string(const TensorView& v) {
  const int shown = v.ndim < TensorView::kMaxDims ? v.ndim : TensorView::kMaxDims;
  std::string s = "(";
  for (int i = 0; i < shown; ++i) s += (i ? ", " : "") + std::to_string(v.sizes[i]);
  if (shown < v.ndim) s += ", ...";
  return s + (v.ndim == 1 ? ",)" : ")");
}

namespace detail {

inline Refusal value_error(std::string message) { return {Refusal::kValue, std::move(message)}; }
inline Refusal type_error(std::string message) { return {Refusal::kType, std::move(message)}; }

inline Refusal check_rank(const TensorView& v, int rank, const char* layout) {
  if (v.ndim == rank) return {};
  return value_error(std::string(v.name) + " must be " + std::to_string(rank) + "-D " + layout +
                     ", got shape " + shape_string(v));
}

inline Refusal shape_error(const TensorView& v, const std::string& expected) {
  return value_error(std::string(v.name) + " has shape " + shape_string(v) + ", expected " +
                     expected);
}

// The element strides Args takes. The last dimension must be contiguous (Args has no stride for
// it); a dimension of extent 1, and every dimension of a tensor with no elements, gets the stride
// a packed tensor would have: its own never addresses anything, and frameworks leave arbitrary
// values there.
inline Refusal normalize_strides(TensorView* v) {
  const int last = v->ndim - 1;
  bool empty = false;
  for (int i = 0; i <= last; ++i) empty = empty || v->sizes[i] == 0;
  if (empty) {
    int64_t packed = 1;
    for (int i = last; i >= 0; --i) {
      v->strides[i] = packed;
      packed *= v->sizes[i] > 0 ? v->sizes[i] : 1;
    }
    return {};
  }
  if (v->sizes[last] > 1 && v->strides[last] != 1) {
    return value_error(std::string(v->name) +
                       ": the last dimension must be contiguous (stride 1), got stride " +
                       std::to_string(v->strides[last]) + "; make the array contiguous first");
  }
  v->strides[last] = 1;
  for (int i = last - 1; i >= 0; --i) {
    if (v->sizes[i] == 1) v->strides[i] = v->sizes[i + 1] * v->strides[i + 1];
  }
  return {};
}

inline bool to_dtype(const ElemType& t, DType* dtype) {
  if (t.name != nullptr || t.lanes != 1) return false;
  if (t.code == kDlFloat && t.bits == 32) *dtype = DType::kFloat32;
  else if (t.code == kDlBfloat && t.bits == 16) *dtype = DType::kBFloat16;
  else if (t.code == kDlFloat && t.bits == 16) *dtype = DType::kFloat16;
  else return false;
  return true;
}

}  // namespace detail

// Problem and Args (and the backend) of the call, or the refusal. Normalizes the strides in call.
inline Refusal build(Call& call, Built* built) {
  using detail::check_rank;
  using detail::shape_error;
  using detail::value_error;
  TensorView& h = call.hidden;
  TensorView& wd = call.w_down;
  TensorView& wk = call.w_up_k;
  TensorView& wv = call.w_up_v;
  TensorView& o = call.out;
  TensorView& l = call.latent;
  TensorView& ws = call.workspace;

  // Ranks first: every shape below is read by index.
  if (Refusal r = check_rank(h, 3, "(B, S, D)")) return r;
  if (Refusal r = check_rank(wd, 2, "(D, R)")) return r;
  if (Refusal r = check_rank(wk, 2, "(R, H*Dh)")) return r;
  if (Refusal r = check_rank(wv, 2, "(R, H*Dh)")) return r;
  if (o.present()) {
    if (Refusal r = check_rank(o, 5, "(2, B, S, H, Dh)")) return r;
  }
  if (l.present()) {
    if (Refusal r = check_rank(l, 3, "(B, S, R)")) return r;
  }
  if (ws.present()) {
    if (Refusal r = check_rank(ws, 1, "(bytes,)")) return r;
  }
  const int64_t width = wk.sizes[1];
  if (!o.present() && (call.num_heads <= 0 || width % call.num_heads != 0)) {
    return value_error("num_heads = " + std::to_string(call.num_heads) +
                       " must be positive and divide the width of w_up_k, " +
                       std::to_string(width) + " (= num_heads * head_dim)");
  }

  // One dtype that latentkv takes, one device it runs on, for every tensor.
  TensorView* tensors[] = {&h, &wd, &wk, &wv, &o, &l};
  Problem& p = built->problem;
  if (!detail::to_dtype(h.dtype, &p.dtype)) {
    return detail::type_error("hidden has dtype " + dtype_name(h.dtype) +
                              "; latentkv takes float32, bfloat16 or float16");
  }
  for (TensorView* t : tensors) {
    if (t->present() && !(t->dtype == h.dtype)) {
      return detail::type_error(std::string(t->name) + " has dtype " + dtype_name(t->dtype) +
                                " but hidden has " + dtype_name(h.dtype));
    }
  }
  for (TensorView* t : {&wd, &wk, &wv, &o, &l, &ws}) {
    if (t->present() && (t->device_type != h.device_type || t->device_id != h.device_id)) {
      return value_error(std::string(t->name) + " is on " +
                         device_name(t->device_type, t->device_id) + " but hidden is on " +
                         device_name(h.device_type, h.device_id) +
                         "; all arrays must be on one device");
    }
  }
  if (h.device_type == kDlCpu) {
    built->backend = Backend::kCpu;
  } else if (h.device_type == kDlCuda) {
    built->backend = Backend::kCuda;
  } else {
    return value_error("hidden is on " + device_name(h.device_type, h.device_id) +
                       "; latentkv runs on cpu and cuda");
  }
  built->device_id = h.device_id;

  // The shapes that define the Problem.
  p.batch = h.sizes[0];
  p.seq = h.sizes[1];
  p.model_dim = h.sizes[2];
  p.rank = wd.sizes[1];
  if (wd.sizes[0] != p.model_dim) {
    return shape_error(wd, "(D, R) with D = " + std::to_string(p.model_dim) + " from hidden");
  }
  if (wk.sizes[0] != p.rank) {
    return shape_error(wk, "(R, H*Dh) with R = " + std::to_string(p.rank) + " from w_down");
  }
  if (wv.sizes[0] != wk.sizes[0] || wv.sizes[1] != wk.sizes[1]) {
    return shape_error(wv, "the shape of w_up_k " + shape_string(wk));
  }
  if (o.present()) {
    if (o.sizes[0] != 2 || o.sizes[1] != p.batch || o.sizes[2] != p.seq ||
        o.sizes[3] * o.sizes[4] != width) {
      return shape_error(o, "(2, " + std::to_string(p.batch) + ", " + std::to_string(p.seq) +
                                ", H, Dh) with H*Dh = " + std::to_string(width) + " from w_up_k");
    }
    p.heads = o.sizes[3];
    p.head_dim = o.sizes[4];
  } else {
    p.heads = call.num_heads;
    p.head_dim = width / call.num_heads;
  }
  if (l.present() && (l.sizes[0] != p.batch || l.sizes[1] != p.seq || l.sizes[2] != p.rank)) {
    return shape_error(l, "(B, S, R) = (" + std::to_string(p.batch) + ", " +
                              std::to_string(p.seq) + ", " + std::to_string(p.rank) + ")");
  }
  for (TensorView* t : tensors) {
    if (!t->present()) continue;
    if (Refusal r = detail::normalize_strides(t)) return r;
  }

  Args& a = built->args;
  a.hidden = h.data;
  a.hidden_stride_batch = h.strides[0];
  a.hidden_stride_seq = h.strides[1];
  a.w_down = wd.data;
  a.w_down_stride_row = wd.strides[0];
  a.w_up_k = wk.data;
  a.w_up_k_stride_row = wk.strides[0];
  a.w_up_v = wv.data;
  a.w_up_v_stride_row = wv.strides[0];
  if (o.present()) {
    a.out = o.data;
    a.out_stride_kv = o.strides[0];
    a.out_stride_batch = o.strides[1];
    a.out_stride_seq = o.strides[2];
    a.out_stride_head = o.strides[3];
  } else {  // packed (2, B, S, H, Dh), allocated by the caller
    a.out_stride_head = p.head_dim;
    a.out_stride_seq = p.heads * p.head_dim;
    a.out_stride_batch = p.seq * a.out_stride_seq;
    a.out_stride_kv = p.batch * a.out_stride_batch;
  }
  if (l.present()) {
    a.latent = l.data;
    a.latent_stride_batch = l.strides[0];
    a.latent_stride_seq = l.strides[1];
  }
  if (ws.present()) {
    if (ws.sizes[0] > 1 && ws.strides[0] != 1) {
      return value_error("workspace must be contiguous, got stride " +
                         std::to_string(ws.strides[0]));
    }
    a.workspace = ws.data;
    a.workspace_bytes = ws.sizes[0] * ((ws.dtype.bits * ws.dtype.lanes + 7) / 8);
  }
  return {};
}

}  // namespace latentkv::bind
