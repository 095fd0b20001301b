// Per-device facts the CUDA kernels' host code needs on every call (SM count, the opt-in shared-
// memory limit), read once per device instead: run() is on the hot path and must not query the
// driver each time. Each kernel family gets its own cache, and with it a setup step run once per
// device (opting its kernels in to more than 48 KB of dynamic shared memory, checking a device
// capability), whose failure every later call reports.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <mutex>

#include "cuda/cuda_check.h"

namespace latentkv::detail {

struct DeviceFacts {
  int sm_count = 0;
  size_t smem_optin = 0;  // bytes of shared memory one block may opt in to (227 KB on Hopper)
  Status status;          // the queries' and the family's setup's outcome
};

// The current device's facts for kernel family Family, whose static Status setup(const
// DeviceFacts&) runs once per device after the queries. The caches live as long as the process.
template <typename Family>
Status current_device_facts(const DeviceFacts** out) {
  static std::array<std::once_flag, kMaxTrackedDevices> once;
  static std::array<DeviceFacts, kMaxTrackedDevices> facts;
  int device = 0;
  if (Status tracked = current_tracked_device(&device); !tracked.ok()) return tracked;
  std::call_once(once[device], [device] {
    const RelaxedCaptureScope relaxed;
    DeviceFacts& f = facts[device];
    int smem = 0;
    cudaError_t err = cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    f.smem_optin = static_cast<size_t>(smem);
    f.status = cuda_status(err, "cudaDeviceGetAttribute(MultiProcessorCount, "
                                "MaxSharedMemoryPerBlockOptin)");
    if (f.status.ok()) f.status = Family::setup(f);
  });
  *out = &facts[device];
  return (*out)->status;
}

}  // namespace latentkv::detail
