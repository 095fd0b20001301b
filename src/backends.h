// Internal interface between the API layer (api.cpp: validation, dispatch) and the backends.
// Every function here is called only after the API layer has validated the problem and arguments,
// so backends may assume positive dimensions, non-null pointers and non-overlapping strides.
#pragma once

#include "latentkv/latentkv.h"

namespace latentkv::detail {

// CPU backend (src/cpu/). float32 only.
Status run_cpu_blocked(const Problem& problem, const Args& args);

// CUDA backend (src/cuda/). Built whenever the CUDA toolkit is found; device presence is a runtime
// question.
bool cuda_device_present();
// Size and dtype limits of the fused kernel (shared memory, index widths); no device query.
Status cuda_fused_supports(const Problem& problem);
Status run_cuda_fused(const Problem& problem, const Args& args, Stream stream);
// The fused kernel is the faster strategy for this float32 problem (few tokens, small weights).
bool cuda_fused_preferred(const Problem& problem);

// cuBLAS strategy (src/cuda/gemm_cublas.cu): all dtypes; needs a (T, N) matrix view of each output
// half (heads packed) and somewhere to put the latent.
int64_t cuda_gemm_workspace_size(const Problem& problem);
Status cuda_gemm_supports(const Problem& problem, const Args& args);
Status run_cuda_gemm(const Problem& problem, const Args& args, Stream stream);

}  // namespace latentkv::detail
