// The test-only late writer of late_writer.h: one kernel and its programmatic launch.
#include "late_writer.h"

namespace latentkv::testing {
namespace {

__global__ void late_copy_kernel(const unsigned char* src, unsigned char* dst, size_t bytes,
                                 uint64_t spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(500);
#endif
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < spin_ns);
  const size_t first = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  const size_t step = size_t{gridDim.x} * blockDim.x;
  if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | bytes) % 16 == 0) {
    for (size_t i = first; i < bytes / 16; i += step) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
    for (size_t i = first; i < bytes; i += step) dst[i] = src[i];
  }
}

}  // namespace

bool late_writer_available() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
             cudaSuccess &&
         major >= 9;
}

cudaError_t late_copy(const void* src, void* dst, size_t bytes, uint64_t spin_ns,
                      cudaStream_t stream) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  // Few blocks, all resident at once: every block has triggered as soon as the grid starts.
  config.gridDim = dim3(static_cast<unsigned>(bytes / 65536 + 1 < 64 ? bytes / 65536 + 1 : 64));
  config.blockDim = dim3(256);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, late_copy_kernel, static_cast<const unsigned char*>(src),
                            static_cast<unsigned char*>(dst), bytes, spin_ns);
}

}  // namespace latentkv::testing
