// Every threshold latentkv chooses by: which strategy kAuto prefers for a problem (one
// *_preferred function per row of the strategy table, at most one of them true for a problem on
// a backend) and which variant a kernel family's launcher runs. Each number has its reason in
// one line; the measurements behind them (device, date, times) are in docs/perf.md.
//
// The *_faster functions are the measured regions, where a strategy beat cuda-gemm; they overlap
// (cuda-fused and float32 cuda-decode both win at one token with small weights), and the
// *_preferred functions resolve that in one fixed order: cuda-fused, then cuda-decode, then
// cuda-gemm for everything else.
#pragma once

#include <cstdint>

#include "latentkv/latentkv.h"
#include "latentkv/mla.h"
#include "cuda/common.h"
#include "cuda/tile_sizes.h"

namespace latentkv::detail {

// Bytes of w_down, w_up_k and w_up_v together: what a call streams from memory at least once.
inline int64_t weight_bytes(const Problem& p) {
  return (p.model_dim * p.rank + 2 * p.rank * p.kv_width()) * element_size(p.dtype);
}

// ---- cuda-fused against cuda-gemm ----
// Every token tile re-reads the weights from L2, so past 64K floats (256 KB) cuBLAS wins.
constexpr int64_t kFusedMaxWeightFloats = int64_t{64} << 10;
// At the founding dims the crossover with cuBLAS lies near 1400 tokens; 1024 keeps a margin.
constexpr int64_t kFusedMaxTokens = 1024;
// ... except at the token-tile configuration's widths within one column block (D <= 256, R <=
// 64, 2N <= 256; any layout), measured up to this many tokens (H200, 2026-12-02 14:54 UTC,
// founding widths, cuda-fused / cuBLAS's three GEMMs and the stack: T=2048 7.97 / 17.8 us, T=6144
// 16.1 / 26.8 (cuda-gemm 23.5), T=16384 29.6 / 44.4; per further 1024 tokens ~1.6 us against
// cuBLAS's ~1.35, so the lines would cross near 75K tokens).
constexpr int64_t kFusedTokenTilesMaxTokens = 16384;
inline bool fused_token_tiles_width(const Problem& p) {
  return p.model_dim <= tiles::kFusedTilesMaxModelDim && p.rank <= tiles::kFusedTilesMaxRank &&
         2 * p.kv_width() <= tiles::kFusedTilesBlockCols;
}

// ---- cuda-decode against cuda-gemm ----
// The decode kernels are instruction-bound, so their edge over cuBLAS shrinks with the weights.
constexpr int64_t kDecodeSmallWeightBytes = int64_t{16} << 20;
// float32 (FFMA): one token wins at any weight size; up to 4 tokens with small weights.
constexpr int64_t kDecodeFp32AnyWeightTokens = 1;
constexpr int64_t kDecodeFp32MaxTokens = 4;
// bf16/fp16 (one cooperative tensor-core kernel): its chain beats cuBLAS's launches up to 8
// tokens of small weights (the A operand's re-reads per up tile grow with T).
constexpr int64_t kDecodeTcMaxTokens = 8;

// ---- cuda-mla-decode against cuda-mla-gemm (the MLA path) ----
// Few tokens make both stages weight streams, which the decode kernels spread over every SM in
// three chained launches where cuBLAS runs GEMV shapes on a fraction of them.
// Past 16 tokens the kernels either run their one-tile kernels over windows of 16 tokens (more
// blocks; each window's blocks read the weights again, from L2 where they are small) or their 2-
// and 4-tile kernels (one pass over the weights). Windows where every weight matrix the call
// streams (stage A's [q_a; kv_a], stage B's kv_b) is at most kMlaDecodeSmallWeightBytes: V2-Lite
// (2.4 + 4.2 MB), windows / tiles, us: whole path T=48 14.2 / 20.3, T=64 16.3 / 24.5, stage B
// alone T=64 7.95 / 12.9, first stage T=32 7.40 / 7.71 (T=64 10.3 / 9.79).
constexpr int64_t kMlaDecodeSmallWeightBytes = int64_t{8} << 20;
// Bytes of [q_a_weight; kv_a_weight] (stage A's weights).
inline int64_t mla_stage_a_weight_bytes(const MlaProblem& p) {
  return (p.q_rank + p.cache_width()) * p.model_dim * element_size(p.dtype);
}
inline bool mla_decode_token_windows(const MlaProblem& p) {
  const int64_t stage_a = mla_stage_a_weight_bytes(p);
  const int64_t stage_b = p.kv_b_rows() * p.kv_rank * element_size(p.dtype);
  return (p.stage == MlaStage::kSecond || stage_a <= kMlaDecodeSmallWeightBytes) &&
         (p.stage == MlaStage::kFirst || stage_b <= kMlaDecodeSmallWeightBytes);
}
// kAuto: decode up to 16 tokens everywhere; with windows, up to 64 (all it takes) where stage B
// runs, and for the first stage alone up to 64 where its weights are at most
// kMlaDecodeFirstWideWeightBytes, else 32. H200, decode / gemm, us: V2-Lite whole T=16 10.5 /
// 17.9, T=48 12.9 / 18.6, T=64 13.4 / 17.6 (19:34 UTC); first stage V2-Lite (2.4 MB) T=33 6.6 /
// 9.8, T=64 7.28 / 9.93 (19:42), V3 kv (8.3 MB) T=32 10.8 / 11.3, T=64 13.7 / 11.4 (19:54); V3
// (33.5 MB of kv_b, no windows) whole T=16 22.7 / 25.9, T=32 29.2 / 26.8, T=64 41.4 / 28.6 (14:12).
constexpr int64_t kMlaDecodeMaxTokens = 16;
constexpr int64_t kMlaDecodeWindowsMaxTokens = 64;
constexpr int64_t kMlaDecodeWindowsFirstMaxTokens = 32;
constexpr int64_t kMlaDecodeFirstWideWeightBytes = int64_t{4} << 20;
inline bool cuda_mla_decode_preferred(const MlaProblem& p) {
  if (p.tokens() <= kMlaDecodeMaxTokens) return true;
  if (!mla_decode_token_windows(p)) return false;
  if (p.stage != MlaStage::kFirst) return p.tokens() <= kMlaDecodeWindowsMaxTokens;
  const int64_t bound = mla_stage_a_weight_bytes(p) <= kMlaDecodeFirstWideWeightBytes
                            ? kMlaDecodeWindowsMaxTokens
                            : kMlaDecodeWindowsFirstMaxTokens;
  return p.tokens() <= bound;
}
inline bool cuda_mla_gemm_preferred(const MlaProblem& p) { return !cuda_mla_decode_preferred(p); }
// K1's and K3's token tiles per window where the call runs in windows: one up to this many tokens,
// two past it. Same H200 call (2026-12-01 19:34 UTC), V2-Lite whole path, K1 over two / one-tile
// windows: T=48 13.1 / 12.9 us, T=64 13.4 / 13.6 (19:25: first stage T=64 7.25 / 7.57). K3 over
// two-tile windows lost then (whole T=48 14.5 / 13.4, T=64 15.3 / 14.1: half the blocks, each warp
// both tiles' MMAs) and won once its grid of two windows (128 blocks) asked for the largest L1
// (mla_decode_stage_b_spread), H100, 2026-12-07, two- / one-tile K3 windows: T=49 11.93 / 12.28,
// T=64 12.32 / 12.44.
constexpr int64_t kMlaDecodeOneTileWindowsMaxTokens = 48;
inline int mla_decode_window_tiles(int64_t tokens) {
  return tokens <= kMlaDecodeOneTileWindowsMaxTokens ? 1 : 2;
}
// cuda-mla-decode's K1 as a programmatic dependent of the kernel before the call (its blocks
// resident and through their launch while that kernel ends; every memory access still after it)
// as far as cuda-mla-decode runs (kMlaDecodeWindowsMaxTokens, 64 tokens) on stage-A weights of at
// most kMlaDecodeFirstWideWeightBytes: faster there with the L2 prefetch below, slower past 16
// tokens without it and on V3's 8.3 MB (docs/perf.md, "Thresholds the heuristics use").
inline bool mla_decode_stage_a_programmatic(int64_t tokens, int64_t stage_a_weight_bytes) {
  return tokens <= kMlaDecodeWindowsMaxTokens &&
         stage_a_weight_bytes <= kMlaDecodeFirstWideWeightBytes;
}
// A programmatic K1 asks L2 for its weight rows before its wait where stage B follows in the same
// call or past one token tile, where it measured faster; a first stage alone at one tile measured
// slower with it (docs/perf.md, "Thresholds the heuristics use").
inline bool mla_decode_stage_a_prefetch_l2(int64_t tokens, bool stage_b_follows) {
  return stage_b_follows || tokens > kMlaDecodeMaxTokens;
}
// cuda-mla-decode's stage A plans one block per SM (room for a stage-B block beside it, whose kv_b
// stream starts during stage A) when its weights are at most this fraction of kv_b's, else two:
// V3 kv (8.3 of 33.5 MB) ran 0.6-1.3 us faster at T=1..16 with one, V3 q_a + kv (30 MB) 1.4 us
// slower (its own stream wants both blocks' loads in flight).
constexpr double kMlaDecodeOverlapMaxWeightRatio = 0.5;
inline bool mla_decode_overlap_stage_b(int64_t stage_a_weight_bytes, int64_t kv_b_bytes) {
  return static_cast<double>(stage_a_weight_bytes) <=
         kMlaDecodeOverlapMaxWeightRatio * static_cast<double>(kv_b_bytes);
}
// With stage B planned beside it (mla_decode_overlap_stage_b), K1 is launched asking for the
// shared-memory carveout (percent of the SM's shared memory, the launch attribute's unit) that
// holds `bytes_per_sm`: its block, a K2 block and stage B's blocks per SM. Left to the driver, K1's
// own need at one token (~1 KB of hidden) gets a small configuration that holds at most one
// stage-B block beside it, so stage B's first kv_b tiles load during K2 instead of beside K1's
// stream. H100, 2026-12-07, same call, with / without, us: V3 kv whole path T=1 21.12 / 21.89
// (all 512 stage-B blocks beside K1 instead of 79); T=4, T=16, Kimi K2 level; the largest
// configuration instead 22.25.
inline int mla_decode_stage_a_carveout(int64_t bytes_per_sm, int64_t sm_shared_bytes) {
  if (sm_shared_bytes <= 0) return 100;
  return static_cast<int>(
      std::min<int64_t>(100, (100 * bytes_per_sm + sm_shared_bytes - 1) / sm_shared_bytes));
}

// cuda-mla-decode's stage B at one token tile: a ring of 4 K-blocks in registers at 4 blocks per
// SM (more warps streaming) where kv_b has more 8-row tiles than the held-tile plan's warps (8 per
// block, 2 blocks per SM), else every K-block of a tile held at 2 blocks per SM. V3 (4096 tiles,
// 2112 warps), ring / held: whole path T=1 20.2 / 21.6 us, T=16 23.8 / 25.1, stage B alone T=1
// 13.3 / 15.0, q_a + kv whole T=1 25.9 / 28.2; V2-Lite (512 tiles: one per warp either way) lost
// with the ring (whole T=1 11.9 / 10.5, T=16 17.1 / 12.2, both with L2 prefetches then).
inline bool mla_decode_stage_b_ring(int64_t tiles, int64_t held_plan_warps) {
  return tiles > held_plan_warps;
}
// cuda-mla-decode's stage B holding whole tiles, where its grid (blocks x token windows) has at
// most one block per SM: launched preferring the largest L1 (the launch's carveout attribute),
// which gives each SM's L1/shared split its smallest shared-memory configuration that fits one
// of its blocks, so that no two share an SM and none shares one with K1, whose stream is the
// chain's first link (its blocks land on the SMs K1 leaves free). H100, 2026-12-07, same call,
// with / without, us: V2-Lite whole path T=1 7.26 / 7.88, T=4 8.10 / 8.52, T=32 (two windows,
// 128 blocks) 10.68 / 10.95; T=16, T=64 (not applied: 256 blocks) and stage B alone level.
// Applied past one block per SM (as a function attribute), it ran in two waves: V2-Lite T=64 and
// Kimi K2 (256 blocks) +3 us.
inline bool mla_decode_stage_b_spread(int64_t blocks, int64_t sm_count) {
  return blocks <= sm_count;
}

// cuda-mla-decode at one token, both stages, no q_a, stage B holding whole tiles (not the ring,
// whose 64 registers it would crowd): every stage-B block sums stage A's chunk
// partials itself instead of waiting for the epilogue kernel (K2): one launch and two L2 round
// trips leave the chain, for L2 reads of stage B's blocks x the partials. Folded where those reads
// are at most this many bytes: V2-Lite (64 blocks x 8 chunks x 576 rows x 4 B = 1.2 MB) whole
// path T=1 9.2 us against 10.8; V3 (512 x 15 x 576 x 4 B = 17.7 MB) 21.0 folded against 21.2.
constexpr int64_t kMlaDecodeFoldMaxReadBytes = int64_t{4} << 20;
inline bool mla_decode_fold_epilogue(int64_t partial_read_bytes) {
  return partial_read_bytes <= kMlaDecodeFoldMaxReadBytes;
}
// Elsewhere without q_a, its epilogue kernel (K2) runs one block per token over the whole
// [c | k_pe] row (no arrival counters) where that block's partial loads take at most this many
// round trips of 8 chunks: the sliced K2 adds a norm across its slices (on sm_90 a cluster
// barrier and an exchange of sums in shared memory; below it an arrival counter and a re-read).
// V2-Lite (8 chunks, then two trips of 4), whole rows / sliced, us: whole path T=2 9.8 / 10.9,
// T=16 10.8 / 11.9, T=64 15.6 / 16.9, first stage T=1 5.49 / 6.55; one trip of 8 then took the
// whole path T=64 from 14.1 to 13.5 and the first stage T=1 from 5.7 to 5.0 (H100, docs/perf.md).
// Past 8 chunks (H100, 2026-12-06 23:25, same call, four trips / sliced with its cluster norm):
// V3 kv's 28 chunks, whole path T=1 21.82 / 22.20, T=16 23.35 / 23.92, first stage T=16 8.45 /
// 8.46. Not measured past 4 trips (32 chunks: past V3's D on 132 SMs).
constexpr int kMlaDecodeWholeRowsMaxTrips = 4;
inline bool mla_decode_whole_rows(int partial_trips) {
  return partial_trips <= kMlaDecodeWholeRowsMaxTrips;
}
// cuda-mla-decode's stage A as one cooperative kernel (the weight stream, one grid-wide barrier,
// then the norms, RoPE and cache rows: mla_decode_fused_stage_a) instead of K1 and K2, where its
// plan fits and it is faster: with q_a merged (K2 is then the sliced one over 8 or more slices) at
// up to kMlaDecodeMaxTokens, and for the first stage alone up to kMlaDecodeFusedFirstMaxTokens on
// stage-A weights of at least kMlaDecodeFusedMinWeightBytes. Elsewhere K1 and the whole-row K2
// (small weights), or K1's one block per SM with stage B's blocks streaming kv_b beside it, are
// faster. H200, 2026-12-04, same calls, fused / K1 + K2, us: V3 q_a + kv first stage T=1 12.25 /
// 13.85, T=4 12.87 / 14.09 (an earlier call: 0.3 us slower at T=1), T=16 14.31 / 15.88,
// both stages T=1 24.00 / 24.47; V3 kv first stage T=1 7.17 / 8.46, T=2 7.16 / 7.31, T=4 7.25 /
// 7.41, T=16 8.50 / 7.72, both stages T=1 19.28 / 18.85; V2-Lite kv (2.4 MB) first stage T=1
// 6.30 / 5.43 (docs/data/h200_mla_fused_stage_a_2026-12-04.txt).
constexpr int64_t kMlaDecodeFusedMinWeightBytes = int64_t{4} << 20;
constexpr int64_t kMlaDecodeFusedFirstMaxTokens = 4;
inline bool mla_decode_fused_stage_a_preferred(int64_t tokens, bool with_q_a,
                                               bool first_stage_only,
                                               int64_t stage_a_weight_bytes) {
  if (tokens > kMlaDecodeMaxTokens) return false;
  if (with_q_a) return true;
  return first_stage_only && tokens <= kMlaDecodeFusedFirstMaxTokens &&
         stage_a_weight_bytes >= kMlaDecodeFusedMinWeightBytes;
}
// The sliced K2 launches at least this many token rows of blocks; the rows past T only wait for
// K1 and exit. Measured, not explained: with them the whole path at one token runs faster (V3 kv
// both stages T=1 19.12 -> 18.71 us, with q_a 24.78 -> 24.30; the first stage alone unchanged),
// while 64 rows cost 0.3-0.8 us at T=16.
constexpr int kMlaDecodeEpilogueMinTokenRows = 16;

// cuda-mla-gemm's stage A at few to mid tokens without q_a: K split into batches of one GEMM (no
// split-K reduction kernel: the epilogue sums the partial products in slice order, reading
// T x (R + dr) float32 more per extra slice). At T <= kMlaGemmFineSplitMaxTokens, slices of
// kMlaGemmSplitDepth columns (2 to kMlaGemmMaxSplits of them); past it two halves of D up to
// kMlaGemmHalfSplitMaxTokens, and up to kMlaGemmDeepSplitMaxTokens where the halves are deep
// (D >= kMlaGemmDeepSplitMinDim: one GEMM's 40-96 CTAs then each run long, and the second
// half's CTAs pay for the epilogue's extra read); else one GEMM (cuBLASLt's own split-K where it
// takes it). Same H200 calls (2026-12-01), slices / one GEMM, us: 19:54 UTC V3 whole path (7
// slices) T=17 25.5 / 26.7, T=64 27.1 / 28.5, T=128 29.8 / 31.1, T=256 34.7 / 35.5, first stage
// T=64 11.4 / 12.7; V2-Lite (2 slices) whole T=65 17.1 / 17.7, T=256 18.7 / 18.9; 21:41 UTC
// T=384 V3 44.7 / 46.7, V2-Lite 19.3 / 20.4; T=512 V2-Lite 22.05 / 22.3; 21:31 UTC V2-Lite T=1024
// 27.3 / 26.0 (two halves of 1024 lose). V3, two halves / 7 slices of 1024 (one GEMM past 512),
// 23:10 and 23:20 UTC: whole T=64 27.3 / 26.1, T=257 36.2 / 34.5, T=384 42.8 / 43.0, T=512 51.1 /
// 52.9, T=768 76.9 / 76.3, T=1024 89.1 / 91.3, T=1536 131 / 131.5, T=2048 165.5 / 168; first
// stage T=512 14.9 / 17.0, T=1024 20.4 / 22.4, T=2048 33.9 / 42.5. With q_a (2112 columns) slices
// lost: V3 q_a + kv first stage T=32 22.9 / 20.3.
constexpr int64_t kMlaGemmFineSplitMaxTokens = 384;
constexpr int64_t kMlaGemmSplitDepth = 1024;
constexpr int64_t kMlaGemmMaxSplits = 8;
constexpr int64_t kMlaGemmHalfSplitMaxTokens = 512;
constexpr int64_t kMlaGemmDeepSplitMaxTokens = 2048;
constexpr int64_t kMlaGemmDeepSplitMinDim = 4096;
constexpr int64_t kMlaGemmHalfSplitStep = 256;  // each half a whole number of these columns
inline int64_t mla_gemm_stage_a_splits(int64_t tokens, int64_t model_dim, int64_t q_rows) {
  if (q_rows > 0) return 1;
  if (tokens <= kMlaGemmFineSplitMaxTokens) {
    if (model_dim % kMlaGemmSplitDepth != 0) return 1;
    const int64_t splits = model_dim / kMlaGemmSplitDepth;
    return splits >= 2 && splits <= kMlaGemmMaxSplits ? splits : 1;
  }
  const bool deep = model_dim >= kMlaGemmDeepSplitMinDim;
  const bool halves = tokens <= kMlaGemmHalfSplitMaxTokens ||
                      (deep && tokens <= kMlaGemmDeepSplitMaxTokens);
  // Whole steps per half, so that every slice starts 16-byte aligned.
  return halves && model_dim % (2 * kMlaGemmHalfSplitStep) == 0 ? 2 : 1;
}

// ---- launchers' variants ----
// cuda-fused's one-token configuration (its kernel takes T <= 2 at D <= 256, R <= 64): one
// round trip and three barriers instead of the streaming configuration's split-K chain. Founding
// widths, one-token / streaming, us: T=1 3.14 / 4.58, T=2 3.83 / 4.61 (its probe at T=4: 4.5
// against 4.8, so no third and fourth token).
inline bool fused_use_one_token(int64_t tokens) {
  return tokens >= 1 && tokens <= tiles::kFusedOneTokenMaxTokens;
}
// cuda-fused's register-tile configuration (its kernel takes D <= 256, R <= 64): its columns per
// block (0: not taken). 32 while its grid fills at most a quarter of the SMs (few tokens spread
// over more SMs), else 256 while the token tiles fill at most an eighth of the SMs or, past half
// of them, once. In between the streaming configuration runs: its grid is near one block per SM
// there, where it copies its weights in at kernel start, and it was as fast or faster. Founding
// widths, H200, same call (2026-12-04), register tiles (32 / 256 columns) against the streaming
// configuration, us: T=3 4.18 / 4.66 against 4.72, T=7 4.24 / 4.68 against 4.77, T=16 4.48 /
// 4.73 against 4.88, T=33 4.88 / 4.78 against 4.92, T=64 5.80 / 4.84 against 4.96, T=128 - /
// 5.01 against 5.01, T=132 - / 5.07 against 5.02, T=256 - / 5.44 against 5.22, T=265 - / 5.42
// against 5.93, T=384 (the founding case) - / 5.88 against 6.10, T=528 - / 6.27 against 6.46.
inline int fused_register_tile_cols(int64_t tokens, int64_t token_tiles, int64_t two_n,
                                    int sm_count) {
  constexpr int kNarrow = tiles::kFusedRegisterTileNarrowCols;
  constexpr int kWide = tiles::kFusedRegisterTileWideCols;
  if (tokens <= tiles::kFusedOneTokenMaxTokens) return 0;
  if (4 * token_tiles * ((two_n + kNarrow - 1) / kNarrow) <= sm_count) return kNarrow;
  const int64_t grid = token_tiles * ((two_n + kWide - 1) / kWide);
  return 8 * grid <= sm_count || (2 * grid > sm_count && grid <= sm_count) ? kWide : 0;
}
// cuda-fused's tensor-core configuration (3xTF32; its kernel takes D <= 256, R <= 64), asked
// where the cluster configuration would run (the streaming grid past two blocks per SM): while its
// grid of 8-token tiles x column blocks is one wave. Founding widths, tensor-core / FFMA
// configurations (same H200 run, 2026-12-02), us: T=576 6.68 / 7.39 (cluster), T=733 6.73 / 7.42,
// T=1024 7.02 / 7.94; at two waves T=1280 10.4 / 8.88 and T=1536 10.4 / 9.44; against the
// streaming configuration T=3 5.89 / 4.77, T=384 6.40 / 6.14 and T=512 6.67 / 6.22 (every block
// stages all of w_down, so one SM's copy bandwidth bounds it). Past its wave the token-tile
// configuration runs (above).
inline bool fused_use_tensor_core(int64_t blocks, int sm_count) { return blocks <= sm_count; }
// ... its 16-column tiles of [K | V] per block: from 16 (one a warp) halved while the grid of
// ceil(T / 8) token tiles x column blocks still fits the SMs once, down to this many (each block
// of a token tile recomputes its latent). 8 and 4 were within 1% of each other at T=3..1024
// (16 alone: 6-9% slower below T=733).
constexpr int kFusedTcMinUpTilesPerBlock = 8;
inline int fused_tc_up_tiles_per_block(int64_t token_tiles, int64_t up_tiles, int sm_count) {
  int per_block = tiles::kFusedTcMaxUpTilesPerBlock;
  while (per_block / 2 >= kFusedTcMinUpTilesPerBlock &&
         token_tiles * ((up_tiles + per_block / 2 - 1) / (per_block / 2)) <= sm_count) {
    per_block /= 2;
  }
  return per_block;
}
// cuda-fused stages the weights in shared memory (resident configuration) once there are this
// many 16-token tiles per SM: each SM then reads them once instead of once per tile.
constexpr int kFusedResidentMinTilesPerSm = 2;
// cuda-decode bf16/fp16 takes 64-column up tiles (128-byte rows) once there are this many of
// them per SM; below that 32-column tiles spread the stream over more SMs.
constexpr int kDecodeTcWideMinTilesPerSm = 2;
// cpu-blocked: below ~200k FMAs per thread, waking a worker costs more than it saves.
constexpr double kCpuFmasPerThread = 2e5;
// cpu-blocked's threads for a call of `fmas` multiply-adds on a pool of `available`: one below
// two threads' worth, else one per kCpuFmasPerThread up to the pool.
inline int cpu_blocked_threads(double fmas, int available) {
  if (fmas < 2 * kCpuFmasPerThread || available <= 1) return 1;
  const double wanted = fmas / kCpuFmasPerThread;
  return wanted >= available ? available : static_cast<int>(wanted);
}
// cpu-blocked's token tile: a whole number of register tiles (kCpuRows), at most kCpuTileTokens,
// the size that gives the busiest thread the fewest tokens (the largest such; tiles are dealt out
// whole): 64 tokens on 2 threads run as 4 tiles of 18 (36 a thread), not 3 of 24 (48); 256 as 22
// tiles of 12 (132), not 11 of 24 (144). A short sequence is split across threads too.
inline int64_t cpu_blocked_tile_tokens(int64_t tokens, int threads) {
  int64_t best = tiles::kCpuTileTokens, busiest = 0;
  for (int64_t tile = tiles::kCpuTileTokens; tile >= tiles::kCpuRows; tile -= tiles::kCpuRows) {
    const int64_t tiles_a_thread = ceil_div(ceil_div(tokens, tile), int64_t{threads});
    if (busiest == 0 || tiles_a_thread * tile < busiest) {
      best = tile;
      busiest = tiles_a_thread * tile;
    }
  }
  return best;
}
// cpu-blocked's few-token split: latent columns per work item, one item a thread (whole
// kCpuSplitCols blocks): each thread then reads its share of every w_down row in one run (V3 T=1
// bf16 on 2 threads, w_down from memory: 256-column items 1444 us against 1704 for 64).
inline int64_t cpu_blocked_split_latent_cols(int64_t rank, int threads) {
  return round_up(ceil_div(rank, int64_t{threads}), int64_t{tiles::kCpuSplitCols});
}
// cpu-blocked's few-token split: [K | V] columns per work item, kCpuSplitKvMaxCols halved (down
// to kCpuSplitCols) while the 2 x ceil(kv_width / cols) items give a thread fewer than
// kCpuSplitKvItemsPerThread (on 2 threads V3's 16384 columns run as 32 items of 1024), or while
// `rows` rows of them overflow kCpuSplitPanelFloats (7-12 rows: 512 columns, 13-24 rows: 256).
inline int64_t cpu_blocked_split_kv_cols(int64_t kv_width, int threads, int64_t rows) {
  int64_t cols = tiles::kCpuSplitKvMaxCols;
  while (cols > tiles::kCpuSplitCols &&
         (2 * ceil_div(kv_width, cols) < int64_t{tiles::kCpuSplitKvItemsPerThread} * threads ||
          rows * cols > tiles::kCpuSplitPanelFloats)) {
    cols /= 2;
  }
  return cols;
}
// cpu-blocked splits the weights' columns over the threads (instead of dealing out token tiles)
// for calls of at most this many tokens: one token tile where the bf16 products run on
// AVX512-BF16, one register tile otherwise (tile_sizes.h kCpuSplitDotMaxTokens says why).
inline int64_t cpu_blocked_split_tokens(bool bf16_dot) {
  return bf16_dot ? tiles::kCpuSplitDotMaxTokens : tiles::kCpuRows;
}

// The measured regions (problem only, no device query).
bool cuda_fused_faster(const Problem& p);
bool cuda_decode_fp32_faster(const Problem& p);  // also false where the kernels do not fit
bool cuda_decode_tc_faster(const Problem& p);    // also false where the kernel does not fit

// The rows' preferences: at most one true per problem on a backend. cuda_fused_preferred asks
// the device's shared-memory limit (cuda_fused_fits), cached per device.
inline bool cpu_blocked_preferred(const Problem&) { return true; }
bool cuda_fused_preferred(const Problem& p);
bool cuda_decode_fp32_preferred(const Problem& p);
bool cuda_decode_tc_preferred(const Problem& p);
bool cuda_gemm_preferred(const Problem& p);

// cuda-fused: the resident configuration (weights in shared memory) for this many token tiles.
inline bool fused_use_resident(int64_t tiles, bool weights_fit, int sm_count) {
  return weights_fit && tiles >= int64_t{kFusedResidentMinTilesPerSm} * sm_count;
}
// cuda-fused: once the streaming configuration's grid would pass this many blocks per SM (a second
// wave), the tensor-core configuration (one wave of 8-token tiles, below), else the token-tile
// one (D <= 256, R <= 64), else the cluster one (sm_90, aligned rows). Below it the streaming
// grid was faster (founding T=384, 192 blocks: 6.0 us against the cluster's best 7.0 and 6.09
// against the token tiles' 6.67); past it the others (T=733, 368 blocks: 10.6 against the
// cluster's 8.45). The token tiles against what ran there before them (H200, 2026-12-02 14:54
// UTC, the shipped kernel; the configurations before it in a 14:41 run): T=1057 7.57 us against
// the cluster's 8.76, T=2048 7.97 against 10.4, T=4096 11.1 against 14.7, T=6144 16.1 against
// 23.2, T=16384 29.6 against 55.4; inside the tensor-core window they lost (T=529 7.54 against
// 6.72, T=733 7.56 against 6.81). At T <= 64 the two were within 6% of each other. With the
// staging's layout as a template parameter instead of a runtime flag (19:10 UTC, same call):
// T=1057 7.04 against 7.57, T=2048 7.77 / 7.96, T=6144 15.4 / 16.1, T=16384 29.1 / 29.7.
constexpr int kFusedClusterMinStreamBlocksPerSm = 2;
inline bool fused_use_cluster(int64_t stream_blocks, int sm_count) {
  return stream_blocks > int64_t{kFusedClusterMinStreamBlocksPerSm} * sm_count;
}
// ... its blocks per cluster: 2 was the fastest of 1/2/4/8 at founding T = 384, 733 and 6144 (more
// blocks: each sums more partial latents over DSMEM and the hidden tile shrinks less than the
// weights' re-reads grow), and cp.async loads beat bulk copies there (8.45 against 8.62 us at
// T=733, 25.4 against 28.3 at T=6144).
inline int fused_cluster_blocks(int64_t /*tokens*/) { return 2; }
// ... and tokens per cluster: the fewest (a multiple of 4) that keep the clusters within one block
// per SM, so the latency-bound small calls spread over every SM with the least work per block; at
// most kFusedClusterMaxTokens, where many tokens amortize each block's weight slice.
inline int64_t fused_cluster_tile_tokens(int64_t tokens, int blocks, int sm_count) {
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  const int64_t fill = (tokens * blocks + sms - 1) / sms;
  const int64_t tile = (fill + 3) / 4 * 4;
  return tile < tiles::kFusedClusterMinTokens   ? tiles::kFusedClusterMinTokens
         : tile > tiles::kFusedClusterMaxTokens ? tiles::kFusedClusterMaxTokens
                                                : tile;
}
// cuda-fused's streaming configuration: the block's weights copied into shared memory at kernel
// start (one round trip instead of four dependent load batches) while the grid is at most one
// block per SM; a fuller grid's burst of copies (every block pulls all of w_down at once) loses
// to the spread-out loads. Founding dims, prefetch / not, same H200 run (16:06 UTC): T=1 4.55 /
// 5.23 us (2 blocks), T=7 4.80 / 5.37, T=64 4.97 / 5.37 (32 blocks), founding T=384 6.92 / 6.09
// (192 blocks).
inline bool fused_prefetch_weights(int64_t blocks, int sm_count) { return blocks <= sm_count; }
// cuda-decode bf16/fp16: 64-column up tiles for this many of them.
inline bool decode_tc_use_wide_tiles(int64_t wide_tiles, bool wide_fits, int sm_count) {
  return wide_fits && wide_tiles >= int64_t{kDecodeTcWideMinTilesPerSm} * sm_count;
}
// cuda-decode float32: tokens per pass, T itself for one or two (a 4-token pass for one token
// cost twice the time: the kernels are instruction-bound), else 4 (registers for two stages on
// one SM).
inline int decode_fp32_token_group(int64_t tokens) {
  return tokens <= 2 ? static_cast<int>(tokens) : 4;
}
// cuda-gemm: K and V as one GEMM batched over {w_up_k, w_up_v} in bf16/fp16 (the up projection's
// CTAs fill the GPU together); float32 keeps two GEMMs (cuBLAS's batched FFMA kernels were
// slower at some sizes).
inline bool gemm_batches_k_and_v(DType dtype) { return dtype != DType::kFloat32; }

}  // namespace latentkv::detail
