// The MLA path on the CPU backend (cpu-mla) and its API layer: every refusal names the argument and
// its value and writes nothing; every stage, RoPE style and form, cache kind (none, dense, paged
// with padding and out-of-range slots), position past the cos/sin cache and strided layout against
// the float64 reference (mla_reference.h) at kMlaFloat32Tolerance; stage-alone calls against
// kBoth; the RoPE styles against each other by the column permutation alone.
//
// Every buffer is exactly as large as its strides need (the cos/sin cache max_position rows), its
// padding and every output element NaN before the call, and each output buffer is compared whole
// (an element written where it should not be, or left unwritten, shows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mla_reference.h"
#include "testing.h"

namespace latentkv::testing {
namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Cache { kNone, kDense, kPaged };
const char* to_string(Cache c) {
  return c == Cache::kNone ? "nocache" : c == Cache::kDense ? "dense" : "paged";
}

// One strided tensor: (extent, stride) per dimension, outermost first, innermost contiguous.
struct Layout {
  std::vector<std::pair<int64_t, int64_t>> dims;
  int64_t span() const {
    int64_t last = 0;
    for (const auto& d : dims) last += (d.first - 1) * d.second;
    return last + 1;
  }
  std::vector<int64_t> offsets() const {
    std::vector<int64_t> out = {0};
    for (const auto& d : dims) {
      std::vector<int64_t> next;
      for (int64_t o : out) {
        for (int64_t i = 0; i < d.first; ++i) next.push_back(o + i * d.second);
      }
      out = std::move(next);
    }
    return out;
  }
};

// [B, S, width] padded by pad elements after every row and every batch.
Layout token_layout(const MlaProblem& p, int64_t width, int64_t pad) {
  const int64_t seq = width + pad;
  return {{{p.batch, p.seq * seq + pad}, {p.seq, seq}, {width, 1}}};
}
Layout matrix_layout(int64_t rows, int64_t cols, int64_t pad) {
  return {{{rows, cols + pad}, {cols, 1}}};
}
// [B, S, H, width] padded after every head, token and batch.
Layout head_layout(const MlaProblem& p, int64_t width, int64_t pad) {
  const int64_t head = width + pad, seq = p.heads * head + pad;
  return {{{p.batch, p.seq * seq + pad}, {p.seq, seq}, {p.heads, head}, {width, 1}}};
}

template <typename T>
std::vector<T> scatter_into(const std::vector<T>& packed, const Layout& l, T fill) {
  std::vector<T> buf(static_cast<size_t>(l.span()), fill);
  const std::vector<int64_t> off = l.offsets();
  for (size_t i = 0; i < off.size(); ++i) buf[static_cast<size_t>(off[i])] = packed[i];
  return buf;
}

std::vector<double> expected_buffer(const std::vector<double>& packed, const Layout& l) {
  return scatter_into(packed, l, kNaN);
}

// The whole of one call: the inputs under the layouts, the outputs NaN, args pointing into them.
struct MlaCall {
  MlaProblem p;
  RopeForm form = RopeForm::kPositions;
  Cache cache = Cache::kNone;
  bool second_from_cache = false;  // kSecond: read c and k_pe from the cache (else latent, k_pe)
  bool want_q_a = true;
  int64_t pad = 0;

  MlaInputs in;
  std::vector<int64_t> slots;  // [T] slot of each token (paged); dense: t
  int64_t num_slots = 0;
  Layout hidden_l, q_a_l, cache_l, latent_l, k_pe_l, k_l, v_l, rope_l, tok1_l;
  std::vector<float> hidden, kv_a_weight, q_a_weight, kv_b_weight, cos_sin_cache, cos, sin,
      latent, k_pe;
  std::vector<int64_t> positions, slot_mapping;
  std::vector<float> q_a, kv_cache, k, v;
  MlaArgs args;

  MlaCall() = default;
  MlaCall(const MlaCall&) = delete;
  MlaCall& operator=(const MlaCall&) = delete;
};

// Slots for T tokens in a cache of T + 5 rows: a permutation, with every fifth token padding (-1)
// and every seventh past the cache (num_slots, or int64 max).
void paged_slots(int64_t t_count, std::vector<int64_t>* slots, int64_t* num_slots) {
  *num_slots = t_count + 5;
  slots->resize(static_cast<size_t>(t_count));
  for (int64_t t = 0; t < t_count; ++t) {
    int64_t s = (t * 7 + 3) % *num_slots;
    while (true) {  // a free slot (the map t -> 7t + 3 mod n is injective when n is not 7k)
      bool used = false;
      for (int64_t u = 0; u < t; ++u) used = used || (*slots)[static_cast<size_t>(u)] == s;
      if (!used) break;
      s = (s + 1) % *num_slots;
    }
    (*slots)[static_cast<size_t>(t)] = s;
  }
  for (int64_t t = 0; t < t_count; ++t) {
    if (t % 5 == 4) (*slots)[static_cast<size_t>(t)] = -1;
    if (t % 7 == 6) {
      (*slots)[static_cast<size_t>(t)] =
          t % 2 ? *num_slots : std::numeric_limits<int64_t>::max();
    }
  }
  if (t_count >= 3) (*slots)[1] = std::numeric_limits<int64_t>::min();
}

bool slot_valid(const MlaCall& c, int64_t t) {
  const int64_t s = c.slots[static_cast<size_t>(t)];
  return s >= 0 && s < c.num_slots;
}

// Lays out `c` (p, form, cache, pad, ... set; c.in drawn) and points c.args into it.
void build(MlaCall* c) {
  const MlaProblem& p = c->p;
  const int64_t pad = c->pad, t_count = p.tokens();
  MlaArgs& a = c->args;
  a = contiguous_mla_args(p);
  const bool first = p.stage != MlaStage::kSecond;
  const bool second = p.stage != MlaStage::kFirst;

  c->num_slots = t_count;
  c->slots.resize(static_cast<size_t>(t_count));
  for (int64_t t = 0; t < t_count; ++t) c->slots[static_cast<size_t>(t)] = t;
  if (c->cache == Cache::kPaged) paged_slots(t_count, &c->slots, &c->num_slots);

  c->tok1_l = token_layout(p, 1, pad);
  if (first) {
    c->hidden_l = token_layout(p, p.model_dim, pad);
    c->hidden = scatter_into(c->in.hidden, c->hidden_l, kNaNf);
    a.hidden = c->hidden.data();
    a.hidden_stride_batch = c->hidden_l.dims[0].second;
    a.hidden_stride_seq = c->hidden_l.dims[1].second;
    const Layout w = matrix_layout(p.cache_width(), p.model_dim, pad);
    c->kv_a_weight = scatter_into(c->in.kv_a_weight, w, kNaNf);
    a.kv_a_weight = c->kv_a_weight.data();
    a.kv_a_weight_stride_row = w.dims[0].second;
    a.kv_a_norm_weight = c->in.kv_a_norm_weight.data();
    if (p.q_rank > 0) {
      const Layout q = matrix_layout(p.q_rank, p.model_dim, pad);
      c->q_a_weight = scatter_into(c->in.q_a_weight, q, kNaNf);
      a.q_a_weight = c->q_a_weight.data();
      a.q_a_weight_stride_row = q.dims[0].second;
      a.q_a_norm_weight = c->in.q_a_norm_weight.data();
      if (c->want_q_a) {
        c->q_a_l = token_layout(p, p.q_rank, pad);
        c->q_a.assign(static_cast<size_t>(c->q_a_l.span()), kNaNf);
        a.q_a = c->q_a.data();
        a.q_a_stride_batch = c->q_a_l.dims[0].second;
        a.q_a_stride_seq = c->q_a_l.dims[1].second;
      }
    }
    if (c->form == RopeForm::kPositions) {
      c->positions = scatter_into(c->in.positions, c->tok1_l, int64_t{-7});
      a.positions = c->positions.data();
      a.positions_stride_batch = c->tok1_l.dims[0].second;
      a.positions_stride_seq = c->tok1_l.dims[1].second;
      const Layout cs = matrix_layout(c->in.max_position, p.rope_dim, pad);
      // exactly max_position rows, the last without its padding: a read past it shows in ASan
      c->cos_sin_cache = scatter_into(c->in.cos_sin_cache, cs, kNaNf);
      a.cos_sin_cache = c->cos_sin_cache.data();
      a.cos_sin_cache_stride_row = cs.dims[0].second;
      a.max_position = c->in.max_position;
    } else {
      c->rope_l = token_layout(p, p.rope_dim, pad);
      c->cos = scatter_into(c->in.cos, c->rope_l, kNaNf);
      c->sin = scatter_into(c->in.sin, c->rope_l, kNaNf);
      a.cos = c->cos.data();
      a.sin = c->sin.data();
      a.cos_stride_batch = c->rope_l.dims[0].second;
      a.cos_stride_seq = c->rope_l.dims[1].second;
    }
  }
  if (c->cache != Cache::kNone) {
    c->cache_l = matrix_layout(c->num_slots, p.cache_width(), pad);
    c->kv_cache.assign(static_cast<size_t>(c->cache_l.span()), kNaNf);
    a.kv_cache = c->kv_cache.data();
    a.kv_cache_stride_slot = c->cache_l.dims[0].second;
    a.num_slots = c->num_slots;
    if (c->cache == Cache::kPaged) {
      c->slot_mapping = scatter_into(c->slots, c->tok1_l, int64_t{-3});
      a.slot_mapping = c->slot_mapping.data();
      a.slot_mapping_stride_batch = c->tok1_l.dims[0].second;
      a.slot_mapping_stride_seq = c->tok1_l.dims[1].second;
    }
  }
  if (second) {
    const Layout w = matrix_layout(p.kv_b_rows(), p.kv_rank, pad);
    c->kv_b_weight = scatter_into(c->in.kv_b_weight, w, kNaNf);
    a.kv_b_weight = c->kv_b_weight.data();
    a.kv_b_weight_stride_row = w.dims[0].second;
    c->k_l = head_layout(p, p.k_width(), pad);
    c->v_l = head_layout(p, p.v_dim, pad);
    c->k.assign(static_cast<size_t>(c->k_l.span()), kNaNf);
    c->v.assign(static_cast<size_t>(c->v_l.span()), kNaNf);
    a.k = c->k.data();
    a.k_stride_batch = c->k_l.dims[0].second;
    a.k_stride_seq = c->k_l.dims[1].second;
    a.k_stride_head = c->k_l.dims[2].second;
    a.v = c->v.data();
    a.v_stride_batch = c->v_l.dims[0].second;
    a.v_stride_seq = c->v_l.dims[1].second;
    a.v_stride_head = c->v_l.dims[2].second;
  }
  if (p.stage == MlaStage::kSecond) {
    if (c->second_from_cache) {  // the cache holds [c | k_pe] at each valid token's slot
      for (int64_t t = 0; t < t_count; ++t) {
        if (!slot_valid(*c, t)) continue;
        float* row = c->kv_cache.data() + c->slots[static_cast<size_t>(t)] * a.kv_cache_stride_slot;
        std::copy(c->in.latent.begin() + t * p.kv_rank, c->in.latent.begin() + (t + 1) * p.kv_rank,
                  row);
        std::copy(c->in.k_pe.begin() + t * p.rope_dim, c->in.k_pe.begin() + (t + 1) * p.rope_dim,
                  row + p.kv_rank);
      }
    } else {
      c->latent_l = token_layout(p, p.kv_rank, pad);
      c->k_pe_l = token_layout(p, p.rope_dim, pad);
      c->latent = scatter_into(c->in.latent, c->latent_l, kNaNf);
      c->k_pe = scatter_into(c->in.k_pe, c->k_pe_l, kNaNf);
      a.latent = c->latent.data();
      a.latent_stride_batch = c->latent_l.dims[0].second;
      a.latent_stride_seq = c->latent_l.dims[1].second;
      a.k_pe = c->k_pe.data();
      a.k_pe_stride_batch = c->k_pe_l.dims[0].second;
      a.k_pe_stride_seq = c->k_pe_l.dims[1].second;
    }
  }
}

Options cpu_options() {
  Options o;
  o.backend = Backend::kCpu;
  return o;
}

// --- bf16 / fp16 calls: the float32 buffers of an MlaCall (values already rounded to the dtype,
// NaN padding) copied into buffers of the dtype with the same layouts, and the outputs back.

// 16-bit copies of an MlaCall's buffers, kept alive for one call.
struct HalfBuffers {
  std::vector<std::vector<unsigned char>> store;
  void* copy(const std::vector<float>& v, DType dtype) {
    store.push_back(to_bytes(v, dtype));
    return store.back().data();
  }
};

void copy_back(const void* h, DType dtype, std::vector<float>* v) {
  const unsigned char* bytes = static_cast<const unsigned char*>(h);
  *v = from_bytes(std::vector<unsigned char>(bytes, bytes + v->size() * element_size(dtype)),
                  dtype);
}

// Runs c in c.p.dtype: float32 as built; bf16 / fp16 on 16-bit copies of every buffer (the RoPE
// tables too when c.p.rope_dtype is the dtype), the outputs copied back into c's float buffers.
Status run_call(MlaCall* c) {
  const DType dt = c->p.dtype;
  if (dt == DType::kFloat32) return run(c->p, c->args, cpu_options());
  HalfBuffers h;
  h.store.reserve(16);
  MlaArgs a = c->args;
  const auto swap = [&](const void* was, const std::vector<float>& v) -> void* {
    return was == nullptr ? nullptr : h.copy(v, dt);
  };
  a.hidden = swap(a.hidden, c->hidden);
  a.kv_a_weight = swap(a.kv_a_weight, c->kv_a_weight);
  a.kv_a_norm_weight = swap(a.kv_a_norm_weight, c->in.kv_a_norm_weight);
  a.q_a_weight = swap(a.q_a_weight, c->q_a_weight);
  a.q_a_norm_weight = swap(a.q_a_norm_weight, c->in.q_a_norm_weight);
  if (c->p.rope_dtype == dt) {
    a.cos_sin_cache = swap(a.cos_sin_cache, c->cos_sin_cache);
    a.cos = swap(a.cos, c->cos);
    a.sin = swap(a.sin, c->sin);
  }
  a.latent = swap(a.latent, c->latent);
  a.k_pe = swap(a.k_pe, c->k_pe);
  a.kv_b_weight = swap(a.kv_b_weight, c->kv_b_weight);
  a.kv_cache = swap(a.kv_cache, c->kv_cache);
  a.q_a = swap(a.q_a, c->q_a);
  a.k = swap(a.k, c->k);
  a.v = swap(a.v, c->v);
  const Status s = run(c->p, a, cpu_options());
  if (a.kv_cache != nullptr) copy_back(a.kv_cache, dt, &c->kv_cache);
  if (a.q_a != nullptr) copy_back(a.q_a, dt, &c->q_a);
  if (a.k != nullptr) copy_back(a.k, dt, &c->k);
  if (a.v != nullptr) copy_back(a.v, dt, &c->v);
  return s;
}

// What each output buffer must hold after a correct call (NaN: untouched).
struct Expected {
  std::vector<double> q_a, kv_cache, k, v;
};

Expected expected_outputs(const MlaCall& c, const MlaOutputs& ref) {
  const MlaProblem& p = c.p;
  const int64_t t_count = p.tokens();
  Expected e;
  if (!c.q_a.empty()) e.q_a = expected_buffer(ref.q_a, c.q_a_l);
  if (!c.kv_cache.empty()) {
    e.kv_cache.assign(c.kv_cache.size(), kNaN);
    for (int64_t t = 0; t < t_count; ++t) {
      if (!slot_valid(c, t)) continue;
      double* row = e.kv_cache.data() + c.slots[static_cast<size_t>(t)] * c.args.kv_cache_stride_slot;
      // stage A writes the row; stage B alone reads it as the test filled it (the same values)
      for (int64_t j = 0; j < p.kv_rank; ++j) row[j] = ref.latent[static_cast<size_t>(t * p.kv_rank + j)];
      for (int64_t j = 0; j < p.rope_dim; ++j) {
        row[p.kv_rank + j] = ref.k_pe[static_cast<size_t>(t * p.rope_dim + j)];
      }
    }
  }
  if (!c.k.empty()) {
    std::vector<double> k = ref.k, v = ref.v;
    if (p.stage == MlaStage::kSecond && c.second_from_cache) {  // skipped tokens: zeros
      const int64_t kt = p.heads * p.k_width(), vt = p.heads * p.v_dim;
      for (int64_t t = 0; t < t_count; ++t) {
        if (slot_valid(c, t)) continue;
        std::fill(k.begin() + t * kt, k.begin() + (t + 1) * kt, 0.0);
        std::fill(v.begin() + t * vt, v.begin() + (t + 1) * vt, 0.0);
      }
    }
    e.k = expected_buffer(k, c.k_l);
    e.v = expected_buffer(v, c.v_l);
  }
  return e;
}

// Every output of c against the float64 reference: float32 within kMlaFloat32Tolerance; bf16 and
// fp16 within 2x the error of transformers' unfused computation in the same dtype
// (emulate_unfused_mla) against the same reference.
void expect_matches(const MlaCall& c, const std::string& what) {
  const Expected e = expected_outputs(c, reference_mla(c.p, c.in, c.form));
  if (c.p.dtype == DType::kFloat32) {
    EXPECT_LE(mla_relative_error(c.q_a, e.q_a), kMlaFloat32Tolerance) << what << ": q_a";
    EXPECT_LE(mla_relative_error(c.kv_cache, e.kv_cache), kMlaFloat32Tolerance) << what << ": cache";
    EXPECT_LE(mla_relative_error(c.k, e.k), kMlaFloat32Tolerance) << what << ": k";
    EXPECT_LE(mla_relative_error(c.v, e.v), kMlaFloat32Tolerance) << what << ": v";
    return;
  }
  const Expected u = expected_outputs(c, emulate_unfused_mla(c.p, c.in, c.form));
  const auto budget = [](const std::vector<double>& unfused, const std::vector<double>& ref) {
    return 2.0 * mla_relative_error(unfused, ref);
  };
  EXPECT_LE(mla_relative_error(c.q_a, e.q_a), budget(u.q_a, e.q_a)) << what << ": q_a";
  EXPECT_LE(mla_relative_error(c.kv_cache, e.kv_cache), budget(u.kv_cache, e.kv_cache))
      << what << ": cache";
  EXPECT_LE(mla_relative_error(c.k, e.k), budget(u.k, e.k)) << what << ": k";
  EXPECT_LE(mla_relative_error(c.v, e.v), budget(u.v, e.v)) << what << ": v";
}

// --- the parameterised comparison with float64

struct MlaCase {
  std::string name;
  MlaProblem problem;
  RopeForm form;
  Cache cache;
  bool second_from_cache;
  int64_t pad;
};

void PrintTo(const MlaCase& c, std::ostream* os) { *os << c.name; }

// The shared edge shapes, plus cpu-mla's own edges: 64-token items, 48-row weight blocks and
// 512-column panels each crossed (T = 65 and 66, R + dr = 49 and 515, H (dn + dv) = 17 and 49,
// D = 520, R = 513), every register tile height (4, then 3, 2, 1 rows left).
std::vector<MlaNamedCase> cpu_edge_cases() {
  std::vector<MlaNamedCase> cases = mla_edge_cases();
  const MlaEdge edges[] = {
      {"cpu-items-d-panel", 1, 65, 520, 0, 33, 16, 1, 8, 9},
      {"cpu-items-r-panel", 2, 33, 16, 7, 513, 2, 1, 24, 25},
  };
  for (const MlaEdge& e : edges) {
    MlaProblem p = mla_edge_problem(e);
    p.dtype = DType::kFloat32;
    cases.push_back({e.name, p});
  }
  return cases;
}

// Every case in float32, bf16 and fp16 (the half types' cos/sin in their dtype on every other
// case, float32 on the rest).
std::vector<MlaCase> comparison_cases() {
  std::vector<MlaCase> cases;
  int index = 0;
  for (const MlaNamedCase& edge : cpu_edge_cases()) {
    for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst, MlaStage::kSecond}) {
      for (RopeStyle style : {RopeStyle::kInterleave, RopeStyle::kGptJ, RopeStyle::kNeox}) {
        for (RopeForm form : {RopeForm::kPositions, RopeForm::kCosSin}) {
          if (stage == MlaStage::kSecond && (style != RopeStyle::kInterleave ||
                                             form != RopeForm::kPositions)) {
            continue;  // stage B has no RoPE: the cache kinds and sources vary instead
          }
          MlaProblem p = edge.problem;
          p.stage = stage;
          p.rope_style = style;
          // every cache kind and both layouts meet every stage across the styles and forms
          const Cache caches[] = {Cache::kNone, Cache::kDense, Cache::kPaged};
          const int n = index++;
          const Cache cache_kinds = caches[n % 3];
          const int64_t pad = (n / 3) % 2 ? 3 : 0;
          if (stage == MlaStage::kSecond) {
            for (bool from_cache : {false, true}) {
              for (Cache cache : {Cache::kDense, Cache::kPaged}) {
                if (!from_cache && cache == Cache::kPaged) continue;
                const std::string name = edge.name + std::string("_second_") +
                                         (from_cache ? "fromcache_" : "fromlatent_") +
                                         (from_cache ? to_string(cache) : "") + "_pad" +
                                         std::to_string(pad);
                cases.push_back({name, p, form, from_cache ? cache : Cache::kNone, from_cache,
                                 pad});
              }
            }
            continue;
          }
          Cache cache = cache_kinds;
          if (stage == MlaStage::kFirst && cache == Cache::kNone && p.q_rank == 0) {
            cache = Cache::kPaged;  // kFirst must write something
          }
          const std::string name = edge.name + std::string("_") + latentkv::to_string(stage) +
                                   "_" + latentkv::to_string(style) + "_" +
                                   testing::to_string(form) + "_" + to_string(cache) + "_pad" +
                                   std::to_string(pad);
          cases.push_back({name, p, form, cache, false, pad});
        }
      }
    }
  }
  const size_t float32_cases = cases.size();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (size_t i = 0; i < float32_cases; ++i) {
      MlaCase half = cases[i];
      half.problem.dtype = dtype;
      if (i % 2) half.problem.rope_dtype = dtype;
      half.name += std::string("_") + latentkv::to_string(dtype) + (i % 2 ? "_ropehalf" : "");
      cases.push_back(half);
    }
  }
  return cases;
}

class MlaCpuVsFloat64 : public ::testing::TestWithParam<MlaCase> {};

TEST_P(MlaCpuVsFloat64, Matches) {
  const MlaCase& tc = GetParam();
  MlaCall c;
  c.p = tc.problem;
  c.form = tc.form;
  c.cache = tc.cache;
  c.second_from_cache = tc.second_from_cache;
  c.pad = tc.pad;
  c.in = random_mla_inputs(c.p, 0x5eed + c.p.tokens());
  build(&c);
  const Status s = run_call(&c);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_matches(c, tc.name);
}

INSTANTIATE_TEST_SUITE_P(Mla, MlaCpuVsFloat64, ::testing::ValuesIn(comparison_cases()),
                         [](const ::testing::TestParamInfo<MlaCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

MlaProblem small_problem(MlaStage stage, int64_t q_rank = 6) {
  MlaProblem p;
  p.batch = 2;
  p.seq = 5;
  p.model_dim = 24;
  p.q_rank = q_rank;
  p.kv_rank = 10;
  p.rope_dim = 8;
  p.heads = 3;
  p.nope_dim = 5;
  p.v_dim = 4;
  p.dtype = DType::kFloat32;
  p.stage = stage;
  return p;
}

// The presets at a few tokens, paged, both RoPE forms.
TEST(MlaCpu, PresetsMatchFloat64) {
  for (const MlaNamedCase& preset : mla_preset_cases()) {
    for (RopeForm form : {RopeForm::kPositions, RopeForm::kCosSin}) {
      // bf16 with the cos/sin form (transformers' bf16 models), float32 with vLLM's
      const DType dtype = form == RopeForm::kCosSin ? DType::kBFloat16 : DType::kFloat32;
      MlaCall c;
      c.p = preset.problem;
      c.p.dtype = dtype;
      c.p.rope_dtype = dtype;
      c.p.seq = preset.name == "deepseek-v2-lite-mla" ? 6 : 2;
      c.form = form;
      c.cache = Cache::kPaged;
      c.in = random_mla_inputs(c.p, 11);
      build(&c);
      const Status s = run_call(&c);
      ASSERT_TRUE(s.ok()) << s.message();
      expect_matches(c, preset.name + " " + to_string(dtype));
    }
  }
}

// Enough work for cpu-mla to spread its items over threads (any machine with 2+ cores): 64-token
// items and 48-row weight blocks, each crossed, and D past one 512-column panel.
TEST(MlaCpu, ThreadedTilesMatchFloat64) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
  MlaCall c;
  c.p = mla_shape(520, 64, 256, 64, 4, 64, 48);
  c.p.dtype = dtype;
  c.p.batch = 3;
  c.p.seq = 43;
  c.cache = Cache::kPaged;
  c.pad = 1;
  c.in = random_mla_inputs(c.p, 17);
  build(&c);
  ASSERT_TRUE(run_call(&c).ok());
  expect_matches(c, std::string("threaded ") + to_string(dtype));
  }
}

// A position outside [0, max_position) gives that token NaN k_pe in K and in the cache row, reads
// nothing outside the exactly sized cos/sin cache (run it under ASan to see), and leaves c and
// the other tokens alone.
TEST(MlaCpu, PositionsPastTheCosSinCacheGiveNanKPe) {
  for (Cache cache : {Cache::kDense, Cache::kPaged}) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    MlaCall c;
    c.p = small_problem(MlaStage::kBoth);
    c.p.dtype = dtype;
    c.cache = cache;
    c.pad = cache == Cache::kPaged ? 1 : 0;
    c.in = random_mla_inputs(c.p, 3);
    c.in.positions[0] = c.in.max_position;
    c.in.positions[3] = -1;
    c.in.positions[4] = std::numeric_limits<int64_t>::max();
    c.in.positions[7] = std::numeric_limits<int64_t>::min();
    c.in.positions[8] = c.in.max_position - 1;  // the last row: in range
    build(&c);
    ASSERT_TRUE(run_call(&c).ok());
    const MlaOutputs ref = reference_mla(c.p, c.in, c.form);
    for (int t : {0, 3, 4, 7}) {
      EXPECT_TRUE(std::isnan(ref.k_pe[static_cast<size_t>(t * c.p.rope_dim)]));
    }
    EXPECT_FALSE(std::isnan(ref.k_pe[static_cast<size_t>(8 * c.p.rope_dim)]));
    expect_matches(c, std::string("positions past the cache, ") + to_string(cache) + " " +
                          to_string(dtype));
  }
  }
}

// positions and cos/sin given as one batch row shared by every batch row (stride_batch 0, as
// transformers' rotary embedding returns [1, S, dr] for shared position ids) give what the same
// rows copied per batch give; a shared sequence stride is still refused.
TEST(MlaCpu, SharedBatchRowOfRopeInputs) {
  for (RopeForm form : {RopeForm::kPositions, RopeForm::kCosSin}) {
    MlaCall c;
    c.p = small_problem(MlaStage::kBoth);
    c.p.batch = 3;
    c.form = form;
    c.pad = 1;
    c.in = random_mla_inputs(c.p, 11);
    const size_t seq = static_cast<size_t>(c.p.seq), dr = static_cast<size_t>(c.p.rope_dim);
    for (size_t b = 1; b < static_cast<size_t>(c.p.batch); ++b) {  // every row equal to row 0
      std::copy_n(c.in.positions.begin(), seq, c.in.positions.begin() + b * seq);
      std::copy_n(c.in.cos.begin(), seq * dr, c.in.cos.begin() + b * seq * dr);
      std::copy_n(c.in.sin.begin(), seq * dr, c.in.sin.begin() + b * seq * dr);
    }
    build(&c);
    if (form == RopeForm::kPositions) {
      c.args.positions_stride_batch = 0;
    } else {
      c.args.cos_stride_batch = 0;
    }
    ASSERT_TRUE(check(c.p, c.args, cpu_options()).ok());
    ASSERT_TRUE(run(c.p, c.args, cpu_options()).ok());
    expect_matches(c, std::string("one shared batch row, ") + to_string(form));
    MlaArgs seq_shared = c.args;
    (form == RopeForm::kPositions ? seq_shared.positions_stride_seq : seq_shared.cos_stride_seq) =
        0;
    const Status refused = check(c.p, seq_shared, cpu_options());
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find(form == RopeForm::kPositions ? "args.positions_stride_seq = 0"
                                                                  : "args.cos_stride_seq = 0"),
              std::string::npos)
        << refused.message();
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// kFirst, then kSecond from the cache it wrote (or from c and k_pe as it made them), give kBoth's
// cache, q_a, K and V bit for bit; tokens with no cache row get K and V rows of zeros.
TEST(MlaCpu, StagesAloneEqualBoth) {
  for (Cache cache : {Cache::kDense, Cache::kPaged}) {
    MlaCall both;
    both.p = small_problem(MlaStage::kBoth);
    both.cache = cache;
    both.in = random_mla_inputs(both.p, 21);
    build(&both);
    ASSERT_TRUE(run(both.p, both.args, cpu_options()).ok());

    MlaCall first;
    first.p = small_problem(MlaStage::kFirst);
    first.cache = cache;
    first.in = both.in;
    build(&first);
    ASSERT_TRUE(run(first.p, first.args, cpu_options()).ok());
    EXPECT_TRUE(same_bits(first.kv_cache, both.kv_cache));
    EXPECT_TRUE(same_bits(first.q_a, both.q_a));

    MlaCall second;
    second.p = small_problem(MlaStage::kSecond);
    second.cache = cache;
    second.second_from_cache = true;
    second.in = both.in;
    build(&second);
    second.kv_cache = first.kv_cache;
    second.args.kv_cache = second.kv_cache.data();
    ASSERT_TRUE(run(second.p, second.args, cpu_options()).ok());
    const int64_t kt = both.p.heads * both.p.k_width(), vt = both.p.heads * both.p.v_dim;
    for (int64_t t = 0; t < both.p.tokens(); ++t) {
      const bool valid = slot_valid(second, t);
      for (int64_t i = 0; i < kt; ++i) {
        const float got = second.k[static_cast<size_t>(t * kt + i)];
        if (valid) {
          ASSERT_EQ(got, both.k[static_cast<size_t>(t * kt + i)]) << "token " << t << " k " << i;
        } else {
          ASSERT_EQ(got, 0.0f) << "token " << t << " has no cache row: K zeros";
        }
      }
      for (int64_t i = 0; i < vt; ++i) {
        const float got = second.v[static_cast<size_t>(t * vt + i)];
        if (valid) {
          ASSERT_EQ(got, both.v[static_cast<size_t>(t * vt + i)]) << "token " << t << " v " << i;
        } else {
          ASSERT_EQ(got, 0.0f) << "token " << t << " has no cache row: V zeros";
        }
      }
    }
    if (cache != Cache::kDense) continue;

    MlaCall from_latent;  // the dense cache's rows as c and k_pe
    from_latent.p = small_problem(MlaStage::kSecond);
    from_latent.in = both.in;
    const MlaProblem& p = both.p;
    for (int64_t t = 0; t < p.tokens(); ++t) {
      const float* row = first.kv_cache.data() + t * first.args.kv_cache_stride_slot;
      std::copy(row, row + p.kv_rank, from_latent.in.latent.begin() + t * p.kv_rank);
      std::copy(row + p.kv_rank, row + p.cache_width(), from_latent.in.k_pe.begin() + t * p.rope_dim);
    }
    build(&from_latent);
    ASSERT_TRUE(run(from_latent.p, from_latent.args, cpu_options()).ok());
    EXPECT_TRUE(same_bits(from_latent.k, both.k));
    EXPECT_TRUE(same_bits(from_latent.v, both.v));
  }
}

// interleave(x) == gptj(x)[d] == neox(x[d]) with d the deinterleave permutation: K's rope columns
// of gptj permuted, and neox's with kv_a_weight's rope rows permuted, equal interleave's exactly.
TEST(MlaCpu, RopeStylesDifferByTheColumnPermutation) {
  for (RopeForm form : {RopeForm::kPositions, RopeForm::kCosSin}) {
    MlaProblem p = small_problem(MlaStage::kBoth);
    p.rope_dim = 16;
    const MlaInputs in = random_mla_inputs(p, 5);
    const std::vector<int64_t> d = deinterleave_permutation(p.rope_dim);
    auto run_style = [&](RopeStyle style, bool permute_rows) {
      auto c = std::make_unique<MlaCall>();
      c->p = p;
      c->p.rope_style = style;
      c->form = form;
      c->in = in;
      if (permute_rows) {
        for (int64_t j = 0; j < p.rope_dim; ++j) {
          std::copy(in.kv_a_weight.begin() + (p.kv_rank + d[static_cast<size_t>(j)]) * p.model_dim,
                    in.kv_a_weight.begin() + (p.kv_rank + d[static_cast<size_t>(j)] + 1) * p.model_dim,
                    c->in.kv_a_weight.begin() + (p.kv_rank + j) * p.model_dim);
        }
      }
      build(c.get());
      EXPECT_TRUE(run(c->p, c->args, cpu_options()).ok());
      return c;
    };
    const auto inter = run_style(RopeStyle::kInterleave, false);
    const auto gptj = run_style(RopeStyle::kGptJ, false);
    const auto neox = run_style(RopeStyle::kNeox, true);
    const int64_t kw = p.k_width();
    bool differs = false;
    for (int64_t row = 0; row < p.tokens() * p.heads; ++row) {
      const float* ki = inter->k.data() + row * kw + p.nope_dim;
      const float* kg = gptj->k.data() + row * kw + p.nope_dim;
      const float* kn = neox->k.data() + row * kw + p.nope_dim;
      for (int64_t j = 0; j < p.rope_dim; ++j) {
        ASSERT_EQ(ki[j], kg[d[static_cast<size_t>(j)]]) << "row " << row << " column " << j;
        ASSERT_EQ(ki[j], kn[j]) << "row " << row << " column " << j;
        differs = differs || ki[j] != kg[j];
      }
    }
    EXPECT_TRUE(differs) << "the styles' outputs should not coincide unpermuted";
  }
}

// No tokens: a no-op that writes nothing, with every check that does not depend on T (the
// projection's zero-size rule): the tokens' tensors may be null, the weights may not, and strides
// keep their signs.
TEST(MlaCpu, ZeroTokensChecksWhatDoesNotDependOnTokens) {
  MlaCall c;
  c.p = small_problem(MlaStage::kBoth);
  c.cache = Cache::kPaged;
  c.in = random_mla_inputs(c.p, 3);
  build(&c);
  const std::vector<float> cache_before = c.kv_cache;
  for (const bool batch_zero : {false, true}) {
    MlaProblem p = c.p;
    (batch_zero ? p.batch : p.seq) = 0;
    MlaArgs a = c.args;
    a.hidden = nullptr;
    a.positions = nullptr;
    a.slot_mapping = nullptr;
    a.q_a = nullptr;
    a.k = nullptr;
    a.v = nullptr;
    Strategy s = Strategy::kAuto;
    ASSERT_TRUE(select_strategy(p, a, cpu_options(), &s).ok());
    EXPECT_EQ(s, Strategy::kCpuMla);
    EXPECT_TRUE(run(p, a, cpu_options()).ok());
    EXPECT_TRUE(run(p, c.args, cpu_options()).ok()) << "non-null empty tensors";

    MlaArgs no_weight = a;
    no_weight.kv_b_weight = nullptr;
    const Status refused = check(p, no_weight, cpu_options());
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("args.kv_b_weight is null"), std::string::npos)
        << refused.message();
    MlaArgs negative = a;
    negative.k_stride_seq = -1;
    EXPECT_NE(check(p, negative, cpu_options()).message().find("args.k_stride_seq = -1"),
              std::string::npos);
    MlaArgs no_slots = a;
    no_slots.num_slots = 0;
    EXPECT_NE(check(p, no_slots, cpu_options()).message().find("args.num_slots = 0"),
              std::string::npos);
  }
  EXPECT_TRUE(std::equal(c.kv_cache.begin(), c.kv_cache.end(), cache_before.begin(),
                         [](float x, float y) { return std::isnan(x) ? std::isnan(y) : x == y; }))
      << "a call with no tokens wrote the cache";

  MlaProblem stage_b = small_problem(MlaStage::kSecond);
  stage_b.seq = 0;
  MlaArgs empty;  // latent, k_pe, k and v empty; kv_b_weight is not
  EXPECT_NE(check(stage_b, empty, cpu_options()).message().find("args.kv_b_weight is null"),
            std::string::npos);
  std::vector<float> kv_b(static_cast<size_t>(stage_b.kv_b_rows() * stage_b.kv_rank), 0.f);
  empty.kv_b_weight = kv_b.data();
  empty.kv_b_weight_stride_row = stage_b.kv_rank;
  EXPECT_TRUE(check(stage_b, empty, cpu_options()).ok());
}

TEST(MlaCpu, StrategyWorkspaceAndCounts) {
  MlaCall c;
  c.p = small_problem(MlaStage::kBoth);
  c.cache = Cache::kPaged;
  c.in = random_mla_inputs(c.p, 1);
  build(&c);
  Strategy s = Strategy::kAuto;
  ASSERT_TRUE(select_strategy(c.p, c.args, cpu_options(), &s).ok());
  EXPECT_EQ(s, Strategy::kCpuMla);
  Options forced = cpu_options();
  forced.strategy = Strategy::kCpuMla;
  EXPECT_TRUE(check(c.p, c.args, forced).ok());
  EXPECT_EQ(workspace_size(c.p, cpu_options()), 0);
  const MlaProblem& p = c.p;
  const double t = static_cast<double>(p.tokens());
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * t * p.model_dim * (p.q_rank + p.kv_rank + p.rope_dim) +
                                  2.0 * t * p.kv_rank * p.heads * (p.nope_dim + p.v_dim));
  EXPECT_GT(p.min_bytes(), 0.0);
  EXPECT_NE(p.to_string().find("rope=interleave"), std::string::npos) << p.to_string();
  EXPECT_STREQ(to_string(RopeStyle::kGptJ), "gptj");
  EXPECT_STREQ(to_string(MlaStage::kSecond), "second");
}

// --- refusals

class MlaRefusals : public ::testing::Test {
 protected:
  // kBoth, q_a, paged cache, positions: every pointer of stage A and B in use.
  MlaCall c;
  void SetUp() override {
    c.p = small_problem(MlaStage::kBoth);
    c.cache = Cache::kPaged;
    c.pad = 2;
    c.in = random_mla_inputs(c.p, 9);
    build(&c);
    ASSERT_TRUE(check(c.p, c.args, cpu_options()).ok()) << check(c.p, c.args, cpu_options()).message();
  }

  // check() and run() refuse with `code` and the same message containing `needle`; no output
  // (all NaN before) changes.
  void expect_refused(const MlaProblem& p, const MlaArgs& a, const std::string& needle,
                      StatusCode code = StatusCode::kInvalidArgument, Options o = cpu_options()) {
    const std::vector<std::vector<float>*> outputs = {&c.q_a, &c.kv_cache, &c.k, &c.v};
    std::vector<std::vector<float>> before;
    for (const auto* b : outputs) before.push_back(*b);
    const Status checked = check(p, a, o);
    const Status ran = run(p, a, o);
    EXPECT_EQ(checked.code(), code) << checked.message();
    EXPECT_EQ(ran.code(), code) << ran.message();
    EXPECT_EQ(checked.message(), ran.message());
    EXPECT_NE(ran.message().find(needle), std::string::npos)
        << "message \"" << ran.message() << "\" does not name " << needle;
    for (size_t i = 0; i < outputs.size(); ++i) {
      ASSERT_EQ(before[i].size(), outputs[i]->size());
      EXPECT_EQ(std::memcmp(before[i].data(), outputs[i]->data(), before[i].size() * sizeof(float)),
                0)
          << "output " << i << " changed by a refused call";
    }
  }
  template <typename F>
  void refuse_problem(F mutate, const std::string& needle,
                      StatusCode code = StatusCode::kInvalidArgument) {
    MlaProblem p = c.p;
    mutate(p);
    expect_refused(p, c.args, needle, code);
  }
  template <typename F>
  void refuse_args(F mutate, const std::string& needle) {
    MlaArgs a = c.args;
    mutate(a);
    expect_refused(c.p, a, needle);
  }
};

TEST_F(MlaRefusals, Dimensions) {
  refuse_problem([](MlaProblem& p) { p.batch = -1; }, "problem.batch = -1");
  refuse_problem([](MlaProblem& p) { p.seq = -2; }, "problem.seq = -2");
  refuse_problem([](MlaProblem& p) { p.model_dim = 0; }, "problem.model_dim = 0");
  refuse_problem([](MlaProblem& p) { p.q_rank = -1; }, "problem.q_rank = -1");
  refuse_problem([](MlaProblem& p) { p.kv_rank = 0; }, "problem.kv_rank = 0");
  refuse_problem([](MlaProblem& p) { p.rope_dim = 0; }, "problem.rope_dim = 0");
  refuse_problem([](MlaProblem& p) { p.rope_dim = 7; }, "problem.rope_dim = 7");
  refuse_problem([](MlaProblem& p) { p.heads = 0; }, "problem.heads = 0");
  refuse_problem([](MlaProblem& p) { p.nope_dim = -3; }, "problem.nope_dim = -3");
  refuse_problem([](MlaProblem& p) { p.v_dim = 0; }, "problem.v_dim = 0");
  refuse_problem([](MlaProblem& p) { p.batch = p.seq = int64_t{1} << 40; }, "problem.batch * problem.seq");
  refuse_problem([](MlaProblem& p) { p.heads = int64_t{1} << 62; }, "problem.heads * (nope_dim + v_dim)");
}

TEST_F(MlaRefusals, TypesEpsStyleStage) {
  refuse_problem([](MlaProblem& p) { p.eps = 0.0f; }, "problem.eps = 0");
  refuse_problem([](MlaProblem& p) { p.eps = -1e-6f; }, "problem.eps = -1e-06");
  refuse_problem([](MlaProblem& p) { p.eps = std::numeric_limits<float>::quiet_NaN(); },
                 "problem.eps = nan");
  refuse_problem([](MlaProblem& p) { p.eps = std::numeric_limits<float>::infinity(); },
                 "problem.eps = inf");
  refuse_problem([](MlaProblem& p) { p.rope_dtype = DType::kBFloat16; },
                 "problem.rope_dtype = bfloat16 must be float32 or problem.dtype = float32");
  refuse_problem([](MlaProblem& p) { p.dtype = static_cast<DType>(9); }, "problem.dtype = 9");
  refuse_problem([](MlaProblem& p) { p.rope_style = static_cast<RopeStyle>(5); },
                 "problem.rope_style = 5");
  refuse_problem([](MlaProblem& p) { p.stage = static_cast<MlaStage>(4); }, "problem.stage = 4");
}

TEST_F(MlaRefusals, RequiredPointers) {
  refuse_args([](MlaArgs& a) { a.hidden = nullptr; }, "args.hidden is null");
  refuse_args([](MlaArgs& a) { a.kv_a_weight = nullptr; }, "args.kv_a_weight is null");
  refuse_args([](MlaArgs& a) { a.kv_a_norm_weight = nullptr; }, "args.kv_a_norm_weight is null");
  refuse_args([](MlaArgs& a) { a.q_a_weight = nullptr; }, "args.q_a_weight is null");
  refuse_args([](MlaArgs& a) { a.q_a_norm_weight = nullptr; }, "args.q_a_norm_weight is null");
  refuse_args([](MlaArgs& a) { a.kv_b_weight = nullptr; }, "args.kv_b_weight is null");
  refuse_args([](MlaArgs& a) { a.k = nullptr; }, "args.k is null");
  refuse_args([](MlaArgs& a) { a.v = nullptr; }, "args.v is null");
}

TEST_F(MlaRefusals, Rope) {
  refuse_args([&](MlaArgs& a) { a.cos = c.in.cos.data(); a.sin = c.in.sin.data(); },
              "give one RoPE form");
  refuse_args([](MlaArgs& a) { a.positions = nullptr; a.cos_sin_cache = nullptr; },
              "args.positions and args.cos are null");
  refuse_args([](MlaArgs& a) { a.positions = nullptr; }, "args.positions is null");
  refuse_args([](MlaArgs& a) { a.cos_sin_cache = nullptr; }, "args.cos_sin_cache is null");
  refuse_args([](MlaArgs& a) { a.max_position = 0; }, "args.max_position = 0");
  refuse_args([](MlaArgs& a) { a.max_position = -4; }, "args.max_position = -4");
  refuse_args([](MlaArgs& a) { a.positions_stride_seq = -1; }, "args.positions_stride_seq = -1");
  refuse_args([&](MlaArgs& a) {
    a.positions = nullptr;
    a.cos_sin_cache = nullptr;
    a.cos = c.in.cos.data();
  }, "args.sin is null");
  refuse_args([&](MlaArgs& a) {
    a.positions = nullptr;
    a.cos_sin_cache = nullptr;
    a.cos = c.in.cos.data();
    a.sin = c.in.sin.data();
    a.cos_stride_seq = c.p.rope_dim - 1;
  }, "args.cos_stride_seq = 7");
}

TEST_F(MlaRefusals, Cache) {
  refuse_args([](MlaArgs& a) { a.num_slots = 0; }, "args.num_slots = 0");
  refuse_args([](MlaArgs& a) { a.slot_mapping = nullptr; a.num_slots = 9; },
              "args.num_slots = 9 is less than the 10 tokens");
  refuse_args([](MlaArgs& a) { a.kv_cache = nullptr; }, "args.slot_mapping is set but args.kv_cache is null");
  refuse_args([](MlaArgs& a) { a.kv_cache_stride_slot = -1; }, "args.kv_cache_stride_slot = -1");
  refuse_args([&](MlaArgs& a) { a.kv_cache_stride_slot = c.p.cache_width() - 1; },
              "args.kv_cache_stride_slot = 17");
  refuse_args([](MlaArgs& a) { a.slot_mapping_stride_batch = 1; }, "args.slot_mapping_stride_batch = 1");
}

TEST_F(MlaRefusals, Layouts) {
  refuse_args([&](MlaArgs& a) { a.hidden_stride_seq = c.p.model_dim - 1; },
              "args.hidden_stride_seq = 23");
  refuse_args([](MlaArgs& a) { a.hidden_stride_batch = std::numeric_limits<int64_t>::max(); },
              "hidden spans more than 2^63");
  refuse_args([](MlaArgs& a) { a.kv_a_weight_stride_row = 3; }, "args.kv_a_weight_stride_row = 3");
  refuse_args([](MlaArgs& a) { a.q_a_weight_stride_row = -8; }, "args.q_a_weight_stride_row = -8");
  refuse_args([](MlaArgs& a) { a.kv_b_weight_stride_row = 9; }, "args.kv_b_weight_stride_row = 9");
  refuse_args([](MlaArgs& a) { a.q_a_stride_seq = 5; }, "args.q_a_stride_seq = 5");
  refuse_args([](MlaArgs& a) { a.k_stride_head = 12; }, "args.k_stride_head = 12");
  refuse_args([](MlaArgs& a) { a.k_stride_seq = 1; }, "args.k_stride_seq = 1");
  refuse_args([](MlaArgs& a) { a.v_stride_head = 3; }, "args.v_stride_head = 3");
  refuse_args([](MlaArgs& a) { a.v_stride_batch = -5; }, "args.v_stride_batch = -5");
}

TEST_F(MlaRefusals, Aliasing) {
  refuse_args([](MlaArgs& a) { a.v = a.k; }, "args.k overlaps args.v");
  // each aliased tensor lies inside the other's buffer, so no third buffer is involved
  refuse_args([&](MlaArgs& a) { a.hidden = c.k.data() + 1; }, "args.k overlaps args.hidden");
  refuse_args([&](MlaArgs& a) { a.q_a = c.kv_cache.data() + 5; },
              "args.q_a overlaps args.kv_cache");
  refuse_args([](MlaArgs& a) { a.q_a = const_cast<void*>(a.cos_sin_cache); },
              "args.q_a overlaps args.cos_sin_cache");
  refuse_args([](MlaArgs& a) { a.kv_cache = const_cast<void*>(a.kv_a_weight); },
              "args.kv_cache overlaps args.kv_a_weight");
  refuse_args([](MlaArgs& a) { a.v = const_cast<void*>(a.kv_b_weight); },
              "args.v overlaps args.kv_b_weight");
  refuse_args([](MlaArgs& a) {
    a.workspace = a.k;
    a.workspace_bytes = 64;
  }, "args.k overlaps args.workspace");
  refuse_args([&](MlaArgs& a) {
    a.workspace = c.in.hidden.data();
    a.workspace_bytes = 0;
  }, "args.workspace_bytes = 0");
}

TEST_F(MlaRefusals, PointersTheStageDoesNotUse) {
  MlaProblem no_q = c.p;
  no_q.q_rank = 0;
  expect_refused(no_q, c.args, "args.q_a_weight = ");
  MlaArgs a = c.args;
  a.q_a_weight = nullptr;
  a.q_a_norm_weight = nullptr;
  expect_refused(no_q, a, "args.q_a = ");

  MlaProblem first = c.p;
  first.stage = MlaStage::kFirst;
  expect_refused(first, c.args, "args.kv_b_weight = ");
  a = c.args;
  a.kv_b_weight = nullptr;
  a.k = nullptr;
  a.v = nullptr;
  EXPECT_TRUE(check(first, a, cpu_options()).ok());
  a.kv_cache = nullptr;
  a.slot_mapping = nullptr;
  a.q_a = nullptr;
  expect_refused(first, a, "problem.stage = first writes nothing");
  a = c.args;
  a.kv_b_weight = nullptr;
  a.k = nullptr;
  a.v = nullptr;
  a.latent = c.in.latent.data();
  expect_refused(first, a, "args.latent = ");

  MlaProblem second = c.p;
  second.stage = MlaStage::kSecond;
  expect_refused(second, c.args, "args.hidden = ");
  MlaArgs b = c.args;
  for (const void** q : {&b.hidden, &b.kv_a_weight, &b.kv_a_norm_weight, &b.q_a_weight,
                         &b.q_a_norm_weight, &b.cos_sin_cache}) {
    *q = nullptr;
  }
  b.positions = nullptr;
  b.q_a = nullptr;
  EXPECT_TRUE(check(second, b, cpu_options()).ok()) << check(second, b, cpu_options()).message();
  MlaArgs b2 = b;
  b2.latent = c.in.latent.data();
  expect_refused(second, b2, "args.k_pe is null");
  b2.k_pe = c.in.k_pe.data();
  expect_refused(second, b2, "args.latent and args.kv_cache are both set");
  b2.kv_cache = nullptr;
  b2.slot_mapping = nullptr;
  EXPECT_TRUE(check(second, b2, cpu_options()).ok()) << check(second, b2, cpu_options()).message();
  b.kv_cache = nullptr;
  b.slot_mapping = nullptr;
  expect_refused(second, b, "args.kv_cache is null");
}

TEST_F(MlaRefusals, Strategies) {
  Options o = cpu_options();
  o.strategy = Strategy::kCudaMlaGemm;
  expect_refused(c.p, c.args, "options.strategy = cuda-mla-gemm does not run on options.backend = cpu",
                 StatusCode::kInvalidArgument, o);
  o.strategy = Strategy::kCpuBlocked;
  expect_refused(c.p, c.args, "options.strategy = cpu-blocked does not compute",
                 StatusCode::kInvalidArgument, o);
  o = cpu_options();
  o.backend = static_cast<Backend>(7);
  expect_refused(c.p, c.args, "options.backend = 7", StatusCode::kInvalidArgument, o);
}

}  // namespace
}  // namespace latentkv::testing
