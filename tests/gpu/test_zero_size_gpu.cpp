// A problem with a zero dimension on the CUDA backend: run() accepts it and writes, on the caller's
// stream, what the unfused math gives (the CPU backend's result, tests/cpu/test_validation.cpp's
// ZeroSize): out zeros where R or D is 0, the latent zeros where D is 0 and hidden @ w_down where
// only N is 0, nothing where T is 0. Every dtype; outputs start as NaN; empty tensors are null.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "testing.h"

namespace latentkv::testing {
namespace {

#define ZS_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device copy of host floats in dtype (null when empty).
void* upload(const std::vector<float>& v, DType dtype) {
  if (v.empty()) return nullptr;
  const std::vector<unsigned char> bytes = to_bytes(v, dtype);
  void* d = nullptr;
  if (cudaMalloc(&d, bytes.size()) != cudaSuccess) return nullptr;
  cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  return d;
}

// A device buffer of `count` elements, every byte 0xFF (NaN in every dtype); null when empty.
void* poisoned(int64_t count, DType dtype) {
  if (count == 0) return nullptr;
  void* d = nullptr;
  const size_t bytes = static_cast<size_t>(count * element_size(dtype));
  if (cudaMalloc(&d, bytes) != cudaSuccess) return nullptr;
  cudaMemset(d, 0xFF, bytes);
  return d;
}

std::vector<float> download(const void* d, int64_t count, DType dtype) {
  std::vector<unsigned char> raw(static_cast<size_t>(count * element_size(dtype)));
  if (count > 0) cudaMemcpy(raw.data(), d, raw.size(), cudaMemcpyDeviceToHost);
  return from_bytes(raw, dtype);
}

TEST(GpuZeroSize, EveryDimensionMayBeZero) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  const struct {
    int64_t Problem::*field;
    const char* name;
  } dims[] = {{&Problem::batch, "batch"}, {&Problem::seq, "seq"},
              {&Problem::model_dim, "model_dim"}, {&Problem::rank, "rank"},
              {&Problem::heads, "heads"}, {&Problem::head_dim, "head_dim"}};
  cudaStream_t stream = nullptr;
  ZS_CUDA_OK(cudaStreamCreate(&stream));
  Options cuda;
  cuda.backend = Backend::kCuda;
  cuda.stream = stream;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const auto& d : dims) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " " + d.name + " = 0");
      Problem q = shape(2, 3, 40, 16, 2, 8);
      q.dtype = dtype;
      q.*d.field = 0;
      const HostInputs in = random_inputs(q, 5);
      const int64_t out_count = 2 * q.tokens() * q.kv_width(), latent_count = q.tokens() * q.rank;
      void* hidden = upload(in.hidden, dtype);
      void* w_down = upload(in.w_down, dtype);
      void* w_up_k = upload(in.w_up_k, dtype);
      void* w_up_v = upload(in.w_up_v, dtype);
      void* out = poisoned(out_count, dtype);
      void* latent = poisoned(latent_count, dtype);
      const Args a = contiguous_args(q, hidden, w_down, w_up_k, w_up_v, out, latent);
      EXPECT_EQ(workspace_size(q, cuda, true), 0);
      const Status ran = run(q, a, cuda);
      EXPECT_TRUE(ran.ok()) << ran.message();
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

      std::vector<double> ref_out, ref_latent;
      reference_kv_proj(q, in, &ref_out, &ref_latent);
      for (float v : download(out, out_count, dtype)) EXPECT_EQ(v, 0.f);
      const std::vector<float> got_latent = download(latent, latent_count, dtype);
      const double tolerance = dtype == DType::kFloat32 ? kFloat32Tolerance : 1e-2;
      if (q.model_dim == 0) {
        for (float v : got_latent) EXPECT_EQ(v, 0.f);
      } else if (latent_count > 0) {
        EXPECT_LE(relative_error(got_latent.data(), ref_latent), tolerance);
      }
      for (void* p : {hidden, w_down, w_up_k, w_up_v, out, latent}) cudaFree(p);
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace latentkv::testing
