// cuda-fused's tensor-core configuration (fused_fp32_tensor_core.cu), called by the strategy's
// launcher in fused_fp32.cu: 3xTF32 mma.sync on operands staged in shared memory, for
// the founding widths (D <= 256, R <= 64) past one or two tokens.
#pragma once

#include "latentkv/latentkv.h"
#include "cuda/device_facts.h"

namespace latentkv::detail {

// Whether it takes this call: sm_80 code and device, T within heuristics.h's
// fused_use_tensor_core, D <= 256, R <= 64, 16-byte rows of every input (D, R, N, the strides and
// the pointers), its shared memory within the device's limit. Host-only checks.
bool fused_tensor_core_takes(const Problem& p, const Args& a, const DeviceFacts& f);

// Launches it (fused_tensor_core_takes must have said yes).
Status run_fused_tensor_core(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream);

}  // namespace latentkv::detail
