// latentkv's MLA KV path: what DeepSeek-V2/V3 and Kimi K2 compute for keys and values, from the
// hidden states to K, V and the latent cache row, with the checkpoint's weights as they are.
//
//   stage A (kFirst)   ckv  = hidden @ kv_a_weight^T            kv_a_weight [R + dr, D]
//                      c    = rmsnorm(ckv[:, :R]) * kv_a_norm_weight      (float32 statistics)
//                      k_pe = rope(ckv[:, R:], position)
//                      q_a  = rmsnorm(hidden @ q_a_weight^T) * q_a_norm_weight   (Rq > 0 only)
//                      kv_cache[slot[t]] = [c | k_pe]           (dense: row t; slot < 0: skipped)
//   stage B (kSecond)  kv   = c @ kv_b_weight^T                  kv_b_weight [H * (dn + dv), R]
//                      K[t, h] = [kv[t, h, :dn] | k_pe[t]]      (dn + dr wide)
//                      V[t, h] = kv[t, h, dn:]                  (dv wide)
//
// kBoth runs A then B in one call. Same contract as the projection (latentkv.h): check() names the
// argument and its value; a refused call writes nothing; run() allocates nothing, never
// synchronizes, runs on options.stream and is graph-capturable (cuda-mla-gemm runs stage B's V
// GEMM on a stream it forks from options.stream and joins back into it before run() returns: one
// such stream per caller stream (per thread for cudaStreamPerThread), made on first use, at the
// caller's priority; a graph captured from options.stream holds the two GEMMs as parallel
// branches). Arithmetic: float32 accumulation, norm and RoPE in float32, each output rounded once
// to the problem's dtype; c enters stage B rounded to the dtype, as the unfused model code does.
//
// check() asks for every dimension of the layer (D, R, dr even, H, dn, dv positive; Rq >= 0) in
// every stage, also those the stage does not use, so one MlaProblem describes the layer. A call
// with no tokens (batch or seq 0) is a no-op that check() still validates for everything that does
// not depend on the tokens (weights, strides' signs, the cache), as the projection treats a zero
// dimension; the tokens' tensors then have no elements and may be null. A pointer the stage
// does not use (q_a_* with Rq = 0, stage A's inputs in kSecond, K/V/kv_b in kFirst, latent/k_pe
// outside kSecond, both RoPE forms at once) is refused rather than ignored.
//
// Device-side indices never read or write out of bounds: a position outside [0, max_position)
// makes that token's k_pe NaN (in K and in the cache row) and reads nothing; a slot < 0 is padding
// (stage A writes no cache row; stage B reading from the cache reads nothing for that token and
// writes its K and V rows as zeros, since a GEMM writes every row it is given); a slot >= num_slots
// is treated as padding too (never read or written).
#pragma once

#include <cstdint>
#include <string>

#include "latentkv/latentkv.h"

namespace latentkv {

// The three layouts of RoPE's 64 columns; each engine's query uses the same one as its keys.
enum class RopeStyle {
  kInterleave,  // transformers' DeepSeek default: pairs (x0, x1), (x2, x3), ... in; rotated evens,
                // then rotated odds out (apply_rotary_pos_emb_interleave)
  kGptJ,        // pairs in and out (vLLM is_neox_style=False)
  kNeox,        // rotate-half in and out: pairs (x_i, x_{i + dr/2})
};
const char* to_string(RopeStyle style);

enum class MlaStage {
  kBoth,    // hidden -> cache row, K, V (prefill)
  kFirst,   // hidden -> cache row (and q_a): what an engine that absorbs W_UK/W_UV runs per decode
  kSecond,  // c and k_pe (given, or gathered from the cache by slot) -> K, V
};
const char* to_string(MlaStage stage);

struct MlaProblem {
  int64_t batch = 0;      // B
  int64_t seq = 0;        // S; T = B * S tokens
  int64_t model_dim = 0;  // D (hidden_size)
  int64_t q_rank = 0;     // Rq (q_lora_rank); 0: no q_a part (DeepSeek-V2-Lite)
  int64_t kv_rank = 0;    // R (kv_lora_rank), 512 on every DeepSeek model
  int64_t rope_dim = 0;   // dr (qk_rope_head_dim), even
  int64_t heads = 0;      // H: the heads this call computes (a tensor-parallel rank's share)
  int64_t nope_dim = 0;   // dn (qk_nope_head_dim); K is dn + dr wide
  int64_t v_dim = 0;      // dv (v_head_dim)
  DType dtype = DType::kBFloat16;        // hidden, weights, outputs, cache
  DType rope_dtype = DType::kFloat32;    // cos/sin and cos_sin_cache: float32 or the dtype
  RopeStyle rope_style = RopeStyle::kInterleave;
  MlaStage stage = MlaStage::kBoth;
  float eps = 1e-6f;  // both RMSNorms

  int64_t tokens() const { return batch * seq; }
  int64_t cache_width() const { return kv_rank + rope_dim; }  // 576 on DeepSeek
  int64_t k_width() const { return nope_dim + rope_dim; }     // 192
  int64_t kv_b_rows() const { return heads * (nope_dim + v_dim); }
  double flops() const;      // the GEMMs of the stage(s) run
  double min_bytes() const;  // each input read once, each output written once
  std::string to_string() const;
};

// Pointers and element strides, innermost dimension contiguous (as in Args). Weights are in the
// checkpoint's nn.Linear layout [out, in]. Optional pointers are null when unused.
struct MlaArgs {
  // --- stage A inputs (kBoth, kFirst)
  const void* hidden = nullptr;  // [B, S, D]
  int64_t hidden_stride_batch = 0, hidden_stride_seq = 0;
  const void* kv_a_weight = nullptr;  // [R + dr, D]: kv_a_proj_with_mqa.weight
  int64_t kv_a_weight_stride_row = 0;
  const void* kv_a_norm_weight = nullptr;  // [R]: kv_a_layernorm.weight (contiguous)
  const void* q_a_weight = nullptr;        // [Rq, D]: q_a_proj.weight, Rq > 0 only
  int64_t q_a_weight_stride_row = 0;
  const void* q_a_norm_weight = nullptr;  // [Rq]: q_a_layernorm.weight, Rq > 0 only

  // RoPE, one of two forms (stage A):
  //  vLLM's: positions [B, S] (int64) into cos_sin_cache [max_position, dr], whose row holds the
  //          dr/2 cosines then the dr/2 sines; pair i rotates by (cos[i], sin[i]).
  //  transformers': cos and sin [B, S, dr] as its rotary embedding returns them (cat(freqs,
  //          freqs)): for kInterleave and kNeox output column j uses cos[j], sin[j]; for kGptJ
  //          pair i uses cos[i], sin[i] (the first half).
  // positions and cos/sin may give every batch row the same rows: stride_batch 0 (transformers'
  // rotary embedding returns [1, S, dr] for position ids shared by the batch).
  const int64_t* positions = nullptr;  // [B, S]
  int64_t positions_stride_batch = 0, positions_stride_seq = 0;
  const void* cos_sin_cache = nullptr;  // [max_position, dr], rope_dtype
  int64_t cos_sin_cache_stride_row = 0;
  int64_t max_position = 0;
  const void* cos = nullptr;  // [B, S, dr], rope_dtype
  const void* sin = nullptr;  // [B, S, dr], same strides as cos
  int64_t cos_stride_batch = 0, cos_stride_seq = 0;

  // --- stage A outputs
  void* q_a = nullptr;  // [B, S, Rq], normalized; Rq > 0 only, optional
  int64_t q_a_stride_batch = 0, q_a_stride_seq = 0;
  // The latent cache: [num_slots, R + dr] rows [c | k_pe]. Dense when slot_mapping is null (token
  // t = b * S + s writes row t; num_slots >= T), paged through slot_mapping [B, S] (int64) else.
  // Written by kBoth and kFirst when given (kFirst needs it or q_a); read by kSecond when latent
  // is null.
  void* kv_cache = nullptr;
  int64_t kv_cache_stride_slot = 0;
  int64_t num_slots = 0;
  const int64_t* slot_mapping = nullptr;  // [B, S]
  int64_t slot_mapping_stride_batch = 0, slot_mapping_stride_seq = 0;

  // --- stage B inputs (kSecond): c [B, S, R] and k_pe [B, S, dr] (already rotated), or, with
  // latent null, both read from kv_cache through slot_mapping (or dense rows).
  const void* latent = nullptr;
  int64_t latent_stride_batch = 0, latent_stride_seq = 0;
  const void* k_pe = nullptr;
  int64_t k_pe_stride_batch = 0, k_pe_stride_seq = 0;
  const void* kv_b_weight = nullptr;  // [H * (dn + dv), R]: kv_b_proj.weight, per head [W_UK; W_UV]
  int64_t kv_b_weight_stride_row = 0;

  // --- stage B outputs (kBoth, kSecond)
  void* k = nullptr;  // [B, S, H, dn + dr]
  int64_t k_stride_batch = 0, k_stride_seq = 0, k_stride_head = 0;
  void* v = nullptr;  // [B, S, H, dv]
  int64_t v_stride_batch = 0, v_stride_seq = 0, v_stride_head = 0;

  // Device scratch as in Args (workspace_size() says how much; contents not kept between calls).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// MlaArgs with every pointer null and every stride that of a densely packed tensor (kv_cache:
// R + dr per slot); the caller sets the pointers it uses, num_slots and max_position.
MlaArgs contiguous_mla_args(const MlaProblem& problem);

// The projection's entry points (latentkv.h) for the MLA path: same contract, same Options
// (options.strategy forces kCpuMla or an MLA CUDA strategy).
int64_t workspace_size(const MlaProblem& problem, const Options& options = {});
Status check(const MlaProblem& problem, const MlaArgs& args, const Options& options = {});
Status select_strategy(const MlaProblem& problem, const MlaArgs& args, const Options& options,
                       Strategy* strategy);
Status run(const MlaProblem& problem, const MlaArgs& args, const Options& options = {});

}  // namespace latentkv
