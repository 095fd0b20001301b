// CUDA error handling for library code: turn a cudaError_t into a Status that names the call,
// never exit() or abort().
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "latentkv/latentkv.h"

namespace latentkv::detail {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return {StatusCode::kCudaError,
          std::string(what) + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err)};
}

}  // namespace latentkv::detail

#define LATENTKV_CUDA_RETURN(call)                                                    \
  do {                                                                                \
    ::latentkv::Status status_ = ::latentkv::detail::cuda_status((call), #call);      \
    if (!status_.ok()) return status_;                                                \
  } while (0)
