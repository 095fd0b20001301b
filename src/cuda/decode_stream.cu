// The decode strategy for float32 (Strategy::kCudaDecode on float32; bf16/fp16 take the tensor-core
// kernel of decode_tensor_core.cu): few tokens (T <= 16; where kAuto prefers it is in
// heuristics.h) against large weights. Any architecture; PDL's overlap needs sm_90. The cost is
// streaming the weights from HBM once, so the work is cut to put every SM on the weight stream with
// all of its loads in flight at once, and the stages are chained with programmatic dependent launch
// (PDL) so that the up-projection weights are already on their way while the down projection runs:
//   1. kv_proj_decode_fp32_down    grid (R / kDownCols column tiles, chunks of D): each block
//                      reads a (32 * loads) x kDownCols tile of w_down (every load issued before
//                      any use), multiplies by the staged hidden rows and writes
//                      partials[chunk][t][r]; chunks are few (~128-224 blocks in all).
//   2. kv_proj_decode_fp32_reduce  latent[t][r] = sum over chunks, in a fixed order
//                      (deterministic), for stage 3 and the caller's latent output.
//   3. kv_proj_decode_fp32_up      persistent, two blocks per SM, over tiles of 16 columns of
//                      [w_up_k | w_up_v] and all R <= 512 rows, in registers; the first tile's
//                      loads go out *before* waiting for stage 2, and each next tile's while the
//                      current one is multiplied by the latent and written straight into the
//                      stacked output (any head stride: heads need not be packed).
// On sm_90, stages 2 and 3 are launched with the programmatic-stream-serialization attribute
// (below it, plain stream order): their blocks start once every block of the previous stage is
// running, and cudaGridDependencySynchronize() holds them until that stage's memory is visible.
// Three launches on the caller's stream, no host synchronization, graph-capturable; the scratch
// (partials and the latent) is the caller's workspace. The element type stays a template
// parameter (the 16-byte vector width follows it), instantiated for float only.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "backends.h"
#include "cuda/common.h"
#include "cuda/convert.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

// The tile plan (tile_sizes.h); the token group per pass (kGroup: 1, 2 or 4, a template argument)
// is chosen by decode_fp32_token_group (heuristics.h).
constexpr int kMaxTokens = tiles::kDecodeStreamMaxTokens;
constexpr int kMaxGroup = tiles::kDecodeStreamMaxGroup;
constexpr int kThreads = tiles::kDecodeStreamThreads;  // 8 warps, every stage
constexpr int kWarps = kThreads / 32;
constexpr int kDownSlots = tiles::kDecodeStreamDownSlots;
constexpr int kUpLoads = tiles::kDecodeStreamUpLoads;
constexpr int kUpSlots = tiles::kDecodeStreamUpSlots;
constexpr int kMaxRank = tiles::kDecodeStreamMaxRank;
constexpr int kTargetBlocks = 128;  // stage 1 cuts D into chunks until about this many blocks
constexpr int kMaxDownLoads = 8;    // 16-byte weight loads per thread in stage 1 (<= 128 registers)
constexpr int kUpBlocksPerSm = 2;   // stage 3 is persistent: this many blocks per SM

// 16-byte vectors of the weights: 4 floats or 8 bf16/fp16.
template <typename T>
struct Vec {
  static constexpr int kWidth = 16 / sizeof(T);
};

// The vector's elements as floats.
template <typename T>
__device__ __forceinline__ void unpack(const uint4& raw, float (&f)[Vec<T>::kWidth]) {
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < Vec<T>::kWidth; ++i) f[i] = to_float(v[i]);
}

template <typename T>
struct DecodeParams : ActivationParams<T>, WeightParams<T> {
  T* latent_out;  // [B, S, R] or null
  int64_t latent_stride_batch, latent_stride_seq;
  float* partials;  // [chunks, T, R] workspace
  float* latent;    // [T, R] workspace
  int chunks, down_loads;  // stage 1: chunks of D, each down_loads * kDownSlots rows
};

// Stage 1. Block (column tile x, chunk y); thread = (column vector lane % 8, row slot
// warp * 4 + lane / 8); the thread's rows are slot, slot + 32, ... within the chunk.
template <typename T, int kGroup>
__global__ void __launch_bounds__(kThreads, 2)
    kv_proj_decode_fp32_down(const __grid_constant__ DecodeParams<T> p) {
  constexpr int kW = Vec<T>::kWidth;
  constexpr int kCols = 8 * kW;  // 64 (bf16/fp16) or 32 (fp32) latent columns per block
  static_assert(sizeof(T) != 4 || kCols == tiles::kDecodeStreamDownCols, "tile_sizes.h's plan");
  __shared__ float x[kMaxTokens][kMaxDownLoads * kDownSlots];  // hidden rows of the chunk
  __shared__ float reduce[kWarps][kGroup][kCols];              // per-warp partial sums
  allow_dependents();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slot = warp * 4 + lane / 8;
  const int col = blockIdx.x * kCols + (lane % 8) * kW;
  const int rows = p.down_loads * kDownSlots;
  const int d0 = blockIdx.y * rows;

  uint4 w[kMaxDownLoads];
#pragma unroll
  for (int i = 0; i < kMaxDownLoads; ++i) {
    const int d = d0 + slot + i * kDownSlots;
    w[i] = make_uint4(0, 0, 0, 0);
    if (i < p.down_loads && d < p.model_dim && col < p.rank) {
      w[i] = load_vector(p.w_down + d * p.w_down_stride + col);
    }
  }
  for (int i = threadIdx.x; i < p.tokens * rows; i += kThreads) {
    const int t = i / rows, r = i % rows;
    x[t][r] = d0 + r < p.model_dim
                  ? to_float(p.hidden[token_offset(t, p.seq, p.hidden_stride_batch,
                                                   p.hidden_stride_seq) + d0 + r])
                  : 0.f;
  }
  __syncthreads();

  for (int t0 = 0; t0 < p.tokens; t0 += kGroup) {
    float acc[kGroup][kW] = {};
#pragma unroll
    for (int i = 0; i < kMaxDownLoads; ++i) {
      if (i >= p.down_loads) break;
      float wf[kW];
      unpack<T>(w[i], wf);
#pragma unroll
      for (int t = 0; t < kGroup; ++t) {
        const float xv = t0 + t < p.tokens ? x[t0 + t][slot + i * kDownSlots] : 0.f;
#pragma unroll
        for (int c = 0; c < kW; ++c) acc[t][c] = fmaf(xv, wf[c], acc[t][c]);
      }
    }
    // The 4 row slots of a warp share columns (lanes 8 apart): fold them, then the 8 warps.
#pragma unroll
    for (int t = 0; t < kGroup; ++t) {
#pragma unroll
      for (int c = 0; c < kW; ++c) {
        float v = acc[t][c];
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < 8) reduce[warp][t][lane * kW + c] = v;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kGroup * kCols; i += kThreads) {
      const int t = t0 + i / kCols, r = blockIdx.x * kCols + i % kCols;
      if (t >= p.tokens || r >= p.rank) continue;
      float sum = 0.f;
#pragma unroll
      for (int g = 0; g < kWarps; ++g) sum += reduce[g][i / kCols][i % kCols];
      p.partials[(int64_t{blockIdx.y} * p.tokens + t) * p.rank + r] = sum;
    }
    __syncthreads();
  }
}

// Stage 2. Block = 32 consecutive elements of latent [T][R] (one per lane); warp w sums chunks
// w, w + 8, ... and the 8 warp sums meet in shared memory, in a fixed order (deterministic).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    kv_proj_decode_fp32_reduce(const __grid_constant__ DecodeParams<T> p) {
  __shared__ float warp_sums[kWarps][32];
  allow_dependents();
  wait_for_previous_stage();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int i = blockIdx.x * 32 + lane;
  const int64_t plane = int64_t{p.tokens} * p.rank;
  float sum = 0.f;
  if (i < plane) {
#pragma unroll 4
    for (int c = warp; c < p.chunks; c += kWarps) sum += p.partials[c * plane + i];
  }
  warp_sums[warp][lane] = sum;
  __syncthreads();
  if (warp != 0 || i >= plane) return;
#pragma unroll
  for (int w = 1; w < kWarps; ++w) sum += warp_sums[w][lane];
  p.latent[i] = sum;
  if (p.latent_out != nullptr) {
    const int t = i / p.rank, r = i % p.rank;
    p.latent_out[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + r] =
        from_float<T>(sum);
  }
}

// Stage 3 works on tiles of kCols = 4 * kW consecutive columns of [K | V] (32 for bf16/fp16, 16
// for fp32; one matrix per thread, since N is a multiple of the vector width); thread = (column
// vector lane % 4, row slot warp * 8 + lane / 4), its rows slot, slot + 64, ... (R <= 512).
template <typename T>
struct UpTile {
  static constexpr int kW = Vec<T>::kWidth;
  static constexpr int kCols = 4 * kW;
  static_assert(sizeof(T) != 4 || kCols == tiles::kDecodeStreamUpCols, "tile_sizes.h's plan");
};

// The thread's weight vectors of one tile, issued together (no use before the last is issued).
template <typename T>
__device__ __forceinline__ void load_up_tile(const DecodeParams<T>& p, int tile, int slot, int lane,
                                             uint4 (&w)[kUpLoads]) {
  const int N = p.kv_width;
  const int col = tile * UpTile<T>::kCols + (lane % 4) * UpTile<T>::kW;  // in [0, 2N)
  const bool is_v = col >= N;
  const T* base = is_v ? p.w_up_v + (col - N) : p.w_up_k + col;
  const int64_t ld = is_v ? p.w_up_v_stride : p.w_up_k_stride;
#pragma unroll
  for (int i = 0; i < kUpLoads; ++i) {
    const int k = slot + i * kUpSlots;
    w[i] = col < 2 * N && k < p.rank ? load_vector(base + k * ld) : make_uint4(0, 0, 0, 0);
  }
}

// out[:, :, tile's columns] = latent (shared memory, [T][R]) @ the tile's weights, token group by
// token group: partial sums over the thread's rows, folded across the warp's 8 row slots by
// shuffles, then across the 8 warps in shared memory.
template <typename T, int kGroup>
__device__ __forceinline__ void project_up_tile(const DecodeParams<T>& p, int tile, int slot,
                                                int lane, int warp, const uint4 (&w)[kUpLoads],
                                                const float* latent,
                                                float (*reduce)[kGroup][UpTile<T>::kCols]) {
  constexpr int kW = UpTile<T>::kW;
  constexpr int kCols = UpTile<T>::kCols;
  const int N = p.kv_width;
  for (int t0 = 0; t0 < p.tokens; t0 += kGroup) {
    float acc[kGroup][kW] = {};
#pragma unroll
    for (int i = 0; i < kUpLoads; ++i) {
      const int k = slot + i * kUpSlots;
      if (k >= p.rank) break;
      float wf[kW];
      unpack<T>(w[i], wf);
#pragma unroll
      for (int t = 0; t < kGroup; ++t) {
        const float a = t0 + t < p.tokens ? latent[(t0 + t) * p.rank + k] : 0.f;
#pragma unroll
        for (int c = 0; c < kW; ++c) acc[t][c] = fmaf(a, wf[c], acc[t][c]);
      }
    }
#pragma unroll
    for (int t = 0; t < kGroup; ++t) {
#pragma unroll
      for (int c = 0; c < kW; ++c) {
        float v = acc[t][c];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < 4) reduce[warp][t][lane * kW + c] = v;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kGroup * kCols; i += kThreads) {
      const int t = t0 + i / kCols, j = tile * kCols + i % kCols;
      if (t >= p.tokens || j >= 2 * N) continue;
      float sum = 0.f;
#pragma unroll
      for (int g = 0; g < kWarps; ++g) sum += reduce[g][i / kCols][i % kCols];
      const int kv = j >= N, n = j - kv * N;
      p.out[out_offset(p, kv, t, n)] = from_float<T>(sum);
    }
    __syncthreads();
  }
}

// Stage 3. Persistent blocks (about two per SM) walk the tiles gridDim.x apart with two register
// buffers: the next tile's weights are in flight while the current one is multiplied. The first
// tile's loads go out before the wait for stage 2, overlapping stages 1 and 2.
template <typename T, int kGroup>
__global__ void __launch_bounds__(kThreads, 2)
    kv_proj_decode_fp32_up(const __grid_constant__ DecodeParams<T> p) {
  extern __shared__ float4 smem_raw[];
  float* latent = reinterpret_cast<float*>(smem_raw);  // [T][R]
  __shared__ float reduce[kWarps][kGroup][UpTile<T>::kCols];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slot = warp * 8 + lane / 4;
  const int tiles = (2 * p.kv_width + UpTile<T>::kCols - 1) / UpTile<T>::kCols;

  uint4 w_a[kUpLoads], w_b[kUpLoads];
  int tile = blockIdx.x;
  load_up_tile(p, tile, slot, lane, w_a);
  // A use of w_a under a condition that never holds (T >= 1) keeps its loads above the wait:
  // without one, ptxas issues them after it, once stage 2 has ended.
  if (p.tokens < 0) {
    uint32_t any = 0;
#pragma unroll
    for (int i = 0; i < kUpLoads; ++i) any ^= w_a[i].x ^ w_a[i].y ^ w_a[i].z ^ w_a[i].w;
    p.latent[0] = __uint_as_float(any);
  }

  wait_for_previous_stage();
  for (int i = threadIdx.x; i < p.tokens * p.rank; i += kThreads) latent[i] = p.latent[i];
  __syncthreads();

  for (; tile < tiles; tile += 2 * gridDim.x) {
    const int next = tile + gridDim.x;
    if (next < tiles) load_up_tile(p, next, slot, lane, w_b);
    project_up_tile<T, kGroup>(p, tile, slot, lane, warp, w_a, latent, reduce);
    if (next >= tiles) break;
    if (next + gridDim.x < tiles) load_up_tile(p, next + gridDim.x, slot, lane, w_a);
    project_up_tile<T, kGroup>(p, next, slot, lane, warp, w_b, latent, reduce);
  }
}

int vector_width(DType dtype) { return 16 / static_cast<int>(element_size(dtype)); }

// Stage 1's plan: the most rows per chunk (fewest partials) that still gives ~kTargetBlocks blocks.
struct DownPlan {
  int loads;
  int chunks;
};
DownPlan down_plan(const Problem& p) {
  const int64_t col_tiles = (p.rank + 8 * vector_width(p.dtype) - 1) / (8 * vector_width(p.dtype));
  DownPlan plan{kMaxDownLoads, 0};
  for (; plan.loads > 1; plan.loads /= 2) {
    const int64_t rows = int64_t{plan.loads} * kDownSlots;
    if (col_tiles * ((p.model_dim + rows - 1) / rows) >= kTargetBlocks) break;
  }
  const int64_t rows = int64_t{plan.loads} * kDownSlots;
  plan.chunks = static_cast<int>((p.model_dim + rows - 1) / rows);
  return plan;
}

int64_t latent_floats(const Problem& p) { return p.tokens() * p.rank; }

size_t up_smem_bytes(const Problem& p) { return sizeof(float) * latent_floats(p); }

template <typename T, int kGroup>
Status launch(const Problem& p, const Args& a, Stream stream) {
  const DeviceFacts* facts = nullptr;
  if (Status known = current_device_facts(&facts); !known.ok()) return known;
  const DownPlan plan = down_plan(p);
  DecodeParams<T> k;
  copy_activation_args<T>(p, a, k);
  copy_weight_args<T>(a, k);
  k.latent_out = static_cast<T*>(a.latent);
  k.latent_stride_batch = a.latent_stride_batch;
  k.latent_stride_seq = a.latent_stride_seq;
  k.partials = static_cast<float*>(a.workspace);
  k.latent = k.partials + int64_t{plan.chunks} * latent_floats(p);
  k.chunks = plan.chunks;
  k.down_loads = plan.loads;

  const int w = Vec<T>::kWidth;
  const dim3 down_grid(static_cast<unsigned>((k.rank + 8 * w - 1) / (8 * w)),
                       static_cast<unsigned>(plan.chunks));
  kv_proj_decode_fp32_down<T, kGroup><<<down_grid, kThreads, 0, stream>>>(k);
  LATENTKV_CUDA_RETURN(cudaGetLastError());

  const dim3 reduce_grid(static_cast<unsigned>((latent_floats(p) + 31) / 32));
  LATENTKV_CUDA_RETURN(launch_after_previous<kv_proj_decode_fp32_reduce<T>>(
      reduce_grid, kThreads, 0, stream, facts->major, k));

  const int64_t up_tiles = ceil_div<int64_t>(2 * int64_t{k.kv_width}, UpTile<T>::kCols);
  const dim3 up_grid(static_cast<unsigned>(
      std::min<int64_t>(up_tiles, int64_t{kUpBlocksPerSm} * facts->sm_count)));
  constexpr auto kUp = kv_proj_decode_fp32_up<T, kGroup>;
  LATENTKV_CUDA_RETURN(launch_after_previous<kUp>(
      up_grid, kThreads, static_cast<size_t>(up_smem_bytes(p)), stream, facts->major, k));
  return Status::Ok();
}

Status refuse(const std::string& why) {
  return {StatusCode::kUnsupported, "cuda-decode: " + why};
}

}  // namespace

int64_t cuda_decode_fp32_workspace_size(const Problem& p) {
  return static_cast<int64_t>(sizeof(float)) * (down_plan(p).chunks + 1) * latent_floats(p);
}

Status cuda_decode_fp32_fits(const Problem& p) {
  if (p.dtype != DType::kFloat32) return refuse("bf16/fp16 take the tensor-core decode kernels");
  if (p.tokens() > kMaxTokens) {
    return refuse("problem tokens (batch * seq) = " + std::to_string(p.tokens()) +
                  " exceeds the " + std::to_string(kMaxTokens) + " it is built for");
  }
  // Stage 3 holds a thread's rows of R in registers and the float32 latent [T][R] in shared
  // memory (at most 16 x 512 floats, 32 KB).
  if (p.rank > kMaxRank) {
    return refuse("problem.rank = " + std::to_string(p.rank) + " exceeds the " +
                  std::to_string(kMaxRank) + " it holds in registers");
  }
  if (2 * p.kv_width() > INT_MAX / 2 || p.model_dim > INT_MAX / 2) {
    return refuse("problem.model_dim or heads * head_dim exceeds its int32 indexing");
  }
  const int64_t vw = vector_width(p.dtype);
  if (p.rank % vw != 0 || p.kv_width() % vw != 0) {
    return refuse("needs problem.rank = " + std::to_string(p.rank) +
                  " and heads * head_dim = " + std::to_string(p.kv_width()) +
                  " to be multiples of " + std::to_string(vw) + " (16-byte weight vectors)");
  }
  return Status::Ok();
}

// The token group (heuristics.h), a template argument: one switch point.
template <typename T>
Status launch_grouped(const Problem& p, const Args& a, Stream stream) {
  switch (decode_fp32_token_group(p.tokens())) {
    case 1: return launch<T, 1>(p, a, stream);
    case 2: return launch<T, 2>(p, a, stream);
    default: return launch<T, kMaxGroup>(p, a, stream);
  }
}

Status run_cuda_decode_fp32(const Problem& p, const Args& a, Stream stream) {
  if (p.dtype != DType::kFloat32) return refuse("bf16/fp16 take the tensor-core decode kernels");
  return launch_grouped<float>(p, a, stream);
}

}  // namespace latentkv::detail
