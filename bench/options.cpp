// Command-line parsing for latentkv-bench. Shapes start from a preset (the founding case by
// default), explicit dimensions override it, --tokens turns it into a sweep over T = seq with
// batch 1, and --sweep / --sweep-mla replace all of that with the lists of tests/common/cases.h
// (the one case list the tests draw from too). An MLA preset (mla_reference.h) makes the cases the
// MLA KV path's, with their own dimension options; --sweep-mla-path runs that path's list.
#include "options.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "mla_reference.h"
#include "testing.h"

namespace latentkv::bench {
namespace {

// "a, b, c": the names of a list of cases.
template <typename Cases>
std::string names_of(const Cases& cases) {
  std::string names;
  for (const auto& c : cases) names += (names.empty() ? "" : ", ") + c.name;
  return names;
}

void print_usage(FILE* to) {
  std::fprintf(to,
R"(usage: latentkv-bench [options]

Runs the low-rank KV projection of Multi-head Latent Attention, checks it against a float64
reference and times the fused path against the unfused baseline (three GEMMs, then the stack
copy, as PyTorch eager does) in the same run. With no options: the founding case ("seed": B=4
S=96 D=256 R=48 H=4 Dh=32 float32) on the best backend present (CUDA if a GPU is found, else CPU).
Cases too large for a quick float64 reference are checked on an even sample of tokens (each
output row depends only on its own token), and every output element must be finite.
An MLA preset or --sweep-mla-path runs the MLA KV path (mla.h) instead: every output (q_a, the
cache rows, K, V) checked on its own (bf16/fp16: within 2x the baseline's error of that output),
the baseline being cuBLAS GEMMs plus separate norm, RoPE, cache-write and concat kernels; its
floor is the largest of one kernel launch, bytes / 4.2 TB/s and FLOPs / 670 TFLOP/s (fp32: 51).

shape
  --preset NAME          start from a named case (default seed); presets:
                         %s
                         and the MLA KV path's (mla.h; bfloat16, RoPE by positions into a
                         cos_sin_cache, the latent cache paged by a shuffled slot_mapping):
                         %s
  --batch N --seq N --model-dim N --rank N --heads N --head-dim N
                         override dimensions of the preset
  --q-rank N --kv-rank N --rope-dim N --nope-dim N --v-dim N
                         MLA presets: override those dimensions too (--q-rank 0: no q_a)
  --stage NAME           MLA: both | first | second (default both; second reads c and k_pe
                         from the paged cache)
  --rope-form NAME       MLA: positions | cos_sin (default positions: vLLM's cos_sin_cache form;
                         cos_sin: transformers' per-token cos and sin)
  --rope-style NAME      MLA: interleave | gptj | neox (default the preset's: interleave)
  --tokens T1,T2,...     one case per T, each with batch=1, seq=T
  --dtype TYPE           float32 | bfloat16 | float16 (default: the preset's)
  --sweep                the standard list: seed, seed-x16, T in {1,7,64,733,6144} with the seed
                         dims, and the remaining presets; on the CPU, cases over 10 GFLOP per
                         call and non-float32 cases are skipped (and said so)
  --sweep-mla            DeepSeek-V2-Lite T in {1,64,1024,8192} and V3 T in {1,128,4096}, bfloat16
                         (--dtype overrides): the real-model table, GPU only
  --sweep-mla-path       the MLA KV path's rows, bfloat16 (--dtype, --rope-form and --rope-style
                         apply): whole path DeepSeek-V2-Lite and V3 without q_a, T in {1,64,1024,
                         4096}; first stage alone V3 kv T in {1,16,64}, V3 q_a + kv T in {1,16},
                         V2-Lite T in {1,16}; each against the unfused cuBLAS baseline (cuBLAS
                         GEMMs, then separate norm, RoPE, cache-write and concat kernels)
backend
  --backend NAME         auto | cpu | cuda (default auto)
  --strategy NAME        auto | cpu-blocked | cuda-fused | cuda-gemm | cuda-decode (projection),
                         cpu-mla | cuda-mla-gemm | cuda-mla-decode (MLA): force one strategy
                         (default auto); with --backend auto it also picks the backend
timing
  --warmup N             unmeasured runs first (default 10)
  --iters N              timed samples (default 100; GPU: graph replays and host loops)
  --seconds S            stop a measurement early once it has taken S seconds (default 1),
                         after at least 5 samples
  --calls-per-graph N    CUDA: calls captured per graph (default 20)
  --no-rotate            CUDA: time on one input set even when it fits in L2 (default: cycle
                         through enough copies to spill it)
  --seed N               seed of the random inputs (default 1)
output
  --json                 one JSON object per case on stdout; the human report goes to stderr
  --quiet                no progress on stderr (by default a run of several cases prints a
                         line per case as it finishes)
  --help                 this text

Exit status: 0 all cases pass; 1 a result is outside tolerance or a CUDA call failed; 2 a bad
option, a backend that is not there, or a case the library refused.
)",
               names_of(testing::preset_cases()).c_str(),
               names_of(testing::mla_preset_cases()).c_str());
}

int bad_option(const std::string& message) {
  std::fprintf(stderr, "latentkv-bench: %s (see --help)\n", message.c_str());
  return 2;
}

bool parse_int(const std::string& text, int64_t min_value, int64_t* value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < min_value) return false;
  *value = v;
  return true;
}

bool parse_seconds(const std::string& text, double* value) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !(v > 0) || v > 3600) return false;
  *value = v;
  return true;
}

// Matches s against to_string() of each value.
template <typename Enum>
bool parse_enum(const std::string& s, std::initializer_list<Enum> values, Enum* out) {
  for (Enum v : values) {
    if (s == to_string(v)) {
      *out = v;
      return true;
    }
  }
  return false;
}

bool parse_token_list(const std::string& text, std::vector<int64_t>* tokens) {
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    int64_t t = 0;
    if (!parse_int(text.substr(begin, end - begin), 1, &t)) return false;
    tokens->push_back(t);
    begin = end + 1;
  }
  return !tokens->empty();
}

// The strategy's own backend, so that --strategy alone is enough.
Backend backend_of(Strategy strategy) {
  switch (strategy) {
    case Strategy::kCpuBlocked:
    case Strategy::kCpuMla: return Backend::kCpu;
    case Strategy::kCudaMlaGemm:
    case Strategy::kCudaMlaDecode:
    case Strategy::kCudaFused:
    case Strategy::kCudaGemm:
    case Strategy::kCudaDecode: return Backend::kCuda;
    case Strategy::kAuto: break;
  }
  return Backend::kAuto;
}

// The cases of one list of cases.h, as the bench runs them.
std::vector<BenchCase> bench_cases(const std::vector<testing::Case>& cases) {
  std::vector<BenchCase> out;
  for (const testing::Case& c : cases) {
    BenchCase b;
    b.name = c.name;
    b.problem = c.problem;
    out.push_back(b);
  }
  return out;
}

// An MLA case of latentkv-bench.
BenchCase mla_case(const std::string& name, const MlaProblem& problem) {
  BenchCase c;
  c.name = name;
  c.mla = true;
  c.mla_problem = problem;
  return c;
}

}  // namespace

int parse_options(int argc, char** argv, BenchOptions* options) {
  std::string preset = "seed";
  bool mla_sweep = false;
  bool mla_path_sweep = false;
  bool plain_sweep = false;
  bool dtype_set = false;
  DType dtype = DType::kFloat32;
  bool shape_set = false;
  std::vector<int64_t> tokens;
  // Dimension overrides, -1 where not given; the order of kDims below. The first four and
  // --heads are shared by both operations; --rank and --head-dim are the projection's, the last
  // five the MLA path's.
  constexpr int kDimCount = 11;
  int64_t dims[kDimCount] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  static const char* const kDims[kDimCount] = {
      "--batch",  "--seq",     "--model-dim", "--rank",     "--heads", "--head-dim",
      "--q-rank", "--kv-rank", "--rope-dim",  "--nope-dim", "--v-dim"};
  enum { kBatch, kSeq, kModelDim, kRank, kHeads, kHeadDim, kQRank, kKvRank, kRopeDim, kNopeDim,
         kVDim };
  // MLA options, as given (stage_set etc. say whether they were).
  bool stage_set = false, rope_form_set = false, rope_style_set = false;
  MlaStage stage = MlaStage::kBoth;
  testing::RopeForm rope_form = testing::RopeForm::kPositions;
  RopeStyle rope_style = RopeStyle::kInterleave;

  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    // --name=value and --name value are both accepted.
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto take_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) return false;
      value = argv[++i];
      has_value = true;
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      return 0;
    }
    if (arg == "--json" || arg == "--sweep" || arg == "--sweep-mla" ||
        arg == "--sweep-mla-path" || arg == "--no-rotate" || arg == "--quiet") {
      if (has_value) return bad_option(arg + " takes no value");
      if (arg == "--json") options->json = true;
      if (arg == "--sweep") options->sweep = plain_sweep = true;
      if (arg == "--sweep-mla") options->sweep = mla_sweep = true;
      if (arg == "--sweep-mla-path") options->sweep = mla_path_sweep = true;
      if (arg == "--no-rotate") options->timing.rotate = false;
      if (arg == "--quiet") options->quiet = true;
      continue;
    }
    bool known = false;
    for (const char* d : kDims) known = known || arg == d;
    for (const char* o : {"--preset", "--tokens", "--dtype", "--backend", "--strategy", "--iters",
                          "--warmup", "--seconds", "--calls-per-graph", "--seed", "--stage",
                          "--rope-form", "--rope-style"}) {
      known = known || arg == o;
    }
    if (!known) return bad_option("unknown option '" + std::string(argv[i]) + "'");
    if (!take_value()) return bad_option(arg + " needs a value");

    int64_t n = 0;
    bool dim_given = false;
    for (int d = 0; d < kDimCount; ++d) {
      if (arg != kDims[d]) continue;
      dim_given = true;
      const bool may_be_zero = d == kQRank;
      if (!parse_int(value, may_be_zero ? 0 : 1, &n)) {
        return bad_option(arg + " = '" + value + "' is not a " +
                          (may_be_zero ? "non-negative" : "positive") + " integer");
      }
      dims[d] = n;
      shape_set = true;
    }
    if (dim_given) continue;
    if (arg == "--preset") {
      Problem p;
      MlaProblem m;
      if (!testing::find_preset(value, &p) && !testing::find_mla_preset(value, &m)) {
        return bad_option("no preset named '" + value + "'");
      }
      preset = value;
    } else if (arg == "--tokens") {
      if (!parse_token_list(value, &tokens)) {
        return bad_option("--tokens = '" + value + "' is not a comma list of positive integers");
      }
    } else if (arg == "--dtype") {
      if (!parse_enum(value, {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, &dtype)) {
        return bad_option("--dtype = '" + value + "': expected float32, bfloat16 or float16");
      }
      dtype_set = true;
    } else if (arg == "--stage") {
      if (!parse_enum(value, {MlaStage::kBoth, MlaStage::kFirst, MlaStage::kSecond}, &stage)) {
        return bad_option("--stage = '" + value + "': expected both, first or second");
      }
      stage_set = true;
    } else if (arg == "--rope-form") {
      if (!parse_enum(value, {testing::RopeForm::kPositions, testing::RopeForm::kCosSin},
                      &rope_form)) {
        return bad_option("--rope-form = '" + value + "': expected positions or cos_sin");
      }
      rope_form_set = true;
    } else if (arg == "--rope-style") {
      if (!parse_enum(value, {RopeStyle::kInterleave, RopeStyle::kGptJ, RopeStyle::kNeox},
                      &rope_style)) {
        return bad_option("--rope-style = '" + value + "': expected interleave, gptj or neox");
      }
      rope_style_set = true;
    } else if (arg == "--backend") {
      if (!parse_enum(value, {Backend::kAuto, Backend::kCpu, Backend::kCuda}, &options->backend)) {
        return bad_option("--backend = '" + value + "': expected auto, cpu or cuda");
      }
    } else if (arg == "--strategy") {
      if (!parse_enum(value,
                      {Strategy::kAuto, Strategy::kCpuBlocked, Strategy::kCudaFused,
                       Strategy::kCudaGemm, Strategy::kCudaDecode, Strategy::kCpuMla,
                       Strategy::kCudaMlaGemm, Strategy::kCudaMlaDecode},
                      &options->strategy)) {
        return bad_option("--strategy = '" + value +
                          "': expected auto, cpu-blocked, cuda-fused, cuda-gemm, cuda-decode, "
                          "cpu-mla, cuda-mla-gemm or cuda-mla-decode");
      }
    } else if (arg == "--seconds") {
      if (!parse_seconds(value, &options->timing.seconds)) {
        return bad_option("--seconds = '" + value + "' is not a number in (0, 3600]");
      }
    } else {
      // The remaining options are integer counts.
      const bool is_warmup = arg == "--warmup";
      const bool is_seed = arg == "--seed";
      if (!parse_int(value, is_warmup || is_seed ? 0 : 1, &n) || n > 1000000000) {
        return bad_option(arg + " = '" + value + "' is not a " +
                          (is_warmup || is_seed ? "non-negative" : "positive") + " integer");
      }
      if (is_warmup) options->timing.warmup = static_cast<int>(n);
      if (is_seed) options->timing.seed = static_cast<uint64_t>(n);
      if (arg == "--iters") options->timing.iters = static_cast<int>(n);
      if (arg == "--calls-per-graph") {
        if (n > 10000) return bad_option("--calls-per-graph = '" + value + "' is over 10000");
        options->timing.calls_per_graph = static_cast<int>(n);
      }
    }
  }

  if (options->strategy != Strategy::kAuto) {
    const Backend own = backend_of(options->strategy);
    if (options->backend == Backend::kAuto) {
      options->backend = own;
    } else if (options->backend != own) {
      return bad_option(std::string("--strategy ") + to_string(options->strategy) +
                        " does not run on --backend " + to_string(options->backend));
    }
  }

  MlaProblem mla_base;
  const bool mla = mla_path_sweep || testing::find_mla_preset(preset, &mla_base);
  if (!mla && (stage_set || rope_form_set || rope_style_set)) {
    return bad_option("--stage, --rope-form and --rope-style are the MLA path's: use an MLA "
                      "preset (" + names_of(testing::mla_preset_cases()) +
                      ") or --sweep-mla-path");
  }
  for (int d = 0; d < kDimCount; ++d) {
    const bool projection_only = d == kRank || d == kHeadDim;
    const bool mla_only = d >= kQRank;
    if (dims[d] >= 0 && (mla ? projection_only : mla_only)) {
      return bad_option(std::string(kDims[d]) + " does not apply to " +
                        (mla ? "the MLA path (--q-rank, --kv-rank, --rope-dim, --nope-dim, "
                               "--v-dim set its dimensions)"
                             : "the projection (it is an MLA dimension)"));
    }
  }

  if (options->sweep) {
    if (shape_set || !tokens.empty() || preset != "seed" || stage_set) {
      return bad_option("--sweep runs its own list of cases; drop --preset, --tokens, --stage and "
                        "the dimension options");
    }
    if (mla_path_sweep) {
      if (mla_sweep || plain_sweep) {
        return bad_option("--sweep-mla-path runs its own list; drop --sweep and --sweep-mla");
      }
      for (const testing::MlaNamedCase& c : testing::mla_path_sweep_cases()) {
        options->cases.push_back(mla_case(c.name, c.problem));
      }
    } else {
      options->cases =
          bench_cases(mla_sweep ? testing::mla_sweep_cases() : testing::sweep_cases());
    }
  } else {
    if (!tokens.empty() && (dims[kBatch] > 0 || dims[kSeq] > 0)) {
      return bad_option("--tokens sets batch=1 and seq=T itself; drop --batch and --seq");
    }
    BenchCase base;
    base.name = preset;
    if (mla) {
      base = mla_case(preset, mla_base);
      MlaProblem& m = base.mla_problem;
      int64_t* fields[kDimCount] = {&m.batch,  &m.seq,     &m.model_dim, nullptr,
                                    &m.heads,  nullptr,    &m.q_rank,    &m.kv_rank,
                                    &m.rope_dim, &m.nope_dim, &m.v_dim};
      for (int d = 0; d < kDimCount; ++d) {
        if (dims[d] >= 0 && fields[d] != nullptr) *fields[d] = dims[d];
      }
      m.stage = stage;
    } else {
      testing::find_preset(preset, &base.problem);
      int64_t* fields[6] = {&base.problem.batch, &base.problem.seq,   &base.problem.model_dim,
                            &base.problem.rank,  &base.problem.heads, &base.problem.head_dim};
      for (int d = 0; d < 6; ++d) {
        if (dims[d] > 0) *fields[d] = dims[d];
      }
    }
    if (shape_set) base.name = "custom";
    if (tokens.empty()) {
      options->cases.push_back(base);
    } else {
      for (int64_t t : tokens) {
        BenchCase c = base;
        int64_t* batch = mla ? &c.mla_problem.batch : &c.problem.batch;
        int64_t* seq = mla ? &c.mla_problem.seq : &c.problem.seq;
        *batch = 1;
        *seq = t;
        c.name = (preset == "seed" && !shape_set ? "" : base.name + " ") + "T=" + std::to_string(t);
        options->cases.push_back(c);
      }
    }
  }
  for (BenchCase& c : options->cases) {
    if (dtype_set) {
      c.problem.dtype = dtype;
      c.mla_problem.dtype = dtype;
    }
    if (rope_form_set) c.rope_form = rope_form;
    if (rope_style_set) c.mla_problem.rope_style = rope_style;
  }
  return -1;
}

}  // namespace latentkv::bench
