// Row-major GEMMs through cuBLASLt with a cache of plans, for the CUDA strategies that run their
// matrix products on cuBLAS. A plan (matmul descriptor, three layouts, the heuristic's algorithm)
// is made once per shape, stride and pointer-alignment key and reused, so a call pays no
// heuristic; where the heuristic offers no algorithm, cublasGemmEx takes the shape. cuBLAS's
// scratch is the caller's (a slice of args.workspace, ordered on the caller's stream), never a
// buffer of the library's own that two streams could share.
//
// Row-major C[M, N] = A[M, K] op(B) is Lt's column-major C^T = op(B)^T A^T, so every call passes
// (B, A) with the row strides as leading dimensions. B is either [K, N] row-major or, for weights
// in nn.Linear's [out, in] layout, [N, K] row-major (b_transposed: Lt's "TN" product).
//
// The plan takes the heuristic's first algorithm, except where the caller marks a GEMM
// short_inner (see Shape): cuda-mla-gemm's stage B, 512 deep. There, when the first algorithm's
// Lt tile is 128x256 and its grid is at least kShortInnerWaves waves of the device's SMs, the
// plan takes the heuristic's first 128x160 or 128x128 candidate instead. Measured on an H200
// (docs/experiments.md, cuBLASLt 13.0, bf16, [T, 512] x [512, 128] batched over H heads): V3
// (H = 128) 1.20x at T = 4096 and 1.11x at T = 1024; V2-Lite T = 4096 (H = 16, 1.9 waves of
// 128x256) is 0.90x with 128x128 and keeps the first. A 512-deep tile is only 8 k-blocks of 64,
// so a 128x256 tile (one CTA an SM) pays its pipeline fill and its epilogue every wave, which
// smaller tiles, two an SM, overlap. A GEMM marked no_split_reduction is offered only algorithms
// without split-K: cuda-mla-gemm's stage A splits K itself, as batches, and sums the partial
// products in its epilogue (no reduction kernel).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/stream_branches.h"
#include "latentkv/latentkv.h"

namespace latentkv::detail::lt {

// cuBLAS's scratch size (NVIDIA's recommendation for Hopper) and the boundary it starts at (cuBLAS
// requires 256 bytes). A call given less runs the algorithms that need none (no split-K).
constexpr int64_t kScratchBytes = int64_t{32} << 20;
constexpr int64_t kScratchAlignment = 256;

inline int64_t align_up(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

inline Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return {StatusCode::kCudaError, std::string(what) + " failed: " + cublasGetStatusName(s) + ": " +
                                      cublasGetStatusString(s)};
}

// in_type, out_type, b_transposed, short_inner, batches, rows, cols, inner, a.ld, b.ld, ldc, the
// three batch strides, the three pointer alignments, scratch bytes, no_split_reduction.
using PlanKey = std::array<int64_t, 19>;

struct Plan {
  PlanKey key{};
  bool use_gemm_ex = false;  // the heuristic found no algorithm: cublasGemmEx takes the shape
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // Lt's A, B, C (see gemm())
  cublasLtMatmulAlgo_t algo{};
};

constexpr size_t kMaxPlans = 64;  // distinct shapes kept per device; the oldest goes first

inline void destroy(Plan& plan) {
  if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
  plan = Plan{};
}

// One handle pair per device, created on first use. Calls on it are serialized by `mutex` (held
// for a whole run(): cublasSetStream/cublasSetWorkspace, the plan cache, the stream branches and
// the GEMMs of one call must not interleave with another thread's).
struct DeviceHandle {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::deque<Plan> plans;
  StreamBranches branches;  // one per caller stream (stream_branches.h)
  Status status;
  std::mutex mutex;
};

inline Status device_handle(DeviceHandle** out) {
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

inline cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// What every GEMM of one run() shares: the device's handles (locked by the caller), the caller's
// stream and the scratch (null and 0 when the workspace has none to spare).
struct Context {
  DeviceHandle& h;
  Stream stream;
  void* scratch;
  int64_t scratch_bytes;
};

// The scratch inside a workspace whose first `used` bytes hold other things: kScratchBytes from
// the next 256-byte boundary, or none where the workspace is too small for that.
inline void scratch_after(void* workspace, int64_t workspace_bytes, int64_t used, void** scratch,
                          int64_t* scratch_bytes) {
  *scratch = nullptr;
  *scratch_bytes = 0;
  if (workspace == nullptr) return;
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t end = base + static_cast<uintptr_t>(workspace_bytes);
  uintptr_t start = base + static_cast<uintptr_t>(used);
  start = (start + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
  if (start < end && end - start >= static_cast<uintptr_t>(kScratchBytes)) {
    *scratch = reinterpret_cast<void*>(start);
    *scratch_bytes = kScratchBytes;
  }
}

// A row-major operand: base pointer, row stride, stride between batches (0: shared by every
// batch), in elements.
struct Operand {
  const void* data;
  int64_t ld;
  int64_t batch_stride;
};

// The GEMM's types and sizes: C[b] (rows x cols, out_type) = A[b] (rows x inner) @ op(B[b]) for
// b < batches, inputs in in_type, float32 accumulation.
struct Shape {
  DType in_type;
  DType out_type;
  bool b_transposed;  // B given as [cols, inner] (nn.Linear's weight), else [inner, cols]
  int64_t batches, rows, cols, inner;
  bool short_inner = false;  // the tile rule of the header comment applies
  bool no_split_reduction = false;  // only algorithms without split-K (the caller splits K)
};

constexpr int kShortInnerCandidates = 8;  // heuristic results the short_inner rule looks through
constexpr int64_t kShortInnerWaves = 3;

// The Lt tile's extent over Lt's M (our cols) and N (our rows) for the tiles the short_inner rule
// names; {0, 0} for any other.
inline std::pair<int64_t, int64_t> tile_extent(const cublasLtMatmulAlgo_t& algo) {
  uint32_t tile = CUBLASLT_MATMUL_TILE_UNDEFINED;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                           sizeof tile, &written) != CUBLAS_STATUS_SUCCESS) {
    return {0, 0};
  }
  switch (tile) {
    case CUBLASLT_MATMUL_TILE_128x128: return {128, 128};
    case CUBLASLT_MATMUL_TILE_128x160: return {128, 160};
    case CUBLASLT_MATMUL_TILE_128x256: return {128, 256};
    default: return {0, 0};
  }
}

// The short_inner rule over the heuristic's `found` results: the index of the one to run.
inline int short_inner_choice(const Shape& g, const cublasLtMatmulHeuristicResult_t* results,
                              int found) {
  const auto [tile_cols, tile_rows] = tile_extent(results[0].algo);
  if (tile_cols != 128 || tile_rows != 256) return 0;
  const DeviceFacts* facts = nullptr;
  if (!current_device_facts(&facts).ok()) return 0;
  const int64_t sms = facts->sm_count;
  const int64_t ctas = (g.cols + tile_cols - 1) / tile_cols *
                       ((g.rows + tile_rows - 1) / tile_rows) * g.batches;
  if (ctas < kShortInnerWaves * sms) return 0;
  for (int i = 1; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const auto [cols, rows] = tile_extent(results[i].algo);
    if (cols == 128 && (rows == 128 || rows == 160)) return i;
  }
  return 0;
}

// The largest power of two (up to 16) dividing the address of every batch's operand.
inline int64_t alignment(const void* data, int64_t batch_stride_bytes) {
  const uint64_t bits =
      reinterpret_cast<uintptr_t>(data) | static_cast<uint64_t>(batch_stride_bytes) | 16;
  return static_cast<int64_t>(bits & (~bits + 1));
}

inline Status layout(cublasLtMatrixLayout_t* out, cudaDataType_t t, int64_t rows, int64_t cols,
                     int64_t ld, int64_t batches, int64_t batch_stride) {
  Status s = cublas_status(cublasLtMatrixLayoutCreate(out, t, rows, cols, ld),
                           "cublasLtMatrixLayoutCreate");
  if (s.ok() && batches > 1) {
    const int32_t count = static_cast<int32_t>(batches);
    s = cublas_status(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof count),
                      "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    if (s.ok()) {
      s = cublas_status(
          cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &batch_stride, sizeof batch_stride),
          "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
  }
  return s;
}

// Lt's A is our B: (cols x inner) column-major with ld b.ld, or for b_transposed the [cols, inner]
// row-major weight, which is (inner x cols) column-major with op T. Lt's B is our A (inner x rows,
// ld a.ld), its C ours (cols x rows, ldc).
inline Status make_plan(cublasLtHandle_t lt, const Shape& g, Operand a, Operand b, int64_t ldc,
                        int64_t c_batch_stride, const int64_t (&aligned)[3],
                        int64_t scratch_bytes, Plan* plan) {
  const cudaDataType_t in = cuda_type(g.in_type), out = cuda_type(g.out_type);
  Status s = cublas_status(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                           "cublasLtMatmulDescCreate");
  if (s.ok() && g.b_transposed) {
    const cublasOperation_t op = CUBLAS_OP_T;
    s = cublas_status(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op),
        "cublasLtMatmulDescSetAttribute(TRANSA)");
  }
  if (s.ok()) {
    s = g.b_transposed ? layout(&plan->a, in, g.inner, g.cols, b.ld, g.batches, b.batch_stride)
                       : layout(&plan->a, in, g.cols, g.inner, b.ld, g.batches, b.batch_stride);
  }
  if (s.ok()) s = layout(&plan->b, in, g.inner, g.rows, a.ld, g.batches, a.batch_stride);
  if (s.ok()) s = layout(&plan->c, out, g.cols, g.rows, ldc, g.batches, c_batch_stride);
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
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (s.ok() && g.no_split_reduction) {
    s = cublas_status(cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                          sizeof reduction),
                      "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
  }
  cublasLtMatmulHeuristicResult_t results[kShortInnerCandidates] = {};
  int found = 0;
  if (s.ok()) {
    const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(
        lt, plan->desc, plan->a, plan->b, plan->c, plan->c, pref,
        g.short_inner ? kShortInnerCandidates : 1, results, &found);
    plan->use_gemm_ex = asked != CUBLAS_STATUS_SUCCESS || found == 0 ||
                        results[0].state != CUBLAS_STATUS_SUCCESS;
    const int chosen = plan->use_gemm_ex || !g.short_inner ? 0
                                                            : short_inner_choice(g, results, found);
    plan->algo = results[chosen].algo;
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  return s;
}

// C[b] = A[b] @ op(B[b]) for b < g.batches on the context's stream: cuBLASLt with the shape's
// cached plan, or cublasGemmEx where the heuristic offers no algorithm. The caller holds
// ctx.h.mutex.
inline Status gemm(const Context& ctx, const Shape& g, Operand a, Operand b, void* c, int64_t ldc,
                   int64_t c_batch_stride) {
  DeviceHandle& h = ctx.h;
  const float alpha = 1.f, beta = 0.f;
  const int64_t in_bytes = element_size(g.in_type), out_bytes = element_size(g.out_type);
  if (g.batches == 1) a.batch_stride = b.batch_stride = c_batch_stride = 0;
  const int64_t aligned[3] = {alignment(a.data, a.batch_stride * in_bytes),
                              alignment(b.data, b.batch_stride * in_bytes),
                              alignment(c, c_batch_stride * out_bytes)};
  const PlanKey key = {static_cast<int64_t>(g.in_type), static_cast<int64_t>(g.out_type),
                       g.b_transposed, g.short_inner, g.batches, g.rows, g.cols, g.inner,
                       a.ld, b.ld, ldc, a.batch_stride, b.batch_stride, c_batch_stride,
                       aligned[0], aligned[1], aligned[2], ctx.scratch_bytes,
                       g.no_split_reduction};
  auto plan = std::find_if(h.plans.begin(), h.plans.end(),
                           [&key](const Plan& p) { return p.key == key; });
  if (plan == h.plans.end()) {
    if (h.plans.size() == kMaxPlans) {
      destroy(h.plans.front());
      h.plans.pop_front();
    }
    Plan fresh;
    fresh.key = key;
    // Host work only, but it may be the first call of a shape inside the caller's graph capture.
    const RelaxedCaptureScope relaxed;
    if (Status s = make_plan(h.lt, g, a, b, ldc, c_batch_stride, aligned, ctx.scratch_bytes,
                             &fresh);
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
  const cudaDataType_t in = cuda_type(g.in_type), out = cuda_type(g.out_type);
  const cublasOperation_t op_b = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  // cublasSetStream puts the handle back on cuBLAS's default workspace pool (memory of its own,
  // shared across streams): the call's scratch replaces it, or none at all.
  Status s = cublas_status(cublasSetStream(h.handle, ctx.stream), "cublasSetStream");
  if (s.ok()) {
    s = cublas_status(
        cublasSetWorkspace(h.handle, ctx.scratch, static_cast<size_t>(ctx.scratch_bytes)),
        "cublasSetWorkspace");
  }
  if (!s.ok()) return s;
  if (g.batches == 1) {
    return cublas_status(cublasGemmEx_64(h.handle, op_b, CUBLAS_OP_N, g.cols, g.rows, g.inner,
                                         &alpha, b.data, in, b.ld, a.data, in, a.ld, &beta, c,
                                         out, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmEx");
  }
  return cublas_status(
      cublasGemmStridedBatchedEx_64(h.handle, op_b, CUBLAS_OP_N, g.cols, g.rows, g.inner, &alpha,
                                    b.data, in, b.ld, b.batch_stride, a.data, in, a.ld,
                                    a.batch_stride, &beta, c, out, ldc, c_batch_stride,
                                    g.batches, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

}  // namespace latentkv::detail::lt
