// The CUDA strategies' limits and preferences as the strategy table sees them (src/backends.h,
// src/heuristics.h, src/strategies.cpp): which problems each decode family takes, what it refuses
// and with which message, how much workspace its row asks for, where it was measured faster than
// cuda-gemm, and that at most one row is preferred for a problem. All of this is host logic that
// asks no device, so it runs here, without a GPU; the GPU suite runs the kernels on the same
// shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends.h"
#include "heuristics.h"
#include "mla_reference.h"
#include "testing.h"

namespace latentkv::testing {
namespace {

using detail::cuda_decode_args;
using detail::cuda_decode_fp32_fits;
using detail::cuda_decode_tc_fits;
// The measured regions (heuristics.h); the rows' preferences resolve their overlap.
bool cuda_fused_preferred(const Problem& p) { return detail::cuda_fused_faster(p); }
bool cuda_decode_fp32_preferred(const Problem& p) { return detail::cuda_decode_fp32_faster(p); }
bool cuda_decode_tc_preferred(const Problem& p) { return detail::cuda_decode_tc_faster(p); }

// The workspace the cuda-decode row of p.dtype asks for (the table's choice of row).
int64_t cuda_decode_workspace_size(const Problem& p) {
  return detail::table_workspace(detail::projection_strategies(), p, Backend::kCuda,
                                 Strategy::kCudaDecode, false);
}
// What both decode rows ask of the arguments, with the workspace of p.dtype's row.
Status cuda_decode_supports(const Problem& p, const Args& a) {
  return cuda_decode_args(p, a, cuda_decode_workspace_size(p));
}

Problem in_dtype(Problem p, DType dtype) {
  p.dtype = dtype;
  return p;
}

const Problem kV2Lite = shape(1, 1, 2048, 512, 16, 128);
const Problem kV3 = shape(1, 1, 7168, 512, 128, 128);

void expect_refused(const Status& s, StatusCode code, const std::string& names) {
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(names), std::string::npos) << s.message();
}

TEST(DecodeLimits, TensorCoreKernelsTakeUpToSixteenTokensIn16BitTypes) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t t : {1, 7, 16}) {
      EXPECT_TRUE(cuda_decode_tc_fits(in_dtype(shape(1, t, 7168, 512, 128, 128), dtype)).ok());
    }
    expect_refused(cuda_decode_tc_fits(in_dtype(shape(17, 1, 2048, 512, 16, 128), dtype)),
                   StatusCode::kUnsupported, "problem tokens (batch * seq) = 17");
  }
  expect_refused(cuda_decode_tc_fits(kV2Lite), StatusCode::kUnsupported, "float32");
  expect_refused(cuda_decode_fp32_fits(in_dtype(kV2Lite, DType::kBFloat16)),
                 StatusCode::kUnsupported, "bf16/fp16");
}

TEST(DecodeLimits, WeightRowsAreWholeSixteenByteVectors) {
  const Problem odd_rank = in_dtype(shape(1, 1, 64, 12, 2, 16), DType::kBFloat16);
  expect_refused(cuda_decode_tc_fits(odd_rank), StatusCode::kUnsupported, "problem.rank = 12");
  const Problem odd_width = in_dtype(shape(1, 1, 64, 16, 3, 6), DType::kFloat16);
  expect_refused(cuda_decode_tc_fits(odd_width), StatusCode::kUnsupported,
                 "heads * head_dim = 18");
  // float32 vectors are 4 elements: R = 12 is whole vectors there.
  EXPECT_TRUE(cuda_decode_fp32_fits(shape(1, 1, 64, 12, 2, 16)).ok());
}

TEST(DecodeLimits, SharedMemoryBoundsTheModelDimension) {
  // A down item holds its chunk of D (D / 2 rows at R = 512) of w_down's 8 columns and of the
  // hidden rows in shared memory.
  const Problem wide = in_dtype(shape(1, 1, 1 << 16, 512, 16, 128), DType::kBFloat16);
  expect_refused(cuda_decode_tc_fits(wide), StatusCode::kUnsupported, "shared memory");
  // Sizes whose plan would not even be computed in int: refused the same way.
  const Problem huge_rank = in_dtype(shape(1, 1, 64, 1 << 24, 1, 8), DType::kBFloat16);
  expect_refused(cuda_decode_tc_fits(huge_rank), StatusCode::kUnsupported, "shared memory");
  const Problem huge_dim = in_dtype(shape(1, 1, int64_t{1} << 29, 8, 1, 8), DType::kFloat16);
  expect_refused(cuda_decode_tc_fits(huge_dim), StatusCode::kUnsupported, "shared memory");
}

TEST(DecodeWorkspace, SizedForTheFamilyThatRuns) {
  // bf16/fp16: the down items' float32 partial latents, [chunks][T][R]. V2-Lite: 64 column tiles
  // of 8 x 2 chunks of D; R = 8: one column tile, and D = 64 is one chunk.
  EXPECT_EQ(cuda_decode_workspace_size(in_dtype(kV2Lite, DType::kBFloat16)), 4 * 2 * 1 * 512);
  EXPECT_EQ(cuda_decode_workspace_size(in_dtype(shape(2, 3, 2048, 512, 16, 128), DType::kBFloat16)),
            4 * 2 * 6 * 512);
  EXPECT_EQ(cuda_decode_workspace_size(in_dtype(shape(1, 1, 64, 8, 1, 8), DType::kFloat16)),
            4 * 1 * 1 * 8);
  // float32: the chunk partials and the latent.
  EXPECT_GT(cuda_decode_workspace_size(kV2Lite), 0);
  EXPECT_EQ(cuda_decode_workspace_size(shape(17, 1, 2048, 512, 16, 128)), 0);
}

TEST(DecodeDispatch, PreferredWhereMeasuredFaster) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t t : {1, 2, 4, 8, 16}) {
      // DeepSeek-V2-Lite up to 8 tokens (measured: 9.0 us at T = 8 against cuda-gemm's 9.1, 10.1
      // at T = 16 against 9.2); DeepSeek-V3's 41 MB never (18.9 at T = 1 against 17.1).
      EXPECT_EQ(cuda_decode_tc_preferred(in_dtype(shape(1, t, 2048, 512, 16, 128), dtype)),
                t <= 8);
      EXPECT_FALSE(cuda_decode_tc_preferred(in_dtype(shape(1, t, 7168, 512, 128, 128), dtype)));
    }
  }
  EXPECT_TRUE(cuda_decode_fp32_preferred(kV3));                        // T = 1
  EXPECT_TRUE(cuda_decode_fp32_preferred(shape(1, 4, 256, 48, 4, 32)));  // small weights
  EXPECT_FALSE(cuda_decode_fp32_preferred(shape(1, 2, 7168, 512, 128, 128)));
}

TEST(FusedDispatch, PreferredForSmallWeightsWhereMeasuredFaster) {
  // Small weights: T <= 1024 (measured at the founding dims before the token tiles: 10.7 us at
  // T = 1024 against cuda-gemm's 11.7, 14.3 at T = 2048 against 12.6); at the token tiles' widths
  // within one column block (D <= 256, R <= 64, 2N <= 256) up to 16384 tokens (T = 6144 16.1 us
  // against cuda-gemm's 23.5, T = 16384 29.6 against cuBLAS's 44.4).
  EXPECT_TRUE(cuda_fused_preferred(shape(4, 96, 256, 48, 4, 32)));
  EXPECT_TRUE(cuda_fused_preferred(shape(1, 1024, 256, 48, 4, 32)));
  EXPECT_TRUE(cuda_fused_preferred(shape(1, 1025, 256, 48, 4, 32)));
  EXPECT_TRUE(cuda_fused_preferred(shape(16, 384, 256, 48, 4, 32)));  // T = 6144
  EXPECT_TRUE(cuda_fused_preferred(shape(1, 16384, 255, 45, 3, 15)));   // odd widths
  EXPECT_FALSE(cuda_fused_preferred(shape(1, 16385, 256, 48, 4, 32)));
  EXPECT_FALSE(cuda_fused_preferred(shape(1, 1025, 260, 48, 4, 32)));  // D past 256
  EXPECT_FALSE(cuda_fused_preferred(shape(1, 1025, 256, 68, 4, 32)));  // R past 64
  EXPECT_FALSE(cuda_fused_preferred(shape(1, 1025, 128, 32, 4, 33)));  // 2N = 264: two blocks
  EXPECT_FALSE(cuda_fused_preferred(in_dtype(shape(4, 96, 256, 48, 4, 32), DType::kBFloat16)));
  EXPECT_FALSE(cuda_fused_preferred(shape(1, 64, 2048, 512, 16, 128)));  // DeepSeek-V2-Lite
}

TEST(DecodeArguments, RefusedWithTheArgumentNamed) {
  const Problem p = in_dtype(kV2Lite, DType::kBFloat16);
  alignas(16) static unsigned char storage[256];
  Args a = contiguous_args(p, storage, storage, storage, storage, storage);
  a.workspace = storage;
  a.workspace_bytes = cuda_decode_workspace_size(p);
  EXPECT_TRUE(cuda_decode_supports(p, a).ok());  // pointers are not dereferenced

  Args unaligned = a;
  unaligned.w_up_v = storage + 2;
  expect_refused(cuda_decode_supports(p, unaligned), StatusCode::kUnsupported, "16-byte aligned");
  Args padded = a;
  padded.w_down_stride_row = p.rank + 4;
  expect_refused(cuda_decode_supports(p, padded), StatusCode::kUnsupported,
                 "multiples of 8 elements");
  Args short_workspace = a;
  short_workspace.workspace_bytes -= 16;
  expect_refused(cuda_decode_supports(p, short_workspace), StatusCode::kInvalidArgument,
                 "args.workspace_bytes = " + std::to_string(a.workspace_bytes - 16));
  Args no_workspace = a;
  no_workspace.workspace = nullptr;
  expect_refused(cuda_decode_supports(p, no_workspace), StatusCode::kInvalidArgument,
                 "args.workspace_bytes");
}

// The table's two cuda-decode rows share one Strategy id and split the dtypes between them.
// cuda-mla-decode under kAuto: up to 16 tokens at any size and stage; on small weights (token
// windows) up to 64, the first stage alone on weights of at most 4 MB too, else 32
// (heuristics.h); cuda-mla-gemm past that.
TEST(MlaDecodeDispatch, SixteenTokensOrMoreInWindowsOnSmallWeights) {
  MlaProblem small = mla_shape(2048, 0, 512, 64, 16, 128, 128);  // V2-Lite bf16: 2.4 + 4.2 MB
  MlaProblem large = small;
  large.heads = 128;  // V3's kv_b: 33.5 MB
  MlaProblem v3_kv_a = large;
  v3_kv_a.model_dim = 7168;  // [kv_a] 8.3 MB: windows, but the first stage alone to 32 tokens
  for (MlaStage stage : {MlaStage::kBoth, MlaStage::kSecond, MlaStage::kFirst}) {
    small.stage = large.stage = v3_kv_a.stage = stage;
    EXPECT_TRUE(detail::mla_decode_token_windows(small)) << to_string(stage);
    EXPECT_EQ(detail::mla_decode_token_windows(large), stage == MlaStage::kFirst);
    for (int64_t tokens : {1, 16, 17, 32, 33, 64, 65}) {
      small.seq = large.seq = v3_kv_a.seq = tokens;
      EXPECT_EQ(detail::cuda_mla_decode_preferred(small), tokens <= 64)
          << "T = " << tokens << ", stage " << to_string(stage);
      EXPECT_EQ(detail::cuda_mla_decode_preferred(large),
                tokens <= 16 || (stage == MlaStage::kFirst && tokens <= 64))
          << "T = " << tokens << ", stage " << to_string(stage);
      EXPECT_EQ(detail::cuda_mla_decode_preferred(v3_kv_a),
                tokens <= 16 || (stage == MlaStage::kFirst && tokens <= 32))
          << "T = " << tokens << ", stage " << to_string(stage);
      EXPECT_NE(detail::cuda_mla_decode_preferred(small), detail::cuda_mla_gemm_preferred(small));
    }
  }
  MlaProblem with_q_a = mla_shape(7168, 1536, 512, 64, 8, 128, 128);  // a rank's 8 V3 heads
  with_q_a.seq = 32;  // kv_b 2.1 MB but [q_a; kv_a] 30 MB: no windows, so 16 tokens
  EXPECT_FALSE(detail::mla_decode_token_windows(with_q_a));
  EXPECT_FALSE(detail::cuda_mla_decode_preferred(with_q_a));
}

// The launchers' variants at the measured points (heuristics.h): cuda-fused's one-token
// configuration at T = 1 and 2 only, its tensor-core one within one wave (T = 1024 on 132 SMs,
// not 1280; one column block of 16 up tiles at 92 token tiles, two of 8 where 48 x 2 blocks fit
// the SMs); cuda-mla-decode's fold where stage B's blocks read at most 4 MB of partials (V2-Lite at
// T = 1: 64 blocks x 8 chunks x 576 rows x 4 B; not V3: 512 x 15), and the whole-row K2 at up to
// four round trips of partial loads (8 chunks a trip: V2-Lite's 8 and V3's 28 chunks; not 33),
// and its fused stage A and its programmatic K1 where they measured faster.
TEST(LauncherVariants, WhereTheyWereMeasured) {
  EXPECT_FALSE(detail::fused_use_one_token(0));
  EXPECT_TRUE(detail::fused_use_one_token(1));
  EXPECT_TRUE(detail::fused_use_one_token(2));
  EXPECT_FALSE(detail::fused_use_one_token(3));
  EXPECT_TRUE(detail::fused_use_tensor_core(128, 132));  // T = 1024: 128 tiles, one block each
  EXPECT_FALSE(detail::fused_use_tensor_core(160, 132));  // T = 1280: a second wave
  EXPECT_EQ(detail::fused_tc_up_tiles_per_block(92, 16, 132), 16);  // T = 733, 2N = 256
  EXPECT_EQ(detail::fused_tc_up_tiles_per_block(48, 16, 132), 8);   // T = 384: two column blocks
  EXPECT_TRUE(detail::mla_decode_fold_epilogue(int64_t{64} * 8 * 576 * 4));
  EXPECT_FALSE(detail::mla_decode_fold_epilogue(int64_t{512} * 15 * 576 * 4));
  EXPECT_TRUE(detail::mla_decode_fold_epilogue(detail::kMlaDecodeFoldMaxReadBytes));
  EXPECT_FALSE(detail::mla_decode_fold_epilogue(detail::kMlaDecodeFoldMaxReadBytes + 1));
  EXPECT_EQ(detail::mla_decode_window_tiles(17), 1);
  EXPECT_EQ(detail::mla_decode_window_tiles(48), 1);
  EXPECT_EQ(detail::mla_decode_window_tiles(49), 2);
  EXPECT_EQ(detail::mla_decode_window_tiles(64), 2);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(64, 7168, 0), 7);  // V3: 7 slices of 1024
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(64, 7168, 1536), 1);  // with q_a: one GEMM
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(384, 7168, 0), 7);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(385, 7168, 0), 2);  // two halves of 3584
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(512, 2048, 0), 2);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(513, 2048, 0), 1);  // V2-Lite: halves too shallow
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(2048, 7168, 0), 2);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(2049, 7168, 0), 1);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(400, 1536, 0), 2);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(400, 1280, 0), 1);  // halves not 256-column steps
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(400, 7168, 1536), 1);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(64, 1024, 0), 1);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(64, 3000, 0), 1);
  EXPECT_EQ(detail::mla_gemm_stage_a_splits(64, 9 * 1024, 0), 1);
  // cuda-mla-decode's held stage B asks for the largest L1 only where its grid has at most one
  // block per SM: V2-Lite's 64 blocks (T <= 16) and two windows of them (T = 32), not four
  // (T = 64) nor Kimi K2's 256.
  EXPECT_TRUE(detail::mla_decode_stage_b_spread(64, 132));
  EXPECT_TRUE(detail::mla_decode_stage_b_spread(2 * 64, 132));
  EXPECT_FALSE(detail::mla_decode_stage_b_spread(4 * 64, 132));
  EXPECT_FALSE(detail::mla_decode_stage_b_spread(256, 132));
  // K1's carveout beside stage B: the percent of the SM's shared memory (228 KB on Hopper) that
  // holds the bytes asked, rounded up, at most 100. V3 kv T=1: K1 2 KB, K2 3 KB, 4 ring blocks of
  // 6.2 KB: 14 % (the 32 KB configuration).
  EXPECT_EQ(detail::mla_decode_stage_a_carveout(30656, 233472), 14);
  EXPECT_EQ(detail::mla_decode_stage_a_carveout(2334, 233472), 1);
  EXPECT_EQ(detail::mla_decode_stage_a_carveout(2335, 233472), 2);
  EXPECT_EQ(detail::mla_decode_stage_a_carveout(233472, 233472), 100);
  EXPECT_EQ(detail::mla_decode_stage_a_carveout(400000, 233472), 100);
  EXPECT_EQ(detail::mla_decode_stage_a_carveout(1000, 0), 100);
  EXPECT_TRUE(detail::mla_decode_whole_rows((8 + 7) / 8));
  EXPECT_TRUE(detail::mla_decode_whole_rows((28 + 7) / 8));
  EXPECT_TRUE(detail::mla_decode_whole_rows((32 + 7) / 8));
  EXPECT_FALSE(detail::mla_decode_whole_rows((33 + 7) / 8));
  // cuda-mla-decode's fused stage A: with q_a to 16 tokens, both stages or the first alone; the
  // first stage alone without q_a to 4 tokens on V3's 8.3 MB, not V2-Lite's 2.4 MB; never the
  // whole path without q_a.
  const int64_t v3_q_kv = int64_t{2112} * 7168 * 2, v3_kv = int64_t{576} * 7168 * 2;
  const int64_t v2_lite_kv = int64_t{576} * 2048 * 2;
  EXPECT_TRUE(detail::mla_decode_fused_stage_a_preferred(1, true, false, v3_q_kv));
  EXPECT_TRUE(detail::mla_decode_fused_stage_a_preferred(16, true, true, v3_q_kv));
  EXPECT_FALSE(detail::mla_decode_fused_stage_a_preferred(17, true, true, v3_q_kv));
  EXPECT_TRUE(detail::mla_decode_fused_stage_a_preferred(1, false, true, v3_kv));
  EXPECT_TRUE(detail::mla_decode_fused_stage_a_preferred(4, false, true, v3_kv));
  EXPECT_FALSE(detail::mla_decode_fused_stage_a_preferred(5, false, true, v3_kv));
  EXPECT_FALSE(detail::mla_decode_fused_stage_a_preferred(1, false, false, v3_kv));
  EXPECT_FALSE(detail::mla_decode_fused_stage_a_preferred(1, false, true, v2_lite_kv));
  // K1 as a programmatic dependent of the kernel before the call: V2-Lite's 2.4 MB to 64 tokens
  // (with its L2 prefetch); not V3's 8.3 MB (T=16 slower).
  EXPECT_TRUE(detail::mla_decode_stage_a_programmatic(1, v2_lite_kv));
  EXPECT_TRUE(detail::mla_decode_stage_a_programmatic(64, v2_lite_kv));
  EXPECT_FALSE(detail::mla_decode_stage_a_programmatic(65, v2_lite_kv));
  EXPECT_FALSE(detail::mla_decode_stage_a_programmatic(1, v3_kv));
  EXPECT_TRUE(detail::mla_decode_stage_a_programmatic(1, detail::kMlaDecodeFirstWideWeightBytes));
  EXPECT_FALSE(
      detail::mla_decode_stage_a_programmatic(1, detail::kMlaDecodeFirstWideWeightBytes + 1));
  // Its L2 prefetch before the wait: with stage B after it, or past one token tile (16 tokens).
  EXPECT_TRUE(detail::mla_decode_stage_a_prefetch_l2(1, true));
  EXPECT_FALSE(detail::mla_decode_stage_a_prefetch_l2(16, false));
  EXPECT_TRUE(detail::mla_decode_stage_a_prefetch_l2(17, false));
  // cuda-fused's register-tile configuration at the founding widths (2N = 256) on 132 SMs, at the
  // points measured on 2026-12-04: 32 columns a block for T in 3..16, 256 for 17..64 and
  // 265..528, the one-token configuration below and the streaming configuration between.
  const auto cols = [](int64_t t, int64_t two_n) {
    return detail::fused_register_tile_cols(t, (t + 3) / 4, two_n, 132);
  };
  EXPECT_EQ(cols(2, 256), 0);
  EXPECT_EQ(cols(3, 256), 32);
  EXPECT_EQ(cols(16, 256), 32);
  EXPECT_EQ(cols(17, 256), 256);
  EXPECT_EQ(cols(64, 256), 256);
  EXPECT_EQ(cols(65, 256), 0);
  EXPECT_EQ(cols(132, 256), 0);
  EXPECT_EQ(cols(264, 256), 0);
  EXPECT_EQ(cols(265, 256), 256);
  EXPECT_EQ(cols(384, 256), 256);
  EXPECT_EQ(cols(528, 256), 256);
  EXPECT_EQ(cols(529, 256), 0);
  // Wider [K | V] rows count their column blocks: 2N = 512 halves each range.
  EXPECT_EQ(cols(8, 512), 32);
  EXPECT_EQ(cols(9, 512), 256);
  EXPECT_EQ(cols(265, 512), 0);
}

TEST(StrategyTable, OneRowPerStrategyAndDtypeFamily) {
  const auto& table = detail::projection_strategies();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (Strategy id : {Strategy::kCpuBlocked, Strategy::kCudaFused, Strategy::kCudaGemm,
                        Strategy::kCudaDecode}) {
      int rows = 0;
      for (const auto& row : table) rows += row.id == id && (row.dtypes & detail::dtype_bit(dtype));
      const bool expected = dtype == DType::kFloat32 || id == Strategy::kCpuBlocked ||
                            id == Strategy::kCudaGemm || id == Strategy::kCudaDecode;
      EXPECT_EQ(rows, expected ? 1 : 0) << to_string(id) << " " << to_string(dtype);
    }
  }
  // The fallback order: cpu-blocked, then cuda-gemm, cuda-fused, cuda-decode.
  ASSERT_GE(table.size, 4);
  EXPECT_EQ(table.rows[0].id, Strategy::kCpuBlocked);
  EXPECT_EQ(table.rows[1].id, Strategy::kCudaGemm);
  EXPECT_EQ(table.rows[2].id, Strategy::kCudaFused);
  EXPECT_EQ(table.rows[3].id, Strategy::kCudaDecode);
}

// Without a device, cuda-fused's shared-memory check fails and it is never preferred; the
// preferences of the other rows still come from the problem alone. At most one CUDA row is
// preferred for each of these shapes, and cuda-gemm exactly where no other is.
TEST(StrategyTable, AtMostOneRowPreferred) {
  std::vector<Problem> shapes = {kV2Lite, kV3, shape(1, 4, 256, 48, 4, 32),
                                 shape(1, 2, 7168, 512, 128, 128), shape(4, 96, 256, 48, 4, 32)};
  for (const Problem& p : edge_shapes()) shapes.push_back(p);
  for (Problem p : shapes) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      p.dtype = dtype;
      int preferred = 0;
      for (const auto& row : detail::projection_strategies()) {
        if (row.backend == Backend::kCuda && (row.dtypes & detail::dtype_bit(dtype))) {
          preferred += row.preferred(p);
        }
      }
      EXPECT_EQ(preferred, 1) << p.to_string();
    }
  }
}

// The rows' preferences in the order heuristics.h gives them: cuda-fused over float32
// cuda-decode where both won, cuda-gemm for everything the others do not take.
TEST(StrategyTable, PreferencesFollowTheMeasuredRegions) {
  const Problem one_token = shape(1, 1, 256, 48, 4, 32);  // both cuda-fused and decode won here
  EXPECT_TRUE(detail::cuda_fused_faster(one_token));
  EXPECT_TRUE(detail::cuda_decode_fp32_faster(one_token));
  EXPECT_EQ(detail::cuda_decode_fp32_preferred(one_token),
            !detail::cuda_fused_preferred(one_token));
  EXPECT_TRUE(detail::cuda_decode_fp32_preferred(kV3));
  EXPECT_FALSE(detail::cuda_gemm_preferred(kV3));
  EXPECT_TRUE(detail::cuda_gemm_preferred(shape(1, 2, 7168, 512, 128, 128)));
  const Problem v3_bf16 = in_dtype(kV3, DType::kBFloat16);
  EXPECT_TRUE(detail::cuda_gemm_preferred(v3_bf16));
  EXPECT_TRUE(detail::cuda_decode_tc_preferred(in_dtype(kV2Lite, DType::kBFloat16)));
}


// cpu-blocked's work split (heuristics.h): one thread below two threads' worth of FMAs; token
// tiles of whole register tiles that give the busiest thread the fewest tokens (the examples of
// the heuristic's comment, and for every T up to 600 on 1-8 threads: no other tile size gives the
// busiest thread fewer tokens, and no larger one as few); the few-token split's latent in one item
// a thread and its [K | V] items halved until each thread has kCpuSplitKvItemsPerThread, both in
// whole kCpuSplitCols blocks.
TEST(CpuBlockedHeuristics, ThreadsTokenTilesAndSplitColumns) {
  namespace tiles = detail::tiles;
  EXPECT_EQ(detail::cpu_blocked_threads(3.9e5, 8), 1);
  EXPECT_EQ(detail::cpu_blocked_threads(4e5, 8), 2);
  EXPECT_EQ(detail::cpu_blocked_threads(1.01e6, 8), 5);
  EXPECT_EQ(detail::cpu_blocked_threads(1e9, 8), 8);
  EXPECT_EQ(detail::cpu_blocked_threads(1e9, 1), 1);

  EXPECT_EQ(detail::cpu_blocked_tile_tokens(64, 2), 18);
  EXPECT_EQ(detail::cpu_blocked_tile_tokens(256, 2), 12);
  EXPECT_EQ(detail::cpu_blocked_tile_tokens(384, 1), tiles::kCpuTileTokens);
  auto busiest = [](int64_t t, int threads, int64_t tile) {
    return ((t + tile - 1) / tile + threads - 1) / threads * tile;
  };
  for (int threads = 1; threads <= 8; ++threads) {
    for (int64_t t = 1; t <= 600; ++t) {
      const int64_t chosen = detail::cpu_blocked_tile_tokens(t, threads);
      ASSERT_EQ(chosen % tiles::kCpuRows, 0) << t << " tokens on " << threads;
      ASSERT_LE(chosen, tiles::kCpuTileTokens);
      for (int64_t tile = tiles::kCpuRows; tile <= tiles::kCpuTileTokens;
           tile += tiles::kCpuRows) {
        ASSERT_GE(busiest(t, threads, tile), busiest(t, threads, chosen))
            << t << " tokens on " << threads << ": tile " << tile << " against " << chosen;
        if (tile > chosen) {
          ASSERT_GT(busiest(t, threads, tile), busiest(t, threads, chosen));
        }
      }
    }
  }

  EXPECT_EQ(detail::cpu_blocked_split_latent_cols(512, 2), 256);
  EXPECT_EQ(detail::cpu_blocked_split_latent_cols(512, 8), tiles::kCpuSplitCols);
  EXPECT_EQ(detail::cpu_blocked_split_latent_cols(512, 16), tiles::kCpuSplitCols);
  EXPECT_EQ(detail::cpu_blocked_split_latent_cols(200, 2), 128);
  EXPECT_EQ(detail::cpu_blocked_split_latent_cols(48, 4), tiles::kCpuSplitCols);
  // V3 on 2 threads: K and V as 32 items of 1024 columns, narrower as the rows grow past 6 (the
  // panel [rows, cols] within kCpuSplitPanelFloats)
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(128 * 128, 2, 1), tiles::kCpuSplitKvMaxCols);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(128 * 128, 2, 6), tiles::kCpuSplitKvMaxCols);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(128 * 128, 2, 7), 512);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(128 * 128, 2, 12), 512);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(128 * 128, 2, 24), 256);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(6 * 300, 2, 6), 512);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(6 * 300, 2, 16), 256);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(6 * 300, 4, 1), 256);
  EXPECT_EQ(detail::cpu_blocked_split_kv_cols(6 * 50, 2, 24), tiles::kCpuSplitCols);
  for (int64_t rows = 1; rows <= tiles::kCpuSplitDotMaxTokens; ++rows) {
    for (int threads = 1; threads <= 8; ++threads) {
      const int64_t cols = detail::cpu_blocked_split_kv_cols(128 * 128, threads, rows);
      ASSERT_EQ(cols % tiles::kCpuSplitCols, 0) << rows << " rows, " << threads << " threads";
      ASSERT_LE(rows * cols, tiles::kCpuSplitPanelFloats) << rows << " rows, " << threads;
    }
  }
  EXPECT_EQ(detail::cpu_blocked_split_tokens(true), tiles::kCpuTileTokens);
  EXPECT_EQ(detail::cpu_blocked_split_tokens(false), tiles::kCpuRows);
}

}  // namespace
}  // namespace latentkv::testing
