// A stream forked from the caller's stream for a part of one call that needs no order against the
// rest of it (cuda-mla-gemm's stage B: the V GEMM beside the K GEMM). fork() makes the branch wait
// on the caller's stream and join() makes the caller's stream wait on the branch, so the call
// stays ordered on the caller's stream and asynchronous to the host, and a CUDA graph captured from
// that stream holds the two parts as parallel branches (events record and wait inside a capture).
// The branch has the caller's stream priority: the library never raises its work above the
// caller's.
//
// One branch per caller stream: a stream under capture must not share its branch with another
// caller's work, since a branch stays in the capture until it ends. cudaStreamPerThread is one
// handle for a stream per host thread, so its branches are per thread too. Branches are made on
// first use, under the device handle's mutex (lt_matmul.h), and kept for the process; past
// kMaxStreamBranches caller streams a call runs its parts in order on the caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <deque>
#include <thread>

#include "cuda/cuda_check.h"
#include "latentkv/latentkv.h"
#include "validation.h"

namespace latentkv::detail {

constexpr size_t kMaxStreamBranches = 64;

struct StreamBranch {
  Stream caller = nullptr;
  std::thread::id thread;  // the thread whose cudaStreamPerThread `caller` is; else unset
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;

  // The branch waits for everything enqueued on the caller's stream so far.
  Status fork() const {
    LATENTKV_RETURN_IF_ERROR(cuda_status(cudaEventRecord(forked, caller), "cudaEventRecord"));
    return cuda_status(cudaStreamWaitEvent(stream, forked, 0), "cudaStreamWaitEvent");
  }
  // The caller's stream waits for the branch. Called after every fork, also when a launch on the
  // branch failed, so that the branch is never left outside the caller's order (or, under
  // capture, unjoined).
  Status join() const {
    LATENTKV_RETURN_IF_ERROR(cuda_status(cudaEventRecord(joined, stream), "cudaEventRecord"));
    return cuda_status(cudaStreamWaitEvent(caller, joined, 0), "cudaStreamWaitEvent");
  }
};

// The branch of `caller`, made on first use; *out is null (run in order on the caller's stream)
// once kMaxStreamBranches caller streams have one. The caller holds the mutex that guards
// `branches`.
inline Status stream_branch(std::deque<StreamBranch>& branches, Stream caller,
                            const StreamBranch** out) {
  *out = nullptr;
  const std::thread::id thread =
      caller == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id();
  for (const StreamBranch& b : branches) {
    if (b.caller == caller && b.thread == thread) {
      *out = &b;
      return Status::Ok();
    }
  }
  if (branches.size() == kMaxStreamBranches) return Status::Ok();
  // The first call on a stream may come inside the caller's graph capture: creating a stream and
  // events is host work, allowed under a relaxed capture mode.
  const RelaxedCaptureScope relaxed;
  int priority = 0;  // the default, where the caller's cannot be read
  if (cudaStreamGetPriority(caller, &priority) != cudaSuccess) {
    priority = 0;
    cudaGetLastError();  // not sticky: cleared so that no later launch check reports it
  }
  StreamBranch b;
  b.caller = caller;
  b.thread = thread;
  Status s = cuda_status(cudaStreamCreateWithPriority(&b.stream, cudaStreamNonBlocking, priority),
                         "cudaStreamCreateWithPriority");
  if (s.ok()) {
    s = cuda_status(cudaEventCreateWithFlags(&b.forked, cudaEventDisableTiming),
                    "cudaEventCreateWithFlags");
  }
  if (s.ok()) {
    s = cuda_status(cudaEventCreateWithFlags(&b.joined, cudaEventDisableTiming),
                    "cudaEventCreateWithFlags");
  }
  if (!s.ok()) {
    if (b.stream != nullptr) cudaStreamDestroy(b.stream);
    if (b.forked != nullptr) cudaEventDestroy(b.forked);
    return s;
  }
  branches.push_back(b);
  *out = &branches.back();
  return Status::Ok();
}

}  // namespace latentkv::detail
