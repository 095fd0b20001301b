// latentkv/_torch_ops.so: torch.ops.latentkv.kv_proj and kv_proj_with_latent, defined and given
// their CPU and CUDA kernels here, once (latentkv/torch.py loads this library with
// torch.ops.load_library and registers the fake kernels from Python, the module named by
// set_python_module).
//
// A kernel is kept lean, since it is what every eager call of LatentKVProjection pays on top of
// latentkv::run: the tensors' sizes, strides and pointers go through args_builder.h (the checks
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
  if (const bind::Refusal r = bind::build(call, &built)) {
    TORCH_CHECK_TYPE(r.kind != bind::Refusal::kType, r.message);
    TORCH_CHECK_VALUE(false, r.message);
  }
  const latentkv::Problem& p = built.problem;
  const c10::Device device = hidden.device();
  at::Tensor out = empty({2, p.batch, p.seq, p.heads, p.head_dim}, hidden.scalar_type(), device);
  built.args.out = out.mutable_data_ptr();

  latentkv::Options options;
  options.backend = built.backend;
#ifdef LATENTKV_TORCH_CUDA
  // Custom ops get no device guard from the dispatcher: run() launches on the current device, so
  // make it the tensors' one (a no-op when it already is), and use torch's stream of that device.
  c10::cuda::OptionalCUDAGuard guard;
  at::Tensor workspace;
  if (device.is_cuda()) {
    guard.set_device(device);
    options.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    if (const int64_t bytes = latentkv::workspace_size(p, options, latent_out != nullptr)) {
      workspace = empty({bytes}, at::kByte, device);
      built.args.workspace = workspace.mutable_data_ptr();
      built.args.workspace_bytes = bytes;
    }
  }
#else
  TORCH_CHECK_VALUE(!device.is_cuda(), "hidden is on ", device,
                    "; latentkv/_torch_ops was built against a torch without CUDA");
#endif
  const latentkv::Status status = latentkv::run(p, built.args, options);
  if (!status.ok()) {
    TORCH_CHECK(status.code() != latentkv::StatusCode::kCudaError,
                latentkv::to_string(status.code()), ": ", status.message());
    TORCH_CHECK_VALUE(false, latentkv::to_string(status.code()), ": ", status.message());
  }
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
}

TORCH_LIBRARY_IMPL(latentkv, CPU, m) {
  m.impl("kv_proj", &kv_proj);
  m.impl("kv_proj_with_latent", &kv_proj_with_latent);
}

#ifdef LATENTKV_TORCH_CUDA
TORCH_LIBRARY_IMPL(latentkv, CUDA, m) {
  m.impl("kv_proj", &kv_proj);
  m.impl("kv_proj_with_latent", &kv_proj_with_latent);
}
#endif
