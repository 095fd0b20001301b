// The projection's strategy table: one row per strategy (cuda-decode has two, one per kernel
// family), in fallback order: kAuto runs the row heuristics.h prefers when it takes the call,
// else the first row below that does (strategy_table.h). This file is where a newcomer finds
// "the strategy for a shape": the rows' takes() say what each can run, heuristics.h which is
// preferred.
#include <cstdint>
#include <iterator>
#include <string>

#include "backends.h"
#include "heuristics.h"
#include "validation.h"

namespace latentkv::detail {
namespace {

using Row = StrategyRow<Problem, Args>;

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

Status takes_always(const Problem&, const Args&) { return Status::Ok(); }
int64_t no_workspace(const Problem&, bool) { return 0; }

Status launch_cpu_blocked(const Problem& p, const Args& a, Stream) { return run_cpu_blocked(p, a); }

Status fused_takes(const Problem& p, const Args&) { return cuda_fused_fits(p); }

// table_workspace asks a row of every problem of its backend and dtype; the decode plans are
// sized for the problems their fits checks accept, so a row asks its plan only for those.
int64_t decode_fp32_workspace(const Problem& p, bool) {
  return cuda_decode_fp32_fits(p).ok() ? cuda_decode_fp32_workspace_size(p) : 0;
}
Status decode_fp32_takes(const Problem& p, const Args& a) {
  LATENTKV_RETURN_IF_ERROR(cuda_decode_fp32_fits(p));
  return cuda_decode_args(p, a, cuda_decode_fp32_workspace_size(p));
}

int64_t decode_tc_workspace(const Problem& p, bool) {
  return cuda_decode_tc_fits(p).ok() ? cuda_decode_tc_workspace_size(p) : 0;
}
// cp.async.bulk.tensor and mbarrier waits are sm_90 instructions: below it the row steps aside.
Status decode_tc_takes(const Problem& p, const Args& a) {
  LATENTKV_RETURN_IF_ERROR(cuda_require_compute_capability(9, "cuda-decode (bf16/fp16)"));
  LATENTKV_RETURN_IF_ERROR(cuda_decode_tc_fits(p));
  LATENTKV_RETURN_IF_ERROR(cuda_decode_tc_compiled());
  return cuda_decode_args(p, a, cuda_decode_tc_workspace_size(p));
}

constexpr Row kRows[] = {
    {Strategy::kCpuBlocked, Backend::kCpu, kAllTypes, takes_always, cpu_blocked_preferred,
     no_workspace, launch_cpu_blocked},
    {Strategy::kCudaGemm, Backend::kCuda, kAllTypes, cuda_gemm_supports, cuda_gemm_preferred,
     cuda_gemm_workspace_size, run_cuda_gemm},
    {Strategy::kCudaFused, Backend::kCuda, kFloat32Only, fused_takes, cuda_fused_preferred,
     no_workspace, run_cuda_fused},
    {Strategy::kCudaDecode, Backend::kCuda, kFloat32Only, decode_fp32_takes,
     cuda_decode_fp32_preferred, decode_fp32_workspace, run_cuda_decode_fp32},
    {Strategy::kCudaDecode, Backend::kCuda, kHalfTypes, decode_tc_takes, cuda_decode_tc_preferred,
     decode_tc_workspace, run_cuda_decode_tc},
};

}  // namespace

const StrategyTable<Problem, Args>& projection_strategies() {
  static const StrategyTable<Problem, Args> table{kRows, static_cast<int>(std::size(kRows))};
  return table;
}

// Both decode families read every weight row in 16-byte pieces and keep their scratch in the
// workspace.
Status cuda_decode_args(const Problem& p, const Args& a, int64_t workspace_bytes) {
  const int64_t vector = 16 / element_size(p.dtype);  // elements per 16 bytes
  if (a.w_down_stride_row % vector != 0 || a.w_up_k_stride_row % vector != 0 ||
      a.w_up_v_stride_row % vector != 0 || !aligned16(a.w_down) || !aligned16(a.w_up_k) ||
      !aligned16(a.w_up_v)) {
    return {StatusCode::kUnsupported,
            "cuda-decode: needs the weight row strides to be multiples of " +
                std::to_string(vector) + " elements and the weights 16-byte aligned"};
  }
  if (a.workspace == nullptr || a.workspace_bytes < workspace_bytes || !aligned16(a.workspace)) {
    return {StatusCode::kInvalidArgument,
            "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                ": cuda-decode needs a 16-byte aligned workspace of " +
                std::to_string(workspace_bytes) + " bytes"};
  }
  return Status::Ok();
}

}  // namespace latentkv::detail
