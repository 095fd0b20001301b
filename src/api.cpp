// The public entry points: argument validation (check), strategy choice (select_strategy) and
// dispatch (run). All validation lives here so every backend sees only well-formed calls, and a
// refused call never reaches a backend, so nothing is written.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "backends.h"
#include "validation.h"
#include "latentkv/latentkv.h"

namespace latentkv {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kBackendUnavailable: return "backend unavailable";
    case StatusCode::kCudaError: return "CUDA error";
  }
  return "unknown status";
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown dtype";
}

int64_t element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "unknown backend";
}

const char* to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::kAuto: return "auto";
    case Strategy::kCpuBlocked: return "cpu-blocked";
    case Strategy::kCudaFused: return "cuda-fused";
    case Strategy::kCudaGemm: return "cuda-gemm";
    case Strategy::kCudaDecode: return "cuda-decode";
    case Strategy::kCpuMla: return "cpu-mla";
    case Strategy::kCudaMlaGemm: return "cuda-mla-gemm";
  }
  return "unknown strategy";
}

double Problem::flops() const {
  const double t = static_cast<double>(tokens());
  return 2.0 * t * model_dim * rank + 4.0 * t * rank * kv_width();
}

double Problem::min_bytes() const {
  const double t = static_cast<double>(tokens());
  const double n = static_cast<double>(kv_width());
  return element_size(dtype) *
         (t * model_dim + static_cast<double>(model_dim) * rank + 2.0 * rank * n + 2.0 * t * n);
}

std::string Problem::to_string() const {
  std::ostringstream s;
  s << "B=" << batch << " S=" << seq << " D=" << model_dim << " R=" << rank << " H=" << heads
    << " Dh=" << head_dim << " " << latentkv::to_string(dtype);
  return s.str();
}

Args contiguous_args(const Problem& p, const void* hidden, const void* w_down, const void* w_up_k,
                     const void* w_up_v, void* out, void* latent) {
  Args a;
  a.hidden = hidden;
  a.hidden_stride_seq = p.model_dim;
  a.hidden_stride_batch = p.seq * p.model_dim;
  a.w_down = w_down;
  a.w_down_stride_row = p.rank;
  a.w_up_k = w_up_k;
  a.w_up_k_stride_row = p.kv_width();
  a.w_up_v = w_up_v;
  a.w_up_v_stride_row = p.kv_width();
  a.out = out;
  a.out_stride_head = p.head_dim;
  a.out_stride_seq = p.heads * p.head_dim;
  a.out_stride_batch = p.seq * p.heads * p.head_dim;
  a.out_stride_kv = p.batch * p.seq * p.heads * p.head_dim;
  a.latent = latent;
  a.latent_stride_seq = p.rank;
  a.latent_stride_batch = p.seq * p.rank;
  return a;
}

bool backend_available(Backend backend) {
  switch (backend) {
    case Backend::kCpu: return true;
    case Backend::kCuda: return detail::cuda_device_present();
    case Backend::kAuto: return true;
  }
  return false;
}

Backend resolve_backend(Backend backend) {
  if (backend != Backend::kAuto) return backend;
  return detail::cuda_device_present() ? Backend::kCuda : Backend::kCpu;
}

namespace {

using detail::byte_range;
using detail::check_layout;
using detail::check_positive;
using detail::Dim;
using detail::invalid;
using detail::overlaps;
using detail::Range;
using detail::Span;

Status check_problem(const Problem& p) {
  LATENTKV_RETURN_IF_ERROR(check_positive("batch", p.batch));
  LATENTKV_RETURN_IF_ERROR(check_positive("seq", p.seq));
  LATENTKV_RETURN_IF_ERROR(check_positive("model_dim", p.model_dim));
  LATENTKV_RETURN_IF_ERROR(check_positive("rank", p.rank));
  LATENTKV_RETURN_IF_ERROR(check_positive("heads", p.heads));
  LATENTKV_RETURN_IF_ERROR(check_positive("head_dim", p.head_dim));
  int64_t product = 0;
  if (__builtin_mul_overflow(p.batch, p.seq, &product)) {
    return invalid("problem.batch * problem.seq = " + std::to_string(p.batch) + " * " +
                   std::to_string(p.seq) + " overflows int64");
  }
  if (__builtin_mul_overflow(p.heads, p.head_dim, &product)) {
    return invalid("problem.heads * problem.head_dim = " + std::to_string(p.heads) + " * " +
                   std::to_string(p.head_dim) + " overflows int64");
  }
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) {
    return invalid("problem.dtype = " + std::to_string(static_cast<int>(p.dtype)) +
                   " is not a DType");
  }
  return Status::Ok();
}

Status check_args(const Problem& p, const Args& a) {
  struct Pointer {
    const void* ptr;
    const char* name;
  };
  for (const Pointer& q : {Pointer{a.hidden, "args.hidden"}, Pointer{a.w_down, "args.w_down"},
                           Pointer{a.w_up_k, "args.w_up_k"}, Pointer{a.w_up_v, "args.w_up_v"},
                           Pointer{a.out, "args.out"}}) {
    if (q.ptr == nullptr) return invalid(std::string(q.name) + " is null");
  }
  const int64_t n = p.kv_width();
  const int64_t eb = element_size(p.dtype);
  Span hidden, w_down, w_up_k, w_up_v, out, latent;
  const Dim hidden_dims[] = {{p.batch, a.hidden_stride_batch, "args.hidden_stride_batch"},
                             {p.seq, a.hidden_stride_seq, "args.hidden_stride_seq"},
                             {p.model_dim, 1, nullptr}};
  LATENTKV_RETURN_IF_ERROR(check_layout("hidden", hidden_dims, 3, eb, &hidden));
  const Dim w_down_dims[] = {{p.model_dim, a.w_down_stride_row, "args.w_down_stride_row"},
                             {p.rank, 1, nullptr}};
  LATENTKV_RETURN_IF_ERROR(check_layout("w_down", w_down_dims, 2, eb, &w_down));
  const Dim w_up_k_dims[] = {{p.rank, a.w_up_k_stride_row, "args.w_up_k_stride_row"},
                             {n, 1, nullptr}};
  LATENTKV_RETURN_IF_ERROR(check_layout("w_up_k", w_up_k_dims, 2, eb, &w_up_k));
  const Dim w_up_v_dims[] = {{p.rank, a.w_up_v_stride_row, "args.w_up_v_stride_row"},
                             {n, 1, nullptr}};
  LATENTKV_RETURN_IF_ERROR(check_layout("w_up_v", w_up_v_dims, 2, eb, &w_up_v));
  const Dim out_dims[] = {{2, a.out_stride_kv, "args.out_stride_kv"},
                          {p.batch, a.out_stride_batch, "args.out_stride_batch"},
                          {p.seq, a.out_stride_seq, "args.out_stride_seq"},
                          {p.heads, a.out_stride_head, "args.out_stride_head"},
                          {p.head_dim, 1, nullptr}};
  LATENTKV_RETURN_IF_ERROR(check_layout("out", out_dims, 5, eb, &out));

  Range outputs[3] = {byte_range("out", a.out, out, eb), {}, {}};
  int num_outputs = 1;
  if (a.latent != nullptr) {
    const Dim latent_dims[] = {{p.batch, a.latent_stride_batch, "args.latent_stride_batch"},
                               {p.seq, a.latent_stride_seq, "args.latent_stride_seq"},
                               {p.rank, 1, nullptr}};
    LATENTKV_RETURN_IF_ERROR(check_layout("latent", latent_dims, 3, eb, &latent));
    outputs[num_outputs++] = byte_range("latent", a.latent, latent, eb);
    if (overlaps(outputs[0], outputs[1])) {
      return invalid("args.latent overlaps args.out in memory");
    }
  }
  if (a.workspace != nullptr) {
    if (a.workspace_bytes <= 0) {
      return invalid("args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                     " must be positive when args.workspace is set");
    }
    const uintptr_t w = reinterpret_cast<uintptr_t>(a.workspace);
    const Range workspace{"workspace", w, w + static_cast<uintptr_t>(a.workspace_bytes)};
    for (int o = 0; o < num_outputs; ++o) {
      if (overlaps(workspace, outputs[o])) {
        return invalid(std::string("args.workspace overlaps args.") + outputs[o].name);
      }
    }
    outputs[num_outputs++] = workspace;  // an output too: nothing may alias it
  }
  const Range inputs[] = {byte_range("hidden", a.hidden, hidden, eb),
                          byte_range("w_down", a.w_down, w_down, eb),
                          byte_range("w_up_k", a.w_up_k, w_up_k, eb),
                          byte_range("w_up_v", a.w_up_v, w_up_v, eb)};
  for (int o = 0; o < num_outputs; ++o) {
    for (const Range& in : inputs) {
      if (overlaps(outputs[o], in)) {
        return invalid(std::string("args.") + outputs[o].name + " overlaps args." + in.name +
                       " in memory; outputs must not alias inputs");
      }
    }
  }
  return Status::Ok();
}

// kAuto's first choice on CUDA from the problem alone: the fused kernel where launches and round
// trips dominate (few tokens, small weights); the decode kernels where few tokens meet weights
// worth streaming over every SM (cuBLAS leaves most SMs idle there); cuBLAS where the work is
// GEMM-sized and the fused FFMA kernel would lose to it. choose() and workspace_size() share it.
Strategy preferred_cuda_strategy(const Problem& p) {
  if (detail::cuda_fused_supports(p).ok() && detail::cuda_fused_preferred(p)) {
    return Strategy::kCudaFused;
  }
  return detail::cuda_decode_preferred(p) ? Strategy::kCudaDecode : Strategy::kCudaGemm;
}

Status choose(const Problem& p, const Args& a, const Options& o, Strategy* chosen) {
  const Backend backend = resolve_backend(o.backend);
  if (backend == Backend::kCpu) {
    if (o.strategy != Strategy::kAuto && o.strategy != Strategy::kCpuBlocked) {
      return {StatusCode::kInvalidArgument, std::string("options.strategy = ") +
                                                to_string(o.strategy) +
                                                " does not run on options.backend = cpu"};
    }
    if (p.dtype != DType::kFloat32) {
      return {StatusCode::kUnsupported, std::string("problem.dtype = ") + to_string(p.dtype) +
                                            " is not supported by the cpu backend (float32 only)"};
    }
    *chosen = Strategy::kCpuBlocked;
    return Status::Ok();
  }
  if (!detail::cuda_device_present()) {
    return {StatusCode::kBackendUnavailable,
            "options.backend = cuda, but no CUDA device is present (or CUDA support is not "
            "compiled in)"};
  }
  switch (o.strategy) {
    case Strategy::kCudaFused:
      LATENTKV_RETURN_IF_ERROR(detail::cuda_fused_supports(p));
      *chosen = Strategy::kCudaFused;
      return Status::Ok();
    case Strategy::kCudaGemm:
      LATENTKV_RETURN_IF_ERROR(detail::cuda_gemm_supports(p, a));
      *chosen = Strategy::kCudaGemm;
      return Status::Ok();
    case Strategy::kCudaDecode:
      LATENTKV_RETURN_IF_ERROR(detail::cuda_decode_supports(p, a));
      *chosen = Strategy::kCudaDecode;
      return Status::Ok();
    case Strategy::kAuto: break;
    default:
      return {StatusCode::kInvalidArgument, std::string("options.strategy = ") +
                                                to_string(o.strategy) +
                                                " does not run on options.backend = cuda"};
  }
  // The preferred strategy when the call's arguments suit it, then whatever takes the call (no
  // workspace, unaligned weights).
  const Strategy preferred = preferred_cuda_strategy(p);
  if (preferred == Strategy::kCudaFused) {
    *chosen = Strategy::kCudaFused;
    return Status::Ok();
  }
  const Status decode = detail::cuda_decode_supports(p, a);
  if (preferred == Strategy::kCudaDecode && decode.ok()) {
    *chosen = Strategy::kCudaDecode;
    return Status::Ok();
  }
  const Status fused = detail::cuda_fused_supports(p);
  const Status gemm = detail::cuda_gemm_supports(p, a);
  if (gemm.ok()) {
    *chosen = Strategy::kCudaGemm;
    return Status::Ok();
  }
  if (fused.ok()) {
    *chosen = Strategy::kCudaFused;
    return Status::Ok();
  }
  if (decode.ok()) {
    *chosen = Strategy::kCudaDecode;
    return Status::Ok();
  }
  return {gemm.code(), "no CUDA strategy takes " + p.to_string() + ": cuda-fused: " +
                           fused.message() + "; cuda-gemm: " + gemm.message() +
                           "; cuda-decode: " + decode.message()};
}

}  // namespace

Status select_strategy(const Problem& problem, const Args& args, const Options& options,
                       Strategy* strategy) {
  LATENTKV_RETURN_IF_ERROR(check_problem(problem));
  LATENTKV_RETURN_IF_ERROR(check_args(problem, args));
  if (options.backend != Backend::kAuto && options.backend != Backend::kCpu &&
      options.backend != Backend::kCuda) {
    return invalid("options.backend = " + std::to_string(static_cast<int>(options.backend)) +
                   " is not a Backend");
  }
  Strategy chosen = Strategy::kAuto;
  LATENTKV_RETURN_IF_ERROR(choose(problem, args, options, &chosen));
  if (strategy != nullptr) *strategy = chosen;
  return Status::Ok();
}

int64_t workspace_size(const Problem& problem, const Options& options, bool with_latent) {
  if (!check_problem(problem).ok() || resolve_backend(options.backend) != Backend::kCuda) return 0;
  const int64_t gemm = detail::cuda_gemm_workspace_size(problem, with_latent);
  switch (options.strategy) {
    case Strategy::kCudaGemm: return gemm;
    case Strategy::kCudaDecode: return detail::cuda_decode_workspace_size(problem);
    case Strategy::kAuto: break;
    default: return 0;
  }
  // Where kAuto prefers cuda-decode, enough for cuda-gemm too: choose() falls back to it when the
  // call's weights are not 16-byte vectors.
  switch (preferred_cuda_strategy(problem)) {
    case Strategy::kCudaFused: return 0;
    case Strategy::kCudaDecode: return std::max(detail::cuda_decode_workspace_size(problem), gemm);
    default: return gemm;
  }
}

Status check(const Problem& problem, const Args& args, const Options& options) {
  return select_strategy(problem, args, options, nullptr);
}

Status run(const Problem& problem, const Args& args, const Options& options) {
  Strategy strategy = Strategy::kAuto;
  LATENTKV_RETURN_IF_ERROR(select_strategy(problem, args, options, &strategy));
  switch (strategy) {
    case Strategy::kCpuBlocked: return detail::run_cpu_blocked(problem, args);
    case Strategy::kCudaFused: return detail::run_cuda_fused(problem, args, options.stream);
    case Strategy::kCudaGemm: return detail::run_cuda_gemm(problem, args, options.stream);
    case Strategy::kCudaDecode: {
      const Status decoded = detail::run_cuda_decode(problem, args, options.stream);
      // kAuto's choice refused at launch, having enqueued nothing (the bf16/fp16 kernel is a
      // cooperative launch, one block on every SM at once, which fewer available SMs than the
      // device reports cannot take): cuda-gemm takes the call where it can.
      if (decoded.code() == StatusCode::kUnsupported && options.strategy == Strategy::kAuto &&
          detail::cuda_gemm_supports(problem, args).ok()) {
        return detail::run_cuda_gemm(problem, args, options.stream);
      }
      return decoded;
    }
    default: break;
  }
  return {StatusCode::kUnsupported, "no strategy takes " + problem.to_string()};
}

}  // namespace latentkv
