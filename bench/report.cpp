// Human and JSON output of latentkv-bench. Numbers that were not measured (a refused fused call,
// the launch timing on the CPU, a floor without ceilings) print as "-" and as JSON null, never as
// a made-up zero.
#include "report.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace latentkv::bench {
namespace {

bool known(double v) { return std::isfinite(v); }

// "%.3g" of a value, or "-" when it was not measured.
std::string num(double v, const char* format = "%.3g") {
  if (!known(v)) return std::isinf(v) ? "inf" : "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// Three significant digits without an exponent for the ranges times and rates take.
std::string fixed(double v) {
  if (!known(v)) return num(v);
  const double a = std::fabs(v);
  return num(v, a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : "%.3g");
}

std::string describe_problem(const BenchCase& c) {
  std::ostringstream s;
  s << c.to_string() << " (T=" << c.tokens() << ", " << fixed(c.flops() * 1e-6) << " MFLOP, "
    << fixed(c.min_bytes() * 1e-6) << " MB min)";
  return s.str();
}

std::string stats_line(const Stats& s, const char* what) {
  if (!s.valid()) return "-";
  return fixed(s.median_us) + " us/call (min " + fixed(s.min_us) + ", p90 " + fixed(s.p90_us) + "; " +
         std::to_string(s.samples) + " " + what + ")";
}

std::string verdict(const CaseResult& r) {
  switch (r.outcome) {
    case Outcome::kPass: return "PASS";
    case Outcome::kFail: return "FAIL";
    case Outcome::kRefused: return "REFUSED";
    case Outcome::kSkipped: return "SKIPPED";
    case Outcome::kError: return "ERROR";
  }
  return "?";
}

std::string backend_strategy(const CaseResult& r) {
  // kAuto after the run means no strategy took the problem.
  return std::string(to_string(r.backend)) + "/" +
         (r.strategy == Strategy::kAuto ? "-" : to_string(r.strategy));
}

bool on_gpu(const CaseResult& r) { return r.backend == Backend::kCuda; }

void print_path(FILE* to, const char* label, const std::string& who, const PathResult& path,
                const CaseResult& r, const std::string& verdict_text) {
  const std::string err = num(path.error);
  std::fprintf(to, "  %-9s %-20s err %s%s%s\n", label, who.c_str(), err.c_str(),
               verdict_text.empty() ? "" : "  ", verdict_text.c_str());
  if (on_gpu(r)) {
    const std::string sets =
        r.input_sets > 1 ? " over " + std::to_string(r.input_sets) + " input sets" : "";
    const std::string graph = "graph of " + std::to_string(r.calls_per_graph) + " calls" + sets +
                              ": " + stats_line(path.time, "replays");
    std::fprintf(to, "            %s\n", graph.c_str());
    std::fprintf(to, "            back to back from C++: %s\n",
                 stats_line(path.launch, "loops").c_str());
  } else {
    std::fprintf(to, "            %s\n", stats_line(path.time, "runs").c_str());
  }
}

// A small JSON writer: keys in insertion order, non-finite numbers as null.
class Json {
 public:
  Json& add(const char* key, double v) { return raw(key, known(v) ? num(v, "%.6g") : "null"); }
  Json& add(const char* key, int64_t v) { return raw(key, std::to_string(v)); }
  Json& add(const char* key, int v) { return raw(key, std::to_string(v)); }
  Json& add(const char* key, bool v) { return raw(key, v ? "true" : "false"); }
  Json& add(const char* key, const std::string& v) { return raw(key, quote(v)); }
  Json& add(const char* key, const char* v) { return raw(key, quote(v)); }
  Json& add(const char* key, const Json& v) { return raw(key, v.str()); }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  Json& raw(const char* key, const std::string& value) {
    if (!body_.empty()) body_ += ",";
    body_ += quote(key) + ":" + value;
    return *this;
  }
  static std::string quote(const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        q += '\\';
        q += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        q += buf;
      } else {
        q += c;
      }
    }
    return q + "\"";
  }
  std::string body_;
};

Json stats_json(const Stats& s) {
  if (!s.valid()) return Json();
  return Json()
      .add("median", s.median_us)
      .add("min", s.min_us)
      .add("p90", s.p90_us)
      .add("samples", s.samples);
}

Json path_json(const PathResult& path, const CaseResult& r) {
  Json j;
  j.add("ran", path.ran).add("error", path.error);
  j.add("time_us", stats_json(path.time));
  if (on_gpu(r)) j.add("back_to_back_us", stats_json(path.launch));
  return j;
}

}  // namespace

void print_header(FILE* to, const RunInfo& run) {
  const TimingConfig& t = run.timing;
  std::fprintf(to, "latentkv-bench: backend %s (%s)\n", to_string(run.backend), run.why.c_str());
  if (run.gpu != nullptr) {
    const GpuInfo& g = *run.gpu;
    std::fprintf(to, "  device: %s, sm_%d%d, %d SMs, L2 %.0f MiB\n", g.name.c_str(),
                 g.compute_major, g.compute_minor, g.sm_count, g.l2_bytes / 1048576.0);
    std::fprintf(to, "  launch floor: empty kernel %s us/call in a graph, %s us/call back to back\n",
                 fixed(g.empty_graph.median_us).c_str(), fixed(g.empty_loop.median_us).c_str());
    std::string gemm;
    for (const auto& [dtype, rate] : g.gemm_tflop_per_s) {
      gemm += std::string(", cuBLAS GEMM ") + to_string(dtype) + " " + fixed(rate) + " TFLOP/s";
    }
    std::fprintf(to, "  ceilings (measured now): copy %s GB/s%s\n", fixed(g.copy_gb_per_s).c_str(),
                 gemm.c_str());
    std::fprintf(to,
                 "  timing: CUDA events; per call = graph replay / calls, median of up to %d "
                 "replays after %d warm-up; inputs %s\n",
                 t.iters, t.warmup,
                 t.rotate ? "rotated through copies that spill L2 when one fits" : "not rotated");
  } else {
    std::fprintf(to,
                 "  timing: std::chrono wall time per call, median of up to %d runs after %d "
                 "warm-up (at most ~%.3g s per measurement)\n",
                 t.iters, t.warmup, t.seconds);
  }
}

void print_case(FILE* to, const CaseResult& r) {
  const int64_t tokens = r.bench_case.tokens();
  std::fprintf(to, "\n%s: %s\n", r.bench_case.name.c_str(),
               describe_problem(r.bench_case).c_str());
  if (r.outcome == Outcome::kSkipped) {
    std::fprintf(to, "  skipped: %s\n", r.message.c_str());
    return;
  }
  if (r.fused.ran) {
    const std::string checked = r.checked_tokens == tokens
                                    ? "all " + std::to_string(tokens) + " token" +
                                          (tokens == 1 ? "" : "s")
                                    : std::to_string(r.checked_tokens) + " of " +
                                          std::to_string(tokens) + " tokens";
    print_path(to, "fused", backend_strategy(r), r.fused, r,
               "tolerance " + num(r.tolerance) + " (" + checked + ")  " + verdict(r));
    if (!r.error_detail.empty()) {
      std::fprintf(to, "            by output: %s\n", r.error_detail.c_str());
    }
  }
  if (!r.message.empty()) {
    std::fprintf(to, "  %-9s %s (%s): %s\n", "fused", verdict(r).c_str(), to_string(r.refusal),
                 r.message.c_str());
  }
  if (r.baseline.ran) print_path(to, "baseline", r.baseline_name, r.baseline, r, "");
  if (!r.fused.time.valid()) return;
  std::string line = "speedup " + (known(r.speedup()) ? fixed(r.speedup()) + "x" : "-");
  if (on_gpu(r)) line += " (graph), " + fixed(r.speedup_launch()) + "x (back to back)";
  line += "; " + fixed(r.gb_per_s()) + " GB/s, " + fixed(r.tflop_per_s()) + " TFLOP/s";
  if (known(r.floor.us)) {
    line += "; floor " + fixed(r.floor.us) + " us (" + r.floor.bound + "): " +
            num(r.pct_of_floor(), "%.0f") + "% of floor";
  }
  if (on_gpu(r) && known(r.launch_floor_loop_us)) {
    line += "; back to back " + fixed(r.fused.launch.median_us / r.launch_floor_loop_us) +
            "x an empty kernel";
  }
  std::fprintf(to, "  %s\n", line.c_str());
}

void print_table(FILE* to, const std::vector<CaseResult>& results) {
  int name_width = 18;  // the case column fits the longest name
  for (const CaseResult& r : results) {
    name_width = std::max(name_width, static_cast<int>(r.bench_case.name.size()));
  }
  std::fprintf(to, "\n%-*s %-22s %-9s %9s %9s %8s %8s %8s %7s  %s\n", name_width, "case",
               "backend/strategy", "err", "fused us", "base us", "speedup", "GB/s", "TFLOP/s",
               "floor%", "result");
  for (const CaseResult& r : results) {
    const bool timed = r.fused.time.valid();
    std::fprintf(to, "%-*s %-22s %-9s %9s %9s %8s %8s %8s %7s  %s\n", name_width,
                 r.bench_case.name.c_str(), backend_strategy(r).c_str(),
                 num(r.fused.error, "%.2e").c_str(), fixed(r.fused.time.median_us).c_str(),
                 fixed(r.baseline.time.median_us).c_str(),
                 timed && known(r.speedup()) ? (fixed(r.speedup()) + "x").c_str() : "-",
                 timed ? fixed(r.gb_per_s()).c_str() : "-",
                 timed ? fixed(r.tflop_per_s()).c_str() : "-",
                 timed ? num(r.pct_of_floor(), "%.0f%%").c_str() : "-", verdict(r).c_str());
  }
  int count = 0;
  const double graph = geomean_speedup(results, false, &count);
  if (count < 2) return;
  std::string line = "geometric mean of the speedups over " + std::to_string(count) +
                     " timed cases: " + fixed(graph) + "x";
  if (!results.empty() && on_gpu(results.front())) {
    int loops = 0;
    const double launch = geomean_speedup(results, true, &loops);
    line += " (graph), " + fixed(launch) + "x (back to back, " + std::to_string(loops) + " cases)";
  }
  std::fprintf(to, "%s\n", line.c_str());
}

double geomean_speedup(const std::vector<CaseResult>& results, bool back_to_back, int* count) {
  double log_sum = 0;
  *count = 0;
  for (const CaseResult& r : results) {
    if (!r.fused.time.valid()) continue;
    const double s = back_to_back ? r.speedup_launch() : r.speedup();
    if (!(s > 0) || !std::isfinite(s)) continue;  // a baseline that was not timed
    log_sum += std::log(s);
    ++*count;
  }
  return *count > 0 ? std::exp(log_sum / *count) : kNaN;
}

std::string case_summary(const CaseResult& r) {
  std::string s = verdict(r);
  if (r.fused.time.valid()) {
    s += ", fused " + fixed(r.fused.time.median_us) + " us";
    if (known(r.speedup())) s += ", speedup " + fixed(r.speedup()) + "x";
  } else if (!r.message.empty()) {
    s += ": " + r.message;
  }
  return s;
}

std::string case_json(const CaseResult& r) {
  const BenchCase& c = r.bench_case;
  const Problem& p = c.problem;
  const bool timed = r.fused.time.valid();
  Json shape;
  if (c.mla) {
    const MlaProblem& m = c.mla_problem;
    shape.add("batch", m.batch)
        .add("seq", m.seq)
        .add("model_dim", m.model_dim)
        .add("q_rank", m.q_rank)
        .add("kv_rank", m.kv_rank)
        .add("rope_dim", m.rope_dim)
        .add("heads", m.heads)
        .add("nope_dim", m.nope_dim)
        .add("v_dim", m.v_dim)
        .add("tokens", m.tokens())
        .add("stage", to_string(m.stage))
        .add("rope_style", to_string(m.rope_style))
        .add("rope_dtype", to_string(m.rope_dtype))
        .add("rope_form", testing::to_string(c.rope_form));
  } else {
    shape.add("batch", p.batch)
        .add("seq", p.seq)
        .add("model_dim", p.model_dim)
        .add("rank", p.rank)
        .add("heads", p.heads)
        .add("head_dim", p.head_dim)
        .add("tokens", p.tokens())
        .add("kv_width", p.kv_width());
  }
  Json j;
  j.add("case", r.bench_case.name)
      .add("shape", shape)
      .add("operation", c.mla ? "mla" : "projection")
      .add("dtype", to_string(c.dtype()))
      .add("backend", to_string(r.backend))
      .add("strategy", to_string(r.strategy))
      .add("device", r.device)
      .add("result", to_string(r.outcome))
      .add("status", to_string(r.refusal))
      .add("message", r.message)
      .add("error", r.fused.error)
      .add("tolerance", r.tolerance)
      .add("error_detail", r.error_detail)
      .add("checked_tokens", r.checked_tokens)
      .add("baseline", r.baseline_name)
      .add("baseline_error", r.baseline.error)
      .add("input_sets", r.input_sets)
      .add("calls_per_graph", r.calls_per_graph)
      .add("fused", path_json(r.fused, r))
      .add("unfused", path_json(r.baseline, r))
      .add("speedup", timed ? r.speedup() : kNaN)
      .add("speedup_back_to_back", timed && on_gpu(r) ? r.speedup_launch() : kNaN)
      .add("bytes", c.min_bytes())
      .add("flops", c.flops())
      .add("gb_per_s", timed ? r.gb_per_s() : kNaN)
      .add("tflop_per_s", timed ? r.tflop_per_s() : kNaN)
      .add("floor_us", r.floor.us)
      .add("floor_bound", r.floor.bound)
      .add("pct_of_floor", timed ? r.pct_of_floor() : kNaN)
      .add("empty_kernel_graph_us", r.launch_floor_graph_us)
      .add("empty_kernel_back_to_back_us", r.launch_floor_loop_us);
  return j.str();
}

}  // namespace latentkv::bench
