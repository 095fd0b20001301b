// The fused float32 strategy (Strategy::kCudaFused): one launch computes the latent, K and V for
// tiles of tokens, keeps the latent in shared memory and writes the stacked [2, B, S, H, Dh] output
// (and the latent, when asked) directly. FFMA with float32 accumulation (error against float64
// near 1e-7), except in the tensor-core and token-tile configurations (3xTF32, near 1e-6).
//
// At one or two tokens of small widths the one-token configuration takes the call
// (fused_fp32_one_token.cu: every load at kernel start, one round trip and three barriers); from
// three tokens, where heuristics.h's fused_register_tile_cols says so, the register-tile one
// (fused_fp32_register_tiles.cu: D <= 256, R <= 64, 16-byte rows; 4-token blocks with every load
// at kernel start, register tiles and shuffle reductions, one barrier).
// Once the streaming configuration's grid passes 2 blocks per SM (heuristics.h), the tensor-core
// configuration while its 8-token tiles fit the SMs once (fused_fp32_tensor_core.cu: D <= 256,
// R <= 64, 16-byte rows; the operands staged in shared memory), else the token-tile configuration
// (fused_fp32_token_tiles.cu: D <= 256, R <= 64, any layout; a 3xTF32 GEMM over 16- to 64-token
// tiles, persistent blocks holding the weights in shared memory), else the cluster configuration
// where it takes the call (fused_fp32_cluster.cu: sm_90, 16-byte aligned rows; a cluster of blocks
// per token tile, each fetching its slice of the weights, every load issued at kernel start).
// Everything else runs one of two tile configurations (tile_sizes.h), one kernel template,
// kv_proj_fused_fp32 (any architecture):
// - kStreamConfig (few tokens, or weights too large for shared memory): 4 tokens per block, one
//   block per tile, weights read straight from L2. At the founding size (T=384, D=256, R=48,
//   N=128: 19 MFLOP, 0.9 MB) the time is launch latency plus memory round trips, so every thread
//   has only a few weight loads (split-K over 256 threads) and issues them all before using any.
//   While the grid has at most one block per SM (heuristics.h), each block instead copies its
//   weights into shared memory at kernel start, beside the hidden tile's loads: one round trip
//   instead of one per load batch and phase.
// - kResidentConfig (many tokens, weights fit in shared memory): persistent blocks stage the
//   weights in shared memory once and loop over 16-token tiles, so the weights cross L2 once per SM
//   instead of once per tile, and each weight read from shared memory feeds 4-8 tokens.
// In both, the split-K partials meet in shared memory and their sum goes to the latent tile (down
// projection) or the output (up projection).
#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "backends.h"
#include "cuda/common.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/fused_fp32_cluster.h"
#include "cuda/fused_fp32_one_token.h"
#include "cuda/fused_fp32_register_tiles.h"
#include "cuda/fused_fp32_tensor_core.h"
#include "cuda/fused_fp32_token_tiles.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

// Compile-time tile plan. Threads are numbered (column group fastest, then token group, then
// slice of the reduction dimension); each thread accumulates kTokens / k*TokenGroups tokens times
// 4 consecutive columns.
template <int kTokens_, int kThreads_, int kDownTokenGroups_, int kUpTokenGroups_,
          int kUpColGroups_, bool kWeightsInSmem_>
struct TileConfig {
  static constexpr int kThreads = kThreads_;
  static constexpr int kTokens = kTokens_;
  static constexpr bool kWeightsInSmem = kWeightsInSmem_;
  // Down projection: kFusedDownCols / 4 groups of 4 latent columns per pass.
  static constexpr int kDownColGroups = tiles::kFusedDownCols / tiles::kFusedVectorWidth;
  static constexpr int kDownCols = 4 * kDownColGroups;
  static constexpr int kDownTokenGroups = kDownTokenGroups_;
  static constexpr int kDownTokensPerThread = kTokens / kDownTokenGroups;
  static constexpr int kDownSlices = kThreads / (kDownColGroups * kDownTokenGroups);
  // Up projection: kUpColGroups x 4 of the 2N [K | V] columns per pass.
  static constexpr int kUpColGroups = kUpColGroups_;
  static constexpr int kUpCols = 4 * kUpColGroups;
  static constexpr int kUpTokenGroups = kUpTokenGroups_;
  static constexpr int kUpTokensPerThread = kTokens / kUpTokenGroups;
  static constexpr int kUpSlices = kThreads / (kUpColGroups * kUpTokenGroups);
  // Partial sums, [slice][token][column], sized for the larger of the two projections.
  static constexpr int kReduceFloats =
      (kDownSlices * kDownCols > kUpSlices * kUpCols ? kDownSlices * kDownCols
                                                     : kUpSlices * kUpCols) * kTokens;

  static_assert(kTokens % kDownTokenGroups == 0 && kTokens % kUpTokenGroups == 0,
                "token groups must split the tile evenly");
  static_assert(kDownTokensPerThread % 4 == 0 && kUpTokensPerThread % 4 == 0,
                "tiles are read from shared memory 4 tokens at a time");
  static_assert(kDownSlices * kDownColGroups * kDownTokenGroups == kThreads &&
                    kUpSlices * kUpColGroups * kUpTokenGroups == kThreads,
                "each projection must use every thread");
};

// The up projection's 128-column passes can be spread over gridDim.y blocks (column_splits).
using kStreamConfig = TileConfig<tiles::kFusedStreamTokens, tiles::kFusedStreamThreads, 1, 1,
                                 tiles::kFusedStreamUpCols / 4, false>;
using kResidentConfig = TileConfig<tiles::kFusedResidentTokens, tiles::kFusedResidentThreads, 4, 2,
                                   tiles::kFusedResidentUpCols / 4, true>;
static_assert(kStreamConfig::kUpCols == tiles::kFusedStreamUpCols &&
                  kResidentConfig::kUpCols == tiles::kFusedResidentUpCols &&
                  kStreamConfig::kDownCols == tiles::kFusedDownCols,
              "the tile plan is the one tile_sizes.h describes");

// Everything the kernel needs, shapes in comments, strides in elements.
struct FusedParams : FusedParamsBase {
  int num_tiles;                                          // ceil(T / kTokens)
  // Uniform per launch: which fast paths the pointers and strides allow.
  bool hidden_vec4;   // hidden rows 16-byte aligned, D % 4 == 0
  bool w_down_vec4;   // w_down rows 16-byte aligned, R % 4 == 0
  bool w_up_vec4;     // w_up_k/v rows 16-byte aligned, N % 4 == 0 (a group never straddles K|V)
  bool heads_packed;  // out_stride_head == Dh: a token's N outputs are contiguous
  // Streaming configuration, one down and one up pass per block, 16-byte weight rows, and room
  // beside two blocks an SM: the block's weights (w_down whole, its kUpCols columns of
  // [w_up_k | w_up_v]) copied into shared memory at kernel start, beside the hidden tile's loads,
  // so that the block waits on one memory round trip instead of one per load batch and phase.
  bool prefetch_weights;
};

__host__ __device__ constexpr int round_up4(int x) { return (x + 3) / 4 * 4; }

// Shared memory of one block, carved from the dynamic allocation, in floats. Token tiles are
// stored transposed ([k][token]) so one 16-byte load gives a k-value for 4 tokens; resident
// weights keep rows padded to a multiple of 4 columns (zero-filled) so every read is 16 bytes.
template <typename Config>
struct SharedPlan {
  int hidden, latent, reduce, w_down, w_up;  // offsets
  int total;
  __host__ __device__ SharedPlan(int d, int r, int n, bool prefetch) {
    hidden = 0;                                        // [D][kTokens]
    latent = hidden + d * Config::kTokens;             // [R][kTokens]
    reduce = latent + r * Config::kTokens;             // [slices][kTokens][cols]
    // Resident: [D][round_up4(R)]; prefetched (R % 4 == 0): [D][R].
    w_down = reduce + Config::kReduceFloats;
    // Resident: [R][round_up4(2N)]; prefetched: [R][kUpCols], the block's columns.
    w_up = w_down + (Config::kWeightsInSmem || prefetch ? d * round_up4(r) : 0);
    total = w_up + (Config::kWeightsInSmem ? r * round_up4(2 * n)
                    : prefetch             ? r * Config::kUpCols
                                           : 0);
  }
  size_t bytes() const { return sizeof(float) * static_cast<size_t>(total); }
};

// The block's weights into shared memory (p.prefetch_weights; the layout of SharedPlan), 16
// bytes a copy, cp.async on sm_80+: w_down [D][R] whole and columns [col0, col0 + kUpCols) of
// [w_up_k | w_up_v] (zeros past 2N), one cp.async group; the kernel waits on it (wait_async_copies)
// before the barrier that follows the hidden tile.
template <typename Config>
__device__ __forceinline__ void prefetch_weights(const FusedParams& p, float* w_down, float* w_up,
                                                 int col0) {
  const int R = p.rank, N = p.kv_width, quads = R / 4;
  for (int i = threadIdx.x; i < p.model_dim * quads; i += Config::kThreads) {
    const int k = i / quads, c = 4 * (i % quads);
    copy16_async(w_down + k * R + c, p.w_down + k * p.w_down_stride + c, true);
  }
  constexpr int kUpQuads = Config::kUpCols / 4;
  for (int i = threadIdx.x; i < R * kUpQuads; i += Config::kThreads) {
    const int k = i / kUpQuads, c = 4 * (i % kUpQuads), j = col0 + c;
    const float* src = j < N ? p.w_up_k + k * p.w_up_k_stride + j
                             : p.w_up_v + k * p.w_up_v_stride + (j - N);
    copy16_async(w_up + k * Config::kUpCols + c, j < 2 * N ? src : p.w_up_k, j < 2 * N);
  }
  commit_copies();
}

// Element j of the concatenated [w_up_k | w_up_v] row k (j < 2N).
__device__ __forceinline__ float load_up(const FusedParams& p, int k, int j) {
  return j < p.kv_width ? __ldg(p.w_up_k + k * p.w_up_k_stride + j)
                        : __ldg(p.w_up_v + k * p.w_up_v_stride + (j - p.kv_width));
}

// Columns [col, col+4) of a matrix row, one at a time (the slow path for unaligned rows); columns
// >= limit read as 0.
template <typename Load>
__device__ __forceinline__ float4 gather4(int col, int limit, Load load) {
  float4 v;
  v.x = col + 0 < limit ? load(col + 0) : 0.f;
  v.y = col + 1 < limit ? load(col + 1) : 0.f;
  v.z = col + 2 < limit ? load(col + 2) : 0.f;
  v.w = col + 3 < limit ? load(col + 3) : 0.f;
  return v;
}

// acc += tile[k] (x) w(k) over this thread's slice k = slice, slice + kSlices, ... < K. The weight
// loads and the tile reads of kBatch steps are all issued before the first is used, so a thread
// waits for one memory round trip per batch rather than per step.
template <int kRows, int kSlices, int kTileStride, typename LoadW>
__device__ __forceinline__ void accumulate_slices(float (&acc)[kRows][4], const float* tile,
                                                  int slice, int K, LoadW load_w) {
  constexpr int kBatch = kRows >= 8 ? 4 : 8;  // registers: kBatch * (4 + kRows) beside acc
  for (int k0 = slice; k0 < K; k0 += kSlices * kBatch) {
    float4 w[kBatch];
    float4 a[kBatch][kRows / 4];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int k = k0 + b * kSlices;
      const bool live = k < K;
      w[b] = live ? load_w(k) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < kRows / 4; ++i) {
        a[b][i] = live ? *reinterpret_cast<const float4*>(tile + k * kTileStride + 4 * i)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
#pragma unroll
      for (int i = 0; i < kRows / 4; ++i) {
        const float av[4] = {a[b][i].x, a[b][i].y, a[b][i].z, a[b][i].w};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          float* c = acc[4 * i + r];
          c[0] = fmaf(av[r], w[b].x, c[0]);
          c[1] = fmaf(av[r], w[b].y, c[1]);
          c[2] = fmaf(av[r], w[b].z, c[2]);
          c[3] = fmaf(av[r], w[b].w, c[3]);
        }
      }
    }
  }
}

template <int kRows>
__device__ __forceinline__ void store_partials(float* reduce, int row, int col, int cols,
                                               const float (&acc)[kRows][4]) {
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    *reinterpret_cast<float4*>(reduce + (row + t) * cols + col) =
        make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
  }
}

// Copies a [rows][cols] weight matrix (or the [K | V] pair, when second != null) into shared
// memory with rows padded to round_up4(total cols) and the padding zero-filled.
__device__ void stage_weights(float* dst, int rows, int cols, const float* first,
                              int64_t first_stride, const float* second, int64_t second_stride,
                              bool vec4) {
  const int total = second ? 2 * cols : cols, padded = round_up4(total);
  const int quads = padded / 4;
  for (int i = threadIdx.x; i < rows * quads; i += blockDim.x) {
    const int k = i / quads, c = 4 * (i % quads);
    float4 v;
    if (vec4 && c + 4 <= total) {
      const float* src = c < cols ? first + k * first_stride + c
                                  : second + k * second_stride + (c - cols);
      v = load_vector<float4>(src);
    } else {
      v = gather4(c, total, [&](int j) {
        return j < cols ? __ldg(first + k * first_stride + j)
                        : __ldg(second + k * second_stride + (j - cols));
      });
    }
    *reinterpret_cast<float4*>(dst + k * padded + c) = v;
  }
}

template <typename Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    kv_proj_fused_fp32(const __grid_constant__ FusedParams p) {
  start_after_previous_kernel();
  constexpr int kTokens = Config::kTokens;
  extern __shared__ float4 smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);
  const SharedPlan<Config> plan(p.model_dim, p.rank, p.kv_width, p.prefetch_weights);
  float* hidden_t = smem + plan.hidden;  // [D][kTokens]
  float* latent_t = smem + plan.latent;  // [R][kTokens]
  float* reduce = smem + plan.reduce;    // [slices][kTokens][cols]

  const int tid = threadIdx.x;
  const int D = p.model_dim, R = p.rank, N = p.kv_width, R4 = round_up4(R), N2p = round_up4(2 * N);

  if constexpr (Config::kWeightsInSmem) {
    stage_weights(smem + plan.w_down, D, R, p.w_down, p.w_down_stride, nullptr, 0, p.w_down_vec4);
    stage_weights(smem + plan.w_up, R, N, p.w_up_k, p.w_up_k_stride, p.w_up_v, p.w_up_v_stride,
                  p.w_up_vec4);
  }

  if constexpr (!Config::kWeightsInSmem) {
    if (p.prefetch_weights) {
      prefetch_weights<Config>(p, smem + plan.w_down, smem + plan.w_up,
                               blockIdx.y * Config::kUpCols);
    }
  }

  for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    const int token0 = tile * kTokens;

    // Stage the hidden tile, transposed; tokens past T read as 0 and are never stored.
    if (p.hidden_vec4) {
      const int quads = D / 4;
      for (int i = tid; i < kTokens * quads; i += Config::kThreads) {
        const int t = i / quads, k = 4 * (i % quads), token = token0 + t;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (token < p.tokens) {
          const float* row =
              p.hidden + token_offset(token, p.seq, p.hidden_stride_batch, p.hidden_stride_seq);
          v = *reinterpret_cast<const float4*>(row + k);  // coherent: hidden may be fresh
        }
        hidden_t[(k + 0) * kTokens + t] = v.x;
        hidden_t[(k + 1) * kTokens + t] = v.y;
        hidden_t[(k + 2) * kTokens + t] = v.z;
        hidden_t[(k + 3) * kTokens + t] = v.w;
      }
    } else {
      for (int i = tid; i < kTokens * D; i += Config::kThreads) {
        const int t = i / D, k = i % D, token = token0 + t;
        hidden_t[k * kTokens + t] =
            token < p.tokens
                ? p.hidden[token_offset(token, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) +
                           k]
                : 0.f;
      }
    }
    if (!Config::kWeightsInSmem && p.prefetch_weights) wait_async_copies();
    __syncthreads();  // also orders the weight staging (or prefetch) before first use

    // Down projection: latent[t][r] = sum_d hidden[t][d] * w_down[d][r].
    {
      constexpr int kRows = Config::kDownTokensPerThread;
      const int group = tid % Config::kDownColGroups;
      const int row = (tid / Config::kDownColGroups) % Config::kDownTokenGroups * kRows;
      const int slice = tid / (Config::kDownColGroups * Config::kDownTokenGroups);
      for (int col0 = 0; col0 < R; col0 += Config::kDownCols) {
        const int col = col0 + 4 * group;
        float acc[kRows][4] = {};
        const float* tile_rows = hidden_t + row;
        if constexpr (Config::kWeightsInSmem) {
          const float* w = smem + plan.w_down + col;
          if (col < R4) {
            accumulate_slices<kRows, Config::kDownSlices, kTokens>(
                acc, tile_rows, slice, D,
                [&](int k) { return *reinterpret_cast<const float4*>(w + k * R4); });
          }
        } else if (col < R) {
          const float* w = p.w_down + col;
          const int64_t ld = p.w_down_stride;
          if (p.prefetch_weights) {
            const float* staged = smem + plan.w_down + col;
            accumulate_slices<kRows, Config::kDownSlices, kTokens>(
                acc, tile_rows, slice, D,
                [&](int k) { return *reinterpret_cast<const float4*>(staged + k * R); });
          } else if (p.w_down_vec4) {
            accumulate_slices<kRows, Config::kDownSlices, kTokens>(
                acc, tile_rows, slice, D,
                [&](int k) { return load_vector<float4>(w + k * ld); });
          } else {
            accumulate_slices<kRows, Config::kDownSlices, kTokens>(
                acc, tile_rows, slice, D, [&](int k) {
                  return gather4(col, R, [&](int j) { return __ldg(p.w_down + k * ld + j); });
                });
          }
        }
        store_partials<kRows>(reduce, slice * kTokens + row, 4 * group, Config::kDownCols, acc);
        __syncthreads();
        for (int i = tid; i < kTokens * Config::kDownCols; i += Config::kThreads) {
          const int t = i / Config::kDownCols, c = i % Config::kDownCols;
          if (col0 + c >= R) continue;
          float sum = 0.f;
#pragma unroll
          for (int s = 0; s < Config::kDownSlices; ++s) {
            sum += reduce[(s * kTokens + t) * Config::kDownCols + c];
          }
          latent_t[(col0 + c) * kTokens + t] = sum;
          const int token = token0 + t;
          if (p.latent != nullptr && token < p.tokens && blockIdx.y == 0) {
            p.latent[token_offset(token, p.seq, p.latent_stride_batch, p.latent_stride_seq) +
                     col0 + c] = sum;
          }
        }
        __syncthreads();
      }
    }

    // Up projection: out[kv][t][j] = sum_r latent[t][r] * w_up_kv[r][j] over the 2N columns of
    // [K | V].
    {
      constexpr int kRows = Config::kUpTokensPerThread;
      const int group = tid % Config::kUpColGroups;
      const int row = (tid / Config::kUpColGroups) % Config::kUpTokenGroups * kRows;
      const int slice = tid / (Config::kUpColGroups * Config::kUpTokenGroups);
      for (int col0 = blockIdx.y * Config::kUpCols; col0 < 2 * N;
           col0 += gridDim.y * Config::kUpCols) {
        const int col = col0 + 4 * group;
        float acc[kRows][4] = {};
        const float* tile_rows = latent_t + row;
        if constexpr (Config::kWeightsInSmem) {
          const float* w = smem + plan.w_up + col;
          if (col < N2p) {
            accumulate_slices<kRows, Config::kUpSlices, kTokens>(
                acc, tile_rows, slice, R,
                [&](int k) { return *reinterpret_cast<const float4*>(w + k * N2p); });
          }
        } else if (col < 2 * N) {
          if (p.prefetch_weights) {  // one pass: col0 is the block's first column
            const float* staged = smem + plan.w_up + 4 * group;
            accumulate_slices<kRows, Config::kUpSlices, kTokens>(
                acc, tile_rows, slice, R, [&](int k) {
                  return *reinterpret_cast<const float4*>(staged + k * Config::kUpCols);
                });
          } else if (p.w_up_vec4) {  // N % 4 == 0: the group lies in one half
            const bool is_k = col < N;
            const float* w = is_k ? p.w_up_k + col : p.w_up_v + (col - N);
            const int64_t ld = is_k ? p.w_up_k_stride : p.w_up_v_stride;
            accumulate_slices<kRows, Config::kUpSlices, kTokens>(
                acc, tile_rows, slice, R,
                [&](int k) { return load_vector<float4>(w + k * ld); });
          } else {
            accumulate_slices<kRows, Config::kUpSlices, kTokens>(
                acc, tile_rows, slice, R, [&](int k) {
                  return gather4(col, 2 * N, [&](int j) { return load_up(p, k, j); });
                });
          }
        }
        store_partials<kRows>(reduce, slice * kTokens + row, 4 * group, Config::kUpCols, acc);
        __syncthreads();
        for (int i = tid; i < kTokens * Config::kUpCols; i += Config::kThreads) {
          const int t = i / Config::kUpCols, c = i % Config::kUpCols;
          const int token = token0 + t, j = col0 + c;
          if (j >= 2 * N || token >= p.tokens) continue;
          float sum = 0.f;
#pragma unroll
          for (int s = 0; s < Config::kUpSlices; ++s) {
            sum += reduce[(s * kTokens + t) * Config::kUpCols + c];
          }
          const int kv = j >= N, n = j - kv * N;
          const int64_t head_offset =
              p.heads_packed ? n : (n / p.head_dim) * p.out_stride_head + n % p.head_dim;
          p.out[kv * p.out_stride_kv +
                token_offset(token, p.seq, p.out_stride_batch, p.out_stride_seq) + head_offset] =
              sum;
        }
        __syncthreads();
      }
    }
  }
}

template <typename Config>
Status allow_max_smem(int bytes) {
  return cuda_status(cudaFuncSetAttribute(kv_proj_fused_fp32<Config>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                     "cudaFuncSetAttribute(kv_proj_fused_fp32, MaxDynamicSharedMemorySize)");
}

// The per-device setup (prepared_device): both configurations opted in to the device's limit.
struct FusedKernels {
  static Status setup(const DeviceFacts& f) {
    const int bytes = static_cast<int>(f.smem_optin);
    Status s = allow_max_smem<kStreamConfig>(bytes);
    if (s.ok()) s = allow_max_smem<kResidentConfig>(bytes);
    return s;
  }
};

template <typename Config>
size_t smem_bytes(const Problem& p, bool prefetch = false) {
  return SharedPlan<Config>(static_cast<int>(p.model_dim), static_cast<int>(p.rank),
                            static_cast<int>(p.kv_width()), prefetch)
      .bytes();
}

// Resident weights (heuristics.h) where they fit; below the tile count it asks for, the streaming
// configuration spreads the latency-bound work over more SMs.
bool use_resident(const Problem& p, const DeviceFacts& f) {
  return fused_use_resident(ceil_div<int64_t>(p.tokens(), kResidentConfig::kTokens),
                            smem_bytes<kResidentConfig>(p) <= f.smem_optin, f.sm_count);
}

bool aligned16(const void* ptr) { return is_aligned(ptr, 16); }

FusedParams make_params(const Problem& p, const Args& a, int tile_tokens) {
  FusedParams k;
  copy_fused_args(p, a, k);
  k.num_tiles = static_cast<int>(ceil_div<int64_t>(p.tokens(), tile_tokens));
  k.hidden_vec4 = aligned16(a.hidden) && p.model_dim % 4 == 0 && a.hidden_stride_seq % 4 == 0 &&
                  a.hidden_stride_batch % 4 == 0;
  k.w_down_vec4 = aligned16(a.w_down) && p.rank % 4 == 0 && a.w_down_stride_row % 4 == 0;
  k.w_up_vec4 = aligned16(a.w_up_k) && aligned16(a.w_up_v) && p.kv_width() % 4 == 0 &&
                a.w_up_k_stride_row % 4 == 0 && a.w_up_v_stride_row % 4 == 0;
  k.heads_packed = a.out_stride_head == p.head_dim;
  k.prefetch_weights = false;
  return k;
}

// How many blocks share one token tile's up projection (gridDim.y). Each of them recomputes the
// tile's latent, so the split stays where the repeated down projection (D*R per token) costs at
// most the up projection (2N*R per token), and stops once the grid covers the SMs twice.
int64_t useful_column_splits(const Problem& p, int up_cols) {
  const int64_t passes = (2 * p.kv_width() + up_cols - 1) / up_cols;
  const int64_t cheap = 1 + 2 * p.kv_width() / p.model_dim;
  return passes < cheap ? passes : cheap;
}
int column_splits(const Problem& p, int64_t tiles, int up_cols, int sm_count) {
  const int64_t fill = (2 * int64_t{sm_count} + tiles - 1) / tiles;
  int64_t splits = useful_column_splits(p, up_cols);
  splits = splits < fill ? splits : fill;
  return static_cast<int>(splits < 1 ? 1 : splits > 65535 ? 65535 : splits);
}

// The cluster configuration (heuristics.h) once the streaming grid, with the column splits it
// would want, passes its blocks per SM (monotonic in T, unlike the capped split count).
bool use_cluster(const Problem& p, const DeviceFacts& f) {
  const int64_t tiles = ceil_div<int64_t>(p.tokens(), kStreamConfig::kTokens);
  return fused_use_cluster(tiles * useful_column_splits(p, kStreamConfig::kUpCols), f.sm_count);
}

template <typename Config>
Status launch(const Problem& p, const Args& a, const DeviceFacts& f, Stream stream) {
  FusedParams k = make_params(p, a, Config::kTokens);
  dim3 grid;
  if constexpr (Config::kWeightsInSmem) {  // persistent: one block per SM loops over tiles
    grid = dim3(k.num_tiles < f.sm_count ? k.num_tiles : f.sm_count, 1);
  } else {
    grid = dim3(k.num_tiles, column_splits(p, k.num_tiles, Config::kUpCols, f.sm_count));
  }
  if constexpr (!Config::kWeightsInSmem) {
    // A grid the heuristics prefetch for, one down pass (R <= kDownCols) and one up pass per
    // block (2N <= gridDim.y * kUpCols), the copies' 16-byte rows, and two blocks an SM still
    // resident.
    k.prefetch_weights =
        fused_prefetch_weights(static_cast<int64_t>(grid.x) * grid.y, f.sm_count) &&
        k.w_down_vec4 && k.w_up_vec4 && p.rank <= Config::kDownCols &&
        2 * p.kv_width() <= static_cast<int64_t>(grid.y) * Config::kUpCols &&
        2 * smem_bytes<Config>(p, true) <= f.smem_optin;
  }
  const size_t smem = smem_bytes<Config>(p, k.prefetch_weights);
  return cuda_status(launch_after_previous<kv_proj_fused_fp32<Config>>(grid, Config::kThreads, smem,
                                                                     stream, f.major, k),
                     "kv_proj_fused_fp32 launch");
}

}  // namespace

Status cuda_fused_fits(const Problem& p) {
  if (p.dtype != DType::kFloat32) {
    return {StatusCode::kUnsupported, std::string("problem.dtype = ") + to_string(p.dtype) +
                                          " is not supported by the cuda-fused strategy yet "
                                          "(float32 only)"};
  }
  // The kernel indexes tokens, columns, shared memory and in-matrix offsets with int32; tensors
  // are addressed with 64-bit strides.
  const struct {
    const char* name;
    int64_t value;
  } limits[] = {{"tokens (batch * seq)", p.tokens() + 16},
                {"model_dim (times the 16-token tile)", p.model_dim * 16},
                {"2 * heads * head_dim", 2 * p.kv_width() + 4},
                {"rank * heads * head_dim", p.rank * (2 * p.kv_width() + 4)},
                {"model_dim * rank", p.model_dim * (p.rank + 4)}};
  for (const auto& l : limits) {
    if (l.value > INT_MAX) {
      return {StatusCode::kUnsupported,
              std::string("problem ") + l.name + " = " + std::to_string(l.value) +
                  " exceeds the int32 indexing of the cuda-fused kernel"};
    }
  }
  const DeviceFacts* f = nullptr;
  if (Status s = prepared_device<FusedKernels>(&f); !s.ok()) return s;
  const size_t need = smem_bytes<kStreamConfig>(p);
  if (need > f->smem_optin) {
    return {StatusCode::kUnsupported,
            "problem.model_dim = " + std::to_string(p.model_dim) + " with problem.rank = " +
                std::to_string(p.rank) + " needs " + std::to_string(need) +
                " bytes of shared memory per block in the cuda-fused kernel; the device has " +
                std::to_string(f->smem_optin)};
  }
  return Status::Ok();
}

Status run_cuda_fused(const Problem& p, const Args& a, Stream stream) {
  const DeviceFacts* f = nullptr;
  if (Status s = prepared_device<FusedKernels>(&f); !s.ok()) return s;
  if (fused_one_token_takes(p, a)) return run_fused_one_token(p, a, *f, stream);
  if (fused_register_tiles_takes(p, a, *f)) return run_fused_register_tiles(p, a, *f, stream);
  if (use_cluster(p, *f)) {
    if (fused_tensor_core_takes(p, a, *f)) return run_fused_tensor_core(p, a, *f, stream);
    if (fused_token_tiles_takes(p, a, *f)) return run_fused_token_tiles(p, a, *f, stream);
    if (fused_cluster_takes(p, a, *f)) return run_fused_cluster(p, a, *f, stream);
  }
  if (use_resident(p, *f)) return launch<kResidentConfig>(p, a, *f, stream);
  return launch<kStreamConfig>(p, a, *f, stream);
}

}  // namespace latentkv::detail
