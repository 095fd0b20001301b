// CUDA and cuBLAS error checks for latentkv-bench. In a command-line tool a failed call has nothing
// to recover: print the call, where it was and the error, and exit 1. (The library instead returns
// a Status; see src/cuda/cuda_check.h.)
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace latentkv::bench {

[[noreturn]] inline void cuda_failed(const char* call, const char* file, int line,
                                     const char* name, const char* text) {
  std::fflush(stdout);
  std::fprintf(stderr, "latentkv-bench: %s failed at %s:%d: %s: %s\n", call, file, line, name,
               text);
  std::exit(1);
}

inline void check_call(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) {
    cuda_failed(call, file, line, cudaGetErrorName(err), cudaGetErrorString(err));
  }
}

inline void check_call(cublasStatus_t err, const char* call, const char* file, int line) {
  if (err != CUBLAS_STATUS_SUCCESS) {
    cuda_failed(call, file, line, cublasGetStatusName(err), cublasGetStatusString(err));
  }
}

}  // namespace latentkv::bench

// A CUDA runtime or cuBLAS call that must succeed.
#define BENCH_CHECK(call) ::latentkv::bench::check_call((call), #call, __FILE__, __LINE__)

// After a kernel launch: the launch error (bad configuration) shows here, not at the <<<>>>.
#define BENCH_CHECK_LAUNCH() BENCH_CHECK(cudaGetLastError())
