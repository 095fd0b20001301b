// latentkv public C++ API: the low-rank KV projection of Multi-head Latent Attention.
//
//   latent = hidden @ w_down                       hidden (B, S, D), w_down (D, R)
//   k, v   = latent @ w_up_k, latent @ w_up_v      w_up_k, w_up_v (R, N = H*Dh)
//   out    = stack([k.view(B,S,H,Dh), v.view(B,S,H,Dh)])   -> (2, B, S, H, Dh)
//
// Framework-free: raw pointers, element strides and a CUDA stream. The contract follows CUTLASS's
// can_implement/run split: check() says whether a problem can run on a backend and, if not, which
// argument is wrong and why; run() calls check() and then launches. A refused call writes nothing.
// No function here throws, exits or aborts; every failure comes back as a Status.
#pragma once

#include <cstdint>
#include <string>

struct CUstream_st;  // cudaStream_t without including the CUDA headers

namespace latentkv {

using Stream = CUstream_st*;  // == cudaStream_t; nullptr is the legacy default stream

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // a dimension, pointer or stride is wrong
  kUnsupported,         // valid, but this backend cannot run it (dtype, size limits)
  kBackendUnavailable,  // the backend is not compiled in or has no device
  kCudaError,           // a CUDA call or launch failed
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* to_string(StatusCode code);

enum class DType { kFloat32, kBFloat16, kFloat16 };
const char* to_string(DType dtype);
int64_t element_size(DType dtype);

enum class Backend { kAuto, kCpu, kCuda };
const char* to_string(Backend backend);

// The shape of one call. T = batch * seq tokens, N = heads * head_dim output columns per half.
// Any dimension may be 0 (negative ones are refused): run() then writes what the unfused matmuls
// give, without a strategy: nothing where T or N is 0 (but the latent, where only N is 0), out
// zeros where R or D is 0 (empty sums), the latent zeros where D is 0.
struct Problem {
  int64_t batch = 0;      // B
  int64_t seq = 0;        // S
  int64_t model_dim = 0;  // D
  int64_t rank = 0;       // R, the latent width
  int64_t heads = 0;      // H
  int64_t head_dim = 0;   // Dh
  DType dtype = DType::kFloat32;

  int64_t tokens() const { return batch * seq; }
  int64_t kv_width() const { return heads * head_dim; }
  // 2*T*D*R + 4*T*R*N
  double flops() const;
  // Each input read once, each output written once (the latent output not included).
  double min_bytes() const;
  std::string to_string() const;
};

// Pointers and element strides. The innermost dimension of every tensor is contiguous (stride 1);
// outer strides may be padded but never make rows overlap (stride >= extent * inner stride). A
// tensor with no elements (a zero dimension) may be null.
struct Args {
  const void* hidden = nullptr;  // [B, S, D]
  int64_t hidden_stride_batch = 0;
  int64_t hidden_stride_seq = 0;

  const void* w_down = nullptr;  // [D, R]
  int64_t w_down_stride_row = 0;

  const void* w_up_k = nullptr;  // [R, H*Dh]
  int64_t w_up_k_stride_row = 0;

  const void* w_up_v = nullptr;  // [R, H*Dh]
  int64_t w_up_v_stride_row = 0;

  void* out = nullptr;  // [2, B, S, H, Dh]; out[0] = K, out[1] = V
  int64_t out_stride_kv = 0;
  int64_t out_stride_batch = 0;
  int64_t out_stride_seq = 0;
  int64_t out_stride_head = 0;

  void* latent = nullptr;  // [B, S, R], optional: written when not null (what the MLA cache stores)
  int64_t latent_stride_batch = 0;
  int64_t latent_stride_seq = 0;

  // Device scratch: cuda-gemm keeps the latent there when args.latent is null and gives the rest
  // to cuBLAS (split-K partial sums), cuda-decode its partial sums (workspace_size() says how
  // much; 0 for the fused kernel). Its contents need no initialization and are not kept between
  // calls; it is used in stream order on options.stream, so calls on different streams need
  // different workspaces. May be null: strategies that need it are then skipped by kAuto and
  // refused when forced (cuda-gemm with args.latent runs without it, on cuBLAS algorithms that
  // need no scratch).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Args for densely packed tensors; latent may be null.
Args contiguous_args(const Problem& problem, const void* hidden, const void* w_down,
                     const void* w_up_k, const void* w_up_v, void* out, void* latent = nullptr);

// How the work is done. kAuto lets the dispatcher choose; the others force one strategy (for
// benchmarks and tests), and check() refuses a forced strategy that cannot take the problem.
enum class Strategy {
  kAuto,
  kCpuBlocked,  // CPU: blocked, vectorized, threaded over token tiles
  kCudaFused,   // CUDA: one launch, latent kept in shared memory (float32)
  kCudaGemm,    // CUDA: cuBLAS GEMMs on tensor cores / FFMA, K and V written straight into the
                // stacked output (no stack copy); the latent goes to args.latent or the workspace
  kCudaDecode,  // CUDA: few tokens (<= 16) and large weights: the weights streamed over every SM
                // (float32: three FFMA launches chained by programmatic dependent launch;
                // bf16/fp16, sm_90 only: one cooperative launch on tensor cores (TMA), a block
                // on every SM at once, so it does not run beside other kernels; where fewer SMs are available
                // than the device reports (MPS limits, green contexts) the launch is refused
                // with kUnsupported, and kAuto runs cuda-gemm instead); needs the workspace
  // The MLA path (latentkv/mla.h):
  kCpuMla,      // CPU: float32, the reference path
  kCudaMlaGemm, // CUDA: cuBLASLt GEMMs; norms, RoPE, the cache row and K's k_pe columns in one
                // pass over the first GEMM's output; K and V written in place by the second
  kCudaMlaDecode,  // CUDA, bf16/fp16, sm_80+: few tokens (<= 16): both stages' weights streamed
                   // over every SM into tensor-core GEMVs, norms/RoPE/cache in a small epilogue,
                   // stage B chained behind stage A (programmatic dependent launch, sm_90);
                   // needs the workspace for stage A and 16-byte aligned weight/hidden rows
};
const char* to_string(Strategy strategy);

struct Options {
  Backend backend = Backend::kAuto;
  Strategy strategy = Strategy::kAuto;
  Stream stream = nullptr;  // CUDA only: the stream run() enqueues on
};

// True when the backend is compiled in and (for CUDA) a device is present.
bool backend_available(Backend backend);
// kAuto resolves to kCuda when available, else kCpu.
Backend resolve_backend(Backend backend);
// The CPU backend's instructions for bf16 products on this machine: "avx512-bf16" (dot products,
// where the CPU has AVX512-BF16 and the environment variable LATENTKV_CPU_ISA is not "avx2") or
// "avx2" (bf16 widened to float32 FMAs). Decided once, at the first call that asks.
const char* cpu_bf16_isa();
// The CPU backend's decode regime for `dtype`: calls of at most this many tokens (B * S) split
// the weights' columns over the threads, so each weight streams from memory once across all of
// them; more tokens are dealt out to the threads in token tiles. 24 for bf16 where cpu_bf16_isa()
// says "avx512-bf16", else 6. (LatentKVProjection takes the op for bf16 on the CPU up to this
// bound, where the AVX512-BF16 products beat torch's.)
int cpu_split_tokens(DType dtype);

// Bytes of args.workspace that the strategy run() would choose, given a workspace, needs (for
// kAuto, also enough for the strategy it falls back to); 0 when it needs none (cuda-fused, the
// CPU). cuda-gemm asks for cuBLAS's scratch (32 MiB) on top of the latent, with or without a
// latent output. Without the workspace, run() falls back to a strategy that needs none where one
// takes the problem.
int64_t workspace_size(const Problem& problem, const Options& options = {},
                       bool with_latent = false);

// Validates everything run() needs; writes and launches nothing.
Status check(const Problem& problem, const Args& args, const Options& options = {});

// The strategy run() would use, or the refusal check() would give; options.strategy for a problem
// with a zero dimension, which no strategy computes.
Status select_strategy(const Problem& problem, const Args& args, const Options& options,
                       Strategy* strategy);

// check(), then compute. On CUDA the call is asynchronous on options.stream, allocates nothing,
// never synchronizes and may be captured in a CUDA graph. Pointers must live on the backend's side
// (host memory for kCpu, device memory for kCuda).
Status run(const Problem& problem, const Args& args, const Options& options = {});

}  // namespace latentkv

#include "latentkv/mla.h"  // the MLA KV path: MlaProblem, MlaArgs and their check()/run()
