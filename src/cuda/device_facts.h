// Per-device facts the CUDA strategies need on every call (SM count, compute capability, the
// opt-in shared-memory limit, cooperative launch support), read once per device into one cache:
// run() is on the hot path and must not query the driver each time. A kernel family that needs a
// setup step once per device (opting its kernels in to more than 48 KB of dynamic shared memory)
// gets it through prepared_device<Family> (or prepare<Family> with facts already in hand), whose
// failure every later call reports.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <mutex>

#include "cuda/cuda_check.h"

namespace latentkv::detail {

struct DeviceFacts {
  int device = 0;  // the tracked device number these facts are of
  int sm_count = 0;
  int major = 0, minor = 0;  // compute capability
  size_t smem_optin = 0;     // bytes of shared memory one block may opt in to (227 KB on Hopper)
  size_t smem_per_sm = 0;    // bytes of shared memory an SM has (228 KB on Hopper)
  bool cooperative_launch = false;
  Status status;  // the queries' outcome
};

// The facts of `device` (a tracked device number) and of the current device (device_facts.cu).
Status device_facts(int device, const DeviceFacts** out);
Status current_device_facts(const DeviceFacts** out);

// Family's static Status setup(const DeviceFacts&) run once on the device `f` is of (its outcome
// every later call returns). For a sub-configuration handed facts its caller already has: no
// second driver query on the call's path.
template <typename Family>
Status prepare(const DeviceFacts& f) {
  static std::array<std::once_flag, kMaxTrackedDevices> once;
  static std::array<Status, kMaxTrackedDevices> setup;
  std::call_once(once[f.device], [&f] {
    const RelaxedCaptureScope relaxed;
    setup[f.device] = Family::setup(f);
  });
  return setup[f.device];
}

// The current device's facts after Family's setup has run once on it. The caches live as long as
// the process.
template <typename Family>
Status prepared_device(const DeviceFacts** out) {
  if (Status s = current_device_facts(out); !s.ok()) return s;
  return prepare<Family>(**out);
}

}  // namespace latentkv::detail
