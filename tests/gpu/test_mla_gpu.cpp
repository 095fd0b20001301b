// cuda-mla-gemm and cuda-mla-decode (the MLA path's CUDA strategies) through the public API,
// against the float64
// reference of tests/common/mla_reference.h: float32 within kMlaFloat32Tolerance, bf16/fp16 within
// 2x the error of transformers' unfused computation in the same dtype (emulate_unfused_mla) on the
// same inputs. Every stage, the three RoPE styles and both forms, dense and paged caches with
// padding and past-the-end slots, positions past the cos/sin table, padded strides (folding and
// not), edge shapes, the presets, a user stream and CUDA-graph capture. Every device buffer has
// exactly the tensor's span (compute-sanitizer memcheck sees any access past it) and outputs start
// as NaN bytes, so an element never written, or written where it must not be, shows. Select with
// --gtest_filter='*Mla*' (cuda-mla-decode's own cases: '*MlaDecode*'); every test skips on a
// machine with no GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/stream_branches.h"
#include "cuda/tile_sizes.h"
#include "graph_rounds.h"
#include "heuristics.h"
#include "late_writer.h"
#include "mla_reference.h"
#include "testing.h"

namespace latentkv::testing {
namespace {

constexpr uint64_t kSeed = 20261201;

#define SKIP_WITHOUT_CUDA_MLA()                                               \
  do {                                                                        \
    if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Where stage A writes its cache row, or (kSecond) where stage B reads c and k_pe from.
enum class CacheMode {
  kNone,   // kBoth/kFirst: no cache; kSecond: args.latent and args.k_pe
  kDense,  // row t of [num_slots >= T, R + dr]
  kPaged,  // slot_mapping: a shuffled slot per token, one padding (-1) and one past the end
};

const char* to_string(CacheMode mode) {
  switch (mode) {
    case CacheMode::kNone: return "nocache";
    case CacheMode::kDense: return "dense";
    case CacheMode::kPaged: return "paged";
  }
  return "?";
}

struct MlaCase {
  std::string name;
  MlaProblem problem;
  RopeForm form = RopeForm::kPositions;
  CacheMode cache = CacheMode::kPaged;
  int64_t pad_seq = 0;     // extra elements in every row stride (heads, tokens, weight rows)
  int64_t pad_batch = 0;   // extra elements in every batch stride: rows stop folding when B > 1
  int64_t out_pad = 0;     // extra elements in K's and V's head strides only (odd: no pair stores)
  bool q_a = true;         // ask for q_a (Rq > 0 only)
  bool bad_positions = false;    // a position < 0 and one == max_position
  int first_slot = 0;  // kPaged: 0 keeps token 0's shuffled slot, -1 makes it padding, 1 past the end
  bool fused_q_weights = false;  // q_a_weight's rows run straight into kv_a_weight's
  Strategy strategy = Strategy::kCudaMlaGemm;  // forced (kAuto: the table's choice)
  Strategy expect_selected = Strategy::kAuto;  // under kAuto: the strategy it must pick
};

std::string case_name(const MlaCase& c) {
  std::string n = c.name + "_" + mla_problem_id(c.problem) + "_" + to_string(c.problem.dtype) +
                  "_" + to_string(c.problem.stage) + "_" + to_string(c.problem.rope_style) + "_" +
                  to_string(c.form) + "_" + to_string(c.cache);
  if (c.pad_seq || c.pad_batch) {
    n += "_pad" + std::to_string(c.pad_seq) + "x" + std::to_string(c.pad_batch);
  }
  if (c.out_pad) n += "_outpad" + std::to_string(c.out_pad);
  if (c.problem.q_rank > 0 && !c.q_a) n += "_noqa";
  if (c.bad_positions) n += "_badpos";
  if (c.first_slot != 0) n += c.first_slot < 0 ? "_slot0pad" : "_slot0past";
  if (c.fused_q_weights) n += "_fusedq";
  if (c.problem.rope_dtype != DType::kFloat32) n += "_ropedtype";
  if (c.strategy != Strategy::kCudaMlaGemm) n += std::string("_") + to_string(c.strategy);
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

void PrintTo(const MlaCase& c, std::ostream* os) { *os << case_name(c); }

// Owns the call's device buffers, each exactly its tensor's bytes.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : buffers_) cudaFree(p);
  }
  // A device copy of bytes (null for none); ADD_FAILURE on a CUDA error.
  void* upload(const void* bytes, size_t size) {
    if (size == 0) return nullptr;
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << size << ")";
      return nullptr;
    }
    buffers_.push_back(p);
    if (cudaMemcpy(p, bytes, size, cudaMemcpyHostToDevice) != cudaSuccess) {
      ADD_FAILURE() << "cudaMemcpy to the device";
    }
    return p;
  }

 private:
  std::vector<void*> buffers_;
};

// The element offsets, in packed order, of a [T, width] tensor with strides (batch, seq), and of
// a [T, H, width] one with strides (batch, seq, head).
std::vector<int64_t> token_offsets(const MlaProblem& p, int64_t width, int64_t stride_batch,
                                   int64_t stride_seq, int64_t heads = 1,
                                   int64_t stride_head = 0) {
  std::vector<int64_t> offsets;
  offsets.reserve(static_cast<size_t>(p.tokens() * heads * width));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < p.seq; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < width; ++j) {
          offsets.push_back(b * stride_batch + s * stride_seq + h * stride_head + j);
        }
      }
    }
  }
  return offsets;
}

int64_t span_of(const std::vector<int64_t>& offsets) {
  return offsets.empty() ? 0 : *std::max_element(offsets.begin(), offsets.end()) + 1;
}

// A strided tensor: host values (NaN where nothing lives) and its packed-order offsets.
struct Strided {
  std::vector<float> values;
  std::vector<int64_t> offsets;
};

Strided strided(const std::vector<float>& packed, std::vector<int64_t> offsets, float fill) {
  Strided s;
  s.values = scatter(packed, offsets, span_of(offsets), fill);
  s.offsets = std::move(offsets);
  return s;
}

std::vector<int64_t> int_strided(const std::vector<int64_t>& packed,
                                 const std::vector<int64_t>& offsets) {
  std::vector<int64_t> out(static_cast<size_t>(span_of(offsets)), -7);
  for (size_t i = 0; i < offsets.size(); ++i) out[static_cast<size_t>(offsets[i])] = packed[i];
  return out;
}

// What one call produced (decoded to float) and what it was given.
struct MlaRun {
  Status status;
  std::vector<float> q_a, k, v, cache;  // whole buffers, strided
  Strided q_a_layout, k_layout, v_layout;
  std::vector<int64_t> slots;  // [T] packed: each token's cache row, -1 where skipped
  int64_t num_slots = 0, cache_stride = 0;
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Builds the call of case c on inputs `in` (strided, poisoned, exact-size device buffers), runs it
// on `stream` (captured into a CUDA graph and replayed when `graph`; `inside_capture`, if given,
// runs before the capture ends, which is then relaxed so that it may copy and synchronize) and
// reads everything back. ASSERTs inside: the caller checks HasFatalFailure().
void run_case(const MlaCase& c, const MlaInputs& in, Stream stream, bool graph, MlaRun* out,
              const std::function<void()>& inside_capture = nullptr) {
  const MlaProblem& p = c.problem;
  const DType dt = p.dtype, rdt = p.rope_dtype;
  const int64_t ps = c.pad_seq, pb = c.pad_batch, T = p.tokens();
  const bool stage_a = p.stage != MlaStage::kSecond, stage_b = p.stage != MlaStage::kFirst;
  DeviceArena arena;
  MlaArgs a;
  auto tensor = [&](const std::vector<float>& packed, int64_t width, int64_t* sb, int64_t* ss,
                    DType type) {
    *ss = width + ps;
    *sb = p.seq * *ss + pb;
    const Strided s = strided(packed, token_offsets(p, width, *sb, *ss), kNaN);
    const std::vector<unsigned char> bytes = to_bytes(s.values, type);
    return arena.upload(bytes.data(), bytes.size());
  };
  auto matrix = [&](const std::vector<float>& packed, int64_t rows, int64_t cols, int64_t* ld,
                    DType type) {
    *ld = cols + ps;
    MlaProblem rows_only = p;
    rows_only.batch = 1;
    rows_only.seq = rows;
    const Strided s = strided(packed, token_offsets(rows_only, cols, 0, *ld), kNaN);
    const std::vector<unsigned char> bytes = to_bytes(s.values, type);
    return arena.upload(bytes.data(), bytes.size());
  };
  auto vector = [&](const std::vector<float>& v, DType type) {
    const std::vector<unsigned char> bytes = to_bytes(v, type);
    return arena.upload(bytes.data(), bytes.size());
  };
  auto ints = [&](const std::vector<int64_t>& packed, int64_t* sb, int64_t* ss) {
    *ss = 1 + ps;
    *sb = p.seq * *ss + pb;
    const std::vector<int64_t> v = int_strided(packed, token_offsets(p, 1, *sb, *ss));
    return static_cast<const int64_t*>(arena.upload(v.data(), v.size() * sizeof(int64_t)));
  };

  // Slots and positions.
  out->num_slots = c.cache == CacheMode::kPaged ? T + 3 : T + 1;
  std::vector<int64_t> slot_mapping(static_cast<size_t>(T));
  std::iota(slot_mapping.begin(), slot_mapping.end(), 0);
  if (c.cache == CacheMode::kPaged) {
    std::vector<int64_t> all(static_cast<size_t>(out->num_slots));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), std::mt19937_64(kSeed + static_cast<uint64_t>(T)));
    std::copy(all.begin(), all.begin() + T, slot_mapping.begin());
    if (T >= 2) slot_mapping[1] = -1;
    if (T >= 3) slot_mapping[static_cast<size_t>(T - 1)] = out->num_slots + 5;
    if (c.first_slot != 0) slot_mapping[0] = c.first_slot < 0 ? -1 : out->num_slots;
  }
  out->slots = slot_mapping;
  for (int64_t& s : out->slots) {
    if (s >= out->num_slots) s = -1;
  }
  if (c.cache == CacheMode::kNone) out->slots.assign(static_cast<size_t>(T), -1);
  std::vector<int64_t> positions = in.positions;
  if (c.bad_positions) {
    positions[0] = -1;
    if (T >= 2) positions[static_cast<size_t>(T - 1)] = in.max_position;
  }

  if (stage_a) {
    a.hidden = tensor(in.hidden, p.model_dim, &a.hidden_stride_batch, &a.hidden_stride_seq, dt);
    if (c.fused_q_weights && p.q_rank > 0) {
      std::vector<float> both = in.q_a_weight;
      both.insert(both.end(), in.kv_a_weight.begin(), in.kv_a_weight.end());
      int64_t ld = 0;
      const char* base = static_cast<const char*>(
          matrix(both, p.q_rank + p.cache_width(), p.model_dim, &ld, dt));
      a.q_a_weight = base;
      a.kv_a_weight = base + p.q_rank * ld * element_size(dt);
      a.q_a_weight_stride_row = a.kv_a_weight_stride_row = ld;
    } else {
      a.kv_a_weight = matrix(in.kv_a_weight, p.cache_width(), p.model_dim,
                             &a.kv_a_weight_stride_row, dt);
      if (p.q_rank > 0) {
        a.q_a_weight =
            matrix(in.q_a_weight, p.q_rank, p.model_dim, &a.q_a_weight_stride_row, dt);
      }
    }
    a.kv_a_norm_weight = vector(in.kv_a_norm_weight, dt);
    if (p.q_rank > 0) a.q_a_norm_weight = vector(in.q_a_norm_weight, dt);
    if (c.form == RopeForm::kPositions) {
      a.positions = ints(positions, &a.positions_stride_batch, &a.positions_stride_seq);
      a.max_position = in.max_position;
      a.cos_sin_cache = matrix(in.cos_sin_cache, in.max_position, p.rope_dim,
                               &a.cos_sin_cache_stride_row, rdt);
    } else {
      a.cos = tensor(in.cos, p.rope_dim, &a.cos_stride_batch, &a.cos_stride_seq, rdt);
      a.sin = tensor(in.sin, p.rope_dim, &a.cos_stride_batch, &a.cos_stride_seq, rdt);
    }
  }

  // Outputs, NaN-poisoned.
  void* q_a_dev = nullptr;
  if (stage_a && p.q_rank > 0 && c.q_a) {
    a.q_a_stride_seq = p.q_rank + ps;
    a.q_a_stride_batch = p.seq * a.q_a_stride_seq + pb;
    out->q_a_layout.offsets = token_offsets(p, p.q_rank, a.q_a_stride_batch, a.q_a_stride_seq);
    out->q_a_layout.values.assign(static_cast<size_t>(span_of(out->q_a_layout.offsets)), kNaN);
    q_a_dev = vector(out->q_a_layout.values, dt);
    a.q_a = q_a_dev;
  }
  void* cache_dev = nullptr;
  const bool cache_used = c.cache != CacheMode::kNone;
  if (cache_used) {
    a.kv_cache_stride_slot = p.cache_width() + ps;
    a.num_slots = out->num_slots;
    out->cache_stride = a.kv_cache_stride_slot;
    std::vector<float> cache(static_cast<size_t>((out->num_slots - 1) * a.kv_cache_stride_slot +
                                                 p.cache_width()),
                             kNaN);
    if (p.stage == MlaStage::kSecond) {  // the rows stage B gathers: token t's [c | k_pe]
      for (int64_t t = 0; t < T; ++t) {
        const int64_t slot = out->slots[static_cast<size_t>(t)];
        if (slot < 0) continue;
        float* row = cache.data() + slot * a.kv_cache_stride_slot;
        std::copy_n(in.latent.begin() + t * p.kv_rank, p.kv_rank, row);
        std::copy_n(in.k_pe.begin() + t * p.rope_dim, p.rope_dim, row + p.kv_rank);
      }
    }
    cache_dev = vector(cache, dt);
    a.kv_cache = cache_dev;
    if (c.cache == CacheMode::kPaged) {
      a.slot_mapping =
          ints(slot_mapping, &a.slot_mapping_stride_batch, &a.slot_mapping_stride_seq);
    }
  }
  if (p.stage == MlaStage::kSecond && c.cache == CacheMode::kNone) {
    a.latent = tensor(in.latent, p.kv_rank, &a.latent_stride_batch, &a.latent_stride_seq, dt);
    a.k_pe = tensor(in.k_pe, p.rope_dim, &a.k_pe_stride_batch, &a.k_pe_stride_seq, dt);
  }
  void* k_dev = nullptr;
  void* v_dev = nullptr;
  if (stage_b) {
    a.kv_b_weight =
        matrix(in.kv_b_weight, p.kv_b_rows(), p.kv_rank, &a.kv_b_weight_stride_row, dt);
    a.k_stride_head = p.k_width() + ps + c.out_pad;
    a.k_stride_seq = p.heads * a.k_stride_head + ps;
    a.k_stride_batch = p.seq * a.k_stride_seq + pb;
    out->k_layout.offsets =
        token_offsets(p, p.k_width(), a.k_stride_batch, a.k_stride_seq, p.heads, a.k_stride_head);
    out->k_layout.values.assign(static_cast<size_t>(span_of(out->k_layout.offsets)), kNaN);
    k_dev = vector(out->k_layout.values, dt);
    a.k = k_dev;
    a.v_stride_head = p.v_dim + ps + c.out_pad;
    a.v_stride_seq = p.heads * a.v_stride_head + ps;
    a.v_stride_batch = p.seq * a.v_stride_seq + pb;
    out->v_layout.offsets =
        token_offsets(p, p.v_dim, a.v_stride_batch, a.v_stride_seq, p.heads, a.v_stride_head);
    out->v_layout.values.assign(static_cast<size_t>(span_of(out->v_layout.offsets)), kNaN);
    v_dev = vector(out->v_layout.values, dt);
    a.v = v_dev;
  }
  ASSERT_FALSE(::testing::Test::HasFailure()) << "setting up " << case_name(c);

  Options o;
  o.backend = Backend::kCuda;
  o.strategy = c.strategy;
  o.stream = stream;
  const int64_t ws = workspace_size(p, o);  // cuda-mla-decode's stage B alone needs none
  ASSERT_TRUE(ws > 0 || c.strategy == Strategy::kCudaMlaDecode);
  if (ws > 0) {
    std::vector<unsigned char> ws_poison(static_cast<size_t>(ws), 0xFF);
    a.workspace = arena.upload(ws_poison.data(), ws_poison.size());
    a.workspace_bytes = ws;
  }
  const Status checked = check(p, a, o);
  ASSERT_TRUE(checked.ok()) << checked.message();
  if (c.expect_selected != Strategy::kAuto) {
    Strategy selected = Strategy::kAuto;
    ASSERT_TRUE(select_strategy(p, a, o, &selected).ok());
    EXPECT_EQ(to_string(selected), std::string(to_string(c.expect_selected))) << case_name(c);
  }

  if (graph) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, inside_capture ? cudaStreamCaptureModeRelaxed
                                                            : cudaStreamCaptureModeGlobal),
              cudaSuccess);
    out->status = run(p, a, o);
    if (inside_capture) inside_capture();
    ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
    ASSERT_TRUE(out->status.ok()) << out->status.message();
    ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);  // replays write the same
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  } else {
    out->status = run(p, a, o);
    ASSERT_TRUE(out->status.ok()) << out->status.message();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);

  auto download = [&](void* dev, size_t count, std::vector<float>* host) {
    std::vector<unsigned char> bytes(count * static_cast<size_t>(element_size(dt)));
    ASSERT_EQ(cudaMemcpy(bytes.data(), dev, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    *host = from_bytes(bytes, dt);
  };
  if (q_a_dev != nullptr) download(q_a_dev, out->q_a_layout.values.size(), &out->q_a);
  if (cache_dev != nullptr) {
    download(cache_dev,
             static_cast<size_t>((out->num_slots - 1) * out->cache_stride + p.cache_width()),
             &out->cache);
  }
  if (k_dev != nullptr) download(k_dev, out->k_layout.values.size(), &out->k);
  if (v_dev != nullptr) download(v_dev, out->v_layout.values.size(), &out->v);
}

int64_t finite_count(const std::vector<double>& v) {
  return std::count_if(v.begin(), v.end(), [](double x) { return !std::isnan(x); });
}

// got within the dtype's budget of ref: float32 within kMlaFloat32Tolerance, half types within 2x
// the unfused emulation's error (emu) against the same reference.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& emu, DType dtype) {
  const double err = mla_relative_error(got, ref);
  if (dtype == DType::kFloat32) {
    EXPECT_LE(err, kMlaFloat32Tolerance) << what;
    return;
  }
  const double budget = 2.0 * mla_relative_error(emu, ref);
  EXPECT_LE(err, budget) << what << " (2x the unfused " << to_string(dtype) << " error)";
}

// Rows [t] of a [T, H, width] reference zeroed where the token's slot was skipped (stage B from a
// paged cache writes those rows as zeros, mla.h).
void zero_skipped(std::vector<double>* v, const std::vector<int64_t>& slots, int64_t row) {
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) std::fill_n(v->begin() + static_cast<int64_t>(t) * row, row, 0.0);
  }
}

// Token t's cache row [c | k_pe] of a stage-A result, appended to *rows.
void append_cache_row(const MlaProblem& p, const MlaOutputs& o, int64_t t,
                      std::vector<double>* rows) {
  rows->insert(rows->end(), o.latent.begin() + t * p.kv_rank,
               o.latent.begin() + (t + 1) * p.kv_rank);
  rows->insert(rows->end(), o.k_pe.begin() + t * p.rope_dim,
               o.k_pe.begin() + (t + 1) * p.rope_dim);
}

// Runs case c and checks every output against the reference and the unfused emulation.
void check_case(const MlaCase& c, Stream stream = nullptr, bool graph = false,
                const std::function<void()>& inside_capture = nullptr) {
  const MlaProblem& p = c.problem;
  MlaInputs in = random_mla_inputs(p, kSeed ^ std::hash<std::string>{}(case_name(c)));
  MlaRun got;
  run_case(c, in, stream, graph, &got, inside_capture);
  if (::testing::Test::HasFatalFailure()) return;
  if (c.bad_positions) {
    in.positions[0] = -1;
    if (p.tokens() >= 2) in.positions[static_cast<size_t>(p.tokens() - 1)] = in.max_position;
  }
  MlaOutputs ref = reference_mla(p, in, c.form);
  MlaOutputs emu = emulate_unfused_mla(p, in, c.form);
  const DType dt = p.dtype;

  if (!got.q_a.empty()) {
    expect_close("q_a", gather(got.q_a.data(), got.q_a_layout.offsets), ref.q_a, emu.q_a, dt);
    EXPECT_EQ(count_not_nan(got.q_a), p.tokens() * p.q_rank) << "q_a's padding written";
  }
  if (!got.cache.empty() && p.stage != MlaStage::kSecond) {
    // Rows of tokens with a slot, packed [T', R + dr]; every other element still NaN.
    std::vector<float> rows;
    std::vector<double> ref_rows, emu_rows;
    for (int64_t t = 0; t < p.tokens(); ++t) {
      const int64_t slot = got.slots[static_cast<size_t>(t)];
      if (slot < 0) continue;
      const float* row = got.cache.data() + slot * got.cache_stride;
      rows.insert(rows.end(), row, row + p.cache_width());
      append_cache_row(p, ref, t, &ref_rows);
      append_cache_row(p, emu, t, &emu_rows);
    }
    expect_close("cache rows", rows, ref_rows, emu_rows, dt);
    EXPECT_EQ(count_not_nan(got.cache), finite_count(ref_rows))
        << "cache elements written outside the tokens' rows (padding slots, skipped slots, "
        << "row padding)";
  }
  if (p.stage != MlaStage::kFirst) {
    if (p.stage == MlaStage::kSecond && c.cache == CacheMode::kPaged) {
      zero_skipped(&ref.k, got.slots, p.heads * p.k_width());
      zero_skipped(&emu.k, got.slots, p.heads * p.k_width());
      zero_skipped(&ref.v, got.slots, p.heads * p.v_dim);
      zero_skipped(&emu.v, got.slots, p.heads * p.v_dim);
    }
    expect_close("k", gather(got.k.data(), got.k_layout.offsets), ref.k, emu.k, dt);
    expect_close("v", gather(got.v.data(), got.v_layout.offsets), ref.v, emu.v, dt);
    EXPECT_EQ(count_not_nan(got.k), finite_count(ref.k)) << "K's padding written";
    EXPECT_EQ(count_not_nan(got.v), finite_count(ref.v)) << "V's padding written";
  }
}

MlaProblem with(MlaProblem p, DType dtype, MlaStage stage, RopeStyle style) {
  p.dtype = dtype;
  p.stage = stage;
  p.rope_style = style;
  return p;
}

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr RopeStyle kStyles[] = {RopeStyle::kInterleave, RopeStyle::kGptJ, RopeStyle::kNeox};

// Every stage, style and form, every cache mode, on a small shape with q_a, odd pads and B > 1.
std::vector<MlaCase> stage_cases() {
  MlaProblem base = mla_shape(72, 24, 40, 16, 3, 24, 16);
  base.batch = 2;
  base.seq = 5;
  std::vector<MlaCase> cases;
  for (DType dt : kDTypes) {
    for (RopeStyle style : kStyles) {
      for (RopeForm form : {RopeForm::kPositions, RopeForm::kCosSin}) {
        for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst}) {
          for (CacheMode cache : {CacheMode::kNone, CacheMode::kDense, CacheMode::kPaged}) {
            if (stage == MlaStage::kFirst && cache == CacheMode::kNone && base.q_rank == 0) {
              continue;
            }
            MlaCase c{"small", with(base, dt, stage, style), form, cache};
            c.pad_seq = 3;
            cases.push_back(c);
          }
        }
      }
    }
    for (CacheMode cache : {CacheMode::kNone, CacheMode::kDense, CacheMode::kPaged}) {
      MlaCase c{"small", with(base, dt, MlaStage::kSecond, RopeStyle::kInterleave),
                RopeForm::kPositions, cache};
      c.pad_seq = 3;
      cases.push_back(c);
    }
  }
  return cases;
}

// The edge shapes of mla_reference.h in every dtype: kBoth on a paged cache with positions past
// the table, and kSecond gathering from a paged cache.
std::vector<MlaCase> edge_cases() {
  std::vector<MlaCase> cases;
  for (const MlaNamedCase& e : mla_edge_cases()) {
    for (DType dt : kDTypes) {
      MlaCase both{e.name, with(e.problem, dt, MlaStage::kBoth, RopeStyle::kInterleave),
                   RopeForm::kPositions, CacheMode::kPaged};
      both.bad_positions = true;
      cases.push_back(both);
      MlaCase second{e.name, with(e.problem, dt, MlaStage::kSecond, RopeStyle::kInterleave),
                     RopeForm::kPositions, CacheMode::kPaged};
      cases.push_back(second);
    }
  }
  return cases;
}

// Layouts: batch strides that stop the rows folding (B > H loops over heads, H >= B over
// batches), seq-only padding that keeps them folding, q_a's weight rows followed by kv_a's (one
// GEMM), Rq > 0 without a q_a output, the rope dtype equal to a half dtype, S = 1 with B > 1.
std::vector<MlaCase> layout_cases() {
  std::vector<MlaCase> cases;
  for (DType dt : kDTypes) {
    MlaProblem many_batches = mla_shape(40, 16, 24, 8, 2, 8, 12);
    many_batches.batch = 5;
    many_batches.seq = 3;
    MlaProblem many_heads = mla_shape(40, 0, 24, 8, 7, 8, 12);
    many_heads.batch = 2;
    many_heads.seq = 4;
    for (const MlaProblem& shape : {many_batches, many_heads}) {
      for (MlaStage stage : {MlaStage::kBoth, MlaStage::kSecond}) {
        for (CacheMode cache : {CacheMode::kNone, CacheMode::kPaged}) {
          MlaCase c{"unfolded", with(shape, dt, stage, RopeStyle::kNeox), RopeForm::kCosSin,
                    cache};
          c.pad_seq = 1;
          c.pad_batch = 5;
          cases.push_back(c);
        }
      }
    }
    MlaProblem decode = mla_shape(64, 32, 48, 16, 4, 16, 16);
    decode.batch = 6;
    decode.seq = 1;
    MlaCase fused{"fusedq", with(decode, dt, MlaStage::kBoth, RopeStyle::kGptJ),
                  RopeForm::kPositions, CacheMode::kPaged};
    fused.fused_q_weights = true;
    cases.push_back(fused);
    MlaCase no_q_a{"noqa", with(decode, dt, MlaStage::kFirst, RopeStyle::kInterleave),
                   RopeForm::kPositions, CacheMode::kDense};
    no_q_a.q_a = false;
    cases.push_back(no_q_a);
    // Stage A split over slices of D as batches (mla_gemm_stage_a_splits: 3 of 1024 columns),
    // summed by the epilogue: without q_a (Rq = 0, and Rq > 0 with no q_a output), paged and
    // dense cache; with q_a (one GEMM, no slices) and rows that stop folding (no slices).
    MlaProblem sliced = mla_shape(3 * detail::kMlaGemmSplitDepth, 0, 40, 16, 3, 24, 16);
    sliced.batch = 1;
    sliced.seq = 5;
    MlaCase slices{"dslices", with(sliced, dt, MlaStage::kBoth, RopeStyle::kNeox),
                   RopeForm::kPositions, CacheMode::kPaged};
    cases.push_back(slices);
    sliced.q_rank = 24;
    MlaCase slices_no_q_a{"dslices-noqa", with(sliced, dt, MlaStage::kBoth, RopeStyle::kGptJ),
                          RopeForm::kCosSin, CacheMode::kDense};
    slices_no_q_a.q_a = false;
    cases.push_back(slices_no_q_a);
    MlaCase slices_q_a{"dslices-qa", with(sliced, dt, MlaStage::kBoth, RopeStyle::kNeox),
                       RopeForm::kPositions, CacheMode::kDense};
    slices_q_a.fused_q_weights = true;
    cases.push_back(slices_q_a);
    // Two halves of D past kMlaGemmFineSplitMaxTokens (D = 1536, T = 400), and where the halves
    // are deep past kMlaGemmHalfSplitMaxTokens (D = 4096, T = 520).
    MlaProblem halved = mla_shape(1536, 0, 40, 16, 3, 24, 16);
    halved.batch = 2;
    halved.seq = 200;
    cases.push_back(MlaCase{"dhalves", with(halved, dt, MlaStage::kBoth, RopeStyle::kGptJ),
                            RopeForm::kPositions, CacheMode::kPaged});
    MlaProblem deep = mla_shape(detail::kMlaGemmDeepSplitMinDim, 0, 40, 16, 2, 24, 16);
    deep.batch = 1;
    deep.seq = 520;
    cases.push_back(MlaCase{"dhalves-deep", with(deep, dt, MlaStage::kFirst,
                                                 RopeStyle::kInterleave),
                            RopeForm::kCosSin, CacheMode::kDense});
    sliced.batch = 2;
    sliced.seq = 3;
    MlaCase unfolded_slices{"dslices-unfolded", with(sliced, dt, MlaStage::kFirst,
                                                     RopeStyle::kInterleave),
                            RopeForm::kCosSin, CacheMode::kPaged};
    unfolded_slices.pad_batch = 8;
    cases.push_back(unfolded_slices);
    // Rows near the epilogue's shared memory (kMlaEpilogueSharedBytes, R = 4100): two slices
    // of D that would not fit (one plane runs instead), and T = 1100, whose two tokens a block
    // would not fit (one a block, eight warps each).
    MlaProblem wide = mla_shape(2 * detail::kMlaGemmSplitDepth, 0, 4100, 16, 1, 8, 8);
    wide.batch = 1;
    wide.seq = 3;
    cases.push_back(MlaCase{"wide-slices", with(wide, dt, MlaStage::kBoth, RopeStyle::kNeox),
                            RopeForm::kPositions, CacheMode::kPaged});
    wide.model_dim = 64;
    wide.seq = 1100;
    cases.push_back(MlaCase{"wide-tokens", with(wide, dt, MlaStage::kBoth,
                                                RopeStyle::kInterleave),
                            RopeForm::kCosSin, CacheMode::kDense});
    if (dt != DType::kFloat32) {
      MlaCase rope_half{"ropehalf", with(decode, dt, MlaStage::kBoth, RopeStyle::kInterleave),
                        RopeForm::kCosSin, CacheMode::kDense};
      rope_half.problem.rope_dtype = dt;
      cases.push_back(rope_half);
      rope_half.form = RopeForm::kPositions;
      cases.push_back(rope_half);
    }
  }
  return cases;
}

// The presets at T = 1 (decode) and T = 64, bf16, as the models run them.
std::vector<MlaCase> preset_cases_mla() {
  std::vector<MlaCase> cases;
  for (const MlaNamedCase& preset : mla_preset_cases()) {
    for (int64_t tokens : {1, 64}) {
      if (preset.name == "kimi-k2-mla" && tokens != 1) continue;
      MlaProblem p = preset.problem;
      p.seq = tokens;
      MlaCase c{preset.name + "_T" + std::to_string(tokens),
                with(p, DType::kBFloat16, MlaStage::kBoth, RopeStyle::kInterleave),
                RopeForm::kPositions, CacheMode::kPaged};
      cases.push_back(c);
    }
  }
  return cases;
}

// cuda-mla-decode forced (T <= 64) with 16-byte rows (pads of 8 elements): every stage, dtype,
// RoPE style and form, cache mode on a T = 16 shape with q_a, odd H and a D whose last step is
// partial; then T = 1 and 15, Rq = 0, dr != 64 (2, 32), dn != dv, D over several chunks, rows
// that stop folding, positions past the table; the token tiles' edges (a tile, a tile + 1, two,
// three run as four, four - 1, four) at every stage, dtype and cache layout (these small weights
// run in windows of one token tile past 16 tokens); the presets at T = 1, 16, 32 and 64 (V3: 7
// chunks of 4 steps, 6 q_a slices, more kv_b tiles than warps, 2 and 4 token tiles); under kAuto,
// kMlaDecodeMaxTokens (and the token windows' bounds on small weights) pick it, while one token
// more than each and rows of 3-element pads fall back to cuda-mla-gemm.
std::vector<MlaCase> decode_cases() {
  constexpr DType kHalfTypes[] = {DType::kBFloat16, DType::kFloat16};
  std::vector<MlaCase> cases;
  auto decode = [](MlaCase c, int64_t pad_seq, int64_t pad_batch = 0) {
    c.strategy = Strategy::kCudaMlaDecode;
    c.pad_seq = pad_seq;
    c.pad_batch = pad_batch;
    return c;
  };
  MlaProblem base = mla_shape(328, 24, 40, 16, 3, 24, 16);
  base.batch = 2;
  base.seq = 8;
  for (DType dt : kHalfTypes) {
    for (RopeStyle style : kStyles) {
      for (RopeForm form : {RopeForm::kPositions, RopeForm::kCosSin}) {
        for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst}) {
          for (CacheMode cache : {CacheMode::kNone, CacheMode::kDense, CacheMode::kPaged}) {
            cases.push_back(decode({"decode", with(base, dt, stage, style), form, cache}, 8));
          }
        }
      }
    }
    for (CacheMode cache : {CacheMode::kNone, CacheMode::kDense, CacheMode::kPaged}) {
      cases.push_back(decode(
          {"decode", with(base, dt, MlaStage::kSecond, RopeStyle::kInterleave),
           RopeForm::kPositions, cache},
          8));
    }
  }
  const MlaEdge edges[] = {
      {"dec-one-token", 1, 1, 64, 0, 8, 4, 1, 8, 8},
      {"dec-one-token-q", 1, 1, 128, 16, 64, 64, 1, 32, 32},
      {"dec-15-chunks", 3, 5, 1000, 0, 24, 32, 5, 8, 16},
      {"dec-16-rope2", 1, 16, 520, 40, 64, 2, 7, 12, 20},
      {"dec-v3-like", 1, 4, 1536, 1536, 512, 64, 2, 128, 128},
      // Stage B's one-tile ring (more kv_b tiles than 2 blocks x 8 warps per SM): 5040 tiles,
      // past the ring's 4 blocks x 8 warps on up to 157 SMs (warps with a second tile), heads of
      // 252 rows, R = 2 steps of 128 + a partial K-block; then 16 tokens over two sequences at
      // V3's R and head widths (4352 tiles).
      {"dec-ring-tiles", 1, 3, 64, 0, 264, 64, 160, 120, 132},
      {"dec-ring-16", 2, 8, 64, 0, 512, 64, 136, 128, 128},
      // The fused stage A (one cooperative kernel): its widest q_a (kFusedQHeld x 256 rows) over
      // six tokens, one row past it (K1 and the sliced K2 with q_a), and one and four tokens of
      // the first stage alone on 4.7 MB of weights (heuristics.h: fused there, not with stage B
      // behind).
      {"dec-fused-q2048", 2, 3, 256, 2048, 64, 16, 2, 16, 16},
      {"dec-q2056", 1, 2, 256, 2056, 64, 16, 1, 16, 16},
      {"dec-fused-first", 1, 1, 4096, 0, 512, 64, 1, 8, 8},
      {"dec-fused-first-T4", 2, 2, 4096, 0, 512, 64, 1, 8, 8},
  };
  for (const MlaEdge& e : edges) {
    const MlaProblem p = mla_edge_problem(e);
    for (DType dt : kHalfTypes) {
      MlaCase both = decode({e.name, with(p, dt, MlaStage::kBoth, RopeStyle::kInterleave),
                             RopeForm::kPositions, CacheMode::kPaged},
                            0);
      both.bad_positions = true;
      cases.push_back(both);
      cases.push_back(decode({e.name, with(p, dt, MlaStage::kFirst, RopeStyle::kNeox),
                              RopeForm::kCosSin, CacheMode::kDense},
                             8, 8));
      cases.push_back(decode({e.name, with(p, dt, MlaStage::kSecond, RopeStyle::kInterleave),
                              RopeForm::kPositions, CacheMode::kPaged},
                             0));
    }
  }
  // The fused stage A's one-token first stage through a padding slot or a position before the
  // table (NaN k_pe), in the two pair layouts the edges above leave out there.
  for (RopeStyle style : {RopeStyle::kInterleave, RopeStyle::kGptJ}) {
    const MlaProblem p = mla_edge_problem({"", 1, 1, 4096, 0, 512, 64, 1, 8, 8});
    MlaCase first = decode({"dec-fused-first-paged", with(p, DType::kBFloat16, MlaStage::kFirst,
                                                          style),
                            RopeForm::kPositions, CacheMode::kPaged},
                           0);
    first.bad_positions = style == RopeStyle::kGptJ;
    cases.push_back(first);
  }
  constexpr int64_t kTile = detail::tiles::kMlaDecodeTokenTile;
  constexpr int64_t kMaxTokens = kTile * detail::tiles::kMlaDecodeMaxTokenTiles;
  MlaProblem tiled = mla_shape(328, 24, 40, 16, 3, 24, 16);
  for (int64_t tokens : {kTile, kTile + 1, 2 * kTile, 3 * kTile, kMaxTokens - 1, kMaxTokens}) {
    tiled.batch = tokens % 3 == 0 ? 3 : 1;  // 48 and 63 over three sequences
    tiled.seq = tokens / tiled.batch;
    for (DType dt : kHalfTypes) {
      for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst, MlaStage::kSecond}) {
        for (CacheMode cache : {CacheMode::kDense, CacheMode::kPaged}) {
          cases.push_back(decode({"dec-tiles-T" + std::to_string(tokens),
                                  with(tiled, dt, stage, RopeStyle::kInterleave),
                                  RopeForm::kPositions, cache},
                                 8));
        }
      }
    }
  }
  // K and V rows at odd head strides: stage B's scalar stores (pair_stores off) in the one-tile
  // kernels over windows (T = 17), the two-tile windows (T = 64), the ring and the fold.
  for (int64_t tokens : {kTile + 1, kMaxTokens}) {
    tiled.batch = 1;
    tiled.seq = tokens;
    MlaCase c = decode({"dec-outpad-T" + std::to_string(tokens),
                        with(tiled, DType::kBFloat16, MlaStage::kBoth, RopeStyle::kInterleave),
                        RopeForm::kPositions, CacheMode::kPaged},
                       8);
    c.out_pad = 1;
    cases.push_back(c);
  }
  // One token through both stages without q_a: stage B's blocks fold K2's sums, norm and RoPE
  // in (mla_decode_fold_epilogue). Every dtype, RoPE style, form and table dtype, cache mode and
  // token 0's slot as padding and past the end; dr = 2 and 128; D over 16 chunks (two of the
  // fold's batches); R + dr at the fold's 768 rows and 8 past them (K2 again); the ring (5040
  // kv_b tiles), which does not fold (the whole-row K2 runs before it).
  MlaProblem one = mla_shape(520, 0, 64, 16, 3, 24, 16);
  for (DType dt : kHalfTypes) {
    for (RopeStyle style : kStyles) {
      for (RopeForm form : {RopeForm::kPositions, RopeForm::kCosSin}) {
        for (CacheMode cache : {CacheMode::kNone, CacheMode::kDense, CacheMode::kPaged}) {
          MlaCase c = decode({"fold", with(one, dt, MlaStage::kBoth, style), form, cache}, 8);
          if (form == RopeForm::kCosSin && cache == CacheMode::kDense) {
            c.problem.rope_dtype = dt;
          }
          cases.push_back(c);
        }
      }
    }
    for (int first_slot : {-1, 1}) {
      MlaCase c = decode({"fold", with(one, dt, MlaStage::kBoth, RopeStyle::kInterleave),
                          RopeForm::kPositions, CacheMode::kPaged},
                         0);
      c.first_slot = first_slot;
      cases.push_back(c);
    }
  }
  // Past one token (or the first stage alone) without q_a, K2 runs as one block per token over
  // the whole row where its partial loads take at most four round trips of 8 chunks
  // (mla_decode_whole_rows): T = 2 and 17 (two windows) at both stages; on 132 SMs D = 2048 at 8
  // chunks (one trip), 2304 at 9 (two), 8192 at 32 (four) and 8448 at 33 (the sliced K2 again).
  for (DType dt : kHalfTypes) {
    for (int64_t tokens : {2, 17}) {
      for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst}) {
        MlaProblem p = one;
        p.seq = tokens;
        cases.push_back(decode({"rows", with(p, dt, stage, RopeStyle::kGptJ), RopeForm::kCosSin,
                                CacheMode::kPaged},
                               8));
      }
    }
  }
  for (int64_t d : {2048, 2304, 8192, 8448}) {
    MlaProblem p = mla_shape(d, 0, 64, 16, 3, 24, 16);
    p.seq = 4;
    cases.push_back(decode({"rows-chunks", with(p, DType::kBFloat16, MlaStage::kFirst,
                                                RopeStyle::kInterleave),
                            RopeForm::kPositions, CacheMode::kPaged},
                           0));
  }
  // The same K2 over V3's whole [c | k_pe] row (576 wide) at D = 7168 (28 chunks on 132 SMs; 16
  // tokens: K1 and K2, not the fused stage A), both half types and stages.
  for (DType dt : kHalfTypes) {
    for (MlaStage stage : {MlaStage::kFirst, MlaStage::kBoth}) {
      MlaProblem p = mla_shape(7168, 0, 512, 64, 2, 16, 16);
      p.seq = 16;
      cases.push_back(decode({"rows-wide", with(p, dt, stage, RopeStyle::kInterleave),
                              RopeForm::kPositions, CacheMode::kPaged},
                             0));
    }
  }
  // K2's slices (rows past one block's 768, or q_a) as one cluster per token: a short last c
  // slice (R = 968: four c slices, the last 200 rows), with q_a 9 slices (1536 + 512) and 16
  // (3328 + 512, the most one cluster takes), then past 16 the arrival counters (3584 + 512: 17);
  // two tokens each, so that a token's clusters and counters stay apart.
  const MlaEdge slice_edges[] = {
      {"slices-short-c", 1, 2, 2304, 0, 968, 64, 2, 16, 16},
      {"slices-q-cluster-9", 1, 2, 2304, 1536, 512, 64, 2, 16, 16},
      {"slices-q-cluster-16", 2, 1, 2304, 3328, 512, 32, 2, 16, 16},
      {"slices-q-counter-17", 1, 2, 2304, 3584, 512, 64, 2, 16, 16},
  };
  for (const MlaEdge& e : slice_edges) {
    for (MlaStage stage : {MlaStage::kFirst, MlaStage::kBoth}) {
      cases.push_back(decode({e.name, with(mla_edge_problem(e), DType::kBFloat16, stage,
                                           RopeStyle::kInterleave),
                              RopeForm::kPositions, CacheMode::kPaged},
                             0));
    }
  }
  // The fold's smallest edge and the ring's also run with scalar stores.
  const MlaEdge fold = {"fold-rope2", 1, 1, 264, 0, 40, 2, 2, 8, 8};
  const MlaEdge ring = {"fold-ring", 1, 1, 1280, 0, 264, 64, 160, 120, 132};
  const MlaEdge fold_edges[] = {
      fold,
      {"fold-rope128", 1, 1, 264, 0, 96, 128, 3, 16, 24},
      {"fold-16-chunks", 1, 1, 4096, 0, 64, 16, 2, 16, 16},
      {"fold-768-rows", 1, 1, 256, 0, 704, 64, 2, 16, 16},
      {"fold-past-768-rows", 1, 1, 256, 0, 712, 64, 2, 16, 16},
      ring,
  };
  for (const MlaEdge& e : {fold, ring}) {
    MlaCase c = decode({e.name, with(mla_edge_problem(e), DType::kFloat16, MlaStage::kBoth,
                                     RopeStyle::kNeox),
                        RopeForm::kPositions, CacheMode::kPaged},
                       0);
    c.out_pad = 1;  // scalar stores
    cases.push_back(c);
  }
  for (const MlaEdge& e : fold_edges) {
    const MlaProblem p = mla_edge_problem(e);
    for (DType dt : kHalfTypes) {
      MlaCase c = decode({e.name, with(p, dt, MlaStage::kBoth, RopeStyle::kNeox),
                          RopeForm::kPositions, CacheMode::kPaged},
                         0);
      c.bad_positions = dt == DType::kFloat16;
      cases.push_back(c);
    }
  }
  for (const MlaNamedCase& preset : mla_preset_cases()) {
    for (int64_t tokens : {int64_t{1}, kTile, 2 * kTile, kMaxTokens}) {
      MlaProblem p = preset.problem;
      p.seq = tokens;
      for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst}) {
        if (tokens > kTile && stage != MlaStage::kBoth) continue;
        cases.push_back(decode({preset.name + "_T" + std::to_string(tokens),
                                with(p, DType::kBFloat16, stage, RopeStyle::kInterleave),
                                RopeForm::kPositions, CacheMode::kPaged},
                               0));
      }
    }
  }
  MlaCase picked = decode({"auto", with(base, DType::kBFloat16, MlaStage::kBoth,
                                        RopeStyle::kInterleave),
                           RopeForm::kPositions, CacheMode::kPaged},
                          8);
  picked.strategy = Strategy::kAuto;
  picked.expect_selected = Strategy::kCudaMlaDecode;
  cases.push_back(picked);
  picked.name = "auto-max";
  picked.problem.batch = 1;
  picked.problem.seq = detail::kMlaDecodeMaxTokens;
  cases.push_back(picked);
  MlaCase windows = picked;  // these weights are far under kMlaDecodeSmallWeightBytes
  windows.name = "auto-windows";
  windows.problem.seq = detail::kMlaDecodeWindowsMaxTokens;
  cases.push_back(windows);
  MlaCase first_windows = windows;
  first_windows.name = "auto-first-windows";
  first_windows.problem.seq = detail::kMlaDecodeWindowsMaxTokens;  // weights under 4 MB
  first_windows.problem.stage = MlaStage::kFirst;
  cases.push_back(first_windows);
  MlaCase first_past = first_windows;
  first_past.name = "auto-first-past";
  first_past.problem.seq = detail::kMlaDecodeWindowsMaxTokens + 1;
  first_past.expect_selected = Strategy::kCudaMlaGemm;
  cases.push_back(first_past);
  MlaCase past_tiles = picked;  // what the kernels cannot take, whatever the heuristic says
  past_tiles.name = "auto-past-tiles";
  past_tiles.problem.seq = kMaxTokens + 1;
  past_tiles.expect_selected = Strategy::kCudaMlaGemm;
  cases.push_back(past_tiles);
  MlaCase unaligned = picked;
  unaligned.pad_seq = 3;
  unaligned.expect_selected = Strategy::kCudaMlaGemm;
  cases.push_back(unaligned);
  return cases;
}

// One test per case; the lists are instantiated apart (Stages/, Edges/, Layouts/, Presets/) so
// a filter can pick a group.
class MlaGpuCase : public ::testing::TestWithParam<MlaCase> {};
TEST_P(MlaGpuCase, MatchesReference) {
  SKIP_WITHOUT_CUDA_MLA();
  check_case(GetParam());
}
std::string param_name(const ::testing::TestParamInfo<MlaCase>& info) {
  return case_name(info.param);
}
INSTANTIATE_TEST_SUITE_P(Stages, MlaGpuCase, ::testing::ValuesIn(stage_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Edges, MlaGpuCase, ::testing::ValuesIn(edge_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Layouts, MlaGpuCase, ::testing::ValuesIn(layout_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Presets, MlaGpuCase, ::testing::ValuesIn(preset_cases_mla()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(MlaDecode, MlaGpuCase, ::testing::ValuesIn(decode_cases()), param_name);

MlaCase stream_case(DType dt) {
  MlaProblem p = mla_shape(64, 16, 32, 16, 3, 16, 8);
  p.batch = 2;
  p.seq = 3;
  return {"stream", with(p, dt, MlaStage::kBoth, RopeStyle::kInterleave), RopeForm::kPositions,
          CacheMode::kPaged};
}

TEST(MlaGpu, RunsOnAUserStream) {
  SKIP_WITHOUT_CUDA_MLA();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (DType dt : kDTypes) check_case(stream_case(dt), stream);
  cudaStreamDestroy(stream);
  // The highest priority (stage B's branch takes the caller's) and the per-thread default stream.
  int lowest = 0, highest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&lowest, &highest), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, highest), cudaSuccess);
  check_case(stream_case(DType::kBFloat16), stream);
  cudaStreamDestroy(stream);
  check_case(stream_case(DType::kFloat16), cudaStreamPerThread);
}

// Captured into a CUDA graph (global capture mode: no allocation or synchronization inside run())
// and replayed twice. The first call of a fresh plan shape happens inside the capture.
TEST(MlaGpu, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA_MLA();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (DType dt : kDTypes) {
    for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst, MlaStage::kSecond}) {
      for (Strategy strategy : {Strategy::kCudaMlaGemm, Strategy::kCudaMlaDecode}) {
        if (strategy == Strategy::kCudaMlaDecode && dt == DType::kFloat32) continue;
        MlaCase c = stream_case(dt);
        c.name = "graph";
        c.problem.stage = stage;
        c.problem.seq = 7;  // a shape no other test plans first
        c.strategy = strategy;
        check_case(c, stream, /*graph=*/true);
      }
    }
  }
  cudaStreamDestroy(stream);
}

// The chained-call tests' layer: the first stage alone, bf16, D = 256, R = 64, dr = 16, H = 2, on
// T tokens (B = 1).
MlaProblem small_first_stage(int64_t tokens) {
  MlaProblem p = with(mla_shape(256, 0, 64, 16, 2, 16, 16), DType::kBFloat16, MlaStage::kFirst,
                      RopeStyle::kInterleave);
  p.seq = tokens;
  return p;
}

// values as dtype in a fresh device buffer of arena.
void* upload_values(DeviceArena& arena, const std::vector<float>& values, DType dtype) {
  const std::vector<unsigned char> bytes = to_bytes(values, dtype);
  return arena.upload(bytes.data(), bytes.size());
}

// `bytes` of 0xFF (NaN in every dtype) in a fresh device buffer of arena.
void* upload_poison(DeviceArena& arena, size_t bytes) {
  const std::vector<unsigned char> poison(bytes, 0xFF);
  return arena.upload(poison.data(), bytes);
}

// cuda-mla-decode forced on `stream`.
Options decode_options(cudaStream_t stream) {
  Options o;
  o.backend = Backend::kCuda;
  o.strategy = Strategy::kCudaMlaDecode;
  o.stream = stream;
  return o;
}

// Two first-stage calls back to back on one stream with no synchronization between them, sharing
// one workspace: the second call's hidden states are the first's dense cache rows [T, R + dr]
// (its D = R + dr). A kernel of the second call that touched memory before the first call's
// kernels had finished would read the NaN poison the rows start as (or clobber partials and
// counters the first call still reads). cuda-mla-decode at T = 1, 4 and 16 (K1, a programmatic
// dependent of the kernel before it, then the row epilogue on these small weights), eagerly and
// as one captured graph replayed twice; the second call is checked against the float64 reference
// on the first's rows as read back.
TEST(MlaGpu, ACallReadsTheCacheRowsOfTheCallBefore) {
  SKIP_WITHOUT_CUDA_MLA();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (int64_t tokens : {1, 4, 16}) {
    const MlaProblem first = small_first_stage(tokens);
    MlaProblem second = first;
    second.model_dim = first.cache_width();
    SCOPED_TRACE(first.to_string());
    const MlaInputs in_first = random_mla_inputs(first, kSeed + static_cast<uint64_t>(tokens));
    MlaInputs in_second = random_mla_inputs(second, kSeed + 100 + static_cast<uint64_t>(tokens));
    const Options o = decode_options(stream);
    DeviceArena arena;
    const auto upload = [&](const std::vector<float>& values, DType dtype) {
      return upload_values(arena, values, dtype);
    };
    const size_t cache_bytes =
        static_cast<size_t>(tokens * first.cache_width() * element_size(first.dtype));
    void* cache_first = upload_poison(arena, cache_bytes);
    void* cache_second = upload_poison(arena, cache_bytes);
    const int64_t ws = std::max(workspace_size(first, o), workspace_size(second, o));
    const std::vector<unsigned char> ws_bytes(static_cast<size_t>(ws), 0xFF);
    void* workspace = arena.upload(ws_bytes.data(), ws_bytes.size());
    const auto args_of = [&](const MlaProblem& p, const MlaInputs& in, void* cache) {
      MlaArgs a = contiguous_mla_args(p);
      a.hidden = upload(in.hidden, p.dtype);
      a.kv_a_weight = upload(in.kv_a_weight, p.dtype);
      a.kv_a_norm_weight = upload(in.kv_a_norm_weight, p.dtype);
      a.positions = static_cast<const int64_t*>(
          arena.upload(in.positions.data(), in.positions.size() * sizeof(int64_t)));
      a.max_position = in.max_position;
      a.cos_sin_cache = upload(in.cos_sin_cache, p.rope_dtype);
      a.kv_cache = cache;
      a.num_slots = p.tokens();
      a.workspace = workspace;
      a.workspace_bytes = ws;
      return a;
    };
    const MlaArgs args_first = args_of(first, in_first, cache_first);
    MlaArgs args_second = args_of(second, in_second, cache_second);
    args_second.hidden = cache_first;
    args_second.hidden_stride_seq = args_first.kv_cache_stride_slot;
    args_second.hidden_stride_batch = tokens * args_first.kv_cache_stride_slot;
    ASSERT_FALSE(HasFailure()) << "setting up";
    const auto enqueue = [&]() -> Status {
      for (void* cache : {cache_first, cache_second}) {
        if (cudaMemsetAsync(cache, 0xFF, cache_bytes, stream) != cudaSuccess) {
          return {StatusCode::kCudaError, "cudaMemsetAsync (the poison)"};
        }
      }
      if (Status s = run(first, args_first, o); !s.ok()) return s;
      return run(second, args_second, o);
    };
    const MlaOutputs ref_first = reference_mla(first, in_first, RopeForm::kPositions);
    const MlaOutputs emu_first = emulate_unfused_mla(first, in_first, RopeForm::kPositions);
    // A dense [T, R + dr] cache's rows of a stage-A result.
    const auto rows_of = [&](const MlaOutputs& o_) {
      std::vector<double> rows;
      for (int64_t t = 0; t < tokens; ++t) append_cache_row(first, o_, t, &rows);
      return rows;
    };
    int programmatic = 0;
    eager_then_graph_replays(stream, enqueue, [&](const std::string&) {
      std::vector<unsigned char> bytes(cache_bytes);
      ASSERT_EQ(cudaMemcpy(bytes.data(), cache_first, cache_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      const std::vector<float> rows_first = from_bytes(bytes, first.dtype);
      expect_close("the first call's cache rows", rows_first, rows_of(ref_first),
                   rows_of(emu_first), first.dtype);
      in_second.hidden = rows_first;
      ASSERT_EQ(cudaMemcpy(bytes.data(), cache_second, cache_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      expect_close("the second call's cache rows", from_bytes(bytes, second.dtype),
                   rows_of(reference_mla(second, in_second, RopeForm::kPositions)),
                   rows_of(emulate_unfused_mla(second, in_second, RopeForm::kPositions)),
                   second.dtype);
    }, &programmatic);
    if (HasFatalFailure()) break;
    if (late_writer_available()) {  // sm_90: each call's K2 after its K1, and on these small
                                    // weights the second call's K1 after the first's K2
      EXPECT_GE(programmatic, 3) << "the calls' kernels were not programmatic dependents";
    }
  }
  cudaStreamDestroy(stream);
}

// A first-stage call whose inputs are written by late_copy (late_writer.h): it lets a programmatic
// dependent launch at once and writes them ~50 us later, so any kernel of the call that reads one
// before the kernel before the call has finished reads the poison (hidden, kv_a's weight: NaN;
// positions: -1, outside the table, so NaN k_pe). On these small weights K1 is a programmatic
// dependent of late_copy (mla_decode_stage_a_programmatic) and must wait for it before any read
// (at 64 tokens its L2 prefetch of the weight before the wait, mla_decode_stage_a_prefetch_l2,
// brings nothing into the SM); K2 (and K3's fold) read gamma, the slot, the position and its
// cos/sin before their waits.
TEST(MlaGpu, NoKernelOfACallReadsBeforeTheKernelBeforeItEnds) {
  SKIP_WITHOUT_CUDA_MLA();
  if (!late_writer_available()) GTEST_SKIP() << "no programmatic launch below sm_90";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (int64_t tokens : {1, 4, 16, 64}) {
    for (const char* late_input : {"hidden", "positions", "kv_a_weight"}) {
      const MlaProblem p = small_first_stage(tokens);
      SCOPED_TRACE(p.to_string() + " (" + late_input + " late)");
      const MlaInputs in = random_mla_inputs(p, kSeed + static_cast<uint64_t>(tokens));
      const Options o = decode_options(stream);
      DeviceArena arena;
      const auto upload = [&](const std::vector<float>& values, DType dtype) {
        return upload_values(arena, values, dtype);
      };
      const size_t cache_bytes =
          static_cast<size_t>(tokens * p.cache_width() * element_size(p.dtype));
      void* cache = upload_poison(arena, cache_bytes);
      const int64_t ws = workspace_size(p, o);
      const std::vector<unsigned char> ws_bytes(static_cast<size_t>(ws), 0xFF);
      MlaArgs a = contiguous_mla_args(p);
      void* hidden = upload(in.hidden, p.dtype);
      void* hidden_source = upload(in.hidden, p.dtype);
      const size_t hidden_bytes = in.hidden.size() * static_cast<size_t>(element_size(p.dtype));
      const size_t positions_bytes = in.positions.size() * sizeof(int64_t);
      void* positions = arena.upload(in.positions.data(), positions_bytes);
      void* positions_source = arena.upload(in.positions.data(), positions_bytes);
      a.hidden = hidden;
      void* weight = upload(in.kv_a_weight, p.dtype);
      void* weight_source = upload(in.kv_a_weight, p.dtype);
      const size_t weight_bytes =
          in.kv_a_weight.size() * static_cast<size_t>(element_size(p.dtype));
      a.kv_a_weight = weight;
      a.kv_a_norm_weight = upload(in.kv_a_norm_weight, p.dtype);
      a.positions = static_cast<const int64_t*>(positions);
      a.max_position = in.max_position;
      a.cos_sin_cache = upload(in.cos_sin_cache, p.rope_dtype);
      a.kv_cache = cache;
      a.num_slots = p.tokens();
      a.workspace = arena.upload(ws_bytes.data(), ws_bytes.size());
      a.workspace_bytes = ws;
      ASSERT_FALSE(HasFailure()) << "setting up";
      struct LateBuffer {
        void* target;        // what the call reads, poisoned until late_copy writes it
        const void* source;  // its values
        size_t bytes;
      };
      const std::map<std::string, LateBuffer> late_buffers = {
          {"hidden", {hidden, hidden_source, hidden_bytes}},
          {"positions", {positions, positions_source, positions_bytes}},
          {"kv_a_weight", {weight, weight_source, weight_bytes}}};
      const LateBuffer& late = late_buffers.at(late_input);
      const auto enqueue = [&]() -> Status {
        if (cudaMemsetAsync(cache, 0xFF, cache_bytes, stream) != cudaSuccess ||
            cudaMemsetAsync(late.target, 0xFF, late.bytes, stream) != cudaSuccess) {
          return {StatusCode::kCudaError, "cudaMemsetAsync (the poison)"};
        }
        if (late_copy(late.source, late.target, late.bytes, 50000, stream) != cudaSuccess) {
          return {StatusCode::kCudaError, "late_copy"};
        }
        return run(p, a, o);
      };
      const MlaOutputs ref = reference_mla(p, in, RopeForm::kPositions);
      const MlaOutputs emu = emulate_unfused_mla(p, in, RopeForm::kPositions);
      std::vector<double> ref_rows, emu_rows;
      for (int64_t t = 0; t < tokens; ++t) {
        append_cache_row(p, ref, t, &ref_rows);
        append_cache_row(p, emu, t, &emu_rows);
      }
      int programmatic = 0;
      eager_then_graph_replays(
          stream, enqueue,
          [&](const std::string&) {
            std::vector<unsigned char> bytes(cache_bytes);
            ASSERT_EQ(cudaMemcpy(bytes.data(), cache, cache_bytes, cudaMemcpyDeviceToHost),
                      cudaSuccess);
            expect_close("the cache rows", from_bytes(bytes, p.dtype), ref_rows, emu_rows,
                         p.dtype);
          },
          &programmatic);
      if (HasFatalFailure()) break;
      EXPECT_GE(programmatic, 2) << "late_copy -> K1 and K1 -> K2 were not both programmatic";
    }
  }
  cudaStreamDestroy(stream);
}

// cudaStreamPerThread is one handle for a stream per host thread: two threads calling on theirs at
// once each get their own branch for stage B (stream_branches.h), with the right results.
TEST(MlaGpu, PerThreadDefaultStreamsOfTwoThreads) {
  SKIP_WITHOUT_CUDA_MLA();
  std::thread first([] { check_case(stream_case(DType::kBFloat16), cudaStreamPerThread); });
  std::thread second([] { check_case(stream_case(DType::kFloat16), cudaStreamPerThread); });
  first.join();
  second.join();
}

// Too small a workspace is refused naming args.workspace_bytes, and the refused call writes
// nothing; the exact minimum (no room for cuBLAS's scratch) runs.
TEST(MlaGpu, WorkspaceRefusalAndMinimum) {
  SKIP_WITHOUT_CUDA_MLA();
  MlaProblem p = with(mla_shape(32, 0, 16, 8, 2, 8, 8), DType::kBFloat16, MlaStage::kBoth,
                      RopeStyle::kInterleave);
  p.seq = 4;
  const MlaInputs in = random_mla_inputs(p, kSeed);
  DeviceArena arena;
  MlaArgs a = contiguous_mla_args(p);
  auto up = [&](const std::vector<float>& v, DType type) {
    const std::vector<unsigned char> b = to_bytes(v, type);
    return arena.upload(b.data(), b.size());
  };
  a.hidden = up(in.hidden, p.dtype);
  a.kv_a_weight = up(in.kv_a_weight, p.dtype);
  a.kv_a_norm_weight = up(in.kv_a_norm_weight, p.dtype);
  a.cos = up(in.cos, p.rope_dtype);
  a.sin = up(in.sin, p.rope_dtype);
  a.kv_b_weight = up(in.kv_b_weight, p.dtype);
  const std::vector<float> k_poison(static_cast<size_t>(p.tokens() * p.heads * p.k_width()), kNaN);
  const std::vector<float> v_poison(static_cast<size_t>(p.tokens() * p.heads * p.v_dim), kNaN);
  a.k = up(k_poison, p.dtype);
  a.v = up(v_poison, p.dtype);
  ASSERT_FALSE(::testing::Test::HasFailure());
  // The regions before the scratch: ckv [T, R + dr padded to 4] float32 and c [T, R], each
  // rounded up to 256 bytes, from a 256-byte aligned start (cudaMalloc's are).
  const int64_t ckv = (p.tokens() * ((p.cache_width() + 3) / 4 * 4) * 4 + 255) / 256 * 256;
  const int64_t c = (p.tokens() * p.kv_rank * 2 + 255) / 256 * 256;
  a.workspace = up(std::vector<float>(static_cast<size_t>((ckv + c) / 4), 0.f), DType::kFloat32);
  Options o;
  o.backend = Backend::kCuda;
  o.strategy = Strategy::kCudaMlaGemm;
  a.workspace_bytes = ckv + c - 1;
  const Status refused = run(p, a, o);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("args.workspace_bytes = " + std::to_string(ckv + c - 1)),
            std::string::npos)
      << refused.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> k_bytes(k_poison.size() * 2);
  ASSERT_EQ(cudaMemcpy(k_bytes.data(), a.k, k_bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(count_not_nan(from_bytes(k_bytes, p.dtype)), 0) << "a refused call wrote K";

  a.workspace_bytes = ckv + c;
  const Status ran = run(p, a, o);
  ASSERT_TRUE(ran.ok()) << ran.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k_bytes.data(), a.k, k_bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const MlaOutputs ref = reference_mla(p, in, RopeForm::kCosSin);
  const MlaOutputs emu = emulate_unfused_mla(p, in, RopeForm::kCosSin);
  expect_close("k", from_bytes(k_bytes, p.dtype), ref.k, emu.k, p.dtype);
}

// A pointer not aligned to its elements is refused, naming it.
TEST(MlaGpu, RefusesAMisalignedPointer) {
  SKIP_WITHOUT_CUDA_MLA();
  MlaProblem p = with(mla_shape(32, 0, 16, 8, 2, 8, 8), DType::kBFloat16, MlaStage::kSecond,
                      RopeStyle::kInterleave);
  MlaArgs a = contiguous_mla_args(p);
  DeviceArena arena;
  std::vector<unsigned char> bytes(4096, 0);
  char* base = static_cast<char*>(arena.upload(bytes.data(), bytes.size()));
  ASSERT_NE(base, nullptr);
  a.latent = base + 1;
  a.k_pe = base + 512;
  a.kv_b_weight = base + 1024;
  a.k = base + 2048;
  a.v = base + 3072;
  Options o;
  o.backend = Backend::kCuda;
  o.strategy = Strategy::kCudaMlaGemm;
  const Status s = check(p, a, o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("args.latent"), std::string::npos) << s.message();
}

// A row whose one token would not fit the epilogue's shared memory is refused with kUnsupported,
// naming the dimensions.
TEST(MlaGpu, RefusesARowPastTheEpiloguesSharedMemory) {
  SKIP_WITHOUT_CUDA_MLA();
  const MlaProblem p = with(mla_shape(64, 0, 7000, 16, 1, 8, 8), DType::kBFloat16,
                            MlaStage::kFirst, RopeStyle::kInterleave);
  DeviceArena arena;
  std::vector<unsigned char> bytes(size_t{2} << 20, 0);
  char* base = static_cast<char*>(arena.upload(bytes.data(), bytes.size()));
  ASSERT_NE(base, nullptr);
  MlaArgs a = contiguous_mla_args(p);
  a.hidden = base;                            // [1, 64]
  a.kv_a_weight = base + (64 << 10);          // [7016, 64]: 898 KB
  a.kv_a_norm_weight = base + (1024 << 10);   // [7000]
  a.positions = reinterpret_cast<const int64_t*>(base + (1088 << 10));
  a.cos_sin_cache = base + (1152 << 10);      // [4, 16] float32
  a.max_position = 4;
  a.kv_cache = base + (1216 << 10);           // dense: [1, 7016]
  a.num_slots = 1;
  a.workspace = base + (1280 << 10);
  a.workspace_bytes = 512 << 10;
  Options o;
  o.backend = Backend::kCuda;
  o.strategy = Strategy::kCudaMlaGemm;
  const Status s = check(p, a, o);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.message();
  EXPECT_NE(s.message().find("problem.q_rank + problem.kv_rank + problem.rope_dim = 7016"),
            std::string::npos)
      << s.message();
}

// cuda-mla-decode forced past its 64 tokens, or on weight rows that are not whole 16-byte vectors,
// is refused with kUnsupported naming the value; kAuto runs cuda-mla-gemm there instead.
TEST(MlaDecodeGpu, RefusesPast64TokensAndPartialVectorRows) {
  SKIP_WITHOUT_CUDA_MLA();
  MlaProblem p = with(mla_shape(32, 0, 32, 8, 3, 16, 8), DType::kBFloat16, MlaStage::kSecond,
                      RopeStyle::kInterleave);
  DeviceArena arena;
  std::vector<unsigned char> bytes(size_t{1} << 20, 0);
  char* base = static_cast<char*>(arena.upload(bytes.data(), bytes.size()));
  ASSERT_NE(base, nullptr);
  auto args_for = [&](const MlaProblem& problem) {
    MlaArgs a = contiguous_mla_args(problem);
    a.latent = base;
    a.k_pe = base + (64 << 10);
    a.kv_b_weight = base + (128 << 10);
    a.k = base + (256 << 10);
    a.v = base + (512 << 10);
    return a;
  };
  Options forced;
  forced.backend = Backend::kCuda;
  forced.strategy = Strategy::kCudaMlaDecode;
  Options automatic;
  automatic.backend = Backend::kCuda;
  auto selected = [&](const MlaArgs& a) {
    Strategy s = Strategy::kAuto;
    const Status status = select_strategy(p, a, automatic, &s);
    EXPECT_TRUE(status.ok()) << status.message();
    return std::string(to_string(s));
  };

  constexpr int64_t kMaxTokens =
      detail::tiles::kMlaDecodeTokenTile * detail::tiles::kMlaDecodeMaxTokenTiles;
  p.seq = kMaxTokens + 1;
  Status s = check(p, args_for(p), forced);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("(tokens) = " + std::to_string(kMaxTokens + 1)), std::string::npos)
      << s.message();
  EXPECT_EQ(selected(args_for(p)), "cuda-mla-gemm");

  p.seq = kMaxTokens;
  EXPECT_TRUE(check(p, args_for(p), forced).ok());
  EXPECT_EQ(selected(args_for(p)),
            detail::cuda_mla_decode_preferred(p) ? "cuda-mla-decode" : "cuda-mla-gemm");

  p.seq = detail::kMlaDecodeMaxTokens;
  MlaArgs a = args_for(p);
  EXPECT_TRUE(check(p, a, forced).ok());
  EXPECT_EQ(selected(a), "cuda-mla-decode");
  a.kv_b_weight_stride_row = p.kv_rank + 3;
  s = check(p, a, forced);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("args.kv_b_weight_stride_row = 35"), std::string::npos)
      << s.message();
  EXPECT_EQ(selected(a), "cuda-mla-gemm");
}

// Each caller stream gets its own branch for stage B's V GEMM (stream_branches.h) up to
// kMaxStreamBranches; past that a new caller stream takes over the least recently used branch
// that no capture holds. Here one stream's capture stays open while kMaxStreamBranches + 2 other
// streams call twice each, taking branches over: the captured stream's branch must not be among
// them (the capture would hold their work, or be invalidated), so every call and the replayed
// graph match the reference.
TEST(MlaGpu, StreamBranchesPastTheLimitAreTakenOverOutsideCaptures) {
  SKIP_WITHOUT_CUDA_MLA();
  std::vector<cudaStream_t> streams(detail::kMaxStreamBranches + 2);
  for (cudaStream_t& stream : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  cudaStream_t held = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking), cudaSuccess);
  MlaCase captured = stream_case(DType::kBFloat16);
  captured.name = "held-capture";
  check_case(captured, held, /*graph=*/true, [&] {
    for (int round = 0; round < 2; ++round) {
      for (cudaStream_t stream : streams) check_case(stream_case(DType::kBFloat16), stream);
    }
  });
  for (cudaStream_t stream : streams) cudaStreamDestroy(stream);
  cudaStreamDestroy(held);
}

}  // namespace
}  // namespace latentkv::testing
