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
// first use, under the device handle's mutex (lt_matmul.h), up to kMaxStreamBranches; past that a
// new caller stream takes over the least recently used branch that no capture holds (its old
// caller, if it calls again, takes over another), and runs its parts in order on its own stream
// only while every branch is inside a capture. A branch taken over keeps its pending work ahead
// of the new caller's (an extra dependency, never a missing one).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
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
  int priority = 0;        // the stream's, the caller's when it was made
  uint64_t last_call = 0;  // StreamBranches::calls at its caller's last call

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

// The branches of one device handle; a deque, so that a branch handed out stays where it is.
struct StreamBranches {
  std::deque<StreamBranch> list;
  uint64_t calls = 0;
};

// The priority of `caller`'s stream, the default where it cannot be read.
inline int stream_priority(Stream caller) {
  int priority = 0;
  if (cudaStreamGetPriority(caller, &priority) != cudaSuccess) {
    cudaGetLastError();  // not sticky: cleared so that no later launch check reports it
    return 0;
  }
  return priority;
}

inline Status make_branch_stream(int priority, cudaStream_t* stream) {
  return cuda_status(cudaStreamCreateWithPriority(stream, cudaStreamNonBlocking, priority),
                     "cudaStreamCreateWithPriority");
}

// Whether a capture holds `stream` (as its origin or through an event it waited on).
inline bool in_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return true;  // unknown: treated as held
  }
  return status != cudaStreamCaptureStatusNone;
}

// The branch of `caller`: its own, a new one while fewer than kMaxStreamBranches exist, else the
// least recently used one outside every capture, taken over (remade at the caller's priority
// where that differs). *out is null (run in order on the caller's stream) when every branch is
// inside a capture. The caller holds the mutex that guards `branches`.
inline Status stream_branch(StreamBranches& branches, Stream caller, const StreamBranch** out) {
  *out = nullptr;
  const std::thread::id thread =
      caller == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id();
  const uint64_t call = ++branches.calls;
  for (StreamBranch& b : branches.list) {
    if (b.caller == caller && b.thread == thread) {
      b.last_call = call;
      *out = &b;
      return Status::Ok();
    }
  }
  // The first call on a stream may come inside the caller's graph capture: creating a stream and
  // events is host work, allowed under a relaxed capture mode.
  const RelaxedCaptureScope relaxed;
  const int priority = stream_priority(caller);
  if (branches.list.size() == kMaxStreamBranches) {
    StreamBranch* oldest = nullptr;
    for (StreamBranch& b : branches.list) {
      if ((oldest == nullptr || b.last_call < oldest->last_call) && !in_capture(b.stream)) {
        oldest = &b;
      }
    }
    if (oldest == nullptr) return Status::Ok();
    if (oldest->priority != priority) {
      cudaStream_t remade = nullptr;
      LATENTKV_RETURN_IF_ERROR(make_branch_stream(priority, &remade));
      cudaStreamDestroy(oldest->stream);  // its pending work still runs; then it is released
      oldest->stream = remade;
      oldest->priority = priority;
    }
    oldest->caller = caller;
    oldest->thread = thread;
    oldest->last_call = call;
    *out = oldest;
    return Status::Ok();
  }
  StreamBranch b;
  b.caller = caller;
  b.thread = thread;
  b.priority = priority;
  b.last_call = call;
  Status s = make_branch_stream(priority, &b.stream);
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
  branches.list.push_back(b);
  *out = &branches.list.back();
  return Status::Ok();
}

}  // namespace latentkv::detail
