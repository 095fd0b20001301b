// cuda-fused's one-token configuration (fused_fp32_one_token.cu), called by the strategy's
// launcher in fused_fp32.cu: one or two tokens at small widths, every load in flight at kernel
// start and the chain cut to one memory round trip and three barriers.
#pragma once

#include "cuda/device_facts.h"
#include "latentkv/latentkv.h"

namespace latentkv::detail {

// Whether it takes this call: T within heuristics.h's fused_use_one_token, D <= 256, R <= 64 and
// a multiple of 4, w_down's rows 16-byte vectors (pointer and stride). Host-only checks.
bool fused_one_token_takes(const Problem& p, const Args& a);

// Launches it (fused_one_token_takes must have said yes).
Status run_fused_one_token(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream);

}  // namespace latentkv::detail
