// The shared test and benchmark support declared in testing.h: random inputs, the float64
// reference, the error metric and strided-layout helpers. Everything is plain,
// deterministic host code (its own uniform draws from std::mt19937_64, so a seed gives the same
// inputs with any standard library) and easy to trust: the reference is three loops in float64.
#include "testing.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

namespace latentkv::testing {
namespace {

// Uniform in [-1, 1) from the top 53 bits of one draw.
double uniform_pm1(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

// count values ~ U(-1, 1) * scale rounded to dtype, redrawn when the rounding gives zero.
std::vector<float> random_values(std::mt19937_64& rng, int64_t count, double scale, DType dtype) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) {
    do {
      x = round_to_dtype(static_cast<float>(uniform_pm1(rng) * scale), dtype);
    } while (x == 0.0f);
  }
  return v;
}

// Keeps the top bits of a float32, rounding the dropped `drop` bits to nearest even.
float round_mantissa(float value, int drop) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t half = (1u << (drop - 1)) - 1;
  bits += half + ((bits >> drop) & 1u);
  bits &= ~((1u << drop) - 1u);
  std::memcpy(&value, &bits, sizeof bits);
  return value;
}

// (extent, stride) of each dimension of `tensor`, outermost first.
std::vector<std::pair<int64_t, int64_t>> tensor_dims(const Problem& p, const Args& a, Tensor t) {
  switch (t) {
    case Tensor::kHidden:
      return {{p.batch, a.hidden_stride_batch}, {p.seq, a.hidden_stride_seq}, {p.model_dim, 1}};
    case Tensor::kWDown: return {{p.model_dim, a.w_down_stride_row}, {p.rank, 1}};
    case Tensor::kWUpK: return {{p.rank, a.w_up_k_stride_row}, {p.kv_width(), 1}};
    case Tensor::kWUpV: return {{p.rank, a.w_up_v_stride_row}, {p.kv_width(), 1}};
    case Tensor::kOut:
      return {{2, a.out_stride_kv},
              {p.batch, a.out_stride_batch},
              {p.seq, a.out_stride_seq},
              {p.heads, a.out_stride_head},
              {p.head_dim, 1}};
    case Tensor::kLatent:
      return {{p.batch, a.latent_stride_batch}, {p.seq, a.latent_stride_seq}, {p.rank, 1}};
  }
  return {};
}

}  // namespace

float round_to_dtype(float value, DType dtype) {
  if (dtype == DType::kBFloat16) return round_mantissa(value, 16);  // 8 of float32's 24 bits
  if (dtype != DType::kFloat16) return value;
  constexpr float kMinNormal = 0x1.0p-14f;  // below it fp16 is subnormal, quantum 2^-24
  if (std::fabs(value) < kMinNormal) return std::nearbyint(value * 0x1.0p24f) * 0x1.0p-24f;
  const float rounded = round_mantissa(value, 13);  // 11 of float32's 24 bits
  constexpr float kMax = 65504.0f;
  return std::fabs(rounded) > kMax ? std::copysign(std::numeric_limits<float>::infinity(), value)
                                   : rounded;
}

Tolerances unfused_tolerances(const Problem& p, const HostInputs& in,
                              const std::vector<double>& out_ref,
                              const std::vector<double>& latent_ref) {
  Tolerances t;
  if (p.dtype == DType::kFloat32) return t;
  const auto error_of = [](const std::vector<double>& got, const std::vector<double>& ref) {
    const std::vector<float> as_float(got.begin(), got.end());
    return relative_error(as_float.data(), ref);
  };
  std::vector<double> latent = latent_ref;
  for (double& x : latent) x = round_to_dtype(static_cast<float>(x), p.dtype);
  const int64_t t_count = p.tokens(), r_count = p.rank, n = p.kv_width();
  std::vector<double> out(static_cast<size_t>(2 * t_count * n), 0.0);  // [2, T, N]
  for (int half = 0; half < 2; ++half) {
    const std::vector<float>& w = half == 0 ? in.w_up_k : in.w_up_v;
    for (int64_t tok = 0; tok < t_count; ++tok) {
      double* row = out.data() + (half * t_count + tok) * n;
      for (int64_t r = 0; r < r_count; ++r) {
        const double l = latent[tok * r_count + r];
        for (int64_t j = 0; j < n; ++j) row[j] += l * w[r * n + j];
      }
      for (int64_t j = 0; j < n; ++j) row[j] = round_to_dtype(static_cast<float>(row[j]), p.dtype);
    }
  }
  t.out = std::max(2.0 * error_of(out, out_ref), kFloat32Tolerance);
  t.latent = std::max(2.0 * error_of(latent, latent_ref), kFloat32Tolerance);
  return t;
}

std::vector<unsigned char> to_bytes(const std::vector<float>& values, DType dtype) {
  const size_t eb = static_cast<size_t>(element_size(dtype));
  std::vector<unsigned char> out(values.size() * eb);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&out[i * eb], &values[i], eb);
    } else if (dtype == DType::kBFloat16) {
      const __nv_bfloat16 x = __float2bfloat16_rn(values[i]);
      std::memcpy(&out[i * eb], &x, eb);
    } else {
      const __half x = __float2half_rn(values[i]);
      std::memcpy(&out[i * eb], &x, eb);
    }
  }
  return out;
}

std::vector<float> from_bytes(const std::vector<unsigned char>& bytes, DType dtype) {
  const size_t eb = static_cast<size_t>(element_size(dtype));
  std::vector<float> out(bytes.size() / eb);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&out[i], &bytes[i * eb], eb);
    } else if (dtype == DType::kBFloat16) {
      __nv_bfloat16 x;
      std::memcpy(&x, &bytes[i * eb], eb);
      out[i] = __bfloat162float(x);
    } else {
      __half x;
      std::memcpy(&x, &bytes[i * eb], eb);
      out[i] = __half2float(x);
    }
  }
  return out;
}

HostInputs random_inputs(const Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t t = p.tokens(), n = p.kv_width();
  HostInputs in;
  in.hidden = random_values(rng, t * p.model_dim, 1.0, p.dtype);
  in.w_down =
      random_values(rng, p.model_dim * p.rank, 1.0 / std::sqrt(double(p.model_dim)), p.dtype);
  in.w_up_k = random_values(rng, p.rank * n, 1.0 / std::sqrt(double(p.rank)), p.dtype);
  in.w_up_v = random_values(rng, p.rank * n, 1.0 / std::sqrt(double(p.rank)), p.dtype);
  return in;
}

void reference_kv_proj(const Problem& p, const HostInputs& in, std::vector<double>* out,
                       std::vector<double>* latent) {
  const int64_t t_count = p.tokens(), d_count = p.model_dim, r_count = p.rank, n = p.kv_width();
  std::vector<double> lat(static_cast<size_t>(t_count * r_count), 0.0);  // [T, R]
  for (int64_t t = 0; t < t_count; ++t) {
    double* lrow = lat.data() + t * r_count;
    for (int64_t d = 0; d < d_count; ++d) {
      const double h = in.hidden[t * d_count + d];
      const float* wrow = in.w_down.data() + d * r_count;
      for (int64_t r = 0; r < r_count; ++r) lrow[r] += h * wrow[r];
    }
  }
  out->assign(static_cast<size_t>(2 * t_count * n), 0.0);  // [2, T, N]
  for (int64_t t = 0; t < t_count; ++t) {
    double* krow = out->data() + t * n;
    double* vrow = out->data() + (t_count + t) * n;
    for (int64_t r = 0; r < r_count; ++r) {
      const double l = lat[t * r_count + r];
      const float* wk = in.w_up_k.data() + r * n;
      const float* wv = in.w_up_v.data() + r * n;
      for (int64_t j = 0; j < n; ++j) {
        krow[j] += l * wk[j];
        vrow[j] += l * wv[j];
      }
    }
  }
  if (latent != nullptr) *latent = std::move(lat);
}

double relative_error(const float* got, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      return std::numeric_limits<double>::infinity();
    }
    const double e = got[i] - ref[i];
    diff += e * e;
    norm += ref[i] * ref[i];
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

std::string problem_id(const Problem& p) {
  return "B" + std::to_string(p.batch) + "_S" + std::to_string(p.seq) + "_D" +
         std::to_string(p.model_dim) + "_R" + std::to_string(p.rank) + "_H" +
         std::to_string(p.heads) + "_Dh" + std::to_string(p.head_dim);
}

Args padded_args(const Problem& p, int64_t pad) {
  Args a;
  a.hidden_stride_seq = p.model_dim + pad;
  a.hidden_stride_batch = p.seq * a.hidden_stride_seq + pad;
  a.w_down_stride_row = p.rank + pad;
  a.w_up_k_stride_row = p.kv_width() + pad;
  a.w_up_v_stride_row = p.kv_width() + pad;
  a.out_stride_head = p.head_dim + pad;
  a.out_stride_seq = p.heads * a.out_stride_head + pad;
  a.out_stride_batch = p.seq * a.out_stride_seq + pad;
  a.out_stride_kv = p.batch * a.out_stride_batch + pad;
  a.latent_stride_seq = p.rank + pad;
  a.latent_stride_batch = p.seq * a.latent_stride_seq + pad;
  return a;
}

std::vector<int64_t> element_offsets(const Problem& p, const Args& a, Tensor tensor) {
  std::vector<int64_t> offsets{0};
  for (const auto& [extent, stride] : tensor_dims(p, a, tensor)) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(extent));
    for (int64_t base : offsets) {
      for (int64_t i = 0; i < extent; ++i) next.push_back(base + i * stride);
    }
    offsets = std::move(next);
  }
  return offsets;
}

int64_t span_elements(const Problem& p, const Args& a, Tensor tensor) {
  int64_t last = 0;
  for (const auto& [extent, stride] : tensor_dims(p, a, tensor)) last += (extent - 1) * stride;
  return last + 1;
}

std::vector<float> scatter(const std::vector<float>& packed, const std::vector<int64_t>& offsets,
                           int64_t span, float fill) {
  std::vector<float> buffer(static_cast<size_t>(span), fill);
  for (size_t i = 0; i < offsets.size(); ++i) buffer[offsets[i]] = packed[i];
  return buffer;
}

std::vector<float> gather(const float* base, const std::vector<int64_t>& offsets) {
  std::vector<float> packed(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) packed[i] = base[offsets[i]];
  return packed;
}

StridedBuffers strided_buffers(const Problem& p, const HostInputs& in, const Args& strides,
                               bool with_latent) {
  constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
  auto place = [&](const std::vector<float>& packed, Tensor t) {
    return scatter(packed, element_offsets(p, strides, t), span_elements(p, strides, t), kPoison);
  };
  StridedBuffers b;
  b.hidden = place(in.hidden, Tensor::kHidden);
  b.w_down = place(in.w_down, Tensor::kWDown);
  b.w_up_k = place(in.w_up_k, Tensor::kWUpK);
  b.w_up_v = place(in.w_up_v, Tensor::kWUpV);
  b.out.assign(static_cast<size_t>(span_elements(p, strides, Tensor::kOut)), kPoison);
  b.out_offsets = element_offsets(p, strides, Tensor::kOut);
  b.args = strides;
  b.args.hidden = b.hidden.data();
  b.args.w_down = b.w_down.data();
  b.args.w_up_k = b.w_up_k.data();
  b.args.w_up_v = b.w_up_v.data();
  b.args.out = b.out.data();
  b.args.latent = nullptr;
  if (with_latent) {
    b.latent.assign(static_cast<size_t>(span_elements(p, strides, Tensor::kLatent)), kPoison);
    b.latent_offsets = element_offsets(p, strides, Tensor::kLatent);
    b.args.latent = b.latent.data();
  }
  return b;
}

int64_t count_not_nan(const std::vector<float>& buffer) {
  int64_t n = 0;
  for (float x : buffer) n += !std::isnan(x);
  return n;
}

}  // namespace latentkv::testing
