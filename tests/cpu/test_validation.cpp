// Every refusal of check()/run(): the right StatusCode, a message naming the argument, and no byte
// of any buffer changed (outputs hold a sentinel pattern before the call). The calls go through the
// CPU backend, but the validation is the API layer's, shared by every backend. Also what is not
// refused: a zero dimension, whose result is the unfused math's (empty, or empty sums: zeros).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "testing.h"

namespace latentkv::testing {
namespace {

constexpr unsigned char kSentinel = 0xA5;
constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();

class Refusals : public ::testing::Test {
 protected:
  // Every dimension > 1, so every stride is checked. N = 6.
  Problem p = make_problem();
  std::vector<float> hidden, w_down, w_up_k, w_up_v;
  // out and latent share one allocation (out first), large enough for the aliasing tests.
  std::vector<float> outputs;
  Args a;
  Options cpu;

  static Problem make_problem() {
    Problem q;
    q.batch = 2;
    q.seq = 3;
    q.model_dim = 5;
    q.rank = 4;
    q.heads = 2;
    q.head_dim = 3;
    return q;
  }

  void SetUp() override {
    const HostInputs in = random_inputs(p, 1);
    hidden = in.hidden;
    w_down = in.w_down;
    w_up_k = in.w_up_k;
    w_up_v = in.w_up_v;
    const int64_t out_elems = 2 * p.tokens() * p.kv_width();
    outputs.assign(static_cast<size_t>(out_elems + p.tokens() * p.rank), 0.0f);
    a = contiguous_args(p, hidden.data(), w_down.data(), w_up_k.data(), w_up_v.data(),
                        outputs.data(), outputs.data() + out_elems);
    cpu.backend = Backend::kCpu;
  }

  // check() and run() must both refuse with `code` and a message containing `needle`, and leave
  // every buffer as it was.
  void expect_refused(const Problem& q, const Args& args, const Options& o, StatusCode code,
                      const std::string& needle) {
    std::memset(outputs.data(), kSentinel, outputs.size() * sizeof(float));
    const std::vector<std::vector<float>*> buffers = {&hidden, &w_down, &w_up_k, &w_up_v, &outputs};
    std::vector<std::vector<unsigned char>> before;
    for (const std::vector<float>* b : buffers) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(b->data());
      before.emplace_back(bytes, bytes + b->size() * sizeof(float));
    }
    const Status checked = check(q, args, o);
    const Status ran = run(q, args, o);
    EXPECT_EQ(checked.code(), code) << to_string(checked.code()) << ": " << checked.message();
    EXPECT_EQ(ran.code(), code) << to_string(ran.code()) << ": " << ran.message();
    EXPECT_NE(ran.message().find(needle), std::string::npos)
        << "message \"" << ran.message() << "\" does not name " << needle;
    EXPECT_EQ(checked.message(), ran.message());
    for (size_t i = 0; i < buffers.size(); ++i) {
      EXPECT_EQ(std::memcmp(before[i].data(), buffers[i]->data(), before[i].size()), 0)
          << "buffer " << i << " changed by a refused call";
    }
  }

  void expect_invalid(const Problem& q, const Args& args, const std::string& needle) {
    expect_refused(q, args, cpu, StatusCode::kInvalidArgument, needle);
  }
  void expect_invalid(const Args& args, const std::string& needle) {
    expect_invalid(p, args, needle);
  }
};

TEST_F(Refusals, TheFixtureItselfRuns) {
  const Status s = run(p, a, cpu);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST_F(Refusals, NullPointers) {
  const struct {
    const void* Args::*field;
    const char* name;
  } inputs[] = {{&Args::hidden, "args.hidden"},
                {&Args::w_down, "args.w_down"},
                {&Args::w_up_k, "args.w_up_k"},
                {&Args::w_up_v, "args.w_up_v"}};
  for (const auto& f : inputs) {
    Args b = a;
    b.*f.field = nullptr;
    expect_invalid(b, f.name);
  }
  Args b = a;
  b.out = nullptr;
  expect_invalid(b, "args.out");
}

TEST_F(Refusals, NullLatentIsAllowed) {
  Args b = a;
  b.latent = nullptr;
  EXPECT_TRUE(run(p, b, cpu).ok());
}

struct DimField {
  int64_t Problem::*field;
  const char* name;
};
constexpr DimField kDims[] = {
    {&Problem::batch, "problem.batch"},         {&Problem::seq, "problem.seq"},
    {&Problem::model_dim, "problem.model_dim"}, {&Problem::rank, "problem.rank"},
    {&Problem::heads, "problem.heads"},         {&Problem::head_dim, "problem.head_dim"}};

// Zero is a valid extent (ZeroSize below); negative ones are refused.
TEST_F(Refusals, NegativeDimensions) {
  for (const auto& d : kDims) {
    for (int64_t value : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
      SCOPED_TRACE(std::string(d.name) + " = " + std::to_string(value));
      Problem q = p;
      q.*d.field = value;
      expect_invalid(q, a, d.name);
    }
  }
}

// A tensor with elements may not be null in a problem with a zero dimension either.
TEST_F(Refusals, NullTensorWithElementsInAZeroSizeProblem) {
  Problem q = p;
  q.rank = 0;  // the weights are empty; hidden and out are not
  Args b = contiguous_args(q, hidden.data(), nullptr, nullptr, nullptr, outputs.data());
  EXPECT_TRUE(run(q, b, cpu).ok());
  b.hidden = nullptr;
  expect_invalid(q, b, "args.hidden is null");
  b.hidden = hidden.data();
  b.out = nullptr;
  expect_invalid(q, b, "args.out is null");
}

template <typename T>
const T* data_or_null(const std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}
template <typename T>
T* data_or_null(std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

// A problem with a zero dimension runs and writes what the unfused matmuls give: nothing where T
// is 0; out zeros where R or D is 0 (empty sums), the latent zeros where D is 0 and hidden @ w_down
// where only N is 0 (float32 within kFloat32Tolerance; bf16 / fp16 rounded to the dtype, so within
// its unit roundoff, 2^-8 / 2^-11). Every dtype; empty tensors are null; outputs start as NaN.
TEST(ZeroSize, EveryDimensionMayBeZero) {
  Options cpu;
  cpu.backend = Backend::kCpu;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Problem base = shape(2, 3, 5, 4, 2, 3);
    base.dtype = dtype;
    const double latent_tolerance = dtype == DType::kFloat32   ? kFloat32Tolerance
                                    : dtype == DType::kBFloat16 ? 0x1.0p-8
                                                                : 0x1.0p-11;
    for (const auto& d : kDims) {
      for (bool with_latent : {false, true}) {
        SCOPED_TRACE(std::string(to_string(dtype)) + " " + d.name + " = 0" +
                     (with_latent ? ", with latent" : ""));
        Problem q = base;
        q.*d.field = 0;
        const HostInputs in = random_inputs(q, 11);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        const auto bytes = [&](const std::vector<float>& v) { return to_bytes(v, dtype); };
        const std::vector<unsigned char> hidden = bytes(in.hidden), w_down = bytes(in.w_down),
                                         w_up_k = bytes(in.w_up_k), w_up_v = bytes(in.w_up_v);
        std::vector<unsigned char> out =
            bytes(std::vector<float>(static_cast<size_t>(2 * q.tokens() * q.kv_width()), nan));
        std::vector<unsigned char> latent = bytes(
            std::vector<float>(with_latent ? static_cast<size_t>(q.tokens() * q.rank) : 0, nan));
        const Args a = contiguous_args(q, data_or_null(hidden), data_or_null(w_down),
                                       data_or_null(w_up_k), data_or_null(w_up_v),
                                       data_or_null(out), data_or_null(latent));
        EXPECT_TRUE(check(q, a, cpu).ok()) << check(q, a, cpu).message();
        Strategy chosen = Strategy::kCpuBlocked;
        ASSERT_TRUE(select_strategy(q, a, cpu, &chosen).ok());
        EXPECT_EQ(chosen, Strategy::kAuto) << "no strategy runs a zero-size problem";
        EXPECT_EQ(workspace_size(q, cpu, with_latent), 0);
        Options cuda;
        cuda.backend = Backend::kCuda;
        EXPECT_EQ(workspace_size(q, cuda, with_latent), 0);
        const Status ran = run(q, a, cpu);
        ASSERT_TRUE(ran.ok()) << ran.message();

        std::vector<double> ref_out, ref_latent;
        reference_kv_proj(q, in, &ref_out, &ref_latent);
        const std::vector<float> got_out = from_bytes(out, dtype);
        for (size_t i = 0; i < got_out.size(); ++i) {
          ASSERT_EQ(got_out[i], 0.f) << "out[" << i << "]: an empty sum is 0";
        }
        const std::vector<float> got_latent = from_bytes(latent, dtype);
        if (with_latent && !got_latent.empty()) {
          if (q.model_dim == 0) {
            for (float v : got_latent) ASSERT_EQ(v, 0.f);
          } else {
            EXPECT_LE(relative_error(got_latent.data(), ref_latent), latent_tolerance);
          }
        }
      }
    }
  }
}

// A forced strategy must still be one of this backend and dtype; kAuto and cpu-blocked run (bf16
// too).
TEST(ZeroSize, ForcedStrategiesAreCheckedByName) {
  Problem q = shape(0, 3, 5, 4, 2, 3);
  std::vector<float> w(68);  // w_down [5, 4], w_up_k and w_up_v [4, 6]
  const Args a = contiguous_args(q, nullptr, w.data(), w.data() + 20, w.data() + 44, nullptr);
  Options o;
  o.backend = Backend::kCpu;
  o.strategy = Strategy::kCpuBlocked;
  EXPECT_TRUE(run(q, a, o).ok());
  o.strategy = Strategy::kCudaDecode;
  const Status s = check(q, a, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.strategy = cuda-decode"), std::string::npos) << s.message();
  o.strategy = Strategy::kAuto;
  q.dtype = DType::kBFloat16;
  EXPECT_TRUE(run(q, a, o).ok());
}

TEST_F(Refusals, HeadsTimesHeadDimWiderThanTheWeights) {
  Problem q = p;
  q.heads = 3;  // N = 9, the weights' rows hold 6
  expect_invalid(q, a, "args.w_up_k_stride_row");
  Args b = a;
  b.w_up_k_stride_row = p.kv_width() + 3;
  b.w_up_v_stride_row = p.kv_width() - 1;
  expect_invalid(b, "args.w_up_v_stride_row");
}

TEST_F(Refusals, OverlappingStrides) {
  const struct {
    int64_t Args::*field;
    int64_t value;
    const char* name;
  } cases[] = {
      {&Args::hidden_stride_seq, 4, "args.hidden_stride_seq"},       // < D
      {&Args::hidden_stride_batch, 14, "args.hidden_stride_batch"},  // < S * D
      {&Args::w_down_stride_row, 3, "args.w_down_stride_row"},       // < R
      {&Args::w_up_k_stride_row, 5, "args.w_up_k_stride_row"},       // < N
      {&Args::out_stride_head, 2, "args.out_stride_head"},           // < Dh
      {&Args::out_stride_seq, 5, "args.out_stride_seq"},             // < H * Dh
      {&Args::out_stride_batch, 17, "args.out_stride_batch"},        // < S * N
      {&Args::out_stride_kv, 35, "args.out_stride_kv"},              // K and V overlap
      {&Args::latent_stride_seq, 3, "args.latent_stride_seq"},       // < R
      {&Args::latent_stride_batch, 11, "args.latent_stride_batch"},  // < S * R
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Args b = a;
    b.*c.field = c.value;
    expect_invalid(b, c.name);
  }
}

TEST_F(Refusals, NegativeStrides) {
  const struct {
    int64_t Args::*field;
    const char* name;
  } strides[] = {{&Args::hidden_stride_batch, "args.hidden_stride_batch"},
                 {&Args::hidden_stride_seq, "args.hidden_stride_seq"},
                 {&Args::w_down_stride_row, "args.w_down_stride_row"},
                 {&Args::w_up_k_stride_row, "args.w_up_k_stride_row"},
                 {&Args::w_up_v_stride_row, "args.w_up_v_stride_row"},
                 {&Args::out_stride_kv, "args.out_stride_kv"},
                 {&Args::out_stride_batch, "args.out_stride_batch"},
                 {&Args::out_stride_seq, "args.out_stride_seq"},
                 {&Args::out_stride_head, "args.out_stride_head"},
                 {&Args::latent_stride_batch, "args.latent_stride_batch"},
                 {&Args::latent_stride_seq, "args.latent_stride_seq"}};
  for (const auto& s : strides) {
    SCOPED_TRACE(s.name);
    Args b = a;
    b.*s.field = -1;
    expect_invalid(b, s.name);
  }
}

TEST_F(Refusals, LatentOverlappingOut) {
  Args b = a;
  b.latent = static_cast<float*>(a.out) + 2 * p.tokens() * p.kv_width() - 1;  // last element of V
  expect_invalid(b, "args.latent overlaps args.out");
  b.latent = a.out;
  expect_invalid(b, "args.latent overlaps args.out");
  EXPECT_TRUE(run(p, a, cpu).ok()) << "latent right after out does not overlap";
}

TEST_F(Refusals, OutputsAliasingInputs) {
  // The outputs buffer is larger than each input, so aliasing it cannot write out of bounds.
  Args b = a;
  b.hidden = a.out;
  expect_invalid(b, "args.out overlaps args.hidden");
  b = a;
  b.w_up_v = static_cast<float*>(a.out) + 1;
  expect_invalid(b, "args.out overlaps args.w_up_v");
  b = a;
  b.w_down = a.latent;
  expect_invalid(b, "args.latent overlaps args.w_down");
}

// The workspace is scratch the library writes: it must have a size and alias nothing. The CPU
// backend ignores a valid one.
TEST_F(Refusals, Workspace) {
  std::vector<float> scratch(64);
  Args b = a;
  b.workspace = scratch.data();
  b.workspace_bytes = 0;
  expect_invalid(b, "args.workspace_bytes = 0");
  b.workspace_bytes = -4;
  expect_invalid(b, "args.workspace_bytes = -4");
  b.workspace = static_cast<float*>(a.out) + 3;
  b.workspace_bytes = 16;
  expect_invalid(b, "args.workspace overlaps args.out");
  b.workspace = a.latent;
  expect_invalid(b, "args.workspace overlaps args.latent");
  b.workspace = hidden.data();
  expect_invalid(b, "args.workspace overlaps args.hidden");
  b.workspace = scratch.data();
  b.workspace_bytes = static_cast<int64_t>(scratch.size() * sizeof(float));
  const Status s = run(p, b, cpu);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(workspace_size(p, cpu), 0);
}

TEST_F(Refusals, ElementCountsOverflowInt64) {
  Problem q = p;
  q.batch = int64_t{1} << 40;
  q.seq = int64_t{1} << 40;
  expect_invalid(q, a, "problem.batch * problem.seq");
  q = p;
  q.heads = int64_t{1} << 33;
  q.head_dim = int64_t{1} << 33;
  expect_invalid(q, a, "problem.heads * problem.head_dim");

  // T = 2^62 tokens of D = 4: every product fits in int64, but hidden would take 2^66 bytes.
  q = p;
  q.batch = int64_t{1} << 31;
  q.seq = int64_t{1} << 31;
  q.model_dim = 4;
  expect_invalid(q, a, "problem.batch * seq * model_dim = 2147483648 * 2147483648 * 4 elements "
                       "of 4 bytes: hidden would exceed 2^60 bytes");
  // Every packed tensor is held to 2^60 bytes, so that the sizes derived from them fit in int64
  // (cuda-gemm's latent in the workspace is T * R * element size).
  q = p;
  q.dtype = DType::kBFloat16;
  q.batch = int64_t{1} << 29;
  q.seq = 1;
  q.rank = int64_t{1} << 31;
  q.model_dim = int64_t{1} << 30;
  expect_invalid(q, a, "problem.model_dim * rank");
  q.model_dim = 1;
  expect_invalid(q, a, "latent would exceed 2^60 bytes");
  Options cuda;  // workspace_size() answers for the backend without asking for a device
  cuda.backend = Backend::kCuda;
  EXPECT_EQ(workspace_size(q, cuda, false), 0);
  q.rank = int64_t{1} << 30;  // T * R * 2 = 2^60 bytes exactly: the problem passes
  EXPECT_GT(workspace_size(q, cuda, false), int64_t{1} << 60);
  q = p;
  q.heads = int64_t{1} << 30;
  q.head_dim = int64_t{1} << 29;
  expect_invalid(q, a, "problem.rank * heads * head_dim");
  q.rank = 0;  // w_up_k and w_up_v are empty; out is not
  expect_invalid(q, a, "2 * problem.batch * seq * heads * head_dim");
}

TEST_F(Refusals, HugeStridesOverflowTheSpan) {
  Args b = a;
  b.hidden_stride_batch = kHuge;
  expect_invalid(b, "args.hidden_stride_batch");
  b = a;
  b.out_stride_kv = kHuge;
  expect_invalid(b, "args.out_stride_kv");
  b = a;
  b.w_down_stride_row = kHuge / 8;  // the span fits in elements (~2^62), not in bytes
  expect_invalid(b, "w_down spans more than 2^63 bytes with args.w_down_stride_row = " +
                       std::to_string(kHuge / 8));
  b = a;
  b.latent_stride_seq = kHuge / 2;
  expect_invalid(b, "args.latent_stride_seq");
}

// The largest element offset is exactly INT64_MAX: the element count (offset + 1) already
// overflows and must be refused without signed overflow (run this under -fsanitize=undefined).
TEST_F(Refusals, SpanEndingAtInt64Max) {
  Args b = a;
  b.w_down_stride_row = kHuge / 4;  // (D - 1) * stride + R - 1 = 4 * (2^61 - 1) + 3 = 2^63 - 1
  expect_invalid(b, "w_down spans more than 2^63");
}

TEST_F(Refusals, InvalidEnumValues) {
  Problem q = p;
  q.dtype = static_cast<DType>(7);
  expect_invalid(q, a, "problem.dtype = 7");
  Options o = cpu;
  o.backend = static_cast<Backend>(9);
  expect_refused(p, a, o, StatusCode::kInvalidArgument, "options.backend = 9");
  o = cpu;
  o.strategy = static_cast<Strategy>(9);
  expect_refused(p, a, o, StatusCode::kInvalidArgument, "options.strategy");
}

TEST_F(Refusals, StrategyOfAnotherBackend) {
  Options o = cpu;
  o.strategy = Strategy::kCudaFused;
  expect_refused(p, a, o, StatusCode::kInvalidArgument, "options.strategy = cuda-fused");
  o.strategy = Strategy::kCpuBlocked;
  EXPECT_TRUE(run(p, a, o).ok());
}

TEST_F(Refusals, CudaBackendWithoutDevice) {
  if (backend_available(Backend::kCuda)) GTEST_SKIP() << "a CUDA device is present";
  Options o;
  o.backend = Backend::kCuda;
  expect_refused(p, a, o, StatusCode::kBackendUnavailable, "options.backend = cuda");
  EXPECT_EQ(resolve_backend(Backend::kAuto), Backend::kCpu);
}

}  // namespace
}  // namespace latentkv::testing
