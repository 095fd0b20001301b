// latentkv._C: the Python binding of latentkv::run for numpy arrays (and any DLPack array), kept
// thin. Each array argument is read as a DLPack view; args_builder.h turns the views into the
// Problem and Args (the checks that come before a Problem exists), and run() checks the rest and
// computes, with the GIL released, on the caller's stream for CUDA arrays.
//
// An array type that publishes the DLPack C exchange API (__dlpack_c_exchange_api__, torch >=
// 2.10) is read by one C call per array, with no Python-level __dlpack__ (which costs ~2 us per
// tensor in torch, refuses tensors that require grad, and may record cross-stream events); every
// other type goes through nanobind's ndarray import. A refused call raises ValueError (shapes,
// strides, devices, what a backend cannot run) or TypeError (dtypes, non-arrays) with latentkv's
// message, and writes nothing. kv_proj writes into the caller's output and allocates nothing;
// kv_proj_numpy, what latentkv.kv_proj calls for numpy arrays, allocates its output as a new
// numpy array.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <new>
#include <string>

#include "args_builder.h"
#include "latentkv/latentkv.h"

namespace nb = nanobind;
using latentkv::bind::TensorView;

namespace {

// The DLPack C ABI (dlpack.h v1.x), only what reading a tensor and its stream needs. Layouts are
// fixed by the DLPack standard; kept here so the binding depends on no framework's headers.
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
struct DlExchangeApi {
  DlExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DlTensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

constexpr int32_t kDlCudaHost = 3;

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
    // Hold a reference so the pointer can never be reused by another type.
    Py_INCREF(reinterpret_cast<PyObject*>(type));
    cache[used++] = {type, api};
  }
  return api;
}

// Arrays that came through nanobind stay referenced here until run() returns.
struct Keep {
  nb::ndarray<nb::ro> inputs[4];
  nb::ndarray<> outputs[3];
  int num_inputs = 0;
  int num_outputs = 0;
};

void fill(TensorView* v, void* data, int ndim, DlDataType dtype, int32_t device_type,
          int32_t device_id, const int64_t* shape, const int64_t* strides) {
  v->data = data;
  v->ndim = ndim;
  v->dtype = {dtype.code, dtype.bits, dtype.lanes, nullptr};
  // Pinned host memory (what a framework may report as kDLCUDAHost) is host memory.
  v->device_type = device_type == kDlCudaHost ? latentkv::bind::kDlCpu : device_type;
  v->device_id = device_type == kDlCudaHost ? 0 : device_id;
  const int kept = ndim < TensorView::kMaxDims ? ndim : TensorView::kMaxDims;
  int64_t compact = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (i < kept) {
      v->sizes[i] = shape[i];
      v->strides[i] = strides ? strides[i] : compact;
    }
    compact *= shape[i];
  }
}

[[noreturn]] void not_an_array(const char* name, PyTypeObject* type, const char* what) {
  throw nb::type_error((std::string(name) + ": expected " + what +
                        " (numpy.ndarray, torch.Tensor or any DLPack array), got " +
                        nb::type_name(reinterpret_cast<PyObject*>(type)).c_str())
                           .c_str());
}

template <typename Array>
void fill_from_ndarray(TensorView* v, const Array& a) {
  const int ndim = static_cast<int>(a.ndim());
  fill(v, const_cast<void*>(static_cast<const void*>(a.data())), 0,
       {a.dtype().code, a.dtype().bits, a.dtype().lanes}, a.device_type(), a.device_id(), nullptr,
       nullptr);
  v->ndim = ndim;
  for (int i = 0; i < ndim && i < TensorView::kMaxDims; ++i) {
    v->sizes[i] = static_cast<int64_t>(a.shape(i));
    v->strides[i] = a.stride(i);
  }
}

// Reads one array argument into v; returns the exchange API it was read through, or null.
// Inputs may be read-only; outputs must be writable.
const DlExchangeApi* read_view(nb::handle obj, const char* name, bool writable, TensorView* v,
                               Keep* keep) {
  v->name = name;
  PyTypeObject* type = Py_TYPE(obj.ptr());
  // Some nanobind versions turn None into an empty ndarray instead of refusing it.
  if (obj.is_none()) not_an_array(name, type, writable ? "a writable array" : "an array");
  if (const DlExchangeApi* api = exchange_api(type)) {
    DlTensor t;
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) throw nb::python_error();
    fill(v, static_cast<char*>(t.data) + t.byte_offset, t.ndim, t.dtype, t.device.device_type,
         t.device.device_id, t.shape, t.strides);
    return api;
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
    fill_from_ndarray(v, a);
  } else {
    nb::ndarray<nb::ro>& a = keep->inputs[keep->num_inputs];
    if (!nb::try_cast(obj, a, false) || !a.is_valid()) not_an_array(name, type, "an array");
    ++keep->num_inputs;
    fill_from_ndarray(v, a);
  }
  return nullptr;
}

void raise_refusal(const latentkv::bind::Refusal& r) {
  if (r.kind == latentkv::bind::Refusal::kType) throw nb::type_error(r.message.c_str());
  throw nb::value_error(r.message.c_str());
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

// A parsed and built call: the views read, Problem/Args/Options made.
struct Prepared {
  Keep keep;
  DlDataType dtype = {};  // hidden's, which every tensor has
  latentkv::bind::Built built;
  latentkv::Options options;
};

// Reads the arguments (out or num_heads; latent_out and workspace may be None), builds the call
// and resolves the stream (an int cudaStream_t, else the current stream of the arrays' framework
// when it publishes one, else the legacy default stream).
void prepare(Prepared* prep, nb::handle hidden, nb::handle w_down, nb::handle w_up_k,
             nb::handle w_up_v, nb::handle out, int64_t num_heads, nb::handle latent_out,
             nb::handle stream, nb::handle workspace) {
  latentkv::bind::Call call;
  Keep* keep = &prep->keep;
  const DlExchangeApi* api = read_view(hidden, "hidden", false, &call.hidden, keep);
  read_view(w_down, "w_down", false, &call.w_down, keep);
  read_view(w_up_k, "w_up_k", false, &call.w_up_k, keep);
  read_view(w_up_v, "w_up_v", false, &call.w_up_v, keep);
  if (out.is_valid()) read_view(out, "out", true, &call.out, keep);
  if (!latent_out.is_none()) read_view(latent_out, "latent_out", true, &call.latent, keep);
  if (!workspace.is_none()) read_view(workspace, "workspace", true, &call.workspace, keep);
  call.num_heads = num_heads;
  prep->dtype = {call.hidden.dtype.code, call.hidden.dtype.bits, call.hidden.dtype.lanes};
  if (latentkv::bind::Refusal r = latentkv::bind::build(call, &prep->built)) raise_refusal(r);

  latentkv::Options& options = prep->options;
  options.backend = prep->built.backend;
  if (options.backend == latentkv::Backend::kCuda) {
    void* s = nullptr;
    if (!stream.is_none()) {
      uint64_t value = 0;
      if (!nb::try_cast(stream, value, false)) {
        throw nb::type_error("stream must be an int (a cudaStream_t address) or None");
      }
      s = reinterpret_cast<void*>(static_cast<uintptr_t>(value));
    } else if (api != nullptr && api->current_work_stream != nullptr) {
      if (api->current_work_stream(latentkv::bind::kDlCuda, prep->built.device_id, &s) != 0) {
        throw nb::python_error();
      }
    }
    options.stream = static_cast<latentkv::Stream>(s);
  }
}

void run_prepared(const Prepared& prep) {
  const latentkv::bind::Built& b = prep.built;
  latentkv::Status status;
  {
    nb::gil_scoped_release unlocked;
    if (b.backend == latentkv::Backend::kCuda) {
      CudaDeviceGuard guard(b.device_id);
      status = latentkv::run(b.problem, b.args, prep.options);
    } else {
      status = latentkv::run(b.problem, b.args, prep.options);
    }
  }
  if (!status.ok()) raise_status(status);
}

enum class Mode { kRun, kNoop, kWorkspaceSize };

// kv_proj, _noop and workspace_size share the parsing and checks; _noop measures the binding's
// own cost (it stops before run()), workspace_size asks what the call would like as scratch.
template <Mode kMode>
int64_t kv_proj(nb::handle hidden, nb::handle w_down, nb::handle w_up_k, nb::handle w_up_v,
                nb::handle out, nb::handle latent_out, nb::handle stream, nb::handle workspace) {
  Prepared prep;
  prepare(&prep, hidden, w_down, w_up_k, w_up_v, out, 0, latent_out, stream, workspace);
  if constexpr (kMode == Mode::kWorkspaceSize) {
    const latentkv::bind::Built& b = prep.built;
    return latentkv::workspace_size(b.problem, prep.options, b.args.latent != nullptr);
  }
  if constexpr (kMode == Mode::kRun) run_prepared(prep);
  return 1;
}

// latentkv.kv_proj's call for numpy arrays: the output, packed (2, B, S, H, Dh), allocated here
// and returned as a numpy array (64-byte aligned for the CPU backend's vector loads).
nb::object kv_proj_numpy(nb::handle hidden, nb::handle w_down, nb::handle w_up_k,
                         nb::handle w_up_v, nb::handle num_heads, nb::handle latent_out) {
  PyObject* index = PyNumber_Index(num_heads.ptr());  // int-like only, as operator.index
  if (index == nullptr) throw nb::python_error();
  const long long heads = PyLong_AsLongLong(index);
  Py_DECREF(index);
  if (heads == -1 && PyErr_Occurred()) throw nb::python_error();
  Prepared prep;
  prepare(&prep, hidden, w_down, w_up_k, w_up_v, nb::handle(), heads, latent_out, nb::none(),
          nb::none());
  const latentkv::Problem& p = prep.built.problem;
  if (prep.built.backend != latentkv::Backend::kCpu) {
    throw nb::value_error(("hidden is on " +
                           latentkv::bind::device_name(latentkv::bind::kDlCuda,
                                                       prep.built.device_id) +
                           "; latentkv.kv_proj returns numpy arrays from host memory only (pass "
                           "torch tensors for CUDA)")
                              .c_str());
  }
  const size_t shape[5] = {2, static_cast<size_t>(p.batch), static_cast<size_t>(p.seq),
                           static_cast<size_t>(p.heads), static_cast<size_t>(p.head_dim)};
  const size_t bytes = 2 * static_cast<size_t>(p.tokens()) * static_cast<size_t>(p.kv_width()) *
                       static_cast<size_t>(latentkv::element_size(p.dtype));
  constexpr std::align_val_t kAlign{64};
  void* data = ::operator new(bytes > 0 ? bytes : 1, kAlign);
  nb::capsule owner(data, [](void* d) noexcept { ::operator delete(d, kAlign); });
  prep.built.args.out = data;
  run_prepared(prep);
  const nb::dlpack::dtype dtype{prep.dtype.code, prep.dtype.bits, prep.dtype.lanes};
  return nb::ndarray<nb::numpy>(data, 5, shape, owner, nullptr, dtype).cast();
}

constexpr const char* kKvProjDoc =
    "kv_proj(hidden, w_down, w_up_k, w_up_v, out, latent_out=None, stream=None, workspace=None)"
    " -> 1\n\n"
    "Writes stack([k, v]) of the MLA low-rank KV projection into out (2, B, S, H, Dh), and the\n"
    "latent (B, S, R) into latent_out when given. hidden (B, S, D), w_down (D, R), w_up_k and\n"
    "w_up_v (R, H*Dh); all on one device (cpu or cuda), one dtype (float32, bfloat16, float16),\n"
    "last dimension contiguous. stream: a cudaStream_t as an int; None means the current stream\n"
    "of the arrays' framework when it publishes one (torch), else the legacy default stream.\n"
    "workspace: a 1-D contiguous device array of scratch bytes (workspace_size() says how many\n"
    "the preferred strategy wants; without it, latentkv runs a strategy that needs none), one\n"
    "per stream. Returns 1 after running; raises ValueError/TypeError with latentkv's message\n"
    "on refusal, having written nothing.";

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "latentkv's compiled binding; use latentkv.kv_proj";
  using namespace nb::literals;
  m.def("kv_proj", &kv_proj<Mode::kRun>, "hidden"_a.none(), "w_down"_a.none(), "w_up_k"_a.none(),
        "w_up_v"_a.none(), "out"_a.none(), "latent_out"_a = nb::none(), "stream"_a = nb::none(),
        "workspace"_a = nb::none(), kKvProjDoc);
  m.def("_noop", &kv_proj<Mode::kNoop>, "hidden"_a.none(), "w_down"_a.none(), "w_up_k"_a.none(),
        "w_up_v"_a.none(), "out"_a.none(), "latent_out"_a = nb::none(), "stream"_a = nb::none(),
        "workspace"_a = nb::none(),
        "Parses and checks like kv_proj (including the stream query) but does not call run(): "
        "the binding's own per-call cost.");
  m.def("workspace_size", &kv_proj<Mode::kWorkspaceSize>, "hidden"_a.none(), "w_down"_a.none(),
        "w_up_k"_a.none(), "w_up_v"_a.none(), "out"_a.none(), "latent_out"_a = nb::none(),
        "stream"_a = nb::none(), "workspace"_a = nb::none(),
        "Bytes of workspace the strategy latentkv prefers for this kv_proj call wants (0 on the "
        "CPU and for strategies that need none); checks like kv_proj, runs nothing.");
  m.def("kv_proj_numpy", &kv_proj_numpy, "hidden"_a.none(), "w_down"_a.none(), "w_up_k"_a.none(),
        "w_up_v"_a.none(), "num_heads"_a.none(), "latent_out"_a = nb::none(),
        "kv_proj_numpy(hidden, w_down, w_up_k, w_up_v, num_heads, latent_out=None) -> ndarray\n\n"
        "kv_proj into a new numpy array (2, B, S, H, Dh) with H = num_heads (host arrays: the "
        "CPU backend); what latentkv.kv_proj runs for numpy arrays.");
  m.def(
      "cuda_available", [] { return latentkv::backend_available(latentkv::Backend::kCuda); },
      "True when latentkv was built with CUDA and a device is present.");
  m.def(
      "cpu_bf16_isa", [] { return latentkv::cpu_bf16_isa(); },
      "The CPU backend's instructions for bf16 products here: 'avx512-bf16' (dot products) or "
      "'avx2' (widened to float32 FMAs; also where LATENTKV_CPU_ISA=avx2).");
  m.def(
      "cpu_split_tokens",
      [](const std::string& dtype) {
        for (latentkv::DType d : {latentkv::DType::kFloat32, latentkv::DType::kBFloat16,
                                  latentkv::DType::kFloat16}) {
          if (dtype == latentkv::to_string(d)) return latentkv::cpu_split_tokens(d);
        }
        throw nb::value_error(("dtype = '" + dtype +
                               "' is not one of 'float32', 'bfloat16', 'float16'").c_str());
      },
      "dtype"_a,
      "cpu_split_tokens(dtype) -> int\n\nThe CPU backend's decode regime for dtype ('float32', "
      "'bfloat16' or 'float16'): calls of at most this many tokens stream the weights once over "
      "every thread (weight columns split across them) instead of tiling the tokens.");
}
