// The MLA path's strategy table: one row per strategy, in fallback order (strategy_table.h says
// how select_row reads it). On CUDA, cuda-mla-decode (few tokens, bf16/fp16, 16-byte aligned rows)
// comes before cuda-mla-gemm, which takes every call; heuristics.h says which one kAuto prefers.
#include "cuda/mla_decode.h"
#include "heuristics.h"
#include "mla/mla_backends.h"

namespace latentkv::detail {
namespace {

bool always(const MlaProblem&) { return true; }
int64_t no_workspace(const MlaProblem&, bool) { return 0; }
Status launch_cpu(const MlaProblem& p, const MlaArgs& a, Stream) { return run_mla_cpu(p, a); }
int64_t cuda_gemm_workspace(const MlaProblem& p, bool) { return mla_cuda_gemm_workspace_size(p); }
int64_t cuda_decode_workspace(const MlaProblem& p, bool) {
  return mla_cuda_decode_workspace_size(p);
}

const StrategyRow<MlaProblem, MlaArgs> kRows[] = {
    {Strategy::kCpuMla, Backend::kCpu, kAllTypes, mla_cpu_takes, always, no_workspace,
     launch_cpu},
    {Strategy::kCudaMlaDecode, Backend::kCuda, kHalfTypes, mla_cuda_decode_takes,
     cuda_mla_decode_preferred, cuda_decode_workspace, run_mla_cuda_decode},
    {Strategy::kCudaMlaGemm, Backend::kCuda, kAllTypes, mla_cuda_gemm_takes,
     cuda_mla_gemm_preferred, cuda_gemm_workspace, run_mla_cuda_gemm},
};

}  // namespace

const StrategyTable<MlaProblem, MlaArgs>& mla_strategy_table() {
  static const StrategyTable<MlaProblem, MlaArgs> table{kRows, sizeof kRows / sizeof kRows[0]};
  return table;
}

}  // namespace latentkv::detail
