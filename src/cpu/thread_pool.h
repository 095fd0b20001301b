// The CPU backend's threads: one persistent pool shared by cpu-blocked and cpu-mla, made on the
// first call big enough to use it. parallel_items hands out work items through a shared counter to
// the calling thread and up to threads - 1 pool workers, and returns when every item is done (a
// barrier between the phases of a call). The caller always works too, so a call never waits for a
// worker that does not come (a forked child has none); a call that finds the pool busy with another
// thread's job runs its items alone.
#pragma once

#include <cstdint>

namespace latentkv::detail {

// Threads a call may use: the pool's workers plus the caller (1 when no pool can be made).
int cpu_threads_available();

// body(ctx, item) for every item in [0, count), on at most `threads` threads (the caller's
// included). body must not throw.
void parallel_items(int64_t count, int threads, void (*body)(const void* ctx, int64_t item),
                    const void* ctx);

// The same for a callable f(item).
template <class F>
void parallel_for(int64_t count, int threads, const F& f) {
  parallel_items(
      count, threads, [](const void* ctx, int64_t item) { (*static_cast<const F*>(ctx))(item); },
      &f);
}

}  // namespace latentkv::detail
