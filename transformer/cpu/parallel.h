// parallel_for over XLA's intra-op thread pool, for the CPU kernels (fused_attention.cc,
// cached_attention.cc).
#ifndef TRANSFORMER_CPU_PARALLEL_H_
#define TRANSFORMER_CPU_PARALLEL_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace {

// Runs work(i) for i in [0, n) on the calling thread and up to threads - 1 pool threads.
// The caller waits only for helpers that have started: a helper still queued behind another
// device's computation (which may be waiting for this one in a collective) finds no work and
// touches only the shared counters, so nothing can deadlock. `spin`: wait for the started
// helpers' last items by spinning, not on the condition variable, whose wake-up costs tens
// of microseconds on a VM: for calls whose items take microseconds (a decoding step's).
template <class Work>
void parallel_for(xla::ffi::ThreadPool& pool, long threads, long n, Work work,
                  bool spin = false) {
  struct Shared {
    std::atomic<long> next{0};
    std::atomic<long> active{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto shared = std::make_shared<Shared>();
  auto run = [shared, n, &work]() {
    for (long i; (i = shared->next.fetch_add(1)) < n;) work(i);
  };
  long helpers = std::min(threads, n) - 1;
  for (long h = 0; h < helpers; ++h) {
    pool.Schedule([shared, n, run]() {
      shared->active.fetch_add(1);
      if (shared->next.load() < n) run();
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->active.fetch_sub(1);
      shared->cv.notify_all();
    });
  }
  run();
  if (spin) {
    while (shared->active.load() != 0) _mm_pause();
    return;
  }
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait(lock, [&] { return shared->active.load() == 0; });
}

}  // namespace

#endif  // TRANSFORMER_CPU_PARALLEL_H_
