// CUDA device discovery and the per-device facts (device_facts.h), each read once per process or
// device: run() must not query the driver on every call.
#include <cuda_runtime.h>

#include <string>

#include "backends.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"

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

Status device_facts(int device, const DeviceFacts** out) {
  static std::array<std::once_flag, kMaxTrackedDevices> once;
  static std::array<DeviceFacts, kMaxTrackedDevices> facts;
  std::call_once(once[device], [device] {
    const RelaxedCaptureScope relaxed;
    DeviceFacts& f = facts[device];
    f.device = device;
    int smem = 0, smem_sm = 0, cooperative = 0;
    const struct {
      int* value;
      cudaDeviceAttr attribute;
    } queries[] = {{&f.sm_count, cudaDevAttrMultiProcessorCount},
                   {&f.major, cudaDevAttrComputeCapabilityMajor},
                   {&f.minor, cudaDevAttrComputeCapabilityMinor},
                   {&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin},
                   {&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
                   {&cooperative, cudaDevAttrCooperativeLaunch}};
    cudaError_t err = cudaSuccess;
    for (const auto& q : queries) {
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(q.value, q.attribute, device);
    }
    f.smem_optin = static_cast<size_t>(smem);
    f.smem_per_sm = static_cast<size_t>(smem_sm);
    f.cooperative_launch = cooperative != 0;
    f.status = cuda_status(err, "cudaDeviceGetAttribute(MultiProcessorCount, ComputeCapability, "
                                "MaxSharedMemoryPerBlockOptin, MaxSharedMemoryPerMultiprocessor, "
                                "CooperativeLaunch)");
  });
  *out = &facts[device];
  return (*out)->status;
}

Status current_device_facts(const DeviceFacts** out) {
  int device = 0;
  if (Status tracked = current_tracked_device(&device); !tracked.ok()) return tracked;
  return device_facts(device, out);
}

Status cuda_require_compute_capability(int major, const char* strategy) {
  const DeviceFacts* f = nullptr;
  if (Status s = current_device_facts(&f); !s.ok()) return s;
  if (f->major >= major) return Status::Ok();
  return {StatusCode::kUnsupported, std::string(strategy) + ": needs compute capability " +
                                        std::to_string(major) + ".0 (sm_" +
                                        std::to_string(major) + "0); the device has " +
                                        std::to_string(f->major) + "." +
                                        std::to_string(f->minor)};
}

}  // namespace latentkv::detail
