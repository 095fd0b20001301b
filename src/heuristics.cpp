// The strategy preferences of heuristics.h: the measured regions and the one order that makes
// at most one row preferred per problem.
#include "heuristics.h"

#include "backends.h"

namespace latentkv::detail {

bool cuda_fused_faster(const Problem& p) {
  const int64_t weight_floats = p.model_dim * p.rank + 2 * p.rank * p.kv_width();
  return p.dtype == DType::kFloat32 && weight_floats <= kFusedMaxWeightFloats &&
         (p.tokens() <= kFusedMaxTokens ||
          (fused_token_tiles_width(p) && p.tokens() <= kFusedTokenTilesMaxTokens));
}

bool cuda_decode_fp32_faster(const Problem& p) {
  if (!cuda_decode_fp32_fits(p).ok()) return false;  // also bounds the sizes multiplied below
  return p.tokens() <= kDecodeFp32AnyWeightTokens ||
         (p.tokens() <= kDecodeFp32MaxTokens && weight_bytes(p) <= kDecodeSmallWeightBytes);
}

bool cuda_decode_tc_faster(const Problem& p) {
  if (!cuda_decode_tc_fits(p).ok()) return false;  // also bounds the sizes multiplied below
  return weight_bytes(p) <= kDecodeSmallWeightBytes && p.tokens() <= kDecodeTcMaxTokens;
}

bool cuda_fused_preferred(const Problem& p) {
  return cuda_fused_faster(p) && cuda_fused_fits(p).ok();
}

bool cuda_decode_fp32_preferred(const Problem& p) {
  return cuda_decode_fp32_faster(p) && !cuda_fused_preferred(p);
}

bool cuda_decode_tc_preferred(const Problem& p) { return cuda_decode_tc_faster(p); }

bool cuda_gemm_preferred(const Problem& p) {
  return !cuda_fused_preferred(p) && !cuda_decode_fp32_preferred(p) && !cuda_decode_tc_preferred(p);
}

}  // namespace latentkv::detail
