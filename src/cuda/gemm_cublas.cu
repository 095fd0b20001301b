// The cuBLAS strategy (Strategy::kCudaGemm): latent = hidden @ w_down, then K and V as GEMMs
// whose C matrices are out[0] and out[1] themselves (one batched GEMM for both where the weights
// allow it), so the stack copy that PyTorch eager pays (about 30% of DeepSeek-V3 prefill) never
// happens. float32 runs on FFMA (CUBLAS_COMPUTE_32F, no TF32); bfloat16/float16 on tensor cores
// with float32 accumulation. The latent is written to args.latent when the caller asks for it,
// else to args.workspace. The GEMMs go through lt_matmul.h (cuBLASLt with one cached plan per
// shape, cublasGemmEx where the heuristic offers none; one handle per device, shared with the MLA
// path). cuBLAS's own scratch (split-K partial sums and the like) is the rest of args.workspace:
// the caller's memory, ordered on the caller's stream, so calls on different streams never share
// it.
//
// Batches whose rows are not evenly strided across the batch dimension run as a strided-batched
// GEMM over B; an output whose heads are not packed (out_stride_head > Dh) as one batched over
// the heads (UpProjection).
#include <cstdint>
#include <mutex>
#include <string>

#include "backends.h"
#include "cuda/lt_matmul.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

using lt::Operand;

// The latent [T, R] when it lives in the workspace, and the room it takes there (cuBLAS's scratch
// follows at a 256-byte boundary). check_problem bounds T * R * element size by 2^60 bytes, so
// these sizes and the workspace's total fit in int64.
int64_t latent_bytes(const Problem& p) { return p.tokens() * p.rank * element_size(p.dtype); }
int64_t latent_workspace_bytes(const Problem& p) {
  return lt::align_up(latent_bytes(p), lt::kScratchAlignment);
}

// C[b] (rows x cols) = A[b] (rows x inner) @ B[b] (inner x cols) for b < batches, all in the
// problem's dtype (a batch stride of 0 shares an operand).
Status gemm(const lt::Context& ctx, DType dtype, int64_t batches, int64_t rows, int64_t cols,
            int64_t inner, Operand a, Operand b, void* c, int64_t ldc, int64_t c_batch_stride) {
  return lt::gemm(ctx, {dtype, dtype, false, batches, rows, cols, inner}, a, b, c, ldc,
                  c_batch_stride);
}

// Rows of every batch evenly strided: the B batches fold into one matrix of T rows.
bool folds(const Problem& p, int64_t stride_batch, int64_t stride_seq) {
  return p.batch == 1 || stride_batch == p.seq * stride_seq;
}

// One output half: out_half[b, s, h, :] (Dh) = latent[b, s, :] (R) @ w[:, h*Dh : (h+1)*Dh].
// Packed heads make a token's N outputs one row, so the half is a (rows, N) GEMM (one over all T
// rows where the latent and the output fold, else batched over b). Unpacked heads (a padded head
// stride) make each head its own (rows, Dh) product: batched over heads with C's batch stride =
// out_stride_head and B's = Dh columns of w; where the rows do not fold either, the smaller of B
// and H is looped over and the larger batched.
struct UpProjection {
  const Problem& p;
  const Args& a;
  Operand latent;
  bool rows_fold;

  bool heads_packed() const { return p.heads == 1 || a.out_stride_head == p.head_dim; }

  Status run(const lt::Context& ctx, Operand w, char* out_half) const {
    const int64_t eb = element_size(p.dtype);
    if (heads_packed()) {
      return gemm(ctx, p.dtype, rows_fold ? 1 : p.batch, rows_fold ? p.tokens() : p.seq,
                  p.kv_width(), p.rank, latent, w, out_half, a.out_stride_seq,
                  a.out_stride_batch);
    }
    const Operand w_heads{w.data, w.ld, p.head_dim};
    if (rows_fold) {
      return gemm(ctx, p.dtype, p.heads, p.tokens(), p.head_dim, p.rank,
                  {latent.data, latent.ld, 0}, w_heads, out_half, a.out_stride_seq,
                  a.out_stride_head);
    }
    const char* latent_bytes = static_cast<const char*>(latent.data);
    const char* w_bytes = static_cast<const char*>(w.data);
    Status s;
    if (p.heads >= p.batch) {
      for (int64_t b = 0; b < p.batch && s.ok(); ++b) {
        s = gemm(ctx, p.dtype, p.heads, p.seq, p.head_dim, p.rank,
                 {latent_bytes + b * latent.batch_stride * eb, latent.ld, 0}, w_heads,
                 out_half + b * a.out_stride_batch * eb, a.out_stride_seq, a.out_stride_head);
      }
      return s;
    }
    for (int64_t head = 0; head < p.heads && s.ok(); ++head) {
      s = gemm(ctx, p.dtype, p.batch, p.seq, p.head_dim, p.rank, latent,
               {w_bytes + head * p.head_dim * eb, w.ld, 0},
               out_half + head * a.out_stride_head * eb, a.out_stride_seq, a.out_stride_batch);
    }
    return s;
  }
};

}  // namespace

int64_t cuda_gemm_workspace_size(const Problem& p, bool with_latent) {
  // kScratchAlignment more: the scratch starts at a 256-byte boundary wherever the workspace does.
  const int64_t latent_part = with_latent ? 0 : latent_workspace_bytes(p);
  return latent_part + lt::kScratchAlignment + lt::kScratchBytes;
}

Status cuda_gemm_supports(const Problem& p, const Args& a) {
  if (a.latent == nullptr && (a.workspace == nullptr || a.workspace_bytes < latent_bytes(p))) {
    return {StatusCode::kInvalidArgument,
            "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                " with args.latent = null: cuda-gemm needs a latent buffer or at least " +
                std::to_string(latent_bytes(p)) + " bytes of workspace (" +
                std::to_string(cuda_gemm_workspace_size(p, false)) +
                " with cuBLAS's scratch)"};
  }
  return Status::Ok();
}

Status run_cuda_gemm(const Problem& p, const Args& a, Stream stream) {
  lt::DeviceHandle* h = nullptr;
  if (Status s = lt::device_handle(&h); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(h->mutex);
  const int64_t eb = element_size(p.dtype);
  Operand latent{a.latent, a.latent_stride_seq, a.latent_stride_batch};
  if (a.latent == nullptr) latent = {a.workspace, p.rank, p.seq * p.rank};  // [B, S, R] packed
  // The scratch: the workspace after the latent (if it holds it), from a 256-byte boundary;
  // none where the caller gave less than workspace_size() asks for.
  lt::Context ctx{*h, stream, nullptr, 0};
  lt::scratch_after(a.workspace, a.workspace_bytes,
                    a.latent == nullptr ? latent_workspace_bytes(p) : 0, &ctx.scratch,
                    &ctx.scratch_bytes);
  const bool latent_folds = folds(p, latent.batch_stride, latent.ld);

  // latent [rows, R] = hidden [rows, D] @ w_down [D, R]: one GEMM over all T rows where hidden
  // and the latent fold, else one batch per b.
  const bool down_folds = latent_folds && folds(p, a.hidden_stride_batch, a.hidden_stride_seq);
  Status s = gemm(ctx, p.dtype, down_folds ? 1 : p.batch, down_folds ? p.tokens() : p.seq,
                  p.rank, p.model_dim, {a.hidden, a.hidden_stride_seq, a.hidden_stride_batch},
                  {a.w_down, a.w_down_stride_row, 0}, const_cast<void*>(latent.data), latent.ld,
                  latent.batch_stride);
  if (!s.ok()) return s;

  const bool up_folds = latent_folds && folds(p, a.out_stride_batch, a.out_stride_seq);
  const UpProjection up{p, a, latent, up_folds};
  char* out = static_cast<char*>(a.out);
  // out[0] = latent @ w_up_k and out[1] = latent @ w_up_v: as one GEMM batched over {w_up_k,
  // w_up_v} where the dtype is worth it (heuristics.h), the heads are packed, the rows fold and
  // w_up_v sits a whole number of elements after w_up_k with the same row stride.
  const int64_t kv_gap =
      static_cast<const char*>(a.w_up_v) - static_cast<const char*>(a.w_up_k);
  if (gemm_batches_k_and_v(p.dtype) && up.heads_packed() && up.rows_fold && kv_gap > 0 &&
      kv_gap % eb == 0 && a.w_up_k_stride_row == a.w_up_v_stride_row && a.out_stride_kv > 0) {
    return gemm(ctx, p.dtype, 2, p.tokens(), p.kv_width(), p.rank,
                {latent.data, latent.ld, 0}, {a.w_up_k, a.w_up_k_stride_row, kv_gap / eb}, out,
                a.out_stride_seq, a.out_stride_kv);
  }
  s = up.run(ctx, {a.w_up_k, a.w_up_k_stride_row, 0}, out);
  if (s.ok()) {
    s = up.run(ctx, {a.w_up_v, a.w_up_v_stride_row, 0}, out + a.out_stride_kv * eb);
  }
  return s;
}

}  // namespace latentkv::detail
