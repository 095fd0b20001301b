// latentkv-cases: prints the one case list (cases.h) as JSON on stdout, so the Python tests
// (python/tests/cases.py) run the same shapes as the C++ tests and the benchmark. One object:
//   {"random_seed": N, "random_count": N,
//    "lists": {"edge": [{"name", "batch", "seq", "model_dim", "rank", "heads", "head_dim",
//                        "dtype", "tags": [...]}, ...], "preset": [...], ...}}
// Names hold no characters that need escaping beyond '"' and '\\', which are escaped anyway.
#include <cstdio>
#include <string>

#include "cases.h"

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string case_json(const latentkv::testing::Case& c) {
  const latentkv::Problem& p = c.problem;
  std::string tags;
  for (const std::string& t : latentkv::testing::tag_names(c.tags)) {
    tags += (tags.empty() ? "" : ", ") + quoted(t);
  }
  return "{\"name\": " + quoted(c.name) + ", \"batch\": " + std::to_string(p.batch) +
         ", \"seq\": " + std::to_string(p.seq) + ", \"model_dim\": " + std::to_string(p.model_dim) +
         ", \"rank\": " + std::to_string(p.rank) + ", \"heads\": " + std::to_string(p.heads) +
         ", \"head_dim\": " + std::to_string(p.head_dim) + ", \"dtype\": " +
         quoted(latentkv::to_string(p.dtype)) + ", \"tags\": [" + tags + "]}";
}

}  // namespace

int main() {
  namespace t = latentkv::testing;
  std::string out = "{\"random_seed\": " + std::to_string(t::kRandomSeed) +
                    ", \"random_count\": " + std::to_string(t::kRandomCount) + ", \"lists\": {";
  bool first_list = true;
  for (const std::string& list : t::list_names()) {
    out += std::string(first_list ? "" : ",") + "\n  " + quoted(list) + ": [";
    first_list = false;
    bool first = true;
    for (const t::Case& c : t::cases_named(list)) {
      out += std::string(first ? "" : ",") + "\n    " + case_json(c);
      first = false;
    }
    out += "]";
  }
  out += "}}\n";
  return std::fputs(out.c_str(), stdout) < 0 ? 1 : 0;
}
