// The MLA path's decode strategy (Strategy::kCudaMlaDecode, mla_decode.cu): few tokens (T <= 64)
// against the layer's weights, streamed once over every SM with 16-byte loads into tensor-core
// GEMVs, the norms, RoPE and cache write in a small epilogue and stage B chained behind stage A by
// programmatic dependent launch. bf16 and fp16, sm_80 and later (the overlap needs sm_90).
#pragma once

#include <cstdint>

#include "latentkv/latentkv.h"

namespace latentkv::detail {

Status mla_cuda_decode_takes(const MlaProblem& problem, const MlaArgs& args);
int64_t mla_cuda_decode_workspace_size(const MlaProblem& problem);
Status run_mla_cuda_decode(const MlaProblem& problem, const MlaArgs& args, Stream stream);

}  // namespace latentkv::detail
