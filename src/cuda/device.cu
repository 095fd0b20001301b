// CUDA device discovery, cached once per process: run() must not query the driver on every call.
#include <cuda_runtime.h>

#include "backends.h"
#include "cuda/cuda_check.h"

namespace latentkv::detail {

bool cuda_device_present() {
  static const bool present = [] {
    const RelaxedCaptureScope relaxed;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error so it does not leak to the caller
      return false;
    }
    return count > 0;
  }();
  return present;
}

}  // namespace latentkv::detail
