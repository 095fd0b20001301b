// cuda-fused's register-tile configuration (fused_fp32_register_tiles.cu), called by the
// strategy's launcher in fused_fp32.cu: 4-token tiles at small widths (D <= 256, R <= 64) with
// every load of a block issued at kernel start, register tiles for every FMA, the sums over lanes
// done by warp shuffles, and one barrier between the two projections.
#pragma once

#include "latentkv/latentkv.h"
#include "cuda/device_facts.h"

namespace latentkv::detail {

// Whether it takes this call: T and the grid within heuristics.h's fused_register_tile_cols,
// D <= 256, R <= 64, 16-byte rows of hidden, w_down, w_up_k and w_up_v (D, R, N multiples of 4,
// pointers and strides), the output in 16-byte groups where Dh % 4 == 0 (else element stores),
// its shared memory within the device's limit. Host-only checks.
bool fused_register_tiles_takes(const Problem& p, const Args& a, const DeviceFacts& f);

// Launches it (fused_register_tiles_takes must have said yes).
Status run_fused_register_tiles(const Problem& p, const Args& a, const DeviceFacts& f,
                                Stream stream);

}  // namespace latentkv::detail
