// Device code the MLA path's stage-A kernels share (mla_epilogue.cu after cuBLASLt, the decode
// kernels of mla_decode.cu): where a token's cache row is, RoPE's pair layout in each style, and
// the rotation of one pair with the token's angles in either form (a cos_sin_cache row by
// position, or transformers' per-token cos/sin). One copy, so both strategies rotate, round and
// treat out-of-table positions (NaN) the same way.
#pragma once

#include <cstdint>

#include "cuda/common.h"
#include "cuda/convert.h"
#include "cuda/mla_epilogue.h"
#include "latentkv/mla.h"

namespace latentkv::detail {

// The cache slot of token t: t (dense) or slots[t]; 0 without a cache. Apart from the row below so
// that a kernel can issue the load early and find the row when it needs it.
__device__ __forceinline__ int64_t mla_cache_slot(const MlaCacheRef& cache, int t, int seq) {
  if (cache.rows == nullptr) return 0;
  return cache.slots == nullptr
             ? t
             : cache.slots[token_offset(t, seq, cache.slots_stride_batch, cache.slots_stride_seq)];
}

// The cache row at `slot`; null for padding (slot < 0), for slots past the cache and without a
// cache.
template <typename T>
__device__ __forceinline__ T* mla_cache_row_at(const MlaCacheRef& cache, int64_t slot) {
  if (cache.rows == nullptr || slot < 0 || slot >= cache.num_slots) return nullptr;
  return static_cast<T*>(cache.rows) + slot * cache.stride;
}

// The cache row a token writes or reads (the two above).
template <typename T>
__device__ __forceinline__ T* mla_cache_row(const MlaCacheRef& cache, int t, int seq) {
  return mla_cache_row_at<T>(cache, mla_cache_slot(cache, t, seq));
}

// Token t's K row [H, dn + dr] from its column dn on (k_pe's columns), or null.
template <typename T>
__device__ __forceinline__ T* mla_k_pe_columns(const MlaKRef& k, int t, int seq, int nope_dim) {
  if (k.data == nullptr) return nullptr;
  return static_cast<T*>(k.data) + token_offset(t, seq, k.stride_batch, k.stride_seq) + nope_dim;
}

// RoPE pair i of dr/2 in each layout: inputs ia, ib rotated into outputs oa, ob; in
// transformers' (cos, sin) form, output oa uses cos/sin column ja and ob column jb.
struct RopePair {
  int ia, ib, oa, ob, ja, jb;
};

__device__ __forceinline__ RopePair rope_pair(RopeStyle style, int i, int half) {
  switch (style) {
    case RopeStyle::kInterleave: return {2 * i, 2 * i + 1, i, i + half, i, i + half};
    case RopeStyle::kGptJ: return {2 * i, 2 * i + 1, 2 * i, 2 * i + 1, i, i};
    case RopeStyle::kNeox: break;
  }
  return {i, i + half, i, i + half, i, i + half};
}

// One token's angles: its cos_sin_cache row (vLLM's form), or its cos and sin rows
// (transformers'); ok is false for a position outside [0, max_position), which reads nothing.
template <typename RopeT>
struct RopeAngles {
  const RopeT* table;  // [dr]: dr/2 cosines then dr/2 sines, or null
  const RopeT* cos;    // [dr] each, or null
  const RopeT* sin;
  bool ok;
};

// Token t's position (vLLM's form; 0 in transformers'), loaded apart from its table row (below)
// so that a kernel can issue the load early.
__device__ __forceinline__ int64_t rope_position(const MlaEpilogueParams& p, int t) {
  if (p.positions == nullptr) return 0;
  return p.positions[token_offset(t, p.seq, p.positions_stride_batch, p.positions_stride_seq)];
}

// p: MlaEpilogueParams (its RoPE fields); pos: rope_position(p, t).
template <typename RopeT>
__device__ __forceinline__ RopeAngles<RopeT> rope_angles_at(const MlaEpilogueParams& p, int t,
                                                            int64_t pos) {
  RopeAngles<RopeT> a{nullptr, nullptr, nullptr, true};
  if (p.positions != nullptr) {
    a.ok = pos >= 0 && pos < p.max_position;
    if (a.ok) a.table = static_cast<const RopeT*>(p.cos_sin_cache) + pos * p.cos_sin_cache_stride;
    return a;
  }
  const int64_t offset = token_offset(t, p.seq, p.cos_stride_batch, p.cos_stride_seq);
  a.cos = static_cast<const RopeT*>(p.cos) + offset;
  a.sin = static_cast<const RopeT*>(p.sin) + offset;
  return a;
}

template <typename RopeT>
__device__ __forceinline__ RopeAngles<RopeT> rope_angles(const MlaEpilogueParams& p, int t) {
  return rope_angles_at<RopeT>(p, t, rope_position(p, t));
}

// The cos/sin that pair r (index i of dr/2) rotates by: loaded apart from the rotation so a kernel
// can read them before the data it rotates exists (programmatic dependent launch).
struct PairAngles {
  float ca, sa, cb, sb;
};

template <typename RopeT>
__device__ __forceinline__ PairAngles rope_pair_angles(const RopeAngles<RopeT>& a,
                                                       const RopePair& r, int i, int half) {
  if (!a.ok) return {0.f, 0.f, 0.f, 0.f};
  if (a.table != nullptr) {
    const float c = to_float(a.table[i]), s = to_float(a.table[half + i]);
    return {c, s, c, s};
  }
  return {to_float(a.cos[r.ja]), to_float(a.sin[r.ja]), to_float(a.cos[r.jb]),
          to_float(a.sin[r.jb])};
}

// Rotates pair r, its inputs x0 and x1 (float32, unrounded), into out [dr], each value rounded to T
// (what every destination holds); NaN where the position is outside the table (ok false). The
// second form reads the pair's inputs from x [dr].
template <typename T>
__device__ __forceinline__ void rope_apply(const RopePair& r, const PairAngles& c, bool ok,
                                           float x0, float x1, float* out) {
  if (!ok) {
    out[r.oa] = out[r.ob] = __int_as_float(0x7fc00000);
    return;
  }
  out[r.oa] = to_float(from_float<T>(fmaf(x0, c.ca, -x1 * c.sa)));
  out[r.ob] = to_float(from_float<T>(fmaf(x1, c.cb, x0 * c.sb)));
}
template <typename T>
__device__ __forceinline__ void rope_apply(const RopePair& r, const PairAngles& c, bool ok,
                                           const float* x, float* out) {
  rope_apply<T>(r, c, ok, ok ? x[r.ia] : 0.f, ok ? x[r.ib] : 0.f, out);
}

// Both at once: pair i of x rotated into out.
template <typename T, typename RopeT>
__device__ __forceinline__ void rope_rotate_pair(RopeStyle style, const RopeAngles<RopeT>& a,
                                                 int i, int half, const float* x, float* out) {
  const RopePair r = rope_pair(style, i, half);
  rope_apply<T>(r, rope_pair_angles(a, r, i, half), a.ok, x, out);
}

}  // namespace latentkv::detail
