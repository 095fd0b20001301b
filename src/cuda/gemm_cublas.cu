// The cuBLAS strategy (Strategy::kCudaGemm): latent = hidden @ w_down, then K and V as GEMMs
// whose C matrices are out[0] and out[1] themselves (one batched GEMM for both where the weights
// allow it), so the stack copy that PyTorch eager pays (about 30% of DeepSeek-V3 prefill) never
// happens. float32 runs on FFMA (CUBLAS_COMPUTE_32F, no TF32); bfloat16/float16 on tensor cores
// with float32 accumulation. The latent is written to args.latent when the caller asks for it,
// else to args.workspace. The GEMMs go through cuBLASLt with one cached plan per shape (the
// heuristic runs once, not per call), cublasGemmEx where the heuristic offers none. cuBLAS's own
// scratch (split-K partial sums and the like) is the rest of args.workspace: the caller's memory,
// ordered on the caller's stream, so calls on different streams never share it.
//
// Row-major C[M,N] = A[M,K] B[K,N] is the column-major product C^T = B^T A^T, so every call passes
// (B, A) with the row strides as leading dimensions. Batches whose rows are not evenly strided
// across the batch dimension run as a strided-batched GEMM over B; an output whose heads are not
// packed (out_stride_head > Dh) as one batched over the heads (UpProjection).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <deque>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>

#include "backends.h"
#include "cuda/cuda_check.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

// cuBLAS's scratch, taken from args.workspace after the latent (when the latent lives there too),
// at a 256-byte boundary as cuBLAS requires. The size NVIDIA recommends for Hopper; a call given
// less runs the algorithms that need none (slower at some shapes: split-K is among those that do).
// A buffer of the library's own would be shared by every stream of the device, and GEMMs on two
// streams may run at the same time.
constexpr int64_t kScratchBytes = int64_t{32} << 20;
constexpr int64_t kScratchAlignment = 256;

// The latent [T, R] when it lives in the workspace, and the room it takes there (the scratch
// follows at a 256-byte boundary).
int64_t latent_bytes(const Problem& p) { return p.tokens() * p.rank * element_size(p.dtype); }
int64_t latent_workspace_bytes(const Problem& p) {
  return (latent_bytes(p) + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return {StatusCode::kCudaError, std::string(what) + " failed: " + cublasGetStatusName(s) + ": " +
                                      cublasGetStatusString(s)};
}

// A cuBLASLt plan: the matmul descriptor, the three layouts and the algorithm of one GEMM shape
// (dims, strides, pointer alignments), chosen once by the heuristic and reused: cublasGemmEx
// redoes that host work on every call (the host time per call is in docs/perf.md).
using PlanKey = std::array<int64_t, 15>;

struct GemmPlan {
  PlanKey key{};
  bool use_gemm_ex = false;  // the heuristic found no algorithm: cublasGemmEx takes the shape
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // Lt's A, B, C (see gemm())
  cublasLtMatmulAlgo_t algo{};
};

constexpr size_t kMaxPlans = 64;  // distinct shapes kept per device; the oldest goes first

void destroy(GemmPlan& plan) {
  if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
  plan = GemmPlan{};
}

// One handle per device, created on first use; calls on it are serialized (cublasSetStream and
// cublasSetWorkspace, the plan cache and the GEMMs of one run() must not interleave with another
// thread's).
struct DeviceHandle {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::deque<GemmPlan> plans;
  Status status;
  std::mutex mutex;
};

Status device_handle(DeviceHandle** out) {
  static std::array<std::once_flag, kMaxTrackedDevices> once;
  static std::array<DeviceHandle, kMaxTrackedDevices> handles;
  int device = 0;
  if (Status tracked = current_tracked_device(&device); !tracked.ok()) return tracked;
  DeviceHandle& h = handles[device];
  std::call_once(once[device], [&h] {
    const RelaxedCaptureScope relaxed;
    h.status = cublas_status(cublasCreate(&h.handle), "cublasCreate");
    if (h.status.ok()) h.status = cublas_status(cublasLtCreate(&h.lt), "cublasLtCreate");
  });
  *out = &h;
  return h.status;
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// What every GEMM of one run() shares: the device's handles (locked), the caller's stream and the
// scratch from the caller's workspace (null and 0 when it has none to spare).
struct GemmContext {
  DeviceHandle& h;
  Stream stream;
  void* scratch;
  int64_t scratch_bytes;
};

// A row-major operand of one batch: base pointer, row stride, stride between batches.
struct Operand {
  const void* data;
  int64_t ld;
  int64_t batch_stride;
};

// The largest power of two (up to 16) dividing the address of every batch's operand.
int64_t alignment(const void* data, int64_t batch_stride_bytes) {
  const uint64_t bits =
      reinterpret_cast<uintptr_t>(data) | static_cast<uint64_t>(batch_stride_bytes) | 16;
  return static_cast<int64_t>(bits & (~bits + 1));
}

Status lt_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t t, int64_t rows, int64_t cols,
                 int64_t ld, int64_t batches, int64_t batch_stride) {
  Status s = cublas_status(cublasLtMatrixLayoutCreate(layout, t, rows, cols, ld),
                           "cublasLtMatrixLayoutCreate");
  if (s.ok() && batches > 1) {
    const int32_t count = static_cast<int32_t>(batches);
    s = cublas_status(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof count),
                      "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    if (s.ok()) {
      s = cublas_status(
          cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &batch_stride, sizeof batch_stride),
          "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
  }
  return s;
}

// Row-major C = A B is Lt's column-major C^T = B^T A^T: Lt's A is our B (cols x inner, ld
// b.ld), its B our A (inner x rows, ld a.ld), its C ours (cols x rows, ldc).
Status make_plan(cublasLtHandle_t lt, DType dtype, int64_t batches, int64_t rows, int64_t cols,
                 int64_t inner, Operand a, Operand b, int64_t ldc, int64_t c_batch_stride,
                 const int64_t (&aligned)[3], int64_t scratch_bytes, GemmPlan* plan) {
  const cudaDataType_t t = cuda_type(dtype);
  Status s = cublas_status(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                           "cublasLtMatmulDescCreate");
  if (s.ok()) s = lt_layout(&plan->a, t, cols, inner, b.ld, batches, b.batch_stride);
  if (s.ok()) s = lt_layout(&plan->b, t, inner, rows, a.ld, batches, a.batch_stride);
  if (s.ok()) s = lt_layout(&plan->c, t, cols, rows, ldc, batches, c_batch_stride);
  cublasLtMatmulPreference_t pref = nullptr;
  if (s.ok()) {
    s = cublas_status(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  }
  const uint64_t workspace = static_cast<uint64_t>(scratch_bytes);
  if (s.ok()) {
    s = cublas_status(cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                          sizeof workspace),
                      "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  }
  const uint32_t align_a = static_cast<uint32_t>(aligned[1]),  // Lt's A is our B
      align_b = static_cast<uint32_t>(aligned[0]), align_c = static_cast<uint32_t>(aligned[2]);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const uint32_t*> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c}};
  for (const auto& [attribute, value] : alignments) {
    if (!s.ok()) break;
    s = cublas_status(cublasLtMatmulPreferenceSetAttribute(pref, attribute, value, sizeof *value),
                      "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (s.ok()) {
    const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(
        lt, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
    plan->use_gemm_ex = asked != CUBLAS_STATUS_SUCCESS || found == 0 ||
                        result.state != CUBLAS_STATUS_SUCCESS;
    plan->algo = result.algo;
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  return s;
}

// C[b] (rows x cols) = A[b] (rows x inner) @ B[b] (inner x cols) for b < batches (a batch
// stride of 0 shares an operand), on the context's stream: cuBLASLt with the shape's cached plan,
// or cublasGemmEx where the heuristic offers no algorithm.
Status gemm(const GemmContext& ctx, DType dtype, int64_t batches, int64_t rows, int64_t cols,
            int64_t inner, Operand a, Operand b, void* c, int64_t ldc, int64_t c_batch_stride) {
  DeviceHandle& h = ctx.h;
  const float alpha = 1.f, beta = 0.f;
  const int64_t eb = element_size(dtype);
  const int64_t aligned[3] = {alignment(a.data, a.batch_stride * eb),
                              alignment(b.data, b.batch_stride * eb),
                              alignment(c, c_batch_stride * eb)};
  const PlanKey key = {static_cast<int64_t>(dtype), batches, rows, cols, inner, a.ld, b.ld, ldc,
                       a.batch_stride, b.batch_stride, c_batch_stride, aligned[0], aligned[1],
                       aligned[2], ctx.scratch_bytes};
  auto plan = std::find_if(h.plans.begin(), h.plans.end(),
                           [&key](const GemmPlan& p) { return p.key == key; });
  if (plan == h.plans.end()) {
    if (h.plans.size() == kMaxPlans) {
      destroy(h.plans.front());
      h.plans.pop_front();
    }
    GemmPlan fresh;
    fresh.key = key;
    if (Status s = make_plan(h.lt, dtype, batches, rows, cols, inner, a, b, ldc, c_batch_stride,
                             aligned, ctx.scratch_bytes, &fresh);
        !s.ok()) {
      destroy(fresh);
      return s;
    }
    h.plans.push_back(fresh);
    plan = std::prev(h.plans.end());
  }
  if (!plan->use_gemm_ex) {
    return cublas_status(cublasLtMatmul(h.lt, plan->desc, &alpha, b.data, plan->a, a.data,
                                        plan->b, &beta, c, plan->c, c, plan->c, &plan->algo,
                                        ctx.scratch, static_cast<size_t>(ctx.scratch_bytes),
                                        ctx.stream),
                         "cublasLtMatmul");
  }
  const cudaDataType_t t = cuda_type(dtype);
  // cublasSetStream puts the handle back on cuBLAS's default workspace pool (memory of its own,
  // shared across streams): the call's scratch replaces it, or none at all.
  Status s = cublas_status(cublasSetStream(h.handle, ctx.stream), "cublasSetStream");
  if (s.ok()) {
    s = cublas_status(
        cublasSetWorkspace(h.handle, ctx.scratch, static_cast<size_t>(ctx.scratch_bytes)),
        "cublasSetWorkspace");
  }
  if (!s.ok()) return s;
  if (batches == 1) {
    return cublas_status(cublasGemmEx_64(h.handle, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, inner,
                                         &alpha, b.data, t, b.ld, a.data, t, a.ld, &beta, c, t,
                                         ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmEx");
  }
  return cublas_status(
      cublasGemmStridedBatchedEx_64(h.handle, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, inner, &alpha,
                                    b.data, t, b.ld, b.batch_stride, a.data, t, a.ld,
                                    a.batch_stride, &beta, c, t, ldc, c_batch_stride, batches,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
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

  Status run(const GemmContext& ctx, Operand w, char* out_half) const {
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
  return (with_latent ? 0 : latent_workspace_bytes(p)) + kScratchAlignment + kScratchBytes;
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
  DeviceHandle* h = nullptr;
  if (Status s = device_handle(&h); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(h->mutex);
  const int64_t eb = element_size(p.dtype);
  Operand latent{a.latent, a.latent_stride_seq, a.latent_stride_batch};
  if (a.latent == nullptr) latent = {a.workspace, p.rank, p.seq * p.rank};  // [B, S, R] packed
  // The scratch: the workspace after the latent (if it holds it), from a 256-byte boundary;
  // none where the caller gave less than workspace_size() asks for.
  GemmContext ctx{*h, stream, nullptr, 0};
  if (a.workspace != nullptr) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(a.workspace);
    const uintptr_t end = base + static_cast<uintptr_t>(a.workspace_bytes);
    const int64_t latent_part = a.latent == nullptr ? latent_workspace_bytes(p) : 0;
    uintptr_t start = base + static_cast<uintptr_t>(latent_part);
    start = (start + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
    if (start < end && end - start >= static_cast<uintptr_t>(kScratchBytes)) {
      ctx.scratch = reinterpret_cast<void*>(start);
      ctx.scratch_bytes = kScratchBytes;
    }
  }
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
