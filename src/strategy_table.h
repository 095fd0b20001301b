// The strategy table: one row per strategy, and the one dispatcher over it. Each operation (the
// projection: Problem/Args; the MLA path: MlaProblem/MlaArgs) has its own table of rows
// (strategies.cpp, mla/strategies.cpp). A row says what the strategy is (name through its
// Strategy id, backend, dtypes), whether it takes a call (a Status naming the reason when not),
// whether the heuristics prefer it for a problem (heuristics.h holds every threshold), how much
// workspace it needs, and how to launch it.
//
// Dispatch (select_row): a forced strategy selects its row (the first whose id, backend and dtype
// match) and the call runs there or is refused with that row's reason. kAuto takes the row the
// heuristics prefer for the problem (at most one per backend and dtype) when it takes the call,
// else the first row in table order that takes it: the table's order is the fallback order.
// workspace_size() for kAuto (table_workspace) is the preferred row's workspace, and where that is
// not zero also enough for the first other row of the table, so a caller who allocates it gets
// the preferred strategy and, should the arguments rule that out (alignment), the fallback.
// A launch that is refused having enqueued nothing (kUnsupported: a cooperative launch the device
// cannot hold at that moment) runs, under kAuto, on the next row that takes the call (next_row).
#pragma once

#include <cstdint>
#include <string>

#include "latentkv/latentkv.h"

namespace latentkv::detail {

// A set of DTypes as bits.
using DTypeMask = unsigned;
constexpr DTypeMask dtype_bit(DType d) { return 1u << static_cast<unsigned>(d); }
constexpr DTypeMask kFloat32Only = dtype_bit(DType::kFloat32);
constexpr DTypeMask kHalfTypes = dtype_bit(DType::kBFloat16) | dtype_bit(DType::kFloat16);
constexpr DTypeMask kAllTypes = kFloat32Only | kHalfTypes;

template <typename ProblemT, typename ArgsT>
struct StrategyRow {
  Strategy id;  // to_string(id) is its name; a strategy may have one row per dtype family
  Backend backend;
  DTypeMask dtypes;
  // Can this strategy run the call? Looks at the problem, the arguments (alignment, workspace)
  // and the device's facts (compute capability), never at memory contents.
  Status (*takes)(const ProblemT&, const ArgsT&);
  // Is it the faster choice for this problem (heuristics.h)? At most one row of a backend and
  // dtype says so for a problem. Looks at the problem alone (any problem check() accepts), so
  // select_row finds the preferred row before asking any row to take the call.
  bool (*preferred)(const ProblemT&);
  // Bytes of args.workspace it needs for the problem (0: none); with_latent: the caller gives the
  // projection's latent output (MLA rows ignore it).
  int64_t (*workspace)(const ProblemT&, bool with_latent);
  // Enqueues the work on the stream. kUnsupported only when nothing was enqueued.
  Status (*launch)(const ProblemT&, const ArgsT&, Stream);
};

template <typename ProblemT, typename ArgsT>
struct StrategyTable {
  const StrategyRow<ProblemT, ArgsT>* rows;
  int size;
  const StrategyRow<ProblemT, ArgsT>* begin() const { return rows; }
  const StrategyRow<ProblemT, ArgsT>* end() const { return rows + size; }
};

// Whether some row could run a problem of p.dtype on `backend` (resolved) with `forced` (kAuto:
// any row), asking no row whether it takes the call; the refusal names the strategy, the backend
// or the dtype that has none. select_row's first step, and all that a call with nothing to
// compute (a zero dimension) needs.
template <typename ProblemT, typename ArgsT>
Status match_rows(const StrategyTable<ProblemT, ArgsT>& table, const ProblemT& p, Backend backend,
                  Strategy forced) {
  const DTypeMask dtype = dtype_bit(p.dtype);
  bool named = false;
  for (const auto& row : table) {
    if (forced != Strategy::kAuto && row.id != forced) continue;
    named = true;
    if (row.backend == backend && (row.dtypes & dtype)) return Status::Ok();
  }
  if (forced == Strategy::kAuto) {
    return {StatusCode::kUnsupported, std::string("problem.dtype = ") + to_string(p.dtype) +
                                          " is not supported by the " + to_string(backend) +
                                          " backend"};
  }
  if (!named) {
    return {StatusCode::kInvalidArgument, std::string("options.strategy = ") + to_string(forced) +
                                              " does not compute " + p.to_string()};
  }
  for (const auto& row : table) {
    if (row.id == forced && row.backend == backend) {
      return {StatusCode::kUnsupported, std::string("options.strategy = ") + to_string(forced) +
                                            " does not take problem.dtype = " + to_string(p.dtype)};
    }
  }
  return {StatusCode::kInvalidArgument, std::string("options.strategy = ") + to_string(forced) +
                                            " does not run on options.backend = " +
                                            to_string(backend)};
}

// The row that runs the call on `backend` (already resolved: kCpu or kCuda), or the refusal.
template <typename ProblemT, typename ArgsT>
Status select_row(const StrategyTable<ProblemT, ArgsT>& table, const ProblemT& p, const ArgsT& a,
                  Backend backend, Strategy forced, const StrategyRow<ProblemT, ArgsT>** out) {
  if (Status matched = match_rows(table, p, backend, forced); !matched.ok()) return matched;
  const DTypeMask dtype = dtype_bit(p.dtype);
  if (forced != Strategy::kAuto) {
    for (const auto& row : table) {
      if (row.id != forced || row.backend != backend || !(row.dtypes & dtype)) continue;
      Status takes = row.takes(p, a);
      if (takes.ok()) *out = &row;
      return takes;
    }
  }
  // kAuto. preferred() looks at the problem alone, so the preferred row is found without asking
  // any row to take the call: on the common path no refusal message is built.
  const auto matches = [&](const StrategyRow<ProblemT, ArgsT>& row) {
    return row.backend == backend && (row.dtypes & dtype);
  };
  const StrategyRow<ProblemT, ArgsT>* preferred = nullptr;
  for (const auto& row : table) {
    if (matches(row) && row.preferred(p)) {
      preferred = &row;
      break;
    }
  }
  if (preferred != nullptr && preferred->takes(p, a).ok()) {
    *out = preferred;
    return Status::Ok();
  }
  for (const auto& row : table) {
    if (matches(row) && &row != preferred && row.takes(p, a).ok()) {
      *out = &row;
      return Status::Ok();
    }
  }
  // No row takes the call: each one's reason.
  std::string reasons;
  StatusCode code = StatusCode::kUnsupported;
  for (const auto& row : table) {
    if (!matches(row)) continue;
    const Status takes = row.takes(p, a);
    if (takes.code() == StatusCode::kInvalidArgument) code = takes.code();
    reasons += std::string(reasons.empty() ? "" : "; ") + to_string(row.id) + ": " +
               takes.message();
  }
  return {code, std::string("no ") + to_string(backend) + " strategy takes " + p.to_string() +
                    ": " + reasons};
}

// Under kAuto, the row to run when `refused`'s launch came back kUnsupported having enqueued
// nothing: the first other row of the table, in table order, that takes the call; null if none.
template <typename ProblemT, typename ArgsT>
const StrategyRow<ProblemT, ArgsT>* next_row(const StrategyTable<ProblemT, ArgsT>& table,
                                             const ProblemT& p, const ArgsT& a,
                                             const StrategyRow<ProblemT, ArgsT>* refused) {
  for (const auto& row : table) {
    if (&row == refused || row.backend != refused->backend ||
        !(row.dtypes & dtype_bit(p.dtype))) {
      continue;
    }
    if (row.takes(p, a).ok()) return &row;
  }
  return nullptr;
}

// Workspace bytes for a call on `backend` (resolved) with `forced` (kAuto or a strategy).
template <typename ProblemT, typename ArgsT>
int64_t table_workspace(const StrategyTable<ProblemT, ArgsT>& table, const ProblemT& p,
                        Backend backend, Strategy forced, bool with_latent) {
  const DTypeMask dtype = dtype_bit(p.dtype);
  const StrategyRow<ProblemT, ArgsT>* preferred = nullptr;
  const StrategyRow<ProblemT, ArgsT>* first_other = nullptr;
  for (const auto& row : table) {
    if (row.backend != backend || !(row.dtypes & dtype)) continue;
    if (forced != Strategy::kAuto) {
      if (row.id == forced) return row.workspace(p, with_latent);
      continue;
    }
    if (preferred == nullptr && row.preferred(p)) {
      preferred = &row;
    } else if (first_other == nullptr) {
      first_other = &row;
    }
  }
  if (preferred == nullptr) return first_other ? first_other->workspace(p, with_latent) : 0;
  const int64_t own = preferred->workspace(p, with_latent);
  if (own == 0 || first_other == nullptr) return own;
  const int64_t other = first_other->workspace(p, with_latent);
  return own > other ? own : other;
}

}  // namespace latentkv::detail
