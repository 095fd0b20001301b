// The unfused CPU baseline: what PyTorch eager does, on one thread. Three GEMMs into temporaries
// (latent = hidden @ w_down, k = latent @ w_up_k, v = latent @ w_up_v), then the stack copy of k
// and v into the [2, B, S, H, Dh] output. The temporaries are allocated once, outside timing.
#pragma once

#include <vector>

#include "latentkv/latentkv.h"

namespace latentkv::bench {

class CpuBaseline {
 public:
  explicit CpuBaseline(const Problem& problem);  // float32 only
  // args: host pointers, contiguous (as contiguous_args makes them).
  void run(const Args& args);

 private:
  Problem problem_;
  std::vector<float> latent_;  // [T, R]
  std::vector<float> k_;       // [T, N]
  std::vector<float> v_;       // [T, N]
  std::vector<float> edge_;    // the zero-padded right-edge strip of a right-hand matrix
};

}  // namespace latentkv::bench
