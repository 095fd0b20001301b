// The unfused CUDA baseline of the MLA KV path: the same math the way an eager engine runs it
// (vLLM's MLA prefill path, transformers' DeepseekV3Attention): cuBLAS GEMMs (cublasGemmEx, the
// dtype in and out, float32 compute) and a separate simple kernel per step, each a launch:
//   stage A   ckv = hidden @ [W_qa ; W_kva]^T          one GEMM into a [T, Rq + R + dr] temporary
//             q_a = rmsnorm(ckv[:, :Rq]) * g_q        (Rq > 0)
//             c   = rmsnorm(ckv[:, Rq:Rq+R]) * g_kv   into a [T, R] temporary
//             rope(ckv[:, Rq+R:]) in place            positions + cos_sin_cache, or cos/sin
//             cache[slot[t]] = [c | k_pe]             the scatter (concat_and_cache_mla)
//   stage B   (alone: c and k_pe gathered from the cache by slot first)
//             kv  = c @ W_kvb^T                       into a [T, H * (dn + dv)] temporary
//             K = [kv[:, :, :dn] | k_pe broadcast], V = kv[:, :, dn:]   one concat/split kernel
// Rounded where torch rounds (each GEMM's output, normed.to(dtype) then weight * normed, each RoPE
// product and sum in the dtype), so its error is the same-precision unfused error that the fused
// path's bf16/fp16 tolerance is twice of. Temporaries and cuBLAS's workspace are allocated once:
// run() allocates nothing and can be captured in a CUDA graph.
#pragma once

#include "baseline_cublas.h"
#include "latentkv/latentkv.h"

namespace latentkv::bench {

class MlaCublasBaseline {
 public:
  MlaCublasBaseline(const MlaProblem& problem, Stream stream);
  ~MlaCublasBaseline();
  MlaCublasBaseline(const MlaCublasBaseline&) = delete;
  MlaCublasBaseline& operator=(const MlaCublasBaseline&) = delete;

  // args: device pointers with contiguous strides (contiguous_mla_args), q_a's weight rows directly
  // followed by kv_a's where Rq > 0 and stage A runs; stage B alone reads the cache by slot.
  // Enqueues on the stream.
  void run(const MlaArgs& args);

 private:
  template <typename T, typename Rope>
  void run_typed(const MlaArgs& args);

  MlaProblem problem_;
  Stream stream_;
  CublasHandle handle_;
  void* ckv_ = nullptr;   // [T, Rq + R + dr]: the first GEMM's output, k_pe rotated in place
  void* c_ = nullptr;     // [T, R]: c normalized (stage A) or gathered (stage B alone)
  void* k_pe_ = nullptr;  // [T, dr]: gathered (stage B alone)
  void* kv_ = nullptr;    // [T, H * (dn + dv)]
};

}  // namespace latentkv::bench
