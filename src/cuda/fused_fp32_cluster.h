// cuda-fused's cluster configuration (fused_fp32_cluster.cu), called by the strategy's launcher
// in fused_fp32.cu: the fast path for 16-byte aligned problems on sm_90, where a thread-block
// cluster shares each token tile's work so every block fetches only a slice of the weights.
#pragma once

#include "latentkv/latentkv.h"
#include "cuda/device_facts.h"

namespace latentkv::detail {

// Whether the cluster kernel takes this call: sm_90 code and device, 16-byte aligned rows of every
// input (D, R, N, the strides and the pointers), and its shared-memory plan within the device's
// limit. Host-only checks on values already at hand (no driver call after the first).
bool fused_cluster_takes(const Problem& p, const Args& a, const DeviceFacts& f);

// Launches it (fused_cluster_takes must have said yes) with heuristics.h's cluster size.
Status run_fused_cluster(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream);
// The same with the cluster size chosen (1..kFusedClusterMaxBlocks, shared memory checked by the
// caller; dev/fused_cluster_probe.cu compares them).
Status run_fused_cluster(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream,
                         int blocks);

}  // namespace latentkv::detail
