// latentkv/_torch_ops.so: torch.ops.latentkv.kv_proj and kv_proj_with_latent registered in C++.
//
// The same two ops that latentkv/torch.py can register from Python, with the same schemas, but
// dispatched without a Python kernel: the Python-registered op costs ~7 us per call more than the
// binding it wraps (measured on an H200 host), this one a C++ dispatch. The kernel is thin:
// cheap checks with the binding's messages (TORCH_CHECK_TYPE -> TypeError for dtypes,
// TORCH_CHECK_VALUE -> ValueError for shapes, strides and devices, naming the argument and its
// value), one allocation for the output, Problem/Args from sizes and element strides, and
// latentkv::run on torch's current stream of the tensors' device. The output, and the scratch of
// the strategy that wants it (cuBLAS's, and the latent when latent_out is not given; the decode
// kernels' partial sums), come from torch's allocator for the device, as at::empty's would (for
// CUDA the caching allocator: stream-ordered and CUDA-graph safe). A refused call raises with
// latentkv's message and writes nothing. The fake (meta) kernels stay in Python (latentkv.torch,
// named by set_python_module), and torch.py loads this library with torch.ops.load_library.
//
// The same file is the Python extension module latentkv._torch_ops (linked against torch_python):
// kv_proj_eager, the op's kernel called from Python without the dispatcher, and the C call of
// LatentKVProjection (install_fast_call), the eager path of the module and of latentkv.torch's
// kv_proj. LATENTKV_TORCH_CUDA (set by CMake only when torch has CUDA) compiles the CUDA
// registration, device guard and stream lookup.
#include <ATen/EmptyTensor.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/library.h>
#include <torch/version.h>

#ifdef LATENTKV_TORCH_CUDA
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdint>
#include <string>

#include "latentkv/latentkv.h"

namespace {

// Dtype names as the binding (DLPack) spells them, so both registrations say the same thing.
std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    default: return c10::toString(t);
  }
}

std::string shape_string(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

void check_dim(const at::Tensor& t, const char* name, int64_t dim, const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must be ", dim, "-D ", layout, ", got shape ",
                    shape_string(t));
}

// Element strides with the binding's rules: the last dimension must be contiguous (the C++ API has
// no stride for it); a dimension of extent 1 gets the stride a packed tensor would have (its own is
// never used to address anything, and torch leaves arbitrary values there).
template <int kDim>
void strides_of(const at::Tensor& t, const char* name, int64_t (&strides)[kDim]) {
  const at::IntArrayRef sizes = t.sizes(), given = t.strides();
  TORCH_CHECK_VALUE(sizes[kDim - 1] <= 1 || given[kDim - 1] == 1, name,
                    ": the last dimension must be contiguous (stride 1), got stride ",
                    given[kDim - 1], "; make the array contiguous first");
  strides[kDim - 1] = 1;
  for (int i = kDim - 2; i >= 0; --i) {
    strides[i] = sizes[i] == 1 ? sizes[i + 1] * strides[i + 1] : given[i];
  }
}

// What at::empty gives, from the same allocator, without a second trip through the dispatcher
// (0.1 us a call, measured on a CPU host). Uninitialized: run() writes all of the output, and the
// workspace is scratch.
at::Tensor empty(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
#ifdef LATENTKV_TORCH_CUDA
  if (device.is_cuda()) return at::detail::empty_cuda(sizes, dtype, device, std::nullopt);
#endif
  return at::detail::empty_cpu(sizes, dtype);
}

at::Tensor kv_proj_impl(const at::Tensor& hidden, const at::Tensor& w_down,
                        const at::Tensor& w_up_k, const at::Tensor& w_up_v, int64_t num_heads,
                        const at::Tensor* latent_out) {
  check_dim(hidden, "hidden", 3, "(B, S, D)");
  check_dim(w_down, "w_down", 2, "(D, R)");
  check_dim(w_up_k, "w_up_k", 2, "(R, H*Dh)");
  check_dim(w_up_v, "w_up_v", 2, "(R, H*Dh)");
  if (latent_out != nullptr) check_dim(*latent_out, "latent_out", 3, "(B, S, R)");
  const int64_t width = w_up_k.size(1);
  TORCH_CHECK_VALUE(num_heads > 0 && width % num_heads == 0, "num_heads = ", num_heads,
                    " must be positive and divide the width of w_up_k, ", width,
                    " (= num_heads * head_dim)");

  const c10::ScalarType scalar_type = hidden.scalar_type();
  latentkv::DType dtype = latentkv::DType::kFloat32;
  switch (scalar_type) {
    case c10::ScalarType::Float: dtype = latentkv::DType::kFloat32; break;
    case c10::ScalarType::BFloat16: dtype = latentkv::DType::kBFloat16; break;
    case c10::ScalarType::Half: dtype = latentkv::DType::kFloat16; break;
    default:
      TORCH_CHECK_TYPE(false, "hidden has dtype ", dtype_name(scalar_type),
                       "; latentkv takes float32, bfloat16 or float16");
  }
  const c10::Device device = hidden.device();
  const at::Tensor* others[] = {&w_down, &w_up_k, &w_up_v, latent_out};
  static constexpr const char* kOtherNames[] = {"w_down", "w_up_k", "w_up_v", "latent_out"};
  const int num_others = latent_out != nullptr ? 4 : 3;
  for (int i = 0; i < num_others; ++i) {
    TORCH_CHECK_TYPE(others[i]->scalar_type() == scalar_type, kOtherNames[i], " has dtype ",
                     dtype_name(others[i]->scalar_type()), " but hidden has ",
                     dtype_name(scalar_type));
  }
  for (int i = 0; i < num_others; ++i) {
    TORCH_CHECK_VALUE(others[i]->device() == device, kOtherNames[i], " is on ",
                      others[i]->device(), " but hidden is on ", device,
                      "; all arrays must be on one device");
  }
  const bool cuda = device.is_cuda();
  TORCH_CHECK_VALUE(cuda || device.is_cpu(), "hidden is on ", device,
                    "; latentkv runs on cpu and cuda");

  latentkv::Problem p;
  p.batch = hidden.size(0);
  p.seq = hidden.size(1);
  p.model_dim = hidden.size(2);
  p.rank = w_down.size(1);
  p.heads = num_heads;
  p.head_dim = width / num_heads;
  p.dtype = dtype;
  TORCH_CHECK_VALUE(w_down.size(0) == p.model_dim, "w_down has shape ", shape_string(w_down),
                    ", expected (D, R) with D = ", p.model_dim, " from hidden");
  TORCH_CHECK_VALUE(w_up_k.size(0) == p.rank, "w_up_k has shape ", shape_string(w_up_k),
                    ", expected (R, H*Dh) with R = ", p.rank, " from w_down");
  TORCH_CHECK_VALUE(w_up_v.sizes() == w_up_k.sizes(), "w_up_v has shape ", shape_string(w_up_v),
                    ", expected the shape of w_up_k ", shape_string(w_up_k));
  if (latent_out != nullptr) {
    const at::Tensor& l = *latent_out;
    TORCH_CHECK_VALUE(l.size(0) == p.batch && l.size(1) == p.seq && l.size(2) == p.rank,
                      "latent_out has shape ", shape_string(l), ", expected (B, S, R) = (",
                      p.batch, ", ", p.seq, ", ", p.rank, ")");
  }

  at::Tensor out = empty({2, p.batch, p.seq, p.heads, p.head_dim}, scalar_type, device);
  if (p.batch == 0 || p.seq == 0 || p.model_dim == 0 || p.rank == 0 || p.heads == 0 ||
      p.head_dim == 0) {
    // Nothing for latentkv to compute: the result is empty or an empty sum (zeros), and only the
    // latent can still be non-trivial (H*Dh = 0 alone); as torch.py's _finish.
    out.zero_();
    if (latent_out != nullptr) latent_out->copy_(hidden.matmul(w_down));
    return out;
  }

  latentkv::Args a;
  int64_t h_strides[3], wd_strides[2], wk_strides[2], wv_strides[2];
  strides_of(hidden, "hidden", h_strides);
  strides_of(w_down, "w_down", wd_strides);
  strides_of(w_up_k, "w_up_k", wk_strides);
  strides_of(w_up_v, "w_up_v", wv_strides);
  a.hidden = hidden.const_data_ptr();
  a.hidden_stride_batch = h_strides[0];
  a.hidden_stride_seq = h_strides[1];
  a.w_down = w_down.const_data_ptr();
  a.w_down_stride_row = wd_strides[0];
  a.w_up_k = w_up_k.const_data_ptr();
  a.w_up_k_stride_row = wk_strides[0];
  a.w_up_v = w_up_v.const_data_ptr();
  a.w_up_v_stride_row = wv_strides[0];
  // out is packed (2, B, S, H, Dh).
  a.out = out.mutable_data_ptr();
  a.out_stride_head = p.head_dim;
  a.out_stride_seq = p.heads * p.head_dim;
  a.out_stride_batch = p.seq * a.out_stride_seq;
  a.out_stride_kv = p.batch * a.out_stride_batch;
  if (latent_out != nullptr) {
    int64_t l_strides[3];
    strides_of(*latent_out, "latent_out", l_strides);
    a.latent = latent_out->mutable_data_ptr();
    a.latent_stride_batch = l_strides[0];
    a.latent_stride_seq = l_strides[1];
  }

  latentkv::Options options;
  options.backend = cuda ? latentkv::Backend::kCuda : latentkv::Backend::kCpu;
#ifdef LATENTKV_TORCH_CUDA
  // Custom ops get no device guard from the dispatcher: run() launches on the current device, so
  // make it the tensors' one (a no-op when it already is), and use torch's stream of that device.
  c10::cuda::OptionalCUDAGuard guard;
  at::Tensor workspace;
  if (cuda) {
    guard.set_device(device);
    options.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    if (const int64_t bytes = latentkv::workspace_size(p, options, latent_out != nullptr)) {
      workspace = empty({bytes}, at::kByte, device);
      a.workspace = workspace.mutable_data_ptr();
      a.workspace_bytes = bytes;
    }
  }
#else
  TORCH_CHECK_VALUE(!cuda, "hidden is on ", device,
                    "; latentkv/_torch_ops was built against a torch without CUDA");
#endif
  const latentkv::Status status = latentkv::run(p, a, options);
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

// Releases the GIL for its scope (also when an exception leaves it).
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() { PyEval_RestoreThread(state_); }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

// The Python exception a refusal becomes, as torch's own translation of these C++ exceptions.
PyObject* raise_from(PyObject* type, const c10::Error& e) {
  PyErr_SetString(type, e.what_without_backtrace());
  return nullptr;
}

// latentkv._torch_ops.kv_proj_eager(hidden, w_down, w_up_k, w_up_v, num_heads): the op's kernel
// called straight from Python, for eager calls of LatentKVProjection and latentkv.torch.kv_proj,
// with no dispatcher, no Python frame of its own (METH_FASTCALL) and no DLPack round trip: the
// tensors are read from their Python objects and the output is wrapped as one. Returns None,
// having done nothing, where the dispatcher must take the call instead: an argument that is not a
// plain tensor (subclasses, non-tensors), a num_heads that is not an int, something for autograd
// to record (the op has no backward), an active torch function or dispatch mode, a functorch
// transform, a jit trace. A refusal raises what the op would (TypeError, ValueError) with the same
// message and writes nothing.
PyObject* kv_proj_eager(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_Format(PyExc_TypeError,
                 "kv_proj_eager(hidden, w_down, w_up_k, w_up_v, num_heads) takes 5 arguments, "
                 "got %zd",
                 nargs);
    return nullptr;
  }
  for (int i = 0; i < 4; ++i) {
    if (!THPVariable_CheckExact(args[i])) Py_RETURN_NONE;
  }
  if (!PyLong_CheckExact(args[4])) Py_RETURN_NONE;  // the op's schema check reports it
  const at::Tensor& hidden = THPVariable_Unpack(args[0]);
  const at::Tensor& w_down = THPVariable_Unpack(args[1]);
  const at::Tensor& w_up_k = THPVariable_Unpack(args[2]);
  const at::Tensor& w_up_v = THPVariable_Unpack(args[3]);
  if (at::GradMode::is_enabled() && (hidden.requires_grad() || w_down.requires_grad() ||
                                     w_up_k.requires_grad() || w_up_v.requires_grad())) {
    Py_RETURN_NONE;
  }
  // Modes, transforms and traces: a functorch transform adds its dynamic-layer keys to the
  // thread's included dispatch keys (as Python dispatch modes do), so any key beyond the default
  // ones declines; torch.jit.trace records through the dispatcher.
  if (at::impl::torch_function_mode_enabled() || c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
      !(c10::impl::tls_local_dispatch_key_set().included_ - c10::default_included_set).empty() ||
      torch::jit::tracer::isTracing()) {
    Py_RETURN_NONE;
  }
  const long long num_heads = PyLong_AsLongLong(args[4]);
  if (num_heads == -1 && PyErr_Occurred()) return nullptr;
  try {
    at::Tensor out;
    if (hidden.is_cuda()) {
      out = kv_proj_impl(hidden, w_down, w_up_k, w_up_v, num_heads, nullptr);
    } else {
      // The CPU backend computes in the call: let other Python threads run meanwhile, as torch's
      // own operators do. (A CUDA call only enqueues; the GIL round trip would cost more.)
      const GilRelease released;
      out = kv_proj_impl(hidden, w_down, w_up_k, w_up_v, num_heads, nullptr);
    }
    return THPVariable_Wrap(std::move(out));
  } catch (const c10::TypeError& e) {
    return raise_from(PyExc_TypeError, e);
  } catch (const c10::ValueError& e) {
    return raise_from(PyExc_ValueError, e);
  } catch (const c10::Error& e) {
    return raise_from(PyExc_RuntimeError, e);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// LatentKVProjection's calls from Python without a Python frame. install_fast_call sets the class's
// tp_call slot (what `module(x)` runs; the class attribute __call__, a Python function, stays what
// torch.compile inlines and what explicit `module.__call__(x)` runs) to module_fast_call, which
// makes the Python __call__'s fast-path checks in C and calls kv_proj_eager, and otherwise calls
// that Python __call__. Measured on the H200's hosts, the Python frame and its checks cost 1.3-1.9
// us of a ~10 us call. Assigning the class's __call__ again restores CPython's own slot. The checks
// mirror __call__'s in latentkv/torch.py: change them together.
struct FastCall {
  PyTypeObject* cls = nullptr;       // LatentKVProjection; subclasses take the Python __call__
  PyObject* python_call = nullptr;   // LatentKVProjection.__call__, the full logic
  PyObject* module_type = nullptr;   // torch.nn.Module
  PyObject* module_call = nullptr;   // nn.Module.__call__ as installed (tracers patch it: torch.fx)
  PyObject* frame_callback = nullptr;  // () -> dynamo's frame callback, None outside torch.compile
  PyObject* global_hooks[4] = {};    // torch.nn.modules.module._global_*_hooks (edited in place)
  PyObject* hook_keys[4] = {};       // the instance's own hook dicts
  PyObject* compiled_key = nullptr;  // "_compiled_call_impl" (module.compile())
  PyObject* forward_key = nullptr;   // "forward" in the instance dict: a patched forward
  PyObject* parameters_key = nullptr;
  PyObject* weight_keys[3] = {};     // w_down, w_up_k, w_up_v
  PyObject* heads_key = nullptr;     // num_heads
  PyObject* call_name = nullptr;     // "__call__"
};
FastCall fast_call;

// The output, a new reference to None where the Python __call__ must take the call, or null with
// an exception set.
PyObject* module_fast_path(PyObject* self, PyObject* x) {
  const FastCall& f = fast_call;
  PyObject* dict = PyObject_GenericGetDict(self, nullptr);
  if (dict == nullptr) return nullptr;
  PyObject* result = nullptr;
  bool plain = true;
  for (PyObject* key : f.hook_keys) {
    PyObject* hooks = PyDict_GetItemWithError(dict, key);
    plain = plain && hooks != nullptr && PyDict_Check(hooks) && PyDict_GET_SIZE(hooks) == 0;
  }
  for (PyObject* hooks : f.global_hooks) plain = plain && PyDict_GET_SIZE(hooks) == 0;
  PyObject* compiled = PyDict_GetItemWithError(dict, f.compiled_key);
  plain = plain && (compiled == nullptr || compiled == Py_None) &&
          PyDict_GetItemWithError(dict, f.forward_key) == nullptr;
  PyObject* params = plain ? PyDict_GetItemWithError(dict, f.parameters_key) : nullptr;
  PyObject* heads = plain ? PyDict_GetItemWithError(dict, f.heads_key) : nullptr;
  PyObject* argv[5] = {x, nullptr, nullptr, nullptr, heads};
  plain = plain && params != nullptr && PyDict_Check(params) && heads != nullptr;
  for (int i = 0; plain && i < 3; ++i) {
    argv[1 + i] = PyDict_GetItemWithError(params, f.weight_keys[i]);
    plain = argv[1 + i] != nullptr;
  }
  if (PyErr_Occurred()) {
    Py_DECREF(dict);
    return nullptr;
  }
  if (plain) {
    PyObject* call = PyObject_GetAttr(f.module_type, f.call_name);
    plain = call == f.module_call;
    Py_XDECREF(call);
  }
  if (plain) {
    PyObject* callback = PyObject_CallNoArgs(f.frame_callback);
    plain = callback == Py_None;
    Py_XDECREF(callback);
  }
  if (!PyErr_Occurred()) result = plain ? kv_proj_eager(nullptr, argv, 5) : Py_NewRef(Py_None);
  Py_DECREF(dict);
  return result;
}

PyObject* module_fast_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  const FastCall& f = fast_call;
  if (Py_TYPE(self) == f.cls && PyTuple_GET_SIZE(args) == 1 &&
      (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0)) {
    PyObject* out = module_fast_path(self, PyTuple_GET_ITEM(args, 0));
    if (out != Py_None) return out;  // the result, or null with the error
    Py_DECREF(out);
  }
  PyObject* bound = PyMethod_New(f.python_call, self);
  if (bound == nullptr) return nullptr;
  PyObject* out = PyObject_Call(bound, args, kwargs);
  Py_DECREF(bound);
  return out;
}

// install_fast_call(cls, python_call, module_type, module_call, frame_callback, global_hooks):
// from latentkv.torch, once per process (later calls change nothing).
PyObject* install_fast_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyType_Check(args[0]) || !PyTuple_Check(args[5]) ||
      PyTuple_GET_SIZE(args[5]) != 4) {
    PyErr_SetString(PyExc_TypeError,
                    "install_fast_call(cls, python_call, module_type, module_call, "
                    "frame_callback, (4 global hook dicts))");
    return nullptr;
  }
  for (int i = 0; i < 4; ++i) {
    if (!PyDict_Check(PyTuple_GET_ITEM(args[5], i))) {
      PyErr_SetString(PyExc_TypeError, "install_fast_call: the global hooks must be dicts");
      return nullptr;
    }
  }
  if (fast_call.cls != nullptr) Py_RETURN_NONE;  // a reloaded latentkv.torch keeps the Python path
  FastCall f;
  f.cls = reinterpret_cast<PyTypeObject*>(Py_NewRef(args[0]));
  f.python_call = Py_NewRef(args[1]);
  f.module_type = Py_NewRef(args[2]);
  f.module_call = Py_NewRef(args[3]);
  f.frame_callback = Py_NewRef(args[4]);
  for (int i = 0; i < 4; ++i) f.global_hooks[i] = Py_NewRef(PyTuple_GET_ITEM(args[5], i));
  const char* hook_names[] = {"_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                              "_backward_hooks"};
  for (int i = 0; i < 4; ++i) f.hook_keys[i] = PyUnicode_InternFromString(hook_names[i]);
  const char* weight_names[] = {"w_down", "w_up_k", "w_up_v"};
  for (int i = 0; i < 3; ++i) f.weight_keys[i] = PyUnicode_InternFromString(weight_names[i]);
  f.compiled_key = PyUnicode_InternFromString("_compiled_call_impl");
  f.forward_key = PyUnicode_InternFromString("forward");
  f.parameters_key = PyUnicode_InternFromString("_parameters");
  f.heads_key = PyUnicode_InternFromString("num_heads");
  f.call_name = PyUnicode_InternFromString("__call__");
  if (PyErr_Occurred()) return nullptr;
  fast_call = f;
  fast_call.cls->tp_call = module_fast_call;
  PyType_Modified(fast_call.cls);
  Py_RETURN_NONE;
}

PyMethodDef module_methods[] = {
    {"kv_proj_eager", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kv_proj_eager)),
     METH_FASTCALL,
     "kv_proj_eager(hidden, w_down, w_up_k, w_up_v, num_heads) -> Tensor | None\n\n"
     "torch.ops.latentkv.kv_proj's kernel without the dispatcher, for plain tensors in eager mode "
     "with nothing for autograd to record; None where the op must take the call."},
    {"install_fast_call",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(install_fast_call)),
     METH_FASTCALL,
     "install_fast_call(cls, python_call, module_type, module_call, frame_callback, "
     "global_hooks)\n\nLatentKVProjection's calls made in C (its tp_call slot); latentkv.torch "
     "installs it once."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_torch_ops",
                          "torch.ops.latentkv.* registered in C++, and the eager entry point.", -1,
                          module_methods};

}  // namespace

// Importing latentkv._torch_ops (after torch.ops.load_library has loaded the same file) gives
// Python the eager entry point; the ops register themselves when the library is loaded.
PyMODINIT_FUNC PyInit__torch_ops() { return PyModule_Create(&module_def); }

TORCH_LIBRARY(latentkv, m) {
  // The fake kernels are registered from this module (torch.library.register_fake); torch imports
  // it when it needs them and checks that they come from there. (The older name of the call is
  // kept as an alias in newer torch; 2.6 surely has the new one.)
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
