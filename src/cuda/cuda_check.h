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

// One-time setup (attribute queries, cuBLAS handles, their workspace) may happen on the first run()
// while the caller captures a CUDA graph in global mode, which forbids calls such as cudaMalloc on
// this thread. None of that setup is stream work, so it runs under relaxed capture mode.
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureScope() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// The current device, for the per-device caches of the CUDA strategies (device facts, cuBLAS
// handles, kernels opted in to large shared memory), which track the first kMaxTrackedDevices.
constexpr int kMaxTrackedDevices = 64;
inline Status current_tracked_device(int* device) {
  if (Status s = cuda_status(cudaGetDevice(device), "cudaGetDevice"); !s.ok()) return s;
  if (*device < 0 || *device >= kMaxTrackedDevices) {
    return {StatusCode::kUnsupported, "CUDA device " + std::to_string(*device) +
                                          " is beyond the " + std::to_string(kMaxTrackedDevices) +
                                          " devices latentkv tracks"};
  }
  return Status::Ok();
}

}  // namespace latentkv::detail

#define LATENTKV_CUDA_RETURN(call)                                                    \
  do {                                                                                \
    ::latentkv::Status status_ = ::latentkv::detail::cuda_status((call), #call);      \
    if (!status_.ok()) return status_;                                                \
  } while (0)
