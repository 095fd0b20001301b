// The MLA path's entry points (latentkv/mla.h): names, the problem's counts, and the validation
// of MlaProblem + MlaArgs for each stage; then dispatch through the MLA strategy table
// (mla/strategies.cpp) with select_row / table_workspace, as every operation does. All of the
// path's checks live here, so a backend sees only well-formed calls and a refused call writes
// nothing: every tensor's layout (strides, int64 overflow), the pointers the stage needs, the ones
// it must not be given, and aliasing between every output and everything else.
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "mla/mla_backends.h"
#include "strategy_table.h"
#include "validation.h"
#include "latentkv/latentkv.h"

namespace latentkv {

const char* to_string(RopeStyle style) {
  switch (style) {
    case RopeStyle::kInterleave: return "interleave";
    case RopeStyle::kGptJ: return "gptj";
    case RopeStyle::kNeox: return "neox";
  }
  return "unknown rope style";
}

const char* to_string(MlaStage stage) {
  switch (stage) {
    case MlaStage::kBoth: return "both";
    case MlaStage::kFirst: return "first";
    case MlaStage::kSecond: return "second";
  }
  return "unknown stage";
}

namespace {
bool runs_first(const MlaProblem& p) { return p.stage != MlaStage::kSecond; }
bool runs_second(const MlaProblem& p) { return p.stage != MlaStage::kFirst; }
}  // namespace

double MlaProblem::flops() const {
  const double t = static_cast<double>(tokens());
  double f = 0.0;
  if (runs_first(*this)) f += 2.0 * t * model_dim * static_cast<double>(q_rank + cache_width());
  if (runs_second(*this)) f += 2.0 * t * kv_rank * static_cast<double>(kv_b_rows());
  return f;
}

// Stage A reads hidden and the two weights and writes the cache row and q_a; stage B reads c and
// k_pe (unless stage A made them) and kv_b, and writes K and V. cos/sin, positions and slots are
// left out (a few bytes per token).
double MlaProblem::min_bytes() const {
  const double t = static_cast<double>(tokens());
  const double width = static_cast<double>(cache_width());
  double elems = 0.0;
  if (runs_first(*this)) {
    elems += t * model_dim + static_cast<double>(q_rank + cache_width()) * model_dim;
    elems += q_rank + kv_rank;  // the norms' weights
    elems += t * (width + q_rank);
  }
  if (runs_second(*this)) {
    if (stage == MlaStage::kSecond) elems += t * width;
    elems += static_cast<double>(kv_b_rows()) * kv_rank;
    elems += t * static_cast<double>(heads) * (k_width() + v_dim);
  }
  return elems * element_size(dtype);
}

std::string MlaProblem::to_string() const {
  std::ostringstream s;
  s << "MLA B=" << batch << " S=" << seq << " D=" << model_dim << " Rq=" << q_rank
    << " R=" << kv_rank << " dr=" << rope_dim << " H=" << heads << " dn=" << nope_dim
    << " dv=" << v_dim << " " << latentkv::to_string(dtype) << " rope="
    << latentkv::to_string(rope_style) << "/" << latentkv::to_string(rope_dtype)
    << " stage=" << latentkv::to_string(stage);
  return s.str();
}

MlaArgs contiguous_mla_args(const MlaProblem& p) {
  using detail::wrapping_product;  // the problem is not checked yet
  const auto wrapping_sum = [](int64_t x, int64_t y) {
    return static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
  };
  const int64_t k_width = wrapping_sum(p.nope_dim, p.rope_dim);
  MlaArgs a;
  a.hidden_stride_seq = p.model_dim;
  a.hidden_stride_batch = wrapping_product({p.seq, p.model_dim});
  a.kv_a_weight_stride_row = p.model_dim;
  a.q_a_weight_stride_row = p.model_dim;
  a.positions_stride_seq = 1;
  a.positions_stride_batch = p.seq;
  a.cos_sin_cache_stride_row = p.rope_dim;
  a.cos_stride_seq = p.rope_dim;
  a.cos_stride_batch = wrapping_product({p.seq, p.rope_dim});
  a.q_a_stride_seq = p.q_rank;
  a.q_a_stride_batch = wrapping_product({p.seq, p.q_rank});
  a.kv_cache_stride_slot = wrapping_sum(p.kv_rank, p.rope_dim);
  a.slot_mapping_stride_seq = 1;
  a.slot_mapping_stride_batch = p.seq;
  a.latent_stride_seq = p.kv_rank;
  a.latent_stride_batch = wrapping_product({p.seq, p.kv_rank});
  a.k_pe_stride_seq = p.rope_dim;
  a.k_pe_stride_batch = wrapping_product({p.seq, p.rope_dim});
  a.kv_b_weight_stride_row = p.kv_rank;
  a.k_stride_head = k_width;
  a.k_stride_seq = wrapping_product({p.heads, k_width});
  a.k_stride_batch = wrapping_product({p.seq, p.heads, k_width});
  a.v_stride_head = p.v_dim;
  a.v_stride_seq = wrapping_product({p.heads, p.v_dim});
  a.v_stride_batch = wrapping_product({p.seq, p.heads, p.v_dim});
  return a;
}

namespace {

using detail::byte_range;
using detail::check_layout;
using detail::check_packed_bytes;
using detail::check_positive;
using detail::Dim;
using detail::invalid;
using detail::overlaps;
using detail::Range;
using detail::Span;

bool valid_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}

Status check_mul(const char* what, int64_t a, int64_t b, int64_t* out) {
  if (__builtin_mul_overflow(a, b, out)) {
    return invalid(std::string(what) + " = " + std::to_string(a) + " * " + std::to_string(b) +
                   " overflows int64");
  }
  return Status::Ok();
}

Status check_problem(const MlaProblem& p) {
  if (p.batch < 0) {
    return invalid("problem.batch = " + std::to_string(p.batch) + " must not be negative");
  }
  if (p.seq < 0) return invalid("problem.seq = " + std::to_string(p.seq) + " must not be negative");
  LATENTKV_RETURN_IF_ERROR(check_positive("model_dim", p.model_dim));
  if (p.q_rank < 0) {
    return invalid("problem.q_rank = " + std::to_string(p.q_rank) + " must not be negative");
  }
  LATENTKV_RETURN_IF_ERROR(check_positive("kv_rank", p.kv_rank));
  LATENTKV_RETURN_IF_ERROR(check_positive("rope_dim", p.rope_dim));
  if (p.rope_dim % 2 != 0) {
    return invalid("problem.rope_dim = " + std::to_string(p.rope_dim) +
                   " must be even (RoPE rotates pairs of columns)");
  }
  LATENTKV_RETURN_IF_ERROR(check_positive("heads", p.heads));
  LATENTKV_RETURN_IF_ERROR(check_positive("nope_dim", p.nope_dim));
  LATENTKV_RETURN_IF_ERROR(check_positive("v_dim", p.v_dim));
  int64_t n = 0;
  LATENTKV_RETURN_IF_ERROR(check_mul("problem.batch * problem.seq", p.batch, p.seq, &n));
  int64_t stage_a_width = 0;  // Rq + R + dr: the first GEMM's output row
  if (__builtin_add_overflow(p.kv_rank, p.rope_dim, &stage_a_width) ||
      __builtin_add_overflow(stage_a_width, p.q_rank, &stage_a_width)) {
    return invalid("problem.q_rank + kv_rank + rope_dim = " + std::to_string(p.q_rank) + " + " +
                   std::to_string(p.kv_rank) + " + " + std::to_string(p.rope_dim) +
                   " overflows int64");
  }
  int64_t head_width = 0;
  if (__builtin_add_overflow(p.nope_dim, p.v_dim, &head_width) ||
      __builtin_add_overflow(p.nope_dim, p.rope_dim, &n)) {
    return invalid("problem.nope_dim = " + std::to_string(p.nope_dim) +
                   " plus v_dim or rope_dim overflows int64");
  }
  LATENTKV_RETURN_IF_ERROR(
      check_mul("problem.heads * (nope_dim + v_dim)", p.heads, head_width, &n));
  LATENTKV_RETURN_IF_ERROR(
      check_mul("problem.heads * (nope_dim + rope_dim)", p.heads, p.k_width(), &n));
  if (!valid_dtype(p.dtype)) {
    return invalid("problem.dtype = " + std::to_string(static_cast<int>(p.dtype)) +
                   " is not a DType");
  }
  if (p.rope_dtype != DType::kFloat32 && p.rope_dtype != p.dtype) {
    return invalid(std::string("problem.rope_dtype = ") +
                   (valid_dtype(p.rope_dtype) ? to_string(p.rope_dtype)
                                              : std::to_string(static_cast<int>(p.rope_dtype))) +
                   " must be float32 or problem.dtype = " + to_string(p.dtype));
  }
  if (p.rope_style != RopeStyle::kInterleave && p.rope_style != RopeStyle::kGptJ &&
      p.rope_style != RopeStyle::kNeox) {
    return invalid("problem.rope_style = " + std::to_string(static_cast<int>(p.rope_style)) +
                   " is not a RopeStyle");
  }
  if (p.stage != MlaStage::kBoth && p.stage != MlaStage::kFirst &&
      p.stage != MlaStage::kSecond) {
    return invalid("problem.stage = " + std::to_string(static_cast<int>(p.stage)) +
                   " is not an MlaStage");
  }
  if (!(p.eps > 0.0f) || !std::isfinite(p.eps)) {
    std::ostringstream s;
    s << "problem.eps = " << p.eps << " must be positive and finite";
    return invalid(s.str());
  }
  // The stage's packed tensors within 2^60 bytes (validation.h: kMaxPackedBytes), which bounds
  // the regions of cuda-mla-gemm's workspace (stage A's float32 [T, Rq + R + dr] GEMM output,
  // the latent) and the sizes it adds up.
  const int64_t eb = element_size(p.dtype);
  LATENTKV_RETURN_IF_ERROR(check_packed_bytes("latent", "problem.batch * seq * kv_rank",
                                              {p.batch, p.seq, p.kv_rank}, eb));
  if (runs_first(p)) {
    LATENTKV_RETURN_IF_ERROR(check_packed_bytes("hidden", "problem.batch * seq * model_dim",
                                                {p.batch, p.seq, p.model_dim}, eb));
    LATENTKV_RETURN_IF_ERROR(
        check_packed_bytes("q_a_weight and kv_a_weight",
                           "(problem.q_rank + kv_rank + rope_dim) * model_dim",
                           {stage_a_width, p.model_dim}, eb));
    LATENTKV_RETURN_IF_ERROR(
        check_packed_bytes("stage A's float32 GEMM output",
                           "problem.batch * seq * (q_rank + kv_rank + rope_dim)",
                           {p.batch, p.seq, stage_a_width}, 4));
  }
  if (runs_second(p)) {
    LATENTKV_RETURN_IF_ERROR(
        check_packed_bytes("kv_b_weight", "problem.heads * (nope_dim + v_dim) * kv_rank",
                           {p.heads, head_width, p.kv_rank}, eb));
    LATENTKV_RETURN_IF_ERROR(
        check_packed_bytes("k", "problem.batch * seq * heads * (nope_dim + rope_dim)",
                           {p.batch, p.seq, p.heads, p.k_width()}, eb));
    LATENTKV_RETURN_IF_ERROR(check_packed_bytes("v", "problem.batch * seq * heads * v_dim",
                                                {p.batch, p.seq, p.heads, p.v_dim}, eb));
  }
  return Status::Ok();
}

// The byte ranges of one call's tensors, sorted into what it reads and what it writes.
struct Ranges {
  std::vector<Range> inputs, outputs;
};

struct Pointer {
  const void* ptr;
  const char* name;
};

Status require(const Pointer& q, const char* why) {
  if (q.ptr == nullptr) return invalid(std::string("args.") + q.name + " is null; " + why);
  return Status::Ok();
}

// A tensor of the tokens ([B, S, ...]): with no tokens it has no elements and may be null.
Status require_tokens(const MlaProblem& p, const Pointer& q, const char* why) {
  return p.tokens() == 0 ? Status::Ok() : require(q, why);
}

Status forbid(const Pointer& q, const char* why) {
  if (q.ptr != nullptr) {
    std::ostringstream s;
    s << "args." << q.name << " = " << q.ptr << " must be null: " << why;
    return invalid(s.str());
  }
  return Status::Ok();
}

// Checks one tensor's layout and files its byte range.
Status add_tensor(const char* name, const void* base, const Dim* dims, int rank, int64_t eb,
                  std::vector<Range>* into) {
  Span span;
  LATENTKV_RETURN_IF_ERROR(check_layout(name, dims, rank, eb, &span));
  into->push_back(byte_range(name, base, span, eb));
  return Status::Ok();
}

// The token tensors [B, S, width] (width contiguous); a shared_batch input may give every batch
// row the same rows (stride_batch 0: transformers' cos/sin for position ids shared by the batch).
Status add_token_tensor(const char* name, const void* base, int64_t stride_batch,
                        const char* stride_batch_name, int64_t stride_seq,
                        const char* stride_seq_name, const MlaProblem& p, int64_t width,
                        int64_t eb, std::vector<Range>* into, bool shared_batch = false) {
  const Dim dims[] = {{p.batch, stride_batch, stride_batch_name, shared_batch},
                      {p.seq, stride_seq, stride_seq_name},
                      {width, 1, nullptr}};
  return add_tensor(name, base, dims, 3, eb, into);
}

Status add_matrix(const char* name, const void* base, int64_t rows, int64_t stride_row,
                  const char* stride_name, int64_t cols, int64_t eb, std::vector<Range>* into) {
  const Dim dims[] = {{rows, stride_row, stride_name}, {cols, 1, nullptr}};
  return add_tensor(name, base, dims, 2, eb, into);
}

Status check_rope(const MlaProblem& p, const MlaArgs& a, Ranges* r) {
  const bool vllm = a.positions != nullptr || a.cos_sin_cache != nullptr;
  const bool hf = a.cos != nullptr || a.sin != nullptr;
  if (vllm && hf) {
    return invalid(
        "args.positions/cos_sin_cache and args.cos/sin are both set; give one RoPE form");
  }
  if (!vllm && !hf) {
    if (p.tokens() == 0) return Status::Ok();  // cos and sin, empty
    return invalid("args.positions and args.cos are null; stage A needs RoPE from positions + "
                   "cos_sin_cache or from cos + sin");
  }
  const int64_t rb = element_size(p.rope_dtype);
  if (vllm) {
    LATENTKV_RETURN_IF_ERROR(
        require_tokens(p, {a.positions, "positions"}, "args.cos_sin_cache needs it"));
    LATENTKV_RETURN_IF_ERROR(
        require({a.cos_sin_cache, "cos_sin_cache"}, "args.positions index into it"));
    if (a.max_position <= 0) {
      return invalid("args.max_position = " + std::to_string(a.max_position) +
                     " must be positive with args.cos_sin_cache");
    }
    LATENTKV_RETURN_IF_ERROR(add_token_tensor(
        "positions", a.positions, a.positions_stride_batch, "args.positions_stride_batch",
        a.positions_stride_seq, "args.positions_stride_seq", p, 1, sizeof(int64_t), &r->inputs,
        true));
    return add_matrix("cos_sin_cache", a.cos_sin_cache, a.max_position,
                      a.cos_sin_cache_stride_row, "args.cos_sin_cache_stride_row", p.rope_dim, rb,
                      &r->inputs);
  }
  LATENTKV_RETURN_IF_ERROR(require_tokens(p, {a.cos, "cos"}, "args.sin needs it"));
  LATENTKV_RETURN_IF_ERROR(require_tokens(p, {a.sin, "sin"}, "args.cos needs it"));
  LATENTKV_RETURN_IF_ERROR(add_token_tensor("cos", a.cos, a.cos_stride_batch,
                                            "args.cos_stride_batch", a.cos_stride_seq,
                                            "args.cos_stride_seq", p, p.rope_dim, rb, &r->inputs,
                                            true));
  return add_token_tensor("sin", a.sin, a.cos_stride_batch, "args.cos_stride_batch",
                          a.cos_stride_seq, "args.cos_stride_seq", p, p.rope_dim, rb, &r->inputs,
                          true);
}

// The latent cache and its slots; `written` says whether the stage writes it (stage A) or reads
// it (stage B alone).
Status check_cache(const MlaProblem& p, const MlaArgs& a, bool written, Ranges* r) {
  if (a.num_slots <= 0) {
    return invalid("args.num_slots = " + std::to_string(a.num_slots) +
                   " must be positive with args.kv_cache");
  }
  if (a.slot_mapping == nullptr) {
    if (a.num_slots < p.tokens()) {
      return invalid("args.num_slots = " + std::to_string(a.num_slots) +
                     " is less than the " + std::to_string(p.tokens()) +
                     " tokens a dense cache (args.slot_mapping null) holds");
    }
  } else {
    LATENTKV_RETURN_IF_ERROR(add_token_tensor(
        "slot_mapping", a.slot_mapping, a.slot_mapping_stride_batch,
        "args.slot_mapping_stride_batch", a.slot_mapping_stride_seq,
        "args.slot_mapping_stride_seq", p, 1, sizeof(int64_t), &r->inputs));
  }
  return add_matrix("kv_cache", a.kv_cache, a.num_slots, a.kv_cache_stride_slot,
                    "args.kv_cache_stride_slot", p.cache_width(), element_size(p.dtype),
                    written ? &r->outputs : &r->inputs);
}

Status check_first_stage(const MlaProblem& p, const MlaArgs& a, Ranges* r) {
  const int64_t eb = element_size(p.dtype);
  const char* needs = "stage A reads it";
  LATENTKV_RETURN_IF_ERROR(require_tokens(p, {a.hidden, "hidden"}, needs));
  LATENTKV_RETURN_IF_ERROR(require({a.kv_a_weight, "kv_a_weight"}, needs));
  LATENTKV_RETURN_IF_ERROR(require({a.kv_a_norm_weight, "kv_a_norm_weight"}, needs));
  LATENTKV_RETURN_IF_ERROR(add_token_tensor(
      "hidden", a.hidden, a.hidden_stride_batch, "args.hidden_stride_batch", a.hidden_stride_seq,
      "args.hidden_stride_seq", p, p.model_dim, eb, &r->inputs));
  LATENTKV_RETURN_IF_ERROR(add_matrix("kv_a_weight", a.kv_a_weight, p.cache_width(),
                                      a.kv_a_weight_stride_row, "args.kv_a_weight_stride_row",
                                      p.model_dim, eb, &r->inputs));
  r->inputs.push_back(
      byte_range("kv_a_norm_weight", a.kv_a_norm_weight, Span{p.kv_rank - 1}, eb));
  if (p.q_rank > 0) {
    const char* q_needs = "problem.q_rank > 0 computes q_a";
    LATENTKV_RETURN_IF_ERROR(require({a.q_a_weight, "q_a_weight"}, q_needs));
    LATENTKV_RETURN_IF_ERROR(require({a.q_a_norm_weight, "q_a_norm_weight"}, q_needs));
    LATENTKV_RETURN_IF_ERROR(add_matrix("q_a_weight", a.q_a_weight, p.q_rank,
                                        a.q_a_weight_stride_row, "args.q_a_weight_stride_row",
                                        p.model_dim, eb, &r->inputs));
    r->inputs.push_back(byte_range("q_a_norm_weight", a.q_a_norm_weight, Span{p.q_rank - 1}, eb));
    if (a.q_a != nullptr) {
      LATENTKV_RETURN_IF_ERROR(add_token_tensor("q_a", a.q_a, a.q_a_stride_batch,
                                                "args.q_a_stride_batch", a.q_a_stride_seq,
                                                "args.q_a_stride_seq", p, p.q_rank, eb,
                                                &r->outputs));
    }
  } else {
    const char* why = "problem.q_rank = 0 has no q_a part";
    LATENTKV_RETURN_IF_ERROR(forbid({a.q_a_weight, "q_a_weight"}, why));
    LATENTKV_RETURN_IF_ERROR(forbid({a.q_a_norm_weight, "q_a_norm_weight"}, why));
    LATENTKV_RETURN_IF_ERROR(forbid({a.q_a, "q_a"}, why));
  }
  LATENTKV_RETURN_IF_ERROR(check_rope(p, a, r));
  if (a.kv_cache != nullptr) {
    LATENTKV_RETURN_IF_ERROR(check_cache(p, a, /*written=*/true, r));
  } else if (a.slot_mapping != nullptr) {
    return invalid("args.slot_mapping is set but args.kv_cache is null");
  }
  if (p.stage == MlaStage::kFirst && a.kv_cache == nullptr && a.q_a == nullptr &&
      p.tokens() > 0) {
    return invalid("args.kv_cache and args.q_a are null: problem.stage = first writes nothing");
  }
  const char* made_here = "stage A makes c and k_pe itself";
  LATENTKV_RETURN_IF_ERROR(forbid({a.latent, "latent"}, made_here));
  return forbid({a.k_pe, "k_pe"}, made_here);
}

Status check_second_stage(const MlaProblem& p, const MlaArgs& a, Ranges* r) {
  const int64_t eb = element_size(p.dtype);
  const char* needs = "stage B needs it";
  LATENTKV_RETURN_IF_ERROR(require({a.kv_b_weight, "kv_b_weight"}, needs));
  LATENTKV_RETURN_IF_ERROR(require_tokens(p, {a.k, "k"}, needs));
  LATENTKV_RETURN_IF_ERROR(require_tokens(p, {a.v, "v"}, needs));
  LATENTKV_RETURN_IF_ERROR(add_matrix("kv_b_weight", a.kv_b_weight, p.kv_b_rows(),
                                      a.kv_b_weight_stride_row, "args.kv_b_weight_stride_row",
                                      p.kv_rank, eb, &r->inputs));
  const Dim k_dims[] = {{p.batch, a.k_stride_batch, "args.k_stride_batch"},
                        {p.seq, a.k_stride_seq, "args.k_stride_seq"},
                        {p.heads, a.k_stride_head, "args.k_stride_head"},
                        {p.k_width(), 1, nullptr}};
  LATENTKV_RETURN_IF_ERROR(add_tensor("k", a.k, k_dims, 4, eb, &r->outputs));
  const Dim v_dims[] = {{p.batch, a.v_stride_batch, "args.v_stride_batch"},
                        {p.seq, a.v_stride_seq, "args.v_stride_seq"},
                        {p.heads, a.v_stride_head, "args.v_stride_head"},
                        {p.v_dim, 1, nullptr}};
  LATENTKV_RETURN_IF_ERROR(add_tensor("v", a.v, v_dims, 4, eb, &r->outputs));
  if (p.stage != MlaStage::kSecond) return Status::Ok();

  const char* stage_b = "problem.stage = second reads c and k_pe, it does not compute them";
  for (const Pointer& q :
       {Pointer{a.hidden, "hidden"}, Pointer{a.kv_a_weight, "kv_a_weight"},
        Pointer{a.kv_a_norm_weight, "kv_a_norm_weight"}, Pointer{a.q_a_weight, "q_a_weight"},
        Pointer{a.q_a_norm_weight, "q_a_norm_weight"}, Pointer{a.q_a, "q_a"},
        Pointer{a.positions, "positions"}, Pointer{a.cos_sin_cache, "cos_sin_cache"},
        Pointer{a.cos, "cos"}, Pointer{a.sin, "sin"}}) {
    LATENTKV_RETURN_IF_ERROR(forbid(q, stage_b));
  }
  if (a.latent != nullptr || a.k_pe != nullptr) {
    LATENTKV_RETURN_IF_ERROR(require_tokens(p, {a.latent, "latent"}, "args.k_pe comes with it"));
    LATENTKV_RETURN_IF_ERROR(require_tokens(p, {a.k_pe, "k_pe"}, "args.latent comes with it"));
    if (a.kv_cache != nullptr || a.slot_mapping != nullptr) {
      return invalid("args.latent and args.kv_cache are both set: problem.stage = second reads "
                     "c and k_pe from one of them");
    }
    LATENTKV_RETURN_IF_ERROR(add_token_tensor(
        "latent", a.latent, a.latent_stride_batch, "args.latent_stride_batch",
        a.latent_stride_seq, "args.latent_stride_seq", p, p.kv_rank, eb, &r->inputs));
    return add_token_tensor("k_pe", a.k_pe, a.k_pe_stride_batch, "args.k_pe_stride_batch",
                            a.k_pe_stride_seq, "args.k_pe_stride_seq", p, p.rope_dim, eb,
                            &r->inputs);
  }
  if (a.kv_cache == nullptr && p.tokens() == 0) return Status::Ok();  // latent and k_pe, empty
  LATENTKV_RETURN_IF_ERROR(require(
      {a.kv_cache, "kv_cache"},
      "problem.stage = second reads c and k_pe from args.latent + args.k_pe or from the cache"));
  return check_cache(p, a, /*written=*/false, r);
}

Status check_args(const MlaProblem& p, const MlaArgs& a) {
  Ranges r;
  if (runs_first(p)) {
    LATENTKV_RETURN_IF_ERROR(check_first_stage(p, a, &r));
  }
  if (runs_second(p)) {
    LATENTKV_RETURN_IF_ERROR(check_second_stage(p, a, &r));
  } else {
    const char* why = "problem.stage = first computes no K or V";
    for (const Pointer& q : {Pointer{a.kv_b_weight, "kv_b_weight"}, Pointer{a.k, "k"},
                             Pointer{a.v, "v"}}) {
      LATENTKV_RETURN_IF_ERROR(forbid(q, why));
    }
  }
  if (a.workspace != nullptr) {
    if (a.workspace_bytes <= 0) {
      return invalid("args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                     " must be positive when args.workspace is set");
    }
    const uintptr_t w = reinterpret_cast<uintptr_t>(a.workspace);
    r.outputs.push_back({"workspace", w, w + static_cast<uintptr_t>(a.workspace_bytes)});
  }
  for (size_t o = 0; o < r.outputs.size(); ++o) {
    for (size_t other = o + 1; other < r.outputs.size(); ++other) {
      if (overlaps(r.outputs[o], r.outputs[other])) {
        return invalid(std::string("args.") + r.outputs[o].name + " overlaps args." +
                       r.outputs[other].name + " in memory; outputs must not alias each other");
      }
    }
    for (const Range& in : r.inputs) {
      if (overlaps(r.outputs[o], in)) {
        return invalid(std::string("args.") + r.outputs[o].name + " overlaps args." + in.name +
                       " in memory; outputs must not alias inputs");
      }
    }
  }
  return Status::Ok();
}

Status resolve(const Options& o, Backend* backend) {
  if (o.backend != Backend::kAuto && o.backend != Backend::kCpu && o.backend != Backend::kCuda) {
    return invalid("options.backend = " + std::to_string(static_cast<int>(o.backend)) +
                   " is not a Backend");
  }
  *backend = resolve_backend(o.backend);
  if (*backend == Backend::kCuda && !backend_available(Backend::kCuda)) {
    return {StatusCode::kBackendUnavailable,
            "options.backend = cuda, but no CUDA device is present (or CUDA support is not "
            "compiled in)"};
  }
  return Status::Ok();
}

using Row = detail::StrategyRow<MlaProblem, MlaArgs>;

// Validation, then the row that runs the call. With no tokens every check that does not depend
// on T still applies (the tokens' tensors have no elements and may be null); no row is asked
// whether it takes the call, which is a no-op on the first row that computes the problem's dtype
// on the backend (the projection's rule for a zero dimension).
Status select_row(const MlaProblem& p, const MlaArgs& a, const Options& o, const Row** row) {
  LATENTKV_RETURN_IF_ERROR(check_problem(p));
  LATENTKV_RETURN_IF_ERROR(check_args(p, a));
  Backend backend = Backend::kAuto;
  LATENTKV_RETURN_IF_ERROR(resolve(o, &backend));
  const auto& table = detail::mla_strategy_table();
  if (p.tokens() > 0) return detail::select_row(table, p, a, backend, o.strategy, row);
  LATENTKV_RETURN_IF_ERROR(detail::match_rows(table, p, backend, o.strategy));
  for (const Row& r : table) {
    if (r.backend == backend && (r.dtypes & detail::dtype_bit(p.dtype)) &&
        (o.strategy == Strategy::kAuto || o.strategy == r.id)) {
      *row = &r;
      break;
    }
  }
  return Status::Ok();
}

}  // namespace

int64_t workspace_size(const MlaProblem& problem, const Options& options) {
  Backend backend = Backend::kAuto;
  if (!check_problem(problem).ok() || !resolve(options, &backend).ok()) return 0;
  return detail::table_workspace(detail::mla_strategy_table(), problem, backend, options.strategy,
                                 /*with_latent=*/false);
}

Status check(const MlaProblem& problem, const MlaArgs& args, const Options& options) {
  return select_strategy(problem, args, options, nullptr);
}

Status select_strategy(const MlaProblem& problem, const MlaArgs& args, const Options& options,
                       Strategy* strategy) {
  const Row* row = nullptr;
  LATENTKV_RETURN_IF_ERROR(select_row(problem, args, options, &row));
  if (strategy != nullptr) *strategy = row->id;
  return Status::Ok();
}

Status run(const MlaProblem& problem, const MlaArgs& args, const Options& options) {
  const Row* row = nullptr;
  LATENTKV_RETURN_IF_ERROR(select_row(problem, args, options, &row));
  if (problem.tokens() == 0) return Status::Ok();
  return row->launch(problem, args, options.stream);
}

}  // namespace latentkv
