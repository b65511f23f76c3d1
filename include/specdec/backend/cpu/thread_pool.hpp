#pragma once
//! \file
//! `thread_pool`: a small persistent pool that runs one function on every thread (the caller
//! included) and waits for all of them: the fork-join step of the CPU backend's parallel matrix
//! products. Workers spin briefly between jobs (a decode step is a few dozen short jobs), then
//! sleep on an atomic wait so an idle pool costs nothing. A pool of more threads than the cores
//! available (`available_cores`) never spins: its spinning threads would take the cores the
//! working ones need (a pool of 1024 threads on 2 cores ran a hundred times slower spinning), so
//! its workers and its caller sleep at once.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "specdec/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specdec {

namespace detail {
//! A hint to the processor that the caller is spinning.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
}  // namespace detail

//! The cores this process may run on: its CPU affinity mask where the system has one (Linux),
//! else `std::thread::hardware_concurrency()`; at least 1.
[[nodiscard]] inline std::size_t available_cores() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<std::size_t>(CPU_COUNT(&set));
#endif
  unsigned const n = std::thread::hardware_concurrency();
  return n > 0 ? n : 1;
}

//! A fixed set of threads that run jobs fork-join style: `run(f)` calls `f(t)` for t in
//! [0, size()) -- t = 0 on the calling thread, the others on the workers -- and returns when all
//! calls have returned. One job at a time: concurrent `run` calls from different threads take
//! turns; `run` must not be called from inside a job. Running a job neither allocates nor throws.
class thread_pool {
 public:
  //! A pool of `threads` threads in all (the caller counts as one, so `threads - 1` workers are
  //! started). Throws `errc::invalid_argument` for 0 or more than 1024 threads.
  explicit thread_pool(std::size_t threads) : shared_(std::make_unique<shared_state>()) {
    SPECDEC_CHECK(threads >= 1 && threads <= 1024, invalid_argument, "thread_pool: ", threads,
                  " threads, need 1 to 1024");
    size_ = threads;
    shared_->spin = threads <= available_cores();
    workers_.reserve(threads - 1);
    try {
      for (std::size_t t = 1; t < threads; ++t)
        workers_.emplace_back([s = shared_.get(), t] { worker_loop(*s, t); });
    } catch (...) {
      stop();
      throw;
    }
  }

  thread_pool(thread_pool const&) = delete;
  thread_pool& operator=(thread_pool const&) = delete;

  ~thread_pool() { stop(); }

  //! Threads in all, the caller included.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  //! Whether the threads spin briefly before they sleep when they wait (between jobs, and the
  //! caller for the workers): only when the pool has no more threads than `available_cores()`.
  [[nodiscard]] bool spins() const noexcept { return shared_->spin; }

  //! The process-wide pool of `threads` threads, created on first use and kept while some owner
  //! holds it. Models that run one after another from the same thread (a draft and its target)
  //! share it, so that no idle pool spins on a core another one needs.
  [[nodiscard]] static std::shared_ptr<thread_pool> shared(std::size_t threads) {
    static std::mutex mutex;
    static std::map<std::size_t, std::weak_ptr<thread_pool>> pools;
    std::lock_guard<std::mutex> lock(mutex);
    std::weak_ptr<thread_pool>& slot = pools[threads];
    std::shared_ptr<thread_pool> pool = slot.lock();
    if (pool == nullptr) {
      pool = std::make_shared<thread_pool>(threads);
      slot = pool;
    }
    return pool;
  }

  //! Calls `f(t)` for every t in [0, size()), t = 0 on this thread, and waits for all. `f` must
  //! not throw (a throw terminates the program).
  template <class F>
  void run(F&& f) noexcept {
    if (size_ == 1) {
      f(std::size_t{0});
      return;
    }
    using fn_type = std::remove_reference_t<F>;
    shared_state& s = *shared_;
    std::lock_guard<std::mutex> turn(s.run_mutex);
    s.job_fn = [](void* ctx, std::size_t t) noexcept { (*static_cast<fn_type*>(ctx))(t); };
    s.job_ctx = const_cast<void*>(static_cast<void const*>(&f));
    s.pending.store(static_cast<std::uint32_t>(size_ - 1), std::memory_order_relaxed);
    s.generation.fetch_add(1, std::memory_order_release);
    s.generation.notify_all();  // a no-op system-wise when no worker sleeps
    f(std::size_t{0});
    // Wait for the workers: spin first (unless oversubscribed), then sleep until the last one
    // is done (it notifies).
    spinner spin;
    for (std::uint32_t left = s.pending.load(std::memory_order_acquire); left != 0;
         left = s.pending.load(std::memory_order_acquire)) {
      if (!s.spin || !spin()) s.pending.wait(left, std::memory_order_acquire);
    }
  }

  //! Work (multiply-adds) below which `split_rows` and `split_tasks` stay on the calling thread:
  //! the hand-off to the workers would cost more.
  static constexpr std::size_t min_parallel_work = std::size_t{1} << 15;

  //! `parallel_for(rows, grain, f)`, or `f(0, rows)` on this thread alone when the pool has one
  //! thread or `work` is below `min_parallel_work`.
  template <class F>
  void split_rows(std::size_t rows, std::size_t grain, std::size_t work, F&& f) noexcept {
    if (size_ == 1 || work < min_parallel_work)
      f(std::size_t{0}, rows);
    else
      parallel_for(rows, grain, f);
  }

  //! Splits `tasks` evenly over the threads and calls f(thread, begin, end) on each non-empty
  //! share, or f(0, 0, tasks) here when the pool has one thread, there is one task or `work` is
  //! below `min_parallel_work`.
  template <class F>
  void split_tasks(std::size_t tasks, std::size_t work, F&& f) noexcept {
    if (size_ == 1 || work < min_parallel_work || tasks == 1) {
      f(std::size_t{0}, std::size_t{0}, tasks);
      return;
    }
    run([&](std::size_t t) {
      std::size_t const b = tasks * t / size_, e = tasks * (t + 1) / size_;
      if (b < e) f(t, b, e);
    });
  }

  //! Splits [0, n) into size() contiguous chunks whose bounds are multiples of `grain` (except n)
  //! and calls `f(begin, end)` on each non-empty chunk, one per thread.
  template <class F>
  void parallel_for(std::size_t n, std::size_t grain, F&& f) noexcept {
    std::size_t const threads = size_;
    std::size_t const blocks = (n + grain - 1) / grain;
    run([&](std::size_t t) {
      std::size_t const b0 = blocks * t / threads;
      std::size_t const b1 = blocks * (t + 1) / threads;
      std::size_t const begin = std::min(n, b0 * grain);
      std::size_t const end = std::min(n, b1 * grain);
      if (begin < end) f(begin, end);
    });
  }

 private:
  // Spins for about `spin_time`, then gives up (call returns false).
  class spinner {
   public:
    bool operator()() noexcept {
      detail::cpu_relax();
      if (++count_ % 32 != 0) return true;
      auto const now = std::chrono::steady_clock::now();
      if (count_ == 32) start_ = now;
      return now - start_ < spin_time;
    }

   private:
    static constexpr std::chrono::microseconds spin_time{200};
    std::uint64_t count_ = 0;
    std::chrono::steady_clock::time_point start_{};
  };

  struct shared_state {
    alignas(64) std::atomic<std::uint32_t> generation{0};
    alignas(64) std::atomic<std::uint32_t> pending{0};
    alignas(64) std::atomic<bool> stopping{false};
    bool spin = true;      // whether waits spin before they sleep (set before any worker starts)
    std::mutex run_mutex;  // one job at a time
    void (*job_fn)(void*, std::size_t) noexcept = nullptr;
    void* job_ctx = nullptr;
  };

  static void worker_loop(shared_state& s, std::size_t t) noexcept {
    std::uint32_t seen = 0;
    for (;;) {
      std::uint32_t gen = s.generation.load(std::memory_order_acquire);
      spinner spin;
      while (gen == seen) {
        if (!s.spin || !spin()) s.generation.wait(seen, std::memory_order_acquire);
        gen = s.generation.load(std::memory_order_acquire);
      }
      seen = gen;
      if (s.stopping.load(std::memory_order_acquire)) return;
      s.job_fn(s.job_ctx, t);
      // The last worker wakes the caller when it sleeps (a no-op system-wise otherwise).
      if (s.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) s.pending.notify_one();
    }
  }

  void stop() noexcept {
    if (!shared_) return;
    shared_->stopping.store(true, std::memory_order_release);
    shared_->generation.fetch_add(1, std::memory_order_release);
    shared_->generation.notify_all();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
  }

  std::unique_ptr<shared_state> shared_;
  std::vector<std::thread> workers_;
  std::size_t size_ = 1;
};

}  // namespace specdec
