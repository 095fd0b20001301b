// cuBLAS GEMMs plus a stack-copy kernel: the unfused CUDA baseline (see baseline_cublas.h).
#include "baseline_cublas.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_check.h"

namespace latentkv::bench {
namespace {

// cuBLAS's own workspace, set once so that capture never has it allocate (PyTorch does the same).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kCopyThreads = 256;

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// torch.stack([k, v]) on contiguous halves: out0 = k, out1 = v, in one launch (as torch.cat's
// kernel does), grid-stride over both halves in `Unit`-sized pieces.
template <typename Unit>
__global__ void stack_kv_kernel(const Unit* __restrict__ k, const Unit* __restrict__ v,
                                Unit* __restrict__ out0, Unit* __restrict__ out1, int64_t units) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < 2 * units;
       i += stride) {
    if (i < units) {
      out0[i] = k[i];
    } else {
      out1[i - units] = v[i - units];
    }
  }
}

template <typename Unit>
void launch_stack_kv(const void* k, const void* v, void* out0, void* out1, int64_t bytes,
                     Stream stream) {
  const int64_t units = bytes / static_cast<int64_t>(sizeof(Unit));
  const int64_t blocks = std::min<int64_t>((2 * units + kCopyThreads - 1) / kCopyThreads, 65536);
  stack_kv_kernel<Unit><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
      static_cast<const Unit*>(k), static_cast<const Unit*>(v), static_cast<Unit*>(out0),
      static_cast<Unit*>(out1), units);
  BENCH_CHECK_LAUNCH();
}

}  // namespace

void cublas_gemm(cublasContext* handle, DType dtype, int64_t m, int64_t n, int64_t k,
                 const void* a, const void* b, void* c) {
  // Row-major c = a @ b is column-major c^T = b^T @ a^T: cuBLAS sees an (n x k) @ (k x m) product
  // of the same memory, with no transposes.
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t type = cuda_type(dtype);
  BENCH_CHECK(cublasGemmEx_64(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, type, n, a,
                               type, k, &beta, c, type, n, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

void cublas_gemm_nt(cublasContext* handle, DType dtype, int64_t m, int64_t n, int64_t k,
                    const void* a, int64_t lda, const void* w, int64_t ldw, void* c, int64_t ldc) {
  // Column-major, c^T [n, m] = w [n, k] @ a^T [k, m]: w's rows are column-major w^T, transposed.
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t type = cuda_type(dtype);
  BENCH_CHECK(cublasGemmEx_64(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, type, ldw, a,
                               type, lda, &beta, c, type, ldc, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

CublasHandle::CublasHandle(Stream stream) {
  BENCH_CHECK(cublasCreate(&handle_));
  BENCH_CHECK(cublasSetStream(handle_, stream));
  BENCH_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  BENCH_CHECK(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
}

CublasHandle::~CublasHandle() {
  // Teardown errors would only hide the first one; the bench exits right after a failure anyway.
  cublasDestroy(handle_);
  cudaFree(workspace_);
}

CublasBaseline::CublasBaseline(const Problem& problem, Stream stream)
    : problem_(problem), stream_(stream), handle_(stream) {
  const size_t elem = static_cast<size_t>(element_size(problem.dtype));
  const size_t t = static_cast<size_t>(problem.tokens());
  BENCH_CHECK(cudaMalloc(&latent_, elem * t * static_cast<size_t>(problem.rank)));
  BENCH_CHECK(cudaMalloc(&k_, elem * t * static_cast<size_t>(problem.kv_width())));
  BENCH_CHECK(cudaMalloc(&v_, elem * t * static_cast<size_t>(problem.kv_width())));
}

CublasBaseline::~CublasBaseline() {
  // Teardown errors would only hide the first one; the bench exits right after a failure anyway.
  cudaFree(v_);
  cudaFree(k_);
  cudaFree(latent_);
}

void CublasBaseline::run(const Args& args) {
  const int64_t t = problem_.tokens(), d = problem_.model_dim, r = problem_.rank;
  const int64_t n = problem_.kv_width();
  const DType dt = problem_.dtype;
  cublas_gemm(handle_.get(), dt, t, r, d, args.hidden, args.w_down, latent_);
  cublas_gemm(handle_.get(), dt, t, n, r, latent_, args.w_up_k, k_);
  cublas_gemm(handle_.get(), dt, t, n, r, latent_, args.w_up_v, v_);

  const int64_t elem = element_size(dt);
  const int64_t half_bytes = t * n * elem;
  char* out0 = static_cast<char*>(args.out);
  char* out1 = out0 + args.out_stride_kv * elem;
  // 16-byte pieces where both halves allow it (cudaMalloc'd temporaries are 256-byte aligned).
  const bool wide = half_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(out0) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out1) % 16 == 0;
  if (wide) {
    launch_stack_kv<uint4>(k_, v_, out0, out1, half_bytes, stream_);
  } else {
    launch_stack_kv<uint16_t>(k_, v_, out0, out1, half_bytes, stream_);
  }
}

}  // namespace latentkv::bench
