// Internal interface between the API layer (api.cpp: validation, dispatch) and the backends.
// Every function here is called only after the API layer has validated the problem and arguments,
// so backends may assume positive dimensions, non-null pointers and non-overlapping strides.
#pragma once

#include "latentkv/latentkv.h"

namespace latentkv::detail {

// CPU backend (src/cpu/). float32 only.
Status run_cpu_blocked(const Problem& problem, const Args& args);

// CUDA backend (src/cuda/). Built whenever the CUDA toolkit is found; device presence is a runtime
// question.
bool cuda_device_present();
// Size and dtype limits of the fused kernel (shared memory, index widths); no device query.
Status cuda_fused_supports(const Problem& problem);
Status run_cuda_fused(const Problem& problem, const Args& args, Stream stream);
// The fused kernel is the faster strategy for this float32 problem (few tokens, small weights).
bool cuda_fused_preferred(const Problem& problem);

// cuBLAS strategy (src/cuda/gemm_cublas.cu): all dtypes and layouts; needs somewhere to put the
// latent (args.latent or the workspace). The workspace it asks for also holds cuBLAS's scratch.
int64_t cuda_gemm_workspace_size(const Problem& problem, bool with_latent);
Status cuda_gemm_supports(const Problem& problem, const Args& args);
Status run_cuda_gemm(const Problem& problem, const Args& args, Stream stream);

// Decode strategy: few tokens against large weights, the weights streamed over every SM. float32
// runs FFMA kernels (src/cuda/decode_stream.cu, T <= 16), bf16/fp16 one cooperative
// tensor-core kernel (src/cuda/decode_tensor_core.cu, T <= 16); the cuda_decode_* functions
// (src/cuda/decode.cpp) pick by dtype. *_fits looks at the problem alone (sizes, shared
// memory); cuda_decode_supports adds the arguments, the same for both (16-byte weight rows, the
// workspace); *_preferred says decode is the faster strategy for the problem.
int64_t cuda_decode_workspace_size(const Problem& problem);
Status cuda_decode_supports(const Problem& problem, const Args& args);
bool cuda_decode_preferred(const Problem& problem);
Status run_cuda_decode(const Problem& problem, const Args& args, Stream stream);

// Bytes of w_down, w_up_k and w_up_v together (what a decode call streams).
inline int64_t weight_bytes(const Problem& p) {
  return (p.model_dim * p.rank + 2 * p.rank * p.kv_width()) * element_size(p.dtype);
}

int64_t cuda_decode_fp32_workspace_size(const Problem& problem);
Status cuda_decode_fp32_fits(const Problem& problem);
bool cuda_decode_fp32_preferred(const Problem& problem);
Status run_cuda_decode_fp32(const Problem& problem, const Args& args, Stream stream);

int64_t cuda_decode_tc_workspace_size(const Problem& problem);
Status cuda_decode_tc_fits(const Problem& problem);
bool cuda_decode_tc_preferred(const Problem& problem);
Status run_cuda_decode_tc(const Problem& problem, const Args& args, Stream stream);

}  // namespace latentkv::detail
