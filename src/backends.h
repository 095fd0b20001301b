// What the projection's strategy table (strategies.cpp) calls in the backends: per strategy,
// whether it takes a problem, the workspace it needs and its launcher. Called only after the API
// layer has validated the call and found every dimension positive (a zero dimension never reaches
// a strategy: run_*_zero_size writes what the empty sums give), so the backends may assume
// positive dimensions, non-null pointers and non-overlapping strides.
#pragma once

#include <cstdint>

#include "latentkv/latentkv.h"
#include "strategy_table.h"

namespace latentkv::detail {

// The projection's strategies, in fallback order (strategies.cpp).
const StrategyTable<Problem, Args>& projection_strategies();

// ---- CPU (src/cpu/), float32 ----
Status run_cpu_blocked(const Problem& problem, const Args& args);
// A zero dimension: out zeros where R or D is 0 (empty sums), the latent zeros where D is 0 and
// computed where only N is 0; nothing where T is 0. Any dimension may be 0 here.
Status run_cpu_zero_size(const Problem& problem, const Args& args);

// ---- CUDA (src/cuda/): always compiled; a device is a runtime question ----
bool cuda_device_present();
// kUnsupported naming `strategy` and the device's compute capability when it is below major.0.
Status cuda_require_compute_capability(int major, const char* strategy);
// run_cpu_zero_size's result, written on the stream.
Status run_cuda_zero_size(const Problem& problem, const Args& args, Stream stream);

// cuda-fused (fused_fp32.cu): the dtype, its int32 indexing and the device's shared memory.
Status cuda_fused_fits(const Problem& problem);
Status run_cuda_fused(const Problem& problem, const Args& args, Stream stream);

// cuda-gemm (gemm_cublas.cu): every dtype and layout; needs somewhere to put the latent
// (args.latent or the workspace). The workspace it asks for also holds cuBLAS's scratch.
int64_t cuda_gemm_workspace_size(const Problem& problem, bool with_latent);
Status cuda_gemm_supports(const Problem& problem, const Args& args);
Status run_cuda_gemm(const Problem& problem, const Args& args, Stream stream);

// cuda-decode, two rows of one strategy: float32 on FFMA kernels (decode_stream.cu), bf16/fp16 on
// one cooperative tensor-core kernel for sm_90 (decode_tensor_core.cu). *_fits looks at the
// problem alone and asks no device; *_workspace_size is defined only for a problem *_fits accepts
// (the rows ask it for no other).
// cuda_decode_args is what both ask of the arguments: 16-byte weight rows, a workspace of
// `workspace_bytes` (strategies.cpp).
Status cuda_decode_args(const Problem& problem, const Args& args, int64_t workspace_bytes);
int64_t cuda_decode_fp32_workspace_size(const Problem& problem);
Status cuda_decode_fp32_fits(const Problem& problem);
Status run_cuda_decode_fp32(const Problem& problem, const Args& args, Stream stream);
int64_t cuda_decode_tc_workspace_size(const Problem& problem);
Status cuda_decode_tc_fits(const Problem& problem);
// kUnsupported where the build holds no sm_90 code for the kernel (device present).
Status cuda_decode_tc_compiled();
Status run_cuda_decode_tc(const Problem& problem, const Args& args, Stream stream);

}  // namespace latentkv::detail
