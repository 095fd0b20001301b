// The MLA cases' inputs, tensors, float64 check and driver (see mla_case.h). The check compares
// each output separately: for bf16/fp16 each must be within twice the unfused baseline's error of
// the same output on the same inputs, for float32 within 1e-5; the case reports the output closest
// to its bound, and all of them in error_detail.
#include "mla_case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "case_steps.h"
#include "verify.h"

namespace latentkv::bench {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool runs_first(const MlaProblem& p) { return p.stage != MlaStage::kSecond; }
bool runs_second(const MlaProblem& p) { return p.stage != MlaStage::kFirst; }

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

// Rows `rows` of a packed [T, width] vector.
std::vector<float> pick_rows(const std::vector<float>& v, int64_t width,
                             const std::vector<int64_t>& rows) {
  std::vector<float> out;
  out.reserve(rows.size() * static_cast<size_t>(width));
  for (int64_t t : rows) out.insert(out.end(), v.begin() + t * width, v.begin() + (t + 1) * width);
  return out;
}

// Error of rows `rows` (width wide) of a packed [T, width] output against ref (those rows,
// packed); +inf when any element of the whole output is not finite.
double rows_error(const std::vector<float>& out, int64_t t_all, int64_t width,
                  const std::vector<int64_t>& rows, const std::vector<double>& ref) {
  if (static_cast<int64_t>(out.size()) != t_all * width || !all_finite(out)) return kInf;
  return testing::mla_relative_error(pick_rows(out, width, rows), ref);
}

std::string format_error(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2e", v);
  return std::isnan(v) ? "-" : std::isinf(v) ? "inf" : buf;
}

// Sets outcome, error, tolerance and error_detail from each output's fused and baseline errors.
void judge(DType dtype, const MlaErrors& fused, const MlaErrors& baseline, CaseResult* r) {
  bool pass = true;
  double worst = -1.0;
  for (int o = 0; o < kMlaOutputs; ++o) {
    const double error = fused.error[o];
    if (std::isnan(error)) continue;  // not an output of this call
    const double tolerance = fused_tolerance(dtype, baseline.error[o]);
    const bool ok = error <= tolerance;  // a NaN tolerance (no baseline) fails, as it must
    pass = pass && ok;
    const double ratio = std::isnan(tolerance) || std::isinf(error) ? kInf : error / tolerance;
    if (ratio > worst) {
      worst = ratio;
      r->fused.error = error;
      r->tolerance = tolerance;
    }
    r->error_detail += std::string(r->error_detail.empty() ? "" : ", ") + mla_output_name(o) +
                       " " + format_error(error) + (ok ? " <= " : " > ") +
                       format_error(tolerance);
  }
  r->outcome = pass ? Outcome::kPass : Outcome::kFail;
}

double worst_error(const MlaErrors& e) {
  double worst = kNaN;
  for (double v : e.error) {
    if (!std::isnan(v)) worst = std::isnan(worst) ? v : std::max(worst, v);
  }
  return worst;
}

}  // namespace

MlaHostInputs make_mla_inputs(const MlaProblem& p, uint64_t seed) {
  MlaHostInputs h;
  h.in = testing::random_mla_inputs(p, seed);
  const int64_t pages_per_seq = (p.seq + kMlaPageSlots - 1) / kMlaPageSlots;
  std::vector<int64_t> pages(static_cast<size_t>(p.batch * pages_per_seq + 1));
  std::iota(pages.begin(), pages.end(), int64_t{0});
  std::mt19937_64 rng(seed ^ 0x5bd1e995u);
  std::shuffle(pages.begin(), pages.end(), rng);
  h.num_slots = static_cast<int64_t>(pages.size()) * kMlaPageSlots;
  h.slot_mapping.resize(static_cast<size_t>(p.tokens()));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < p.seq; ++s) {
      const int64_t page = pages[static_cast<size_t>(b * pages_per_seq + s / kMlaPageSlots)];
      h.slot_mapping[static_cast<size_t>(b * p.seq + s)] =
          page * kMlaPageSlots + s % kMlaPageSlots;
    }
  }
  return h;
}

int64_t element_bytes(const MlaTensor& tensor, const MlaProblem& problem) {
  switch (tensor.kind) {
    case MlaKind::kData: return element_size(problem.dtype);
    case MlaKind::kRope: return element_size(problem.rope_dtype);
    case MlaKind::kIndex: return static_cast<int64_t>(sizeof(int64_t));
  }
  return 0;
}

std::vector<MlaTensor> mla_tensors(const BenchCase& c, const MlaHostInputs& h) {
  const MlaProblem& p = c.mla_problem;
  const testing::MlaInputs& in = h.in;
  const int64_t t = p.tokens(), width = p.cache_width();
  std::vector<MlaTensor> ts(kMlaTensors);
  const auto input = [&](int id, MlaKind kind, std::vector<float> values) {
    ts[static_cast<size_t>(id)].kind = kind;
    ts[static_cast<size_t>(id)].count = static_cast<int64_t>(values.size());
    ts[static_cast<size_t>(id)].values = std::move(values);
  };
  const auto index = [&](int id, const std::vector<int64_t>& indices) {
    ts[static_cast<size_t>(id)].kind = MlaKind::kIndex;
    ts[static_cast<size_t>(id)].count = static_cast<int64_t>(indices.size());
    ts[static_cast<size_t>(id)].indices = indices;
  };
  const auto output = [&](int id, int64_t count) {
    ts[static_cast<size_t>(id)].output = true;
    ts[static_cast<size_t>(id)].count = count;
  };
  if (runs_first(p)) {
    input(kMlaHidden, MlaKind::kData, in.hidden);
    std::vector<float> weight_a = in.q_a_weight;  // [Rq + R + dr, D], q_a first
    weight_a.insert(weight_a.end(), in.kv_a_weight.begin(), in.kv_a_weight.end());
    input(kMlaWeightA, MlaKind::kData, std::move(weight_a));
    input(kMlaKvANorm, MlaKind::kData, in.kv_a_norm_weight);
    if (p.q_rank > 0) {
      input(kMlaQANorm, MlaKind::kData, in.q_a_norm_weight);
      output(kMlaQa, t * p.q_rank);
    }
    if (c.rope_form == testing::RopeForm::kPositions) {
      index(kMlaPositions, in.positions);
      input(kMlaCosSinCache, MlaKind::kRope, in.cos_sin_cache);
    } else {
      input(kMlaCos, MlaKind::kRope, in.cos);
      input(kMlaSin, MlaKind::kRope, in.sin);
    }
    output(kMlaCache, h.num_slots * width);
  } else {
    // Stage B alone reads [c | k_pe] from the token's slot; every other slot holds NaN.
    std::vector<float> cache(static_cast<size_t>(h.num_slots * width),
                             std::numeric_limits<float>::quiet_NaN());
    for (int64_t i = 0; i < t; ++i) {
      float* row = cache.data() + h.slot_mapping[static_cast<size_t>(i)] * width;
      std::copy_n(in.latent.begin() + i * p.kv_rank, p.kv_rank, row);
      std::copy_n(in.k_pe.begin() + i * p.rope_dim, p.rope_dim, row + p.kv_rank);
    }
    input(kMlaCache, MlaKind::kData, std::move(cache));
  }
  index(kMlaSlots, h.slot_mapping);
  if (runs_second(p)) {
    input(kMlaKvB, MlaKind::kData, in.kv_b_weight);
    output(kMlaK, t * p.heads * p.k_width());
    output(kMlaV, t * p.heads * p.v_dim);
  }
  return ts;
}

MlaArgs mla_args(const BenchCase& c, const MlaHostInputs& h, void* const* ptr) {
  const MlaProblem& p = c.mla_problem;
  MlaArgs a = contiguous_mla_args(p);
  a.hidden = ptr[kMlaHidden];
  if (ptr[kMlaWeightA] != nullptr) {
    a.q_a_weight = p.q_rank > 0 ? ptr[kMlaWeightA] : nullptr;
    a.kv_a_weight =
        static_cast<char*>(ptr[kMlaWeightA]) + p.q_rank * p.model_dim * element_size(p.dtype);
  }
  a.kv_a_norm_weight = ptr[kMlaKvANorm];
  a.q_a_norm_weight = ptr[kMlaQANorm];
  a.positions = static_cast<const int64_t*>(ptr[kMlaPositions]);
  a.cos_sin_cache = ptr[kMlaCosSinCache];
  if (a.cos_sin_cache != nullptr) a.max_position = h.in.max_position;
  a.cos = ptr[kMlaCos];
  a.sin = ptr[kMlaSin];
  a.q_a = ptr[kMlaQa];
  a.kv_cache = ptr[kMlaCache];
  a.num_slots = h.num_slots;
  a.slot_mapping = static_cast<const int64_t*>(ptr[kMlaSlots]);
  a.kv_b_weight = ptr[kMlaKvB];
  a.k = ptr[kMlaK];
  a.v = ptr[kMlaV];
  return a;
}

const char* mla_output_name(int output) {
  switch (output) {
    case kOutQa: return "q_a";
    case kOutCache: return "cache";
    case kOutK: return "k";
    case kOutV: return "v";
  }
  return "?";
}

MlaReferenceCheck::MlaReferenceCheck(const BenchCase& c, const MlaHostInputs& h,
                                     double max_flops)
    : problem_(c.mla_problem), in_(h) {
  const MlaProblem& p = problem_;
  const int64_t t_all = p.tokens();
  MlaProblem one = p;
  one.batch = 1;
  one.seq = 1;
  tokens_ = sample_tokens(t_all, one.flops(), max_flops);
  const int64_t count = checked_tokens();
  if (count == t_all) {
    ref_ = testing::reference_mla(p, h.in, c.rope_form);
    return;
  }
  // The sampled tokens as a problem of their own: batch 1, seq = count, the same weights and
  // tables.
  MlaProblem sub = p;
  sub.batch = 1;
  sub.seq = count;
  const testing::MlaInputs& in = h.in;
  testing::MlaInputs picked;
  picked.kv_a_weight = in.kv_a_weight;
  picked.kv_a_norm_weight = in.kv_a_norm_weight;
  picked.q_a_weight = in.q_a_weight;
  picked.q_a_norm_weight = in.q_a_norm_weight;
  picked.kv_b_weight = in.kv_b_weight;
  picked.max_position = in.max_position;
  picked.cos_sin_cache = in.cos_sin_cache;
  picked.hidden = pick_rows(in.hidden, p.model_dim, tokens_);
  picked.cos = pick_rows(in.cos, p.rope_dim, tokens_);
  picked.sin = pick_rows(in.sin, p.rope_dim, tokens_);
  picked.latent = pick_rows(in.latent, p.kv_rank, tokens_);
  picked.k_pe = pick_rows(in.k_pe, p.rope_dim, tokens_);
  for (int64_t t : tokens_) picked.positions.push_back(in.positions[static_cast<size_t>(t)]);
  ref_ = testing::reference_mla(sub, picked, c.rope_form);
}

MlaErrors MlaReferenceCheck::errors(const MlaHostOutputs& out) const {
  const MlaProblem& p = problem_;
  const int64_t t_all = p.tokens();
  MlaErrors e;
  if (runs_first(p) && p.q_rank > 0) {
    e.error[kOutQa] = rows_error(out.q_a, t_all, p.q_rank, tokens_, ref_.q_a);
  }
  if (runs_first(p)) {
    // Mapped rows finite, unmapped rows still NaN (written nowhere else), sampled rows compared.
    const int64_t width = p.cache_width();
    std::vector<bool> mapped(static_cast<size_t>(in_.num_slots), false);
    for (int64_t slot : in_.slot_mapping) mapped[static_cast<size_t>(slot)] = true;
    bool layout_ok = static_cast<int64_t>(out.cache.size()) == in_.num_slots * width;
    for (int64_t s = 0; layout_ok && s < in_.num_slots; ++s) {
      const auto row = out.cache.begin() + s * width;
      layout_ok = mapped[static_cast<size_t>(s)]
                      ? std::all_of(row, row + width, [](float v) { return std::isfinite(v); })
                      : std::all_of(row, row + width, [](float v) { return std::isnan(v); });
    }
    if (!layout_ok) {
      e.error[kOutCache] = kInf;
    } else {
      std::vector<float> got;
      std::vector<double> ref;
      for (size_t i = 0; i < tokens_.size(); ++i) {
        const int64_t slot = in_.slot_mapping[static_cast<size_t>(tokens_[i])];
        got.insert(got.end(), out.cache.begin() + slot * width,
                   out.cache.begin() + (slot + 1) * width);
        const auto c = ref_.latent.begin() + static_cast<int64_t>(i) * p.kv_rank;
        const auto pe = ref_.k_pe.begin() + static_cast<int64_t>(i) * p.rope_dim;
        ref.insert(ref.end(), c, c + p.kv_rank);
        ref.insert(ref.end(), pe, pe + p.rope_dim);
      }
      e.error[kOutCache] = testing::mla_relative_error(got, ref);
    }
  }
  if (runs_second(p)) {
    e.error[kOutK] = rows_error(out.k, t_all, p.heads * p.k_width(), tokens_, ref_.k);
    e.error[kOutV] = rows_error(out.v, t_all, p.heads * p.v_dim, tokens_, ref_.v);
  }
  return e;
}

CaseResult run_mla_case(const BenchCase& c, Backend backend, Strategy strategy,
                        const TimingConfig& config, GpuSession* gpu, const ProgressFn& progress) {
  const MlaProblem& p = c.mla_problem;
  CaseResult result;
  result.bench_case = c;
  result.backend = backend;

  progress("random inputs");
  const MlaHostInputs inputs = make_mla_inputs(p, config.seed);
  progress("placing inputs");
  const std::unique_ptr<MlaTarget> target =
      gpu != nullptr ? make_mla_cuda_target(c, inputs, config, gpu->info(), gpu->stream())
                     : make_mla_cpu_target(c, inputs, config);
  const Options options = fused_options(backend, strategy, target->stream());
  const Status chosen = choose_strategy(*target, p, options, &result);
  if (!chosen.ok() && !target->has_baseline()) return result;

  progress("float64 reference");
  const MlaReferenceCheck check(c, inputs, kReferenceFlops);
  result.checked_tokens = check.checked_tokens();
  MlaErrors fused;
  if (chosen.ok()) {
    progress("fused: check");
    target->poison_outputs();
    const Status status = run(p, target->args(0), options);
    if (status.ok()) {
      fused = check.errors(target->read_outputs());
      result.fused.ran = true;
    } else {
      record_refusal(status, &result);
    }
  }
  MlaErrors baseline;
  if (target->has_baseline()) {
    progress("baseline: check");
    target->poison_outputs();
    target->run_baseline(0);
    baseline = check.errors(target->read_outputs());
    result.baseline.ran = true;
    result.baseline.error = worst_error(baseline);
  }

  if (result.fused.ran) judge(p.dtype, fused, baseline, &result);
  time_paths(*target, p, options, progress, &result);
  return result;
}

}  // namespace latentkv::bench
