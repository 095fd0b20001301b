// The CUDA backend through the public API, against the float64 reference: random and edge shapes,
// the presets, padded and unaligned layouts, latent on and off, every CUDA strategy (kAuto and each
// one forced), user streams and CUDA-graph capture, refusals that must leave device memory alone,
// and bf16/fp16 where a strategy takes them. Device outputs start as 0xFF bytes (NaN in every
// dtype), so an element never written shows as a non-finite error. Every test skips, and ctest
// reports it skipped, on a machine with no GPU.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/tile_sizes.h"
#include "graph_rounds.h"
#include "late_writer.h"
#include "testing.h"

namespace latentkv::testing {
namespace {

constexpr uint64_t kSeed = 20261129;
constexpr int64_t kOddPad = 3;  // odd strides: rows not 16-byte aligned
constexpr unsigned char kNaNByte = 0xFF;

#define SKIP_WITHOUT_CUDA()                                                   \
  do {                                                                        \
    if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define CUDA_ASSERT(call)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// float values (already rounded to dtype) as the dtype's bytes, and back.
std::vector<unsigned char> encode(const std::vector<float>& values, DType dtype) {
  const size_t eb = static_cast<size_t>(element_size(dtype));
  std::vector<unsigned char> bytes(values.size() * eb);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &values[i], 4);
    if (dtype == DType::kBFloat16) {
      const uint16_t top = static_cast<uint16_t>(bits >> 16);  // exact: the value is a bf16
      std::memcpy(&bytes[i * eb], &top, 2);
    } else if (dtype == DType::kFloat16) {
      const __half h = __float2half(values[i]);
      std::memcpy(&bytes[i * eb], &h, 2);
    } else {
      std::memcpy(&bytes[i * eb], &bits, 4);
    }
  }
  return bytes;
}

std::vector<float> decode(const std::vector<unsigned char>& bytes, DType dtype) {
  const size_t eb = static_cast<size_t>(element_size(dtype));
  std::vector<float> values(bytes.size() / eb);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kBFloat16) {
      uint16_t top = 0;
      std::memcpy(&top, &bytes[i * eb], 2);
      const uint32_t bits = static_cast<uint32_t>(top) << 16;
      std::memcpy(&values[i], &bits, 4);
    } else if (dtype == DType::kFloat16) {
      __half h;
      std::memcpy(&h, &bytes[i * eb], 2);
      values[i] = __half2float(h);
    } else {
      std::memcpy(&values[i], &bytes[i * eb], 4);
    }
  }
  return values;
}

// One cudaMalloc'd tensor: `ptr` sits `misalign` elements past the allocation's start.
struct DeviceTensor {
  void* base = nullptr;
  unsigned char* ptr = nullptr;
  size_t bytes = 0;  // of the tensor's span, from ptr

  DeviceTensor() = default;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (base != nullptr) cudaFree(base);
  }

  cudaError_t allocate(size_t span_bytes, size_t misalign_bytes) {
    bytes = span_bytes;
    const cudaError_t err = cudaMalloc(&base, span_bytes + misalign_bytes);
    ptr = static_cast<unsigned char*>(base) + misalign_bytes;
    return err;
  }
  cudaError_t upload(const std::vector<unsigned char>& host) {
    return cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice);
  }
  cudaError_t download(std::vector<unsigned char>* host) const {
    host->resize(bytes);
    return cudaMemcpy(host->data(), ptr, bytes, cudaMemcpyDeviceToHost);
  }
};

// A host call (strided_buffers) mirrored on the device with the same strides; every pointer is
// `misalign` elements past its allocation, outputs poisoned with NaN bytes. The call carries the
// largest workspace any strategy asks for, so every strategy can take it.
struct DeviceCall {
  DType dtype = DType::kFloat32;
  DeviceTensor hidden, w_down, w_up_k, w_up_v, out, latent, workspace;
  Args args;
  bool with_latent = false;

  // ASSERTs inside: the caller checks HasFatalFailure().
  void init(const Problem& p, const StridedBuffers& host, int64_t misalign) {
    dtype = p.dtype;
    with_latent = host.args.latent != nullptr;
    const size_t eb = static_cast<size_t>(element_size(dtype));
    const size_t shift = static_cast<size_t>(misalign) * eb;
    struct Input {
      DeviceTensor* tensor;
      const std::vector<float>* values;
    };
    for (const Input& in : {Input{&hidden, &host.hidden}, Input{&w_down, &host.w_down},
                            Input{&w_up_k, &host.w_up_k}, Input{&w_up_v, &host.w_up_v}}) {
      CUDA_ASSERT(in.tensor->allocate(in.values->size() * eb, shift));
      CUDA_ASSERT(in.tensor->upload(encode(*in.values, dtype)));
    }
    CUDA_ASSERT(out.allocate(host.out.size() * eb, shift));
    if (with_latent) CUDA_ASSERT(latent.allocate(host.latent.size() * eb, shift));
    int64_t workspace_bytes = 0;
    for (Strategy s : {Strategy::kAuto, Strategy::kCudaGemm, Strategy::kCudaDecode}) {
      Options o;
      o.backend = Backend::kCuda;
      o.strategy = s;
      workspace_bytes = std::max(workspace_bytes, workspace_size(p, o, with_latent));
    }
    if (workspace_bytes > 0) CUDA_ASSERT(workspace.allocate(workspace_bytes, 0));
    CUDA_ASSERT(poison(nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());  // before a run on a stream that does not wait for it
    args = host.args;
    args.hidden = hidden.ptr;
    args.w_down = w_down.ptr;
    args.w_up_k = w_up_k.ptr;
    args.w_up_v = w_up_v.ptr;
    args.out = out.ptr;
    args.latent = with_latent ? latent.ptr : nullptr;
    args.workspace = workspace_bytes > 0 ? workspace.ptr : nullptr;
    args.workspace_bytes = workspace_bytes;
  }

  cudaError_t poison(cudaStream_t stream) {
    cudaError_t err = cudaMemsetAsync(out.ptr, kNaNByte, out.bytes, stream);
    if (err == cudaSuccess && with_latent) {
      err = cudaMemsetAsync(latent.ptr, kNaNByte, latent.bytes, stream);
    }
    return err;
  }
};

Options cuda_options(Strategy strategy = Strategy::kAuto, cudaStream_t stream = nullptr) {
  Options o;
  o.backend = Backend::kCuda;
  o.strategy = strategy;
  o.stream = stream;
  return o;
}

// kAuto, then each CUDA strategy forced.
constexpr Strategy kCudaStrategies[] = {Strategy::kAuto, Strategy::kCudaFused, Strategy::kCudaGemm,
                                        Strategy::kCudaDecode};

// Reads a device output back and compares it with the reference: finite, within tolerance, and
// nothing written outside the tensor's own elements.
void expect_output_matches(const DeviceTensor& tensor, DType dtype,
                           const std::vector<int64_t>& offsets, const std::vector<double>& ref,
                           double tolerance, const char* name) {
  std::vector<unsigned char> bytes;
  CUDA_ASSERT(tensor.download(&bytes));
  const std::vector<float> buffer = decode(bytes, dtype);
  const double err = relative_error(gather(buffer.data(), offsets).data(), ref);
  EXPECT_LE(err, tolerance) << name;
  EXPECT_EQ(count_not_nan(buffer), static_cast<int64_t>(offsets.size()))
      << name << ": padding was written";
}

// Inputs of one problem, its float64 results and the tolerances they are held to: float32 at
// kFloat32Tolerance; bf16/fp16 within 2x the error of the unfused same-precision baseline (what
// eager PyTorch does: the latent and each output rounded to dtype, sums exact).
struct Expected {
  HostInputs in;
  std::vector<double> out, latent;
  double out_tolerance = kFloat32Tolerance;
  double latent_tolerance = kFloat32Tolerance;
};

Expected expected_for(const Problem& p, uint64_t seed = kSeed) {
  Expected e;
  e.in = random_inputs(p, seed);
  reference_kv_proj(p, e.in, &e.out, &e.latent);
  const Tolerances t = unfused_tolerances(p, e.in, e.out, e.latent);
  e.out_tolerance = t.out;
  e.latent_tolerance = t.latent;
  return e;
}

// Runs p on CUDA under `strides` (every pointer `misalign` elements off its allocation) on
// `stream`, with kAuto and each strategy forced, and compares out and latent with the expected
// results each time. A forced strategy may answer kUnsupported (cuda-fused: bf16/fp16 or large
// weights, cuda-decode: T > 16 or unaligned weights); kAuto must take every call (cuda-gemm takes
// every dtype and layout). Returns the runs made; *why gets the refusal when kAuto ran nothing;
// *ran, if given, collects the strategies that ran.
int expect_cuda_matches(const Problem& p, const Expected& e, const Args& strides, bool with_latent,
                        std::string* why, int64_t misalign = 0, cudaStream_t stream = nullptr,
                        std::vector<Strategy>* ran = nullptr) {
  SCOPED_TRACE(p.to_string() + (with_latent ? ", latent" : ", no latent") + ", pad " +
               std::to_string(strides.out_stride_head - p.head_dim) + ", misalign " +
               std::to_string(misalign));
  const StridedBuffers host = strided_buffers(p, e.in, strides, with_latent);
  DeviceCall dev;
  dev.init(p, host, misalign);
  if (::testing::Test::HasFatalFailure()) return 0;

  int runs = 0;
  for (Strategy strategy : kCudaStrategies) {
    SCOPED_TRACE(std::string("options.strategy = ") + to_string(strategy));
    const Options o = cuda_options(strategy, stream);
    const Status taken = check(p, dev.args, o);
    if (taken.code() == StatusCode::kUnsupported) {
      if (strategy != Strategy::kAuto) continue;
      ADD_FAILURE() << "kAuto refused: " << taken.message();
      *why = taken.message();
      return 0;
    }
    EXPECT_TRUE(taken.ok()) << to_string(taken.code()) << ": " << taken.message();
    if (!taken.ok()) return runs;
    EXPECT_EQ(dev.poison(stream), cudaSuccess);
    const Status s = run(p, dev.args, o);
    EXPECT_TRUE(s.ok()) << to_string(s.code()) << ": " << s.message();
    if (!s.ok()) return runs;
    ++runs;
    if (ran != nullptr) ran->push_back(strategy);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    expect_output_matches(dev.out, p.dtype, host.out_offsets, e.out, e.out_tolerance, "out");
    if (with_latent) {
      expect_output_matches(dev.latent, p.dtype, host.latent_offsets, e.latent, e.latent_tolerance,
                            "latent");
    }
  }
  return runs;
}

// Packed and odd-padded strides, latent off and on; the runs made, the last refusal in *why.
int run_all_layouts(const Problem& p, std::string* why) {
  const Expected e = expected_for(p);
  int runs = 0;
  for (int64_t pad : {int64_t{0}, kOddPad}) {
    for (bool with_latent : {false, true}) {
      runs += expect_cuda_matches(p, e, padded_args(p, pad), with_latent, why);
      if (::testing::Test::HasFatalFailure()) return runs;
    }
  }
  return runs;
}

void expect_all_layouts_match(const Problem& p) {
  std::string why;
  if (run_all_layouts(p, &why) == 0) GTEST_SKIP() << why;
}

std::string shape_name(const ::testing::TestParamInfo<Problem>& info) {
  return std::to_string(info.index) + "_" + problem_id(info.param);
}

class GpuShapes : public ::testing::TestWithParam<Problem> {};

TEST_P(GpuShapes, MatchesFloat64) {
  SKIP_WITHOUT_CUDA();
  expect_all_layouts_match(GetParam());
}

// The shapes of the one case list (tests/common/cases.h).
INSTANTIATE_TEST_SUITE_P(Random, GpuShapes,
                         ::testing::ValuesIn(random_shapes(kRandomCount, kRandomSeed)),
                         shape_name);
INSTANTIATE_TEST_SUITE_P(Edge, GpuShapes, ::testing::ValuesIn(edge_shapes()), shape_name);

class GpuPresets : public ::testing::TestWithParam<std::string> {};

// The founding case, T = 6144 (seed-x16) and the DeepSeek shapes.
TEST_P(GpuPresets, MatchFloat64) {
  SKIP_WITHOUT_CUDA();
  Problem p;
  ASSERT_TRUE(find_preset(GetParam(), &p));
  expect_all_layouts_match(p);
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Case& c : preset_cases()) names.push_back(c.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(All, GpuPresets, ::testing::ValuesIn(preset_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Pointers 4 bytes past a 16-byte boundary and odd strides: no vector load may assume alignment.
TEST(GpuLayouts, Unaligned) {
  SKIP_WITHOUT_CUDA();
  Problem seed;
  ASSERT_TRUE(find_preset("seed", &seed));
  std::vector<Problem> shapes = {seed};
  for (const Problem& p : edge_shapes()) {
    if (p.model_dim % 4 != 0 || p.rank % 4 != 0 || p.kv_width() % 4 != 0) shapes.push_back(p);
  }
  for (const Problem& p : shapes) {
    const Expected e = expected_for(p);
    for (int64_t pad : {int64_t{0}, int64_t{1}}) {
      for (bool with_latent : {false, true}) {
        std::string why;
        EXPECT_GT(expect_cuda_matches(p, e, padded_args(p, pad), with_latent, &why, 1), 0) << why;
        if (HasFatalFailure()) return;
      }
    }
  }
}

// cuda-gemm multiplies K and V as one batched GEMM when w_up_v sits a whole number of elements
// after w_up_k with the same row stride, else as two GEMMs. Both weights are placed in one
// allocation in either order, with different row strides, and interleaved as one [R, 2N] tensor
// (w_up_v = w_up_k + N, both rows 2N apart: the batched GEMM's operands overlap, read-only); each
// against float64.
TEST(GpuGemm, KAndVWeightsInEitherOrderOrStride) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Problem p = shape(2, 7, 96, 24, 3, 16);
    p.dtype = dtype;
    const Expected e = expected_for(p);
    enum class Placement { kKThenV, kVThenK, kInterleaved };
    struct Layout {
      Placement placement;
      int64_t k_row_pad;
    };
    const Layout layouts[] = {{Placement::kKThenV, 0}, {Placement::kVThenK, 0},
                              {Placement::kKThenV, 8}, {Placement::kInterleaved, 0}};
    for (const Layout layout : layouts) {
      SCOPED_TRACE(std::string(to_string(dtype)) + ", placement " +
                   std::to_string(static_cast<int>(layout.placement)) + ", w_up_k row pad " +
                   std::to_string(layout.k_row_pad));
      Args strides = padded_args(p, 0);
      strides.w_up_k_stride_row += layout.k_row_pad;
      const StridedBuffers host = strided_buffers(p, e.in, strides, /*with_latent=*/true);
      DeviceCall dev;
      dev.init(p, host, 0);
      if (HasFatalFailure()) return;
      DeviceTensor both;
      CUDA_ASSERT(both.allocate(dev.w_up_k.bytes + dev.w_up_v.bytes, 0));
      unsigned char* k = both.ptr;
      unsigned char* v = both.ptr + dev.w_up_k.bytes;
      if (layout.placement == Placement::kVThenK) {
        v = both.ptr;
        k = both.ptr + dev.w_up_v.bytes;
      }
      if (layout.placement == Placement::kInterleaved) {
        const size_t row = static_cast<size_t>(p.kv_width() * element_size(dtype));
        v = k + row;
        for (auto [dst, src] : {std::pair{k, dev.w_up_k.ptr}, std::pair{v, dev.w_up_v.ptr}}) {
          CUDA_ASSERT(cudaMemcpy2D(dst, 2 * row, src, row, row, p.rank, cudaMemcpyDeviceToDevice));
        }
        dev.args.w_up_k_stride_row = dev.args.w_up_v_stride_row = 2 * p.kv_width();
      } else {
        CUDA_ASSERT(cudaMemcpy(k, dev.w_up_k.ptr, dev.w_up_k.bytes, cudaMemcpyDeviceToDevice));
        CUDA_ASSERT(cudaMemcpy(v, dev.w_up_v.ptr, dev.w_up_v.bytes, cudaMemcpyDeviceToDevice));
      }
      dev.args.w_up_k = k;
      dev.args.w_up_v = v;
      const Status s = run(p, dev.args, cuda_options(Strategy::kCudaGemm));
      ASSERT_TRUE(s.ok()) << s.message();
      CUDA_ASSERT(cudaDeviceSynchronize());
      expect_output_matches(dev.out, p.dtype, host.out_offsets, e.out, e.out_tolerance, "out");
      expect_output_matches(dev.latent, p.dtype, host.latent_offsets, e.latent,
                            e.latent_tolerance, "latent");
    }
  }
}

// cuda-gemm with the heads not packed (out_stride_head > Dh): one GEMM batched over the heads
// where the rows fold; where they do not, batched over the heads and looped over b (H >= B) or
// batched over b and looped over the heads (H < B). Every dtype, more tokens than cuda-decode
// takes, latent off and on, each against float64 with the padding checked unwritten.
TEST(GpuGemm, HeadsNotPacked) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t batch, seq, heads;
    bool rows_fold;
  };
  for (const Case c : {Case{3, 11, 5, true}, Case{2, 13, 4, false}, Case{5, 7, 2, false}}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      Problem p = shape(c.batch, c.seq, 72, 40, c.heads, 24);
      p.dtype = dtype;
      const Expected e = expected_for(p);
      Args strides = padded_args(p, kOddPad);
      if (c.rows_fold) {
        strides.out_stride_batch = p.seq * strides.out_stride_seq;
        strides.hidden_stride_batch = p.seq * strides.hidden_stride_seq;
        strides.latent_stride_batch = p.seq * strides.latent_stride_seq;
      }
      for (bool with_latent : {false, true}) {
        SCOPED_TRACE(p.to_string() + (c.rows_fold ? ", rows fold" : ", rows do not fold") +
                     (with_latent ? ", latent" : ", no latent"));
        const StridedBuffers host = strided_buffers(p, e.in, strides, with_latent);
        DeviceCall dev;
        dev.init(p, host, 0);
        if (HasFatalFailure()) return;
        CUDA_ASSERT(dev.poison(nullptr));
        const Status s = run(p, dev.args, cuda_options(Strategy::kCudaGemm));
        ASSERT_TRUE(s.ok()) << s.message();
        CUDA_ASSERT(cudaDeviceSynchronize());
        expect_output_matches(dev.out, p.dtype, host.out_offsets, e.out, e.out_tolerance, "out");
        if (with_latent) {
          expect_output_matches(dev.latent, p.dtype, host.latent_offsets, e.latent,
                                e.latent_tolerance, "latent");
        }
      }
    }
  }
}

// The founding case on the device, packed, with a latent output.
class GpuSeedCall : public ::testing::Test {
 protected:
  Problem p;
  StridedBuffers host;
  DeviceCall dev;

  void SetUp() override {
    SKIP_WITHOUT_CUDA();
    ASSERT_TRUE(find_preset("seed", &p));
    host = strided_buffers(p, random_inputs(p, kSeed), padded_args(p, 0), true);
    dev.init(p, host, 0);
  }
};

// kAuto picks a CUDA strategy; a CPU strategy forced on the CUDA backend is refused.
TEST_F(GpuSeedCall, AutoPicksACudaStrategy) {
  Strategy chosen = Strategy::kAuto;
  const Status s = select_strategy(p, dev.args, cuda_options(), &chosen);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(chosen == Strategy::kCudaFused || chosen == Strategy::kCudaGemm) << to_string(chosen);
  const Status wrong = check(p, dev.args, cuda_options(Strategy::kCpuBlocked));
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("options.strategy"), std::string::npos) << wrong.message();
}

// A refused call writes nothing: device out and latent keep their byte pattern.
TEST_F(GpuSeedCall, RefusalsLeaveDeviceOutputsUntouched) {
  constexpr unsigned char kSentinel = 0x5A;
  Args overlapping = dev.args;
  overlapping.hidden_stride_seq = p.model_dim - 1;
  Args aliasing = dev.args;
  aliasing.latent = dev.args.out;
  Problem wide = p;
  wide.heads += 1;  // wider than the weights' rows
  Args no_workspace = dev.args;
  no_workspace.latent = nullptr;
  no_workspace.workspace = nullptr;
  no_workspace.workspace_bytes = 0;
  Args workspace_on_out = no_workspace;
  workspace_on_out.workspace = dev.args.out;
  workspace_on_out.workspace_bytes = workspace_size(p, cuda_options(Strategy::kCudaGemm));
  const struct {
    Problem problem;
    Args args;
    Strategy strategy;
    const char* needle;
  } refusals[] = {
      {p, overlapping, Strategy::kAuto, "args.hidden_stride_seq"},
      {p, aliasing, Strategy::kAuto, "args.latent overlaps args.out"},
      {wide, dev.args, Strategy::kAuto, "args.w_up_k_stride_row"},
      {p, no_workspace, Strategy::kCudaGemm, "args.workspace_bytes"},
      {p, workspace_on_out, Strategy::kCudaGemm, "args.workspace overlaps args.out"},
  };
  for (const auto& r : refusals) {
    CUDA_ASSERT(cudaMemset(dev.out.ptr, kSentinel, dev.out.bytes));
    CUDA_ASSERT(cudaMemset(dev.latent.ptr, kSentinel, dev.latent.bytes));
    const Status s = run(r.problem, r.args, cuda_options(r.strategy));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find(r.needle), std::string::npos) << s.message();
    CUDA_ASSERT(cudaDeviceSynchronize());
    for (const DeviceTensor* t : {&dev.out, &dev.latent}) {
      std::vector<unsigned char> bytes;
      CUDA_ASSERT(t->download(&bytes));
      EXPECT_EQ(std::count(bytes.begin(), bytes.end(), kSentinel),
                static_cast<std::ptrdiff_t>(bytes.size()))
          << "bytes changed by a refused call: " << r.needle;
    }
  }
}

// RAII for the stream objects of the tests below (graph_rounds.h has OwnedGraph).
struct OwnedStream {
  cudaStream_t stream = nullptr;
  ~OwnedStream() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

// cuBLAS's scratch comes from the caller's workspace, and cuda-gemm runs without it: with a latent
// output and no workspace, and with only the latent's bytes of workspace (algorithms that need no
// scratch then). K = 2048 against 24 rows is where cuBLAS picks split-K when it may.
TEST(GpuGemm, CublasScratchIsOptional) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Problem p = shape(2, 12, 2048, 128, 4, 64);
    p.dtype = dtype;
    const Expected e = expected_for(p);
    for (bool with_latent : {true, false}) {
      SCOPED_TRACE(p.to_string() + (with_latent ? ", latent, no workspace"
                                                : ", no latent, the latent's bytes of workspace"));
      const StridedBuffers host = strided_buffers(p, e.in, padded_args(p, 0), with_latent);
      DeviceCall dev;
      dev.init(p, host, 0);
      if (HasFatalFailure()) return;
      Args args = dev.args;
      args.workspace = with_latent ? nullptr : dev.args.workspace;
      args.workspace_bytes = with_latent ? 0 : p.tokens() * p.rank * element_size(p.dtype);
      CUDA_ASSERT(dev.poison(nullptr));
      const Status s = run(p, args, cuda_options(Strategy::kCudaGemm));
      ASSERT_TRUE(s.ok()) << s.message();
      CUDA_ASSERT(cudaDeviceSynchronize());
      expect_output_matches(dev.out, p.dtype, host.out_offsets, e.out, e.out_tolerance, "out");
      if (with_latent) {
        expect_output_matches(dev.latent, p.dtype, host.latent_offsets, e.latent,
                              e.latent_tolerance, "latent");
      }
    }
  }
}

// run() enqueues on the caller's stream: a non-blocking stream, synchronized alone, has the result.
TEST(GpuStreams, RunsOnAUserStream) {
  SKIP_WITHOUT_CUDA();
  OwnedStream s;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  Problem p;
  ASSERT_TRUE(find_preset("seed", &p));
  const Expected e = expected_for(p);
  for (int64_t pad : {int64_t{0}, kOddPad}) {
    for (bool with_latent : {false, true}) {
      std::string why;
      EXPECT_GT(expect_cuda_matches(p, e, padded_args(p, pad), with_latent, &why, 0, s.stream), 0)
          << why;
    }
  }
}

void CUDART_CB sleep_20ms(void*) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// Two calls with different inputs on two streams, released together (both streams wait on an
// event that a third stream records after a 20 ms host function, so both calls are queued before
// either starts): each must compute its own result. cuBLAS's scratch is each call's workspace; a
// buffer per device would be shared by GEMMs running side by side. DeepSeek-V3-sized down
// projection at T = 32 (split-K with scratch), bf16 and float32, five rounds.
TEST(GpuStreams, ConcurrentCallsOnTwoStreams) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    Problem p = shape(1, 32, 7168, 512, 4, 128);
    p.dtype = dtype;
    SCOPED_TRACE(p.to_string());
    const Expected e[2] = {expected_for(p, kSeed), expected_for(p, kSeed + 1)};
    StridedBuffers host[2];
    DeviceCall dev[2];
    OwnedStream streams[3];
    for (int i = 0; i < 2; ++i) {
      host[i] = strided_buffers(p, e[i].in, padded_args(p, 0), false);
      dev[i].init(p, host[i], 0);
      if (HasFatalFailure()) return;
    }
    for (OwnedStream& s : streams) {
      CUDA_ASSERT(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    }
    cudaEvent_t gate = nullptr;
    CUDA_ASSERT(cudaEventCreateWithFlags(&gate, cudaEventDisableTiming));
    for (int round = 0; round < 5; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      CUDA_ASSERT(cudaLaunchHostFunc(streams[2].stream, sleep_20ms, nullptr));
      CUDA_ASSERT(cudaEventRecord(gate, streams[2].stream));
      for (int i = 0; i < 2; ++i) {
        CUDA_ASSERT(cudaStreamWaitEvent(streams[i].stream, gate, 0));
        CUDA_ASSERT(dev[i].poison(streams[i].stream));
        const Status s = run(p, dev[i].args, cuda_options(Strategy::kCudaGemm, streams[i].stream));
        ASSERT_TRUE(s.ok()) << s.message();
      }
      CUDA_ASSERT(cudaDeviceSynchronize());
      for (int i = 0; i < 2; ++i) {
        expect_output_matches(dev[i].out, p.dtype, host[i].out_offsets, e[i].out,
                              e[i].out_tolerance, i == 0 ? "out of stream 0" : "out of stream 1");
      }
    }
    CUDA_ASSERT(cudaEventDestroy(gate));
  }
}

// Two cuda-fused calls back to back on one stream, the second reading the first's K as its hidden
// states ([B, S, H * Dh] at out's strides), with no synchronization between them, eagerly and as
// one captured CUDA graph replayed twice; both outputs poisoned with NaN first. A kernel of the
// second call that read its input before the first call's kernel had finished would read the
// poison (or stale values) and fail. At the founding widths the token counts reach, on an H200,
// the one-token (1, 2), 256-column register-tile (64, 384), tensor-core (733) and token-tile
// (6144) configurations. The second call's reference is computed from the first's output as read
// back.
TEST(GpuStreams, ACallReadsTheOutputOfTheCallBefore) {
  SKIP_WITHOUT_CUDA();
  OwnedStream s;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  const Options o = cuda_options(Strategy::kCudaFused, s.stream);
  for (int64_t tokens : {1, 2, 64, 384, 733, 6144}) {
    const Problem first = shape(1, tokens, 256, 48, 4, 32);
    const Problem second = shape(1, tokens, first.kv_width(), 48, 4, 32);  // D = H * Dh
    SCOPED_TRACE(first.to_string());
    const HostInputs in_first = random_inputs(first, kSeed);
    HostInputs in_second = random_inputs(second, kSeed + 1);
    const StridedBuffers host_first =
        strided_buffers(first, in_first, padded_args(first, 0), false);
    const StridedBuffers host_second =
        strided_buffers(second, in_second, padded_args(second, 0), false);
    DeviceCall dev_first, dev_second;
    dev_first.init(first, host_first, 0);
    dev_second.init(second, host_second, 0);
    if (HasFatalFailure()) return;
    Args args_second = dev_second.args;
    args_second.hidden = dev_first.args.out;  // K, the first plane of out
    args_second.hidden_stride_batch = dev_first.args.out_stride_batch;
    args_second.hidden_stride_seq = dev_first.args.out_stride_seq;
    const auto enqueue = [&]() -> Status {
      if (dev_first.poison(s.stream) != cudaSuccess || dev_second.poison(s.stream) != cudaSuccess) {
        return {StatusCode::kCudaError, "cudaMemsetAsync (the poison)"};
      }
      if (Status st = run(first, dev_first.args, o); !st.ok()) return st;
      return run(second, args_second, o);
    };
    std::vector<double> ref_first, ref_second;
    reference_kv_proj(first, in_first, &ref_first, nullptr);
    int programmatic = 0;
    eager_then_graph_replays(s.stream, enqueue, [&](const std::string&) {
      expect_output_matches(dev_first.out, first.dtype, host_first.out_offsets, ref_first,
                            kFloat32Tolerance, "first call's out");
      std::vector<unsigned char> bytes;
      CUDA_ASSERT(dev_first.out.download(&bytes));
      const std::vector<float> out_first =
          gather(decode(bytes, first.dtype).data(), host_first.out_offsets);
      in_second.hidden.assign(out_first.begin(), out_first.begin() + tokens * first.kv_width());
      reference_kv_proj(second, in_second, &ref_second, nullptr);
      expect_output_matches(dev_second.out, second.dtype, host_second.out_offsets, ref_second,
                            kFloat32Tolerance, "second call's out");
    }, &programmatic);
    if (HasFatalFailure()) return;
    if (late_writer_available()) {  // sm_90: the second call's kernel follows the first's
      EXPECT_GE(programmatic, 1) << "the second call's kernel was not a programmatic dependent";
    }
  }
}

// Every cuda-fused kernel touches memory only after its griddepcontrol.wait, checked without
// relying on timing: its hidden states are written by late_copy (late_writer.h), which lets the
// call's kernel launch at once and writes them ~50 us later; a read before the wait sees the NaN
// poison. Token counts and widths reach one-token (1, 2), register tiles (16: 32 columns, 64 and
// 384: 256), streaming with its weight copy (128), tensor core (733), token tiles (6144) and, at
// R = 96, the cluster configuration (733).
TEST(GpuStreams, EveryFusedKernelWaitsBeforeItsFirstRead) {
  SKIP_WITHOUT_CUDA();
  if (!late_writer_available()) GTEST_SKIP() << "no programmatic launch below sm_90";
  OwnedStream s;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  const Options o = cuda_options(Strategy::kCudaFused, s.stream);
  struct Case {
    int64_t tokens, rank;
  };
  for (const Case& c : {Case{1, 48}, Case{2, 48}, Case{16, 48}, Case{64, 48}, Case{128, 48},
                        Case{384, 48}, Case{733, 48}, Case{6144, 48}, Case{733, 96}}) {
    const Problem p = shape(1, c.tokens, 256, c.rank, 4, 32);
    SCOPED_TRACE(p.to_string());
    const Expected e = expected_for(p);
    const StridedBuffers host = strided_buffers(p, e.in, padded_args(p, 0), false);
    DeviceCall dev;
    dev.init(p, host, 0);
    DeviceTensor source;  // hidden's values; dev.hidden starts each round as NaN
    CUDA_ASSERT(source.allocate(dev.hidden.bytes, 0));
    CUDA_ASSERT(cudaMemcpy(source.ptr, dev.hidden.ptr, dev.hidden.bytes, cudaMemcpyDeviceToDevice));
    if (HasFatalFailure()) return;
    const auto enqueue = [&]() -> Status {
      if (cudaMemsetAsync(dev.hidden.ptr, kNaNByte, dev.hidden.bytes, s.stream) != cudaSuccess ||
          dev.poison(s.stream) != cudaSuccess) {
        return {StatusCode::kCudaError, "cudaMemsetAsync (the poison)"};
      }
      if (late_copy(source.ptr, dev.hidden.ptr, dev.hidden.bytes, 50000, s.stream) !=
          cudaSuccess) {
        return {StatusCode::kCudaError, "late_copy"};
      }
      return run(p, dev.args, o);
    };
    int programmatic = 0;
    eager_then_graph_replays(
        s.stream, enqueue,
        [&](const std::string&) {
          expect_output_matches(dev.out, p.dtype, host.out_offsets, e.out, e.out_tolerance, "out");
        },
        &programmatic);
    if (HasFatalFailure()) return;
    EXPECT_GE(programmatic, 1) << "the call's kernel was not a programmatic dependent";
  }
}

class GpuGraphs : public ::testing::TestWithParam<Strategy> {};

// run() may be captured into a CUDA graph: no allocation, no synchronization, nothing on another
// stream (global capture mode turns any of those into an error), and the replayed graph computes
// the right result, twice. Run alone (as ctest does), the captured call is the first run() of the
// process, so lazy initialization inside run() (a handle, a device query) is caught too.
TEST_P(GpuGraphs, CapturableInACudaGraph) {
  SKIP_WITHOUT_CUDA();
  Problem p;
  ASSERT_TRUE(find_preset("seed", &p));
  if (GetParam() == Strategy::kCudaDecode) {  // a decode-sized call: T = 7
    p.batch = 1;
    p.seq = 7;
  }
  const Expected e = expected_for(p);
  for (bool with_latent : {true, false}) {
    SCOPED_TRACE(with_latent ? "latent" : "no latent");
    const StridedBuffers host = strided_buffers(p, e.in, padded_args(p, 0), with_latent);
    DeviceCall dev;
    dev.init(p, host, 0);
    if (HasFatalFailure()) return;
    OwnedStream s;
    CUDA_ASSERT(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    OwnedGraph g;
    CUDA_ASSERT(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeGlobal));
    const Status captured = run(p, dev.args, cuda_options(GetParam(), s.stream));
    CUDA_ASSERT(cudaStreamEndCapture(s.stream, &g.graph));
    ASSERT_TRUE(captured.ok()) << captured.message();
    CUDA_ASSERT(cudaGraphInstantiate(&g.exec, g.graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      CUDA_ASSERT(dev.poison(s.stream));
      CUDA_ASSERT(cudaGraphLaunch(g.exec, s.stream));
      CUDA_ASSERT(cudaStreamSynchronize(s.stream));
      expect_output_matches(dev.out, p.dtype, host.out_offsets, e.out, e.out_tolerance, "out");
      if (with_latent) {
        expect_output_matches(dev.latent, p.dtype, host.latent_offsets, e.latent,
                              e.latent_tolerance, "latent");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, GpuGraphs,
                         ::testing::Values(Strategy::kCudaFused, Strategy::kCudaGemm,
                                           Strategy::kCudaDecode),
                         [](const ::testing::TestParamInfo<Strategy>& info) {
                           std::string name = to_string(info.param);
                           return name.substr(name.find('-') + 1);
                         });

// Odd strides everywhere the decode kernels read or write element by element (hidden, out with
// unpacked heads, latent), and weight rows padded by 8 elements so they stay 16-byte vectors.
Args decode_padded_args(const Problem& p) {
  Args a = padded_args(p, kOddPad);
  a.w_down_stride_row = p.rank + 8;
  a.w_up_k_stride_row = p.kv_width() + 8;
  a.w_up_v_stride_row = p.kv_width() + 8;
  return a;
}

class GpuDecode : public ::testing::TestWithParam<DType> {};

// Every decode shape in every dtype, packed and padded, latent off and on, against float64 under
// each strategy; cuda-decode itself must have run on each of them.
TEST_P(GpuDecode, MatchesFloat64) {
  SKIP_WITHOUT_CUDA();
  for (Problem p : problems(decode_cases())) {  // cases.h: around the decode kernels' tiles
    p.dtype = GetParam();
    const Expected e = expected_for(p);
    for (const Args& strides : {padded_args(p, 0), decode_padded_args(p)}) {
      for (bool with_latent : {false, true}) {
        std::string why;
        std::vector<Strategy> ran;
        expect_cuda_matches(p, e, strides, with_latent, &why, 0, nullptr, &ran);
        if (HasFatalFailure()) return;
        EXPECT_NE(std::find(ran.begin(), ran.end(), Strategy::kCudaDecode), ran.end())
            << p.to_string() << ": cuda-decode did not run";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuDecode,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(to_string(info.param));
                         });

// kAuto sends DeepSeek decode to cuda-decode when the call has a workspace, and falls back to a
// strategy that needs none when it does not.
TEST(GpuDecodeDispatch, AutoPicksDecodeForFewTokens) {
  SKIP_WITHOUT_CUDA();
  Problem p = shape(1, 1, 2048, 512, 16, 128);
  p.dtype = DType::kBFloat16;
  const StridedBuffers host =
      strided_buffers(p, random_inputs(p, kSeed), padded_args(p, 0), /*with_latent=*/true);
  DeviceCall dev;
  dev.init(p, host, 0);
  if (HasFatalFailure()) return;
  EXPECT_GT(workspace_size(p, cuda_options(), true), 0);
  Strategy chosen = Strategy::kAuto;
  Status s = select_strategy(p, dev.args, cuda_options(), &chosen);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(chosen, Strategy::kCudaDecode);
  Args no_workspace = dev.args;
  no_workspace.workspace = nullptr;
  no_workspace.workspace_bytes = 0;
  s = select_strategy(p, no_workspace, cuda_options(), &chosen);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(chosen, Strategy::kCudaGemm);  // the latent output is its scratch
  s = check(p, no_workspace, cuda_options(Strategy::kCudaDecode));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("args.workspace_bytes"), std::string::npos) << s.message();
}

// ---- cuda-fused's cluster configuration (sm_90, 16-byte aligned rows) ----
// cuda-fused runs it once its streaming grid (ceil(T / 4) tiles, times up to a few column splits)
// passes 2 blocks per SM, so from T > 8 * SMs on whatever the widths; below that only the founding
// dims' token sweep reaches it (from T > 4 * SMs, 2 column splits). Its tile of tokens is chosen per call from T, the cluster size C and the SM count (4 more tokens
// each time C * T passes a multiple of 4 * SMs, up to 32), so the token edges here are k * SMs / 2
// - 1, k * SMs / 2 and k * SMs / 2 + 1 (a tile full, then one token into a larger one; every edge
// for C = 8, every second for C = 4) past the 32-token cap; the D and [K | V] chunks (one per
// block of the cluster) are exercised where D and 2N leave some blocks a short or empty chunk
// (D = 4, 20; N = 4, 12). Layouts: strided inputs and outputs still 16-byte
// aligned (its vector stores, heads not packed), outputs with odd strides (its scalar stores),
// pointers 16 bytes off (still its path) and 4 bytes off (the fallback configuration).

// Inputs padded by in_pad elements per dimension, out and latent by out_pad.
Args fused_layout_args(const Problem& p, int64_t in_pad, int64_t out_pad) {
  Args a = padded_args(p, in_pad);
  const Args o = padded_args(p, out_pad);
  a.out_stride_head = o.out_stride_head;
  a.out_stride_seq = o.out_stride_seq;
  a.out_stride_batch = o.out_stride_batch;
  a.out_stride_kv = o.out_stride_kv;
  a.latent_stride_seq = o.latent_stride_seq;
  a.latent_stride_batch = o.latent_stride_batch;
  return a;
}

// cuda-fused forced on p under each layout, against float64; outputs NaN-poisoned before each run.
void expect_fused_layouts(const Problem& p) {
  const Expected e = expected_for(p);
  const struct {
    int64_t in_pad, out_pad, misalign;
    bool latent;
  } layouts[] = {{0, 0, 0, true}, {4, 4, 0, true}, {0, 1, 0, true}, {0, 0, 4, false},
                 {0, 0, 1, true}};
  for (const auto& l : layouts) {
    SCOPED_TRACE(p.to_string() + ", in pad " + std::to_string(l.in_pad) + ", out pad " +
                 std::to_string(l.out_pad) + ", misalign " + std::to_string(l.misalign) +
                 (l.latent ? ", latent" : ""));
    const StridedBuffers host =
        strided_buffers(p, e.in, fused_layout_args(p, l.in_pad, l.out_pad), l.latent);
    DeviceCall dev;
    dev.init(p, host, l.misalign);
    if (::testing::Test::HasFatalFailure()) return;
    const Status s = run(p, dev.args, cuda_options(Strategy::kCudaFused));
    ASSERT_TRUE(s.ok()) << s.message();
    CUDA_ASSERT(cudaDeviceSynchronize());
    expect_output_matches(dev.out, p.dtype, host.out_offsets, e.out, e.out_tolerance, "out");
    if (l.latent) {
      expect_output_matches(dev.latent, p.dtype, host.latent_offsets, e.latent,
                            e.latent_tolerance, "latent");
    }
  }
}

int device_sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

// A T past the streaming configuration's two blocks per SM at any width and past the tensor-core
// configuration's one wave of 8-token tiles: the token-tile configuration's (D <= 256, R <= 64)
// and, for the shapes it refuses, the cluster one's.
int64_t past_streaming_tokens() { return 8 * device_sm_count() + 1; }

// A few shapes small enough for compute-sanitizer, each in the cluster configuration (R = 68 or
// D > 256, which the token tiles refuse): partial last tiles, empty chunks, heads not a multiple of
// 4 wide.
TEST(GpuFusedCluster, SmallEdges) {
  SKIP_WITHOUT_CUDA();
  const int64_t t = past_streaming_tokens();
  ASSERT_GT(t, 1);
  for (const Problem& p : {shape(1, t, 256, 68, 4, 32), shape(1, t, 20, 68, 1, 4),
                           shape(1, t + 2, 260, 4, 3, 4), shape(1, t + 6, 264, 52, 2, 6)}) {
    expect_fused_layouts(p);
    if (HasFatalFailure()) return;
  }
}

// T around each change of the cluster configuration's tile (4 to 32 tokens, from ceil(2 T /
// SMs): edges at multiples of SMs / 2), at R = 68 (past the token tiles' 64); the founding widths
// at B > 1 (the streaming configuration).
TEST(GpuFusedCluster, TokenTileEdges) {
  SKIP_WITHOUT_CUDA();
  const int64_t sms = device_sm_count();
  ASSERT_GT(sms, 0);
  std::vector<int64_t> tokens = {3, 4, 5};
  for (int64_t k = 1; k <= detail::tiles::kFusedClusterMaxTokens + 1; ++k) {
    const int64_t edge = k * sms / 2;
    for (int64_t t : {edge - 1, edge, edge + 1}) tokens.push_back(t);
  }
  for (int64_t t : tokens) {
    expect_fused_layouts(shape(1, t, 256, 68, 4, 32));
    if (HasFatalFailure()) return;
  }
  expect_fused_layouts(shape(4, 96, 256, 48, 4, 32));  // the founding case, B > 1
}

// The cluster's D chunks at R = 68 and its R at D = 260 (both refused by the token tiles).
TEST(GpuFusedCluster, ChunkEdges) {
  SKIP_WITHOUT_CUDA();
  const int64_t t = past_streaming_tokens();
  for (int64_t d : {4, 12, 20, 60, 260}) {
    expect_fused_layouts(shape(1, t, d, 68, 2, 8));
    if (HasFatalFailure()) return;
  }
  for (int64_t r : {4, 44, 52}) {
    expect_fused_layouts(shape(1, t, 260, r, 2, 16));
    if (HasFatalFailure()) return;
  }
  for (const auto& [h, dh] : {std::pair<int64_t, int64_t>{1, 4}, {3, 4}, {1, 12}, {2, 36},
                              {2, 6}, {4, 32}}) {
    expect_fused_layouts(shape(1, t, 260, 12, h, dh));
    if (HasFatalFailure()) return;
  }
}

// ---- cuda-fused's tensor-core configuration (the cluster configuration's T while its 8-token
// tiles x column blocks fit the SMs once; D <= 256, R <= 64, 16-byte rows) ----
// Small enough for compute-sanitizer: at the founding widths the window's first T (4 SMs + 1:
// one token in the last tile), T = 4 SMs + 8 over two sequences that meet inside a tile, and its
// last T (a tile per SM); small D and R; D, R, N off their tiles with 2N = 264 (a second column
// block, its one up tile partial) and 2N = 248 (the last up tile partial). Each under the layouts
// above (the padded and misaligned ones fall back to the FFMA configurations).
TEST(GpuFusedTensorCore, WindowEdges) {
  SKIP_WITHOUT_CUDA();
  const int64_t sms = device_sm_count();
  ASSERT_GT(sms, 0);
  for (const Problem& p :
       {shape(1, 4 * sms + 1, 256, 48, 4, 32), shape(2, 2 * sms + 4, 256, 48, 4, 32),
        shape(1, 8 * sms, 256, 48, 4, 32), shape(1, 6 * sms + 3, 20, 12, 4, 32),
        shape(1, 3 * sms + 5, 100, 40, 3, 44), shape(1, 6 * sms + 1, 64, 64, 2, 62)}) {
    expect_fused_layouts(p);
    if (HasFatalFailure()) return;
  }
}

// ---- cuda-fused's token-tile configuration (past the streaming grid's two blocks per SM and the
// tensor-core configuration's one wave; D <= 256, R <= 64, any layout: 16, 32, 48 or 64-token
// tiles, persistent blocks) ----
// At the founding widths: 4 x SMs + 1 (inside the tensor-core window: only the misaligned layouts
// come here), the edges of the tile choice on this device (16 x SMs: the last grid of 16-token
// tiles; 32 x SMs + 1: 48-token tiles of 12 warps, their last grid at 48 x SMs; 48 x SMs + 1:
// 64-token tiles; past 64 x SMs persistent blocks walking 48-token tiles, two at 64 x SMs + 1,
// three at 128 x SMs + 17, or 64-token tiles where those leave the busiest block fewer tokens, two
// at 96 x SMs + 1), two sequences meeting inside a tile (at 48-token tiles too: 2 x (20 x SMs +
// 3)). Past 8 x SMs (the region at any width): tiny widths; D and R off their K steps (D = 252,
// R = 44: zero-filled rows and columns) with 2N = 264 (a second column block of 8 columns);
// 2N = 512 at R = 64 (two full column blocks, the largest shared-memory plan); 2N = 120 (the last
// n-tile partial); an odd head width (no pair stores); D, R and N odd; R past 48 at 48- and
// 64-token tiles (R = 64, 52) and R = 48 with D = 200 (25 K steps, an odd count) at 48-token
// tiles. Each under the layouts above (the padded outputs store element by element; the
// misaligned inputs are staged by element loads).
TEST(GpuFusedTokenTiles, TileEdges) {
  SKIP_WITHOUT_CUDA();
  const int64_t sms = device_sm_count();
  ASSERT_GT(sms, 0);
  const int64_t t = past_streaming_tokens();
  for (const Problem& p :
       {shape(1, 4 * sms + 1, 256, 48, 4, 32), shape(1, 16 * sms, 256, 48, 4, 32),
        shape(2, 8 * sms + 3, 256, 48, 4, 32), shape(1, 32 * sms + 1, 256, 48, 4, 32),
        shape(1, 48 * sms, 256, 48, 4, 32), shape(2, 20 * sms + 3, 256, 48, 4, 32),
        shape(1, 48 * sms + 1, 256, 48, 4, 32), shape(1, 64 * sms + 1, 256, 48, 4, 32),
        shape(1, 128 * sms + 17, 256, 48, 4, 32), shape(1, 96 * sms + 1, 256, 48, 4, 32),
        shape(1, t, 4, 4, 3, 4), shape(1, 32 * sms + 5, 252, 44, 3, 44),
        shape(1, 16 * sms - 3, 256, 64, 8, 32), shape(1, 64 * sms + 9, 100, 40, 2, 30),
        shape(1, t + 7, 64, 16, 4, 3), shape(1, t + 11, 255, 45, 3, 15),
        shape(1, 32 * sms + 1, 256, 64, 4, 32), shape(1, 48 * sms + 1, 200, 52, 2, 24),
        shape(1, 40 * sms + 7, 200, 48, 2, 24)}) {
    expect_fused_layouts(p);
    if (HasFatalFailure()) return;
  }
}

// ---- cuda-fused's one-token configuration (T <= 2, D <= 256, R <= 64 and a multiple of 4) ----
// The founding widths at T = 1, T = 2 in one sequence and over two; D = 1, 32, 33 and 255 (rows
// past D read nothing); R = 4, 8, 44, 48, 60 and 64 (the reduce-scatter's full width; row slices
// of 1..8 rows, the last one short); 2N = 8, 30 (one partial block), 80 (K | V meeting inside a
// block, N = 40) and 1024 (32 blocks); odd head widths; then D = 257, R = 62 and R = 68, which
// fall back to the streaming configuration. Each under the layouts above (pointers 4 bytes off:
// w_down's rows are no longer vectors, the fallback again).
TEST(GpuFusedOneToken, Edges) {
  SKIP_WITHOUT_CUDA();
  for (const Problem& p :
       {shape(1, 1, 256, 48, 4, 32), shape(1, 2, 256, 48, 4, 32), shape(2, 1, 256, 48, 4, 32),
        shape(1, 1, 1, 4, 1, 4), shape(1, 1, 32, 64, 2, 20), shape(1, 1, 33, 60, 1, 16),
        shape(1, 2, 255, 8, 5, 3), shape(1, 1, 256, 64, 16, 32), shape(1, 2, 100, 44, 2, 10),
        shape(1, 1, 257, 48, 4, 32), shape(1, 1, 64, 62, 2, 8), shape(1, 1, 64, 68, 2, 8)}) {
    expect_fused_layouts(p);
    if (HasFatalFailure()) return;
  }
}

// ---- cuda-fused's register-tile configuration (from 3 tokens while its grid fits the SMs once;
// D <= 256, R <= 64, 16-byte rows) ----
// Small enough for compute-sanitizer. 32 columns a block (few tokens): the founding widths at
// T = 3 (one partial tile), 4, 5 and over two sequences that meet inside a tile; D = 4 (one lane's
// piece) and 252; R = 4, 44 (a warp's 8 columns partly past R) and 52; 2N = 16, 40 (K | V
// meeting inside a block), 264 (a partial ninth block) and 512; head widths of 3 and 12 (element
// stores). 256 columns a block: the founding case, 4 x SMs (one tile per SM), 2N = 512 and 264
// past a block, a head width of 9 (element stores). Then D = 255 and
// R = 68, which fall back to the streaming configuration. Each under the layouts above (padded
// and misaligned inputs: the fallback again).
TEST(GpuFusedRegisterTiles, Edges) {
  SKIP_WITHOUT_CUDA();
  const int64_t sms = device_sm_count();
  ASSERT_GT(sms, 0);
  for (const Problem& p :
       {shape(1, 3, 256, 48, 4, 32), shape(1, 4, 256, 48, 4, 32), shape(1, 5, 256, 48, 4, 32),
        shape(2, 3, 256, 48, 4, 32), shape(1, 9, 4, 4, 2, 4), shape(1, 7, 252, 44, 1, 20),
        shape(2, 5, 64, 52, 3, 12), shape(1, 6, 128, 64, 4, 64), shape(1, 11, 40, 48, 11, 12),
        shape(1, 3, 36, 8, 2, 128), shape(1, 13, 64, 16, 4, 3), shape(4, 96, 256, 48, 4, 32),
        shape(1, 4 * sms, 256, 48, 4, 32), shape(1, sms / 8, 128, 64, 4, 64),
        shape(1, sms / 8 + 1, 40, 44, 11, 12), shape(1, 3 * sms, 64, 16, 4, 9),
        shape(1, 13, 255, 48, 4, 32), shape(1, 13, 64, 68, 4, 32)}) {
    expect_fused_layouts(p);
    if (HasFatalFailure()) return;
  }
}

class GpuLowPrecision : public ::testing::TestWithParam<DType> {};

// bf16/fp16 within 2x the error of the unfused same-precision baseline, on every layout and
// strategy that takes them; skipped with the library's message when none does.
TEST_P(GpuLowPrecision, WithinTwiceTheUnfusedError) {
  SKIP_WITHOUT_CUDA();
  // The presets meant for this dtype (seed, deepseek-v2-lite, deepseek-v3), then every edge shape.
  std::vector<Problem> shapes =
      problems(preset_cases(), GetParam() == DType::kBFloat16 ? kBf16 : kFp16);
  for (const Problem& p : edge_shapes()) shapes.push_back(p);
  int runs = 0;
  std::string why;
  for (Problem p : shapes) {
    p.dtype = GetParam();
    runs += run_all_layouts(p, &why);
    if (HasFatalFailure()) return;
  }
  if (runs == 0) GTEST_SKIP() << why;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuLowPrecision,
                         ::testing::Values(DType::kBFloat16, DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::kBFloat16 ? "bf16" : "fp16");
                         });

}  // namespace
}  // namespace latentkv::testing
