// The CPU backend's persistent thread pool behind parallel_items (thread_pool.h).
#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace latentkv::detail {
namespace {

constexpr int kMaxWorkers = 63;
// How long a worker polls for the next job before it sleeps (see spin_while_unchanged).
constexpr std::chrono::microseconds kSpin{100};

// Work items [0, count), each handed out once through a shared counter.
struct Job {
  void (*body)(const void* ctx, int64_t item) = nullptr;
  const void* ctx = nullptr;
  int64_t count = 0;
  std::atomic<int64_t> next{0};

  void drain() {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) body(ctx, i);
  }
};

// A persistent pool: made on the first call big enough to use it, its workers sleep on a condition
// variable between calls. The calling thread always works too and a job ends when its items are
// done and the workers that joined it have left, so a call never waits for a worker that does not
// come (a forked child has none); a call that finds the pool busy with another thread's job runs
// alone. Never destroyed: workers asleep at exit die with the process, with no join at static
// destruction time.
class ThreadPool {
 public:
  // The pool, or null when it cannot be made.
  static ThreadPool* instance() {
    static ThreadPool* pool = [] {
      try {
        return new ThreadPool();
      } catch (const std::exception&) {
        return static_cast<ThreadPool*>(nullptr);
      }
    }();
    return pool;
  }

  int workers() const { return static_cast<int>(threads_.size()); }

  // Runs job on the caller and at most `helpers` workers; returns when every item is done.
  void run(Job& job, int helpers) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || helpers <= 0) {
      job.drain();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      slots_ = helpers;
      ++generation_;
    }
    wake_.notify_all();
    job.drain();
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = nullptr;  // closed: no worker joins any more
    done_.wait(lock, [this] { return active_ == 0; });
  }

 private:
  ThreadPool() {
    const int wanted = std::min<int>(kMaxWorkers, std::thread::hardware_concurrency()) - 1;
    for (int i = 0; i < wanted; ++i) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        break;  // fewer workers (maybe none): the caller does the rest
      }
    }
  }

  void work() {
    uint64_t seen = generation_.load();
    for (;;) {
      spin_while_unchanged(seen);
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_ != seen && job_ != nullptr && slots_ > 0; });
      seen = generation_;
      --slots_;
      ++active_;
      Job* job = job_;
      lock.unlock();
      job->drain();
      lock.lock();
      if (--active_ == 0) done_.notify_one();
    }
  }

  // Before sleeping, a worker polls for the next job for up to kSpin: a condition-variable wake-up
  // takes ~20 us here, two tiles' worth of the founding case, and back-to-back calls (a layer loop,
  // a benchmark) would pay it every time.
  void spin_while_unchanged(uint64_t seen) const {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    while (generation_.load(std::memory_order_relaxed) == seen &&
           std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }

  std::mutex busy_;  // held by the one caller whose job the pool runs
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  // The open job, guarded by mutex_.
  Job* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // written under mutex_, also polled without it
  int slots_ = 0;                        // workers that may still join
  int active_ = 0;                       // workers inside the job
};

}  // namespace

int cpu_threads_available() {
  ThreadPool* pool = ThreadPool::instance();
  return pool == nullptr ? 1 : pool->workers() + 1;
}

void parallel_items(int64_t count, int threads, void (*body)(const void* ctx, int64_t item),
                    const void* ctx) {
  Job job;
  job.body = body;
  job.ctx = ctx;
  job.count = count;
  const int helpers = static_cast<int>(std::min<int64_t>(threads - 1, count - 1));
  ThreadPool* pool = helpers > 0 ? ThreadPool::instance() : nullptr;
  if (pool == nullptr) {
    job.drain();
    return;
  }
  try {
    pool->run(job, helpers);
  } catch (const std::system_error&) {
    job.drain();  // a mutex error before the job opened: the remaining items run here
  }
}

}  // namespace latentkv::detail
