// EXPERIMENT (not shipped): where cuda-mla-gemm's prefill time goes, and which cuBLASLt algorithm
// each of its GEMMs should run. For DeepSeek-V2-Lite and V3 (bf16, no q_a) at T = 1024 and 4096:
//   path    the library's kBoth, kFirst (stage A GEMM + epilogue) and kSecond from args.latent /
//           args.k_pe (stage B's GEMMs + K's k_pe columns) calls, forced to cuda-mla-gemm;
//   A32     stage A's GEMM as shipped: ckv [T, 576] float32 = hidden [T, D] @ kv_a [576, D]^T;
//   A16     the same GEMM writing bf16;
//   BK, BV  stage B's GEMMs batched over heads: K[:, h, :128] / V[:, h, :] = c [T, 512] @
//           kv_b[h * 256 (+ 128) .. + 128]^T, written with K's / V's strides;
// each GEMM with the heuristic's first algorithm, then every other one it offers (up to 16) and
// split-K variants of the first (2..8 splits, each reduction scheme cuBLASLt accepts), each
// checked against the first's result before its time counts. Printed per algorithm: the config
// (tile, stages, split-K, reduction, swizzle, cluster), the heuristic's waves count, us, TFLOP/s.
// Timing: inputs rotated over enough copies that one pass reads >= 160 MiB (weights from HBM, as
// latentkv-bench rotates them), a CUDA graph of 20 calls, 3 warm-up replays, 15 timed replays,
// median replay / 20.
// Build (links the library for the path rows):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Itests/common
//     dev/mla_prefill_probe.cu build-X/tests/common/liblatentkv_testing.a build-X/src/liblatentkv.a
//     -lcublasLt -lcublas -o /tmp/mla_prefill_probe
//   /tmp/mla_prefill_probe [--quick | --profile]   (--quick: the path rows and the first
//   algorithms only; --profile: each case's kBoth call twice, eagerly, for ncu:
//   ncu --clock-control none -k regex:'^(?!fill_random)' --metrics gpu__time_duration.sum)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "latentkv/mla.h"
#include "mla_reference.h"

// A failed call ends the probe (a dev tool, not library code).
inline void fail_if(bool failed, const char* file, int line, const char* call, const char* why) {
  if (!failed) return;
  std::fprintf(stderr, "%s:%d %s: %s\n", file, line, call, why);
  std::exit(1);
}
#define CUDA_CHECK(x)                                                                        \
  do {                                                                                       \
    const cudaError_t e_ = (x);                                                              \
    fail_if(e_ != cudaSuccess, __FILE__, __LINE__, #x, cudaGetErrorString(e_));              \
  } while (0)
#define LT_CHECK(x)                                                                          \
  do {                                                                                       \
    const cublasStatus_t s_ = (x);                                                           \
    fail_if(s_ != CUBLAS_STATUS_SUCCESS, __FILE__, __LINE__, #x, cublasGetStatusName(s_));   \
  } while (0)

namespace {

constexpr int64_t kRotateBytes = int64_t{160} << 20;
constexpr int kCallsPerGraph = 20;
constexpr size_t kScratch = size_t{32} << 20;

__global__ void fill_random(__nv_bfloat16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(scale * (static_cast<float>(h & 0xffff) / 32768.f - 1.f));
  }
}

void* device_random(int64_t elements, uint32_t seed, float scale = 1.f) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, elements * 2));
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), elements, seed, scale);
  CUDA_CHECK(cudaGetLastError());
  return p;
}

// Median us per call of `calls` issued by enqueue(i, stream) into a graph.
double time_graph(const std::function<void(int, cudaStream_t)>& enqueue, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCallsPerGraph; ++i) enqueue(i, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> ms;
  for (int i = 0; i < 15; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return ms[ms.size() / 2] * 1e3 / kCallsPerGraph;
}

// Row-major C[b] (M x N) = A[b] (M x K) @ W[b]^T, W [N, K] rows of ldw: Lt's TN product as
// src/cuda/lt_matmul.h issues it (Lt A = W, Lt B = A, C column-major N x M).
struct Gemm {
  const char* name;
  int64_t batches, m, n, k;
  int64_t lda, a_stride;  // activations
  int64_t ldw, w_stride;  // weights
  int64_t ldc, c_stride;
  cudaDataType_t out;
  std::vector<const void*> a, w;  // rotated copies
  void* c;
};

struct LtGemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
};

void layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
            int64_t batches, int64_t stride) {
  LT_CHECK(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
  if (batches > 1) {
    const int32_t count = static_cast<int32_t>(batches);
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                              sizeof count));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride, sizeof stride));
  }
}

LtGemm describe(const Gemm& g) {
  LtGemm d;
  LT_CHECK(cublasLtMatmulDescCreate(&d.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op = CUBLAS_OP_T;
  LT_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op));
  layout(&d.la, CUDA_R_16BF, g.k, g.n, g.ldw, g.batches, g.w_stride);
  layout(&d.lb, CUDA_R_16BF, g.k, g.m, g.lda, g.batches, g.a_stride);
  layout(&d.lc, g.out, g.n, g.m, g.ldc, g.batches, g.c_stride);
  return d;
}

template <typename T>
T config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written);
  return v;
}

std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "id %d tile %u stages %u splitk %u red %u swz %u cluster %u",
                config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
                config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  return buf;
}

// Max |x - ref| / max |ref| over C's first rows (enough to catch a broken algorithm).
double compare(const Gemm& g, const std::vector<float>& ref, std::vector<float>* out) {
  const int64_t elems = std::min<int64_t>(g.m, 64) * g.ldc;
  std::vector<uint16_t> half(g.out == CUDA_R_32F ? 0 : elems);
  out->assign(elems, 0.f);
  if (g.out == CUDA_R_32F) {
    CUDA_CHECK(cudaMemcpy(out->data(), g.c, elems * 4, cudaMemcpyDeviceToHost));
  } else {
    CUDA_CHECK(cudaMemcpy(half.data(), g.c, elems * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < elems; ++i) {
      const uint32_t bits = static_cast<uint32_t>(half[i]) << 16;
      std::memcpy(&(*out)[i], &bits, 4);
    }
  }
  if (ref.empty()) return 0;
  double err = 0, scale = 0;
  for (int64_t i = 0; i < elems; ++i) {
    err = std::max(err, std::fabs(static_cast<double>((*out)[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return err / std::max(scale, 1e-30);
}

void probe_gemm(cublasLtHandle_t lt, Gemm& g, void* scratch, cudaStream_t stream, bool quick) {
  LtGemm d = describe(g);
  cublasLtMatmulPreference_t pref;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kScratch;
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t results[16];
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, d.desc, d.la, d.lb, d.lc, d.lc, pref,
                                          quick ? 1 : 16, results, &found));
  struct Candidate {
    cublasLtMatmulAlgo_t algo;
    float waves;
    std::string tag;
  };
  std::vector<Candidate> candidates;
  for (int i = 0; i < found; ++i) {
    candidates.push_back({results[i].algo, results[i].wavesCount, "h" + std::to_string(i)});
  }
  if (!quick && found > 0) {
    for (uint32_t splits : {2u, 3u, 4u, 6u, 8u}) {
      for (uint32_t red : {uint32_t{CUBLASLT_REDUCTION_SCHEME_INPLACE},
                           uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE},
                           uint32_t{CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}}) {
        cublasLtMatmulAlgo_t algo = results[0].algo;
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                             sizeof splits);
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                             sizeof red);
        cublasLtMatmulHeuristicResult_t checked{};
        if (cublasLtMatmulAlgoCheck(lt, d.desc, d.la, d.lb, d.lc, d.lc, &algo, &checked) ==
                CUBLAS_STATUS_SUCCESS &&
            checked.workspaceSize <= kScratch) {
          candidates.push_back({algo, checked.wavesCount,
                                "s" + std::to_string(splits) + "r" + std::to_string(red)});
        }
      }
    }
  }
  const double flops = 2.0 * g.batches * g.m * g.n * g.k;
  const float alpha = 1.f, beta = 0.f;
  std::vector<float> ref, out;
  double first_us = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& cand = candidates[i];
    auto call = [&](int j, cudaStream_t s) {
      const size_t copy = static_cast<size_t>(j) % g.a.size();
      LT_CHECK(cublasLtMatmul(lt, d.desc, &alpha, g.w[copy], d.la, g.a[copy], d.lb, &beta, g.c,
                              d.lc, g.c, d.lc, &cand.algo, scratch, kScratch, s));
    };
    const int64_t checked_bytes =
        std::min<int64_t>(g.m, 64) * g.ldc * (g.out == CUDA_R_32F ? 4 : 2);
    CUDA_CHECK(cudaMemset(g.c, 0, checked_bytes));
    call(0, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double err = compare(g, ref, &out);
    if (i == 0) ref = out;
    if (err > 2e-2) {
      std::printf("  %-8s %-4s %-62s waves %5.2f  WRONG (rel err %.3g)\n", g.name,
                  cand.tag.c_str(), describe_algo(cand.algo).c_str(), cand.waves, err);
      continue;
    }
    const double us = time_graph(call, stream);
    if (i == 0) first_us = us;
    std::printf("  %-8s %-4s %-62s waves %5.2f  %8.2f us  %6.1f TFLOP/s  %5.2fx\n", g.name,
                cand.tag.c_str(), describe_algo(cand.algo).c_str(), cand.waves, us,
                flops / us * 1e-6, first_us / us);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(d.la);
  cublasLtMatrixLayoutDestroy(d.lb);
  cublasLtMatrixLayoutDestroy(d.lc);
  cublasLtMatmulDescDestroy(d.desc);
}

struct Model {
  const char* name;
  int64_t d, heads;
};

// The library's MLA calls, forced to cuda-mla-gemm (bf16, vLLM's RoPE form, dense cache).
void probe_path(const Model& model, int64_t t, cudaStream_t stream, bool profile) {
  using namespace latentkv;
  MlaProblem p = latentkv::testing::mla_shape(model.d, 0, 512, 64, model.heads, 128, 128);
  p.seq = t;
  const int64_t max_pos = 8192;
  const int64_t set_bytes = 2 * (t * model.d + 576 * model.d + p.kv_b_rows() * 512);
  const int copies =
      static_cast<int>(std::max<int64_t>(1, (kRotateBytes + set_bytes - 1) / set_bytes));
  std::vector<const void*> hidden, kv_a, kv_b;
  for (int i = 0; i < copies; ++i) {
    hidden.push_back(device_random(t * model.d, 11 + i));
    kv_a.push_back(device_random(576 * model.d, 101 + i, 0.02f));
    kv_b.push_back(device_random(p.kv_b_rows() * 512, 1001 + i, 0.05f));
  }
  void* gamma = device_random(512, 7, 1.f);
  void* k = nullptr;
  void* v = nullptr;
  void* cache = nullptr;
  CUDA_CHECK(cudaMalloc(&k, t * model.heads * 192 * 2));
  CUDA_CHECK(cudaMalloc(&v, t * model.heads * 128 * 2));
  CUDA_CHECK(cudaMalloc(&cache, t * 576 * 2));
  std::vector<int64_t> pos_host(t);
  for (int64_t i = 0; i < t; ++i) pos_host[i] = i;
  int64_t* pos = nullptr;
  CUDA_CHECK(cudaMalloc(&pos, t * 8));
  CUDA_CHECK(cudaMemcpy(pos, pos_host.data(), t * 8, cudaMemcpyHostToDevice));
  std::vector<float> table_host(max_pos * 64);
  for (int64_t i = 0; i < max_pos; ++i) {
    for (int j = 0; j < 32; ++j) {
      const double angle = i * std::pow(10000.0, -j / 32.0);
      table_host[i * 64 + j] = static_cast<float>(std::cos(angle));
      table_host[i * 64 + 32 + j] = static_cast<float>(std::sin(angle));
    }
  }
  float* table = nullptr;
  CUDA_CHECK(cudaMalloc(&table, table_host.size() * 4));
  CUDA_CHECK(cudaMemcpy(table, table_host.data(), table_host.size() * 4, cudaMemcpyHostToDevice));
  Options options;
  options.strategy = Strategy::kCudaMlaGemm;
  options.stream = stream;
  void* workspace = nullptr;
  const int64_t ws_bytes = workspace_size(p, options);
  CUDA_CHECK(cudaMalloc(&workspace, ws_bytes));
  for (MlaStage stage : {MlaStage::kBoth, MlaStage::kFirst, MlaStage::kSecond}) {
    if (profile && stage != MlaStage::kBoth) break;
    MlaProblem q = p;
    q.stage = stage;
    auto args_for = [&](int copy) {
      MlaArgs a = contiguous_mla_args(q);
      if (stage != MlaStage::kSecond) {
        a.hidden = hidden[copy];
        a.kv_a_weight = kv_a[copy];
        a.kv_a_norm_weight = gamma;
        a.positions = pos;
        a.cos_sin_cache = table;
        a.max_position = max_pos;
        a.kv_cache = cache;
        a.num_slots = t;
      } else {
        a.latent = cache;  // c: the cache rows' first 512 values
        a.latent_stride_seq = 576;
        a.latent_stride_batch = t * 576;
        a.k_pe = static_cast<const char*>(cache) + 512 * 2;
        a.k_pe_stride_seq = 576;
        a.k_pe_stride_batch = t * 576;
      }
      if (stage != MlaStage::kFirst) {
        a.kv_b_weight = kv_b[copy];
        a.k = k;
        a.v = v;
      }
      a.workspace = workspace;
      a.workspace_bytes = ws_bytes;
      return a;
    };
    const Status s = check(q, args_for(0), options);
    if (!s.ok()) {
      std::printf("  path %s refused: %s\n", to_string(stage), s.message().c_str());
      continue;
    }
    if (profile) {
      for (int j = 0; j < 2; ++j) {
        const Status r = run(q, args_for(j % copies), options);
        if (!r.ok()) std::printf("run failed: %s\n", r.message().c_str());
      }
      CUDA_CHECK(cudaStreamSynchronize(stream));
      continue;
    }
    const double us = time_graph(
        [&](int j, cudaStream_t) {
          const Status r = run(q, args_for(j % copies), options);
          if (!r.ok()) std::printf("run failed: %s\n", r.message().c_str());
        },
        stream);
    std::printf("  path %-8s %8.2f us  %6.1f TFLOP/s\n", to_string(stage), us,
                q.flops() / us * 1e-6);
  }
  for (auto* ptrs : {&hidden, &kv_a, &kv_b}) {
    for (const void* ptr : *ptrs) CUDA_CHECK(cudaFree(const_cast<void*>(ptr)));
  }
  for (void* ptr : {gamma, k, v, cache, static_cast<void*>(pos), static_cast<void*>(table),
                    workspace}) {
    CUDA_CHECK(cudaFree(ptr));
  }
}

void probe_model(cublasLtHandle_t lt, const Model& model, int64_t t, void* scratch,
                 cudaStream_t stream, bool quick, bool profile) {
  std::printf("== %s T=%lld\n", model.name, static_cast<long long>(t));
  probe_path(model, t, stream, profile);
  if (profile) return;
  const int64_t h = model.heads, d = model.d;
  const int64_t a_copies = std::max<int64_t>(1, kRotateBytes / (2 * (t * d + 576 * d)) + 1);
  const int64_t b_copies = std::max<int64_t>(1, kRotateBytes / (2 * (t * 512 + h * 256 * 512)) + 1);
  std::vector<const void*> hidden, kv_a, c, kv_b;
  for (int64_t i = 0; i < a_copies; ++i) {
    hidden.push_back(device_random(t * d, 21 + i));
    kv_a.push_back(device_random(576 * d, 201 + i, 0.02f));
  }
  for (int64_t i = 0; i < b_copies; ++i) {
    c.push_back(device_random(t * 512, 31 + i));
    kv_b.push_back(device_random(h * 256 * 512, 301 + i, 0.05f));
  }
  std::vector<const void*> kv_b_v;
  for (const void* w : kv_b) kv_b_v.push_back(static_cast<const char*>(w) + 128 * 512 * 2);
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, std::max(t * 576 * 4, t * h * 192 * 2)));
  Gemm gemms[] = {
      {"A32", 1, t, 576, d, d, 0, d, 0, 576, 0, CUDA_R_32F, hidden, kv_a, out},
      {"A16", 1, t, 576, d, d, 0, d, 0, 576, 0, CUDA_R_16BF, hidden, kv_a, out},
      {"BK", h, t, 128, 512, 512, 0, 512, 256 * 512, h * 192, 192, CUDA_R_16BF, c, kv_b, out},
      {"BV", h, t, 128, 512, 512, 0, 512, 256 * 512, h * 128, 128, CUDA_R_16BF, c, kv_b_v, out},
  };
  for (Gemm& g : gemms) probe_gemm(lt, g, scratch, stream, quick);
  for (auto* ptrs : {&hidden, &kv_a, &c, &kv_b}) {
    for (const void* ptr : *ptrs) CUDA_CHECK(cudaFree(const_cast<void*>(ptr)));
  }
  CUDA_CHECK(cudaFree(out));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool profile = argc > 1 && std::strcmp(argv[1], "--profile") == 0;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, cuBLASLt %zu\n", prop.name, prop.multiProcessorCount,
              cublasLtGetVersion());
  cublasLtHandle_t lt;
  LT_CHECK(cublasLtCreate(&lt));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* scratch = nullptr;
  CUDA_CHECK(cudaMalloc(&scratch, kScratch));
  const Model models[] = {{"deepseek-v2-lite", 2048, 16}, {"deepseek-v3", 7168, 128}};
  for (const Model& m : models) {
    for (int64_t t : {int64_t{1024}, int64_t{4096}}) {
      probe_model(lt, m, t, scratch, stream, quick, profile);
    }
  }
  CUDA_CHECK(cudaFree(scratch));
  LT_CHECK(cublasLtDestroy(lt));
  return 0;
}
