// cuda-fused's token-tile configuration (fused_fp32_token_tiles.cu), called by the strategy's
// launcher in fused_fp32.cu: 3xTF32 mma.sync with the tokens as the MMA's M, persistent blocks
// holding the weights in shared memory, for the founding widths (D <= 256, R <= 64) at many tokens.
#pragma once

#include "latentkv/latentkv.h"
#include "cuda/device_facts.h"

namespace latentkv::detail {

// Whether it takes this call (asked where the streaming grid would pass two blocks per SM and the
// tensor-core configuration refuses it): sm_80
// code and device, D <= 256, R <= 64, its shared memory within the device's limit (any layout:
// rows that are not 16-byte vectors are staged element by element). Host-only checks.
bool fused_token_tiles_takes(const Problem& p, const Args& a, const DeviceFacts& f);

// Launches it (fused_token_tiles_takes must have said yes).
Status run_fused_token_tiles(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream);

}  // namespace latentkv::detail
