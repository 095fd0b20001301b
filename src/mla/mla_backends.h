// Internal interface between the MLA path's API layer (mla/api.cpp: validation, the strategy
// table) and its backends. Backends are called only after validation: positive dimensions,
// non-null required pointers, non-overlapping strides, the stage's inputs and outputs present.
#pragma once

#include "latentkv/latentkv.h"
#include "strategy_table.h"

namespace latentkv::detail {

// The MLA strategy table (mla/strategies.cpp), in fallback order: cpu-mla, cuda-mla-decode
// (cuda/mla_decode.h), cuda-mla-gemm.
const StrategyTable<MlaProblem, MlaArgs>& mla_strategy_table();

// CPU (src/mla/cpu_mla.cpp): every stage in float32, bf16 and fp16; the reference path.
Status mla_cpu_takes(const MlaProblem& problem, const MlaArgs& args);
Status run_mla_cpu(const MlaProblem& problem, const MlaArgs& args);

// CUDA (src/cuda/mla_gemm.cu): cuBLASLt GEMMs for both stages; one pass over the first GEMM's
// float32 output does both RMSNorms, RoPE, the cache row, the latent that stage B reads and K's
// k_pe columns; stage B's GEMMs write K's first dn columns and V in place. bf16, fp16, float32.
Status mla_cuda_gemm_takes(const MlaProblem& problem, const MlaArgs& args);
int64_t mla_cuda_gemm_workspace_size(const MlaProblem& problem);
Status run_mla_cuda_gemm(const MlaProblem& problem, const MlaArgs& args, Stream stream);

}  // namespace latentkv::detail
