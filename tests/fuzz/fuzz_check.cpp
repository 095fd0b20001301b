// libFuzzer target over latentkv's front door: raw bytes become a Problem/Args/Options (and an
// MlaProblem/MlaArgs) with dimensions up to 2^62, padded, raw, zero and negative strides, null,
// misaligned and aliasing pointers (fake addresses: check() never dereferences a pointer), forced
// strategies, backends and enum values outside their range; check(), select_strategy() and
// workspace_size() must never crash or hit undefined behaviour (built with ASan and UBSan, see
// scripts/fuzz.sh), and what they accept must be safe to index: every tensor of an accepted call,
// recomputed here in __int128, spans at most INT64_MAX bytes, is non-null unless empty, and no
// output overlaps another tensor; contiguous_args() and contiguous_mla_args() take any problem.
// Refusals must say why (a non-empty message naming the argument) and write no strategy.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "latentkv/latentkv.h"
#include "latentkv/mla.h"

namespace {

using latentkv::Backend;
using latentkv::DType;
using latentkv::Options;
using latentkv::Status;
using latentkv::StatusCode;
using latentkv::Strategy;
using i128 = __int128;

[[noreturn]] void fail(const std::string& what, const std::string& problem) {
  std::fprintf(stderr, "fuzz_check: %s\n  problem: %s\n", what.c_str(), problem.c_str());
  std::abort();
}

// A dimension: mostly small and tile-edge sizes (where the strategies' limits sit), sometimes huge
// (2^k +- a little, up to 2^62), zero, negative or any int64.
int64_t pick_dim(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
    case 1: return in.ConsumeIntegralInRange<int64_t>(1, 40);
    case 2: {
      static constexpr int64_t kEdges[] = {16, 32, 64, 128, 192, 256, 512, 576, 1024, 1536, 7168};
      return kEdges[in.ConsumeIntegralInRange<size_t>(0, std::size(kEdges) - 1)] +
             in.ConsumeIntegralInRange<int64_t>(-1, 1);
    }
    case 3:
    case 4: {
      const int k = in.ConsumeIntegralInRange<int>(10, 62);
      return (int64_t{1} << k) + in.ConsumeIntegralInRange<int64_t>(-2, 2);
    }
    case 5: return in.ConsumeIntegralInRange<int64_t>(-2, 0);
    case 6: return in.ConsumeIntegralInRange<int64_t>(1, int64_t{1} << 31);
    default: return in.ConsumeIntegral<int64_t>();
  }
}

// A stride for a dimension whose inner elements cover `dense` elements: usually dense (or padded),
// sometimes too small, zero, negative, huge or raw. Wrapping arithmetic: `dense` may be garbage.
int64_t pick_stride(FuzzedDataProvider& in, int64_t dense) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
    case 1:
    case 2: return dense;
    case 3:
      return static_cast<int64_t>(static_cast<uint64_t>(dense) +
                                  in.ConsumeIntegralInRange<uint64_t>(1, 64));
    case 4:
      return static_cast<int64_t>(static_cast<uint64_t>(dense) -
                                  in.ConsumeIntegralInRange<uint64_t>(1, 2));
    case 5: return in.ConsumeIntegralInRange<int64_t>(-1, 1);
    case 6: return int64_t{1} << in.ConsumeIntegralInRange<int>(20, 62);
    default: return in.ConsumeIntegral<int64_t>();
  }
}

// x * y, wrapping: the fuzzer's own arithmetic on dimensions must not be what UBSan reports.
int64_t wmul(int64_t x, int64_t y) {
  return static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
}

// Fake addresses below 2^62 (so base + 2^63 bytes never wraps around): usually each tensor its
// own region, 2^40 to 2^57 bytes apart, so that huge tensors can be accepted; sometimes null,
// misaligned, anywhere, or inside a tensor drawn before (aliasing).
struct AddressPicker {
  FuzzedDataProvider& in;
  std::vector<uintptr_t> given;  // at most 21 tensors: 22 << 57 < 2^62

  const void* pick() {
    uintptr_t a = 0;
    const uintptr_t index = given.size() + 1;
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: return nullptr;
      case 1:  // another tensor's address, or inside it
        if (!given.empty()) {
          a = given[in.ConsumeIntegralInRange<size_t>(0, given.size() - 1)] +
              in.ConsumeIntegralInRange<uintptr_t>(0, 4096);
          break;
        }
        [[fallthrough]];
      case 2:  // misaligned
        a = (index << 40) + in.ConsumeIntegralInRange<uintptr_t>(1, 255);
        break;
      case 3:  // anywhere below 2^48
        a = in.ConsumeIntegralInRange<uintptr_t>(1, (uintptr_t{1} << 48) - 1);
        break;
      default:  // its own region, 256-byte aligned
        a = index << in.ConsumeIntegralInRange<int>(40, 57);
    }
    given.push_back(a);
    return reinterpret_cast<const void*>(a);
  }
  void* pick_mut() { return const_cast<void*>(pick()); }
};

// The optional workspace: absent, or a pointer with a plausible or any byte count.
template <typename ArgsT>
void pick_workspace(FuzzedDataProvider& in, AddressPicker& ptr, ArgsT* a) {
  if (!in.ConsumeBool()) return;
  a->workspace = ptr.pick_mut();
  a->workspace_bytes = in.ConsumeBool() ? in.ConsumeIntegral<int64_t>()
                                        : in.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 36);
}

template <typename ProblemT>
std::string describe(const ProblemT& p, const Options& o) {
  return p.to_string() + " backend " + std::to_string(static_cast<int>(o.backend)) +
         " strategy " + std::to_string(static_cast<int>(o.strategy));
}

// x + y, wrapping.
int64_t wadd(int64_t x, int64_t y) {
  return static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
}

DType pick_dtype(FuzzedDataProvider& in) {
  // The three dtypes, mostly; out-of-range values sometimes.
  const int v = in.ConsumeIntegralInRange<int>(0, 8);
  return static_cast<DType>(v <= 6 ? v % 3 : (v == 7 ? 3 : -1));
}

Options pick_options(FuzzedDataProvider& in) {
  Options o;
  const int b = in.ConsumeIntegralInRange<int>(0, 4);
  o.backend = static_cast<Backend>(b <= 2 ? b : (b == 3 ? 7 : -1));
  const int s = in.ConsumeIntegralInRange<int>(0, 9);
  o.strategy = static_cast<Strategy>(s <= 6 ? s : (s == 7 ? 0 : (s == 8 ? 42 : -3)));
  return o;
}

// One tensor as the fuzzer recomputes it: extents and element strides, outermost first.
struct Tensor {
  const char* name;
  const void* base;
  int64_t elem_bytes;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (extent, stride)
  bool output;
};

// [begin, end) in bytes, in __int128; fails the run when an accepted tensor cannot be indexed in
// int64 (a negative extent, a negative stride or a byte offset past INT64_MAX). A tensor with an
// extent of 0 has no elements: an empty span.
void byte_span(const Tensor& t, const std::string& problem, i128* begin, i128* end) {
  *begin = *end = static_cast<i128>(reinterpret_cast<uintptr_t>(t.base));
  for (const auto& [extent, stride] : t.dims) {
    if (extent < 0) fail(std::string("accepted ") + t.name + " with a negative extent", problem);
    if (extent == 0) return;  // no elements: its strides index nothing
  }
  i128 last = 0;
  for (const auto& [extent, stride] : t.dims) {
    if (stride < 0 && extent != 1) {
      fail(std::string("accepted ") + t.name + " with a negative stride", problem);
    }
    // Each term is below 2^126 and the sum is checked after each, so none of this overflows.
    last += static_cast<i128>(extent - 1) * stride;
    if (last > INT64_MAX) break;
  }
  const i128 bytes = (last + 1) * t.elem_bytes;
  if (bytes > INT64_MAX) {
    fail(std::string("accepted ") + t.name + " spanning more than INT64_MAX bytes", problem);
  }
  *end = *begin + bytes;
}

// Every used tensor of an accepted call indexes in int64, and no output overlaps anything else.
// A null pointer is fine for an empty tensor only: a call with a zero dimension (no tokens, an
// empty sum) is checked like any other for everything that does not depend on that dimension.
void check_accepted(const std::vector<Tensor>& tensors, const std::string& problem) {
  std::vector<std::pair<i128, i128>> spans;
  for (const Tensor& t : tensors) {
    i128 b = 0, e = 0;
    byte_span(t, problem, &b, &e);
    if (t.base == nullptr && e > b) fail(std::string("accepted a null ") + t.name, problem);
    spans.emplace_back(b, e);
  }
  const auto empty = [&](size_t i) { return spans[i].first >= spans[i].second; };
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].output || empty(i)) continue;
    for (size_t j = 0; j < tensors.size(); ++j) {
      if (j == i || empty(j)) continue;
      if (spans[i].first < spans[j].second && spans[j].first < spans[i].second) {
        fail(std::string("accepted output ") + tensors[i].name + " overlapping " +
                 tensors[j].name, problem);
      }
    }
  }
}

// A refusal names the field ("args.w_down_stride_row = -1 ...") or at least the tensor.
bool names_something(const std::string& m) {
  for (const char* word : {"problem.", "args.", "options.", "strategy", "backend", "hidden",
                           "w_down", "w_up", "out", "latent", "workspace", "weight", "positions",
                           "cos", "sin", "q_a", "kv_cache", "slot", "k_pe"}) {
    if (m.find(word) != std::string::npos) return true;
  }
  return false;
}

constexpr Strategy kUnwritten = static_cast<Strategy>(-77);

bool is_cpu(Strategy s) { return s == Strategy::kCpuBlocked || s == Strategy::kCpuMla; }

// The properties every entry point's answers share, for either operation. `empty`: a projection
// with a zero dimension, which no strategy computes: select_strategy() answers options.strategy.
template <typename ProblemT, typename ArgsT>
bool check_entry_points(const ProblemT& p, const ArgsT& a, const Options& o, bool empty,
                        const std::string& described, Strategy* chosen) {
  const Status checked = latentkv::check(p, a, o);
  Strategy s = kUnwritten;
  const Status selected = latentkv::select_strategy(p, a, o, &s);
  if (checked.code() != selected.code() || checked.message() != selected.message()) {
    fail("check() says '" + checked.message() + "', select_strategy() '" + selected.message() +
             "'", described);
  }
  if (!checked.ok()) {
    if (s != kUnwritten) fail("a refused select_strategy() wrote the strategy", described);
    if (checked.message().empty() || !names_something(checked.message())) {
      fail("refusal without a reason: '" + checked.message() + "'", described);
    }
    return false;
  }
  if (empty) {
    if (s != o.strategy) fail("an empty call's strategy is not options.strategy", described);
    *chosen = s;
    return true;
  }
  if (s == kUnwritten || s == Strategy::kAuto) fail("accepted without a strategy", described);
  if (o.strategy != Strategy::kAuto && s != o.strategy) {
    fail(std::string("forced ") + latentkv::to_string(o.strategy) + " but selected " +
             latentkv::to_string(s), described);
  }
  if (latentkv::resolve_backend(o.backend) == Backend::kCpu && !is_cpu(s)) {
    fail(std::string("cpu backend selected ") + latentkv::to_string(s), described);
  }
  *chosen = s;
  return true;
}

void fuzz_projection(FuzzedDataProvider& in) {
  latentkv::Problem p;
  p.batch = pick_dim(in);
  p.seq = pick_dim(in);
  p.model_dim = pick_dim(in);
  p.rank = pick_dim(in);
  p.heads = pick_dim(in);
  p.head_dim = pick_dim(in);
  p.dtype = pick_dtype(in);
  const int64_t n = wmul(p.heads, p.head_dim);
  const int64_t t_n = wmul(wmul(p.batch, p.seq), n);

  AddressPicker ptr{in, {}};
  latentkv::Args a;
  a.hidden = ptr.pick();
  a.hidden_stride_seq = pick_stride(in, p.model_dim);
  a.hidden_stride_batch = pick_stride(in, wmul(p.seq, a.hidden_stride_seq));
  a.w_down = ptr.pick();
  a.w_down_stride_row = pick_stride(in, p.rank);
  a.w_up_k = ptr.pick();
  a.w_up_k_stride_row = pick_stride(in, n);
  a.w_up_v = ptr.pick();
  a.w_up_v_stride_row = pick_stride(in, n);
  a.out = ptr.pick_mut();
  a.out_stride_head = pick_stride(in, p.head_dim);
  a.out_stride_seq = pick_stride(in, wmul(p.heads, a.out_stride_head));
  a.out_stride_batch = pick_stride(in, wmul(p.seq, a.out_stride_seq));
  a.out_stride_kv = pick_stride(in, t_n);
  if (in.ConsumeBool()) {
    a.latent = ptr.pick_mut();
    a.latent_stride_seq = pick_stride(in, p.rank);
    a.latent_stride_batch = pick_stride(in, wmul(p.seq, a.latent_stride_seq));
  }
  pick_workspace(in, ptr, &a);
  const Options o = pick_options(in);
  const bool with_latent = in.ConsumeBool();
  const std::string described = describe(p, o);
  // contiguous_args() computes dense strides from any problem, checked or not: no overflow.
  (void)latentkv::contiguous_args(p, a.hidden, a.w_down, a.w_up_k, a.w_up_v, a.out, a.latent);

  const int64_t workspace = latentkv::workspace_size(p, o, with_latent);
  if (workspace < 0) fail("workspace_size() < 0", described);

  const bool empty = p.batch == 0 || p.seq == 0 || p.model_dim == 0 || p.rank == 0 ||
                     p.heads == 0 || p.head_dim == 0;
  Strategy s = Strategy::kAuto;
  if (!check_entry_points(p, a, o, empty, described, &s)) return;
  const int64_t eb = latentkv::element_size(p.dtype);
  std::vector<Tensor> tensors = {
      {"hidden", a.hidden, eb,
       {{p.batch, a.hidden_stride_batch}, {p.seq, a.hidden_stride_seq}, {p.model_dim, 1}}, false},
      {"w_down", a.w_down, eb, {{p.model_dim, a.w_down_stride_row}, {p.rank, 1}}, false},
      {"w_up_k", a.w_up_k, eb, {{p.rank, a.w_up_k_stride_row}, {n, 1}}, false},
      {"w_up_v", a.w_up_v, eb, {{p.rank, a.w_up_v_stride_row}, {n, 1}}, false},
      {"out", a.out, eb,
       {{2, a.out_stride_kv}, {p.batch, a.out_stride_batch}, {p.seq, a.out_stride_seq},
        {p.heads, a.out_stride_head}, {p.head_dim, 1}},
       true},
  };
  if (a.latent != nullptr) {
    tensors.push_back({"latent", a.latent, eb,
                       {{p.batch, a.latent_stride_batch}, {p.seq, a.latent_stride_seq},
                        {p.rank, 1}},
                       true});
  }
  if (a.workspace != nullptr) {
    tensors.push_back({"workspace", a.workspace, 1, {{a.workspace_bytes, 1}}, true});
  }
  check_accepted(tensors, described);
  if (latentkv::resolve_backend(o.backend) == Backend::kCpu && workspace != 0) {
    fail("workspace_size() on the cpu backend is not 0", described);
  }
}

#ifdef LATENTKV_FUZZ_MLA
void fuzz_mla(FuzzedDataProvider& in) {
  latentkv::MlaProblem p;
  p.batch = pick_dim(in);
  p.seq = pick_dim(in);
  p.model_dim = pick_dim(in);
  p.q_rank = in.ConsumeBool() ? 0 : pick_dim(in);
  p.kv_rank = pick_dim(in);
  p.rope_dim = in.ConsumeBool() ? 64 : pick_dim(in);
  p.heads = pick_dim(in);
  p.nope_dim = pick_dim(in);
  p.v_dim = pick_dim(in);
  p.dtype = pick_dtype(in);
  p.rope_dtype = pick_dtype(in);
  const int rs = in.ConsumeIntegralInRange<int>(0, 3);
  p.rope_style = static_cast<latentkv::RopeStyle>(rs < 3 ? rs : 9);
  const int st = in.ConsumeIntegralInRange<int>(0, 3);
  p.stage = static_cast<latentkv::MlaStage>(st < 3 ? st : -2);
  p.eps = in.ConsumeBool() ? 1e-6f : in.ConsumeFloatingPoint<float>();
  const int64_t cache_w = wadd(p.kv_rank, p.rope_dim);
  const int64_t k_w = wadd(p.nope_dim, p.rope_dim);
  const int64_t kv_b_rows = wmul(p.heads, wadd(p.nope_dim, p.v_dim));

  AddressPicker ptr{in, {}};
  latentkv::MlaArgs a;
  // Pointers are drawn for every field; the stage decides which the call uses.
  a.hidden = ptr.pick();
  a.hidden_stride_seq = pick_stride(in, p.model_dim);
  a.hidden_stride_batch = pick_stride(in, wmul(p.seq, a.hidden_stride_seq));
  a.kv_a_weight = ptr.pick();
  a.kv_a_weight_stride_row = pick_stride(in, p.model_dim);
  a.kv_a_norm_weight = ptr.pick();
  if (in.ConsumeBool()) {
    a.q_a_weight = ptr.pick();
    a.q_a_weight_stride_row = pick_stride(in, p.model_dim);
    a.q_a_norm_weight = ptr.pick();
    a.q_a = ptr.pick_mut();
    a.q_a_stride_seq = pick_stride(in, p.q_rank);
    a.q_a_stride_batch = pick_stride(in, wmul(p.seq, a.q_a_stride_seq));
  }
  if (in.ConsumeBool()) {
    a.positions = static_cast<const int64_t*>(ptr.pick());
    a.positions_stride_seq = pick_stride(in, 1);
    a.positions_stride_batch = pick_stride(in, wmul(p.seq, a.positions_stride_seq));
    a.cos_sin_cache = ptr.pick();
    a.cos_sin_cache_stride_row = pick_stride(in, p.rope_dim);
    a.max_position = pick_dim(in);
  } else {
    a.cos = ptr.pick();
    a.sin = ptr.pick();
    a.cos_stride_seq = pick_stride(in, p.rope_dim);
    a.cos_stride_batch = pick_stride(in, wmul(p.seq, a.cos_stride_seq));
  }
  if (in.ConsumeBool()) {
    a.kv_cache = ptr.pick_mut();
    a.kv_cache_stride_slot = pick_stride(in, cache_w);
    a.num_slots = in.ConsumeBool() ? wmul(p.batch, p.seq) : pick_dim(in);
    if (in.ConsumeBool()) {
      a.slot_mapping = static_cast<const int64_t*>(ptr.pick());
      a.slot_mapping_stride_seq = pick_stride(in, 1);
      a.slot_mapping_stride_batch = pick_stride(in, wmul(p.seq, a.slot_mapping_stride_seq));
    }
  }
  if (in.ConsumeBool()) {
    a.latent = ptr.pick();
    a.latent_stride_seq = pick_stride(in, p.kv_rank);
    a.latent_stride_batch = pick_stride(in, wmul(p.seq, a.latent_stride_seq));
    a.k_pe = ptr.pick();
    a.k_pe_stride_seq = pick_stride(in, p.rope_dim);
    a.k_pe_stride_batch = pick_stride(in, wmul(p.seq, a.k_pe_stride_seq));
  }
  a.kv_b_weight = ptr.pick();
  a.kv_b_weight_stride_row = pick_stride(in, p.kv_rank);
  a.k = ptr.pick_mut();
  a.k_stride_head = pick_stride(in, k_w);
  a.k_stride_seq = pick_stride(in, wmul(p.heads, a.k_stride_head));
  a.k_stride_batch = pick_stride(in, wmul(p.seq, a.k_stride_seq));
  a.v = ptr.pick_mut();
  a.v_stride_head = pick_stride(in, p.v_dim);
  a.v_stride_seq = pick_stride(in, wmul(p.heads, a.v_stride_head));
  a.v_stride_batch = pick_stride(in, wmul(p.seq, a.v_stride_seq));
  pick_workspace(in, ptr, &a);
  const Options o = pick_options(in);
  const std::string described = describe(p, o);
  (void)latentkv::contiguous_mla_args(p);  // dense strides from any problem: no overflow
  if (latentkv::workspace_size(p, o) < 0) fail("workspace_size() < 0", described);

  Strategy s = Strategy::kAuto;  // a call with no tokens still names the row it would run on
  if (!check_entry_points(p, a, o, /*empty=*/false, described, &s)) return;
  const int64_t eb = latentkv::element_size(p.dtype);
  const int64_t rb = latentkv::element_size(p.rope_dtype);
  const bool stage_a = p.stage != latentkv::MlaStage::kSecond;
  const bool stage_b = p.stage != latentkv::MlaStage::kFirst;
  const auto bsd = [&](int64_t sb, int64_t ss, int64_t inner) {
    return std::vector<std::pair<int64_t, int64_t>>{{p.batch, sb}, {p.seq, ss}, {inner, 1}};
  };
  std::vector<Tensor> tensors;
  if (stage_a) {
    tensors.push_back({"hidden", a.hidden, eb,
                       bsd(a.hidden_stride_batch, a.hidden_stride_seq, p.model_dim), false});
    tensors.push_back({"kv_a_weight", a.kv_a_weight, eb,
                       {{cache_w, a.kv_a_weight_stride_row}, {p.model_dim, 1}}, false});
    tensors.push_back({"kv_a_norm_weight", a.kv_a_norm_weight, eb, {{p.kv_rank, 1}}, false});
    if (p.q_rank > 0 && a.q_a_weight != nullptr) {
      tensors.push_back({"q_a_weight", a.q_a_weight, eb,
                         {{p.q_rank, a.q_a_weight_stride_row}, {p.model_dim, 1}}, false});
    }
    if (p.q_rank > 0 && a.q_a_norm_weight != nullptr) {
      tensors.push_back({"q_a_norm_weight", a.q_a_norm_weight, eb, {{p.q_rank, 1}}, false});
    }
    if (p.q_rank > 0 && a.q_a != nullptr) {
      tensors.push_back(
          {"q_a", a.q_a, eb, bsd(a.q_a_stride_batch, a.q_a_stride_seq, p.q_rank), true});
    }
    if (a.positions != nullptr) {
      tensors.push_back({"positions", a.positions, 8,
                         {{p.batch, a.positions_stride_batch}, {p.seq, a.positions_stride_seq}},
                         false});
      tensors.push_back({"cos_sin_cache", a.cos_sin_cache, rb,
                         {{a.max_position, a.cos_sin_cache_stride_row}, {p.rope_dim, 1}}, false});
    } else {
      tensors.push_back(
          {"cos", a.cos, rb, bsd(a.cos_stride_batch, a.cos_stride_seq, p.rope_dim), false});
      tensors.push_back(
          {"sin", a.sin, rb, bsd(a.cos_stride_batch, a.cos_stride_seq, p.rope_dim), false});
    }
  }
  const bool reads_cache = p.stage == latentkv::MlaStage::kSecond && a.latent == nullptr;
  if (a.kv_cache != nullptr && (stage_a || reads_cache)) {
    tensors.push_back({"kv_cache", a.kv_cache, eb,
                       {{a.num_slots, a.kv_cache_stride_slot}, {cache_w, 1}}, stage_a});
    if (a.slot_mapping != nullptr) {
      tensors.push_back(
          {"slot_mapping", a.slot_mapping, 8,
           {{p.batch, a.slot_mapping_stride_batch}, {p.seq, a.slot_mapping_stride_seq}}, false});
    }
  }
  if (p.stage == latentkv::MlaStage::kSecond && a.latent != nullptr) {
    tensors.push_back({"latent", a.latent, eb,
                       bsd(a.latent_stride_batch, a.latent_stride_seq, p.kv_rank), false});
    tensors.push_back(
        {"k_pe", a.k_pe, eb, bsd(a.k_pe_stride_batch, a.k_pe_stride_seq, p.rope_dim), false});
  }
  if (stage_b) {
    tensors.push_back({"kv_b_weight", a.kv_b_weight, eb,
                       {{kv_b_rows, a.kv_b_weight_stride_row}, {p.kv_rank, 1}}, false});
    tensors.push_back({"k", a.k, eb,
                       {{p.batch, a.k_stride_batch}, {p.seq, a.k_stride_seq},
                        {p.heads, a.k_stride_head}, {k_w, 1}},
                       true});
    tensors.push_back({"v", a.v, eb,
                       {{p.batch, a.v_stride_batch}, {p.seq, a.v_stride_seq},
                        {p.heads, a.v_stride_head}, {p.v_dim, 1}},
                       true});
  }
  if (a.workspace != nullptr) {
    tensors.push_back({"workspace", a.workspace, 1, {{a.workspace_bytes, 1}}, true});
  }
  check_accepted(tensors, described);
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
#ifdef LATENTKV_FUZZ_MLA
  if (in.ConsumeBool()) {
    fuzz_mla(in);
    return 0;
  }
#endif
  fuzz_projection(in);
  return 0;
}
