// The tile constants that problem shapes depend on, one place for the kernels and for the tests.
//
// Every kernel whose correctness changes at a tile boundary (a partial last token tile, a column
// tile that straddles K|V, a rank not a multiple of the row alignment) takes its sizes from here,
// and tests/common/cases.cpp derives its edge shapes from the same names (a tile minus one, a tile,
// a tile plus one), so the edge cases move with the kernels. Host-includable: no CUDA headers, so
// the CPU backend, the tests and the benchmark can include it too. The reason for each number is
// next to it; the measurements behind them are in docs/perf.md.
#pragma once

namespace latentkv::detail::tiles {

// ---- cuda-fused (fused_fp32.cu): float32, one launch, the latent tile in shared memory ----
// Streaming configuration: 4 tokens per block gives ~100 token tiles at the founding size (T=384),
// enough blocks to spread a launch-latency-bound problem over the SMs.
constexpr int kFusedStreamTokens = 4;
constexpr int kFusedStreamThreads = 256;  // 16 slices of D, 8 of R: <= 16 weight loads per thread
// Its up projection's pass: 32 column groups x 4 columns of the 2N [K | V] columns.
constexpr int kFusedStreamUpCols = 128;
// Resident configuration: 16 tokens per tile, so each weight read from shared memory feeds 4
// (down) or 8 (up) tokens, enough to keep the FMA pipes ahead of the shared-memory port.
constexpr int kFusedResidentTokens = 16;
constexpr int kFusedResidentThreads = 512;
constexpr int kFusedResidentUpCols = 256;  // 64 column groups x 4 columns per up pass
// Both: the down projection's pass is 16 column groups x 4 = 64 latent columns.
constexpr int kFusedDownCols = 64;
// Rows are read 4 floats at a time (16 bytes) when D, R and 2N are multiples of this.
constexpr int kFusedVectorWidth = 4;
// One-token configuration (fused_fp32_one_token.cu, T <= 2): every block computes the whole
// latent with one w_down row per thread (D <= 256) and a 64-wide reduce-scatter (R <= 64), then
// its 32 of the 2N [K | V] columns.
constexpr int kFusedOneTokenMaxTokens = 2;
constexpr int kFusedOneTokenMaxModelDim = 256;
constexpr int kFusedOneTokenMaxRank = 64;
constexpr int kFusedOneTokenBlockCols = 32;
// Register-tile configuration (fused_fp32_register_tiles.cu, from 3 tokens while its grid fits
// the SMs once): 4 tokens per block of 8 warps; in the down, lane l of every warp takes rows
// 32 i + l of D (D <= 256) and warp w 8 latent columns (R <= 64); in the up, 256 or 32 of the 2N
// [K | V] columns per block (heuristics.h).
constexpr int kFusedRegisterTileTokens = 4;
constexpr int kFusedRegisterTileThreads = 256;
constexpr int kFusedRegisterTileMaxModelDim = 256;
constexpr int kFusedRegisterTileMaxRank = 64;
// Its [K | V] columns per block (kernel template arguments): wide, each quad of lanes a 4-column
// group over all 4 tokens; narrow, each warp one group, so few tokens spread over 8x the blocks.
constexpr int kFusedRegisterTileWideCols = 256;
constexpr int kFusedRegisterTileNarrowCols = 32;
// Tensor-core configuration (fused_fp32_tensor_core.cu, sm_80, 3xTF32 mma.sync m16n8k8): tokens
// are the MMA's N (8 per tile); the block stages w_down, its [w_up_k | w_up_v] columns and the
// token tile in shared memory; each of 16 warps takes w_down rows [16 w, 16 w + 16) and one
// 16-column tile of the block's columns, all of R (R <= 64: 4 MMA tiles of the down product, 8 K
// steps of the up one), so D <= 16 warps x 16 rows.
constexpr int kFusedTcThreads = 512;
constexpr int kFusedTcTokens = 8;
constexpr int kFusedTcMaxModelDim = 256;
constexpr int kFusedTcMaxRank = 64;
constexpr int kFusedTcMaxUpTilesPerBlock = 16;  // one per warp: 256 of the 2N columns
// Token-tile configuration (fused_fp32_token_tiles.cu, sm_80, 3xTF32 mma.sync m16n8k8): tokens
// are the MMA's M, 16 x kM per block tile (kM = 1 to 4 m-tiles, chosen per call); w_down and
// the block's 256 columns of [w_up_k | w_up_v] stay in shared memory while the block walks its
// tiles; 16 warps (12 at kM = 3), warp w on m-tile w % kM and every (warps / kM)-th n-tile.
constexpr int kFusedTilesThreads = 512;
constexpr int kFusedTilesMaxMTiles = 4;
constexpr int kFusedTilesMaxModelDim = 256;
constexpr int kFusedTilesMaxRank = 64;
constexpr int kFusedTilesBlockCols = 256;
// Cluster configuration (fused_fp32_cluster.cu, sm_90, 16-byte aligned rows): a cluster of C
// blocks per token tile (C from heuristics.h), block b taking D chunk b of the down projection and
// column chunk b of the up one, so each fetches 1/C of the weights in one round trip. 8 is the
// portable cluster limit (dev/fused_cluster_probe.cu tries 1, 2, 4, 8).
constexpr int kFusedClusterMaxBlocks = 8;
constexpr int kFusedClusterThreads = 256;
// Tokens per tile, chosen per call between 4 (one register tile) and this (fused_cluster_tile_
// tokens, heuristics.h); 32 keeps a block's shared memory near 95 KB at the founding dims with
// C = 2 (two blocks per SM).
constexpr int kFusedClusterMinTokens = 4;
constexpr int kFusedClusterMaxTokens = 32;
// Split-K partials: one 4x4 tile per thread.
constexpr int kFusedClusterReduceFloats = 16 * kFusedClusterThreads;

// ---- cuda-decode, float32 (decode_stream.cu): FFMA, weights streamed over every SM ----
// The strategy's limit on T = batch * seq: a token group of <= 4 accumulates in registers, and
// 16 x 512 floats of latent fit shared memory.
constexpr int kDecodeStreamMaxTokens = 16;
constexpr int kDecodeStreamMaxGroup = 4;  // tokens per pass: 1, 2 or 4 (matched to T)
constexpr int kDecodeStreamThreads = 256;
// Stage 1: latent columns per block, 8 lanes x a 16-byte vector (4 floats).
constexpr int kDecodeStreamDownCols = 32;
constexpr int kDecodeStreamDownSlots = 32;  // rows of D per load step: 8 warps x 4
// Stage 3: columns of [w_up_k | w_up_v] per tile, 4 lanes x a 16-byte vector (4 floats).
constexpr int kDecodeStreamUpCols = 16;
constexpr int kDecodeStreamUpSlots = 64;  // rows of R per load step: 8 warps x 8
constexpr int kDecodeStreamUpLoads = 8;   // 16-byte loads per thread and tile, in registers
// R held in registers by stage 3: 64 slots x 8 loads, the rank of every MLA model so far.
constexpr int kDecodeStreamMaxRank = kDecodeStreamUpSlots * kDecodeStreamUpLoads;
// R and H*Dh must be multiples of one 16-byte vector of float.
constexpr int kDecodeStreamVectorWidth = 4;

// ---- cuda-decode, bfloat16/float16 (decode_tensor_core.cu): mma.sync m16n8k16 ----
constexpr int kDecodeTcThreads = 256;
constexpr int kDecodeTcMmaCols = 8;  // the MMA's N; also a down item's width in latent columns
constexpr int kDecodeTcKStep = 16;   // the MMA's K
// The MMA's M is the tokens: the limit on T (T = 1 and T = 16 cost the same instructions).
constexpr int kDecodeTcTokens = 16;
constexpr int kDecodeTcBoxRows = 64;  // rows per bulk tensor copy (one TMA box)
// Up: R rounded up to this, so each K half of a weight tile is a multiple of the 32 rows one
// ldmatrix.x4.trans covers.
constexpr int kDecodeTcUpRowAlign = 4 * kDecodeTcKStep;
// Down: a chunk of D is a multiple of 8 warps x 2 K steps (32 rows per warp step).
constexpr int kDecodeTcDownRowAlign = (kDecodeTcThreads / 32) * 2 * kDecodeTcKStep;
// Up tile widths (columns of w_up_k / w_up_v): wide once there are enough tiles per SM.
constexpr int kDecodeTcNarrowUpCols = 32;
constexpr int kDecodeTcWideUpCols = 64;
// R and H*Dh must be multiples of 8 elements (16-byte weight rows of bf16/fp16).
constexpr int kDecodeTcVectorWidth = 8;

// ---- cuda-mla-decode (mla_decode.cu): mma.sync m16n8k16 with the tokens as the M side ----
constexpr int kMlaDecodeTokenTile = 16;     // the MMA's M: tokens per tile
constexpr int kMlaDecodeMaxTokenTiles = 4;  // 1, 2 or 4 tiles per call (3 run as 4): T <= 64

// ---- cpu-blocked (cpu/cpu_blocked.cpp): the projection's CPU backend ----
// Register tile: 6 tokens x 16 columns = 12 ymm accumulators (+2 loads, 1 broadcast of 16).
constexpr int kCpuRows = 6;
constexpr int kCpuRegisterCols = 16;
// Tokens per work item: each W panel serves 4 register tiles.
constexpr int kCpuTileTokens = 24;
// w_down rows per pass: a 256 x 16 float panel is 16 KB, in L1.
constexpr int kCpuDBlock = 256;
// Latent columns per pass: the stack tile is 24 x 256 floats (24 KB).
constexpr int kCpuRBlock = 256;
// bf16 / fp16: K and V columns per float32 panel (24 x 256 floats on the stack, 24 KB), each
// summed over all of R before it is rounded.
constexpr int kCpuUpPanel = 256;
// Few tokens on several threads (the column split: T <= kCpuRows, or kCpuSplitDotMaxTokens for
// bf16 on AVX512-BF16, below): weight columns per work item of each phase, in whole blocks of
// kCpuSplitCols: the latent's R in one item a thread (on 2 threads R = 512 runs as 2 items of
// 256), then [K | V]: up to 1024 (2 KB of each bf16 weight row per item, so a thread streams long
// runs of each row), halved down to 64 until there are at least kCpuSplitKvItemsPerThread items a
// thread (on 2 threads V3's [K | V] runs as 32 items of 1024, V2-Lite's as 8 of 512) and until
// the rows' panel fits kCpuSplitPanelFloats. heuristics.h computes both.
constexpr int kCpuSplitCols = 64;
// Products of at most kCpuRows token rows stream w in blocks of this many rows, each across all
// columns (cpu_blocked.cpp gemm_tile; bf16_dot.cpp at most kCpuStreamDotMaxRows rows: 3 and more
// ran 5-40% slower blocked there). Even, so that the bf16 dot products' (k, k + 1) pairs stay
// whole. Weights from memory on 2 threads (docs/perf.md, cpu-blocked), us, whole-k tiles / blocks
// of 16: float32 V3 T=1 4300 / 3650, T=4 7760 / 4870, V2-Lite T=6 1745 / 1003; bf16 V3 T=1 ~2200
// / ~1470.
constexpr int kCpuStreamK = 16;
constexpr int kCpuStreamDotMaxRows = 2;
static_assert(kCpuStreamK % 2 == 0, "blocks start at even k: vdpbf16ps pairs (k, k + 1)");
constexpr int kCpuSplitKvMaxCols = 1024;
constexpr int kCpuSplitKvItemsPerThread = 4;
// bf16 on AVX512-BF16 splits the weights' columns up to one token tile (each weight then read
// once across the threads, where token tiles give every thread its own read of all of them):
// V2-Lite dims, weights from memory, 2 threads, us, token tiles / split (docs/perf.md,
// cpu-blocked): T=12 695-1007 / 483-548, T=24 719-736 / 630-679, T=16 level, T=7-8 5-12% slower
// (a 6-row tile and a streamed 1-2 row one on the two threads); V3 T=24 5585-6099 / 4805-5346;
// T=32 slower again. The float32 and widening products run > kCpuRows rows as whole-k column
// strips, which lose to token tiles there (V2-Lite T=8 float32 ~1150 / ~2000), so they split only
// up to kCpuRows.
constexpr int kCpuSplitDotMaxTokens = kCpuTileTokens;
// The split's [K | V] panel on each thread's stack: [rows, kv_cols] floats (24 KB), so kv_cols
// narrows as the rows grow past kCpuRows.
constexpr int kCpuSplitPanelFloats = kCpuRows * kCpuSplitKvMaxCols;
// Products of more rows (a token tile's) over more than kCpuBlockCols columns (the float32 up
// products, V3's 16384 columns) run in blocks of kCpuBlockCols columns x kCpuBlockK rows of w:
// each 16-column tile that the tile's row groups share then walks 128 rows, not all of an R block
// (256), whose rows 64 KB apart (V3) left it out of cache for the next group. Float32, weights
// from memory, 2 threads, us, whole R block / 256 x 128 blocks (docs/perf.md, cpu-blocked): V3
// T=16 20300-21400 / 11700-13500, T=24 ~22800 / 9500-10300, T=64 56800-61800 / 24700-25500 (eager
// torch 14800-17400, 16800-18600, 25800-27900); V2-Lite T=16-256 level; 512 x 256 (columns
// alone) gained nothing, 512 x 64 less than 128.
constexpr int kCpuBlockCols = 256;
constexpr int kCpuBlockK = 128;

static_assert(kCpuTileTokens % kCpuRows == 0, "a token tile is a whole number of register tiles");
static_assert(kDecodeStreamMaxTokens % kDecodeStreamMaxGroup == 0, "token groups split the limit");

}  // namespace latentkv::detail::tiles
