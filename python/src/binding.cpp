// latentkv._C: the Python binding of latentkv::run, kept thin. Each array argument is read as a
// DLPack tensor view (numpy, torch CPU/CUDA, anything with __dlpack__); the Problem comes from the
// shapes (heads and head_dim from the output the caller allocated), Args from the element strides,
// the backend from the device, and run() is called with the GIL released on the caller's stream.
//
// Two ways in, same checks after: a type that publishes the DLPack C exchange API
// (__dlpack_c_exchange_api__, torch >= 2.10) is read by one C call per array, with no Python-level
// __dlpack__ (which costs ~2 us per tensor in torch, refuses tensors that require grad, and may
// record cross-stream events); everything else goes through nanobind's ndarray import.
// A refused call raises ValueError (shapes, strides, devices, what a backend cannot run) or
// TypeError (dtypes, non-arrays) with latentkv's message, and writes nothing. kv_proj never
// allocates: when the strategy the dispatcher prefers needs scratch (cuBLAS, for the latent), it
// returns the byte count and the caller, which owns the allocator (torch's, stream- and
// graph-aware), calls again with a workspace. kv_proj_allocating, for torch's eager path where
// latentkv/_torch_ops (which has its own, faster one) is not in use, gets its output and that
// scratch from the framework's own DLPack allocator instead.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "latentkv/latentkv.h"

namespace nb = nanobind;

namespace {

// The DLPack C ABI (dlpack.h v1.x), only what the exchange API needs. Layouts are fixed by the
// DLPack standard; kept here so the binding does not depend on any framework's headers.
struct DlDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DlDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DlTensor {
  void* data;
  DlDevice device;
  int32_t ndim;
  DlDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; may be null for a compact row-major tensor
  uint64_t byte_offset;
};
struct DlVersion {
  uint32_t major;
  uint32_t minor;
};
struct DlExchangeApiHeader {
  DlVersion version;
  DlExchangeApiHeader* prev_api;
};
struct DlManagedTensorVersioned {
  DlVersion version;
  void* manager_ctx;
  void (*deleter)(DlManagedTensorVersioned* self);
  uint64_t flags;
  DlTensor dl_tensor;
};
struct DlExchangeApi {
  DlExchangeApiHeader header;
  // A new tensor of the framework shaped like prototype (dtype, ndim, shape, device); 0 on
  // success, else set_error was called.
  int (*managed_tensor_allocator)(DlTensor* prototype, DlManagedTensorVersioned** out,
                                  void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind,
                                                    const char* message));
  void* managed_tensor_from_py_object_no_sync;
  // The framework's Python object for a managed tensor (ownership moves); 0 on success.
  int (*managed_tensor_to_py_object_no_sync)(DlManagedTensorVersioned* tensor, void** out);
  int (*dltensor_from_py_object_no_sync)(void* py_object, DlTensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

constexpr int32_t kDlCpu = 1, kDlCuda = 2, kDlCudaHost = 3;
constexpr uint8_t kDlInt = 0, kDlUInt = 1, kDlFloat = 2, kDlBfloat = 4, kDlComplex = 5, kDlBool = 6;

// The exchange API of a Python type, or null. Looked up once per type: a handful of array types
// (numpy.ndarray, torch.Tensor, torch.nn.Parameter) are ever seen, so a tiny table is enough.
const DlExchangeApi* exchange_api(PyTypeObject* type) {
  struct Entry {
    PyTypeObject* type;
    const DlExchangeApi* api;
  };
  static Entry cache[8] = {};
  static int used = 0;
  for (int i = 0; i < used; ++i) {
    if (cache[i].type == type) return cache[i].api;
  }
  const DlExchangeApi* api = nullptr;
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type),
                                             "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
  } else {
    if (PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
      auto* found = static_cast<const DlExchangeApi*>(
          PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
      // Major version 1 is the layout above; dltensor_from_py_object_no_sync may be absent.
      if (found != nullptr && found->header.version.major == 1 &&
          found->dltensor_from_py_object_no_sync != nullptr) {
        api = found;
      }
    }
    PyErr_Clear();
    Py_DECREF(capsule);  // the API table lives as long as the process, per the DLPack contract
  }
  if (used < 8) {
    // Types are immortal enough for this cache: array types are not created per call. Hold a
    // reference so the pointer can never be reused by another type.
    Py_INCREF(reinterpret_cast<PyObject*>(type));
    cache[used++] = {type, api};
  }
  return api;
}

// One array argument as the binding uses it: copied out of the DLPack view, so nothing here points
// into Python objects once the GIL is released.
struct View {
  const char* name = nullptr;
  void* data = nullptr;
  int ndim = 0;
  int64_t shape[5] = {};
  int64_t strides[5] = {};
  DlDataType dtype = {};
  int32_t device_type = 0;
  int32_t device_id = 0;
  const DlExchangeApi* api = nullptr;  // how it was read, for the stream query
};

// Arrays that came through nanobind stay referenced here until run() returns.
struct Keep {
  nb::ndarray<nb::ro> inputs[4];
  nb::ndarray<> outputs[3];
  int num_inputs = 0;
  int num_outputs = 0;
};

std::string dtype_name(DlDataType t) {
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

std::string device_name(int32_t type, int32_t id) {
  switch (type) {
    case kDlCpu: return "cpu";
    case kDlCuda: return "cuda:" + std::to_string(id);
    default: return "DLPack device type " + std::to_string(type) + ":" + std::to_string(id);
  }
}

std::string shape_string(const View& v) {
  std::string s = "(";
  for (int i = 0; i < v.ndim; ++i) s += (i ? ", " : "") + std::to_string(v.shape[i]);
  return s + (v.ndim == 1 ? ",)" : ")");
}

void check_ndim(const View& v, int got, int expected) {
  if (got != expected) {
    throw nb::value_error((std::string(v.name) + " must be " + std::to_string(expected) +
                           "-D, got " + std::to_string(got) + "-D")
                              .c_str());
  }
}

void fill_from_dltensor(View* v, const DlTensor& t, int expected_ndim) {
  check_ndim(*v, t.ndim, expected_ndim);
  v->ndim = t.ndim;
  v->data = static_cast<char*>(t.data) + t.byte_offset;
  v->dtype = t.dtype;
  v->device_type = t.device.device_type;
  v->device_id = t.device.device_id;
  int64_t compact = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    v->shape[i] = t.shape[i];
    v->strides[i] = t.strides ? t.strides[i] : compact;
    compact *= t.shape[i];
  }
}

template <typename Array>
void fill_from_ndarray(View* v, const Array& a, int expected_ndim) {
  check_ndim(*v, static_cast<int>(a.ndim()), expected_ndim);
  v->ndim = static_cast<int>(a.ndim());
  v->data = const_cast<void*>(static_cast<const void*>(a.data()));
  v->dtype = {a.dtype().code, a.dtype().bits, a.dtype().lanes};
  v->device_type = a.device_type();
  v->device_id = a.device_id();
  for (int i = 0; i < v->ndim; ++i) {
    v->shape[i] = static_cast<int64_t>(a.shape(i));
    v->strides[i] = a.stride(i);
  }
}

[[noreturn]] void not_an_array(const char* name, PyTypeObject* type, const char* what) {
  throw nb::type_error((std::string(name) + ": expected " + what +
                        " (numpy.ndarray, torch.Tensor or any DLPack array), got " +
                        nb::type_name(reinterpret_cast<PyObject*>(type)).c_str())
                           .c_str());
}

void read_view_as_given(nb::handle obj, const char* name, int expected_ndim, bool writable,
                        View* v, Keep* keep) {
  v->name = name;
  PyTypeObject* type = Py_TYPE(obj.ptr());
  // Some nanobind versions turn None into an empty ndarray instead of refusing it.
  if (obj.is_none()) not_an_array(name, type, writable ? "a writable array" : "an array");
  if (const DlExchangeApi* api = exchange_api(type)) {
    DlTensor t;
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) throw nb::python_error();
    v->api = api;
    fill_from_dltensor(v, t, expected_ndim);
    return;
  }
  if (writable) {
    nb::ndarray<>& a = keep->outputs[keep->num_outputs];
    if (!nb::try_cast(obj, a, false) || !a.is_valid()) {
      nb::ndarray<nb::ro> readonly;
      if (nb::try_cast(obj, readonly, false)) {
        throw nb::value_error((std::string(name) + " is read-only, but it is written").c_str());
      }
      not_an_array(name, type, "a writable array");
    }
    ++keep->num_outputs;
    fill_from_ndarray(v, a, expected_ndim);
  } else {
    nb::ndarray<nb::ro>& a = keep->inputs[keep->num_inputs];
    if (!nb::try_cast(obj, a, false) || !a.is_valid()) not_an_array(name, type, "an array");
    ++keep->num_inputs;
    fill_from_ndarray(v, a, expected_ndim);
  }
}

// Reads one array argument. Inputs may be read-only; outputs must be writable. Pinned host memory
// (what a framework may report as kDLCUDAHost) is host memory: the CPU device.
void read_view(nb::handle obj, const char* name, int expected_ndim, bool writable, View* v,
               Keep* keep) {
  read_view_as_given(obj, name, expected_ndim, writable, v, keep);
  if (v->device_type == kDlCudaHost) {
    v->device_type = kDlCpu;
    v->device_id = 0;
  }
}

latentkv::DType to_dtype(const View& v) {
  const DlDataType t = v.dtype;
  if (t.lanes == 1 && t.bits == 32 && t.code == kDlFloat) return latentkv::DType::kFloat32;
  if (t.lanes == 1 && t.bits == 16 && t.code == kDlBfloat) return latentkv::DType::kBFloat16;
  if (t.lanes == 1 && t.bits == 16 && t.code == kDlFloat) return latentkv::DType::kFloat16;
  throw nb::type_error((std::string(v.name) + " has dtype " + dtype_name(t) +
                        "; latentkv takes float32, bfloat16 or float16")
                           .c_str());
}

bool same_dtype(DlDataType a, DlDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

[[noreturn]] void shape_error(const View& v, const std::string& why) {
  throw nb::value_error((std::string(v.name) + " has shape " + shape_string(v) + ", " + why).c_str());
}

// The last dimension must be contiguous (the C++ API has no stride for it). Dimensions of extent 1
// get the stride a packed tensor would have: theirs is never used to address anything, and
// frameworks leave arbitrary values there.
void normalize_strides(View* v) {
  const int last = v->ndim - 1;
  if (v->shape[last] > 1 && v->strides[last] != 1) {
    throw nb::value_error((std::string(v->name) + ": the last dimension must be contiguous "
                                                  "(stride 1), got stride " +
                           std::to_string(v->strides[last]) + "; make the array contiguous first")
                              .c_str());
  }
  v->strides[last] = 1;
  for (int i = last - 1; i >= 0; --i) {
    if (v->shape[i] == 1) v->strides[i] = v->shape[i + 1] * v->strides[i + 1];
  }
}

[[noreturn]] void raise_status(const latentkv::Status& status) {
  const std::string message =
      std::string(latentkv::to_string(status.code())) + ": " + status.message();
  if (status.code() == latentkv::StatusCode::kCudaError) throw std::runtime_error(message);
  throw nb::value_error(message.c_str());
}

// Switches the calling thread to the arrays' CUDA device for the duration of run(), as a torch
// device guard would; a no-op when it is already current.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device &&
        cudaSetDevice(device) == cudaSuccess) {
      switched_ = true;
    }
  }
  ~CudaDeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// What kv_proj returns: it ran; nothing to run (a zero dimension: the caller fills the empty or
// zero result the unfused matmuls would give); or (negative) -bytes of workspace to pass in a
// second call, nothing ran.
constexpr int64_t kRan = 1, kNothingToRun = 0;

// Bytes of workspace this call should get from the caller, else 0: what the strategy the
// dispatcher would pick, given scratch, needs (cuBLAS: its own scratch, and the latent when
// latent_out is not passed; the decode kernels: their partial sums).
int64_t workspace_wanted(const latentkv::Problem& p, const latentkv::Args& a,
                         const latentkv::Options& options) {
  if (a.workspace != nullptr) return 0;
  return latentkv::workspace_size(p, options, a.latent != nullptr);
}

// kv_proj and _noop share everything but the call to run(): _noop measures the binding's own cost.
template <bool kRun>
int64_t kv_proj(nb::handle hidden, nb::handle w_down, nb::handle w_up_k, nb::handle w_up_v,
                nb::handle out, nb::handle latent_out, nb::handle stream, nb::handle workspace) {
  Keep keep;
  View h, wd, wk, wv, o, l;
  read_view(hidden, "hidden", 3, false, &h, &keep);
  read_view(w_down, "w_down", 2, false, &wd, &keep);
  read_view(w_up_k, "w_up_k", 2, false, &wk, &keep);
  read_view(w_up_v, "w_up_v", 2, false, &wv, &keep);
  read_view(out, "out", 5, true, &o, &keep);
  const bool has_latent = !latent_out.is_none();
  if (has_latent) read_view(latent_out, "latent_out", 3, true, &l, &keep);
  View ws;
  const bool has_workspace = !workspace.is_none();
  if (has_workspace) read_view(workspace, "workspace", 1, true, &ws, &keep);
  View* views[] = {&h, &wd, &wk, &wv, &o, &l};
  const int num_views = has_latent ? 6 : 5;

  const latentkv::DType dtype = to_dtype(h);
  for (int i = 1; i < num_views; ++i) {
    if (!same_dtype(views[i]->dtype, h.dtype)) {
      throw nb::type_error((std::string(views[i]->name) + " has dtype " +
                            dtype_name(views[i]->dtype) + " but hidden has " + dtype_name(h.dtype))
                               .c_str());
    }
  }
  for (int i = 1; i < num_views; ++i) {
    if (views[i]->device_type != h.device_type || views[i]->device_id != h.device_id) {
      throw nb::value_error((std::string(views[i]->name) + " is on " +
                             device_name(views[i]->device_type, views[i]->device_id) +
                             " but hidden is on " + device_name(h.device_type, h.device_id) +
                             "; all arrays must be on one device")
                                .c_str());
    }
  }
  latentkv::Backend backend;
  if (h.device_type == kDlCpu) {
    backend = latentkv::Backend::kCpu;
  } else if (h.device_type == kDlCuda) {
    backend = latentkv::Backend::kCuda;
  } else {
    throw nb::value_error(("hidden is on " + device_name(h.device_type, h.device_id) +
                           "; latentkv runs on cpu and cuda")
                              .c_str());
  }

  latentkv::Problem p;
  p.batch = h.shape[0];
  p.seq = h.shape[1];
  p.model_dim = h.shape[2];
  p.rank = wd.shape[1];
  p.dtype = dtype;
  const int64_t n = wk.shape[1];
  if (wd.shape[0] != p.model_dim) {
    shape_error(wd, "expected (D, R) with D = " + std::to_string(p.model_dim) + " from hidden");
  }
  if (wk.shape[0] != p.rank) {
    shape_error(wk, "expected (R, H*Dh) with R = " + std::to_string(p.rank) + " from w_down");
  }
  if (wv.shape[0] != wk.shape[0] || wv.shape[1] != wk.shape[1]) {
    shape_error(wv, "expected the shape of w_up_k " + shape_string(wk));
  }
  if (o.shape[0] != 2 || o.shape[1] != p.batch || o.shape[2] != p.seq ||
      o.shape[3] * o.shape[4] != n) {
    shape_error(o, "expected (2, " + std::to_string(p.batch) + ", " + std::to_string(p.seq) +
                       ", H, Dh) with H*Dh = " + std::to_string(n) + " from w_up_k");
  }
  p.heads = o.shape[3];
  p.head_dim = o.shape[4];
  if (has_latent && (l.shape[0] != p.batch || l.shape[1] != p.seq || l.shape[2] != p.rank)) {
    shape_error(l, "expected (B, S, R) = (" + std::to_string(p.batch) + ", " +
                       std::to_string(p.seq) + ", " + std::to_string(p.rank) + ")");
  }
  if (has_workspace && (ws.device_type != h.device_type || ws.device_id != h.device_id)) {
    throw nb::value_error(("workspace is on " + device_name(ws.device_type, ws.device_id) +
                           " but hidden is on " + device_name(h.device_type, h.device_id))
                              .c_str());
  }
  if (p.batch == 0 || p.seq == 0 || p.model_dim == 0 || p.rank == 0 || p.heads == 0 ||
      p.head_dim == 0) {
    return kNothingToRun;
  }
  for (int i = 0; i < num_views; ++i) normalize_strides(views[i]);

  latentkv::Args a;
  a.hidden = h.data;
  a.hidden_stride_batch = h.strides[0];
  a.hidden_stride_seq = h.strides[1];
  a.w_down = wd.data;
  a.w_down_stride_row = wd.strides[0];
  a.w_up_k = wk.data;
  a.w_up_k_stride_row = wk.strides[0];
  a.w_up_v = wv.data;
  a.w_up_v_stride_row = wv.strides[0];
  a.out = o.data;
  a.out_stride_kv = o.strides[0];
  a.out_stride_batch = o.strides[1];
  a.out_stride_seq = o.strides[2];
  a.out_stride_head = o.strides[3];
  if (has_latent) {
    a.latent = l.data;
    a.latent_stride_batch = l.strides[0];
    a.latent_stride_seq = l.strides[1];
  }

  if (has_workspace) {
    if (ws.shape[0] > 1 && ws.strides[0] != 1) {
      throw nb::value_error("workspace must be contiguous");
    }
    a.workspace = ws.data;
    a.workspace_bytes = ws.shape[0] * ((ws.dtype.bits * ws.dtype.lanes + 7) / 8);
  }

  latentkv::Options options;
  options.backend = backend;
  if (backend == latentkv::Backend::kCuda) {
    void* s = nullptr;
    if (!stream.is_none()) {
      uint64_t value = 0;
      if (!nb::try_cast(stream, value, false)) {
        throw nb::type_error("stream must be an int (a cudaStream_t address) or None");
      }
      s = reinterpret_cast<void*>(static_cast<uintptr_t>(value));
    } else if (h.api != nullptr && h.api->current_work_stream != nullptr) {
      if (h.api->current_work_stream(kDlCuda, h.device_id, &s) != 0) throw nb::python_error();
    }
    options.stream = static_cast<latentkv::Stream>(s);
    if (const int64_t bytes = workspace_wanted(p, a, options)) return -bytes;
  }

  latentkv::Status status;
  {
    nb::gil_scoped_release unlocked;
    if (backend == latentkv::Backend::kCuda) {
      CudaDeviceGuard guard(h.device_id);
      if constexpr (kRun) status = latentkv::run(p, a, options);
    } else {
      if constexpr (kRun) status = latentkv::run(p, a, options);
    }
  }
  if (!status.ok()) raise_status(status);
  return kRan;
}

// A new array of the framework behind `api` (dtype, device, shape given), allocated by the
// framework itself (torch: its caching allocator, on the current stream, inside CUDA-graph pools).
nb::object framework_empty(const DlExchangeApi* api, DlDevice device, DlDataType dtype, int ndim,
                           int64_t* shape) {
  DlTensor prototype = {};
  prototype.device = device;
  prototype.ndim = ndim;
  prototype.dtype = dtype;
  prototype.shape = shape;
  DlManagedTensorVersioned* made = nullptr;
  std::string error;
  auto set_error = [](void* context, const char* kind, const char* message) {
    *static_cast<std::string*>(context) = std::string(kind) + ": " + message;
  };
  if (api->managed_tensor_allocator(&prototype, &made, &error, set_error) != 0 || made == nullptr) {
    throw std::runtime_error("latentkv: the array framework could not allocate the output (" +
                             error + ")");
  }
  void* object = nullptr;
  if (api->managed_tensor_to_py_object_no_sync(made, &object) != 0) throw nb::python_error();
  return nb::steal(static_cast<PyObject*>(object));
}

// kv_proj for frameworks that publish a DLPack allocator (torch >= 2.10): the output (2, B, S, H,
// Dh) is allocated here, so an eager call needs no framework dispatch on top of the binding.
// Returns None, having run nothing, where the caller's own path should take the call instead:
// no such framework, a zero dimension, num_heads not dividing H*Dh (the caller reports it).
nb::object kv_proj_allocating(nb::handle hidden, nb::handle w_down, nb::handle w_up_k,
                              nb::handle w_up_v, int64_t num_heads, nb::handle latent_out) {
  const DlExchangeApi* api = exchange_api(Py_TYPE(hidden.ptr()));
  const DlExchangeApi* width_api = exchange_api(Py_TYPE(w_up_k.ptr()));
  if (api == nullptr || width_api == nullptr || api->managed_tensor_allocator == nullptr ||
      api->managed_tensor_to_py_object_no_sync == nullptr) {
    return nb::none();
  }
  DlTensor h, k;
  if (api->dltensor_from_py_object_no_sync(hidden.ptr(), &h) != 0 ||
      width_api->dltensor_from_py_object_no_sync(w_up_k.ptr(), &k) != 0) {
    throw nb::python_error();
  }
  if (h.ndim != 3 || k.ndim != 2 || num_heads <= 0 || k.shape[1] % num_heads != 0) {
    return nb::none();
  }
  int64_t shape[5] = {2, h.shape[0], h.shape[1], num_heads, k.shape[1] / num_heads};
  for (int64_t extent : shape) {
    if (extent == 0) return nb::none();
  }
  nb::object out = framework_empty(api, h.device, h.dtype, 5, shape);
  int64_t ran = kv_proj<true>(hidden, w_down, w_up_k, w_up_v, out, latent_out, nb::none(),
                              nb::none());
  if (ran < 0) {  // the preferred strategy wants scratch: the framework's, freed on return
    int64_t bytes = -ran;
    nb::object workspace = framework_empty(api, h.device, DlDataType{kDlUInt, 8, 1}, 1, &bytes);
    ran = kv_proj<true>(hidden, w_down, w_up_k, w_up_v, out, latent_out, nb::none(), workspace);
  }
  return ran == kRan ? out : nb::none();
}

constexpr const char* kKvProjDoc =
    "kv_proj(hidden, w_down, w_up_k, w_up_v, out, latent_out=None, stream=None, workspace=None)"
    " -> int\n\n"
    "Writes stack([k, v]) of the MLA low-rank KV projection into out (2, B, S, H, Dh), and the\n"
    "latent (B, S, R) into latent_out when given. hidden (B, S, D), w_down (D, R), w_up_k and\n"
    "w_up_v (R, H*Dh); all on one device (cpu or cuda), one dtype (float32, bfloat16, float16),\n"
    "last dimension contiguous. stream: a cudaStream_t as an int; None means the current stream\n"
    "of the arrays' framework when it publishes one (torch), else the legacy default stream.\n"
    "workspace: a 1-D contiguous device array of scratch bytes (cuBLAS's, the latent when\n"
    "latent_out is None, the decode kernels' partial sums), one per stream.\n"
    "Returns 1 after running; 0 without running when a dimension is zero (out is left as it\n"
    "was); -n without running when the best strategy for the call needs n bytes of workspace\n"
    "(call again with one). Raises ValueError/TypeError with latentkv's message on refusal.";

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "latentkv's compiled binding; use latentkv.kv_proj";
  using namespace nb::literals;
  m.def("kv_proj", &kv_proj<true>, "hidden"_a.none(), "w_down"_a.none(), "w_up_k"_a.none(),
        "w_up_v"_a.none(), "out"_a.none(),
        "latent_out"_a = nb::none(), "stream"_a = nb::none(), "workspace"_a = nb::none(),
        kKvProjDoc);
  m.def("_noop", &kv_proj<false>, "hidden"_a.none(), "w_down"_a.none(), "w_up_k"_a.none(),
        "w_up_v"_a.none(), "out"_a.none(),
        "latent_out"_a = nb::none(), "stream"_a = nb::none(), "workspace"_a = nb::none(),
        "Parses and checks like kv_proj (including the stream query and the GIL release) but "
        "does not call run(): the binding's own per-call cost.");
  m.def("kv_proj_allocating", &kv_proj_allocating, "hidden"_a.none(), "w_down"_a.none(),
        "w_up_k"_a.none(), "w_up_v"_a.none(), "num_heads"_a, "latent_out"_a = nb::none(),
        "kv_proj_allocating(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out=None)\n\n"
        "kv_proj with the output (2, B, S, H, Dh) allocated by the arrays' framework through its "
        "DLPack C exchange API (torch >= 2.10) and returned; None, having run nothing, when the "
        "framework has no such API, a dimension is zero or num_heads does not divide H*Dh. "
        "Refusals raise like kv_proj.");
  m.def(
      "cuda_available", [] { return latentkv::backend_available(latentkv::Backend::kCuda); },
      "True when latentkv was built with CUDA and a device is present.");
}
