// The MLA path's two small kernels around its cuBLASLt GEMMs (cuda-mla-gemm, mla_gemm.cu):
//  - the stage-A epilogue: one pass over the first GEMM's float32 output [q_a | c | k_pe] per
//    token (first summed over the GEMM's slices of D where stage A split it) does both RMSNorms
//    (float32 statistics), RoPE of k_pe and every write that follows from them (q_a, the cache
//    row [c | k_pe], c for stage B, K's last dr columns for every head), each value rounded once
//    to the dtype;
//  - stage B's inputs when stage B runs alone: k_pe broadcast into K's last dr columns (from
//    args.k_pe or the cache row), and c gathered from a paged cache by slot into the workspace.
// The parameter structs are type-erased (dtype fields); the launchers pick the instantiation.
#pragma once

#include <cstdint>

#include "latentkv/latentkv.h"

namespace latentkv::detail {

// Warps per block of both kernels, and the widest k_pe they take: stage B's inputs kernel keeps
// each warp's token's dr values in shared memory (float32), kMlaEpilogueWarps * dr of them within
// the 48 KB a launch gets without opting in. cuda-mla-gemm refuses a wider rope_dim.
constexpr int64_t kMlaEpilogueWarps = 8;
constexpr int64_t kMlaEpilogueMaxRopeDim = 1024;

// The stage-A epilogue stages each token's row of the first GEMM's output (every plane of it) in
// shared memory, with the norm weights once per block, within the 48 KB a launch gets without
// opting in: the bytes one token of a block needs (cuda-mla-gemm refuses a problem over the limit
// and runs stage A in one plane where its slices would not fit). Its dynamic shared memory: 48 KB
// less the 64 bytes of its static partial sums (one pair of floats a warp).
constexpr int64_t kMlaEpilogueSharedBytes = 48 * 1024 - 2 * kMlaEpilogueWarps * 4;
int64_t mla_epilogue_token_shared_bytes(int64_t q_rank, int64_t kv_rank, int64_t rope_dim,
                                        int64_t ckv_ld, int64_t splits);

// Strides in elements; token t = b * S + s.

// The latent cache [num_slots, R + dr] as the kernels address it: row t (slots null) or slots[t],
// a slot outside [0, num_slots) being skipped.
struct MlaCacheRef {
  void* rows;  // null: no cache
  int64_t stride, num_slots;
  const int64_t* slots;  // [B, S] or null
  int64_t slots_stride_batch, slots_stride_seq;
};

// K [B, S, H, dn + dr]: the kernels write its last dr columns.
struct MlaKRef {
  void* data;  // null: K not written
  int64_t stride_batch, stride_seq, stride_head;
};

struct MlaEpilogueParams {
  // [ckv_splits, T, ckv_ld]: q_a (Rq) | c (R) | k_pe (dr), stage A's GEMM output, as partial
  // products over ckv_splits slices of D that the epilogue sums (in slice order, into the first)
  float* ckv;
  int64_t ckv_ld;
  int ckv_splits;  // >= 1
  int64_t ckv_split_stride;  // elements between the slices' planes
  int tokens, seq, q_rank, kv_rank, rope_dim, heads, nope_dim;  // T, S, Rq, R, dr, H, dn
  float eps;
  DType dtype;       // of the norm weights and every output
  DType rope_dtype;  // of cos_sin_cache / cos / sin
  RopeStyle style;
  const void* q_norm;   // [Rq], null when Rq = 0
  const void* kv_norm;  // [R]
  // vLLM's RoPE form when positions is not null, else transformers' (cos, sin).
  const int64_t* positions;  // [B, S]
  int64_t positions_stride_batch, positions_stride_seq;
  const void* cos_sin_cache;  // [max_position, dr]: dr/2 cosines then dr/2 sines
  int64_t cos_sin_cache_stride, max_position;
  const void* cos;  // [B, S, dr]
  const void* sin;  // [B, S, dr], cos's strides
  int64_t cos_stride_batch, cos_stride_seq;
  void* q_a;  // [B, S, Rq] or null
  int64_t q_a_stride_batch, q_a_stride_seq;
  MlaCacheRef cache;  // written: [c | k_pe]
  void* latent;       // [T, R] packed: c for stage B, or null
  MlaKRef k;
};

// Every pointer of the call aligned to its elements (eb: the dtype's bytes, rope_eb: the RoPE
// tables'); the refusal (kInvalidArgument) names the first that is not. Both CUDA strategies ask.
Status mla_elements_aligned(const MlaArgs& a, int64_t eb, int64_t rope_eb);

// The fields that come from the call as given (sizes, norms, RoPE, q_a, the cache), for q_rank
// q_a rows (0 without q_a); ckv, ckv_ld, latent and k are the strategy's to set.
MlaEpilogueParams mla_epilogue_params(const MlaProblem& p, const MlaArgs& a, int64_t q_rank);

Status launch_mla_stage_a_epilogue(const MlaEpilogueParams& p, Stream stream);

struct MlaStageBInputParams {
  int tokens, seq, kv_rank, rope_dim, heads, nope_dim;  // T, S, R, dr, H, dn
  DType dtype;
  const void* k_pe;  // [B, S, dr] (args.k_pe), or null: k_pe from the cache row
  int64_t k_pe_stride_batch, k_pe_stride_seq;
  MlaCacheRef cache;  // read when k_pe is null
  void* latent;  // [T, R] packed: c gathered from the cache rows (zeros for skipped slots), or null
  MlaKRef k;     // its last dr columns (zeros for skipped slots)
};

Status launch_mla_stage_b_inputs(const MlaStageBInputParams& p, Stream stream);

}  // namespace latentkv::detail
