// The one case list of latentkv: every shape the C++ tests, the Python tests (through
// latentkv-cases, print_cases.cpp) and latentkv-bench's sweeps run. The edge shapes come from the
// kernels' own tile constants (src/cuda/tile_sizes.h): a tile minus one, a tile and a tile plus one
// for each configuration, so they follow the kernels when a tile changes. Each case carries a name
// (unique within its list), the Problem and tags saying what it targets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "latentkv/latentkv.h"

namespace latentkv::testing {

// What a case targets, as bits of Case::tags.
enum CaseTag : uint32_t {
  kCpuCheap = 1u << 0,  // the float64 reference and the CPU backend take well under a second
  kFp32 = 1u << 1,      // meant to run in float32
  kBf16 = 1u << 2,      // meant to run in bfloat16
  kFp16 = 1u << 3,      // meant to run in float16
  kCpuBlocked = 1u << 4,  // derived from (or aimed at) the cpu-blocked tiles
  kCudaFused = 1u << 5,   // ... the cuda-fused tiles
  kCudaGemm = 1u << 6,    // ... cuda-gemm (cuBLAS: no tiles of ours; real-model shapes)
  kCudaDecode = 1u << 7,  // ... the cuda-decode tiles (T <= 16); cuda-decode takes it in every
                          // dtype tagged
};
constexpr uint32_t kAllDtypes = kFp32 | kBf16 | kFp16;

// The names of the set tags (JSON, test output): "cpu-cheap", "fp32", ..., "cuda-decode".
std::vector<std::string> tag_names(uint32_t tags);

struct Case {
  std::string name;  // unique within its list (a test id); the sweeps keep the bench's names
  Problem problem;
  uint32_t tags = 0;

  bool has(uint32_t tag) const { return (tags & tag) == tag; }
};
using NamedCase = Case;

// A float32 problem of batch b, seq s, model_dim d, rank r, heads h, head_dim dh.
Problem shape(int64_t b, int64_t s, int64_t d, int64_t r, int64_t h, int64_t dh);

// The named presets: "seed" (the founding case, T = 384), "seed-x16" (T = 6144),
// "deepseek-v2-lite", "deepseek-v3" (one prefill chunk each, float32 as the presets of
// latentkv-bench; the bench and the tests set the dtype).
std::vector<Case> preset_cases();
bool find_preset(const std::string& name, Problem* problem);

// Edge shapes: around every tile of every configuration (tile_sizes.h) plus one token, R = 1,
// H = 1, odd D/R/Dh, a second D and R block. Names say which tile and which side of it.
std::vector<Case> edge_cases();
// The shapes of cuda-decode (T <= 16): around its token groups, column tiles, row slots and row
// alignments, every R and H*Dh a multiple of 8 so all three dtypes take the 16-byte weight rows;
// DeepSeek decode. cuda-decode must take each of them in every dtype.
std::vector<Case> decode_cases();
// count random shapes, small enough for the float64 reference to be quick (deterministic per seed).
std::vector<Case> random_cases(int count, uint64_t seed);
// The seed and count the test suites draw random_cases with (latentkv-cases prints these).
constexpr uint64_t kRandomSeed = 20261129;
constexpr int kRandomCount = 60;

// latentkv-bench --sweep: seed, seed-x16, T in {1, 7, 64, 733, 6144} at the founding dims, the
// remaining presets; float32. Names and shapes fixed, so numbers stay comparable across runs.
std::vector<Case> sweep_cases();
// latentkv-bench --sweep-mla: DeepSeek-V2-Lite T in {1, 64, 1024, 8192} and V3 T in {1, 128,
// 4096}, bfloat16. Names "deepseek-v2-lite T=1", ...
std::vector<Case> mla_sweep_cases();

// The lists by name ("preset", "edge", "decode", "random", "sweep", "mla-sweep"; random with
// kRandomCount, kRandomSeed); an unknown name gives an empty list.
std::vector<std::string> list_names();
std::vector<Case> cases_named(const std::string& list);

// Only the problems of a list, or of its cases with every bit of `tags` set.
std::vector<Problem> problems(const std::vector<Case>& cases, uint32_t tags = 0);
// The edge problems (edge_cases()) and random problems, as the parameterized tests take them.
std::vector<Problem> edge_shapes();
std::vector<Problem> random_shapes(int count, uint64_t seed);

}  // namespace latentkv::testing
