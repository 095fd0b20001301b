// The MLA path on cuBLASLt (Strategy::kCudaMlaGemm), bf16, fp16 and float32 with float32
// accumulation (float32: FFMA, no TF32).
//
//   stage A  ckv [T, Rq + R + dr] (float32, workspace) = hidden @ [q_a_weight ; kv_a_weight]^T
//            one GEMM where the q_a rows are directly followed by the kv_a rows with the same row
//            stride, else one per weight into the same rows; at few to mid tokens (heuristics.h)
//            split over slices of D as the GEMM's batches, without cuBLAS's split-K, into one
//            plane of partial products per slice; then one epilogue kernel (mla_epilogue.cu): the
//            slices summed in order, both RMSNorms, RoPE, q_a, the cache row, c for stage B, K's
//            last dr columns.
//   stage B  K[:, h, :dn] = c @ kv_b[h (dn + dv) .. + dn]^T and V[:, h, :] = c @ kv_b[.. + dn ..
//            + dv]^T, each one GEMM batched over the heads (weight batch stride (dn + dv) rows,
//            output batch stride k_stride_head / v_stride_head, ldc the token stride), written in
//            place: no concat, no K- or V-sized temporary. c comes from a dense cache's rows, the
//            workspace (written by the epilogue, or gathered from a paged cache) or args.latent.
//            Where the tokens' rows do not fold into one matrix (batch stride != S * seq stride),
//            the smaller of B and H is looped over and the other batched. The V GEMM runs on a
//            branch forked from the caller's stream (stream_branches.h), beside the K GEMM on the
//            caller's stream: neither fills the GPU at few tokens nor hides its tail at many.
//
// The workspace, from its first 256-byte boundary: ckv (a plane per slice of D), then (at 256
// bytes) c [T, R] in the dtype where stage B needs it there, then cuBLAS's scratch (lt_matmul.h),
// which is optional; only the K GEMM gets it (two GEMMs at once must not share it), the V GEMM
// runs the algorithms that need none.
// A token whose slot is skipped (padding, or past the cache) while stage B gathers from a paged
// cache gets c = 0, so its K and V rows are written as zeros (mla.h): a GEMM writes every row.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/lt_matmul.h"
#include "cuda/mla_epilogue.h"
#include "heuristics.h"
#include "mla/mla_backends.h"
#include "validation.h"

namespace latentkv::detail {
namespace {

constexpr int64_t kRegionAlignment = 256;  // each workspace region, as cuBLAS's scratch needs
constexpr int64_t kCkvRowAlignment = 4;    // float32 elements: ckv rows start at 16 bytes

bool runs_first(const MlaProblem& p) { return p.stage != MlaStage::kSecond; }
bool runs_second(const MlaProblem& p) { return p.stage != MlaStage::kFirst; }

// q_a is computed only where the caller asks for it.
int64_t q_rank_run(const MlaProblem& p, const MlaArgs& a) {
  return a.q_a != nullptr ? p.q_rank : 0;
}

// Stage B reads c from the workspace: after stage A unless a dense cache holds it, and when it
// runs alone on a paged cache (gathered there by slot).
bool latent_in_workspace(const MlaProblem& p, const MlaArgs& a) {
  if (p.stage == MlaStage::kBoth) return a.kv_cache == nullptr || a.slot_mapping != nullptr;
  if (p.stage == MlaStage::kSecond) return a.latent == nullptr && a.slot_mapping != nullptr;
  return false;
}

int64_t ckv_ld(int64_t q_rank, const MlaProblem& p) {
  return lt::align_up(q_rank + p.kv_rank + p.rope_dim, kCkvRowAlignment);
}

// Stage A's slices of D (heuristics.h), one where the epilogue could not stage their planes. Also
// asked of problems no limit has refused yet (workspace_size): a row over the epilogue's shared
// memory in floats answers 1 before any product could overflow.
int64_t stage_a_splits(const MlaProblem& p, int64_t q_rank) {
  const int64_t splits = mla_gemm_stage_a_splits(p.tokens(), p.model_dim, q_rank);
  constexpr int64_t kFloats = kMlaEpilogueSharedBytes / 4;
  if (splits == 1 || q_rank > kFloats || p.kv_rank > kFloats || p.rope_dim > kFloats) return 1;
  const int64_t bytes = mla_epilogue_token_shared_bytes(q_rank, p.kv_rank, p.rope_dim,
                                                        ckv_ld(q_rank, p), splits);
  return bytes <= kMlaEpilogueSharedBytes ? splits : 1;
}

// Bytes of the workspace's regions before the scratch, from its first 256-byte boundary.
struct WorkspaceLayout {
  int64_t ckv_ld = 0;        // float32 elements per ckv row
  int64_t ckv_bytes = 0;     // [splits, T, ckv_ld] float32, rounded up to 256; 0: no stage A
  int64_t latent_bytes = 0;  // [T, R] in the dtype; 0 where stage B does not read it there
  int64_t used() const { return ckv_bytes + latent_bytes; }
};

WorkspaceLayout workspace_layout(const MlaProblem& p, int64_t q_rank, bool latent) {
  WorkspaceLayout w;
  if (runs_first(p)) {
    w.ckv_ld = ckv_ld(q_rank, p);
    // The most planes a call of the problem can run (fewer where hidden's rows do not fold).
    const int64_t splits = stage_a_splits(p, q_rank);
    w.ckv_bytes = lt::align_up(splits * p.tokens() * w.ckv_ld * 4, kRegionAlignment);
  }
  if (latent) {
    w.latent_bytes =
        lt::align_up(p.tokens() * p.kv_rank * element_size(p.dtype), kRegionAlignment);
  }
  return w;
}

char* aligned_workspace(void* workspace) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  return reinterpret_cast<char*>((base + kRegionAlignment - 1) / kRegionAlignment *
                                 kRegionAlignment);
}

// The tokens' rows of a [B, S, ...] tensor as GEMM operands: one matrix of T rows (row stride
// ld) where they fold, else B batches of S rows (ld, batch_stride). `width` is the row's extent
// (the row stride of a single row, which cuBLAS still asks to be at least that).
struct TokenRows {
  bool folds;
  int64_t ld, batch_stride;
};

TokenRows token_rows(const MlaProblem& p, int64_t stride_batch, int64_t stride_seq,
                     int64_t width) {
  if (p.tokens() == 1) return {true, width, 0};
  if (p.seq == 1) return {true, stride_batch, 0};
  if (p.batch == 1) return {true, stride_seq, 0};
  return {stride_batch == p.seq * stride_seq, stride_seq, stride_batch};
}

// out[:, h, :cols] = c [T, R] @ w[h * (dn + dv) rows .. + cols]^T for every head h: one GEMM
// batched over the heads where c's and out's rows fold, else the smaller of B and H looped over.
// Each is marked short_inner (R deep): lt_matmul.h's tile rule for such GEMMs.
Status head_gemms(const lt::Context& ctx, const MlaProblem& p, const void* c, TokenRows c_rows,
                  const char* w, int64_t ldw, int64_t cols, char* out, TokenRows out_rows,
                  int64_t out_stride_head) {
  const int64_t eb = element_size(p.dtype);
  const int64_t w_head = (p.nope_dim + p.v_dim) * ldw;  // elements between heads' weight rows
  const lt::Operand w_heads{w, ldw, w_head};
  if (c_rows.folds && out_rows.folds) {
    return lt::gemm(ctx, {p.dtype, p.dtype, true, p.heads, p.tokens(), cols, p.kv_rank, true},
                    {c, c_rows.ld, 0}, w_heads, out, out_rows.ld, out_stride_head);
  }
  // Not folding means B > 1 and S > 1: token_rows gave seq strides and batch strides.
  const char* c_bytes = static_cast<const char*>(c);
  Status s;
  if (p.heads >= p.batch) {
    for (int64_t b = 0; b < p.batch && s.ok(); ++b) {
      s = lt::gemm(ctx, {p.dtype, p.dtype, true, p.heads, p.seq, cols, p.kv_rank, true},
                   {c_bytes + b * c_rows.batch_stride * eb, c_rows.ld, 0}, w_heads,
                   out + b * out_rows.batch_stride * eb, out_rows.ld, out_stride_head);
    }
    return s;
  }
  for (int64_t h = 0; h < p.heads && s.ok(); ++h) {
    s = lt::gemm(ctx, {p.dtype, p.dtype, true, p.batch, p.seq, cols, p.kv_rank, true},
                 {c, c_rows.ld, c_rows.batch_stride}, {w + h * w_head * eb, ldw, 0},
                 out + h * out_stride_head * eb, out_rows.ld, out_rows.batch_stride);
  }
  return s;
}

// ckv [splits, T, ckv_ld] float32 = hidden @ [q_a_weight ; kv_a_weight]^T (q_a part only for
// q_rank > 0), slice j of D (D / splits columns) into plane j (T * ld elements on); `rows` are
// hidden's token rows (token_rows), and splits > 1 only where they fold.
Status stage_a_gemms(const lt::Context& ctx, const MlaProblem& p, const MlaArgs& a,
                     int64_t q_rank, TokenRows rows, float* ckv, int64_t ld, int64_t splits) {
  const int64_t eb = element_size(p.dtype);
  const int64_t batches = rows.folds ? 1 : p.batch;
  const int64_t m = rows.folds ? p.tokens() : p.seq;
  const lt::Operand hidden{a.hidden, rows.ld, rows.batch_stride};
  const int64_t kv_cols = p.kv_rank + p.rope_dim;
  auto project = [&](const void* w, int64_t ldw, int64_t cols, float* out) {
    if (splits > 1) {  // rows fold: the batches are the slices of D
      const int64_t depth = p.model_dim / splits;
      lt::Shape g{p.dtype, DType::kFloat32, true, splits, p.tokens(), cols, depth};
      g.no_split_reduction = true;
      return lt::gemm(ctx, g, {a.hidden, rows.ld, depth}, {w, ldw, depth}, out, ld,
                      p.tokens() * ld);
    }
    return lt::gemm(ctx, {p.dtype, DType::kFloat32, true, batches, m, cols, p.model_dim}, hidden,
                    {w, ldw, 0}, out, ld, p.seq * ld);
  };
  if (q_rank == 0) return project(a.kv_a_weight, a.kv_a_weight_stride_row, kv_cols, ckv + q_rank);
  const char* q_end =
      static_cast<const char*>(a.q_a_weight) + q_rank * a.q_a_weight_stride_row * eb;
  if (q_end == a.kv_a_weight && a.q_a_weight_stride_row == a.kv_a_weight_stride_row) {
    return project(a.q_a_weight, a.q_a_weight_stride_row, q_rank + kv_cols, ckv);
  }
  Status s = project(a.q_a_weight, a.q_a_weight_stride_row, q_rank, ckv);
  if (s.ok()) s = project(a.kv_a_weight, a.kv_a_weight_stride_row, kv_cols, ckv + q_rank);
  return s;
}

MlaCacheRef cache_ref(const MlaArgs& a) {
  return {a.kv_cache,     a.kv_cache_stride_slot,        a.num_slots,
          a.slot_mapping, a.slot_mapping_stride_batch, a.slot_mapping_stride_seq};
}

MlaKRef k_ref(const MlaArgs& a) {
  return {a.k, a.k_stride_batch, a.k_stride_seq, a.k_stride_head};
}

MlaEpilogueParams epilogue_params(const MlaProblem& p, const MlaArgs& a, int64_t q_rank,
                                  float* ckv, int64_t ld, int64_t splits, void* latent) {
  MlaEpilogueParams e = mla_epilogue_params(p, a, q_rank);
  e.ckv = ckv;
  e.ckv_ld = ld;
  e.ckv_splits = static_cast<int>(splits);
  e.ckv_split_stride = p.tokens() * ld;
  e.latent = latent;
  if (runs_second(p)) e.k = k_ref(a);
  return e;
}

MlaStageBInputParams stage_b_input_params(const MlaProblem& p, const MlaArgs& a, void* latent) {
  MlaStageBInputParams g{};
  g.tokens = static_cast<int>(p.tokens());
  g.seq = static_cast<int>(p.seq);
  g.kv_rank = static_cast<int>(p.kv_rank);
  g.rope_dim = static_cast<int>(p.rope_dim);
  g.heads = static_cast<int>(p.heads);
  g.nope_dim = static_cast<int>(p.nope_dim);
  g.dtype = p.dtype;
  if (a.latent != nullptr) {
    g.k_pe = a.k_pe;
    g.k_pe_stride_batch = a.k_pe_stride_batch;
    g.k_pe_stride_seq = a.k_pe_stride_seq;
  } else {
    g.cache = cache_ref(a);
    g.latent = latent;
  }
  g.k = k_ref(a);
  return g;
}

Status too_large(const char* what, int64_t value) {
  return {StatusCode::kUnsupported, std::string(what) + " = " + std::to_string(value) +
                                        " exceeds cuda-mla-gemm's int32 limit (" +
                                        std::to_string(std::numeric_limits<int32_t>::max()) +
                                        ")"};
}

}  // namespace

int64_t mla_cuda_gemm_workspace_size(const MlaProblem& p) {
  // The regions as the largest call needs them (q_a on, or off with stage A in slices of D; c in
  // the workspace), the slack to reach the first 256-byte boundary, and cuBLAS's scratch at one.
  const int64_t used = std::max(workspace_layout(p, p.q_rank, runs_second(p)).used(),
                                workspace_layout(p, 0, runs_second(p)).used());
  return kRegionAlignment + used + lt::kScratchAlignment + lt::kScratchBytes;
}

Status mla_cuda_gemm_takes(const MlaProblem& p, const MlaArgs& a) {
  // Kernel grids, their loop counters and cuBLAS's batch counts are int32.
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const struct {
    const char* what;
    int64_t value;
  } limits[] = {{"problem.batch * problem.seq (tokens)", p.tokens()},
                {"problem.q_rank + problem.kv_rank + problem.rope_dim",
                 p.q_rank + p.kv_rank + p.rope_dim},
                {"problem.heads * problem.rope_dim", p.heads * p.rope_dim},
                {"problem.heads * (problem.nope_dim + problem.v_dim)", p.kv_b_rows()}};
  for (const auto& limit : limits) {
    if (limit.value > kMax) return too_large(limit.what, limit.value);
  }
  if (p.rope_dim > kMlaEpilogueMaxRopeDim) {
    return {StatusCode::kUnsupported,
            "problem.rope_dim = " + std::to_string(p.rope_dim) +
                " exceeds cuda-mla-gemm's limit (" + std::to_string(kMlaEpilogueMaxRopeDim) +
                ": each token's k_pe is kept in shared memory)"};
  }
  if (runs_first(p)) {
    const int64_t q_rank = q_rank_run(p, a);
    const int64_t bytes =
        mla_epilogue_token_shared_bytes(q_rank, p.kv_rank, p.rope_dim, ckv_ld(q_rank, p), 1);
    if (bytes > kMlaEpilogueSharedBytes) {
      return {StatusCode::kUnsupported,
              "problem.q_rank + problem.kv_rank + problem.rope_dim = " +
                  std::to_string(q_rank + p.kv_rank + p.rope_dim) +
                  " (q_a's rows counted where args.q_a is given) needs " + std::to_string(bytes) +
                  " bytes of shared memory per token in cuda-mla-gemm's epilogue, over its " +
                  std::to_string(kMlaEpilogueSharedBytes)};
    }
  }
  LATENTKV_RETURN_IF_ERROR(
      mla_elements_aligned(a, element_size(p.dtype), element_size(p.rope_dtype)));
  const WorkspaceLayout w = workspace_layout(p, q_rank_run(p, a), latent_in_workspace(p, a));
  if (w.used() > 0) {
    const int64_t pad = a.workspace == nullptr
                            ? 0
                            : aligned_workspace(a.workspace) - static_cast<char*>(a.workspace);
    if (a.workspace == nullptr || a.workspace_bytes < pad + w.used()) {
      return {StatusCode::kInvalidArgument,
              "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                  (a.workspace == nullptr ? " with args.workspace = null" : "") +
                  ": cuda-mla-gemm needs at least " + std::to_string(pad + w.used()) +
                  " bytes of workspace for this call (" +
                  std::to_string(mla_cuda_gemm_workspace_size(p)) + " with cuBLAS's scratch)"};
    }
  }
  return Status::Ok();
}

Status run_mla_cuda_gemm(const MlaProblem& p, const MlaArgs& a, Stream stream) {
  lt::DeviceHandle* h = nullptr;
  if (Status s = lt::device_handle(&h); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(h->mutex);
  const int64_t q_rank = q_rank_run(p, a);
  const bool latent_ws = latent_in_workspace(p, a);
  const WorkspaceLayout w = workspace_layout(p, q_rank, latent_ws);
  char* base = w.used() > 0 ? aligned_workspace(a.workspace) : nullptr;
  float* ckv = w.ckv_bytes > 0 ? reinterpret_cast<float*>(base) : nullptr;  // [splits, T, ld]
  void* latent = latent_ws ? base + w.ckv_bytes : nullptr;                  // [T, R]
  lt::Context ctx{*h, stream, nullptr, 0};
  const int64_t used = base == nullptr ? 0 : (base - static_cast<char*>(a.workspace)) + w.used();
  lt::scratch_after(a.workspace, a.workspace_bytes, used, &ctx.scratch, &ctx.scratch_bytes);

  if (runs_first(p)) {
    // The slices of D run as the GEMM's batches only where hidden's rows fold into one matrix.
    const TokenRows rows =
        token_rows(p, a.hidden_stride_batch, a.hidden_stride_seq, p.model_dim);
    const int64_t splits = rows.folds ? stage_a_splits(p, q_rank) : 1;
    LATENTKV_RETURN_IF_ERROR(stage_a_gemms(ctx, p, a, q_rank, rows, ckv, w.ckv_ld, splits));
    LATENTKV_RETURN_IF_ERROR(launch_mla_stage_a_epilogue(
        epilogue_params(p, a, q_rank, ckv, w.ckv_ld, splits, latent), stream));
  }
  if (!runs_second(p)) return Status::Ok();
  if (p.stage == MlaStage::kSecond) {
    LATENTKV_RETURN_IF_ERROR(
        launch_mla_stage_b_inputs(stage_b_input_params(p, a, latent), stream));
  }
  // c [T, R]: the workspace, a dense cache's rows, or args.latent.
  const void* c = latent;
  TokenRows c_rows{true, p.kv_rank, p.seq * p.kv_rank};
  if (!latent_ws) {
    if (a.latent != nullptr && p.stage == MlaStage::kSecond) {
      c = a.latent;
      c_rows = token_rows(p, a.latent_stride_batch, a.latent_stride_seq, p.kv_rank);
    } else {
      c = a.kv_cache;  // dense: token t's row is row t
      c_rows = {true, p.tokens() == 1 ? p.kv_rank : a.kv_cache_stride_slot,
                p.seq * a.kv_cache_stride_slot};
    }
  }
  const int64_t eb = element_size(p.dtype);
  const char* kv_b = static_cast<const char*>(a.kv_b_weight);
  const int64_t ldw = a.kv_b_weight_stride_row;
  auto k_gemm = [&](const lt::Context& on) {
    return head_gemms(on, p, c, c_rows, kv_b, ldw, p.nope_dim, static_cast<char*>(a.k),
                      token_rows(p, a.k_stride_batch, a.k_stride_seq, p.nope_dim),
                      a.k_stride_head);
  };
  auto v_gemm = [&](const lt::Context& on) {
    return head_gemms(on, p, c, c_rows, kv_b + p.nope_dim * ldw * eb, ldw, p.v_dim,
                      static_cast<char*>(a.v),
                      token_rows(p, a.v_stride_batch, a.v_stride_seq, p.v_dim), a.v_stride_head);
  };

  const StreamBranch* branch = nullptr;
  LATENTKV_RETURN_IF_ERROR(stream_branch(h->branches, stream, &branch));
  if (branch == nullptr) {  // past kMaxStreamBranches caller streams: in order
    LATENTKV_RETURN_IF_ERROR(k_gemm(ctx));
    return v_gemm(ctx);
  }
  Status s = branch->fork();
  if (s.ok()) s = k_gemm(ctx);
  if (s.ok()) s = v_gemm({*h, branch->stream, nullptr, 0});
  const Status joined = branch->join();
  return s.ok() ? joined : s;
}

}  // namespace latentkv::detail
