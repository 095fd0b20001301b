// The cuBLAS strategy (Strategy::kCudaGemm): latent = hidden @ w_down, then K and V as GEMMs
// whose C matrices are out[0] and out[1] themselves (one batched GEMM for both where the weights
// allow it), so the stack copy that PyTorch eager pays (about 30% of DeepSeek-V3 prefill) never
// happens. float32 runs on FFMA (CUBLAS_COMPUTE_32F, no TF32); bfloat16/float16 on tensor cores
// with float32 accumulation. The latent is written to args.latent when the caller asks for it,
// else to args.workspace.
//
// Row-major C[M,N] = A[M,K] B[K,N] is the column-major product C^T = B^T A^T, so every call passes
// (B, A) with the row strides as leading dimensions. Batches whose rows are not evenly strided
// across the batch dimension run as a strided-batched GEMM over B.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <string>

#include "backends.h"
#include "cuda/cuda_check.h"

namespace latentkv::detail {
namespace {

// cuBLAS's own scratch, set once per handle so that no call allocates (graph capture needs that).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return {StatusCode::kCudaError, std::string(what) + " failed: " + cublasGetStatusName(s) + ": " +
                                      cublasGetStatusString(s)};
}

// One handle per device, created on first use; calls on it are serialized (cublasSetStream and
// the GEMMs of one run() must not interleave with another thread's).
struct DeviceHandle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
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
    if (h.status.ok()) {
      h.status = cuda_status(cudaMalloc(&h.workspace, kCublasWorkspaceBytes),
                             "cudaMalloc(cuBLAS workspace)");
    }
    if (h.status.ok()) {
      h.status = cublas_status(cublasSetWorkspace(h.handle, h.workspace, kCublasWorkspaceBytes),
                               "cublasSetWorkspace");
    }
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

// A row-major operand of one batch: base pointer, row stride, stride between batches.
struct Operand {
  const void* data;
  int64_t ld;
  int64_t batch_stride;
};

// C[b] (rows x cols) = A[b] (rows x inner) @ B[b] (inner x cols) for b < batches (a batch
// stride of 0 shares an operand).
Status gemm(cublasHandle_t handle, DType dtype, int64_t batches, int64_t rows, int64_t cols,
            int64_t inner, Operand a, Operand b, void* c, int64_t ldc, int64_t c_batch_stride) {
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t t = cuda_type(dtype);
  if (batches == 1) {
    return cublas_status(cublasGemmEx_64(handle, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, inner,
                                         &alpha, b.data, t, b.ld, a.data, t, a.ld, &beta, c, t,
                                         ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmEx");
  }
  return cublas_status(
      cublasGemmStridedBatchedEx_64(handle, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, inner, &alpha,
                                    b.data, t, b.ld, b.batch_stride, a.data, t, a.ld,
                                    a.batch_stride, &beta, c,
                                    t, ldc, c_batch_stride, batches, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

// Rows of every batch evenly strided: the B batches fold into one matrix of T rows.
bool folds(const Problem& p, int64_t stride_batch, int64_t stride_seq) {
  return p.batch == 1 || stride_batch == p.seq * stride_seq;
}

}  // namespace

int64_t cuda_gemm_workspace_size(const Problem& p) {
  return p.tokens() * p.rank * element_size(p.dtype);
}

Status cuda_gemm_supports(const Problem& p, const Args& a) {
  if (a.out_stride_head != p.head_dim && p.heads > 1) {
    return {StatusCode::kUnsupported,
            "args.out_stride_head = " + std::to_string(a.out_stride_head) +
                " != head_dim: cuda-gemm writes each output half as one (tokens, heads * head_dim) "
                "matrix, so the heads must be packed"};
  }
  if (a.latent == nullptr && a.workspace_bytes < cuda_gemm_workspace_size(p)) {
    return {StatusCode::kInvalidArgument,
            "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                " with args.latent = null: cuda-gemm needs a latent buffer or " +
                std::to_string(cuda_gemm_workspace_size(p)) + " bytes of workspace"};
  }
  return Status::Ok();
}

Status run_cuda_gemm(const Problem& p, const Args& a, Stream stream) {
  DeviceHandle* h = nullptr;
  if (Status s = device_handle(&h); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(h->mutex);
  if (Status s = cublas_status(cublasSetStream(h->handle, stream), "cublasSetStream"); !s.ok()) {
    return s;
  }
  const int64_t n = p.kv_width(), eb = element_size(p.dtype);
  Operand latent{a.latent, a.latent_stride_seq, a.latent_stride_batch};
  if (a.latent == nullptr) latent = {a.workspace, p.rank, p.seq * p.rank};  // [B, S, R] packed
  void* latent_out = const_cast<void*>(latent.data);

  const Operand hidden{a.hidden, a.hidden_stride_seq, a.hidden_stride_batch};
  const Operand w_down{a.w_down, a.w_down_stride_row, 0};
  // One GEMM over all T rows where every operand folds, else one batch per b.
  const bool fold = folds(p, a.hidden_stride_batch, a.hidden_stride_seq) &&
                    folds(p, latent.batch_stride, latent.ld) &&
                    folds(p, a.out_stride_batch, a.out_stride_seq);
  const int64_t batches = fold ? 1 : p.batch, rows = fold ? p.tokens() : p.seq;

  // latent [rows, R] = hidden [rows, D] @ w_down [D, R]
  Status s = gemm(h->handle, p.dtype, batches, rows, p.rank, p.model_dim, hidden,
                  w_down, latent_out, latent.ld, latent.batch_stride);
  // out[0] [rows, N] = latent @ w_up_k; out[1] likewise with w_up_v. For bf16/fp16, as one GEMM
  // batched over {w_up_k, w_up_v} where the rows fold and w_up_v sits a whole number of elements
  // after w_up_k with the same row stride: one launch instead of two, the up projection's CTAs
  // fill the GPU together (measured on an H200, docs/perf-notes.md: 2.5-3 us less at every
  // DeepSeek size from T = 1 to 8192). float32 keeps two GEMMs: there cuBLAS's batched FFMA
  // kernels were faster at some sizes and slower at others (V2-Lite T = 2: 26.8 against 21.6 us).
  char* out = static_cast<char*>(a.out);
  const int64_t kv_gap =
      static_cast<const char*>(a.w_up_v) - static_cast<const char*>(a.w_up_k);
  if (s.ok() && p.dtype != DType::kFloat32 && fold && kv_gap > 0 && kv_gap % eb == 0 &&
      a.w_up_k_stride_row == a.w_up_v_stride_row && a.out_stride_kv > 0) {
    return gemm(h->handle, p.dtype, 2, rows, n, p.rank, {latent.data, latent.ld, 0},
                {a.w_up_k, a.w_up_k_stride_row, kv_gap / eb}, out, a.out_stride_seq,
                a.out_stride_kv);
  }
  if (s.ok()) {
    s = gemm(h->handle, p.dtype, batches, rows, n, p.rank, latent,
             {a.w_up_k, a.w_up_k_stride_row, 0}, out, a.out_stride_seq, a.out_stride_batch);
  }
  if (s.ok()) {
    s = gemm(h->handle, p.dtype, batches, rows, n, p.rank, latent,
             {a.w_up_v, a.w_up_v_stride_row, 0}, out + a.out_stride_kv * eb, a.out_stride_seq,
             a.out_stride_batch);
  }
  return s;
}

}  // namespace latentkv::detail
