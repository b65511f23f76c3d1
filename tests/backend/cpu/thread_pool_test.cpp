// The CPU backend's thread pool (backend/cpu/thread_pool.hpp) when it has more threads than the
// cores available: every job still runs on every thread, and its waits sleep at once instead of
// spinning, so that a job costs little processor time beyond its work (spinning workers took the
// cores the working ones needed: --threads 1024 on 2 cores ran a hundred times slower).
#include "specdec/backend/cpu/thread_pool.hpp"

#include <time.h>
#include "support/doctest.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <vector>

namespace sd = specdec;

namespace {

// The processor time this process has used, in seconds.
double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

TEST_CASE("thread_pool: a pool of more threads than cores sleeps instead of spinning") {
  std::size_t const cores = sd::available_cores();
  CHECK(cores >= 1);
  CHECK(sd::thread_pool(cores).spins());
  std::size_t const threads = std::min<std::size_t>(1024, 4 * cores + 4);
  sd::thread_pool pool(threads);
  CHECK(!pool.spins());

  // Short jobs, as a decode step runs them: each thread sums its chunk.
  constexpr int jobs = 200;
  std::size_t const n = threads * 64;
  std::vector<std::size_t> per_thread(threads);
  std::atomic<std::size_t> total{0};
  pool.run([&](std::size_t t) { per_thread[t] = t; });  // every worker started
  for (std::size_t t = 0; t < threads; ++t) CHECK(per_thread[t] == t);
  double const start = cpu_seconds();
  for (int j = 0; j < jobs; ++j)
    pool.parallel_for(n, 64, [&](std::size_t begin, std::size_t end) {
      std::size_t s = 0;
      for (std::size_t i = begin; i < end; ++i) s += i;
      total.fetch_add(s, std::memory_order_relaxed);
    });
  double const per_job = (cpu_seconds() - start) / jobs;
  CHECK(total.load() == jobs * (n * (n - 1) / 2));
  // Spinning, each worker burnt about 200 us of processor time per job (3 ms per job for 12
  // threads on 2 cores); sleeping, a few us (40 us per job).
  double const budget = 40e-6 * static_cast<double>(threads - 1);
  MESSAGE(threads, " threads on ", cores, " cores: ", per_job * 1e6,
          " us of processor time per job (budget ", budget * 1e6, ")");
  CHECK(per_job < budget);
}
