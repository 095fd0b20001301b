// The projection's public entry points. One way through: validate (check_problem, check_args) ->
// resolve the backend -> the strategy table's row (strategies.cpp, select_row) -> its launcher.
// All validation lives here so every backend sees only well-formed calls, and a refused call
// never reaches a backend, so nothing is written. A problem with a zero dimension is valid: it
// reaches no strategy, and run_*_zero_size writes what the unfused math gives (empty sums).
#include <cstdint>
#include <sstream>
#include <string>

#include "backends.h"
#include "cpu/bf16_dot.h"
#include "heuristics.h"
#include "latentkv/latentkv.h"
#include "validation.h"

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
    case Strategy::kCudaMlaDecode: return "cuda-mla-decode";
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
  using detail::wrapping_product;  // the problem is not checked yet
  Args a;
  a.hidden = hidden;
  a.hidden_stride_seq = p.model_dim;
  a.hidden_stride_batch = wrapping_product({p.seq, p.model_dim});
  a.w_down = w_down;
  a.w_down_stride_row = p.rank;
  a.w_up_k = w_up_k;
  a.w_up_k_stride_row = wrapping_product({p.heads, p.head_dim});
  a.w_up_v = w_up_v;
  a.w_up_v_stride_row = a.w_up_k_stride_row;
  a.out = out;
  a.out_stride_head = p.head_dim;
  a.out_stride_seq = wrapping_product({p.heads, p.head_dim});
  a.out_stride_batch = wrapping_product({p.seq, p.heads, p.head_dim});
  a.out_stride_kv = wrapping_product({p.batch, p.seq, p.heads, p.head_dim});
  a.latent = latent;
  a.latent_stride_seq = p.rank;
  a.latent_stride_batch = wrapping_product({p.seq, p.rank});
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

const char* cpu_bf16_isa() { return detail::bf16_dot_enabled() ? "avx512-bf16" : "avx2"; }

int cpu_split_tokens(DType dtype) {
  return static_cast<int>(detail::cpu_blocked_split_tokens(detail::bf16_dot_takes(dtype)));
}

namespace {

using detail::byte_range;
using detail::check_layout;
using detail::check_nonnegative;
using detail::check_packed_bytes;
using detail::Dim;
using detail::invalid;
using detail::overlaps;
using detail::Range;
using detail::Span;
using Row = detail::StrategyRow<Problem, Args>;

bool has_zero_dimension(const Problem& p) {
  return p.batch == 0 || p.seq == 0 || p.model_dim == 0 || p.rank == 0 || p.heads == 0 ||
         p.head_dim == 0;
}

Status check_problem(const Problem& p) {
  LATENTKV_RETURN_IF_ERROR(check_nonnegative("batch", p.batch));
  LATENTKV_RETURN_IF_ERROR(check_nonnegative("seq", p.seq));
  LATENTKV_RETURN_IF_ERROR(check_nonnegative("model_dim", p.model_dim));
  LATENTKV_RETURN_IF_ERROR(check_nonnegative("rank", p.rank));
  LATENTKV_RETURN_IF_ERROR(check_nonnegative("heads", p.heads));
  LATENTKV_RETURN_IF_ERROR(check_nonnegative("head_dim", p.head_dim));
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
  // The packed tensors within 2^60 bytes (validation.h: kMaxPackedBytes), which bounds the latent
  // in cuda-gemm's workspace and the sizes the strategies add up.
  const int64_t eb = element_size(p.dtype);
  LATENTKV_RETURN_IF_ERROR(check_packed_bytes("hidden", "problem.batch * seq * model_dim",
                                              {p.batch, p.seq, p.model_dim}, eb));
  LATENTKV_RETURN_IF_ERROR(
      check_packed_bytes("w_down", "problem.model_dim * rank", {p.model_dim, p.rank}, eb));
  LATENTKV_RETURN_IF_ERROR(check_packed_bytes("w_up_k", "problem.rank * heads * head_dim",
                                              {p.rank, p.heads, p.head_dim}, eb));
  LATENTKV_RETURN_IF_ERROR(check_packed_bytes("latent", "problem.batch * seq * rank",
                                              {p.batch, p.seq, p.rank}, eb));
  LATENTKV_RETURN_IF_ERROR(check_packed_bytes("out", "2 * problem.batch * seq * heads * head_dim",
                                              {2, p.batch, p.seq, p.heads, p.head_dim}, eb));
  return Status::Ok();
}

Status check_args(const Problem& p, const Args& a) {
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
  // A tensor with no elements may be null; the latent is optional.
  struct Pointer {
    const void* ptr;
    const Span& span;
    const char* name;
  };
  for (const Pointer& q : {Pointer{a.hidden, hidden, "args.hidden"},
                           Pointer{a.w_down, w_down, "args.w_down"},
                           Pointer{a.w_up_k, w_up_k, "args.w_up_k"},
                           Pointer{a.w_up_v, w_up_v, "args.w_up_v"},
                           Pointer{a.out, out, "args.out"}}) {
    if (q.ptr == nullptr && !q.span.empty()) return invalid(std::string(q.name) + " is null");
  }

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

// Validation, the backend, and the row that runs the call: null for a problem with a zero
// dimension, which no strategy computes (only a row of that backend, dtype and forced strategy
// must exist).
Status select(const Problem& p, const Args& a, const Options& o, Backend* backend,
              const Row** row) {
  LATENTKV_RETURN_IF_ERROR(check_problem(p));
  LATENTKV_RETURN_IF_ERROR(check_args(p, a));
  if (o.backend != Backend::kAuto && o.backend != Backend::kCpu && o.backend != Backend::kCuda) {
    return invalid("options.backend = " + std::to_string(static_cast<int>(o.backend)) +
                   " is not a Backend");
  }
  *backend = resolve_backend(o.backend);
  if (*backend == Backend::kCuda && !detail::cuda_device_present()) {
    return {StatusCode::kBackendUnavailable,
            "options.backend = cuda, but no CUDA device is present (or CUDA support is not "
            "compiled in)"};
  }
  const auto& table = detail::projection_strategies();
  *row = nullptr;
  if (has_zero_dimension(p)) return detail::match_rows(table, p, *backend, o.strategy);
  return detail::select_row(table, p, a, *backend, o.strategy, row);
}

}  // namespace

Status select_strategy(const Problem& problem, const Args& args, const Options& options,
                       Strategy* strategy) {
  Backend backend = Backend::kAuto;
  const Row* row = nullptr;
  LATENTKV_RETURN_IF_ERROR(select(problem, args, options, &backend, &row));
  if (strategy != nullptr) *strategy = row != nullptr ? row->id : options.strategy;
  return Status::Ok();
}

int64_t workspace_size(const Problem& problem, const Options& options, bool with_latent) {
  if (!check_problem(problem).ok() || has_zero_dimension(problem)) return 0;
  return detail::table_workspace(detail::projection_strategies(), problem,
                                 resolve_backend(options.backend), options.strategy, with_latent);
}

Status check(const Problem& problem, const Args& args, const Options& options) {
  return select_strategy(problem, args, options, nullptr);
}

Status run(const Problem& problem, const Args& args, const Options& options) {
  Backend backend = Backend::kAuto;
  const Row* row = nullptr;
  LATENTKV_RETURN_IF_ERROR(select(problem, args, options, &backend, &row));
  if (row == nullptr) {
    return backend == Backend::kCpu ? detail::run_cpu_zero_size(problem, args)
                                    : detail::run_cuda_zero_size(problem, args, options.stream);
  }
  const Status launched = row->launch(problem, args, options.stream);
  if (launched.code() == StatusCode::kUnsupported && options.strategy == Strategy::kAuto) {
    const Row* next = detail::next_row(detail::projection_strategies(), problem, args, row);
    if (next != nullptr) return next->launch(problem, args, options.stream);
  }
  return launched;
}

}  // namespace latentkv
