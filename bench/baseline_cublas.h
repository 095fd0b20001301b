// The unfused CUDA baseline: what PyTorch eager does. Three cuBLAS GEMMs into temporaries
// (latent = hidden @ w_down, k = latent @ w_up_k, v = latent @ w_up_v), then one stack-copy kernel
// writing k and v into the [2, B, S, H, Dh] output: four launches, all on one stream. The handle,
// its workspace and the temporaries are allocated once, so run() allocates nothing and can be
// captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "latentkv/latentkv.h"

struct cublasContext;  // cublasHandle_t without including cuBLAS in C++ files

namespace latentkv::bench {

// Row-major c[m, n] = a[m, k] @ b[k, n] (packed) in dtype, accumulating in float32 as PyTorch's
// matmul does (no TF32 for float32).
void cublas_gemm(cublasContext* handle, DType dtype, int64_t m, int64_t n, int64_t k,
                 const void* a, const void* b, void* c);

// Row-major c[m, n] (row stride ldc) = a[m, k] (row stride lda) @ w[n, k]^T (row stride ldw): an
// nn.Linear with its [out, in] weight, in dtype, float32 accumulation.
void cublas_gemm_nt(cublasContext* handle, DType dtype, int64_t m, int64_t n, int64_t k,
                    const void* a, int64_t lda, const void* w, int64_t ldw, void* c, int64_t ldc);

// A cuBLAS handle on one stream with its own workspace, set once so that graph capture never has
// it allocate (PyTorch does the same).
class CublasHandle {
 public:
  explicit CublasHandle(Stream stream);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasContext* get() const { return handle_; }

 private:
  cublasContext* handle_ = nullptr;
  void* workspace_ = nullptr;
};

class CublasBaseline {
 public:
  CublasBaseline(const Problem& problem, Stream stream);
  ~CublasBaseline();
  CublasBaseline(const CublasBaseline&) = delete;
  CublasBaseline& operator=(const CublasBaseline&) = delete;

  // args: device pointers, contiguous (as contiguous_args makes them). Enqueues on the stream.
  void run(const Args& args);

 private:
  Problem problem_;
  Stream stream_;
  CublasHandle handle_;
  void* latent_ = nullptr;  // [T, R]
  void* k_ = nullptr;       // [T, N]
  void* v_ = nullptr;       // [T, N]
};

}  // namespace latentkv::bench
