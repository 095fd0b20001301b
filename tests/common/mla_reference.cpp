// The MLA test support declared in mla_reference.h: deterministic random inputs (their own
// std::mt19937_64 draws), the float64 reference and the emulation of transformers' unfused
// half-precision code. Both computations share one body (mla_stages), parameterised by how each
// intermediate is rounded: not at all for the reference, to the dtype where torch rounds for the
// emulation, so the two differ in rounding only.
#include "mla_reference.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "testing.h"

namespace latentkv::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kRopeBase = 10000.0;
constexpr double kAttentionScaling = 1.07;  // YaRN's mscale shape: cos and sin scaled alike

double uniform(std::mt19937_64& rng, double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(rng() >> 11) * 0x1.0p-53);
}

std::vector<float> draw(std::mt19937_64& rng, int64_t count, double lo, double hi, DType dtype) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) {
    do {
      x = round_to_dtype(static_cast<float>(uniform(rng, lo, hi)), dtype);
    } while (x == 0.0f);
  }
  return v;
}

std::vector<float> draw_weight(std::mt19937_64& rng, int64_t rows, int64_t fan_in, DType dtype) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return draw(rng, rows * fan_in, -scale, scale, dtype);
}

// How the shared body rounds an intermediate: identity for float64, to the dtype for the
// emulation (float32 problems: to float32).
using Round = std::function<double(double)>;

// y[0:n] = round(w * round(x * rsqrt(mean(x^2) + eps))) with float32 statistics when emulating.
void rmsnorm(const Round& rnd, bool emulate, const std::vector<float>& gamma, float eps,
             double* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  double scale = 0.0;
  if (emulate) {
    const float variance = static_cast<float>(sum / static_cast<double>(n));
    scale = static_cast<double>(1.0f / std::sqrt(variance + eps));
  } else {
    scale = 1.0 / std::sqrt(sum / static_cast<double>(n) + static_cast<double>(eps));
  }
  for (int64_t i = 0; i < n; ++i) {
    const double normed =
        emulate ? rnd(static_cast<double>(static_cast<float>(x[i] * scale))) : x[i] * scale;
    x[i] = rnd(gamma[static_cast<size_t>(i)] * normed);
  }
}

// out[0:dr] = rope(in) for token t, per mla.h's semantics of the style and form.
void rope(const MlaProblem& p, const MlaInputs& in, RopeForm form, const Round& rnd,
          bool emulate, int64_t t, const double* x, double* out) {
  const int64_t dr = p.rope_dim, half = dr / 2;
  std::vector<double> cos(static_cast<size_t>(dr)), sin(static_cast<size_t>(dr));  // per column
  if (form == RopeForm::kPositions) {
    const int64_t pos = in.positions[static_cast<size_t>(t)];
    if (pos < 0 || pos >= in.max_position) {
      for (int64_t j = 0; j < dr; ++j) out[j] = kNaN;
      return;
    }
    const float* row = in.cos_sin_cache.data() + pos * dr;
    for (int64_t j = 0; j < dr; ++j) {
      cos[static_cast<size_t>(j)] = row[j % half];
      sin[static_cast<size_t>(j)] = row[half + j % half];
    }
  } else {
    for (int64_t j = 0; j < dr; ++j) {
      cos[static_cast<size_t>(j)] = in.cos[static_cast<size_t>(t * dr + j)];
      sin[static_cast<size_t>(j)] = in.sin[static_cast<size_t>(t * dr + j)];
    }
  }
  if (emulate) {  // transformers' rotary embedding returns cos/sin cast to the dtype
    for (int64_t j = 0; j < dr; ++j) {
      cos[static_cast<size_t>(j)] = rnd(cos[static_cast<size_t>(j)]);
      sin[static_cast<size_t>(j)] = rnd(sin[static_cast<size_t>(j)]);
    }
  }
  for (int64_t i = 0; i < half; ++i) {
    int64_t in0 = 2 * i, in1 = 2 * i + 1, out0 = i, out1 = i + half;  // interleave
    if (p.rope_style == RopeStyle::kGptJ) {
      out0 = 2 * i;
      out1 = 2 * i + 1;
    } else if (p.rope_style == RopeStyle::kNeox) {
      in0 = i;
      in1 = i + half;
    }
    // gptj reads pair i's angle from column i (the first half); the others from their outputs
    const size_t c0 = static_cast<size_t>(p.rope_style == RopeStyle::kGptJ ? i : out0);
    const size_t c1 = static_cast<size_t>(p.rope_style == RopeStyle::kGptJ ? i : out1);
    out[out0] = rnd(rnd(x[in0] * cos[c0]) - rnd(x[in1] * sin[c0]));
    out[out1] = rnd(rnd(x[in1] * cos[c1]) + rnd(x[in0] * sin[c1]));
  }
}

// y[t, n] = round(sum_k x[t, k] * w[n, k]) for t < rows, n < cols.
std::vector<double> gemm_nt(const Round& rnd, const std::vector<double>& x, int64_t rows,
                            const std::vector<float>& w, int64_t cols, int64_t k) {
  std::vector<double> y(static_cast<size_t>(rows * cols));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t n = 0; n < cols; ++n) {
      double acc = 0.0;
      const float* wr = w.data() + n * k;
      const double* xr = x.data() + t * k;
      for (int64_t e = 0; e < k; ++e) acc += xr[e] * wr[e];
      y[static_cast<size_t>(t * cols + n)] = rnd(acc);
    }
  }
  return y;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

MlaOutputs mla_stages(const MlaProblem& p, const MlaInputs& in, RopeForm form, const Round& rnd,
                      bool emulate) {
  const int64_t t_count = p.tokens(), width = p.cache_width(), dr = p.rope_dim;
  MlaOutputs out;
  if (p.stage != MlaStage::kSecond) {
    const std::vector<double> hidden = widen(in.hidden);
    std::vector<double> ckv = gemm_nt(rnd, hidden, t_count, in.kv_a_weight, width, p.model_dim);
    out.latent.resize(static_cast<size_t>(t_count * p.kv_rank));
    out.k_pe.resize(static_cast<size_t>(t_count * dr));
    for (int64_t t = 0; t < t_count; ++t) {
      double* row = ckv.data() + t * width;
      rmsnorm(rnd, emulate, in.kv_a_norm_weight, p.eps, row, p.kv_rank);
      std::copy(row, row + p.kv_rank, out.latent.begin() + t * p.kv_rank);
      rope(p, in, form, rnd, emulate, t, row + p.kv_rank, out.k_pe.data() + t * dr);
    }
    if (p.q_rank > 0) {
      out.q_a = gemm_nt(rnd, hidden, t_count, in.q_a_weight, p.q_rank, p.model_dim);
      for (int64_t t = 0; t < t_count; ++t) {
        rmsnorm(rnd, emulate, in.q_a_norm_weight, p.eps, out.q_a.data() + t * p.q_rank,
                p.q_rank);
      }
    }
    if (p.stage == MlaStage::kFirst) return out;
  } else {
    out.latent = widen(in.latent);
    out.k_pe = widen(in.k_pe);
  }
  const std::vector<double> kv =
      gemm_nt(rnd, out.latent, t_count, in.kv_b_weight, p.kv_b_rows(), p.kv_rank);
  const int64_t head_width = p.nope_dim + p.v_dim, kw = p.k_width();
  out.k.resize(static_cast<size_t>(t_count * p.heads * kw));
  out.v.resize(static_cast<size_t>(t_count * p.heads * p.v_dim));
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t h = 0; h < p.heads; ++h) {
      const double* src = kv.data() + (t * p.heads + h) * head_width;
      double* k = out.k.data() + (t * p.heads + h) * kw;
      std::copy(src, src + p.nope_dim, k);
      std::copy(out.k_pe.begin() + t * dr, out.k_pe.begin() + (t + 1) * dr, k + p.nope_dim);
      std::copy(src + p.nope_dim, src + head_width,
                out.v.begin() + (t * p.heads + h) * p.v_dim);
    }
  }
  return out;
}

template <typename T>
double relative_error_impl(const std::vector<T>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    if (std::isnan(ref[i]) != std::isnan(g) || std::isinf(g)) {
      return std::numeric_limits<double>::infinity();
    }
    if (std::isnan(ref[i])) continue;
    diff += (g - ref[i]) * (g - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace

const char* to_string(RopeForm form) {
  return form == RopeForm::kPositions ? "positions" : "cos_sin";
}

MlaInputs random_mla_inputs(const MlaProblem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const DType dt = p.dtype;
  const int64_t t_count = p.tokens(), dr = p.rope_dim, half = dr / 2;
  MlaInputs in;
  in.hidden = draw(rng, t_count * p.model_dim, -1.0, 1.0, dt);
  in.kv_a_weight = draw_weight(rng, p.cache_width(), p.model_dim, dt);
  in.kv_a_norm_weight = draw(rng, p.kv_rank, 0.5, 1.5, dt);
  if (p.q_rank > 0) {
    in.q_a_weight = draw_weight(rng, p.q_rank, p.model_dim, dt);
    in.q_a_norm_weight = draw(rng, p.q_rank, 0.5, 1.5, dt);
  }
  in.kv_b_weight = draw_weight(rng, p.kv_b_rows(), p.kv_rank, dt);

  in.max_position = 2 * t_count + 3;
  std::vector<double> freq(static_cast<size_t>(half));  // YaRN-like: each pair's frequency moved
  for (int64_t i = 0; i < half; ++i) {
    freq[static_cast<size_t>(i)] = std::pow(kRopeBase, -2.0 * static_cast<double>(i) /
                                                           static_cast<double>(dr)) *
                                   uniform(rng, 0.8, 1.2);
  }
  in.cos_sin_cache.resize(static_cast<size_t>(in.max_position * dr));
  for (int64_t pos = 0; pos < in.max_position; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * freq[static_cast<size_t>(i)];
      in.cos_sin_cache[static_cast<size_t>(pos * dr + i)] =
          round_to_dtype(static_cast<float>(kAttentionScaling * std::cos(angle)), p.rope_dtype);
      in.cos_sin_cache[static_cast<size_t>(pos * dr + half + i)] =
          round_to_dtype(static_cast<float>(kAttentionScaling * std::sin(angle)), p.rope_dtype);
    }
  }
  in.positions.resize(static_cast<size_t>(t_count));
  in.cos.resize(static_cast<size_t>(t_count * dr));
  in.sin.resize(static_cast<size_t>(t_count * dr));
  for (int64_t t = 0; t < t_count; ++t) {
    const int64_t pos = static_cast<int64_t>(rng() % static_cast<uint64_t>(in.max_position));
    in.positions[static_cast<size_t>(t)] = pos;
    for (int64_t j = 0; j < dr; ++j) {
      in.cos[static_cast<size_t>(t * dr + j)] = in.cos_sin_cache[static_cast<size_t>(pos * dr +
                                                                                    j % half)];
      in.sin[static_cast<size_t>(t * dr + j)] =
          in.cos_sin_cache[static_cast<size_t>(pos * dr + half + j % half)];
    }
  }
  in.latent = draw(rng, t_count * p.kv_rank, -2.0, 2.0, dt);
  in.k_pe = draw(rng, t_count * dr, -1.0, 1.0, dt);
  return in;
}

MlaOutputs reference_mla(const MlaProblem& problem, const MlaInputs& in, RopeForm form) {
  return mla_stages(problem, in, form, [](double x) { return x; }, /*emulate=*/false);
}

MlaOutputs emulate_unfused_mla(const MlaProblem& problem, const MlaInputs& in, RopeForm form) {
  const DType dtype = problem.dtype;
  return mla_stages(
      problem, in, form,
      [dtype](double x) {
        return static_cast<double>(round_to_dtype(static_cast<float>(x), dtype));
      },
      /*emulate=*/true);
}

double mla_relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  return relative_error_impl(got, ref);
}
double mla_relative_error(const std::vector<double>& got, const std::vector<double>& ref) {
  return relative_error_impl(got, ref);
}

std::vector<int64_t> deinterleave_permutation(int64_t rope_dim) {
  const int64_t half = rope_dim / 2;
  std::vector<int64_t> d(static_cast<size_t>(rope_dim));
  for (int64_t j = 0; j < rope_dim; ++j) {
    d[static_cast<size_t>(j)] = j < half ? 2 * j : 2 * (j - half) + 1;
  }
  return d;
}

MlaProblem mla_shape(int64_t d, int64_t q_rank, int64_t r, int64_t dr, int64_t h, int64_t dn,
                     int64_t dv) {
  MlaProblem p;
  p.batch = 1;
  p.seq = 1;
  p.model_dim = d;
  p.q_rank = q_rank;
  p.kv_rank = r;
  p.rope_dim = dr;
  p.heads = h;
  p.nope_dim = dn;
  p.v_dim = dv;
  p.dtype = DType::kBFloat16;
  p.rope_dtype = DType::kFloat32;
  return p;
}

std::vector<MlaNamedCase> mla_preset_cases() {
  return {
      {"deepseek-v2-lite-mla", mla_shape(2048, 0, 512, 64, 16, 128, 128)},
      {"deepseek-v3-mla", mla_shape(7168, 1536, 512, 64, 128, 128, 128)},
      {"kimi-k2-mla", mla_shape(7168, 1536, 512, 64, 64, 128, 128)},
  };
}

bool find_mla_preset(const std::string& name, MlaProblem* problem) {
  for (const MlaNamedCase& c : mla_preset_cases()) {
    if (c.name == name) {
      *problem = c.problem;
      return true;
    }
  }
  return false;
}

std::vector<MlaNamedCase> mla_path_sweep_cases() {
  const struct {
    const char* preset;
    const char* label;  // after the preset's name
    bool q_a;
    MlaStage stage;
    std::vector<int64_t> tokens;
  } rows[] = {
      {"deepseek-v2-lite-mla", "", false, MlaStage::kBoth, {1, 64, 1024, 4096}},
      {"deepseek-v3-mla", " kv", false, MlaStage::kBoth, {1, 64, 1024, 4096}},
      {"deepseek-v3-mla", " kv first", false, MlaStage::kFirst, {1, 16, 64}},
      {"deepseek-v3-mla", " q_a+kv first", true, MlaStage::kFirst, {1, 16}},
      {"deepseek-v2-lite-mla", " first", false, MlaStage::kFirst, {1, 16}},
  };
  std::vector<MlaNamedCase> cases;
  for (const auto& row : rows) {
    MlaProblem base;
    find_mla_preset(row.preset, &base);
    if (!row.q_a) base.q_rank = 0;
    base.stage = row.stage;
    for (int64_t t : row.tokens) {
      MlaProblem p = base;
      p.seq = t;
      cases.push_back({std::string(row.preset) + row.label + " T=" + std::to_string(t), p});
    }
  }
  return cases;
}

MlaProblem mla_edge_problem(const MlaEdge& e) {
  MlaProblem p = mla_shape(e.d, e.q_rank, e.r, e.dr, e.h, e.dn, e.dv);
  p.batch = e.b;
  p.seq = e.s;
  return p;
}

std::vector<MlaNamedCase> mla_edge_cases() {
  // Small shapes off every power of two: one token, odd H and R, dr from 2 to 64, dn != dv, Rq = 0
  // and > 0, 8-wide vectors and 16-token tiles crossed by one (cpu-mla's own item and panel edges
  // are in tests/cpu/test_mla.cpp).
  const MlaEdge edges[] = {
      {"one-token", 1, 1, 16, 0, 8, 4, 1, 4, 4},
      {"odd-heads-odd-rank", 2, 3, 40, 0, 21, 8, 3, 6, 6},
      {"rope32-q-a", 1, 5, 64, 24, 32, 32, 2, 16, 8},
      {"rope16-dn-ne-dv", 3, 2, 33, 12, 17, 16, 5, 7, 11},
      {"rope2", 1, 7, 9, 3, 5, 2, 2, 3, 1},
      {"tile-plus-one", 1, 17, 24, 0, 16, 8, 2, 8, 8},
      {"v2-lite-like", 2, 9, 128, 0, 64, 64, 2, 32, 32},
      {"v3-like", 1, 33, 96, 48, 64, 64, 3, 32, 16},
  };
  std::vector<MlaNamedCase> cases;
  for (const MlaEdge& e : edges) {
    MlaProblem p = mla_edge_problem(e);
    p.dtype = DType::kFloat32;
    cases.push_back({e.name, p});
  }
  return cases;
}

std::string mla_problem_id(const MlaProblem& p) {
  std::ostringstream s;
  s << "B" << p.batch << "_S" << p.seq << "_D" << p.model_dim << "_Rq" << p.q_rank << "_R"
    << p.kv_rank << "_dr" << p.rope_dim << "_H" << p.heads << "_dn" << p.nope_dim << "_dv"
    << p.v_dim;
  return s.str();
}

}  // namespace latentkv::testing
