// PLACEHOLDER: replaced by the blocked CPU backend.
#include "backends.h"
namespace latentkv::detail {
Status run_cpu_blocked(const Problem&, const Args&) { return {StatusCode::kUnsupported, "todo"}; }
}  // namespace latentkv::detail
