// Programmatic dependent launch (PDL, sm_90) from inside a kernel: let the next kernel in the
// stream start launching, and wait until the previous one has finished and its memory is visible.
// The kernel after must be launched with cudaLaunchAttributeProgrammaticStreamSerialization for
// either to matter; on older architectures both compile to nothing (plain stream order).
#pragma once

#include <cuda_runtime.h>

namespace latentkv::detail {

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

__device__ __forceinline__ void wait_for_previous_stage() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

}  // namespace latentkv::detail
