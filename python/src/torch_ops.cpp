// latentkv/_torch_ops.so: torch.ops.latentkv.kv_proj and kv_proj_with_latent (the projection),
// mla_kv, mla_kv_first_stage and mla_kv_second_stage (the MLA KV path, mla.h), defined and given
// their CPU and CUDA kernels here, once (latentkv/torch.py loads this library with
// torch.ops.load_library and registers the fake kernels from Python, the module named by
// set_python_module).
//
// A kernel is kept lean, since it is what every eager call of LatentKVProjection pays on top of
// latentkv::run: the tensors' sizes, strides and pointers go through args_builder.h (mla_args.h for
// the MLA ops; the checks
// and messages shared with the numpy binding: TORCH_CHECK_TYPE -> TypeError for dtypes,
// TORCH_CHECK_VALUE -> ValueError for the rest), the output and the scratch the preferred
// strategy wants (cuBLAS's, the latent when latent_out is not given, the decode kernels' partial
// sums) come from torch's allocator for the device, as at::empty's would, without its second
// dispatch (the caching allocator for CUDA: stream-ordered, CUDA-graph safe), and run() goes on
// torch's current stream of the tensors' device under a device guard. A refused call raises with
// latentkv's message and writes nothing. LATENTKV_TORCH_CUDA (set by CMake only when torch has
// CUDA) compiles the CUDA registration, device guard and stream lookup.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <torch/version.h>

#ifdef LATENTKV_TORCH_CUDA
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdint>

#include "args_builder.h"
#include "latentkv/latentkv.h"
#include "latentkv/mla.h"
#include "mla_args.h"

namespace {

namespace bind = latentkv::bind;

// torch's dtypes in DLPack's codes (what the binding sees for the same tensor), so both say the
// same names; the rest by torch's own name.
bind::ElemType elem_type(c10::ScalarType t) {
  using c10::ScalarType;
  switch (t) {
    case ScalarType::Float: return {bind::kDlFloat, 32};
    case ScalarType::Double: return {bind::kDlFloat, 64};
    case ScalarType::Half: return {bind::kDlFloat, 16};
    case ScalarType::BFloat16: return {bind::kDlBfloat, 16};
    case ScalarType::Byte: return {bind::kDlUInt, 8};
    case ScalarType::Char: return {bind::kDlInt, 8};
    case ScalarType::Short: return {bind::kDlInt, 16};
    case ScalarType::Int: return {bind::kDlInt, 32};
    case ScalarType::Long: return {bind::kDlInt, 64};
    case ScalarType::Bool: return {bind::kDlBool, 8};
    case ScalarType::ComplexFloat: return {bind::kDlComplex, 64};
    case ScalarType::ComplexDouble: return {bind::kDlComplex, 128};
    default: return {0, 0, 1, c10::toString(t)};
  }
}

bind::TensorView view_of(const at::Tensor& t, const char* name) {
  bind::TensorView v;
  v.name = name;
  v.ndim = static_cast<int>(t.dim());
  const at::IntArrayRef sizes = t.sizes(), strides = t.strides();
  for (int i = 0; i < v.ndim && i < bind::TensorView::kMaxDims; ++i) {
    v.sizes[i] = sizes[i];
    v.strides[i] = strides[i];
  }
  v.data = const_cast<void*>(t.const_data_ptr());
  v.dtype = elem_type(t.scalar_type());
  const c10::Device device = t.device();
  v.device_type = device.is_cuda() ? bind::kDlCuda : device.is_cpu() ? bind::kDlCpu
                                                                      : -static_cast<int>(device.type());
  v.device_id = device.has_index() ? device.index() : 0;
  return v;
}

// What at::empty gives, from the same allocator, without a second trip through the dispatcher.
// Uninitialized: run() writes all of the output, and the workspace is scratch.
at::Tensor empty(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
#ifdef LATENTKV_TORCH_CUDA
  if (device.is_cuda()) return at::detail::empty_cuda(sizes, dtype, device, std::nullopt);
#endif
  return at::detail::empty_cpu(sizes, dtype);
}

// A refusal of the builders as TypeError (dtypes) or ValueError (the rest).
void raise_if_refused(const bind::Refusal& r) {
  if (!r) return;
  TORCH_CHECK_TYPE(r.kind != bind::Refusal::kType, r.message);
  TORCH_CHECK_VALUE(false, r.message);
}

// latentkv::run(p, a) on the tensors' device: for CUDA under a device guard (custom ops get none
// from the dispatcher, and run() launches on the current device), on torch's current stream of
// that device, with the scratch workspace_bytes(options) asks for from torch's allocator. Raises
// latentkv's message when the call is refused (ValueError) or CUDA fails (RuntimeError).
template <typename Problem, typename Args, typename WorkspaceBytes>
void run_on_device(const Problem& p, Args& a, latentkv::Backend backend, c10::Device device,
                   WorkspaceBytes workspace_bytes) {
  latentkv::Options options;
  options.backend = backend;
#ifdef LATENTKV_TORCH_CUDA
  c10::cuda::OptionalCUDAGuard guard;
  at::Tensor workspace;
  if (device.is_cuda()) {
    guard.set_device(device);
    options.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    if (const int64_t bytes = workspace_bytes(options)) {
      workspace = empty({bytes}, at::kByte, device);
      a.workspace = workspace.mutable_data_ptr();
      a.workspace_bytes = bytes;
    }
  }
#else
  (void)workspace_bytes;
  TORCH_CHECK_VALUE(!device.is_cuda(), "the tensors are on ", device,
                    "; latentkv/_torch_ops was built against a torch without CUDA");
#endif
  const latentkv::Status status = latentkv::run(p, a, options);
  if (!status.ok()) {
    TORCH_CHECK(status.code() != latentkv::StatusCode::kCudaError,
                latentkv::to_string(status.code()), ": ", status.message());
    TORCH_CHECK_VALUE(false, latentkv::to_string(status.code()), ": ", status.message());
  }
}

at::Tensor kv_proj_impl(const at::Tensor& hidden, const at::Tensor& w_down,
                        const at::Tensor& w_up_k, const at::Tensor& w_up_v, int64_t num_heads,
                        const at::Tensor* latent_out) {
  bind::Call call;
  call.hidden = view_of(hidden, "hidden");
  call.w_down = view_of(w_down, "w_down");
  call.w_up_k = view_of(w_up_k, "w_up_k");
  call.w_up_v = view_of(w_up_v, "w_up_v");
  if (latent_out != nullptr) call.latent = view_of(*latent_out, "latent_out");
  call.num_heads = num_heads;
  bind::Built built;
  raise_if_refused(bind::build(call, &built));
  const latentkv::Problem& p = built.problem;
  const c10::Device device = hidden.device();
  at::Tensor out = empty({2, p.batch, p.seq, p.heads, p.head_dim}, hidden.scalar_type(), device);
  built.args.out = out.mutable_data_ptr();

  run_on_device(p, built.args, built.backend, device, [&](const latentkv::Options& options) {
    return latentkv::workspace_size(p, options, latent_out != nullptr);
  });
  return out;
}

at::Tensor kv_proj(const at::Tensor& hidden, const at::Tensor& w_down, const at::Tensor& w_up_k,
                   const at::Tensor& w_up_v, int64_t num_heads) {
  return kv_proj_impl(hidden, w_down, w_up_k, w_up_v, num_heads, nullptr);
}

at::Tensor kv_proj_with_latent(const at::Tensor& hidden, const at::Tensor& w_down,
                               const at::Tensor& w_up_k, const at::Tensor& w_up_v,
                               int64_t num_heads, const at::Tensor& latent_out) {
  return kv_proj_impl(hidden, w_down, w_up_k, w_up_v, num_heads, &latent_out);
}


// ---- The MLA KV path (mla.h). The three kernels share one body: the call's views go through
// mla_args.h, the outputs (K, V, q_a; packed) come from torch's allocator, run_on_device() runs
// it; the cache is written in place (a declared mutation).

bind::TensorView view_of(const std::optional<at::Tensor>& t, const char* name) {
  if (!t.has_value()) {
    bind::TensorView absent;
    absent.name = name;
    return absent;
  }
  return view_of(*t, name);
}

struct MlaOutputs {
  at::Tensor k, v, q_a;
};

MlaOutputs run_mla(bind::MlaCall& call, const at::Tensor& lead) {
  bind::MlaBuilt built;
  raise_if_refused(bind::build_mla(call, &built));
  const latentkv::MlaProblem& p = built.problem;
  latentkv::MlaArgs& a = built.args;
  const c10::Device device = lead.device();
  const c10::ScalarType dtype = lead.scalar_type();
  MlaOutputs out;
  if (p.stage != latentkv::MlaStage::kSecond) {
    out.q_a = empty({p.batch, p.seq, p.q_rank}, dtype, device);  // [B, S, Rq]
    if (p.q_rank > 0) a.q_a = out.q_a.mutable_data_ptr();
  }
  if (p.stage != latentkv::MlaStage::kFirst) {
    out.k = empty({p.batch, p.seq, p.heads, p.k_width()}, dtype, device);  // [B, S, H, dn + dr]
    out.v = empty({p.batch, p.seq, p.heads, p.v_dim}, dtype, device);      // [B, S, H, dv]
    a.k = out.k.mutable_data_ptr();
    a.v = out.v.mutable_data_ptr();
  }

  run_on_device(p, a, built.backend, device, [&](const latentkv::Options& options) {
    return latentkv::workspace_size(p, options);
  });
  return out;
}

// The arguments both stage-A ops take.
void set_stage_a(bind::MlaCall& call, const at::Tensor& hidden, const at::Tensor& kv_a_weight,
                 const at::Tensor& kv_a_norm_weight, const std::optional<at::Tensor>& cos,
                 const std::optional<at::Tensor>& sin, const std::optional<at::Tensor>& positions,
                 const std::optional<at::Tensor>& cos_sin_cache, c10::string_view rope_style,
                 double eps, const std::optional<at::Tensor>& kv_cache,
                 const std::optional<at::Tensor>& slot_mapping,
                 const std::optional<at::Tensor>& q_a_weight,
                 const std::optional<at::Tensor>& q_a_norm_weight) {
  call.hidden = view_of(hidden, "hidden");
  call.kv_a_weight = view_of(kv_a_weight, "kv_a_weight");
  call.kv_a_norm_weight = view_of(kv_a_norm_weight, "kv_a_norm_weight");
  call.cos = view_of(cos, "cos");
  call.sin = view_of(sin, "sin");
  call.positions = view_of(positions, "positions");
  call.cos_sin_cache = view_of(cos_sin_cache, "cos_sin_cache");
  call.rope_style = std::string_view(rope_style.data(), rope_style.size());
  call.eps = eps;
  call.kv_cache = view_of(kv_cache, "kv_cache");
  call.slot_mapping = view_of(slot_mapping, "slot_mapping");
  call.q_a_weight = view_of(q_a_weight, "q_a_weight");
  call.q_a_norm_weight = view_of(q_a_norm_weight, "q_a_norm_weight");
}

// The arguments both stage-B ops take.
void set_stage_b(bind::MlaCall& call, const at::Tensor& kv_b_weight, int64_t num_heads,
                 int64_t qk_nope_head_dim, int64_t v_head_dim) {
  call.kv_b_weight = view_of(kv_b_weight, "kv_b_weight");
  call.num_heads = num_heads;
  call.nope_dim = qk_nope_head_dim;
  call.v_dim = v_head_dim;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mla_kv(
    const at::Tensor& hidden, const at::Tensor& kv_a_weight, const at::Tensor& kv_a_norm_weight,
    const at::Tensor& kv_b_weight, int64_t num_heads, int64_t qk_nope_head_dim,
    int64_t v_head_dim, const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
    const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& cos_sin_cache,
    c10::string_view rope_style, double eps, const std::optional<at::Tensor>& kv_cache,
    const std::optional<at::Tensor>& slot_mapping, const std::optional<at::Tensor>& q_a_weight,
    const std::optional<at::Tensor>& q_a_norm_weight) {
  bind::MlaCall call;
  call.stage = latentkv::MlaStage::kBoth;
  set_stage_b(call, kv_b_weight, num_heads, qk_nope_head_dim, v_head_dim);
  set_stage_a(call, hidden, kv_a_weight, kv_a_norm_weight, cos, sin, positions, cos_sin_cache,
              rope_style, eps, kv_cache, slot_mapping, q_a_weight, q_a_norm_weight);
  MlaOutputs out = run_mla(call, hidden);
  return {out.k, out.v, out.q_a};
}

at::Tensor mla_kv_first_stage(
    const at::Tensor& hidden, const at::Tensor& kv_a_weight, const at::Tensor& kv_a_norm_weight,
    const at::Tensor& kv_cache, const std::optional<at::Tensor>& cos,
    const std::optional<at::Tensor>& sin, const std::optional<at::Tensor>& positions,
    const std::optional<at::Tensor>& cos_sin_cache, c10::string_view rope_style, double eps,
    const std::optional<at::Tensor>& slot_mapping, const std::optional<at::Tensor>& q_a_weight,
    const std::optional<at::Tensor>& q_a_norm_weight) {
  bind::MlaCall call;
  call.stage = latentkv::MlaStage::kFirst;
  set_stage_a(call, hidden, kv_a_weight, kv_a_norm_weight, cos, sin, positions, cos_sin_cache,
              rope_style, eps, kv_cache, slot_mapping, q_a_weight, q_a_norm_weight);
  return run_mla(call, hidden).q_a;
}

std::tuple<at::Tensor, at::Tensor> mla_kv_second_stage(
    const at::Tensor& kv_b_weight, int64_t num_heads, int64_t qk_nope_head_dim,
    int64_t v_head_dim, const std::optional<at::Tensor>& latent,
    const std::optional<at::Tensor>& k_pe, const std::optional<at::Tensor>& kv_cache,
    const std::optional<at::Tensor>& slot_mapping) {
  bind::MlaCall call;
  call.stage = latentkv::MlaStage::kSecond;
  set_stage_b(call, kv_b_weight, num_heads, qk_nope_head_dim, v_head_dim);
  call.latent = view_of(latent, "latent");
  call.k_pe = view_of(k_pe, "k_pe");
  call.kv_cache = view_of(kv_cache, "kv_cache");
  call.slot_mapping = view_of(slot_mapping, "slot_mapping");
  MlaOutputs out = run_mla(call, kv_b_weight);
  return {out.k, out.v};
}

}  // namespace

TORCH_LIBRARY(latentkv, m) {
  // The fake kernels are registered from this module (torch.library.register_fake); torch imports
  // it when it needs them and checks that they come from there.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  m.set_python_module("latentkv.torch");
#else
  m.impl_abstract_pystub("latentkv.torch");
#endif
  m.def(
      "kv_proj(Tensor hidden, Tensor w_down, Tensor w_up_k, Tensor w_up_v, int num_heads) -> "
      "Tensor");
  m.def(
      "kv_proj_with_latent(Tensor hidden, Tensor w_down, Tensor w_up_k, Tensor w_up_v, "
      "int num_heads, Tensor(a!) latent_out) -> Tensor");
  // The MLA KV path: K (B, S, H, dn + dr), V (B, S, H, dv), q_a (B, S, Rq; Rq = 0 without the
  // q_a weights); kv_cache, when given, receives the [c | k_pe] rows in place.
  m.def(
      "mla_kv(Tensor hidden, Tensor kv_a_weight, Tensor kv_a_norm_weight, Tensor kv_b_weight, "
      "int num_heads, int qk_nope_head_dim, int v_head_dim, Tensor? cos, Tensor? sin, "
      "Tensor? positions, Tensor? cos_sin_cache, str rope_style, float eps, "
      "Tensor(a!)? kv_cache, Tensor? slot_mapping, Tensor? q_a_weight, "
      "Tensor? q_a_norm_weight) -> (Tensor, Tensor, Tensor)");
  m.def(
      "mla_kv_first_stage(Tensor hidden, Tensor kv_a_weight, Tensor kv_a_norm_weight, "
      "Tensor(a!) kv_cache, Tensor? cos, Tensor? sin, Tensor? positions, Tensor? cos_sin_cache, "
      "str rope_style, float eps, Tensor? slot_mapping, Tensor? q_a_weight, "
      "Tensor? q_a_norm_weight) -> Tensor");
  m.def(
      "mla_kv_second_stage(Tensor kv_b_weight, int num_heads, int qk_nope_head_dim, "
      "int v_head_dim, Tensor? latent, Tensor? k_pe, Tensor? kv_cache, Tensor? slot_mapping) -> "
      "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(latentkv, CPU, m) {
  m.impl("kv_proj", &kv_proj);
  m.impl("kv_proj_with_latent", &kv_proj_with_latent);
  m.impl("mla_kv", &mla_kv);
  m.impl("mla_kv_first_stage", &mla_kv_first_stage);
  m.impl("mla_kv_second_stage", &mla_kv_second_stage);
}

#ifdef LATENTKV_TORCH_CUDA
TORCH_LIBRARY_IMPL(latentkv, CUDA, m) {
  m.impl("kv_proj", &kv_proj);
  m.impl("kv_proj_with_latent", &kv_proj_with_latent);
  m.impl("mla_kv", &mla_kv);
  m.impl("mla_kv_first_stage", &mla_kv_first_stage);
  m.impl("mla_kv_second_stage", &mla_kv_second_stage);
}
#endif
