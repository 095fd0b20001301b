// A test-only kernel that makes the chained-call tests deterministic: launched as a programmatic
// dependent (sm_90), it lets the next kernel launch at once (griddepcontrol.launch_dependents),
// waits for the kernel before it, spins for `spin_ns`, and only then copies `bytes` from src to
// dst. A kernel launched after it that touches dst before its own griddepcontrol.wait reads what
// dst held before (the poison), whatever the timing of the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace latentkv::testing {

// False below sm_90 (no programmatic launch: the copy is plain stream order, nothing to probe).
bool late_writer_available();
cudaError_t late_copy(const void* src, void* dst, size_t bytes, uint64_t spin_ns,
                      cudaStream_t stream);

}  // namespace latentkv::testing
