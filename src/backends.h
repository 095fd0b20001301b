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

}  // namespace latentkv::detail
