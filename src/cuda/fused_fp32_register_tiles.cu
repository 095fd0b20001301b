// cuda-fused's register-tile configuration (heuristics.h: fused_register_tile_cols; D <= 256,
// R <= 64, 16-byte rows of hidden, w_down and w_up): from 3 tokens while its grid fits the SMs
// once. The streaming configuration's chain at these sizes is ~1,400 instructions per warp at ~8
// cycles each (split-K partials through shared memory, barriers); here each block of 4 tokens
// runs:
// - every load at kernel start: the hidden tile and w_down copied into shared memory by cp.async in
//   coalesced 16-byte pieces (w_down's rows padded to a stride of 4 mod 8 floats, so the per-lane
//   row reads below are conflict-free), the lane's rows of w_up into registers, all addressed by
//   running pointers (the copies' issue is on every block's critical path); the copies in four
//   groups, the hidden tile with w_down's first 64 rows, then 64 rows each;
// - down: lane l of warp w multiplies rows 32 i + l of the hidden tile and of w_down's columns
//   [8 w, 8 w + 8) (4 tokens x 8 columns of partial sums), each group's rows while the later
//   groups are still arriving, summed over the warp's lanes by a reduce-scatter of shuffles, one
//   latent value written per lane; one barrier;
// - up, over the block's kBlockCols [K | V] columns: 256 (each quad of lanes one 4-column group,
//   each lane 4 tokens over a quarter of R), or 32 at few tokens (each warp one 4-column group,
//   each lane one token over an eighth of R) so that a 4-token tile spreads over 8 SMs, each
//   block then fetching 1/8 of w_up; the row slices summed by shuffles.
// Float32 FFMA, float32 sums in a fixed order (deterministic). Blocks of the first column block
// write the latent output when asked.
#include <cuda_runtime.h>

#include "cuda/common.h"
#include "cuda/cuda_check.h"
#include "cuda/device_facts.h"
#include "cuda/fused_fp32_register_tiles.h"
#include "cuda/kernel_args.h"
#include "cuda/ptx.h"
#include "cuda/tile_sizes.h"
#include "cuda/warp_reduce.h"
#include "heuristics.h"

namespace latentkv::detail {
namespace {

constexpr int kThreads = tiles::kFusedRegisterTileThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kTokens = tiles::kFusedRegisterTileTokens;
constexpr int kMaxModelDim = tiles::kFusedRegisterTileMaxModelDim;
constexpr int kRowsPerLane = kMaxModelDim / 32;                 // rows 32 i + lane of D
constexpr int kCopyGroups = 4;  // w_down's rows in this many cp.async groups, kGroupRows each
constexpr int kGroupRows = kMaxModelDim / kCopyGroups;
static_assert(kGroupRows % 32 == 0 && kCopyGroups <= 8,
              "a group holds whole 32-row steps of the down product; wait_copies_pending's range");
constexpr int kRankPadded = tiles::kFusedRegisterTileMaxRank;   // 64
constexpr int kColsPerWarp = kRankPadded / kWarps;              // latent columns in the down
constexpr int kWideCols = tiles::kFusedRegisterTileWideCols;    // [K | V] columns a block
constexpr int kNarrowCols = tiles::kFusedRegisterTileNarrowCols;
static_assert(kColsPerWarp == 8 && kTokens * kColsPerWarp == 32,
              "the down reduce-scatter's five levels leave one value a lane");
static_assert(kTokens * kMaxModelDim / 4 == kThreads, "one 16-byte hidden piece per thread");

// w_down's row stride in shared memory: R rounded up to the warps' 8 columns, plus 4 floats, so
// the rows of 8 consecutive lanes start 4 banks apart (16-byte reads without conflicts).
__host__ __device__ __forceinline__ int w_down_smem_stride(int rank) {
  return round_up(rank, kColsPerWarp) + 4;
}
// Rows of w_down copied: D rounded up to the lanes (rows past D are zeros).
__host__ __device__ __forceinline__ int w_down_smem_rows(int model_dim) {
  return round_up(model_dim, 32);
}
size_t smem_bytes(const Problem& p) {
  return sizeof(float) *
         (static_cast<size_t>(w_down_smem_rows(static_cast<int>(p.model_dim))) *
              w_down_smem_stride(static_cast<int>(p.rank)) +
          kTokens * kMaxModelDim);
}
constexpr size_t kStaticSmemBytes = sizeof(float) * kTokens * kRankPadded;

// The up projection's work split for kBlockCols columns a block: lane = group x kSlices + slice
// with each lane kLaneTokens tokens (256: 8 groups a warp, 4 slices, all 4 tokens), or warp =
// group and lane = token x kSlices + slice (32: 8 slices, one token).
template <int kBlockCols>
struct UpSplit {
  static constexpr int kGroupsPerWarp = kBlockCols / (4 * kWarps);  // 8 or 1
  static constexpr int kSlices = kGroupsPerWarp == 8 ? 4 : 8;       // of R
  static constexpr int kLaneTokens = kGroupsPerWarp == 8 ? kTokens : 1;
  static constexpr int kMaxSliceRows = kRankPadded / kSlices;       // 16 or 8
  static_assert(kGroupsPerWarp * kSlices * kTokens / kLaneTokens == 32, "one warp's lanes");
};

// Block (x, y): tokens [4 x, 4 x + 4) and [K | V] columns [kBlockCols y, kBlockCols (y + 1)).
// Two blocks fit an SM (<= 128 registers) so that the next call's blocks, launched as programmatic
// dependents once these pass their wait, are resident beside them instead of queued behind them
// (docs/perf.md, cuda-fused: one block an SM cost up to 0.6 us a call in graph replay).
template <int kBlockCols>
__global__ void __launch_bounds__(kThreads, 2)
    kv_proj_fused_register_tiles(const __grid_constant__ FusedParamsBase p) {
  start_after_previous_kernel();
  using Up = UpSplit<kBlockCols>;
  extern __shared__ __align__(16) float smem[];
  __shared__ __align__(16) float latent[kTokens][kRankPadded];  // [token][R padded]
  const int stride = w_down_smem_stride(p.rank);
  const int rows = w_down_smem_rows(p.model_dim);
  float* w_down = smem;                  // [rows][stride]
  float* hidden = smem + rows * stride;  // [kTokens][kMaxModelDim]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int t0 = blockIdx.x * kTokens;

  // Every load first. The hidden tile: thread tid copies token tid / 64's columns 4 (tid % 64)..
  {
    const int j = tid / (kMaxModelDim / 4), d = 4 * (tid % (kMaxModelDim / 4));
    const int t = t0 + j;
    const bool valid = t < p.tokens && d < p.model_dim;
    const float* src =
        p.hidden + (valid ? token_offset(t, p.seq, p.hidden_stride_batch, p.hidden_stride_seq) + d
                          : 0);
    copy16_async(hidden + j * kMaxModelDim + d, src, valid);
  }
  // w_down: 16-byte pieces in slots of kPieceSlots a row (R <= 64), so thread tid keeps slot
  // tid % kPieceSlots and walks rows tid / kPieceSlots + kRowStep i: shifts and running
  // pointers, no division or 64-bit multiply per piece. Slots past round_up(R, 8) / 4 copy
  // nothing; pieces past R or rows past D are zeros.
  {
    constexpr int kPieceSlots = kRankPadded / 4;
    constexpr int kRowStep = kThreads / kPieceSlots;
    constexpr int kSteps = kMaxModelDim / kRowStep;
    const int piece = tid % kPieceSlots;
    const bool copies = piece < round_up(p.rank, kColsPerWarp) / 4;
    const bool piece_in = 4 * piece < p.rank;
    int row = tid / kPieceSlots;
    float* dst = w_down + row * stride + 4 * piece;
    const float* src = p.w_down + (piece_in ? row * p.w_down_stride + 4 * piece : 0);
    const int64_t src_step = piece_in ? kRowStep * p.w_down_stride : 0;
#pragma unroll
    for (int i = 0; i < kSteps; ++i, row += kRowStep) {
      // Every thread closes group g (rows < kGroupRows (g + 1); the hidden tile in the first) at
      // the same step.
      if (i > 0 && i % (kSteps / kCopyGroups) == 0) commit_copies();
      if (copies && row < rows) {
        const bool valid = piece_in && row < p.model_dim;
        copy16_async(dst, valid ? src : p.w_down, valid);
      }
      dst += kRowStep * stride;
      src += src_step;
    }
  }
  // w_up: the lane's slice of R (slice_rows rows) of its 4-column group, into registers.
  const int group = Up::kGroupsPerWarp == 8 ? warp * 8 + lane / Up::kSlices : warp;
  const int slice = lane % Up::kSlices;
  const int token = Up::kLaneTokens == 1 ? lane / Up::kSlices : 0;  // the up's one token
  const int slice_rows = round_up(ceil_div(p.rank, Up::kSlices), 4);
  const int col0 = blockIdx.y * kBlockCols + 4 * group;
  const bool col_in = col0 < 2 * p.kv_width;
  const int kv = col0 >= p.kv_width;  // N % 4 == 0: a group is all K or all V
  const int n0 = col0 - kv * p.kv_width;
  const float* up = (kv ? p.w_up_v : p.w_up_k) + (col_in ? n0 : 0);
  const int64_t up_stride = kv ? p.w_up_v_stride : p.w_up_k_stride;
  // The slice's rows by a running pointer (no 64-bit multiply a row); rows past R are zeros.
  const int r0 = slice * slice_rows;
  const int up_rows = col_in ? max(0, min(slice_rows, p.rank - r0)) : 0;
  const float* up_row = up + (up_rows > 0 ? r0 * up_stride : 0);
  float4 u[Up::kMaxSliceRows];
#pragma unroll
  for (int i = 0; i < Up::kMaxSliceRows; ++i, up_row += up_stride) {
    u[i] = i < up_rows ? load_vector<float4>(up_row) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // In the wide blocks, a use of u under a condition that never holds (T >= 0) keeps its loads
  // here: without one, ptxas issues them after the copies' wait, a memory round trip later. (The
  // narrow blocks' 8 rows a lane measured faster where ptxas puts them: docs/perf.md, cuda-fused.)
  if constexpr (kBlockCols == kWideCols) {
    if (p.tokens < 0) {
      float any = 0.f;
#pragma unroll
      for (int i = 0; i < Up::kMaxSliceRows; ++i) any += u[i].x + u[i].y + u[i].z + u[i].w;
      p.out[0] = any;
    }
  }
  // The copy groups: the hidden tile with w_down's first kGroupRows rows, then kGroupRows more
  // each; the down product's rows of a group run while the later groups are still arriving.
  commit_copies();
  wait_copies<kCopyGroups - 1>();
  __syncthreads();

  // Down: the lane's rows 32 i + lane, then the sums over the warp's lanes; lane l ends with
  // token l / 8's latent column c0 + l % 8. Warps past R write zeros (the up rows past R read
  // them).
  const int c0 = warp * kColsPerWarp;
  float v[kTokens * kColsPerWarp];  // [token][column]
#pragma unroll
  for (int k = 0; k < kTokens * kColsPerWarp; ++k) v[k] = 0.f;
  const bool warp_in = c0 < p.rank;
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    if (i > 0 && i % (kGroupRows / 32) == 0) {
      wait_copies_pending(kCopyGroups - 1 - i / (kGroupRows / 32));
      __syncthreads();
    }
    if (warp_in) {
      if (32 * i >= p.model_dim) continue;
      const int d = 32 * i + lane;
      const float4 w0 = *reinterpret_cast<const float4*>(w_down + d * stride + c0);
      const float4 w1 = *reinterpret_cast<const float4*>(w_down + d * stride + c0 + 4);
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        const float x = hidden[j * kMaxModelDim + d];
        float* vj = v + j * kColsPerWarp;
        vj[0] = fmaf(x, w0.x, vj[0]), vj[1] = fmaf(x, w0.y, vj[1]);
        vj[2] = fmaf(x, w0.z, vj[2]), vj[3] = fmaf(x, w0.w, vj[3]);
        vj[4] = fmaf(x, w1.x, vj[4]), vj[5] = fmaf(x, w1.y, vj[5]);
        vj[6] = fmaf(x, w1.z, vj[6]), vj[7] = fmaf(x, w1.w, vj[7]);
      }
    }
  }
  if (warp_in) {
    reduce_scatter_level<16, 16>(v, lane);
    reduce_scatter_level<8, 8>(v, lane);
    reduce_scatter_level<4, 4>(v, lane);
    reduce_scatter_level<2, 2>(v, lane);
    reduce_scatter_level<1, 1>(v, lane);
  }
  {
    const int j = lane / kColsPerWarp, c = c0 + lane % kColsPerWarp;
    latent[j][c] = v[0];
    const int t = t0 + j;
    if (p.latent != nullptr && blockIdx.y == 0 && t < p.tokens && c < p.rank) {
      p.latent[token_offset(t, p.seq, p.latent_stride_batch, p.latent_stride_seq) + c] = v[0];
    }
  }
  __syncthreads();

  // Up: kLaneTokens tokens x the group's 4 columns over the lane's slice_rows latent rows.
  float o[Up::kLaneTokens * 4];  // [token][column]
#pragma unroll
  for (int k = 0; k < Up::kLaneTokens * 4; ++k) o[k] = 0.f;
#pragma unroll
  for (int i4 = 0; i4 < Up::kMaxSliceRows / 4; ++i4) {
    if (4 * i4 >= slice_rows) break;
#pragma unroll
    for (int j = 0; j < Up::kLaneTokens; ++j) {
      const float4 l =
          *reinterpret_cast<const float4*>(&latent[token + j][slice * slice_rows + 4 * i4]);
      const float ls[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float4& wu = u[4 * i4 + e];
        o[4 * j] = fmaf(ls[e], wu.x, o[4 * j]);
        o[4 * j + 1] = fmaf(ls[e], wu.y, o[4 * j + 1]);
        o[4 * j + 2] = fmaf(ls[e], wu.z, o[4 * j + 2]);
        o[4 * j + 3] = fmaf(ls[e], wu.w, o[4 * j + 3]);
      }
    }
  }
  if constexpr (Up::kLaneTokens == kTokens) {
    // The quad's four slices: lane bit 1 picks tokens {2, 3}, bit 0 the odd one of the pair, so
    // lane l keeps token l & 3's four columns in o[0 .. 4).
    reduce_scatter_level<8, 2>(o, lane);
    reduce_scatter_level<4, 1>(o, lane);
    const int t = t0 + slice;
    if (col_in && t < p.tokens) {
      float* dst = p.out + out_offset(p, kv, t, n0);
      if (p.head_dim % 4 == 0) {
        *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) p.out[out_offset(p, kv, t, n0 + c)] = o[c];
      }
    }
  } else {
    // The 8 slices (lane bits 0-2): bit 2 picks columns {2, 3}, bit 1 the odd one, bit 0 adds
    // the last pair; even lanes store their column.
    reduce_scatter_level<2, 4>(o, lane);
    reduce_scatter_level<1, 2>(o, lane);
    o[0] += __shfl_xor_sync(0xffffffffu, o[0], 1);
    const int t = t0 + token;
    if ((lane & 1) == 0 && col_in && t < p.tokens) {
      p.out[out_offset(p, kv, t, n0 + (lane & 4 ? 2 : 0) + (lane & 2 ? 1 : 0))] = o[0];
    }
  }
}

// The per-device setup (prepared_device): both kernels opted in to the device's shared memory.
struct RegisterTileKernels {
  static Status setup(const DeviceFacts& f) {
    const int bytes = static_cast<int>(f.smem_optin - kStaticSmemBytes);
    cudaError_t err = cudaFuncSetAttribute(kv_proj_fused_register_tiles<kWideCols>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(kv_proj_fused_register_tiles<kNarrowCols>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    }
    return cuda_status(err, "cudaFuncSetAttribute(kv_proj_fused_register_tiles, "
                            "MaxDynamicSharedMemorySize)");
  }
};

int64_t token_tiles(const Problem& p) { return ceil_div<int64_t>(p.tokens(), kTokens); }

}  // namespace

bool fused_register_tiles_takes(const Problem& p, const Args& a, const DeviceFacts& f) {
  // The kernel stores 16 bytes wherever Dh % 4 == 0, so there the output must take them.
  return fused_register_tile_cols(p.tokens(), token_tiles(p), 2 * p.kv_width(), f.sm_count) > 0 &&
         p.model_dim <= kMaxModelDim && p.rank <= kRankPadded && fused_rows_16_bytes(p, a) &&
         (p.head_dim % 4 != 0 || fused_out_16_bytes(p, a)) &&
         smem_bytes(p) + kStaticSmemBytes <= f.smem_optin;
}

Status run_fused_register_tiles(const Problem& p, const Args& a, const DeviceFacts& f,
                                Stream stream) {
  if (Status s = prepare<RegisterTileKernels>(f); !s.ok()) return s;
  FusedParamsBase k;
  copy_fused_args(p, a, k);
  const int cols =
      fused_register_tile_cols(p.tokens(), token_tiles(p), 2 * p.kv_width(), f.sm_count);
  const dim3 grid(static_cast<unsigned>(token_tiles(p)),
                  static_cast<unsigned>(ceil_div<int64_t>(2 * p.kv_width(), cols)));
  const cudaError_t launched =
      cols == kNarrowCols
          ? launch_after_previous<kv_proj_fused_register_tiles<kNarrowCols>>(
                grid, kThreads, smem_bytes(p), stream, f.major, k)
          : launch_after_previous<kv_proj_fused_register_tiles<kWideCols>>(
                grid, kThreads, smem_bytes(p), stream, f.major, k);
  return cuda_status(launched, "kv_proj_fused_register_tiles launch");
}

}  // namespace latentkv::detail
