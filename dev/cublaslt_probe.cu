// EXPERIMENT (not shipped): is there a cuBLASLt algorithm (split-K, a smaller tile giving more
// CTAs, ...) much faster than what cublasGemmEx's default picks for our bf16 GEMMs at small/mid
// token counts? For each case and T it times
//   down: latent[T,R] = hidden[T,D] @ w_down[D,R]                     (cublasGemmEx)
//   up:   out[b][T,N] = latent[T,R] @ w_up[b][R,N], b in {k, v}       (cublasGemmStridedBatchedEx)
// issued exactly as src/cuda/gemm_cublas.cu does (row-major C = A B as column-major C^T = B^T A^T,
// CUBLAS_GEMM_DEFAULT, 32 MiB workspace), then every algorithm cublasLtMatmulAlgoGetHeuristic
// returns (up to 32) plus forced split-K variants of its first unsplit ones (add_split_k), each
// checked against the default's result, then the pair (down then up) with the default calls and
// with the fastest correct algo of each.
// Timing: inputs rotated through enough copies that one replay's working set is >= 160 MiB (weights
// come from HBM, not the 60 MiB L2); a CUDA graph of calls = smallest multiple of copies >= 20
// (so the rotation wraps cleanly), 3 warm-up replays, 50 timed replays back to back; reported:
// median replay / calls.
// Build and run: dev/cublaslt_probe.sh (output in ${OUT:-.}/cublaslt_probe.txt), or
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/cublaslt_probe.cu
//     -lcublasLt -lcublas -o /tmp/cublaslt_probe && /tmp/cublaslt_probe [--model v2lite,v3]
//     [--tokens 1,64] [--max-algos 32] [--split-down]
// --split-down instead times the down GEMM split over chunks of D (a strided-batched GEMM into
// float32 partials, then a summing kernel), alone and followed by the up GEMM.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#define CUDA_CHECK(x)                                                                       \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_), \
              cudaGetErrorString(e_));                                                      \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)
#define CUBLAS_CHECK(x)                                                                    \
  do {                                                                                     \
    cublasStatus_t s_ = (x);                                                               \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusName(s_)); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

using bf16 = __nv_bfloat16;

// ---- what to run (edit here) ----
// name, model dim D, latent rank R, kv width N = heads x head_dim
struct Model {
  const char* name;
  int64_t d, r, n;
};
const std::vector<Model> kModels = {{"v2lite", 2048, 512, 2048}, {"v3", 7168, 512, 16384}};
const std::vector<int64_t> kTokens = {1, 16, 64, 128, 256, 1024};
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // the library's cuBLAS workspace
constexpr size_t kRotateBytes = size_t{160} << 20;    // > 2 x the H200's 60 MiB L2
constexpr int kMinCalls = 20, kWarmup = 3, kReplays = 50;
constexpr double kBadRel = 1e-2;

// ---- device helpers ----
__device__ uint32_t hash32(uint64_t x) {  // murmur3's finalizer
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return static_cast<uint32_t>(x ^ (x >> 33));
}
__global__ void fill_uniform(bf16* p, size_t n, uint64_t seed) {  // values in [-1, 1]
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16(hash32(seed * 0x9e3779b97f4a7c15ull + i) * 0x1p-31f - 1.f);
}
// out[0] = max |x - ref| (inf where x is NaN/inf), out[1] = max |ref|, as float bits (>= 0).
__global__ void max_abs_diff(const bf16* x, const bf16* ref, size_t n, unsigned* out) {
  float d = 0.f, m = 0.f;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float r = __bfloat162float(ref[i]), e = fabsf(__bfloat162float(x[i]) - r);
    d = fmaxf(d, e <= FLT_MAX ? e : INFINITY);
    m = fmaxf(m, fabsf(r));
  }
  atomicMax(&out[0], __float_as_uint(d));
  atomicMax(&out[1], __float_as_uint(m));
}

// ---- one GEMM: row-major C[M,N] = A[M,K] @ B[K,N] (ld K, N, N), `batch` of them ----
struct Gemm {
  const char* name;
  int64_t m, n, k;
  int batch;
  int64_t stride_a, stride_b, stride_c;  // batch strides in elements (A's 0 = shared)
  std::vector<const bf16*> a, b;         // one per copy
  std::vector<bf16*> c;
  int copies() const { return static_cast<int>(a.size()); }
  size_t read_bytes() const { return 2 * (m * k * (stride_a ? batch : 1) + k * n * batch); }
  size_t c_elems() const { return static_cast<size_t>(m * n * batch); }
};

int copies_for(size_t read_bytes) {
  return std::max<int>(2, (kRotateBytes + read_bytes - 1) / read_bytes);
}
int calls_for(int copies) { return (kMinCalls + copies - 1) / copies * copies; }

struct Ctx {
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  void *blas_ws, *lt_ws;
  cudaStream_t stream;
  unsigned* cmp;  // 2 words for max_abs_diff
  std::map<int, std::string> tile_names, stages_names, cluster_names;
};

const float kAlpha = 1.f, kBeta = 0.f;

// The library's call (gemm_cublas.cu): (B, A) with the row strides as leading dimensions.
void run_default(Ctx& x, const Gemm& g, int c) {
  if (g.batch == 1) {
    CUBLAS_CHECK(cublasGemmEx_64(x.blas, CUBLAS_OP_N, CUBLAS_OP_N, g.n, g.m, g.k, &kAlpha, g.b[c],
                                 CUDA_R_16BF, g.n, g.a[c], CUDA_R_16BF, g.k, &kBeta, g.c[c],
                                 CUDA_R_16BF, g.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
        x.blas, CUBLAS_OP_N, CUBLAS_OP_N, g.n, g.m, g.k, &kAlpha, g.b[c], CUDA_R_16BF, g.n,
        g.stride_b, g.a[c], CUDA_R_16BF, g.k, g.stride_a, &kBeta, g.c[c], CUDA_R_16BF, g.n,
        g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// The same product for cuBLASLt, column-major: A_lt = B (n x k), B_lt = A (k x m), C = D (n x m).
struct LtGemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
};
cublasLtMatrixLayout_t lt_layout(uint64_t rows, uint64_t cols, int64_t ld, int batch,
                                 int64_t stride) {
  cublasLtMatrixLayout_t l;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = batch;
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof count));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride));
  }
  return l;
}
LtGemm lt_create(const Gemm& g) {
  LtGemm l;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&l.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // op N, N
  l.la = lt_layout(g.n, g.k, g.n, g.batch, g.stride_b);
  l.lb = lt_layout(g.k, g.m, g.k, g.batch, g.stride_a);
  l.lc = lt_layout(g.n, g.m, g.n, g.batch, g.stride_c);
  return l;
}
void lt_destroy(LtGemm& l) {
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l.la));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l.lb));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l.lc));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(l.desc));
}
cublasStatus_t run_lt(Ctx& x, const Gemm& g, const LtGemm& l, const cublasLtMatmulAlgo_t& algo,
                      int c) {
  return cublasLtMatmul(x.lt, l.desc, &kAlpha, g.b[c], l.la, g.a[c], l.lb, &kBeta, g.c[c], l.lc,
                        g.c[c], l.lc, &algo, x.lt_ws, kWorkspaceBytes, x.stream);
}

// ---- measuring ----
// Median time of one replay of a graph of `calls` enqueue(i) calls, divided by calls, in us.
double time_graph(Ctx& x, int calls, const std::function<void(int)>& enqueue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // Relaxed: a library that lazily queries or initializes something must not break the capture.
  CUDA_CHECK(cudaStreamBeginCapture(x.stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < calls; ++i) enqueue(i);
  CUDA_CHECK(cudaStreamEndCapture(x.stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < kWarmup; ++i) CUDA_CHECK(cudaGraphLaunch(exec, x.stream));
  std::vector<cudaEvent_t> ev(kReplays + 1);
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  CUDA_CHECK(cudaEventRecord(ev[0], x.stream));
  for (int r = 0; r < kReplays; ++r) {  // back to back: each interval is one replay
    CUDA_CHECK(cudaGraphLaunch(exec, x.stream));
    CUDA_CHECK(cudaEventRecord(ev[r + 1], x.stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(x.stream));
  std::vector<float> ms(kReplays);
  for (int r = 0; r < kReplays; ++r) CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
  for (auto& e : ev) CUDA_CHECK(cudaEventDestroy(e));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  std::sort(ms.begin(), ms.end());
  return 1e3 * (ms[kReplays / 2 - 1] + ms[kReplays / 2]) / 2 / calls;
}

// max |x - ref| / max |ref| over n elements on the device.
double rel_diff(Ctx& x, const bf16* a, const bf16* ref, size_t n) {
  unsigned h[2];
  CUDA_CHECK(cudaMemsetAsync(x.cmp, 0, 2 * sizeof(unsigned), x.stream));
  max_abs_diff<<<264, 256, 0, x.stream>>>(a, ref, n, x.cmp);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaMemcpyAsync(h, x.cmp, sizeof h, cudaMemcpyDeviceToHost, x.stream));
  CUDA_CHECK(cudaStreamSynchronize(x.stream));
  float d, m;
  memcpy(&d, &h[0], 4);
  memcpy(&m, &h[1], 4);
  return d / std::max(m, FLT_MIN);
}

// The default's copy-0 result at 16 sampled entries against a float dot product on the host
// (checks this program's operand mapping); returns max |err| / max |ref|.
double host_check(Ctx& x, const Gemm& g) {
  CUDA_CHECK(cudaStreamSynchronize(x.stream));
  std::vector<bf16> row(g.k), col(g.k);
  double err = 0, mag = 0;
  for (int s = 0; s < 16; ++s) {
    const int64_t b = s % g.batch, i = (s * 7919) % g.m, j = (s * 104729 + 13) % g.n;
    CUDA_CHECK(
        cudaMemcpy(row.data(), g.a[0] + b * g.stride_a + i * g.k, 2 * g.k, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy2D(col.data(), 2, g.b[0] + b * g.stride_b + j, 2 * g.n, 2, g.k,
                            cudaMemcpyDeviceToHost));
    bf16 got;
    CUDA_CHECK(cudaMemcpy(&got, g.c[0] + b * g.stride_c + i * g.n + j, 2, cudaMemcpyDeviceToHost));
    double ref = 0;
    for (int64_t q = 0; q < g.k; ++q)
      ref += double(__bfloat162float(row[q])) * __bfloat162float(col[q]);
    err = std::max(err, std::fabs(double(__bfloat162float(got)) - ref));
    mag = std::max(mag, std::fabs(ref));
  }
  return err / std::max(mag, 1e-30);
}

std::map<int, std::string> enum_names(const char* prefix) {  // ID -> name, read from the header
  std::map<int, std::string> names;
  const char* home = getenv("CUDA_HOME");
  const std::string path = std::string(home ? home : "/usr/local/cuda") + "/include/cublasLt.h";
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return names;
  char line[512], name[128];
  int id;
  while (fgets(line, sizeof line, f)) {
    const char* p = strstr(line, prefix);
    if (p && sscanf(p + strlen(prefix), "%127[0-9A-Za-z_] = %d", name, &id) == 2) names[id] = name;
  }
  fclose(f);
  return names;
}
std::string id_name(const std::map<int, std::string>& names, int id) {
  auto it = names.find(id);
  return std::to_string(id) + (it == names.end() ? "" : "(" + it->second + ")");
}

std::string algo_config(const Ctx& x, const cublasLtMatmulHeuristicResult_t& h) {
  int32_t id = 0, splitk = 0;
  uint32_t tile = 0, red = 0, stages = 0, swizzle = 0, custom = 0;
  uint16_t cluster = 0;
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t a, void* v, size_t n) {
    size_t written = 0;  // a field that cannot be read shows as all ones (-1, 65535, ...)
    if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, a, v, n, &written)) memset(v, 0xff, n);
  };
  get(CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id);
  get(CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
  get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk);
  get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red);
  get(CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages);
  get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle);
  get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom);
  get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster);
  const char* reds[] = {"none", "inplace", "compute", "?", "output"};
  char buf[320];
  snprintf(buf, sizeof buf,
           "algo=%d tile=%s splitK=%d red=%s stages=%s swz=%u opt=%u cluster=%s waves=%.2f ws=%zuK",
           id, id_name(x.tile_names, tile).c_str(), splitk, red < 5 ? reds[red] : "?",
           id_name(x.stages_names, stages).c_str(), swizzle, custom,
           id_name(x.cluster_names, cluster).c_str(), h.wavesCount, h.workspaceSize >> 10);
  return buf;
}

// ---- probing one GEMM ----
// Besides the heuristic's list: the first kSplitKFrom of its algos that run unsplit, forced to
// kSplitKs splits (where the algo supports split-K and cublasLtMatmulAlgoCheck accepts it), to
// test "few CTAs, bandwidth-starved" directly even if the heuristic offers no split-K itself.
constexpr int kSplitKFrom = 4;
const std::vector<int32_t> kSplitKs = {2, 4, 8, 16};

struct Candidate {
  std::string label;  // "#r": heuristic rank r; "#r/skS": rank r forced to S splits
  cublasLtMatmulHeuristicResult_t h;
};

void add_split_k(Ctx& x, const LtGemm& l, const std::vector<cublasLtMatmulHeuristicResult_t>& algos,
                 int from, std::vector<Candidate>& cands) {
  for (int r = 0; r < from; ++r) {
    int32_t splitk = 0, support = 0;
    uint32_t mask = 0;
    size_t w = 0;
    const cublasLtMatmulAlgo_t* algo = &algos[r].algo;
    const bool ok = algos[r].state == CUBLAS_STATUS_SUCCESS &&
                    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                         &splitk, sizeof splitk, &w) == 0 &&
                    cublasLtMatmulAlgoCapGetAttribute(algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT,
                                                      &support, sizeof support, &w) == 0 &&
                    cublasLtMatmulAlgoCapGetAttribute(algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                                                      &mask, sizeof mask, &w) == 0;
    if (splitk > 1) continue;  // already split
    if (!ok || !support || !mask) {
      printf("  #%d/sk: %s\n", r, ok ? "no split-K support" : "could not read its capabilities");
      continue;
    }
    // float partials in the workspace if the algo can, else in place, else bf16 partials.
    const uint32_t red =
        (mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
        : (mask & CUBLASLT_REDUCTION_SCHEME_INPLACE)    ? CUBLASLT_REDUCTION_SCHEME_INPLACE
                                                        : CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    for (int32_t s : kSplitKs) {
      Candidate c{"#" + std::to_string(r) + "/sk" + std::to_string(s), algos[r]};
      cublasStatus_t st = cublasLtMatmulAlgoConfigSetAttribute(
          &c.h.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s, sizeof s);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoConfigSetAttribute(&c.h.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                  &red, sizeof red);
      // Fills workspaceSize and wavesCount for the new config; leaves c.h.algo as it is.
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoCheck(x.lt, l.desc, l.la, l.lb, l.lc, l.lc, &c.h.algo, &c.h);
      if (st == CUBLAS_STATUS_SUCCESS && c.h.workspaceSize <= kWorkspaceBytes) {
        c.h.state = CUBLAS_STATUS_SUCCESS;
        cands.push_back(c);
      } else {
        printf("  %-8s rejected: %s, workspace %zu KiB\n", c.label.c_str(), cublasGetStatusName(st),
               c.h.workspaceSize >> 10);
      }
    }
  }
}

struct Probe {
  double default_us = 0, first_us = 0, best_us = 0;
  bool has_best = false;
  cublasLtMatmulAlgo_t best{};
  std::string best_config;
};

Probe probe(Ctx& x, const Gemm& g, int max_algos) {
  Probe p;
  const int calls = calls_for(g.copies());
  const size_t traffic = g.read_bytes() + 2 * g.c_elems();  // minimum HBM bytes of one call
  auto gbps = [&](double us) { return traffic / us / 1e3; };
  printf(
      "\n-- %s: M=%lld N=%lld K=%lld batch=%d | reads %.2f MiB/call, %d copies, %d calls/graph\n",
      g.name, (long long)g.m, (long long)g.n, (long long)g.k, g.batch, g.read_bytes() / 1048576.0,
      g.copies(), calls);

  bf16* ref;
  CUDA_CHECK(cudaMalloc(&ref, 2 * g.c_elems()));
  CUDA_CHECK(cudaMemsetAsync(g.c[0], 0xff, 2 * g.c_elems(), x.stream));  // NaN: unwritten shows
  run_default(x, g, 0);
  CUDA_CHECK(cudaMemcpyAsync(ref, g.c[0], 2 * g.c_elems(), cudaMemcpyDeviceToDevice, x.stream));
  const double host_rel = host_check(x, g);
  p.default_us = time_graph(x, calls, [&](int i) { run_default(x, g, i % g.copies()); });
  printf("  default  %9.2f us  %7.0f GB/s  (vs host float dot at 16 entries: %.1e%s)\n",
         p.default_us, gbps(p.default_us), host_rel, host_rel <= kBadRel ? "" : " BAD");

  LtGemm l = lt_create(g);
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws));
  std::vector<cublasLtMatmulHeuristicResult_t> algos(max_algos);
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(x.lt, l.desc, l.la, l.lb, l.lc, l.lc, pref, max_algos,
                                              algos.data(), &found));
  printf("  heuristic returned %d algos\n", found);
  std::vector<Candidate> cands;
  for (int r = 0; r < found; ++r) cands.push_back({"#" + std::to_string(r), algos[r]});
  add_split_k(x, l, algos, std::min(found, kSplitKFrom), cands);
  for (const Candidate& cand : cands) {
    const auto& h = cand.h;
    const char* label = cand.label.c_str();
    const std::string config = algo_config(x, h);
    if (h.state != CUBLAS_STATUS_SUCCESS) {
      printf("  %-8s state %s  %s\n", label, cublasGetStatusName(h.state), config.c_str());
      continue;
    }
    CUDA_CHECK(cudaMemsetAsync(g.c[0], 0xff, 2 * g.c_elems(), x.stream));
    if (cublasStatus_t s = run_lt(x, g, l, h.algo, 0); s != CUBLAS_STATUS_SUCCESS) {
      printf("  %-8s cublasLtMatmul: %s  %s\n", label, cublasGetStatusName(s), config.c_str());
      continue;
    }
    const double rel = rel_diff(x, g.c[0], ref, g.c_elems());
    const bool bad = !(rel <= kBadRel);
    const double us =
        time_graph(x, calls, [&](int i) { CUBLAS_CHECK(run_lt(x, g, l, h.algo, i % g.copies())); });
    printf("  %-8s %9.2f us  %7.0f GB/s  x%.2f  err %.1e%s  %s\n", label, us, gbps(us),
           p.default_us / us, rel, bad ? " BAD" : "", config.c_str());
    if (cand.label == "#0") p.first_us = us;
    if (!bad && (!p.has_best || us < p.best_us)) {
      p.has_best = true;
      p.best_us = us;
      p.best = h.algo;
      p.best_config = cand.label + " " + config;
    }
  }
  printf("  SUMMARY %s: default %.2f us | heuristic #0 %.2f us | best %.2f us (x%.2f) %s\n", g.name,
         p.default_us, p.first_us, p.best_us, p.has_best ? p.default_us / p.best_us : 0.0,
         p.has_best ? p.best_config.c_str() : "(none correct)");
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  lt_destroy(l);
  CUDA_CHECK(cudaFree(ref));
  return p;
}

// ---- one case: a model at T tokens ----
struct Row {
  std::string name;
  int64_t t;
  Probe down, up;
  double pair_default, pair_best;
};

// The GEMM g on the first `copies` buffer sets, operands A, B, C = set members ia, ib, ic.
constexpr int kPerSet = 5;  // hidden, w_down, latent, w_up (k then v), out (k then v)
Gemm on_sets(Gemm g, const std::vector<bf16*>& all, int copies, int ia, int ib, int ic) {
  for (int s = 0; s < copies; ++s) {
    g.a.push_back(all[kPerSet * s + ia]);
    g.b.push_back(all[kPerSet * s + ib]);
    g.c.push_back(all[kPerSet * s + ic]);
  }
  return g;
}

// The best correct Lt algo where the probe found one, else the default call.
void run_best(Ctx& x, const Gemm& g, const LtGemm& l, const Probe& p, int c) {
  if (p.has_best) {
    CUBLAS_CHECK(run_lt(x, g, l, p.best, c));
  } else {
    run_default(x, g, c);
  }
}

Row run_case(Ctx& x, const Model& md, int64_t t, int max_algos) {
  const int64_t d = md.d, r = md.r, n = md.n;
  const Gemm down_shape{"down", t, r, d, 1, 0, 0, 0, {}, {}, {}};
  const Gemm up_shape{"up", t, n, r, 2, 0, r * n, t * n, {}, {}, {}};
  const int cd = copies_for(down_shape.read_bytes()), cu = copies_for(up_shape.read_bytes());
  const int cp = copies_for(down_shape.read_bytes() + up_shape.read_bytes());
  const int sets = std::max({cd, cu, cp});
  printf("\n==== %s T=%lld (D=%lld R=%lld N=%lld), %d buffer sets\n", md.name, (long long)t,
         (long long)d, (long long)r, (long long)n, sets);
  const size_t sizes[kPerSet] = {size_t(t * d), size_t(d * r), size_t(t * r), size_t(2 * r * n),
                                 size_t(2 * t * n)};
  std::vector<bf16*> all(kPerSet * sets);
  for (int i = 0; i < kPerSet * sets; ++i) {
    CUDA_CHECK(cudaMalloc(&all[i], 2 * sizes[i % kPerSet]));
    fill_uniform<<<1024, 256>>>(all[i], sizes[i % kPerSet], i);  // outputs too: no harm
    CUDA_CHECK(cudaGetLastError());
  }
  CUDA_CHECK(cudaDeviceSynchronize());

  Row row{md.name, t, {}, {}, 0, 0};
  row.down = probe(x, on_sets(down_shape, all, cd, 0, 1, 2), max_algos);
  // The down runs wrote the latents; refill them so the up runs start from random inputs again.
  for (int s = 0; s < sets; ++s)
    fill_uniform<<<1024, 256>>>(all[kPerSet * s + 2], sizes[2], kPerSet * s + 2);
  CUDA_CHECK(cudaDeviceSynchronize());
  row.up = probe(x, on_sets(up_shape, all, cu, 2, 3, 4), max_algos);

  // The pair, down then up on the same set, as the library issues it.
  const Gemm pd = on_sets(down_shape, all, cp, 0, 1, 2), pu = on_sets(up_shape, all, cp, 2, 3, 4);
  LtGemm ld = lt_create(pd), lu = lt_create(pu);
  run_best(x, pd, ld, row.down, 0);  // first-use initialization outside the capture
  run_best(x, pu, lu, row.up, 0);
  const int calls = calls_for(cp);
  row.pair_default = time_graph(x, calls, [&](int i) {
    run_default(x, pd, i % cp);
    run_default(x, pu, i % cp);
  });
  row.pair_best = time_graph(x, calls, [&](int i) {
    run_best(x, pd, ld, row.down, i % cp);
    run_best(x, pu, lu, row.up, i % cp);
  });
  printf("\n  PAIR %s T=%lld (%d copies, %d calls/graph): default %.2f us, best %.2f us (x%.2f)\n",
         md.name, (long long)t, cp, calls, row.pair_default, row.pair_best,
         row.pair_default / row.pair_best);
  lt_destroy(ld);
  lt_destroy(lu);
  for (bf16* p : all) CUDA_CHECK(cudaFree(p));
  return row;
}

// ---- --split-down: the down GEMM as a batched GEMM over `chunks` slices of D (float32 partials),
// then a kernel that sums the partials in a fixed order and rounds to bf16: more CTAs on HBM. ----
__global__ void sum_partials(const float* partials, int chunks, size_t elems, bf16* latent) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x) {
    float total = 0.f;
    for (int c = 0; c < chunks; ++c) total += partials[c * elems + i];
    latent[i] = __float2bfloat16(total);
  }
}

void split_down_study(Ctx& x, const Model& md, int64_t t) {
  const int64_t d = md.d, r = md.r, n = md.n;
  const size_t read = 2 * (t * d + d * r + 2 * r * n);
  const int copies = copies_for(read), calls = calls_for(copies);
  struct Set {
    bf16 *hidden, *w_down, *latent, *w_up, *out;
    float* partials;
  };
  constexpr int kMaxChunks = 64;
  std::vector<Set> sets(copies);
  for (int i = 0; i < copies; ++i) {
    Set& st = sets[i];
    const size_t sizes[5] = {size_t(t * d), size_t(d * r), size_t(t * r), size_t(2 * r * n),
                             size_t(2 * t * n)};
    bf16** ptrs[5] = {&st.hidden, &st.w_down, &st.latent, &st.w_up, &st.out};
    for (int j = 0; j < 5; ++j) {
      CUDA_CHECK(cudaMalloc(ptrs[j], 2 * sizes[j]));
      fill_uniform<<<1024, 256>>>(*ptrs[j], sizes[j], 1000 * i + j);
      CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(cudaMalloc(&st.partials, sizeof(float) * kMaxChunks * t * r));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  auto down = [&](const Set& st) {
    CUBLAS_CHECK(cublasGemmEx_64(x.blas, CUBLAS_OP_N, CUBLAS_OP_N, r, t, d, &kAlpha, st.w_down,
                                 CUDA_R_16BF, r, st.hidden, CUDA_R_16BF, d, &kBeta, st.latent,
                                 CUDA_R_16BF, r, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  auto split_down = [&](const Set& st, int chunks) {
    const int64_t kc = d / chunks;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
        x.blas, CUBLAS_OP_N, CUBLAS_OP_N, r, t, kc, &kAlpha, st.w_down, CUDA_R_16BF, r, kc * r,
        st.hidden, CUDA_R_16BF, d, kc, &kBeta, st.partials, CUDA_R_32F, r, t * r, chunks,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    const size_t elems = size_t(t * r);
    sum_partials<<<(elems + 255) / 256, 256, 0, x.stream>>>(st.partials, chunks, elems,
                                                            st.latent);
    CUDA_CHECK(cudaGetLastError());
  };
  auto up = [&](const Set& st) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
        x.blas, CUBLAS_OP_N, CUBLAS_OP_N, n, t, r, &kAlpha, st.w_up, CUDA_R_16BF, n, r * n,
        st.latent, CUDA_R_16BF, r, 0, &kBeta, st.out, CUDA_R_16BF, n, t * n, 2,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  down(sets[0]);
  up(sets[0]);
  const double base_down = time_graph(x, calls, [&](int i) { down(sets[i % copies]); });
  const double base_pair = time_graph(x, calls, [&](int i) {
    down(sets[i % copies]);
    up(sets[i % copies]);
  });
  printf("SPLIT %s T=%lld: cuBLAS down %.2f us, down+up %.2f us\n", md.name, (long long)t,
         base_down, base_pair);
  for (int chunks : {2, 4, 8, 16, 32, 64}) {
    if (d % chunks != 0 || chunks > kMaxChunks) continue;
    split_down(sets[0], chunks);
    const double sd = time_graph(x, calls, [&](int i) { split_down(sets[i % copies], chunks); });
    const double sp = time_graph(x, calls, [&](int i) {
      split_down(sets[i % copies], chunks);
      up(sets[i % copies]);
    });
    printf("SPLIT %s T=%lld chunks=%d: down+sum %.2f us (x%.2f), +up %.2f us (x%.2f)\n",
           md.name, (long long)t, chunks, sd, base_down / sd, sp, base_pair / sp);
  }
  for (Set& st : sets) {
    for (void* p : {(void*)st.hidden, (void*)st.w_down, (void*)st.latent, (void*)st.w_up,
                    (void*)st.out, (void*)st.partials})
      CUDA_CHECK(cudaFree(p));
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int main(int argc, char** argv) {
  std::vector<Model> models = kModels;
  std::vector<int64_t> tokens = kTokens;
  int max_algos = 32;
  bool split_down = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--split-down") {
      split_down = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) break;
    const std::string value = argv[i + 1];
    if (flag == "--model") {
      models.clear();
      for (const auto& name : split(value))
        for (const auto& m : kModels)
          if (name == m.name) models.push_back(m);
    } else if (flag == "--tokens") {
      tokens.clear();
      for (const auto& v : split(value)) tokens.push_back(std::stoll(v));
    } else if (flag == "--max-algos") {
      max_algos = std::max(1, std::stoi(value));
    } else {
      fprintf(stderr, "usage: %s [--model v2lite,v3] [--tokens 1,16,64] [--max-algos 32] [--split-down]\n",
              argv[0]);
      return 2;
    }
  }
  if (models.empty() || tokens.empty()) {
    fprintf(stderr, "no model or no token count selected (models: v2lite, v3)\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);

  int dev = 0, sms = 0, l2 = 0;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  printf(
      "%s: %d SMs, L2 %d MiB | cuBLASLt %zu (header %d) | bf16 in/out, fp32 compute, ws 32 MiB\n",
      prop.name, sms, l2 >> 20, cublasLtGetVersion(), CUBLAS_VERSION);
  printf(
      "us = median graph replay / calls; GB/s = (A + B + C bytes, once each) / time; x = default"
      " / this;\nerr = max |this - default| / max |default| (BAD > %.0e); #r = heuristic rank\n",
      kBadRel);

  Ctx x{};
  CUBLAS_CHECK(cublasCreate(&x.blas));
  CUBLAS_CHECK(cublasLtCreate(&x.lt));
  CUDA_CHECK(cudaMalloc(&x.blas_ws, kWorkspaceBytes));
  CUDA_CHECK(cudaMalloc(&x.lt_ws, kWorkspaceBytes));
  CUDA_CHECK(cudaMalloc(&x.cmp, 2 * sizeof(unsigned)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasSetWorkspace(x.blas, x.blas_ws, kWorkspaceBytes));
  CUBLAS_CHECK(cublasSetStream(x.blas, x.stream));
  x.tile_names = enum_names("CUBLASLT_MATMUL_TILE_");
  x.stages_names = enum_names("CUBLASLT_MATMUL_STAGES_");
  x.cluster_names = enum_names("CUBLASLT_CLUSTER_SHAPE_");

  if (split_down) {
    for (const auto& m : models)
      for (int64_t t : tokens) split_down_study(x, m, t);
    return 0;
  }
  std::vector<Row> rows;
  for (const auto& m : models)
    for (int64_t t : tokens) rows.push_back(run_case(x, m, t, max_algos));

  printf(
      "\n==== SUMMARY (us per call; best = fastest cuBLASLt algo within %.0e of the default's "
      "result, even where slower than the default; x = default / best)\n",
      kBadRel);
  printf("%-8s %6s | %9s %9s %6s | %9s %9s %6s | %9s %9s %6s\n", "case", "T", "down def", "best",
         "x", "up def", "best", "x", "pair def", "best", "x");
  for (const auto& r : rows) {
    auto best = [](const Probe& p) { return p.has_best ? p.best_us : p.default_us; };
    printf("%-8s %6lld | %9.2f %9.2f %6.2f | %9.2f %9.2f %6.2f | %9.2f %9.2f %6.2f\n",
           r.name.c_str(), (long long)r.t, r.down.default_us, best(r.down),
           r.down.default_us / best(r.down), r.up.default_us, best(r.up),
           r.up.default_us / best(r.up), r.pair_default, r.pair_best, r.pair_default / r.pair_best);
  }
  for (const auto& r : rows) {
    printf("best %s T=%lld down: %s\n", r.name.c_str(), (long long)r.t,
           r.down.has_best ? r.down.best_config.c_str() : "default");
    printf("best %s T=%lld up:   %s\n", r.name.c_str(), (long long)r.t,
           r.up.has_best ? r.up.best_config.c_str() : "default");
  }

  CUDA_CHECK(cudaStreamDestroy(x.stream));
  CUDA_CHECK(cudaFree(x.cmp));
  CUDA_CHECK(cudaFree(x.lt_ws));
  CUDA_CHECK(cudaFree(x.blas_ws));
  CUBLAS_CHECK(cublasLtDestroy(x.lt));
  CUBLAS_CHECK(cublasDestroy(x.blas));
  return 0;
}
