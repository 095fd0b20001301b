// Correctness of the CPU backend against the float64 reference: random shapes, edge shapes from the
// tile sizes, presets, packed and padded strides, with and without the latent output. Outputs and
// the padding of every buffer start as NaN, so an element never written, or a read of padding,
// shows as a non-finite error. The refusals of check()/run() are in test_validation.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/bf16_dot.h"
#include "cpu/elements.h"
#include "cuda/tile_sizes.h"
#include "testing.h"

namespace latentkv::testing {
namespace {

constexpr uint64_t kSeed = 20261129;
constexpr int64_t kPad = 3;  // odd, so padded rows are not 16-byte aligned
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

Options cpu_options() {
  Options o;
  o.backend = Backend::kCpu;
  return o;
}

// Runs p on the CPU under strides `a` and compares out (and latent) with float64 at
// kFloat32Tolerance = 1e-5 relative Frobenius error: float32 sums over D and R terms land at
// ~1e-7..1e-6 for these shapes, so 1e-5 leaves 10x headroom, while one wrong element among a
// thousand already gives ~3e-2.
void expect_matches_reference(const Problem& p, const Args& a, bool with_latent) {
  SCOPED_TRACE(p.to_string() + (with_latent ? " with latent" : " without latent"));
  const HostInputs in = random_inputs(p, kSeed);
  std::vector<double> ref_out, ref_latent;
  reference_kv_proj(p, in, &ref_out, &ref_latent);
  StridedBuffers call = strided_buffers(p, in, a, with_latent);
  const Status s = run(p, call.args, cpu_options());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_LE(relative_error(gather(call.out.data(), call.out_offsets).data(), ref_out),
            kFloat32Tolerance);
  EXPECT_EQ(count_not_nan(call.out), static_cast<int64_t>(call.out_offsets.size()))
      << "out padding was written";
  if (with_latent) {
    EXPECT_LE(relative_error(gather(call.latent.data(), call.latent_offsets).data(), ref_latent),
              kFloat32Tolerance);
    EXPECT_EQ(count_not_nan(call.latent), static_cast<int64_t>(call.latent_offsets.size()))
        << "latent padding was written";
  }
}

// Packed and padded strides, latent off and on.
void expect_all_layouts_match(const Problem& p) {
  for (int64_t pad : {int64_t{0}, kPad}) {
    SCOPED_TRACE("pad " + std::to_string(pad));
    for (bool with_latent : {false, true}) {
      expect_matches_reference(p, padded_args(p, pad), with_latent);
    }
  }
}

std::string shape_name(const ::testing::TestParamInfo<Problem>& info) {
  return std::to_string(info.index) + "_" + problem_id(info.param);
}

class CpuShapes : public ::testing::TestWithParam<Problem> {};

TEST_P(CpuShapes, MatchesFloat64) { expect_all_layouts_match(GetParam()); }

// The shapes of the one case list (tests/common/cases.h) whose float64 reference is quick.
INSTANTIATE_TEST_SUITE_P(Random, CpuShapes,
                         ::testing::ValuesIn(problems(random_cases(kRandomCount, kRandomSeed),
                                                      kCpuCheap)),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(Edge, CpuShapes, ::testing::ValuesIn(problems(edge_cases(), kCpuCheap)),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(Decode, CpuShapes,
                         ::testing::ValuesIn(problems(decode_cases(), kCpuCheap)), shape_name);

// Every preset, packed, with the latent (deepseek-v3's float64 reference is ~1 s).
TEST(CpuPresets, MatchFloat64) {
  for (const NamedCase& c : preset_cases()) {
    SCOPED_TRACE(c.name);
    expect_matches_reference(c.problem, padded_args(c.problem, 0), true);
  }
}

// bf16 / fp16 (cpu-blocked reads the weights in place, widening them): inputs rounded to the dtype,
// buffers in its bytes, outputs and padding poisoned with NaN; out and latent within 2x the error
// of the unfused computation in that dtype against the float64 reference (unfused_tolerances).
void expect_half_matches_reference(Problem p, DType dtype, const Args& strides, bool with_latent) {
  p.dtype = dtype;
  SCOPED_TRACE(p.to_string() + (with_latent ? " with latent" : " without latent"));
  const HostInputs in = random_inputs(p, kSeed);
  std::vector<double> ref_out, ref_latent;
  reference_kv_proj(p, in, &ref_out, &ref_latent);
  const Tolerances tol = unfused_tolerances(p, in, ref_out, ref_latent);
  const StridedBuffers call = strided_buffers(p, in, strides, with_latent);
  std::vector<unsigned char> hidden = to_bytes(call.hidden, dtype);
  std::vector<unsigned char> w_down = to_bytes(call.w_down, dtype);
  std::vector<unsigned char> w_up_k = to_bytes(call.w_up_k, dtype);
  std::vector<unsigned char> w_up_v = to_bytes(call.w_up_v, dtype);
  std::vector<unsigned char> out = to_bytes(call.out, dtype);
  std::vector<unsigned char> latent = to_bytes(call.latent, dtype);
  Args a = call.args;
  a.hidden = hidden.data();
  a.w_down = w_down.data();
  a.w_up_k = w_up_k.data();
  a.w_up_v = w_up_v.data();
  a.out = out.data();
  a.latent = with_latent ? latent.data() : nullptr;
  const Status s = run(p, a, cpu_options());
  ASSERT_TRUE(s.ok()) << s.message();
  const std::vector<float> got_out = from_bytes(out, dtype);
  EXPECT_LE(relative_error(gather(got_out.data(), call.out_offsets).data(), ref_out), tol.out);
  EXPECT_EQ(count_not_nan(got_out), static_cast<int64_t>(call.out_offsets.size()))
      << "out padding was written";
  if (with_latent) {
    const std::vector<float> got_latent = from_bytes(latent, dtype);
    EXPECT_LE(relative_error(gather(got_latent.data(), call.latent_offsets).data(), ref_latent),
              tol.latent);
    EXPECT_EQ(count_not_nan(got_latent), static_cast<int64_t>(call.latent_offsets.size()))
        << "latent padding was written";
  }
}

class CpuHalfShapes : public ::testing::TestWithParam<Problem> {};

TEST_P(CpuHalfShapes, MatchesFloat64) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t pad : {int64_t{0}, kPad}) {
      for (bool with_latent : {false, true}) {
        SCOPED_TRACE(std::string(to_string(dtype)) + ", pad " + std::to_string(pad));
        expect_half_matches_reference(GetParam(), dtype, padded_args(GetParam(), pad), with_latent);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Edge, CpuHalfShapes,
                         ::testing::ValuesIn(problems(edge_cases(), kCpuCheap)), shape_name);
INSTANTIATE_TEST_SUITE_P(Decode, CpuHalfShapes,
                         ::testing::ValuesIn(problems(decode_cases(), kCpuCheap)), shape_name);

// At T <= 6 with >= 4e5 FMAs, cpu-blocked splits the weights' columns across the pool's threads
// (on a machine with >= 2 cores; with one, the token tile runs): R = 200 leaves a partial 64-column
// block, N = 300 has heads of 50 that cross the blocks, D = 1500 a tail of the 8-lane rows, and the
// (B, S) pairs cover the token index split. N = 1800 (heads of 300) takes wider [K | V] blocks
// on 2 threads (512 columns, the last one partial). Every dtype, padded strides, with the latent.
TEST(CpuThreads, FewTokensSplitTheWeightColumns) {
  const std::pair<int64_t, int64_t> batch_seq[] = {{1, 1}, {2, 1}, {1, 5}, {2, 3}, {3, 2}, {6, 1}};
  for (const auto& [b, sq] : batch_seq) {
    for (const Problem& p : {shape(b, sq, 1500, 200, 6, 50), shape(b, sq, 1500, 200, 6, 300)}) {
      expect_matches_reference(p, padded_args(p, kPad), true);
      for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
        expect_half_matches_reference(p, dtype, padded_args(p, kPad), true);
        expect_half_matches_reference(p, dtype, padded_args(p, 0), false);
      }
    }
  }
}

// A token's K, V and latent are the same bits whatever else the call holds: alone or with one more
// (T = 1, 2: the few-token split), in a split of 6, and in token tiles (T = 13: 12 and a one-row
// tile; T = 24: two of 12; T = 25: 18 and 7; T = 40: 24 and 16), or for bf16 on AVX512-BF16 in
// splits of 13 and 24 rows (25: tiles again). Every dtype; D = 1500 and R = 200 leave partial
// blocks, N = 1800 takes the split's wide [K | V] items and the token tiles' float32 up products'
// column x k blocks. The sums' order depends only on k. (bf16 / fp16 outputs hide most float32
// accumulator differences in their rounding; CpuBf16Dot.RowsAreTheSameBitsInEveryTile checks the
// bf16 products' accumulators themselves.)
TEST(CpuThreads, ATokensOutputsAreTheSameBitsInEveryCall) {
  const Problem whole = shape(1, 40, 1500, 200, 6, 300);
  const HostInputs in = random_inputs(whole, kSeed);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(to_string(dtype));
    // out [2, 1, S, H, Dh] and latent [1, S, R] of the first `seq` tokens, in dtype bytes.
    auto call = [&](int64_t seq, std::vector<unsigned char>* out,
                    std::vector<unsigned char>* latent) {
      Problem p = shape(1, seq, whole.model_dim, whole.rank, whole.heads, whole.head_dim);
      p.dtype = dtype;
      const std::vector<float> hidden(in.hidden.begin(),
                                      in.hidden.begin() + seq * whole.model_dim);
      std::vector<unsigned char> x = to_bytes(hidden, dtype), w_down = to_bytes(in.w_down, dtype),
                                 w_up_k = to_bytes(in.w_up_k, dtype),
                                 w_up_v = to_bytes(in.w_up_v, dtype);
      *out = to_bytes(std::vector<float>(2 * seq * whole.kv_width(), kPoison), dtype);
      *latent = to_bytes(std::vector<float>(seq * whole.rank, kPoison), dtype);
      Args a = padded_args(p, 0);
      a.hidden = x.data();
      a.w_down = w_down.data();
      a.w_up_k = w_up_k.data();
      a.w_up_v = w_up_v.data();
      a.out = out->data();
      a.latent = latent->data();
      const Status s = run(p, a, cpu_options());
      ASSERT_TRUE(s.ok()) << s.message();
    };
    std::vector<unsigned char> out40, latent40;
    call(whole.seq, &out40, &latent40);
    const size_t bytes = element_size(dtype);
    const size_t row = whole.kv_width() * bytes;  // one token's K (or V)
    for (int64_t seq : {1, 2, 6, 13, 24, 25}) {
      SCOPED_TRACE("seq " + std::to_string(seq));
      std::vector<unsigned char> out, latent;
      call(seq, &out, &latent);
      for (int64_t kv = 0; kv < 2; ++kv) {
        EXPECT_EQ(0, std::memcmp(out.data() + kv * seq * row, out40.data() + kv * whole.seq * row,
                                 seq * row))
            << (kv == 0 ? "K" : "V");
      }
      EXPECT_EQ(0, std::memcmp(latent.data(), latent40.data(), seq * whole.rank * bytes));
    }
  }
}

// The CPU backend's eight-at-a-time rounding (store_elements, round_row) gives the bits of the
// CUDA toolkit's one-element conversions (store_element) on random float32 bit patterns and on
// every special case: signed zeros, subnormals of both types, ties to even, the largest finite
// values and their overflow, infinities and NaNs (stored as the toolkit's 0x7fff; widened back, any
// NaN).
TEST(CpuElements, EightAtATimeRoundsAsTheToolkit) {
  auto float_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  auto bits_float = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  std::mt19937 rng(kSeed);
  std::vector<uint32_t> patterns = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                    0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu,
                                    0x7f7f8000u, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                    0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x33800000u,
                                    0x33000000u, 0x477ff000u, 0x477fe000u, 0x38800000u,
                                    0x387fc000u, 0x3f802000u, 0x3f803000u, 0xc7800000u};
  for (int i = 0; i < 1 << 16; ++i) patterns.push_back(static_cast<uint32_t>(rng()));
  for (int i = 0; i < 1 << 14; ++i) {  // values near fp16's range and subnormals
    std::uniform_real_distribution<float> exponent(-26.0f, 17.0f);
    patterns.push_back(float_bits(std::ldexp(1.0f + (rng() % 1024) / 1024.0f,
                                             static_cast<int>(exponent(rng)))) ^
                       ((rng() & 1u) << 31));
  }
  patterns.resize(patterns.size() / 8 * 8 + 5);  // a tail the scalar path takes
  std::vector<float> values(patterns.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = bits_float(patterns[i]);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(to_string(dtype));
    const int64_t n = static_cast<int64_t>(values.size());
    std::vector<uint16_t> scalar(n), vector(n), bits(n);
    for (int64_t i = 0; i < n; ++i) detail::store_element(scalar.data(), i, dtype, values[i]);
    detail::store_elements(vector.data(), 0, dtype, values.data(), n);
    std::vector<float> rounded = values;
    detail::round_row(rounded.data(), n, dtype, bits.data());
    int64_t stores_differ = 0, bits_differ = 0, values_differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      stores_differ += vector[i] != scalar[i];
      bits_differ += bits[i] != scalar[i];
      const float expected = detail::load_element(scalar.data(), i, dtype);
      values_differ += std::isnan(expected) ? !std::isnan(rounded[i])
                                            : float_bits(rounded[i]) != float_bits(expected);
    }
    EXPECT_EQ(stores_differ, 0);
    EXPECT_EQ(bits_differ, 0);
    EXPECT_EQ(values_differ, 0);
  }
}

// cpu-blocked's bf16 products run on AVX512-BF16 where the CPU has it, unless LATENTKV_CPU_ISA=avx2
// caps the instruction set (and the public cpu_bf16_isa() says which); ctest runs the half-type
// suites a second time under that cap (latentkv_test_cpu_half_avx2), so both paths are tested on
// such a CPU.
TEST(CpuIsa, Bf16DotProductsFollowTheCpuAndTheCap) {
  const char* isa = std::getenv("LATENTKV_CPU_ISA");
  const bool capped = isa != nullptr && std::string(isa) == "avx2";
  __builtin_cpu_init();
  const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  EXPECT_EQ(detail::bf16_dot_enabled(), cpu && !capped) << "LATENTKV_CPU_ISA=" << (isa ? isa : "");
  EXPECT_STREQ(cpu_bf16_isa(), cpu && !capped ? "avx512-bf16" : "avx2");
}

// The public bound of the CPU decode regime: one token tile for bf16 on AVX512-BF16, one register
// tile for everything else.
TEST(CpuIsa, SplitTokensFollowTheBf16Products) {
  EXPECT_EQ(cpu_split_tokens(DType::kBFloat16),
            detail::bf16_dot_enabled() ? detail::tiles::kCpuTileTokens : detail::tiles::kCpuRows);
  EXPECT_EQ(cpu_split_tokens(DType::kFloat32), detail::tiles::kCpuRows);
  EXPECT_EQ(cpu_split_tokens(DType::kFloat16), detail::tiles::kCpuRows);
}

// The AVX512-BF16 product itself over the edges of its register tiles: rows 1..13 (whole groups of
// 6 and every leftover count), odd and even k (the last pair half zero), column tails around its
// 16-column vectors and 64-column tiles, overwrite and accumulate. Each c row is followed by NaN
// padding, which must stay NaN (masked stores), and every value must be within the float32
// summation bound (k + 1) * 2^-24 * sum |a w| of the float64 product (bf16 products are exact in
// float32, so the sums' rounding is the only error).
TEST(CpuBf16Dot, MatchesFloat64AtTheTileEdges) {
  if (!detail::bf16_dot_enabled()) GTEST_SKIP() << "this CPU has no AVX512-BF16 (or it is capped)";
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bf16 = [&] {  // a random bf16 value: its bits and its value
    const uint16_t bits = detail::float_to_bf16(normal(rng));
    return std::pair<uint16_t, double>(bits, detail::bf16_to_float(bits));
  };
  constexpr int64_t kPadCols = 20;
  for (int rows : {1, 2, 3, 5, 6, 7, 12, 13}) {
    for (int64_t k_len : {1, 2, 3, 64, 255, 256}) {
      for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 200}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE("rows " + std::to_string(rows) + " k " + std::to_string(k_len) + " n " +
                       std::to_string(n) + (accumulate ? " accumulate" : ""));
          const int64_t lda = k_len + 3, ldw = n + 5, ldc = n + kPadCols;
          std::vector<uint16_t> a(rows * lda), w(k_len * ldw);
          std::vector<double> a_val(a.size()), w_val(w.size());
          for (size_t i = 0; i < a.size(); ++i) std::tie(a[i], a_val[i]) = bf16();
          for (size_t i = 0; i < w.size(); ++i) std::tie(w[i], w_val[i]) = bf16();
          std::vector<float> c(rows * ldc, std::numeric_limits<float>::quiet_NaN());
          std::vector<float> c0(c.size());
          for (int i = 0; i < rows; ++i) {
            for (int64_t j = 0; j < n; ++j) c0[i * ldc + j] = accumulate ? normal(rng) : 0.0f;
            if (accumulate) std::copy_n(&c0[i * ldc], n, &c[i * ldc]);
          }
          std::vector<const uint16_t*> a_rows(rows);
          std::vector<float*> c_rows(rows);
          for (int i = 0; i < rows; ++i) {
            a_rows[i] = a.data() + i * lda;
            c_rows[i] = c.data() + i * ldc;
          }
          detail::gemm_bf16_dot(a_rows.data(), rows, k_len, w.data(), ldw, n, c_rows.data(),
                                accumulate);
          int64_t bad = 0, padding_written = 0;
          for (int i = 0; i < rows; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double ref = c0[i * ldc + j], magnitude = std::fabs(ref);
              for (int64_t k = 0; k < k_len; ++k) {
                ref += a_val[i * lda + k] * w_val[k * ldw + j];
                magnitude += std::fabs(a_val[i * lda + k] * w_val[k * ldw + j]);
              }
              const double bound = (k_len + 1) * std::ldexp(magnitude, -24);
              if (!(std::fabs(c[i * ldc + j] - ref) <= bound)) ++bad;
            }
            for (int64_t j = n; j < ldc; ++j) padding_written += !std::isnan(c[i * ldc + j]);
          }
          EXPECT_EQ(bad, 0);
          EXPECT_EQ(padding_written, 0);
        }
      }
    }
  }
}

// The bf16 products' float32 accumulators are the same bits for a row alone, with one more (both
// streamed in blocks of k), and in a tile of 7 rows (six in one register tile, one in its own,
// whole k): k lengths around the stream's blocks (odd ones end in a zero-paired k), column tails.
TEST(CpuBf16Dot, RowsAreTheSameBitsInEveryTile) {
  if (!detail::bf16_dot_enabled()) GTEST_SKIP() << "this CPU has no AVX512-BF16 (or it is capped)";
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int kTileRows = 7;
  for (int64_t k_len : {1, 7, 8, 9, 17, 255, 256, 2001}) {
    for (int64_t n : {1, 65, 200, 1100}) {
      SCOPED_TRACE("k " + std::to_string(k_len) + " n " + std::to_string(n));
      std::vector<uint16_t> a(kTileRows * k_len), w(k_len * n);
      for (uint16_t& x : a) x = detail::float_to_bf16(normal(rng));
      for (uint16_t& x : w) x = detail::float_to_bf16(normal(rng));
      std::vector<float> tile(kTileRows * n), alone(2 * n);
      std::vector<const uint16_t*> a_rows(kTileRows);
      std::vector<float*> c_rows(kTileRows);
      for (int i = 0; i < kTileRows; ++i) {
        a_rows[i] = a.data() + i * k_len;
        c_rows[i] = tile.data() + i * n;
      }
      detail::gemm_bf16_dot(a_rows.data(), kTileRows, k_len, w.data(), n, n, c_rows.data(), false);
      for (int rows : {1, 2}) {
        for (int i = 0; i + rows <= kTileRows; ++i) {
          float* out_rows[2] = {alone.data(), alone.data() + n};
          detail::gemm_bf16_dot(a_rows.data() + i, rows, k_len, w.data(), n, n, out_rows, false);
          EXPECT_EQ(0, std::memcmp(alone.data(), tile.data() + i * n, rows * n * sizeof(float)))
              << rows << " rows from row " << i;
        }
      }
    }
  }
}

// Every preset in both half types, packed, with the latent.
TEST(CpuHalfPresets, MatchFloat64) {
  for (const NamedCase& c : preset_cases()) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(c.name + " " + to_string(dtype));
      expect_half_matches_reference(c.problem, dtype, padded_args(c.problem, 0), true);
    }
  }
}

// A dimension of extent 1 may carry any non-negative stride, 0 included.
TEST(CpuStrides, ExtentOneDimensionsTakeAnyStride) {
  Problem p;
  find_preset("seed", &p);
  p.batch = 1;
  p.heads = 1;
  Args a = padded_args(p, kPad);
  a.hidden_stride_batch = 0;
  a.out_stride_batch = 0;
  a.latent_stride_batch = 0;
  a.out_stride_head = 5;
  expect_matches_reference(p, a, true);
}

// Several host threads calling run() at once: one gets the pool, the others run alone; every
// result must still be right.
TEST(CpuThreads, ConcurrentCallsAreCorrect) {
  Problem p;
  ASSERT_TRUE(find_preset("seed", &p));
  const HostInputs in = random_inputs(p, kSeed);
  std::vector<double> ref_out;
  reference_kv_proj(p, in, &ref_out, nullptr);
  constexpr int kCallers = 4, kCalls = 8;
  std::vector<std::vector<float>> outs(kCallers, std::vector<float>(ref_out.size()));
  std::vector<Status> statuses(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int i = 0; i < kCalls && statuses[c].ok(); ++i) {
        std::fill(outs[c].begin(), outs[c].end(), kPoison);
        statuses[c] = run(p,
                          contiguous_args(p, in.hidden.data(), in.w_down.data(), in.w_up_k.data(),
                                          in.w_up_v.data(), outs[c].data()),
                          cpu_options());
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    ASSERT_TRUE(statuses[c].ok()) << statuses[c].message();
    EXPECT_LE(relative_error(outs[c].data(), ref_out), kFloat32Tolerance) << "caller " << c;
  }
}

TEST(CpuApi, ContiguousArgsArePackedStrides) {
  Problem p;
  ASSERT_TRUE(find_preset("seed", &p));
  float x = 0, y = 0;
  const Args a = contiguous_args(p, &x, &x, &x, &x, &y, &y);
  const Args b = padded_args(p, 0);
  EXPECT_EQ(a.hidden_stride_batch, 96 * 256);
  EXPECT_EQ(a.hidden_stride_seq, b.hidden_stride_seq);
  EXPECT_EQ(a.hidden_stride_batch, b.hidden_stride_batch);
  EXPECT_EQ(a.w_down_stride_row, b.w_down_stride_row);
  EXPECT_EQ(a.w_up_k_stride_row, b.w_up_k_stride_row);
  EXPECT_EQ(a.w_up_v_stride_row, b.w_up_v_stride_row);
  EXPECT_EQ(a.out_stride_kv, 4 * 96 * 128);
  EXPECT_EQ(a.out_stride_kv, b.out_stride_kv);
  EXPECT_EQ(a.out_stride_batch, b.out_stride_batch);
  EXPECT_EQ(a.out_stride_seq, b.out_stride_seq);
  EXPECT_EQ(a.out_stride_head, b.out_stride_head);
  EXPECT_EQ(a.latent_stride_batch, b.latent_stride_batch);
  EXPECT_EQ(a.latent_stride_seq, b.latent_stride_seq);
  EXPECT_EQ(a.hidden, &x);
  EXPECT_EQ(a.out, &y);
  EXPECT_EQ(a.latent, &y);
  EXPECT_EQ(contiguous_args(p, &x, &x, &x, &x, &y).latent, nullptr);
}

TEST(CpuApi, FlopsAndBytes) {
  Problem p;
  ASSERT_TRUE(find_preset("seed", &p));
  // 2*T*D*R + 4*T*R*N with T = 384, D = 256, R = 48, N = 128.
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * 384 * 256 * 48 + 4.0 * 384 * 48 * 128);
  // 4 bytes * (T*D + D*R + 2*R*N + 2*T*N).
  EXPECT_DOUBLE_EQ(p.min_bytes(), 4.0 * (384 * 256 + 256 * 48 + 2 * 48 * 128 + 2 * 384 * 128));
  p.dtype = DType::kBFloat16;
  EXPECT_DOUBLE_EQ(p.min_bytes(), 2.0 * (384 * 256 + 256 * 48 + 2 * 48 * 128 + 2 * 384 * 128));
  EXPECT_EQ(p.tokens(), 384);
  EXPECT_EQ(p.kv_width(), 128);
  EXPECT_NE(p.to_string().find("B=4 S=96 D=256 R=48 H=4 Dh=32"), std::string::npos);
}

TEST(CpuApi, SelectsTheBlockedStrategy) {
  Problem p;
  ASSERT_TRUE(find_preset("seed", &p));
  const HostInputs in = random_inputs(p, kSeed);
  std::vector<float> out(2 * p.tokens() * p.kv_width());
  const Args a = contiguous_args(p, in.hidden.data(), in.w_down.data(), in.w_up_k.data(),
                                 in.w_up_v.data(), out.data());
  Strategy s = Strategy::kAuto;
  ASSERT_TRUE(select_strategy(p, a, cpu_options(), &s).ok());
  EXPECT_EQ(s, Strategy::kCpuBlocked);
  EXPECT_TRUE(backend_available(Backend::kCpu));
  if (!backend_available(Backend::kCuda)) {
    EXPECT_EQ(resolve_backend(Backend::kAuto), Backend::kCpu);
  }
}

TEST(CpuTesting, RoundToDtype) {
  // Ties go to the even neighbour: bf16's ulp at 1 is 2^-7, fp16's is 2^-10.
  EXPECT_EQ(round_to_dtype(1.0f + 0x1.0p-8f, DType::kBFloat16), 1.0f);
  EXPECT_EQ(round_to_dtype(1.0f + 0x1.8p-7f, DType::kBFloat16), 1.0f + 0x1.0p-6f);
  EXPECT_EQ(round_to_dtype(1.0f + 0x1.2p-7f, DType::kBFloat16), 1.0f + 0x1.0p-7f);
  EXPECT_EQ(round_to_dtype(1.0f + 0x1.0p-11f, DType::kFloat16), 1.0f);
  EXPECT_EQ(round_to_dtype(1.0f + 0x1.8p-10f, DType::kFloat16), 1.0f + 0x1.0p-9f);
  EXPECT_EQ(round_to_dtype(0x1.0p-25f, DType::kFloat16), 0.0f);  // fp16 subnormal quantum 2^-24
  EXPECT_EQ(round_to_dtype(3.0f * 0x1.0p-25f, DType::kFloat16), 0x1.0p-23f);
  EXPECT_TRUE(std::isinf(round_to_dtype(70000.0f, DType::kFloat16)));
  EXPECT_EQ(round_to_dtype(0.1f, DType::kFloat32), 0.1f);
}

TEST(CpuTesting, RelativeErrorIsInfiniteOnNonFinite) {
  const std::vector<double> ref = {1.0, 2.0};
  const float good[] = {1.0f, 2.0f};
  const float nan[] = {1.0f, kPoison};
  const float inf[] = {std::numeric_limits<float>::infinity(), 2.0f};
  EXPECT_EQ(relative_error(good, ref), 0.0);
  EXPECT_TRUE(std::isinf(relative_error(nan, ref)));
  EXPECT_TRUE(std::isinf(relative_error(inf, ref)));
}

}  // namespace
}  // namespace latentkv::testing
